// A deploy is a transaction (syrupd/deploy_txn.h): each of its steps made to fail for real
// against a real syrupd, and what must hold afterwards -- the policy already deployed on
// the group keeps routing as before, the failed one left no pin, no program, map or link
// in syrupd, no entry in `list`.
//
// Compile and verifier failures are real (a syntax error, an unbounded loop). The install,
// register and retire steps cannot be made to fail from outside without racing the
// kernel, so those cases use the fault points of a test build (CMake option
// SYRUP_FAULT_INJECTION, off by default): syrupd then fails the named step of a policy of
// a given name after the step's own changes. Without the option those tests skip.
#include <dirent.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "harness.h"
#include "syrup/syrup.h"

namespace syrup::test {
namespace {

namespace fs = std::filesystem;

// Which step fails for a policy of which name, in the suite's syrupd.
constexpr const char* kFaults =
    "compile:fault-compile.c,load:fault-load.c,install:fault-install.c,register:fault-register.c,"
    "retire:fault-retire.c";
constexpr const char* kApp = "txntest";

#ifdef SYRUP_FAULT_INJECTION
constexpr bool kFaultsBuilt = true;
#else
constexpr bool kFaultsBuilt = false;
#endif

// The BPF objects (programs, maps, links) syrupd holds descriptors of.
size_t bpf_fds(pid_t pid) {
  size_t n = 0;
  std::error_code ec;
  for (auto& e : fs::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec)) {
    std::string target = fs::read_symlink(e.path(), ec).string();
    n += target.starts_with("anon_inode:bpf");
  }
  return n;
}

// Every pin under the suite's bpffs root, by path.
std::set<std::string> pins_under(const std::string& root) {
  std::set<std::string> out;
  std::error_code ec;
  for (auto& e : fs::recursive_directory_iterator(root, ec)) out.insert(e.path().string());
  return out;
}

// The ids of the policies `list` shows for kApp.
std::vector<int> app_policies() {
  std::vector<int> ids;
  for (auto& p : list_policies())
    if (p.value("app", "") == kApp) ids.push_back(p["id"].get<int>());
  return ids;
}

class DeployTxnTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    setenv("SYRUP_FAULT_STEP", kFaults, 1);
    daemon_ = start_suite_daemon();
    unsetenv("SYRUP_FAULT_STEP");
  }
  static void TearDownTestSuite() { stop_suite_daemon(daemon_); }
  void SetUp() override { SYRUP_REQUIRE_ROOT(); }
  void TearDown() override {
    for (int id : ids_) syr_remove_policy(id);
  }

  // Deploys source_path(rel) on `fds` under policy name `name` (null: the file's).
  int deploy(const std::string& rel, const std::vector<int>& fds, const char* name = nullptr) {
    syr_deploy_opts o{.sz = sizeof o, .app = kApp, .fds = fds.data(), .n_fds = fds.size(), .name = name};
    int id = syr_deploy_policy(source_path(rel).c_str(), SYR_HOOK_SOCKET_SELECT, &o);
    if (id > 0) ids_.push_back(id);
    return id;
  }

  // by_key routes key k to executor k % n: 10 keys per socket of `g` (its first `n`).
  static std::string routes_by_key(UdpGroup& g, int n) {
    UdpClient c(g.port());
    for (int k = 0; k < 10 * n; k++) c.send_request(1, static_cast<uint32_t>(k));
    std::vector<int> want(static_cast<size_t>(g.size()), 0), got = g.drain();
    for (int i = 0; i < n; i++) want[static_cast<size_t>(i)] = 10;
    if (got == want) return "";
    std::string s = "datagrams per socket:";
    for (int v : got) s += " " + std::to_string(v);
    return s;
  }

  // Deploys by_key on `g`, then `rel` named `name` over it on `fds`, which must fail with
  // -`err` (0: any error) and text containing `says`: then by_key still routes, and the failed deploy
  // left nothing behind.
  void failed_replacement_leaves_nothing(UdpGroup& g, const std::vector<int>& fds, const std::string& rel,
                                         const char* name, int err, const std::string& says) {
    int old = deploy("tests/policies/by_key.c", g.fds());
    ASSERT_GT(old, 0) << syr_last_error();
    ASSERT_EQ(routes_by_key(g, 4), "");
    size_t fds_before = bpf_fds(daemon_->pid());
    std::set<std::string> pins_before = pins_under(daemon_->bpffs_root());

    int r = deploy(rel, fds, name);
    if (err) EXPECT_EQ(r, -err) << syr_last_error();
    else EXPECT_LT(r, 0);
    EXPECT_NE(std::string(syr_last_error()).find(says), std::string::npos) << syr_last_error();

    EXPECT_EQ(routes_by_key(g, 4), "") << "the policy already deployed stopped routing";
    EXPECT_EQ(app_policies(), std::vector<int>{old});
    EXPECT_EQ(pins_under(daemon_->bpffs_root()), pins_before);
    EXPECT_GE(wait_for([&] { return bpf_fds(daemon_->pid()) == fds_before; }, 2000), 0)
        << "syrupd holds " << bpf_fds(daemon_->pid()) << " BPF descriptors, " << fds_before << " before";
    // And the group can still be deployed to: nothing of the failed one is in the way.
    int next = deploy("tests/policies/by_key.c", g.fds());
    EXPECT_GT(next, 0) << syr_last_error();
    EXPECT_EQ(routes_by_key(g, 4), "");
  }

  void skip_without_faults() {
    if (!kFaultsBuilt) GTEST_SKIP() << "needs a build with -DSYRUP_FAULT_INJECTION=ON (fault points)";
  }

  static Daemon* daemon_;
  std::vector<int> ids_;
};
Daemon* DeployTxnTest::daemon_ = nullptr;

TEST_F(DeployTxnTest, ACompileFailureLeavesTheDeployedPolicyRunningAndNothingBehind) {
  UdpGroup g(4);
  failed_replacement_leaves_nothing(g, g.fds(), "tests/policies/syntax_error.c", nullptr, EINVAL, "does not compile");
}

TEST_F(DeployTxnTest, AVerifierRefusalLeavesTheDeployedPolicyRunningAndNothingBehind) {
  UdpGroup g(4);
  failed_replacement_leaves_nothing(g, g.fds(), "tests/policies/unbounded_loop.c", nullptr, 0,
                                    "the verifier rejected policy unbounded_loop.c");
}

// After a successful compile and a load that pinned the new program and its maps.
TEST_F(DeployTxnTest, AFailureAfterTheLoadUnpinsTheNewPolicy) {
  skip_without_faults();
  UdpGroup g(4);
  failed_replacement_leaves_nothing(g, g.fds(), "tests/policies/even_keys.c", "fault-load.c", EIO,
                                    "injected fault at the load step");
}

// The hook's own undo: the executor map and the attachment put back.
TEST_F(DeployTxnTest, AnInstallFailureRestoresTheOldProgramOnTheGroup) {
  skip_without_faults();
  UdpGroup g(4);
  failed_replacement_leaves_nothing(g, g.fds(), "tests/policies/even_keys.c", "fault-install.c", EIO,
                                    "injected fault at the install step");
}

// Other sockets of the same group: install emptied and refilled the shared executor map;
// the undo puts the old policy's four sockets back, and the fifth gets nothing.
TEST_F(DeployTxnTest, AnInstallFailureOnOtherSocketsRefillsTheOldExecutors) {
  skip_without_faults();
  UdpGroup g(4);
  g.add();
  std::vector<int> five = g.fds();
  std::vector<int> four(five.begin(), five.begin() + 4);
  int old = deploy("tests/policies/by_key.c", four);
  ASSERT_GT(old, 0) << syr_last_error();
  ASSERT_EQ(routes_by_key(g, 4), "");
  EXPECT_EQ(deploy("tests/policies/by_key.c", five, "fault-install.c"), -EIO) << syr_last_error();
  EXPECT_EQ(routes_by_key(g, 4), "");
  EXPECT_EQ(app_policies(), std::vector<int>{old});
}

// Installed and registered, then unwound: the registry forgets it, the group runs the old
// program, the old policy is still listed with its id.
TEST_F(DeployTxnTest, ARegisterFailureUnwindsTheInstallToo) {
  skip_without_faults();
  UdpGroup g(4);
  failed_replacement_leaves_nothing(g, g.fds(), "tests/policies/even_keys.c", "fault-register.c", EIO,
                                    "injected fault at the register step");
}

// Retire is irreversible, so it fails before it acts: everything before it is unwound.
TEST_F(DeployTxnTest, ARetireFailureKeepsTheReplacedPolicy) {
  skip_without_faults();
  UdpGroup g(4);
  failed_replacement_leaves_nothing(g, g.fds(), "tests/policies/even_keys.c", "fault-retire.c", EIO,
                                    "injected fault at the retire step");
}

// A first deploy (nothing to replace) that fails after its install: the group is back to
// the kernel's own hash, and the application, which had no other policy, is gone with its
// pins.
TEST_F(DeployTxnTest, AFailedFirstDeployLeavesTheGroupUnscheduledAndNoApplication) {
  skip_without_faults();
  UdpGroup g(4);
  std::set<std::string> pins_before = pins_under(daemon_->bpffs_root());
  EXPECT_EQ(deploy("tests/policies/by_key.c", g.fds(), "fault-register.c"), -EIO) << syr_last_error();
  EXPECT_TRUE(app_policies().empty());
  EXPECT_EQ(pins_under(daemon_->bpffs_root()), pins_before);
  // One 5-tuple, no program: the kernel's hash sends every datagram to one socket.
  UdpClient c(g.port());
  for (int k = 0; k < 40; k++) c.send_request(1, static_cast<uint32_t>(k));
  std::vector<int> got = g.drain();
  EXPECT_EQ(std::count(got.begin(), got.end(), 40), 1) << got[0] << " " << got[1] << " " << got[2] << " " << got[3];
}

}  // namespace
}  // namespace syrup::test
