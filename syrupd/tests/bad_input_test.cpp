// Bad requests to syrupd: each gets one clear error (clang's, the verifier's, the hook's
// refusal, libsyrup's), and the policy already deployed keeps working.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "harness.h"
#include "harness_socket_select.h"
#include "syrup/syrup.h"

namespace syrup::test {
namespace {

class SocketSelect : public SocketSelectTest {};

// Bad input: each gets a clear error and the policy already deployed keeps working.
class SocketSelectBadInput : public SocketSelect {
 protected:
  void SetUp() override {
    SocketSelect::SetUp();
    if (IsSkipped()) return;
    group_ = std::make_unique<UdpGroup>(4);
    good_ = deploy("policies/round_robin.c", *group_);
    ASSERT_GT(good_, 0) << syr_last_error();
  }
  void ExpectGoodPolicyStillWorks() {
    UdpClient c(group_->port());
    for (int i = 0; i < 40; i++) c.send_request(1, i);
    EXPECT_EQ(group_->drain(), (std::vector<int>{10, 10, 10, 10}));
    std::string out;
    run_cmd(build_bin("syrupctl") + " --json list", out);
    EXPECT_EQ(nlohmann::json::parse(out).size(), 1u) << out;
  }
  std::unique_ptr<UdpGroup> group_;
  int good_ = 0;
};

TEST_F(SocketSelectBadInput, SyntaxErrorReturnsClangsMessageWithFileAndLine) {
  int r = deploy("tests/policies/syntax_error.c", *group_);
  EXPECT_EQ(r, -EINVAL);
  std::string err = syr_last_error();
  EXPECT_NE(err.find("does not compile"), std::string::npos) << err;
  EXPECT_NE(err.find("syntax_error.c:5:10: error: expected ';'"), std::string::npos) << err;
  // As clang shows it on a terminal: the line, a caret under the column, the fix.
  EXPECT_NE(err.find("\n    5 |         return 0   /* missing semicolon on line 5 */\n"
                     "      |                 ^\n"
                     "      |                 ;"),
            std::string::npos)
      << err;
  ExpectGoodPolicyStillWorks();
}

// A thread policy deployed at a packet hook fails with one error, not one per field of
// struct syr_thread or thread helper it uses, naming the hook it is for (the reverse:
// thread_test). A packet policy that calls a thread helper is told it is for threads.
TEST_F(SocketSelectBadInput, ThreadPolicyIsRefusedNamingTheHookItIsFor) {
  // fifo.c uses only struct syr_thread; get_first.c syr_thread_hint(); cs_aware.c syr_thread_in_cs().
  for (std::string name : {"fifo.c", "get_first.c", "cs_aware.c"}) {
    SCOPED_TRACE(name);
    EXPECT_EQ(deploy("policies/" + name, *group_), -EINVAL);
    std::string err = syr_last_error(), first = err.substr(0, err.find('\n'));
    EXPECT_NE(first.find("policy " + name + " does not compile: "), std::string::npos) << err;
    EXPECT_NE(first.find(name + ":"), std::string::npos) << err;
    EXPECT_NE(first.find(": error: static assertion failed"), std::string::npos) << err;
    EXPECT_NE(first.find("deploy it with --hook thread"), std::string::npos) << err;
    EXPECT_EQ(occurrences(err, ": error: "), 1u) << err;
    EXPECT_EQ(occurrences(err, "warning:"), 0u) << err;  // only the assertion
  }
  EXPECT_EQ(deploy("tests/policies/thread_helper_at_packet_hook.c", *group_), -EINVAL);
  std::string err = syr_last_error();
  EXPECT_NE(err.find("thread_helper_at_packet_hook.c:8:9: error: static assertion failed"), std::string::npos)
      << err;
  EXPECT_NE(err.find("syr_thread_hint() is for thread policies (--hook thread)"), std::string::npos) << err;
  EXPECT_EQ(occurrences(err, ": error: "), 1u) << err;
  ExpectGoodPolicyStillWorks();
}

// A socket-select policy may not persist past its process: its executors are the
// process's sockets, which close with it, so it would schedule nothing, and a restarted
// server's sockets form a new group that needs a deploy of its own. A thread policy
// likewise ends with its process. The error says why and what to do; the
// policy already on the group is not replaced.
TEST_F(SocketSelectBadInput, PersistIsRefusedForTheHooksWhosePolicyEndsWithItsProcess) {
  auto fds = group_->fds();
  syr_deploy_opts o{.sz = sizeof o, .app = "socktest", .fds = fds.data(), .n_fds = fds.size(), .persist = true};
  EXPECT_EQ(syr_deploy_policy(source_path("policies/pass.c").c_str(), SYR_HOOK_SOCKET_SELECT, &o), -EINVAL);
  std::string err = syr_last_error();
  EXPECT_NE(err.find("persist is not allowed for the socket-select hook: the policy ends with the process it "
                     "schedules; a socket-select policy's executors are the process's sockets, which close with it"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("Deploy it again from the new process, or list it in syrupd's --config"), std::string::npos)
      << err;

  std::string out;
  EXPECT_EQ(run_cmd(build_bin("syrupctl") + " deploy --persist --pid " + std::to_string(getpid()) + " --port " +
                        std::to_string(group_->port()) + " " + source_path("policies/pass.c"),
                    out),
            1);
  EXPECT_NE(out.find("persist is not allowed for the socket-select hook"), std::string::npos) << out;
  EXPECT_EQ(run_cmd(build_bin("syrupctl") + " deploy --hook thread --persist --pid " + std::to_string(getpid()) +
                        " " + source_path("policies/fifo.c"),
                    out),
            1);
  EXPECT_NE(out.find("persist is not allowed for the thread hook: the policy ends with the process it schedules; "
                     "a persisting thread policy would hold on to the exited process's threads"),
            std::string::npos)
      << out;
  ExpectGoodPolicyStillWorks();
}

TEST_F(SocketSelectBadInput, UnboundedLoopReturnsTheVerifiersReason) {
  int r = deploy("tests/policies/unbounded_loop.c", *group_);
  EXPECT_LT(r, 0);
  std::string err = syr_last_error();
  EXPECT_NE(err.find("the verifier rejected policy unbounded_loop.c"), std::string::npos) << err;
  EXPECT_NE(err.find("infinite loop detected"), std::string::npos) << err;
  ExpectGoodPolicyStillWorks();
}

TEST_F(SocketSelectBadInput, UncheckedPacketReadReturnsTheVerifiersReason) {
  int r = deploy("tests/policies/unchecked_read.c", *group_);
  EXPECT_EQ(r, -EACCES);
  std::string err = syr_last_error();
  EXPECT_EQ(err.rfind("the verifier rejected policy unchecked_read.c: ", 0), 0u) << err;
  EXPECT_NE(err.find("invalid access to packet"), std::string::npos) << err;
  EXPECT_NE(err.find("unchecked_read.c:6"), std::string::npos) << "the log names the source line: " << err;
  ExpectGoodPolicyStillWorks();
}

TEST_F(SocketSelectBadInput, UnknownHookMissingFileUnknownParamAndUnreachableDaemon) {
  auto fds = group_->fds();
  syr_deploy_opts o{.sz = sizeof o, .app = "socktest", .fds = fds.data(), .n_fds = fds.size()};
  EXPECT_EQ(syr_deploy_policy(source_path("policies/pass.c").c_str(), static_cast<syr_hook>(42), &o), -EINVAL);
  EXPECT_STREQ(syr_last_error(), "unknown hook 42 (known: socket-select, xdp, thread, socket-lookup)");

  EXPECT_EQ(syr_deploy_policy("/nonexistent/policy.c", SYR_HOOK_SOCKET_SELECT, &o), -ENOENT);
  EXPECT_NE(std::string(syr_last_error()).find("cannot read policy file /nonexistent/policy.c"), std::string::npos);

  EXPECT_EQ(deploy("policies/round_robin.c", *group_, {{"no_such_param", 1}}), -ENOENT);
  EXPECT_NE(std::string(syr_last_error()).find("has no parameter 'no_such_param'"), std::string::npos)
      << syr_last_error();

  std::string out;
  EXPECT_EQ(run_cmd(build_bin("syrupctl") + " deploy --hook sched --pid 1 --port 1 " +
                        source_path("policies/pass.c"),
                    out),
            2);
  EXPECT_NE(out.find("--hook takes one of socket-select, xdp, thread, socket-lookup, got 'sched'"), std::string::npos) << out;

  std::string saved = getenv("SYRUP_SOCKET");
  setenv("SYRUP_SOCKET", "/tmp/syrup-no-such-daemon.sock", 1);
  EXPECT_EQ(syr_deploy_policy(source_path("policies/pass.c").c_str(), SYR_HOOK_SOCKET_SELECT, &o), -ENOENT);
  EXPECT_NE(std::string(syr_last_error()).find("cannot reach syrupd at /tmp/syrup-no-such-daemon.sock"),
            std::string::npos)
      << syr_last_error();
  EXPECT_EQ(run_cmd(build_bin("syrupctl") + " list", out), 3);
  EXPECT_NE(out.find("is syrupd running?"), std::string::npos) << out;
  setenv("SYRUP_SOCKET", saved.c_str(), 1);
  ExpectGoodPolicyStillWorks();
}

}  // namespace
}  // namespace syrup::test
