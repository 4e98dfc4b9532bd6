// The thread hook's parse() (hooks/thread/request.h): its one key, pid.
#include <gtest/gtest.h>

#include "registry.h"
#include "thread/request.h"

namespace syrup::thread {
namespace {

using nlohmann::json;

std::string refusal(const json& f) {
  ThreadRequest r;
  Bad bad;
  return parse(f, r, bad) ? "" : bad.str();
}

TEST(ThreadRequest, PidIsOptionalAndInRange) {
  ThreadRequest r;
  Bad bad;
  ASSERT_TRUE(parse(json::object(), r, bad));
  EXPECT_EQ(r.pid, 0);  // the caller's own process
  ASSERT_TRUE(parse({{"pid", 4194304}}, r, bad));
  EXPECT_EQ(r.pid, 4194304);
  EXPECT_EQ(refusal({{"pid", 0}}), "pid: must be an integer in 1..4194304, got 0");
  EXPECT_EQ(refusal({{"pid", 4294967296ull + 7}}), "pid: must be an integer in 1..4194304, got 4294967303");
  EXPECT_EQ(refusal({{"pid", "7"}}), "pid: must be an integer in 1..4194304, got \"7\"");
  EXPECT_EQ(refusal({{"pid", nullptr}}), "pid: must be an integer in 1..4194304, got null");
}

TEST(ThreadRequest, UnknownKeys) {
  EXPECT_EQ(refusal({{"port", 9000}}), "port: is not a key of the thread hook (its keys: pid, cgroup)");
  EXPECT_EQ(refusal({{"pid", 1}, {"cpus", {1}}}), "cpus: is not a key of the thread hook (its keys: pid, cgroup)");
}

TEST(ThreadRequest, OneProcessOnePolicy) {
  const HookSpec* s = find_hook("thread");
  ASSERT_TRUE(s && s->check && s->same_target);
  Bad bad;
  json c;
  ASSERT_TRUE(s->check({{"pid", 3}}, bad, &c));
  EXPECT_EQ(c, json::object());
  EXPECT_EQ(s->same_target(c, c, "process kv"), "the threads of process kv");
}

}  // namespace
}  // namespace syrup::thread
