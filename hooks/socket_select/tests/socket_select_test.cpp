// Tests of the socket-select hook itself: a real syrupd, real BPF programs in the running
// kernel, real SO_REUSEPORT groups on loopback. Each test asserts which socket of a group
// got which datagram (or connection): the shipped policies' decisions, the kernel's hash
// where no policy decides, the end of a group, which group of a process and port a deploy
// by pid takes, and the refusals only this hook makes.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <net/if.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <thread>

#include <nlohmann/json.hpp>

#include "harness.h"
#include "harness_socket_select.h"
#include "syrup/syrup.h"

namespace syrup::test {
namespace {

class SocketSelect : public SocketSelectTest {};

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
  ASSERT_GT(deploy_fds("policies/round_robin.c", raw_fds(ls)), 0) << syr_last_error();

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
  ASSERT_GT(deploy_fds("policies/round_robin.c", raw_fds(ls)), 0) << syr_last_error();

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

// The executors' group must be the application's alone. Given port 0 with SO_REUSEPORT,
// the kernel may hand out a port another group of the same user holds, and the socket
// joins that group (Tenants.DeployAndExitCyclesLeakNothing once failed on it: a child's
// group got the port of the test's own group). In a network namespace of its own, whose
// ephemeral range is one port held by a group, syr_open_reuseport_group() fails with
// EADDRINUSE instead; with a second port in the range, it gets that one every time.
// A child process does it, so the namespace and its sysctl never touch the test's.
TEST(ReuseportGroup, PortZeroNeverJoinsAnotherGroupOfTheSameUser) {
  SYRUP_REQUIRE_ROOT();
  EXPECT_EQ(in_child([]() -> std::string {
    if (unshare(CLONE_NEWNET) != 0) return std::string("unshare: ") + strerror(errno);
    UniqueFd ctl(socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    ifreq ifr{};
    std::snprintf(ifr.ifr_name, sizeof ifr.ifr_name, "lo");
    ifr.ifr_flags = IFF_UP;
    if (ioctl(ctl.get(), SIOCSIFFLAGS, &ifr) != 0) return "lo up failed";
    auto range = [&](const char* r) {
      std::ofstream f("/proc/sys/net/ipv4/ip_local_port_range");
      f << r << "\n";
      f.close();
      return f ? std::string() : std::string("cannot set ip_local_port_range to ") + r;
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
      if (std::string why = range("40000 40000"); !why.empty()) return why;
      int held[3] = {-1, -1, -1};
      uint16_t port = 0;
      if (int r = open_group(type, held, 3, &port); r != 0 || port != 40000)
        return proto + ": the first group: " + strerror(-r) + " port " + std::to_string(port);
      for (int fd : held) {
        int v = 0;
        socklen_t l = sizeof v;
        sockaddr_in a{};
        socklen_t al = sizeof a;
        getsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &v, &l);
        getsockname(fd, reinterpret_cast<sockaddr*>(&a), &al);
        if (v != 1 || ntohs(a.sin_port) != 40000) return proto + ": a member lacks SO_REUSEPORT or the port";
      }
      if (type == SOCK_DGRAM) {  // the kernel's behaviour the call guards against
        auto [fd, p] = plain_port_zero_bind();
        fprintf(stderr, "child: udp: a plain port-0 SO_REUSEPORT bind %s\n",
                p == 40000 ? "joined the group on 40000" : "did not join the group");
        close(fd);
      }
      int other[2] = {-1, -1};
      int r = open_group(type, other, 2, &port);
      if (r != -EADDRINUSE) return proto + ": want EADDRINUSE with the only port held, got " + std::to_string(r);
      if (other[0] != -1 || other[1] != -1) return proto + ": fds written on failure";
      if (std::string(syr_last_error()).find("no free port on 127.0.0.1") == std::string::npos)
        return proto + ": error text: " + syr_last_error();
      if (std::string why = range("40000 40001"); !why.empty()) return why;
      for (int i = 0; i < 20; i++) {
        if ((r = open_group(type, other, 2, &port)) != 0 || port != 40001)
          return proto + ": round " + std::to_string(i) + ": " + strerror(-r) + " port " + std::to_string(port);
        close(other[0]), close(other[1]);
      }
      for (int fd : held) close(fd);
    }
    return "";
  }), "");
}

// A group that cannot be completed -- here the process runs out of file descriptors in
// the middle of it -- leaves nothing behind: -EMFILE, no socket open, and every fds[i]
// -1, so a caller that closes what it was given closes nothing twice. A child process
// does it, under a file limit of its own.
TEST(ReuseportGroup, AGroupThatFailsMidwayLeavesNoSocketAndNoFdNumber) {
  EXPECT_EQ(in_child([]() -> std::string {
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
    if (setrlimit(RLIMIT_NOFILE, &lim) != 0) return std::string("setrlimit: ") + strerror(errno);
    size_t room = static_cast<size_t>(top + 4) - before.size() + 1;  // the iterator's fd is closed now
    std::vector<int> fds(room + 4, 12345);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int r = syr_open_reuseport_group(SOCK_DGRAM | SOCK_CLOEXEC, reinterpret_cast<sockaddr*>(&a), sizeof a,
                                     fds.data(), fds.size());
    if (r != -EMFILE) return "want -EMFILE from a group of " + std::to_string(fds.size()) + " with room for " +
                             std::to_string(room) + ", got " + std::to_string(r) + " (" + syr_last_error() + ")";
    for (size_t i = 0; i < fds.size(); i++)
      if (fds[i] != -1) return "fds[" + std::to_string(i) + "] is " + std::to_string(fds[i]) + " after the failure";
    if (std::string(syr_last_error()).find("SO_REUSEPORT socket on 127.0.0.1") == std::string::npos)
      return std::string("error text: ") + syr_last_error();
    if (std::vector<int> after = open_fds(); after != before)
      return "open fds: " + std::to_string(before.size()) + " before, " + std::to_string(after.size()) + " after";
    return "";
  }), "");
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


}  // namespace
}  // namespace syrup::test
