// Targets by cgroup (hooks/common/cgroup.h, docs/protocol.md "cgroup"): a tenant may name a
// cgroup only if it owns every process in it, and learns nothing of one it may not name.
// Mallory names Alice's cgroup at every hook, a cgroup that does not exist, an empty one,
// a file that is not a cgroup, a path with "..", and paths through a symlink and a FIFO
// on a file system mounted inside the cgroup tree; every refusal reads the same, and
// Alice's sockets stay unscheduled. A cgroup of more processes than a deploy looks at is
// refused without being read whole.
#include <signal.h>
#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <chrono>
#include <fstream>
#include <map>

#include "security/held_user.h"
#include "security/security.h"
#include "test_cgroup.h"

namespace syrup::test::security {
namespace {

using nlohmann::json;

// syrupctl deploy as `uid`: {"rc", "out"}.
json deploy_as(uid_t uid, const std::string& args) {
  return as_user(uid, [&] {
    std::string out;
    int rc = run_cmd(build_bin("syrupctl") + " deploy " + args, out);
    return json{{"rc", rc}, {"out", out}};
  });
}

std::string replaced(std::string s, const std::string& what, const std::string& with) {
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + with.size()))
    s.replace(at, what.size(), with);
  return s;
}

// Each hook's deploy by cgroup, up to the cgroup.
std::vector<std::pair<std::string, std::string>> hook_deploys(uint16_t port) {
  std::string p = std::to_string(port);
  return {{"socket-select", "--hook socket-select --port " + p + " " + source_path("tests/policies/drop_all.c")},
          {"socket-lookup", "--hook socket-lookup --protocol udp --port " + p + " " +
                                source_path("hooks/socket_lookup/tests/policies/by_port.c")},
          {"thread", "--hook thread " + source_path("tests/policies/thread_prio.c")},
          {"xdp", "--hook xdp --ifname lo " + source_path("tests/policies/drop_all.c")}};
}

constexpr const char* kRefusal = "no cgroup by that path holds processes that are all the caller's";

TEST(CgroupTargets, AnotherUsersCgroupIsRefusedInTheWordsOfAMissingOneAtEveryHook) {
  SYRUP_REQUIRE_ROOT();
  TestCgroup cg({"alice", "empty"});
  if (!cg.why.empty()) GTEST_SKIP() << "cannot make a test cgroup v2: " << cg.why;
  Daemon d;
  d.start();
  UniqueFd hers;
  HeldUser alice(kAlice, [&] {
    hers.reset(socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    int on = 1;
    setsockopt(hers.get(), SOL_SOCKET, SO_REUSEPORT, &on, sizeof on);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    socklen_t len = sizeof a;
    if (bind(hers.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) ||
        getsockname(hers.get(), reinterpret_cast<sockaddr*>(&a), &len))
      return json{{"error", "bind"}};
    return json{{"port", ntohs(a.sin_port)}};
  });
  ASSERT_TRUE(alice.result().contains("port")) << alice.result().dump();
  ASSERT_TRUE(cg.join("alice", alice.pid()));
  uint16_t port = alice.result()["port"].get<uint16_t>();

  for (auto& [hook, args] : hook_deploys(port)) {
    std::map<std::string, std::string> seen;  // what Mallory saw, the path replaced by X
    for (std::string target : {cg.path("alice"), cg.path("nothing"), cg.path("empty"),
                               cg.path("alice") + "/cgroup.procs"}) {
      json m = deploy_as(kMallory, "--cgroup " + target + " " + args);
      std::string out = m.value("out", "");
      EXPECT_NE(m.value("rc", 0), 0) << hook << " " << target << ": " << out;
      EXPECT_NE(out.find(kRefusal), std::string::npos) << hook << " " << target << ": " << out;
      seen[target] = replaced(out, target, "X");
    }
    for (auto& [target, words] : seen) EXPECT_EQ(words, seen.begin()->second) << hook << " " << target;
  }
  // Alice's own deploy by her cgroup is hers to make (the check is ownership, not a ban).
  json a = deploy_as(kAlice, "--cgroup " + cg.path("alice") + " " + hook_deploys(port)[0].second);
  EXPECT_EQ(a.value("rc", -1), 0) << a.dump();
  EXPECT_NE(a.value("out", "").find("with 1 executors"), std::string::npos) << a.dump();
  alice.release();
  EXPECT_EQ(d.stop(), 0);
}

// What parse() refuses never reaches the file system: "..", a relative path, characters
// outside the allowlist. What it lets through is walked beneath the v2 root with no
// symlink, no other file system and no ".." (openat2 RESOLVE_BENEATH | NO_SYMLINKS |
// NO_XDEV): a tmpfs mounted inside the cgroup tree holds a symlink to Alice's cgroup and
// a directory whose cgroup.procs is a FIFO (a read of it would block syrupd); both are
// refused at once, in the words of a missing cgroup.
TEST(CgroupTargets, PathsThatLeaveTheTreeAreRefusedWithoutFollowingThem) {
  SYRUP_REQUIRE_ROOT();
  TestCgroup cg({"alice", "mnt"});
  if (!cg.why.empty()) GTEST_SKIP() << "cannot make a test cgroup v2: " << cg.why;
  std::string mnt = cg.dir("mnt");
  ASSERT_EQ(mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=64k,mode=0755"), 0) << strerror(errno);
  struct Unmount {
    std::string at;
    ~Unmount() { umount2(at.c_str(), MNT_DETACH); }
  } unmount{mnt};
  ASSERT_EQ(symlink(cg.dir("alice").c_str(), (mnt + "/link").c_str()), 0);
  ASSERT_EQ(mkdir((mnt + "/fake").c_str(), 0755), 0);
  ASSERT_EQ(mkfifo((mnt + "/fake/cgroup.procs").c_str(), 0644), 0);
  Daemon d;
  d.start();
  std::string args = hook_deploys(9)[0].second;
  deploy_as(kMallory, "--cgroup " + cg.path("nothing") + " " + args);  // compiles: the timing is the cgroup's
  for (std::string target : {cg.path("mnt") + "/link", cg.path("mnt") + "/fake"}) {
    auto t0 = std::chrono::steady_clock::now();
    json m = deploy_as(kMallory, "--cgroup " + target + " " + args);
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_NE(m.value("out", "").find(kRefusal), std::string::npos) << target << ": " << m.dump();
    EXPECT_LT(ms, 5000) << "syrupd did not answer at once: it opened what " << target << " names";
  }
  for (auto [target, words] : std::vector<std::pair<std::string, std::string>>{
           {cg.path("mnt") + "/../alice", "no empty, '.' or '..' name"},
           {"syrup-test/alice", "below the root"},
           {"/", "below the root"},
           {cg.path("alice") + "/x y", "must be a cgroup v2 path"},
           {cg.path("alice") + "\\nx", "must be a cgroup v2 path"}}) {
    json m = deploy_as(kMallory, "--cgroup '" + target + "' " + args);
    EXPECT_NE(m.value("rc", 0), 0) << target << ": " << m.dump();
    EXPECT_NE(m.value("out", "").find("--cgroup: " ), std::string::npos) << target << ": " << m.dump();
    EXPECT_NE(m.value("out", "").find(words), std::string::npos) << target << ": " << m.dump();
  }
  EXPECT_EQ(d.stop(), 0);
}

// A cgroup of more processes than a deploy looks at (cgroup::kMaxProcesses) is refused
// with the bound, answered without reading the rest.
TEST(CgroupTargets, AHugeCgroupIsRefusedWithTheBound) {
  SYRUP_REQUIRE_ROOT();
  TestCgroup cg({"huge"});
  if (!cg.why.empty()) GTEST_SKIP() << "cannot make a test cgroup v2: " << cg.why;
  // Mallory's own processes, kMaxProcesses + 8 of them, all in the cgroup.
  int go[2];
  ASSERT_EQ(pipe2(go, O_CLOEXEC), 0);
  pid_t leader = fork();
  if (leader == 0) {
    char c;
    if (read(go[0], &c, 1) != 1 || setgroups(0, nullptr) || setgid(kMallory) || setuid(kMallory)) _exit(1);
    for (size_t i = 0; i < cgroup::kMaxProcesses + 8; i++)
      if (fork() == 0) {
        for (;;) pause();
      }
    for (;;) pause();
  }
  ASSERT_GT(leader, 0);
  close(go[0]);
  bool joined = cg.join("huge", leader);
  (void)!write(go[1], "g", 1);
  close(go[1]);
  ASSERT_TRUE(joined);
  // Its children are forked after the move, so they are in the cgroup too.
  size_t n = 0;
  wait_for([&] {
    std::ifstream procs(cg.dir("huge") + "/cgroup.procs");
    n = 0;
    for (pid_t p; procs >> p;) n++;
    return n > cgroup::kMaxProcesses;
  }, 10000);
  ASSERT_GT(n, cgroup::kMaxProcesses);
  Daemon d;
  d.start();
  json m = deploy_as(kMallory, "--cgroup " + cg.path("huge") + " " + hook_deploys(9)[0].second);
  EXPECT_NE(m.value("out", "").find("holds more than " + std::to_string(cgroup::kMaxProcesses) + " processes"),
            std::string::npos)
      << m.dump();
  kill(leader, SIGKILL);
  waitpid(leader, nullptr, 0);
  EXPECT_EQ(d.stop(), 0);
}

}  // namespace
}  // namespace syrup::test::security
