// socket-select's parse() (hooks/socket_select/request.h), key by key: missing, wrong
// type, out of range, unknown. Pure logic: the same function syrupd, the config loader
// and syrupctl call.
#include <gtest/gtest.h>
#include <netinet/in.h>

#include "registry.h"
#include "socket_select/request.h"

namespace syrup::socket_select {
namespace {

using nlohmann::json;

// parse()'s refusal as "key: why", or "" if it took the fields.
std::string refusal(const json& f) {
  SocketSelectRequest r;
  Bad bad;
  return parse(f, r, bad) ? "" : bad.str();
}

TEST(SocketSelectRequest, TakesAProcessGroupAndCanonicalisesTheAddress) {
  SocketSelectRequest r;
  Bad bad;
  ASSERT_TRUE(parse({{"pid", 42}, {"port", 9000}, {"protocol", "tcp"}, {"address", "0:0::1"}}, r, bad)) << bad.str();
  EXPECT_EQ(r.pid, 42);
  EXPECT_EQ(r.port, 9000);
  EXPECT_EQ(r.protocol, IPPROTO_TCP);
  EXPECT_EQ(r.address, "::1");
  EXPECT_EQ(to_json(r), json({{"port", 9000}, {"protocol", "tcp"}, {"address", "::1"}}));
  // Passed sockets (no pid): nothing is required.
  ASSERT_TRUE(parse(json::object(), r, bad));
  EXPECT_EQ(r.pid, 0);
}

TEST(SocketSelectRequest, Port) {
  EXPECT_EQ(refusal({{"pid", 1}}), "port: required key is missing");
  EXPECT_EQ(refusal({{"pid", 1}, {"port", "9000"}}), "port: must be an integer in 1..65535, got \"9000\"");
  EXPECT_EQ(refusal({{"pid", 1}, {"port", 0}}), "port: must be an integer in 1..65535, got 0");
  EXPECT_EQ(refusal({{"pid", 1}, {"port", 4294976396ull}}), "port: must be an integer in 1..65535, got 4294976396");
  EXPECT_EQ(refusal({{"pid", 1}, {"port", 9000.5}}), "port: must be an integer in 1..65535, got 9000.5");
  EXPECT_EQ(refusal({{"pid", 1}, {"port", {{"a", 1}}}}), "port: must be an integer in 1..65535, got {\"a\":1}");
}

TEST(SocketSelectRequest, Pid) {
  EXPECT_EQ(refusal({{"pid", -1}, {"port", 1}}), "pid: must be an integer in 1..4194304, got -1");
  EXPECT_EQ(refusal({{"pid", 0}, {"port", 1}}), "pid: must be an integer in 1..4194304, got 0");
  EXPECT_EQ(refusal({{"pid", "1"}, {"port", 1}}), "pid: must be an integer in 1..4194304, got \"1\"");
  EXPECT_EQ(refusal({{"pid", 4194305}, {"port", 1}}), "pid: must be an integer in 1..4194304, got 4194305");
}

TEST(SocketSelectRequest, Protocol) {
  EXPECT_EQ(refusal({{"pid", 1}, {"port", 1}, {"protocol", "sctp"}}), "protocol: must be udp or tcp, got \"sctp\"");
  EXPECT_EQ(refusal({{"pid", 1}, {"port", 1}, {"protocol", 17}}), "protocol: must be udp or tcp, got 17");
  EXPECT_EQ(refusal({{"pid", 1}, {"port", 1}, {"protocol", "UDP"}}), "protocol: must be udp or tcp, got \"UDP\"");
}

TEST(SocketSelectRequest, Address) {
  const std::string why = "address: must be an IPv4 or IPv6 address as the sockets are bound (e.g. 127.0.0.1, ::, "
                          "0.0.0.0), got ";
  EXPECT_EQ(refusal({{"pid", 1}, {"port", 1}, {"address", "localhost"}}), why + "\"localhost\"");
  EXPECT_EQ(refusal({{"pid", 1}, {"port", 1}, {"address", 127}}), why + "127");
  EXPECT_EQ(refusal({{"address", "127.0.0.1"}}),
            "address: chooses among the sockets of a process (with pid); passed sockets are their group already");
}

TEST(SocketSelectRequest, UnknownKeysAndShapes) {
  EXPECT_EQ(refusal({{"pid", 1}, {"port", 1}, {"ifname", "lo"}}),
            "ifname: is not a key of the socket-select hook (its keys: pid, cgroup, port, protocol, address)");
  EXPECT_EQ(refusal(json::array({1, 2})), "fields: must be an object, got [1,2]");
  // A key with a control character is quoted escaped; a huge value is cut.
  EXPECT_EQ(refusal({{"a\nb", 1}}).substr(0, 5), "a\\x0a");
  EXPECT_LT(refusal({{"pid", 1}, {"port", std::string(100000, 'x')}}).size(), 120u);
}

TEST(SocketSelectRequest, TheSpecChecksWithTheSameWordsAndSaysWhatTwoShare) {
  const HookSpec* s = find_hook("socket-select");
  ASSERT_TRUE(s && s->check && s->same_target);
  Bad bad;
  json c;
  EXPECT_FALSE(s->check({{"pid", 1}, {"port", 0}}, bad, &c));
  EXPECT_EQ(bad.str(), refusal({{"pid", 1}, {"port", 0}}));
  ASSERT_TRUE(s->check({{"pid", 1}, {"port", 9000}}, bad, &c));
  EXPECT_EQ(c, json({{"port", 9000}}));
  json udp = {{"port", 9000}, {"protocol", "udp"}}, tcp = {{"port", 9000}, {"protocol", "tcp"}};
  EXPECT_EQ(s->same_target(c, udp, "pid 1"), "the socket group of pid 1 on port 9000");
  EXPECT_EQ(s->same_target(udp, tcp, "pid 1"), "");
  EXPECT_EQ(s->same_target(c, {{"port", 9001}}, "pid 1"), "");
}

}  // namespace
}  // namespace syrup::socket_select
