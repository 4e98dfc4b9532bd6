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
#include <arpa/inet.h>
#include <dirent.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "harness.h"
#include "security/security.h"
#include "unique_fd.h"
#include "syrup/syrup.h"
#include <bpf/libbpf.h>

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

// syrupd answers a deploy before it drops what the deploy's worker job held (copies of
// shared maps' descriptors): a request after it is served once that is done.
void settle() { (void)list_policies(); }

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
    if (geteuid() != 0) return;
    setenv("SYRUP_FAULT_STEP", kFaults, 1);
    daemon_ = new Daemon();
    // 2 MiB of maps per application: one 1.2 MB array fits, two do not.
    daemon_->start("", {"--quota_map_bytes=2097152"});
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
    settle();
    size_t fds_before = bpf_fds(daemon_->pid());
    std::set<std::string> pins_before = pins_under(daemon_->bpffs_root());

    int r = deploy(rel, fds, name);
    if (err) {
      EXPECT_EQ(r, -err) << syr_last_error();
    } else {
      EXPECT_LT(r, 0);
    }
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

// ---- A tenant's deploy refused at its quota --------------------------------------------

// by_key's routing with a 1.2 MB array `map` (100000 u64), which it touches.
std::string by_key_with_map(const std::string& map) {
  return "#include <syrup/policy.h>\nSYR_ARRAY(" + map + ", __u64, 100000);\n"
         "SYR_POLICY(struct syr_input *in)\n{\n\t__u32 key, k0 = 0;\n"
         "\t__u64 *v = syr_map_lookup(&" + map + ", &k0);\n\n\tif (v)\n\t\t__sync_fetch_and_add(v, 1);\n"
         "\tif (syr_read_u32(in, 12, &key))\n\t\treturn SYR_PASS;\n\treturn key % syr_num_executors;\n}\n";
}

// Mallory, an unprivileged tenant, replaces her policy (1.2 MB of maps) with one that
// declares 1.2 MB more: over her application's 2 MiB map quota, refused EDQUOT naming the
// quota, before the verifier; her policy keeps routing her group, and no map of the
// refused one is pinned.
TEST_F(DeployTxnTest, ATenantsDeployOverItsQuotaLeavesItsPolicyRunning) {
  using security::as_user;
  using security::kMallory;
  std::set<std::string> pins_before = pins_under(daemon_->bpffs_root());
  nlohmann::json j = as_user(kMallory, [&] {
    nlohmann::json out;
    UdpGroup g(4);
    auto fds = g.fds();
    syr_deploy_opts o{.sz = sizeof o, .app = "txnquota", .fds = fds.data(), .n_fds = fds.size()};
    auto deploy_src = [&](const std::string& src, const char* name) {
      return syr_deploy_policy_source(src.data(), src.size(), name, SYR_HOOK_SOCKET_SELECT, &o);
    };
    out["old"] = deploy_src(by_key_with_map("big"), "old.c");
    out["r"] = deploy_src(by_key_with_map("big2"), "new.c");
    out["err"] = syr_last_error();
    out["routes"] = routes_by_key(g, 4);
    for (auto& p : list_policies())
      if (p.value("app", "") == "txnquota") out["listed"].push_back(p["name"]);
    int fd = syr_map_open_app("txnquota", "big2");
    out["big2"] = fd >= 0 ? "pinned" : syr_last_error();
    if (fd >= 0) close(fd);
    return out;
  });
  ASSERT_FALSE(j.contains("error")) << j.dump();
  ASSERT_GT(j["old"].get<int>(), 0) << j.dump();
  EXPECT_EQ(j["r"], -EDQUOT) << j.dump();
  EXPECT_NE(j["err"].get<std::string>().find("bytes of maps; its quota is 2097152"), std::string::npos) << j.dump();
  EXPECT_EQ(j["routes"], "") << j.dump();
  EXPECT_EQ(j["listed"], nlohmann::json::array({"old.c"})) << j.dump();
  EXPECT_NE(j["big2"].get<std::string>().find("has no map 'big2'"), std::string::npos) << j.dump();
  // Once her process is gone, so is her application: nothing left under the pin root.
  EXPECT_GE(wait_for([&] { return pins_under(daemon_->bpffs_root()) == pins_before; }, 3000), 0);
}

// ---- XDP: the claims and the slot ---------------------------------------------------

// A UDP socket bound to `ip`:`port`, non-blocking.
int udp_bound(const std::string& ip, uint16_t port) {
  int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  inet_pton(AF_INET, ip.c_str(), &a.sin_addr);
  a.sin_port = htons(port);
  EXPECT_EQ(bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a), 0) << strerror(errno);
  return s;
}

// Datagrams waiting on `fd`, after a moment for them to arrive.
size_t count_received(int fd) {
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  size_t n = 0;
  char buf[64];
  while (recv(fd, buf, sizeof buf, 0) >= 0) n++;
  return n;
}

uint64_t seen(const char* app) {
  int fd = syr_map_open_app(app, "seen");
  uint64_t v = 0;
  uint32_t k = 0;
  if (fd >= 0) {
    syr_map_lookup_elem(fd, &k, &v);
    close(fd);
  }
  return v;
}

class DeployTxnXdp : public DeployTxnTest {
 protected:
  void SetUp() override {
    DeployTxnTest::SetUp();
    if (IsSkipped()) return;
    net_ = std::make_unique<TestNet>(240 + counter_++ % 10);
    ASSERT_TRUE(net_->ok());
  }
  void TearDown() override {
    DeployTxnTest::TearDown();
    ids_.clear();
    net_.reset();
  }
  int deploy_xdp(const std::string& rel, const char* app, std::vector<uint16_t> ports, const char* name = nullptr) {
    syr_deploy_opts o{.sz = sizeof o, .app = app, .name = name, .ifname = net_->host_if.c_str(),
                      .ports = ports.data(), .n_ports = ports.size()};
    int id = syr_deploy_policy(source_path(rel).c_str(), SYR_HOOK_XDP, &o);
    if (id > 0) ids_.push_back(id);
    return id;
  }
  // Sends 5 datagrams from the peer to each of `ports`.
  void send_each(std::vector<uint16_t> ports) {
    UniqueFd peer(net_->peer_udp());
    sockaddr_in a{};
    a.sin_family = AF_INET;
    inet_pton(AF_INET, net_->host_ip.c_str(), &a.sin_addr);
    uint32_t payload[4] = {1, 0, 0, 0};
    for (uint16_t p : ports)
      for (int i = 0; i < 5; i++) {
        a.sin_port = htons(p);
        sendto(peer.get(), payload, sizeof payload, 0, reinterpret_cast<sockaddr*>(&a), sizeof a);
      }
  }
  static int counter_;
  std::unique_ptr<TestNet> net_;
};
int DeployTxnXdp::counter_ = 0;

// The replacement would keep 9442, claim 9443 and give up 9441: after its register step
// fails, 9441 and 9442 are the old policy's again (it counts their frames), 9443 is
// unclaimed (another application may claim it), and nothing is pinned or held.
TEST_F(DeployTxnXdp, ARegisterFailureGivesTheOldPolicyItsPortsAndSlotBack) {
  skip_without_faults();
  UniqueFd s1(udp_bound(net_->host_ip, 9441)), s2(udp_bound(net_->host_ip, 9442)), s3(udp_bound(net_->host_ip, 9443));
  int old = deploy_xdp("tests/policies/xdp_count.c", kApp, {9441, 9442});
  ASSERT_GT(old, 0) << syr_last_error();
  settle();
  size_t fds_before = bpf_fds(daemon_->pid());
  std::set<std::string> pins_before = pins_under(daemon_->bpffs_root());

  EXPECT_EQ(deploy_xdp("policies/pass.c", kApp, {9442, 9443}, "fault-register.c"), -EIO) << syr_last_error();
  EXPECT_EQ(app_policies(), std::vector<int>{old});
  EXPECT_EQ(pins_under(daemon_->bpffs_root()), pins_before);
  EXPECT_GE(wait_for([&] { return bpf_fds(daemon_->pid()) == fds_before; }, 2000), 0);

  send_each({9441, 9442, 9443});
  EXPECT_EQ(count_received(s1.get()) + count_received(s2.get()) + count_received(s3.get()), 15u);
  EXPECT_EQ(seen(kApp), 10u) << "the old policy must see its two ports' frames, and only those";
  // 9443 went back to nobody; 9441 is still the old policy's.
  EXPECT_GT(deploy_xdp("policies/pass.c", "txnother", {9443}), 0) << syr_last_error();
  EXPECT_EQ(deploy_xdp("policies/pass.c", "txnother2", {9441}), -EBUSY) << syr_last_error();
}

// A first deploy on the interface whose install fails: its slot and claims are released
// and, no policy using the interface, the root program goes too.
TEST_F(DeployTxnXdp, AFailedFirstInstallLeavesTheInterfaceAsItWas) {
  skip_without_faults();
  UniqueFd s1(udp_bound(net_->host_ip, 9451));
  std::set<std::string> pins_before = pins_under(daemon_->bpffs_root());
  EXPECT_EQ(deploy_xdp("tests/policies/xdp_count.c", kApp, {9451}, "fault-install.c"), -EIO) << syr_last_error();
  EXPECT_TRUE(app_policies().empty());
  EXPECT_EQ(pins_under(daemon_->bpffs_root()), pins_before);
  LIBBPF_OPTS(bpf_xdp_query_opts, q);
  ASSERT_EQ(bpf_xdp_query(static_cast<int>(if_nametoindex(net_->host_if.c_str())), 0, &q), 0);
  EXPECT_EQ(q.prog_id, 0u) << "the XDP root stayed attached with no policy";
  send_each({9451});
  EXPECT_EQ(count_received(s1.get()), 5u);
  // The port is free: the next deploy claims it.
  EXPECT_GT(deploy_xdp("tests/policies/xdp_count.c", kApp, {9451}), 0) << syr_last_error();
}

}  // namespace
}  // namespace syrup::test
