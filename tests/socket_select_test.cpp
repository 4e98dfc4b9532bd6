// Integration tests of the socket-select hook through libsyrup and syrupctl: a real
// syrupd, real BPF programs in the running kernel, real SO_REUSEPORT groups on loopback.
// Each test asserts which socket got which datagram (or connection).
#include <arpa/inet.h>
#include <bpf/bpf.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <net/if.h>
#include <sched.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <numeric>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "harness.h"
#include "inet_diag.h"
#include "syrup/syrup.h"

namespace syrup::test {
namespace {

// Steady traffic for tests/policies/by_key.c (and its twin by_key_v2.c), which send key k
// to socket k % sockets: requests with keys 0..n-1 from one client, a pause every 64,
// while a receiver drains every socket and the test changes what serves the group.
class ByKeyTraffic {
 public:
  struct Result {
    int total = 0;      // datagrams received
    int misrouted = 0;  // of those, on another socket than key % sockets
  };
  ByKeyTraffic(UdpGroup& g, uint32_t n, std::chrono::microseconds pause)
      : g_(g), got_(g.size()), receiver_([this] {
          while (!done_.load()) {
            collect(0);
            std::this_thread::sleep_for(std::chrono::microseconds(200));
          }
        }),
        sender_([this, n, pause] {
          UdpClient c(g_.port());
          for (uint32_t k = 0; k < n; k++) {
            c.send_request(1, k);
            if (k % 64 == 0) std::this_thread::sleep_for(pause);
          }
        }) {}
  ~ByKeyTraffic() { stop(); }
  // Waits for the last send, collects what is still queued and says where it all went.
  Result finish() {
    stop();
    collect(100);
    Result r;
    for (size_t i = 0; i < got_.size(); i++)
      for (auto& p : got_[i]) {
        uint32_t key;
        memcpy(&key, p.data() + 4, 4);
        r.total++;
        r.misrouted += key % got_.size() != i;
      }
    return r;
  }

 private:
  void stop() {
    if (sender_.joinable()) sender_.join();
    if (!receiver_.joinable()) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the last datagrams in flight
    done_ = true;
    receiver_.join();
  }
  void collect(int wait_ms) {
    std::vector<std::vector<std::string>> p;
    g_.drain(&p, wait_ms);
    for (size_t i = 0; i < got_.size(); i++)
      for (auto& s : p[i]) got_[i].push_back(std::move(s));
  }
  UdpGroup& g_;
  std::vector<std::vector<std::string>> got_;  // payloads per socket
  std::atomic<bool> done_{false};
  std::thread receiver_, sender_;
};

class SocketSelect : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { daemon_ = start_suite_daemon(); }
  static void TearDownTestSuite() { stop_suite_daemon(daemon_); }
  void SetUp() override { SYRUP_REQUIRE_ROOT(); }
  void TearDown() override {
    for (int id : ids_) syr_remove_policy(id);
  }

  // Deploys policies/<name> (or tests/policies/<name>) on `g`; the id is removed at
  // the end of the test.
  int deploy(const std::string& rel, const UdpGroup& g, std::vector<syr_param> params = {},
             const char* app = "socktest") {
    return deploy_fds(rel, g.fds(), std::move(params), app);
  }
  int deploy_fds(const std::string& rel, std::vector<int> fds, std::vector<syr_param> params = {},
                 const char* app = "socktest") {
    syr_deploy_opts o{.sz = sizeof o, .app = app, .fds = fds.data(), .n_fds = fds.size(),
                      .params = params.data(), .n_params = params.size()};
    int id = syr_deploy_policy(source_path(rel).c_str(), SYR_HOOK_SOCKET_SELECT, &o);
    if (id > 0) ids_.push_back(id);
    return id;
  }

  // Deploys tests/policies/<name> on this process's sockets on `port` with syrupctl
  // --pid (the id is removed at the end of the test): "" or syrupctl's output.
  std::string deploy_pid(uint16_t port, const std::string& name) {
    std::string out;
    if (run_cmd(build_bin("syrupctl") + " --json deploy --hook socket-select --app pidtest --pid " +
                    std::to_string(getpid()) + " --port " + std::to_string(port) + " " +
                    source_path("tests/policies/" + name),
                out) != 0)
      return out.empty() ? "syrupctl failed" : out;
    ids_.push_back(nlohmann::json::parse(out)["id"].get<int>());
    return "";
  }

  // `n` listening TCP sockets in one SO_REUSEPORT group on 127.0.0.1, whose address and
  // port go to `a`; none (and a failure) if the group cannot be made.
  static std::vector<UniqueFd> tcp_listeners(int n, sockaddr_in& a) {
    a = sockaddr_in{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    std::vector<int> fds(static_cast<size_t>(n));
    std::vector<UniqueFd> ls;
    if (int r = syr_open_reuseport_group(SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK,
                                         reinterpret_cast<sockaddr*>(&a), sizeof a, fds.data(), fds.size())) {
      ADD_FAILURE() << "TCP SO_REUSEPORT group: " << strerror(-r) << ": " << syr_last_error();
      return ls;
    }
    for (int fd : fds) ls.emplace_back(fd);
    for (int fd : fds)
      if (listen(fd, 64) != 0) ADD_FAILURE() << "listen: " << strerror(errno);
    return ls;
  }
  static std::vector<int> raw(const std::vector<UniqueFd>& v) {
    std::vector<int> fds;
    for (auto& f : v) fds.push_back(f.get());
    return fds;
  }

  static Daemon* daemon_;
  std::vector<int> ids_;
};
Daemon* SocketSelect::daemon_ = nullptr;

TEST_F(SocketSelect, RoundRobinSplitsOneFlowExactlyEvenly) {
  UdpGroup g(4);
  ASSERT_GT(deploy("policies/round_robin.c", g), 0) << syr_last_error();
  UdpClient c(g.port());
  for (int i = 0; i < 400; i++) c.send_request(1, i);
  EXPECT_EQ(g.drain(), (std::vector<int>{100, 100, 100, 100}));
}

TEST_F(SocketSelect, PassKeepsTheKernelHashOneFlowOneSocket) {
  UdpGroup g(4);
  ASSERT_GT(deploy("policies/pass.c", g), 0) << syr_last_error();
  UdpClient c(g.port());
  for (int i = 0; i < 200; i++) c.send_request(1, i);
  auto counts = g.drain();
  EXPECT_EQ(std::count(counts.begin(), counts.end(), 200), 1) << "one flow must hash to one socket";
  EXPECT_EQ(std::count(counts.begin(), counts.end(), 0), 3);
}

TEST_F(SocketSelect, SitaSendsEveryLongRequestToExecutorZeroAndNoShortOne) {
  UdpGroup g(4);
  ASSERT_GT(deploy("policies/sita.c", g, {{"long_type", 7}}), 0) << syr_last_error();
  UdpClient c(g.port());
  for (int i = 0; i < 300; i++) c.send_request(i % 10 == 0 ? 7 : 1, i);
  std::vector<std::vector<std::string>> got;
  auto counts = g.drain(&got);
  ASSERT_EQ(counts[0], 30);
  for (auto& p : got[0]) EXPECT_EQ(p[0], 7) << "a short request reached executor 0";
  for (int i = 1; i < 4; i++) {
    EXPECT_EQ(counts[i], 90);  // 270 short requests, round robin over 3
    for (auto& p : got[i]) EXPECT_EQ(p[0], 1) << "a long request reached executor " << i;
  }
}

// The README's policy example, as the README shows it (the first C block under "Writing
// a policy"): long requests (type 2) to executor 0, short ones round robin over the rest.
TEST_F(SocketSelect, ReadmePolicyExampleDoesWhatItsCommentSays) {
  std::string readme = read_text(source_path("README.md"));
  size_t section = readme.find("\n## Writing a policy\n");
  ASSERT_NE(section, std::string::npos) << "README.md has no 'Writing a policy' section";
  size_t begin = readme.find("\n```c\n", section), end = readme.find("\n```\n", begin + 1);
  ASSERT_TRUE(begin != std::string::npos && end != std::string::npos) << "no C block under 'Writing a policy'";
  std::string source = readme.substr(begin + 6, end + 1 - (begin + 6));
  ASSERT_NE(source.find("SYR_POLICY("), std::string::npos) << source;
  UdpGroup g(4);
  auto fds = g.fds();
  syr_deploy_opts o{.sz = sizeof o, .app = "socktest", .fds = fds.data(), .n_fds = fds.size()};
  int id = syr_deploy_policy_source(source.data(), source.size(), "README.md", SYR_HOOK_SOCKET_SELECT, &o);
  ASSERT_GT(id, 0) << syr_last_error() << "\n" << source;
  ids_.push_back(id);
  UdpClient c(g.port());
  for (int i = 0; i < 40; i++) c.send_request(i % 4 == 0 ? 2 : 1, i);
  std::vector<std::vector<std::string>> got;
  EXPECT_EQ(g.drain(&got), (std::vector<int>{10, 10, 10, 10}));
  for (auto& p : got[0]) EXPECT_EQ(p[0], 2) << "a short request reached executor 0";
  for (int i = 1; i < 4; i++)
    for (auto& p : got[i]) EXPECT_EQ(p[0], 1) << "a long request reached executor " << i;
}

TEST_F(SocketSelect, ScanAvoidNeverPicksAMarkedExecutorWhileAnUnmarkedOneExists) {
  UdpGroup g(4);
  ASSERT_GT(deploy("policies/scan_avoid.c", g), 0) << syr_last_error();
  syr_mapped_array m{};
  ASSERT_EQ(mmap_app_map("scan_map", &m, "socktest"), "");
  UdpClient c(g.port());

  syr_hint_set(&m, 0, 1);
  syr_hint_set(&m, 2, 1);
  for (int i = 0; i < 100; i++) c.send_request(1, i);
  EXPECT_EQ(g.drain(), (std::vector<int>{0, 50, 0, 50})) << "the free executors share evenly";

  // Move the marks: only executor 2 is free now.
  syr_hint_set(&m, 0, 1);
  syr_hint_set(&m, 1, 1);
  syr_hint_set(&m, 2, 0);
  syr_hint_set(&m, 3, 1);
  for (int i = 0; i < 100; i++) c.send_request(1, i);
  EXPECT_EQ(g.drain(), (std::vector<int>{0, 0, 100, 0}));

  // All marked: the policy still delivers (round robin), it never drops.
  syr_hint_set(&m, 2, 1);
  for (int i = 0; i < 100; i++) c.send_request(1, i);
  EXPECT_EQ(g.drain(), (std::vector<int>{25, 25, 25, 25}));
  syr_map_munmap(&m);
}

TEST_F(SocketSelect, SitaSpreadsLongRequestsOverItsLongExecutors) {
  UdpGroup g(5);
  ASSERT_GT(deploy("policies/sita.c", g, {{"long_type", 7}, {"long_executors", 2}}), 0) << syr_last_error();
  UdpClient c(g.port());
  for (int i = 0; i < 300; i++) c.send_request(i % 5 == 0 ? 7 : 1, i);
  std::vector<std::vector<std::string>> got;
  auto counts = g.drain(&got);
  EXPECT_EQ(counts, (std::vector<int>{30, 30, 80, 80, 80})) << "60 long over 2, 240 short over 3";
  for (int i = 0; i < 2; i++)
    for (auto& p : got[i]) EXPECT_EQ(p[0], 7) << "a short request reached long executor " << i;
  for (int i = 2; i < 5; i++)
    for (auto& p : got[i]) EXPECT_EQ(p[0], 1) << "a long request reached short executor " << i;
}

// A policy must pass the verifier for every group size the hook accepts, not just the
// handful of sockets the other tests use: scan_avoid used to count the free executors and
// then pick the k-th, which the verifier explored in ~n^3 states and rejected ("program
// too large") from about 24 sockets on.
TEST_F(SocketSelect, ShippedPoliciesLoadAndDeliverWithTheLargestGroup) {
  UdpGroup g(253);  // the most sockets one deploy can pass (SCM_MAX_FD)
  UdpClient c(g.port());
  for (const char* p : {"pass.c", "round_robin.c", "scan_avoid.c", "sita.c", "least_loaded.c", "socket_local.c"}) {
    SCOPED_TRACE(p);
    int id = deploy(std::string("policies/") + p, g);
    ASSERT_GT(id, 0) << syr_last_error();
    for (int i = 0; i < 20; i++) c.send_request(1, i);
    auto counts = g.drain();
    EXPECT_EQ(std::accumulate(counts.begin(), counts.end(), 0), 20) << "every request delivered";
    EXPECT_EQ(syr_remove_policy(id), 0) << syr_last_error();
    ids_.pop_back();
  }
}

TEST_F(SocketSelect, ScanAvoidMarksTheExecutorItHandsALongRequest) {
  // The long request sits unread in its socket (nobody has started it), yet the requests
  // after it already avoid that executor: the policy marked it when it steered the long
  // one there, and the application's clear at the end releases it.
  UdpGroup g(4);
  ASSERT_GT(deploy("policies/scan_avoid.c", g, {{"long_type", 2}}), 0) << syr_last_error();
  syr_mapped_array m{};
  ASSERT_EQ(mmap_app_map("scan_map", &m, "socktest"), "");
  UdpClient c(g.port());
  c.send_request(2, 0);
  auto first = g.drain();
  int scan_at = static_cast<int>(std::find(first.begin(), first.end(), 1) - first.begin());
  ASSERT_LT(scan_at, 4) << "the long request was not delivered";
  EXPECT_EQ(syr_hint_get(&m, static_cast<uint32_t>(scan_at)), 1u) << "executor " << scan_at << " not marked";
  c.send_request(2, 0);  // a second long request: the policy steers and marks it elsewhere
  for (int i = 0; i < 40; i++) c.send_request(1, i);
  auto counts = g.drain();
  EXPECT_EQ(counts[scan_at], 0) << "a request went to the executor holding the long one";
  int marked = 0;
  for (uint32_t i = 0; i < 4; i++) marked += syr_hint_get(&m, i) != 0;
  EXPECT_EQ(marked, 2);
  for (uint32_t i = 0; i < 4; i++) syr_hint_set(&m, i, 0);  // the application finished them
  for (int i = 0; i < 40; i++) c.send_request(1, i);
  EXPECT_EQ(g.drain(), (std::vector<int>{10, 10, 10, 10}));
  syr_map_munmap(&m);
}

// keep_free = 1: a long request does not take the last unmarked executor; it queues
// behind another long one, so short requests always find a free executor.
TEST_F(SocketSelect, ScanAvoidKeepsAnExecutorFreeForShortRequests) {
  UdpGroup g(4);
  ASSERT_GT(deploy("policies/scan_avoid.c", g, {{"long_type", 2}, {"keep_free", 1}}), 0) << syr_last_error();
  syr_mapped_array m{};
  ASSERT_EQ(mmap_app_map("scan_map", &m, "socktest"), "");
  UdpClient c(g.port());
  for (uint32_t i = 0; i < 3; i++) syr_hint_set(&m, i, 1);  // only executor 3 is free
  for (int i = 0; i < 30; i++) c.send_request(2, i);
  EXPECT_EQ(g.drain(), (std::vector<int>{10, 10, 10, 0})) << "long requests queue behind the long ones";
  EXPECT_EQ(syr_hint_get(&m, 3), 0u) << "the free executor was marked";
  for (int i = 0; i < 10; i++) c.send_request(1, i);
  EXPECT_EQ(g.drain(), (std::vector<int>{0, 0, 0, 10})) << "short requests take the free one";

  // Two free: the first long request takes one of them, the next ones queue behind long
  // ones (that one included); the other free executor gets none and stays unmarked.
  syr_hint_set(&m, 2, 0);
  for (int i = 0; i < 4; i++) c.send_request(2, i);
  auto got = g.drain();
  int unmarked = -1, n_unmarked = 0;
  for (int i = 0; i < 4; i++)
    if (syr_hint_get(&m, static_cast<uint32_t>(i)) == 0) unmarked = i, n_unmarked++;
  ASSERT_EQ(n_unmarked, 1) << "one of the two free executors took a long request";
  EXPECT_TRUE(unmarked == 2 || unmarked == 3) << unmarked;
  EXPECT_EQ(got[unmarked], 0) << "a long request took the last free executor";
  EXPECT_EQ(got[0] + got[1] + got[2] + got[3], 4);
  for (uint32_t i = 0; i < 4; i++) syr_hint_set(&m, i, 0);
  syr_map_munmap(&m);
}

// The default (keep_free = 0, the talk's policy): long requests avoid marked executors
// like any other request.
TEST_F(SocketSelect, ScanAvoidWithoutAReserveLetsLongRequestsTakeTheLastFreeExecutor) {
  UdpGroup g(4);
  ASSERT_GT(deploy("policies/scan_avoid.c", g, {{"long_type", 2}}), 0) << syr_last_error();
  syr_mapped_array m{};
  ASSERT_EQ(mmap_app_map("scan_map", &m, "socktest"), "");
  UdpClient c(g.port());
  for (uint32_t i = 0; i < 3; i++) syr_hint_set(&m, i, 1);
  c.send_request(2, 0);
  EXPECT_EQ(g.drain(), (std::vector<int>{0, 0, 0, 1}));
  EXPECT_EQ(syr_hint_get(&m, 3), 1u);
  for (uint32_t i = 0; i < 4; i++) syr_hint_set(&m, i, 0);
  syr_map_munmap(&m);
}

TEST_F(SocketSelect, LeastLoadedFollowsTheQueueLengthsInTheMap) {
  UdpGroup g(4);
  ASSERT_GT(deploy("policies/least_loaded.c", g), 0) << syr_last_error();
  int fd = syr_map_open_app("socktest", "queue_len");
  ASSERT_GE(fd, 0) << syr_last_error();
  UdpClient c(g.port());
  // Through the syscall path this time (syr_map_update_elem).
  uint64_t q[4] = {5, 3, 9, 1};
  for (uint32_t i = 0; i < 4; i++) ASSERT_EQ(syr_map_update_elem(fd, &i, &q[i], 0), 0);
  for (int i = 0; i < 50; i++) c.send_request(1, i);
  EXPECT_EQ(g.drain(), (std::vector<int>{0, 0, 0, 50}));
  uint32_t k = 3;
  uint64_t v = 10;
  ASSERT_EQ(syr_map_update_elem(fd, &k, &v, 0), 0);  // now executor 1 is the shortest
  for (int i = 0; i < 50; i++) c.send_request(1, i);
  EXPECT_EQ(g.drain(), (std::vector<int>{0, 50, 0, 0}));
  uint64_t back = 0;
  ASSERT_EQ(syr_map_lookup_elem(fd, &k, &back), 0);
  EXPECT_EQ(back, 10u);
  close(fd);
}

TEST_F(SocketSelect, IndexPastTheExecutorsFallsBackToTheKernelNeverDrops) {
  UdpGroup g(3);
  int id = deploy("tests/policies/out_of_range.c", g);
  ASSERT_GT(id, 0) << syr_last_error();
  UdpClient c(g.port());
  for (int i = 0; i < 60; i++) c.send_request(1, i);
  auto counts = g.drain();
  EXPECT_EQ(counts[0] + counts[1] + counts[2], 60);
  std::string out;
  ASSERT_EQ(run_cmd(build_bin("syrupctl") + " --json stats " + std::to_string(id), out), 0) << out;
  auto j = nlohmann::json::parse(out);
  EXPECT_EQ(j[0]["fallback"], 60);
  EXPECT_EQ(j[0]["drop"], 0);
}

TEST_F(SocketSelect, DropIsOnlyWhatThePolicyAsksFor) {
  UdpGroup g(2);
  int id = deploy("tests/policies/drop_all.c", g);
  ASSERT_GT(id, 0) << syr_last_error();
  UdpClient c(g.port());
  for (int i = 0; i < 20; i++) c.send_request(1, i);
  EXPECT_EQ(g.drain(), (std::vector<int>{0, 0}));
  std::string out;
  ASSERT_EQ(run_cmd(build_bin("syrupctl") + " --json stats " + std::to_string(id), out), 0) << out;
  EXPECT_EQ(nlohmann::json::parse(out)[0]["drop"], 20);
}

TEST_F(SocketSelect, RemovingThePolicyRestoresTheKernelHash) {
  UdpGroup g(4);
  int id = deploy("policies/round_robin.c", g);
  ASSERT_GT(id, 0) << syr_last_error();
  ASSERT_EQ(syr_remove_policy(id), 0) << syr_last_error();
  ids_.clear();
  UdpClient c(g.port());
  for (int i = 0; i < 100; i++) c.send_request(1, i);
  auto counts = g.drain();
  EXPECT_EQ(std::count(counts.begin(), counts.end(), 100), 1);
  EXPECT_FALSE(std::filesystem::exists(daemon_->bpffs_root() + "/apps/socktest"))
      << "pins of a removed policy's application must be gone";
}

TEST_F(SocketSelect, TcpRoundRobinSpreadsConnectionsExactlyEvenly) {
  constexpr int kListeners = 3, kPer = 8;
  sockaddr_in a;
  std::vector<UniqueFd> ls = tcp_listeners(kListeners, a);
  ASSERT_EQ(ls.size(), size_t{kListeners});
  ASSERT_GT(deploy_fds("policies/round_robin.c", raw(ls)), 0) << syr_last_error();

  std::vector<UniqueFd> clients;
  for (int i = 0; i < kListeners * kPer; i++) {
    UniqueFd c(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    ASSERT_EQ(connect(c.get(), reinterpret_cast<sockaddr*>(&a), sizeof a), 0) << strerror(errno);
    clients.push_back(std::move(c));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  std::vector<int> accepted(kListeners);
  for (int i = 0; i < kListeners; i++) {
    int c;
    while ((c = accept(ls[i].get(), nullptr, nullptr)) >= 0) {
      accepted[i]++;
      close(c);
    }
  }
  EXPECT_EQ(accepted, std::vector<int>(kListeners, kPer));
}

// A listener the application closes takes no more connections, at once: the policy's
// choices of it fall back to the kernel's hash over the listeners still open, and with
// none left a connect is refused. Before, syrupd's duplicate kept it listening, and the
// connections it took waited, unaccepted, until the application exited.
TEST_F(SocketSelect, AListenerTheApplicationClosesTakesNoMoreConnections) {
  sockaddr_in a;
  std::vector<UniqueFd> ls = tcp_listeners(2, a);
  ASSERT_EQ(ls.size(), 2u);
  ASSERT_GT(deploy_fds("policies/round_robin.c", raw(ls)), 0) << syr_last_error();

  ls[0].reset();
  std::vector<UniqueFd> clients;
  for (int i = 0; i < 6; i++) {
    UniqueFd c(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    ASSERT_EQ(connect(c.get(), reinterpret_cast<sockaddr*>(&a), sizeof a), 0) << strerror(errno);
    clients.push_back(std::move(c));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  int accepted = 0, c;
  while ((c = accept(ls[1].get(), nullptr, nullptr)) >= 0) {
    accepted++;
    close(c);
  }
  EXPECT_EQ(accepted, 6) << "round robin's every other connection went to the closed listener";

  ls[1].reset();
  UniqueFd late(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  EXPECT_EQ(connect(late.get(), reinterpret_cast<sockaddr*>(&a), sizeof a), -1);
  EXPECT_EQ(errno, ECONNREFUSED) << "with every listener closed, nothing may listen on the port";
}

// A policy whose group has ended (the application closed every socket of it) schedules
// nothing; it must say so and not keep the address from a new group. `list` shows it
// "ended", a deploy on a new group at that address (another application's) takes its
// place at once, and without any deploy syrupd removes it within seconds (every 2 s it
// looks). Before, it stayed listed as running, and the new group's deploy was refused
// with EBUSY as "scheduled by application 'first'" until the owner exited.
TEST_F(SocketSelect, APolicyWhoseSocketsAreAllClosedEndsAndFreesItsAddress) {
  auto group = std::make_unique<UdpGroup>(2);
  uint16_t port = group->port();
  int first = deploy("policies/round_robin.c", *group, {}, "first");
  ASSERT_GT(first, 0) << syr_last_error();
  auto listed = [](int id) {
    std::string out;
    EXPECT_EQ(run_cmd(build_bin("syrupctl") + " --json list", out), 0) << out;
    for (auto& p : nlohmann::json::parse(out))
      if (p["id"] == id) return p;
    return nlohmann::json();
  };
  EXPECT_EQ(listed(first)["open_executors"], 2);
  EXPECT_FALSE(listed(first).contains("status"));
  std::string stats;
  ASSERT_EQ(run_cmd(build_bin("syrupctl") + " --json stats " + std::to_string(first), stats), 0) << stats;
  EXPECT_EQ(nlohmann::json::parse(stats)[0]["open_executors"], 2) << stats;
  std::string group_name = "udp/127.0.0.1:" + std::to_string(port);

  group.reset();
  nlohmann::json p = listed(first);
  if (!p.is_null()) {  // unless the 2 s look came first
    EXPECT_EQ(p["open_executors"], 0);
    EXPECT_EQ(p["status"], "ended: every socket of its group " + group_name + " was closed") << p.dump();
  }
  UdpGroup again(2, port);
  int second = deploy("policies/round_robin.c", again, {}, "second");
  ASSERT_GT(second, 0) << syr_last_error();
  EXPECT_EQ(syr_remove_policy(first), -ENOENT);
  EXPECT_EQ(std::string(syr_last_error()), "no policy " + std::to_string(first) +
                                               " (round_robin.c of app 'first' was removed: every socket of "
                                               "its group " + group_name + " was closed)");
  UdpClient c(port);
  for (int i = 0; i < 40; i++) c.send_request(1, i);
  EXPECT_EQ(again.drain(), (std::vector<int>{20, 20}));

  // No deploy: the periodic look finds it.
  auto third_group = std::make_unique<UdpGroup>(1);
  int third = deploy("policies/pass.c", *third_group, {}, "third");
  ASSERT_GT(third, 0) << syr_last_error();
  third_group.reset();
  EXPECT_GE(wait_for([&] { return listed(third).is_null(); }, 5000), 0) << "the ended policy is still listed";
}

// Runs `body` in a forked child, so that what it changes (its uid, a network namespace
// and its sysctls, a file limit) never touches the test process; the child reports a problem with
// child_fails(code, why), which fails the test with that message.
[[noreturn]] void child_fails(int code, const std::string& why) {
  fprintf(stderr, "child: %s\n", why.c_str());
  _exit(code);
}
void expect_child_passes(const std::function<void()>& body) {
  pid_t c = fork();
  ASSERT_GE(c, 0);
  if (c == 0) {
    body();
    _exit(0);
  }
  int st = 0;
  ASSERT_EQ(waitpid(c, &st, 0), c);
  ASSERT_TRUE(WIFEXITED(st));
  EXPECT_EQ(WEXITSTATUS(st), 0) << "see the child's message above";
}

// A forked process that deploys (`deploy` returns the policy id, or -errno) and then
// lives until release(): an owner the test can let exit while the test process keeps the
// sockets they share, as a worker forked by the application would.
class OwnerProcess {
 public:
  explicit OwnerProcess(const std::function<int()>& deploy) {
    int res[2], hold[2];
    // Close-on-exec: a syrupd the test starts later must not keep the owner waiting.
    if (pipe2(res, O_CLOEXEC) || pipe2(hold, O_CLOEXEC)) {
      ADD_FAILURE() << "pipe: " << strerror(errno);
      return;
    }
    pid_ = fork();
    if (pid_ == 0) {
      ::close(res[0]);
      ::close(hold[1]);
      int id = deploy();
      std::string why = id > 0 ? "" : syr_last_error();
      (void)!write(res[1], &id, sizeof id);
      (void)!write(res[1], why.data(), why.size());
      ::close(res[1]);
      char c;
      (void)!read(hold[0], &c, 1);  // until the test closes its end
      _exit(0);
    }
    ::close(res[1]);
    ::close(hold[0]);
    hold_ = hold[1];
    char buf[512];
    if (pid_ < 0 || read(res[0], &id_, sizeof id_) != static_cast<ssize_t>(sizeof id_)) {
      ADD_FAILURE() << "the owner process did not report its deploy";
      id_ = 0;
    }
    ssize_t n = pid_ > 0 ? read(res[0], buf, sizeof buf) : 0;
    if (n > 0) error_.assign(buf, static_cast<size_t>(n));
    ::close(res[0]);
  }
  ~OwnerProcess() { release(); }
  int id() const { return id_; }                   // the deploy's answer
  const std::string& error() const { return error_; }  // its syr_last_error() if it failed
  pid_t pid() const { return pid_; }
  // Lets the owner exit and reaps it (killed if it has not exited within 5 s).
  void release() {
    if (hold_ >= 0) ::close(hold_);
    hold_ = -1;
    if (pid_ <= 0 || reaped_) return;
    if (wait_for([&] { return waitpid(pid_, nullptr, WNOHANG) == pid_; }, 5000) < 0) {
      ADD_FAILURE() << "the owner process " << pid_ << " did not exit";
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    reaped_ = true;
  }

 private:
  pid_t pid_ = -1;
  int hold_ = -1;
  int id_ = 0;
  bool reaped_ = false;
  std::string error_;
};

// Sends `n` requests on the one flow of `c` to `g`: how many its sockets received.
int delivered(UdpGroup& g, UdpClient& c, int n = 10) {
  for (int i = 0; i < n; i++) c.send_request(1, static_cast<uint32_t>(i));
  auto counts = g.drain();
  return std::accumulate(counts.begin(), counts.end(), 0);
}

// Waits up to 3 s for syrupctl to list no policy.
bool none_listed() {
  return wait_for([] { return list_policies() == nlohmann::json::array(); }, 3000) >= 0;
}

// Sockets of this process with a net_cls class id of their own: a thread of the test's
// joins a cgroup-v1 net_cls group (on a hierarchy mounted for the test) with class id
// `id`, makes them -- by default one UDP socket bound to 127.0.0.1 (fd()); else `make`,
// which says whether it succeeded -- and stays there until the end. A socket keeps that
// class id until a process takes it (pidfd_getfd re-tags it with the taker's: syrupd's
// is 0). Moving a task between net_cls groups re-tags every socket of its descriptor
// table, so the thread never moves back; it ends in the group. `skip` says why there is
// none (no cgroup-v1 net_cls on this kernel).
class ClassedSocket {
 public:
  explicit ClassedSocket(uint32_t id)
      : ClassedSocket(id, [this] {
          fd_.reset(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
          sockaddr_in a{};
          a.sin_family = AF_INET;
          a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
          if (bind(fd_.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) fd_.reset();
          return static_cast<bool>(fd_);
        }) {}
  ClassedSocket(uint32_t id, const std::function<bool()>& make) : group_(mnt_.path() + "/syrup-test") {
    if (mount("none", mnt_.path().c_str(), "cgroup", 0, "net_cls") != 0) {
      skip = std::string("cannot mount a cgroup-v1 net_cls hierarchy: ") + strerror(errno);
      return;
    }
    mounted_ = true;
    if (mkdir(group_.c_str(), 0755) != 0 || !write(group_ + "/net_cls.classid", std::to_string(id))) {
      skip = std::string("cannot make a net_cls group: ") + strerror(errno);
      return;
    }
    std::promise<void> made;
    bool ok = false;
    thread_ = std::thread([&] {
      ok = write(group_ + "/tasks", std::to_string(gettid())) && make();
      made.set_value();
      end_.get_future().wait();
    });
    made.get_future().wait();
    if (!ok) skip = "cannot make the sockets in the net_cls group";
  }
  ~ClassedSocket() {
    if (thread_.joinable()) {
      end_.set_value();
      thread_.join();
    }
    if (!mounted_) return;
    // The ended thread leaves the group a moment after join().
    wait_for([&] { return rmdir(group_.c_str()) == 0 || errno != EBUSY; }, 2000);
    umount(mnt_.path().c_str());
  }
  int fd() const { return fd_.get(); }
  std::string skip;

 private:
  static bool write(const std::string& path, const std::string& v) {
    std::ofstream f(path);
    f << v << "\n";
    f.close();
    return static_cast<bool>(f);
  }
  TempDir mnt_;
  std::string group_;
  bool mounted_ = false;
  UniqueFd fd_;
  std::promise<void> end_;
  std::thread thread_;
};

// The class id sock_diag reports for socket `fd` (0 when it finds none).
uint32_t class_id(int fd) {
  uint64_t cookie = 0;
  socklen_t len = sizeof cookie;
  std::vector<inet_diag::InetSock> all;
  std::string err;
  if (getsockopt(fd, SOL_SOCKET, SO_COOKIE, &cookie, &len) || inet_diag::all_sockets(all, err)) return 0;
  for (const auto& s : all)
    if (s.cookie == cookie) return s.class_id;
  return 0;
}

// A group of two sockets and a client of it, in a new network namespace with loopback up
// made by a thread that has left it again: no task is in that namespace; only its sockets
// and, if `name` is given, /run/netns/<name> (removed at the end) hold it. The group is
// on 127.0.0.1:`port` (0: any). `failed` says what went wrong, if anything.
struct NamespaceGroup {
  explicit NamespaceGroup(const std::string& name = "", uint16_t port = 0) : name_(name) {
    std::string out;
    if (!name.empty() && run_cmd("ip netns add " + name, out) != 0) {
      failed = "ip netns add " + name + ": " + out;
      return;
    }
    std::thread([&] {
      UniqueFd home(open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC));
      UniqueFd named(name.empty() ? -1 : open(("/run/netns/" + name).c_str(), O_RDONLY | O_CLOEXEC));
      if (name.empty() ? unshare(CLONE_NEWNET) != 0 : (!named || setns(named.get(), CLONE_NEWNET) != 0))
        return void(failed = std::string("into a new namespace: ") + strerror(errno));
      UniqueFd ctl(socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
      ifreq ifr{};
      std::snprintf(ifr.ifr_name, sizeof ifr.ifr_name, "lo");
      ifr.ifr_flags = IFF_UP;
      if (ioctl(ctl.get(), SIOCSIFFLAGS, &ifr) != 0) return void(failed = std::string("lo up: ") + strerror(errno));
      group = std::make_unique<UdpGroup>(2, port);
      client = std::make_unique<UdpClient>(group->port());
      if (!home || setns(home.get(), CLONE_NEWNET) != 0) failed = std::string("back home: ") + strerror(errno);
    }).join();
  }
  ~NamespaceGroup() {
    client.reset();
    group.reset();
    std::string out;
    if (!name_.empty()) run_cmd("ip netns del " + name_, out);
  }
  std::unique_ptr<UdpGroup> group;
  std::unique_ptr<UdpClient> client;
  std::string failed;

 private:
  std::string name_;
};

// Deploys drop_all.c on `g` through a syrupd that then dies and loses its state file,
// so that the syrupd started next finds the policy as a leftover: it must detach it, and
// `c`'s datagrams reach the group again.
void expect_leftover_detached(UdpGroup& g, UdpClient& c) {
  Daemon d;
  d.start();
  ASSERT_GT(deploy_on(g, "tests/policies/drop_all.c", "leftover"), 0) << syr_last_error();
  EXPECT_EQ(delivered(g, c), 0);
  d.crash();
  ASSERT_EQ(unlink(d.state_file().c_str()), 0) << strerror(errno);
  d.start(d.bpffs_root());
  EXPECT_NE(d.log().find("found 1 policies of a previous syrupd"), std::string::npos) << d.log();
  EXPECT_EQ(delivered(g, c), 10) << "the leftover program still drops";
  EXPECT_EQ(d.stop(), 0);
}

constexpr uint32_t kTestClassId = 0x100001;

// The executors' group must be the application's alone. Given port 0 with SO_REUSEPORT,
// the kernel may hand out a port another group of the same user holds, and the socket
// joins that group (Tenants.DeployAndExitCyclesLeakNothing once failed on it: a child's
// group got the port of the test's own group). In a network namespace of its own, whose
// ephemeral range is one port held by a group, syr_open_reuseport_group() fails with
// EADDRINUSE instead; with a second port in the range, it gets that one every time.
// A child process does it, so the namespace and its sysctl never touch the test's.
TEST(ReuseportGroup, PortZeroNeverJoinsAnotherGroupOfTheSameUser) {
  SYRUP_REQUIRE_ROOT();
  expect_child_passes([] {
    if (unshare(CLONE_NEWNET) != 0) child_fails(10, std::string("unshare: ") + strerror(errno));
    UniqueFd ctl(socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    ifreq ifr{};
    std::snprintf(ifr.ifr_name, sizeof ifr.ifr_name, "lo");
    ifr.ifr_flags = IFF_UP;
    if (ioctl(ctl.get(), SIOCSIFFLAGS, &ifr) != 0) child_fails(10, "lo up failed");
    auto range = [&](const char* r) {
      std::ofstream f("/proc/sys/net/ipv4/ip_local_port_range");
      f << r << "\n";
      f.close();
      if (!f) child_fails(10, std::string("cannot set ip_local_port_range to ") + r);
    };
    auto open_group = [](int type, int* fds, size_t n, uint16_t* port) {
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      int r = syr_open_reuseport_group(type, reinterpret_cast<sockaddr*>(&a), sizeof a, fds, n);
      *port = ntohs(a.sin_port);
      return r;
    };
    auto plain_port_zero_bind = [] {  // what the call replaces; the fd stays open
      int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0), one = 1;
      setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      socklen_t l = sizeof a;
      if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) < 0) return std::pair{fd, 0};
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &l);
      return std::pair{fd, static_cast<int>(ntohs(a.sin_port))};
    };
    for (int type : {SOCK_DGRAM, SOCK_STREAM}) {
      const std::string proto = type == SOCK_DGRAM ? "udp" : "tcp";
      range("40000 40000");
      int held[3] = {-1, -1, -1};
      uint16_t port = 0;
      if (int r = open_group(type, held, 3, &port); r != 0 || port != 40000)
        child_fails(11, proto + ": the first group: " + strerror(-r) + " port " + std::to_string(port));
      for (int fd : held) {
        int v = 0;
        socklen_t l = sizeof v;
        sockaddr_in a{};
        socklen_t al = sizeof a;
        getsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &v, &l);
        getsockname(fd, reinterpret_cast<sockaddr*>(&a), &al);
        if (v != 1 || ntohs(a.sin_port) != 40000) child_fails(11, proto + ": a member lacks SO_REUSEPORT or the port");
      }
      if (type == SOCK_DGRAM) {  // the kernel's behaviour the call guards against
        auto [fd, p] = plain_port_zero_bind();
        fprintf(stderr, "child: udp: a plain port-0 SO_REUSEPORT bind %s\n",
                p == 40000 ? "joined the group on 40000" : "did not join the group");
        close(fd);
      }
      int other[2] = {-1, -1};
      int r = open_group(type, other, 2, &port);
      if (r != -EADDRINUSE) child_fails(12, proto + ": want EADDRINUSE with the only port held, got " + std::to_string(r));
      if (other[0] != -1 || other[1] != -1) child_fails(12, proto + ": fds written on failure");
      if (std::string(syr_last_error()).find("no free port on 127.0.0.1") == std::string::npos)
        child_fails(12, proto + ": error text: " + syr_last_error());
      range("40000 40001");
      for (int i = 0; i < 20; i++) {
        if ((r = open_group(type, other, 2, &port)) != 0 || port != 40001)
          child_fails(13, proto + ": round " + std::to_string(i) + ": " + strerror(-r) + " port " + std::to_string(port));
        close(other[0]), close(other[1]);
      }
      for (int fd : held) close(fd);
    }
  });
}

// A group that cannot be completed -- here the process runs out of file descriptors in
// the middle of it -- leaves nothing behind: -EMFILE, no socket open, and every fds[i]
// -1, so a caller that closes what it was given closes nothing twice. A child process
// does it, under a file limit of its own.
TEST(ReuseportGroup, AGroupThatFailsMidwayLeavesNoSocketAndNoFdNumber) {
  expect_child_passes([] {
    auto open_fds = [] {
      std::vector<int> fds;
      for (auto& e : std::filesystem::directory_iterator("/proc/self/fd"))
        fds.push_back(std::stoi(e.path().filename().string()));
      return fds;  // the iterator's own fd included, alike every time
    };
    std::vector<int> before = open_fds();
    int top = *std::max_element(before.begin(), before.end());
    // Room for exactly the free numbers below top + 4: the holes and three more.
    rlimit lim{static_cast<rlim_t>(top + 4), static_cast<rlim_t>(top + 4)};
    if (setrlimit(RLIMIT_NOFILE, &lim) != 0) child_fails(10, std::string("setrlimit: ") + strerror(errno));
    size_t room = static_cast<size_t>(top + 4) - before.size() + 1;  // the iterator's fd is closed now
    std::vector<int> fds(room + 4, 12345);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int r = syr_open_reuseport_group(SOCK_DGRAM | SOCK_CLOEXEC, reinterpret_cast<sockaddr*>(&a), sizeof a,
                                     fds.data(), fds.size());
    if (r != -EMFILE) child_fails(11, "want -EMFILE from a group of " + std::to_string(fds.size()) + " with room for " +
                                  std::to_string(room) + ", got " + std::to_string(r) + " (" + syr_last_error() + ")");
    for (size_t i = 0; i < fds.size(); i++)
      if (fds[i] != -1) child_fails(12, "fds[" + std::to_string(i) + "] is " + std::to_string(fds[i]) + " after the failure");
    if (std::string(syr_last_error()).find("SO_REUSEPORT socket on 127.0.0.1") == std::string::npos)
      child_fails(13, std::string("error text: ") + syr_last_error());
    if (std::vector<int> after = open_fds(); after != before)
      child_fails(14, "open fds: " + std::to_string(before.size()) + " before, " + std::to_string(after.size()) + " after");
  });
}

TEST_F(SocketSelect, UnmodifiedProcessByPidTakesItsSocketsInFdOrder) {
  // The "unmodified application" is this process: its sockets are taken by syrupd with
  // pidfd_getfd, executor i being the i-th socket in ascending fd order.
  UdpGroup g(3);
  ASSERT_EQ(deploy_pid(g.port(), "by_key.c"), "");
  UdpClient c(g.port());
  for (uint32_t k = 0; k < 90; k++) c.send_request(1, k);
  std::vector<std::vector<std::string>> got;
  EXPECT_EQ(g.drain(&got), (std::vector<int>{30, 30, 30}));
  for (int i = 0; i < 3; i++)
    for (auto& p : got[i]) {
      uint32_t key;
      memcpy(&key, p.data() + 4, 4);
      EXPECT_EQ(key % 3, static_cast<uint32_t>(i)) << "executor order is not ascending fd order";
    }
  std::string out;
  ASSERT_EQ(run_cmd(build_bin("syrupctl") + " list", out), 0);
  EXPECT_NE(out.find("pidtest"), std::string::npos) << out;
  EXPECT_NE(out.find("by_key.c"), std::string::npos) << out;
}

// A process with SO_REUSEPORT groups on several addresses of one port (a server bound to
// each of its addresses): which group is meant must be said, not guessed. Before, the
// first socket found fixed the group and the other group went unscheduled, silently.
TEST_F(SocketSelect, AProcessWithGroupsOnSeveralAddressesOfThePortIsScheduledAtTheAddressNamed) {
  UdpGroup one(2);
  UdpGroup two(2, one.port(), "127.0.0.2");
  ASSERT_EQ(two.port(), one.port());
  std::string port = std::to_string(one.port()), out;
  std::string deploy = build_bin("syrupctl") + " deploy --hook socket-select --app addrtest --pid " +
                       std::to_string(getpid()) + " --port " + port + " " + source_path("tests/policies/by_key.c");
  EXPECT_EQ(run_cmd(deploy, out), 1) << out;
  EXPECT_NE(out.find("has 2 SO_REUSEPORT udp groups on port " + port +
                     " (bound to 127.0.0.1, 127.0.0.2): say which with address (syrupctl --address)"),
            std::string::npos)
      << out;
  EXPECT_EQ(run_cmd(deploy + " --address 127.0.0.3", out), 1) << out;
  EXPECT_NE(out.find("has no SO_REUSEPORT udp socket bound to 127.0.0.3 port " + port +
                     " (its groups on the port are bound to 127.0.0.1, 127.0.0.2)"),
            std::string::npos)
      << out;
  // syrupctl refuses a name where an address belongs before asking; syrupd does too.
  EXPECT_EQ(run_cmd(deploy + " --address localhost", out), 2) << out;
  EXPECT_NE(out.find("--address takes an IPv4 or IPv6 address, got 'localhost'"), std::string::npos) << out;
  {
    syr_deploy_opts bad{.sz = sizeof bad, .app = "addrtest", .pid = getpid(), .port = one.port(), .address = "localhost"};
    EXPECT_EQ(syr_deploy_policy(source_path("policies/round_robin.c").c_str(), SYR_HOOK_SOCKET_SELECT, &bad), -EINVAL);
    EXPECT_NE(std::string(syr_last_error()).find("address must be an IPv4 or IPv6 address"), std::string::npos)
        << syr_last_error();
  }

  // libsyrup, the same request: the group of 127.0.0.2 gets the policy (keys split by
  // key % 2 in fd order), and the one of 127.0.0.1 keeps the kernel's hash.
  syr_deploy_opts o{.sz = sizeof o, .app = "addrtest", .pid = getpid(), .port = one.port(), .address = "127.0.0.2"};
  int id = syr_deploy_policy(source_path("tests/policies/by_key.c").c_str(), SYR_HOOK_SOCKET_SELECT, &o);
  ASSERT_GT(id, 0) << syr_last_error();
  ids_.push_back(id);
  UdpClient to_two(two.port(), "127.0.0.2"), to_one(one.port());
  for (uint32_t k = 0; k < 40; k++) {
    to_two.send_request(1, k);
    to_one.send_request(1, k);
  }
  EXPECT_EQ(two.drain(), (std::vector<int>{20, 20})) << "the named group is not scheduled by the policy";
  std::vector<int> hashed = one.drain();
  std::sort(hashed.begin(), hashed.end());
  EXPECT_EQ(hashed, (std::vector<int>{0, 40})) << "the other group left the kernel's hash (one flow, one socket)";
  ASSERT_EQ(run_cmd(build_bin("syrupctl") + " list", out), 0);
  EXPECT_NE(out.find("udp/127.0.0.2:" + port), std::string::npos) << out;
  // Passed sockets are their group already.
  auto fds = one.fds();
  syr_deploy_opts f{.sz = sizeof f, .app = "addrtest", .fds = fds.data(), .n_fds = fds.size(), .address = "127.0.0.1"};
  EXPECT_EQ(syr_deploy_policy(source_path("policies/pass.c").c_str(), SYR_HOOK_SOCKET_SELECT, &f), -EINVAL);
  EXPECT_NE(std::string(syr_last_error()).find("address chooses among the sockets of a process (with pid)"),
            std::string::npos)
      << syr_last_error();
}

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

TEST_F(SocketSelect, LiveSwapUnderSteadyTrafficLosesAndMisroutesNothing) {
  constexpr int kSockets = 4, kDatagrams = 20000;
  UdpGroup g(kSockets);
  ASSERT_GT(deploy("tests/policies/by_key.c", g), 0) << syr_last_error();

  ByKeyTraffic traffic(g, kDatagrams, std::chrono::microseconds(50));
  // Swap back and forth between two different programs with the same mapping.
  int swaps = 0;
  for (int i = 0; i < 8; i++) {
    int id = deploy(i % 2 ? "tests/policies/by_key.c" : "tests/policies/by_key_v2.c", g);
    EXPECT_GT(id, 0) << syr_last_error();
    if (id <= 0) break;
    swaps++;
  }
  ByKeyTraffic::Result r = traffic.finish();
  EXPECT_EQ(swaps, 8);
  EXPECT_EQ(r.total, kDatagrams) << "datagrams lost during live swaps";
  EXPECT_EQ(r.misrouted, 0);
  std::string out;
  run_cmd(build_bin("syrupctl") + " --json list", out);
  EXPECT_EQ(nlohmann::json::parse(out).size(), 1u) << "replaced policies must be retired: " << out;
}

TEST_F(SocketSelect, PoliciesOfOneAppShareMapsByName) {
  UdpGroup a(2), b(2);
  int ida = deploy("policies/scan_avoid.c", a, {}, "shareapp");
  int idb = deploy("tests/policies/shares_scan_map.c", b, {}, "shareapp");
  ASSERT_GT(ida, 0) << syr_last_error();
  ASSERT_GT(idb, 0) << syr_last_error();
  syr_mapped_array m{};
  ASSERT_EQ(mmap_app_map("scan_map", &m, "shareapp"), "");
  syr_hint_set(&m, 0, 1);  // one store steers both policies away from executor 0
  UdpClient ca(a.port()), cb(b.port());
  for (int i = 0; i < 20; i++) {
    ca.send_request(1, i);
    cb.send_request(1, i);
  }
  EXPECT_EQ(a.drain(), (std::vector<int>{0, 20}));
  EXPECT_EQ(b.drain(), (std::vector<int>{0, 20}));
  // Another application's map of the same name is a different map.
  UdpGroup c(2);
  ASSERT_GT(deploy("policies/scan_avoid.c", c, {}, "otherapp"), 0) << syr_last_error();
  UdpClient cc(c.port());
  for (int i = 0; i < 20; i++) cc.send_request(1, i);
  EXPECT_EQ(c.drain(), (std::vector<int>{10, 10}));
  syr_map_munmap(&m);
}

// syr_map_mmap() of syr_map_open(name)'s unchecked result, the README's form, with a name the application
// does not have: the open's reason reaches the caller, and `a` is zeroed, so nothing
// stores through a stale pointer.
TEST_F(SocketSelect, MmapOfAMapTheApplicationLacksSaysWhyAndZeroesTheArray) {
  UdpGroup g(2);
  ASSERT_GT(deploy("policies/scan_avoid.c", g), 0) << syr_last_error();
  syr_mapped_array a;
  std::memset(&a, 0xab, sizeof a);
  EXPECT_EQ(syr_map_mmap(syr_map_open_app("socktest", "scan_mpa"), &a), -ENOENT);
  EXPECT_EQ(a.base, nullptr);
  EXPECT_EQ(a.mapped_len, 0u);
  EXPECT_EQ(std::string(syr_last_error()),
            "application 'socktest' has no map 'scan_mpa' (it has scan_map; maps exist while a deployed policy "
            "declares them)");
}

// Removing an id that is gone says what became of it: replaced, or removed by whom.
TEST_F(SocketSelect, RemovingAGonePolicySaysWhatBecameOfIt) {
  UdpGroup g(2);
  int first = deploy("policies/round_robin.c", g);
  ASSERT_GT(first, 0) << syr_last_error();
  int second = deploy("policies/pass.c", g);
  ASSERT_GT(second, 0) << syr_last_error();
  EXPECT_EQ(syr_remove_policy(first), -ENOENT);
  EXPECT_EQ(std::string(syr_last_error()), "no policy " + std::to_string(first) +
                                               " (round_robin.c of app 'socktest' was removed: replaced by policy " +
                                               std::to_string(second) + ")");
  ASSERT_EQ(syr_remove_policy(second), 0) << syr_last_error();
  std::string out;
  EXPECT_EQ(run_cmd(build_bin("syrupctl") + " remove " + std::to_string(second), out), 1);
  EXPECT_EQ(out, "syrupctl: no policy " + std::to_string(second) + " (pass.c of app 'socktest' was removed: removed by pid " +
                     std::to_string(getpid()) + ")\n");
  EXPECT_EQ(syr_remove_policy(999999), -ENOENT);
  EXPECT_EQ(std::string(syr_last_error()), "no policy 999999");
}

TEST_F(SocketSelect, SyrupctlDumpsMapsAndSumsStatsPerTenantAndHook) {
  UdpGroup g(2), h(2);
  ASSERT_GT(deploy("policies/least_loaded.c", g, {}, "dumper"), 0) << syr_last_error();
  ASSERT_GT(deploy("policies/round_robin.c", h, {}, "dumper"), 0) << syr_last_error();
  int fd = syr_map_open_app("dumper", "queue_len");
  ASSERT_GE(fd, 0) << syr_last_error();
  uint32_t k = 1;
  uint64_t v = 42;
  ASSERT_EQ(syr_map_update_elem(fd, &k, &v, 0), 0);
  close(fd);
  std::string out;
  ASSERT_EQ(run_cmd(build_bin("syrupctl") + " --json map dump --app dumper queue_len", out), 0) << out;
  auto j = nlohmann::json::parse(out);
  EXPECT_EQ(j["type"], "array");
  EXPECT_EQ(j["entries"][1]["key_int"], 1);
  EXPECT_EQ(j["entries"][1]["value_int"], 42);
  ASSERT_EQ(run_cmd(build_bin("syrupctl") + " map dump --app dumper queue_len", out), 0) << out;
  EXPECT_NE(out.find("map queue_len of app dumper (array)"), std::string::npos) << out;
  EXPECT_EQ(run_cmd(build_bin("syrupctl") + " map dump --app dumper no_such_map", out), 1);
  EXPECT_NE(out.find("has no map 'no_such_map'"), std::string::npos) << out;
  // It names the maps the application has (least_loaded declares one, round_robin none).
  EXPECT_NE(out.find("(it has queue_len; "), std::string::npos) << out;

  UdpClient cg(g.port()), ch(h.port());
  for (int i = 0; i < 10; i++) cg.send_request(1, i), ch.send_request(1, i);
  g.drain();
  h.drain();
  ASSERT_EQ(run_cmd(build_bin("syrupctl") + " --json stats --by tenant", out), 0) << out;
  auto t = nlohmann::json::parse(out);
  ASSERT_EQ(t.size(), 1u) << out;
  EXPECT_EQ(t[0]["tenant"], "dumper");
  EXPECT_EQ(t[0]["policies"], 2);
  EXPECT_EQ(t[0]["decisions"], 20);
  ASSERT_EQ(run_cmd(build_bin("syrupctl") + " --json stats --by hook", out), 0) << out;
  EXPECT_EQ(nlohmann::json::parse(out)[0]["hook"], "socket-select");
}

// `syrupctl list` and `stats --by` size their columns to what they hold: a long
// application name, a long policy name and an IPv6 group keep every cell of a row under
// its heading. Before, fixed widths (16 for APP, 18 for POLICY, 24 for TARGET) pushed the
// rest of such a row out of line.
TEST_F(SocketSelect, SyrupctlTablesKeepEveryCellUnderItsHeading) {
  sockaddr_in6 a{};
  a.sin6_family = AF_INET6;
  a.sin6_addr = in6addr_loopback;
  std::vector<int> fds(2);
  if (syr_open_reuseport_group(SOCK_DGRAM | SOCK_CLOEXEC, reinterpret_cast<sockaddr*>(&a), sizeof a, fds.data(),
                               fds.size()) != 0)
    GTEST_SKIP() << "no IPv6 loopback (::1) here: " << syr_last_error();
  std::vector<UniqueFd> held;
  for (int fd : fds) held.emplace_back(fd);
  const std::string app = "a-tenant-whose-name-is-longer-than-the-old-column";
  syr_deploy_opts o{.sz = sizeof o, .app = app.c_str(), .fds = fds.data(), .n_fds = fds.size(),
                    .name = "a_policy_with_a_long_name.c"};
  int id = syr_deploy_policy(source_path("policies/round_robin.c").c_str(), SYR_HOOK_SOCKET_SELECT, &o);
  ASSERT_GT(id, 0) << syr_last_error();
  ids_.push_back(id);
  UdpGroup g(2);
  ASSERT_GT(deploy("policies/pass.c", g), 0) << syr_last_error();

  // The header and the row naming `app`; each heading must start where its cell starts
  // (left-aligned) or end where it ends (right-aligned, ID and EXEC).
  auto lines_of = [&app](const std::string& cmd) {
    std::string out;
    EXPECT_EQ(run_cmd(build_bin("syrupctl") + " " + cmd, out), 0) << out;
    std::istringstream in(out);
    std::string header, line, row;
    std::getline(in, header);
    while (std::getline(in, line))
      if (line.find(app) != std::string::npos) row = line;
    EXPECT_FALSE(row.empty()) << out;
    return std::make_pair(header, row);
  };
  auto [header, row] = lines_of("list");
  ASSERT_FALSE(row.empty());
  EXPECT_EQ(row.find(std::to_string(id) + "  "), header.find("ID") + 2 - std::to_string(id).size())
      << header << "\n" << row;
  uint16_t port = ntohs(a.sin6_port);
  EXPECT_EQ(row.find(app), header.find("APP")) << header << "\n" << row;
  EXPECT_EQ(row.find("a_policy_with_a_long_name.c"), header.find("POLICY")) << header << "\n" << row;
  EXPECT_EQ(row.find("udp/::1:" + std::to_string(port)), header.find("TARGET")) << header << "\n" << row;
  EXPECT_EQ(row.find(" 2 ") + 2, header.find("EXEC") + 4) << header << "\n" << row;
  EXPECT_EQ(row.find(std::to_string(getpid())), header.find("OWNER")) << header << "\n" << row;

  auto [sheader, srow] = lines_of("stats --by tenant");
  ASSERT_FALSE(srow.empty());
  EXPECT_EQ(srow.find(" 1 ") + 2, sheader.find("POLICIES") + 8) << sheader << "\n" << srow;
}

TEST_F(SocketSelect, AnotherAppCannotTakeOverAGroup) {
  UdpGroup g(2);
  ASSERT_GT(deploy("policies/round_robin.c", g, {}, "owner-app"), 0) << syr_last_error();
  EXPECT_EQ(deploy("policies/pass.c", g, {}, "intruder-app"), -EBUSY);
  EXPECT_NE(std::string(syr_last_error()).find("is scheduled by application 'owner-app'"), std::string::npos)
      << syr_last_error();
}

TEST_F(SocketSelect, PolicyIsRemovedWhenTheDeployingProcessExits) {
  UdpGroup g(2);
  OwnerProcess owner([&] { return deploy_on(g, "policies/round_robin.c", "shortlived"); });
  ASSERT_GT(owner.id(), 0) << owner.error();
  owner.release();
  std::string out;
  bool gone = false;
  for (int i = 0; i < 100 && !gone; i++) {
    run_cmd(build_bin("syrupctl") + " --json list", out);
    gone = nlohmann::json::parse(out).empty();
    if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE(gone) << out;
  EXPECT_FALSE(std::filesystem::exists(daemon_->bpffs_root() + "/apps/shortlived"));
  EXPECT_NE(daemon_->log().find("owner process " + std::to_string(owner.pid()) + " exited"), std::string::npos);
}

// The owner exits while another process keeps the group's sockets (here the test process;
// in an application, a worker it forked). The policy is removed, and its program must come
// off the group as well: syrupd takes a socket of the group from that other process.
// Before, it asked the exited owner only, found nothing, and left the program attached with
// an empty executor map, so what the policy dropped stayed dropped with no policy listed.
TEST_F(SocketSelect, WhenTheOwnerExitsAGroupAnotherProcessKeepsIsHashedAgain) {
  UdpGroup g(2);
  OwnerProcess owner([&] { return deploy_on(g, "tests/policies/drop_all.c", "dropper"); });
  ASSERT_GT(owner.id(), 0) << owner.error();
  UdpClient c(g.port());
  ASSERT_EQ(delivered(g, c), 0) << "the policy must drop while it is deployed";
  owner.release();
  ASSERT_TRUE(none_listed()) << list_policies().dump();
  for (int i = 0; i < 20; i++) c.send_request(1, i);
  auto counts = g.drain();
  EXPECT_EQ(counts[0] + counts[1], 20) << "the removed policy still drops";
  EXPECT_EQ(std::count(counts.begin(), counts.end(), 20), 1) << "one flow, one socket: the kernel's hash";
}

TEST_F(SocketSelect, AnUnprivilegedApplicationDeploysAndWritesHintsWithoutCapabilities) {
  UdpGroup g(2);
  expect_child_passes([&] {
    // Drop to nobody: no capabilities at all.
    if (setgid(65534) || setuid(65534)) child_fails(10, std::string("setuid nobody: ") + strerror(errno));
    auto fds = g.fds();
    syr_deploy_opts o{.sz = sizeof o, .app = "nobody-app", .fds = fds.data(), .n_fds = fds.size()};
    int id = syr_deploy_policy(source_path("policies/scan_avoid.c").c_str(), SYR_HOOK_SOCKET_SELECT, &o);
    if (id <= 0) child_fails(11, std::string("deploy as nobody: ") + syr_last_error());
    // By name of its application: a forked child would inherit the parent's syr_set_app().
    int fd = syr_map_open_app("nobody-app", "scan_map");
    syr_mapped_array m{};
    if (fd < 0 || syr_map_mmap(fd, &m)) child_fails(12, std::string("map as nobody: ") + syr_last_error());
    syr_hint_set(&m, 1, 1);
    UdpClient c(g.port());
    for (int i = 0; i < 10; i++) c.send_request(1, i);
    auto counts = g.drain();
    if (counts != std::vector<int>{10, 0})
      child_fails(13, "routing: " + std::to_string(counts[0]) + " and " + std::to_string(counts[1]) +
                          " datagrams, want all 10 on socket 0");
    if (syr_remove_policy(id) != 0) child_fails(14, std::string("remove as nobody: ") + syr_last_error());
  });
}

// syrupd killed with SIGKILL under steady traffic and restarted: the program stays
// attached throughout, the new syrupd adopts it, and `list` shows the same state.
TEST(SocketSelectRestart, SigkillUnderTrafficLosesNothingAndTheRestartAdopts) {
  SYRUP_REQUIRE_ROOT();
  Daemon d;
  d.start();
  constexpr int kSockets = 3, kDatagrams = 15000;
  UdpGroup g(kSockets);
  int id = deploy_on(g, "tests/policies/by_key.c", "restart");
  ASSERT_GT(id, 0) << syr_last_error();
  std::string before;
  ASSERT_EQ(run_cmd(build_bin("syrupctl") + " --json list", before), 0);

  ByKeyTraffic traffic(g, kDatagrams, std::chrono::microseconds(100));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  d.crash();
  d.start(d.bpffs_root());
  ByKeyTraffic::Result r = traffic.finish();
  EXPECT_EQ(r.total, kDatagrams) << "datagrams lost across the restart";
  EXPECT_EQ(r.misrouted, 0);
  EXPECT_NE(d.log().find("adopted 1 policies"), std::string::npos) << d.log();
  std::string after;
  ASSERT_EQ(run_cmd(build_bin("syrupctl") + " --json list", after), 0);
  auto jb = nlohmann::json::parse(before), ja = nlohmann::json::parse(after);
  ASSERT_EQ(ja.size(), 1u) << after;
  for (const char* k : {"id", "app", "name", "hook", "target", "executors", "owner_pid", "prog_id"})
    EXPECT_EQ(ja[0][k], jb[0][k]) << k;
  // The adopted policy is fully managed: removing it restores the kernel's hash.
  ASSERT_EQ(syr_remove_policy(id), 0) << syr_last_error();
  UdpClient c(g.port());
  for (int i = 0; i < 30; i++) c.send_request(1, i);
  auto counts = g.drain();
  EXPECT_EQ(std::count(counts.begin(), counts.end(), 30), 1);
  EXPECT_EQ(d.stop(), 0);
}

// A socket the application closes leaves its group at once, also across a restart of
// syrupd: what the policy sends to it falls back to the kernel's hash over the sockets
// still open (before, syrupd's duplicate kept it bound and chosen, a black hole until the
// application exited, and a restarted syrupd refused to adopt the policy). Removing the
// policy detaches its program through a socket the application still holds, even one it
// bound after the deploy.
TEST(SocketSelectRestart, ASocketTheApplicationClosesLeavesItsGroupAtOnce) {
  SYRUP_REQUIRE_ROOT();
  Daemon d;
  d.start();
  UdpGroup g(3);
  int id = deploy_on(g, "tests/policies/by_key.c", "closetest");  // key k to socket k % 3
  ASSERT_GT(id, 0) << syr_last_error();
  auto keys_received = [&g] {
    UdpClient c(g.port());
    for (uint32_t k = 0; k < 30; k++) c.send_request(1, k);
    return g.drain();
  };

  g.close(0);
  auto got = keys_received();
  EXPECT_EQ(got[1] + got[2], 30) << "keys 0, 3, ... (for the closed socket 0) must reach the open ones";
  std::string out;
  ASSERT_EQ(run_cmd(build_bin("syrupctl") + " --json stats " + std::to_string(id), out), 0) << out;
  EXPECT_EQ(nlohmann::json::parse(out)[0]["fallback"], 10) << out;

  d.crash();
  d.start(d.bpffs_root());
  EXPECT_NE(d.log().find("adopted 1 policies"), std::string::npos) << d.log();
  got = keys_received();
  EXPECT_EQ(got[1] + got[2], 30);

  g.add();  // socket 3 joins the group: not an executor, reached by the hash
  g.close(1);
  g.close(2);
  got = keys_received();
  EXPECT_EQ(got[3], 30) << "the only open socket of the group must get everything";

  auto j = list_policies();
  ASSERT_EQ(j.size(), 1u) << j.dump();
  uint32_t prog_id = j[0]["prog_id"].get<uint32_t>();
  ASSERT_EQ(syr_remove_policy(id), 0) << syr_last_error();
  EXPECT_GE(wait_for(
                [&] {
                  int fd = bpf_prog_get_fd_by_id(prog_id);
                  if (fd >= 0) close(fd);
                  return fd < 0;
                },
                2000),
            0)
      << "the removed policy's program is still attached to the group";
  EXPECT_EQ(d.stop(), 0);
}

// A group whose owner closed its copies of the sockets, while another process (a forked
// worker; here the test process) keeps them, is adopted by a restarted syrupd: it takes a
// socket from that process. Before, it asked the owner only and did not adopt the policy,
// whose program stayed attached with an empty map and kept dropping after the owner exited.
TEST(SocketSelectRestart, AGroupOnlyAnotherProcessHoldsIsAdoptedAndDetachedWhenItsOwnerExits) {
  SYRUP_REQUIRE_ROOT();
  Daemon d;
  d.start();
  UdpGroup g(2);
  OwnerProcess owner([&] {
    int id = deploy_on(g, "tests/policies/drop_all.c", "handedover");
    for (int fd : g.fds()) close(fd);  // the owner's copies; the test process keeps its own
    return id;
  });
  ASSERT_GT(owner.id(), 0) << owner.error();
  UdpClient c(g.port());
  EXPECT_EQ(delivered(g, c), 0);

  d.crash();
  d.start(d.bpffs_root());
  EXPECT_NE(d.log().find("adopted 1 policies"), std::string::npos) << d.log();
  auto j = list_policies();
  ASSERT_EQ(j.size(), 1u) << j.dump();
  EXPECT_EQ(j[0]["open_executors"], 2) << j.dump();
  EXPECT_EQ(delivered(g, c), 0) << "the adopted policy must still drop";

  owner.release();
  EXPECT_TRUE(none_listed()) << list_policies().dump();
  EXPECT_EQ(delivered(g, c), 10) << "the policy of the exited owner still drops";
  EXPECT_EQ(d.stop(), 0);
}

// A restarted syrupd without the state file cannot adopt a policy: its pins are leftovers,
// and no record names the group its program is attached to. The executor map still holds
// the group's sockets, and their cookies find a process's socket of the group: the program
// is detached through it, as the start's warning says ("their hooks use the kernel's
// default"). Before, only the map was emptied, and the program kept dropping what its
// policy dropped, with no policy listed.
TEST(SocketSelectRestart, ALeftoverPolicyIsDetachedFromItsGroup) {
  SYRUP_REQUIRE_ROOT();
  UdpGroup g(2);
  UdpClient c(g.port());
  expect_leftover_detached(g, c);
}

// The search for a leftover's group finds the socket of a cookie from the kernel's socket
// records and takes only that one. Taking every socket to read its cookie would re-tag
// each with syrupd's net_cls class id, changing how tc and netfilter treat the traffic of
// sockets that have nothing to do with the policy (here: a socket of the same process,
// made before the group, so the search meets it first).
TEST(SocketSelectRestart, TheLeftoverSearchTakesNoOtherSocket) {
  SYRUP_REQUIRE_ROOT();
  ClassedSocket bystander(kTestClassId);
  if (!bystander.skip.empty()) GTEST_SKIP() << bystander.skip;
  ASSERT_EQ(class_id(bystander.fd()), kTestClassId) << "the socket did not get the group's class id";
  UdpGroup g(2);
  UdpClient c(g.port());
  expect_leftover_detached(g, c);
  EXPECT_EQ(class_id(bystander.fd()), kTestClassId) << "syrupd took a socket outside the group";
}

// A group whose sockets are in a network namespace no task is in and no name holds (made
// by a thread that has ended) is missing from every socket record syrupd can read; the
// search then takes the sockets no record showed, and still detaches the leftover.
TEST(SocketSelectRestart, ALeftoverInANamespaceNoTaskIsInIsStillDetached) {
  SYRUP_REQUIRE_ROOT();
  NamespaceGroup n;
  ASSERT_EQ(n.failed, "");
  expect_leftover_detached(*n.group, *n.client);
}

// Deploy by pid finds the process's sockets on the port from the kernel's socket records
// and takes only those: its other sockets keep their net_cls class id.
TEST_F(SocketSelect, DeployByPidTakesNoSocketOffThePort) {
  ClassedSocket bystander(kTestClassId);
  if (!bystander.skip.empty()) GTEST_SKIP() << bystander.skip;
  ASSERT_EQ(class_id(bystander.fd()), kTestClassId) << "the socket did not get the group's class id";
  UdpGroup g(2);
  ASSERT_EQ(deploy_pid(g.port(), "drop_all.c"), "");
  UdpClient c(g.port());
  EXPECT_EQ(delivered(g, c), 0) << "the policy is not on the group";
  EXPECT_EQ(class_id(bystander.fd()), kTestClassId) << "syrupd took a socket off the port";
}

// Deploy by pid also finds a group in a network namespace no task is in (no socket
// record shows it): it then looks at the sockets no record showed.
TEST_F(SocketSelect, DeployByPidFindsAGroupInANamespaceNoTaskIsIn) {
  NamespaceGroup n;
  ASSERT_EQ(n.failed, "");
  ASSERT_EQ(deploy_pid(n.group->port(), "drop_all.c"), "");
  EXPECT_EQ(delivered(*n.group, *n.client), 0) << "the policy is not on the group";
}

// Deploy by pid looks first in the namespaces of the process's threads, then in every
// namespace: here the group is in one a name holds, made by a thread that has left it.
TEST_F(SocketSelect, DeployByPidFindsAGroupInANamespaceItsThreadsLeft) {
  NamespaceGroup n("syrup-left-" + std::to_string(getpid()));
  ASSERT_EQ(n.failed, "");
  ASSERT_EQ(deploy_pid(n.group->port(), "drop_all.c"), "");
  EXPECT_EQ(delivered(*n.group, *n.client), 0) << "the policy is not on the group";
}

// Groups on one address and port in two network namespaces (one server in two
// containers) are two targets: each tenant's policy schedules its own group, and one
// application's deploy to the second adds a policy instead of replacing the first.
TEST_F(SocketSelect, GroupsOfOnePortInTwoNamespacesAreTwoTargets) {
  NamespaceGroup one;
  ASSERT_EQ(one.failed, "");
  NamespaceGroup two("", one.group->port());
  ASSERT_EQ(two.failed, "");
  ASSERT_EQ(two.group->port(), one.group->port());
  int a = deploy("tests/policies/drop_all.c", *one.group, {}, "tenant-a");
  ASSERT_GT(a, 0) << syr_last_error();
  int b = deploy("tests/policies/drop_all.c", *two.group, {}, "tenant-b");
  ASSERT_GT(b, 0) << syr_last_error();
  EXPECT_EQ(delivered(*one.group, *one.client), 0);
  EXPECT_EQ(delivered(*two.group, *two.client), 0);
  auto j = list_policies();
  ASSERT_EQ(j.size(), 2u) << j.dump();
  EXPECT_NE(j[0]["target"], j[1]["target"]) << j.dump();
  EXPECT_NE(j[0]["target"].get<std::string>().find("udp/127.0.0.1:" + std::to_string(one.group->port()) + " in net:["),
            std::string::npos)
      << j.dump();
  ASSERT_EQ(syr_remove_policy(b), 0) << syr_last_error();
  EXPECT_EQ(delivered(*two.group, *two.client), 10) << "the second group kept a policy";
  EXPECT_EQ(delivered(*one.group, *one.client), 0) << "removing the second group's policy ended the first's";
  int c = deploy("tests/policies/drop_all.c", *two.group, {}, "tenant-a");
  ASSERT_GT(c, 0) << syr_last_error();
  EXPECT_EQ(list_policies().size(), 2u) << "the deploy replaced the first group's policy";
  EXPECT_EQ(delivered(*one.group, *one.client), 0);
  EXPECT_EQ(delivered(*two.group, *two.client), 0);

  // Sockets of both are not one group; and by pid (this process holds both), the address
  // cannot say which is meant.
  EXPECT_LT(deploy_fds("tests/policies/drop_all.c", {one.group->fds()[0], two.group->fds()[0]}, {}, "tenant-c"), 0);
  EXPECT_NE(std::string(syr_last_error()).find("executor 1 (udp/127.0.0.1:" + std::to_string(one.group->port()) +
                                                " in net:["),
            std::string::npos)
      << syr_last_error();
  std::string out = deploy_pid(one.group->port(), "drop_all.c");
  EXPECT_NE(out.find("has 2 SO_REUSEPORT udp groups on port " + std::to_string(one.group->port()) +
                     " (bound to 127.0.0.1 in net:["),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("they differ only in network namespace: deploy with the sockets (fds) of the one meant"),
            std::string::npos)
      << out;
}

// A restarted syrupd reads a group's network namespace from the sockets it adopts: it
// still tells the two groups of one port apart and adopts both policies.
TEST(SocketSelectRestart, GroupsOfOnePortInTwoNamespacesStayTwoTargetsAcrossARestart) {
  SYRUP_REQUIRE_ROOT();
  Daemon d;
  d.start();
  NamespaceGroup one;
  ASSERT_EQ(one.failed, "");
  NamespaceGroup two("", one.group->port());
  ASSERT_EQ(two.failed, "");
  ASSERT_GT(deploy_on(*one.group, "tests/policies/drop_all.c", "tenant-a"), 0) << syr_last_error();
  ASSERT_GT(deploy_on(*two.group, "tests/policies/drop_all.c", "tenant-b"), 0) << syr_last_error();
  auto before = list_policies();
  d.crash();
  d.start(d.bpffs_root());
  EXPECT_NE(d.log().find("adopted 2 policies"), std::string::npos) << d.log();
  auto after = list_policies();
  ASSERT_EQ(after.size(), 2u) << after.dump();
  for (int i = 0; i < 2; i++) EXPECT_EQ(after[i]["target"], before[i]["target"]) << before.dump() << after.dump();
  EXPECT_NE(after[0]["target"], after[1]["target"]) << after.dump();
  EXPECT_EQ(delivered(*one.group, *one.client), 0);
  EXPECT_EQ(delivered(*two.group, *two.client), 0);
  EXPECT_EQ(d.stop(), 0);
}

// A test process that dies without stopping its syrupd (a ctest timeout, output into a
// closed pipe) takes it along: no syrupd is left behind holding programs and pins.
TEST(TestHarness, NoSyrupdOutlivesTheTestProcessThatStartedIt) {
  SYRUP_REQUIRE_ROOT();
  int p[2];
  ASSERT_EQ(pipe2(p, O_CLOEXEC), 0);
  // The orphaned syrupd comes to this process, which reaps it (and sees it end).
  ASSERT_EQ(prctl(PR_SET_CHILD_SUBREAPER, 1), 0) << strerror(errno);
  pid_t test = fork();
  ASSERT_GE(test, 0);
  if (test == 0) {
    auto* d = new Daemon;  // never stopped
    d->start();
    std::string s = std::to_string(d->pid()) + " " + d->socket() + "\n";
    (void)!write(p[1], s.data(), s.size());
    pause();
    _exit(0);
  }
  close(p[1]);
  char buf[512] = {};
  ssize_t n = read(p[0], buf, sizeof buf - 1);
  close(p[0]);
  pid_t syrupd = 0;
  char sock[400] = {};
  ASSERT_GT(n, 0);
  ASSERT_EQ(std::sscanf(buf, "%d %399s", &syrupd, sock), 2) << buf;
  kill(test, SIGKILL);
  waitpid(test, nullptr, 0);
  bool ended = false;
  auto gone = [&] { return ended = ended || waitpid(syrupd, nullptr, WNOHANG) == syrupd; };
  EXPECT_GE(wait_for(gone, 10000), 0) << "syrupd " << syrupd << " outlived the test process that started it";
  if (!gone()) {
    kill(syrupd, SIGKILL);
    waitpid(syrupd, nullptr, 0);
  }
  prctl(PR_SET_CHILD_SUBREAPER, 0);
  std::error_code ec;
  std::filesystem::remove_all(std::filesystem::path(sock).parent_path(), ec);
  std::filesystem::remove_all("/sys/fs/bpf/syrup-test-" + std::to_string(test), ec);
}

// Deploy by pid takes the TCP listeners on the port and none of the connections they
// accepted, which have the port too (a server may hold thousands): each taken would be
// re-tagged with syrupd's net_cls class id.
TEST_F(SocketSelect, DeployByPidTakesNoConnectionItsListenersAccepted) {
  sockaddr_in a{};
  std::vector<UniqueFd> listeners;
  UniqueFd client, accepted;
  ClassedSocket made(kTestClassId, [&] {
    listeners = tcp_listeners(2, a);
    client.reset(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (listeners.size() != 2 || !client || connect(client.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0)
      return false;
    wait_for([&] {
      for (auto& l : listeners)
        if (!accepted) accepted.reset(accept4(l.get(), nullptr, nullptr, SOCK_CLOEXEC));
      return static_cast<bool>(accepted);
    }, 2000);
    return static_cast<bool>(accepted);
  });
  if (!made.skip.empty()) GTEST_SKIP() << made.skip;
  ASSERT_EQ(class_id(accepted.get()), kTestClassId) << "the connection did not get the group's class id";
  ASSERT_EQ(deploy_pid(ntohs(a.sin_port), "drop_all.c"), "");
  auto j = list_policies();
  ASSERT_EQ(j.size(), 1u) << j.dump();
  EXPECT_EQ(j[0]["open_executors"], 2) << j.dump();
  EXPECT_EQ(class_id(listeners[0].get()), 0u) << "syrupd did not take the listeners: the check below proves nothing";
  EXPECT_EQ(class_id(accepted.get()), kTestClassId) << "syrupd took a connection the listeners accepted";
}

// A process whose socket on the port cannot be an executor is told why. The sockets no
// socket record shows (here one in a network namespace no task is in) are then left
// alone: syrupd looks at those only when the records show none of the process's sockets
// on the port, since each one looked at is taken and so re-tagged.
TEST_F(SocketSelect, DeployByPidSaysWhyItsSocketOnThePortCannotBeScheduled) {
  UniqueFd plain(socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t al = sizeof a;
  ASSERT_EQ(bind(plain.get(), reinterpret_cast<sockaddr*>(&a), sizeof a), 0) << strerror(errno);
  ASSERT_EQ(getsockname(plain.get(), reinterpret_cast<sockaddr*>(&a), &al), 0);
  const std::string port = std::to_string(ntohs(a.sin_port));

  UniqueFd netns, hidden;  // a socket in a namespace the thread leaves again
  ClassedSocket made(kTestClassId, [&] {
    UniqueFd home(open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC));
    if (!home || unshare(CLONE_NEWNET) != 0) return false;
    netns.reset(open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC));
    hidden.reset(socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    sockaddr_in any{};  // bound (to any port), or sock_diag would not show it there either
    any.sin_family = AF_INET;
    if (!hidden || bind(hidden.get(), reinterpret_cast<sockaddr*>(&any), sizeof any) != 0) return false;
    return setns(home.get(), CLONE_NEWNET) == 0 && netns;
  });
  if (!made.skip.empty()) GTEST_SKIP() << made.skip;
  auto hidden_class = [&] {  // read from inside its namespace, where sock_diag shows it
    uint32_t id = 0;
    std::thread([&] {
      if (setns(netns.get(), CLONE_NEWNET) == 0) id = class_id(hidden.get());
    }).join();
    return id;
  };
  ASSERT_EQ(hidden_class(), kTestClassId) << "the hidden socket did not get the group's class id";

  std::string out;
  EXPECT_EQ(run_cmd(build_bin("syrupctl") + " deploy --hook socket-select --app pidtest --pid " +
                        std::to_string(getpid()) + " --port " + port + " " + source_path("tests/policies/drop_all.c"),
                    out),
            1)
      << out;
  EXPECT_NE(out.find("has no SO_REUSEPORT socket bound to port " + port + " (fd " + std::to_string(plain.get()) +
                     ", udp/127.0.0.1:" + port + ": SO_REUSEPORT is not set on it)"),
            std::string::npos)
      << out;
  EXPECT_EQ(hidden_class(), kTestClassId) << "syrupd took a socket no record showed";
}

// A leftover that shares its executor map with an adopted policy (a replacement the
// previous syrupd pinned but had not recorded when it died; made here by pinning the
// adopted policy's program and map a second time under another id) is that policy's
// group: it is neither emptied nor detached.
TEST(SocketSelectRestart, ALeftoverSharingAnAdoptedPolicysMapLeavesItsGroupAlone) {
  SYRUP_REQUIRE_ROOT();
  Daemon d;
  d.start();
  UdpGroup g(2);
  int id = deploy_on(g, "tests/policies/drop_all.c", "shared");
  ASSERT_GT(id, 0) << syr_last_error();
  UdpClient c(g.port());
  EXPECT_EQ(delivered(g, c), 0);
  d.crash();
  std::string policies = d.bpffs_root() + "/apps/shared/policies/";
  std::string twin = policies + std::to_string(id + 100);
  ASSERT_EQ(mkdir(twin.c_str(), 0700), 0) << strerror(errno);
  for (const char* pin : {"prog", "syr_executors"}) {
    UniqueFd fd(bpf_obj_get((policies + std::to_string(id) + "/" + pin).c_str()));
    ASSERT_TRUE(fd) << pin << ": " << strerror(errno);
    ASSERT_EQ(bpf_obj_pin(fd.get(), (twin + "/" + pin).c_str()), 0) << strerror(errno);
  }
  d.start(d.bpffs_root());
  EXPECT_NE(d.log().find("adopted 1 policies"), std::string::npos) << d.log();
  EXPECT_NE(d.log().find("found 1 policies of a previous syrupd"), std::string::npos) << d.log();
  EXPECT_EQ(delivered(g, c), 0) << "the adopted policy's group lost its program";
  auto j = list_policies();
  ASSERT_EQ(j.size(), 1u) << j.dump();
  EXPECT_EQ(j[0]["open_executors"], 2) << "the adopted policy's executor map was emptied";
  EXPECT_EQ(d.stop(), 0);
}

// What became of a removed policy outlives syrupd, even one killed: a restart reads it
// from the state file. A policy the restarted syrupd cannot adopt (its sockets closed while syrupd was
// down) counts as removed, with the reason.
TEST(SocketSelectRestart, WhatBecameOfARemovedPolicyIsKeptAcrossARestart) {
  SYRUP_REQUIRE_ROOT();
  Daemon d;
  d.start();
  UdpGroup g(2);
  auto h = std::make_unique<UdpGroup>(2);
  int removed = deploy_on(g, "policies/pass.c", "gonetest");
  ASSERT_GT(removed, 0) << syr_last_error();
  ASSERT_EQ(syr_remove_policy(removed), 0) << syr_last_error();
  int orphaned = deploy_on(*h, "policies/round_robin.c", "gonetest");
  ASSERT_GT(orphaned, 0) << syr_last_error();
  d.crash();  // what the state file holds is what each change wrote
  h.reset();  // the group's last sockets: nothing left for the next syrupd to take over
  d.start(d.bpffs_root());
  ASSERT_EQ(d.answers(), "");
  EXPECT_NE(d.log().find("cannot adopt policy " + std::to_string(orphaned)), std::string::npos) << d.log();

  EXPECT_EQ(syr_remove_policy(removed), -ENOENT);
  EXPECT_EQ(std::string(syr_last_error()), "no policy " + std::to_string(removed) +
                                               " (pass.c of app 'gonetest' was removed: removed by pid " +
                                               std::to_string(getpid()) + ")");
  std::string out;
  EXPECT_EQ(run_cmd(build_bin("syrupctl") + " remove " + std::to_string(orphaned), out), 1);
  EXPECT_EQ(out.rfind("syrupctl: no policy " + std::to_string(orphaned) +
                          " (round_robin.c of app 'gonetest' was removed: not adopted when syrupd restarted: ",
                      0),
            0u)
      << out;
  EXPECT_EQ(d.stop(), 0);
}

// A state file with an entry of the wrong shape (edited by hand, or written by another
// version): syrupd still starts and adopts the rest; the entry's policy is released, its
// group back on the kernel's hash, and "no policy N" says which field was wrong.
TEST(SocketSelectRestart, AMalformedStateFileEntryCostsThatPolicyNotTheStart) {
  SYRUP_REQUIRE_ROOT();
  Daemon d;
  d.start();
  const char* by_key = "tests/policies/by_key.c";
  UdpGroup kept(2), spoiled(2);
  int kept_id = deploy_on(kept, by_key, "statefile"), spoiled_id = deploy_on(spoiled, by_key, "statefile");
  ASSERT_GT(kept_id, 0) << syr_last_error();
  ASSERT_GT(spoiled_id, 0) << syr_last_error();
  d.crash();
  nlohmann::json state = nlohmann::json::parse(read_text(d.state_file()));
  ASSERT_EQ(state["policies"].size(), 2u) << state.dump();
  for (auto& p : state["policies"])
    if (p["id"] == spoiled_id) p["uid"] = "root";
  state["policies"].push_back(42);  // not an entry at all
  for (auto& p : state["policies"])
    if (p.is_object() && p["id"] == kept_id) {
      state["policies"].push_back(p);  // twice
      break;
    }
  state["apps"] = nlohmann::json::array();
  {
    std::ofstream out(d.state_file(), std::ios::trunc);
    out << state.dump();
  }
  d.start(d.bpffs_root());
  ASSERT_EQ(d.answers(), "");
  EXPECT_NE(d.log().find("cannot adopt policy " + std::to_string(spoiled_id) +
                              " (by_key.c) of app 'statefile': its entry in the state file is malformed "
                              "(uid: type must be number, but is string)"),
            std::string::npos)
      << d.log();
  EXPECT_NE(d.log().find("cannot adopt entry 3 of the state file's policies: it is malformed (not a JSON object)"),
            std::string::npos)
      << d.log();
  EXPECT_NE(d.log().find("cannot adopt policy " + std::to_string(kept_id) +
                         " (by_key.c) of app 'statefile': an earlier entry of the state file has its id"),
            std::string::npos)
      << d.log();
  EXPECT_NE(d.log().find("adopted 1 policies"), std::string::npos) << d.log();

  std::string out;
  ASSERT_EQ(run_cmd(build_bin("syrupctl") + " --json list", out), 0) << out;
  auto listed = nlohmann::json::parse(out);
  ASSERT_EQ(listed.size(), 1u) << out;
  EXPECT_EQ(listed[0]["id"], kept_id);
  EXPECT_FALSE(std::filesystem::exists(d.bpffs_root() + "/apps/statefile/policies/" + std::to_string(spoiled_id)));
  // by_key.c sends key k to executor k % 2: the adopted policy still does, the released
  // one's group is on the kernel's hash (one flow, one socket).
  UdpClient to_kept(kept.port()), to_spoiled(spoiled.port());
  for (int k = 0; k < 20; k++) to_kept.send_request(1, k), to_spoiled.send_request(1, k);
  EXPECT_EQ(kept.drain(), (std::vector<int>{10, 10}));
  auto hashed = spoiled.drain();
  EXPECT_EQ(std::count(hashed.begin(), hashed.end(), 20), 1) << hashed[0] << " and " << hashed[1];

  EXPECT_EQ(syr_remove_policy(spoiled_id), -ENOENT);
  EXPECT_EQ(std::string(syr_last_error()),
            "no policy " + std::to_string(spoiled_id) +
                " (by_key.c of app 'statefile' was removed: not adopted when syrupd restarted: its entry in the "
                "state file is malformed (uid: type must be number, but is string))");
  EXPECT_EQ(syr_remove_policy(kept_id), 0) << syr_last_error();
  // Ids are never handed out twice, whatever the file said.
  EXPECT_GT(deploy_on(spoiled, by_key, "statefile"), spoiled_id) << syr_last_error();
  EXPECT_EQ(d.stop(), 0);
}

}  // namespace
}  // namespace syrup::test
