// Integration tests of the socket-lookup hook: a real syrupd, real sk_lookup programs in
// the running kernel, real TCP and UDP sockets. Each test runs in a network namespace of
// its own (the test thread unshares one with loopback up), so a policy on a port range
// steers nothing of the host's. Each test asserts which socket received what, what a
// client saw, or what error text a caller read.
#include <arpa/inet.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <fcntl.h>
#include <map>
#include <mutex>
#include <regex>
#include <grp.h>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "harness.h"
#include "security/held_user.h"
#include "security/security.h"
#include "syrup/syrup.h"
#include "unique_fd.h"

namespace syrup::test {
namespace {

using security::kAlice;
using security::kMallory;
using namespace std::chrono_literals;

// A socket of `type` (SOCK_STREAM: listening) bound to 127.0.0.1:port; -1 on failure.
UniqueFd bound(int type, uint16_t port) {
  UniqueFd fd(socket(AF_INET, type | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (!fd || bind(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) ||
      (type == SOCK_STREAM && listen(fd.get(), 4096)))
    return UniqueFd();
  return fd;
}

// A connected TCP client to 127.0.0.1:port; -1 and errno when refused.
UniqueFd connect_to(uint16_t port) {
  UniqueFd fd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a)) return UniqueFd();
  return fd;
}

// Whether listener `l` has a connection waiting within `ms` (accepted and closed).
bool accepts(int l, int ms = 500) {
  pollfd p{l, POLLIN, 0};
  if (poll(&p, 1, ms) != 1) return false;
  UniqueFd c(accept4(l, nullptr, nullptr, SOCK_CLOEXEC));
  return static_cast<bool>(c);
}

// One datagram to 127.0.0.1:port; whether `s` received it within `ms`.
bool datagram_lands(uint16_t port, int s, int ms = 500) {
  UniqueFd c(socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (sendto(c.get(), "x", 1, 0, reinterpret_cast<sockaddr*>(&a), sizeof a) != 1) return false;
  pollfd p{s, POLLIN, 0};
  if (poll(&p, 1, ms) != 1) return false;
  char b;
  return recv(s, &b, 1, MSG_DONTWAIT) == 1;
}

// The calling thread in a network namespace of its own, with loopback up; back in the
// original one when destroyed.
class OwnNetns {
 public:
  OwnNetns() : orig_(open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC)) {
    if (!orig_ || unshare(CLONE_NEWNET)) return;
    UniqueFd s(socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    ifreq ifr{};
    std::strcpy(ifr.ifr_name, "lo");
    ifr.ifr_flags = IFF_UP | IFF_LOOPBACK | IFF_RUNNING;
    ok_ = ioctl(s.get(), SIOCSIFFLAGS, &ifr) == 0;
  }
  ~OwnNetns() {
    if (orig_) setns(orig_.get(), CLONE_NEWNET);
  }
  bool ok() const { return ok_; }

 private:
  UniqueFd orig_;
  bool ok_ = false;
};

const char* kGrants = "--socket_lookup_ports=62001:7400-7499,62002:7450-7550";

class SocketLookup : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (geteuid() != 0) return;
    daemon_ = new Daemon();
    daemon_->start("", {kGrants});
    if (std::string why = daemon_->answers(); !why.empty()) ADD_FAILURE() << why;
  }
  static void TearDownTestSuite() {
    if (daemon_) EXPECT_EQ(daemon_->stop(), 0) << daemon_->log();
    delete daemon_;
    daemon_ = nullptr;
  }
  void SetUp() override {
    SYRUP_REQUIRE_ROOT();
    netns_ = std::make_unique<OwnNetns>();
    ASSERT_TRUE(netns_->ok()) << "cannot make a network namespace: " << strerror(errno);
  }
  void TearDown() override {
    for (int id : ids_) syr_remove_policy(id);
    netns_.reset();
  }

  // Deploys `rel` at the socket-lookup hook with executors `fds` for ports [lo, hi].
  int deploy(const std::string& rel, const std::vector<int>& fds, const char* proto, uint16_t lo, uint16_t hi,
             const char* app = "sltest") {
    syr_deploy_opts o{};
    o.sz = sizeof o;
    o.app = app;
    o.fds = fds.data();
    o.n_fds = fds.size();
    o.protocol = proto;
    o.port = lo;
    o.port_end = hi;
    int id = syr_deploy_policy(source_path(rel).c_str(), SYR_HOOK_SOCKET_LOOKUP, &o);
    if (id > 0) ids_.push_back(id);
    return id;
  }

  static Daemon* daemon_;
  std::unique_ptr<OwnNetns> netns_;
  std::vector<int> ids_;
};
Daemon* SocketLookup::daemon_ = nullptr;

const std::string kByPort = "hooks/socket_lookup/tests/policies/by_port.c";

// Connections to ten ports, none of which has a socket, land on the listener the policy
// picks (port % 2), and listeners bound to other ports than the one connected to.
TEST_F(SocketLookup, TcpConnectionsLandOnThePickedSocketAcrossPorts) {
  UniqueFd even = bound(SOCK_STREAM, 7001), odd = bound(SOCK_STREAM, 7003);
  ASSERT_TRUE(even && odd);
  ASSERT_GT(deploy(kByPort, {even.get(), odd.get()}, "tcp", 7100, 7109), 0) << syr_last_error();
  for (uint16_t port = 7100; port <= 7109; port++) {
    UniqueFd c = connect_to(port);
    ASSERT_TRUE(c) << "connect to " << port << ": " << strerror(errno);
    int want = port % 2 ? odd.get() : even.get(), other = port % 2 ? even.get() : odd.get();
    EXPECT_TRUE(accepts(want)) << "port " << port;
    EXPECT_FALSE(accepts(other, 0)) << "port " << port;
  }
  // Outside the range the kernel's own lookup decides: no socket on 7110, refused.
  EXPECT_FALSE(connect_to(7110));
  // The wrapper counted each decision for its executor.
  std::string out;
  ASSERT_EQ(run_cmd(build_bin("syrupctl") + " --json stats " + std::to_string(ids_[0]), out), 0) << out;
  nlohmann::json stats = nlohmann::json::parse(out, nullptr, false);
  ASSERT_TRUE(stats.is_array() && stats.size() == 1) << out;
  EXPECT_EQ(stats[0]["executors"], nlohmann::json({5, 5})) << out;
  EXPECT_EQ(stats[0]["fallback"], 0) << out;
}

TEST_F(SocketLookup, UdpDatagramsLandOnThePickedSocketAcrossPorts) {
  UniqueFd even = bound(SOCK_DGRAM, 7001), odd = bound(SOCK_DGRAM, 7003);
  ASSERT_TRUE(even && odd);
  ASSERT_GT(deploy(kByPort, {even.get(), odd.get()}, "udp", 7200, 7203), 0) << syr_last_error();
  for (uint16_t port = 7200; port <= 7203; port++)
    EXPECT_TRUE(datagram_lands(port, port % 2 ? odd.get() : even.get())) << "port " << port;
  // Removing the policy returns the ports to the kernel: nothing is bound there.
  ASSERT_EQ(syr_remove_policy(ids_[0]), 0) << syr_last_error();
  ids_.clear();
  EXPECT_FALSE(datagram_lands(7200, even.get(), 100));
}

// Blue/green: two clients connect without pause for 2 s while the application flips its
// map from blue (executor 0) to green (1) halfway: no connect is refused or reset, every
// connection made after the flip reaches green, and blue's established connection still
// carries data.
TEST_F(SocketLookup, BlueGreenFlipUnderSteadyConnectsRefusesNone) {
  UniqueFd blue = bound(SOCK_STREAM, 7301), green = bound(SOCK_STREAM, 7302);
  ASSERT_TRUE(blue && green);
  ASSERT_GT(deploy("policies/blue_green.c", {blue.get(), green.get()}, "tcp", 7300, 7300, "bluegreen"), 0)
      << syr_last_error();
  syr_mapped_array active{};
  ASSERT_EQ(mmap_app_map("bg_active", &active, "bluegreen"), "");
  *static_cast<volatile uint32_t*>(syr_array_elem(&active, 0)) = 0;

  UniqueFd kept = connect_to(7300);
  ASSERT_TRUE(kept);
  pollfd p{blue.get(), POLLIN, 0};
  ASSERT_EQ(poll(&p, 1, 1000), 1);
  UniqueFd kept_server(accept4(blue.get(), nullptr, nullptr, SOCK_CLOEXEC));
  ASSERT_TRUE(kept_server);

  // Servers: each accepted connection is answered with its server's letter.
  std::atomic<bool> stop{false};
  auto serve = [&](int l, char letter) {
    while (!stop.load()) {
      pollfd q{l, POLLIN, 0};
      if (poll(&q, 1, 20) != 1) continue;
      UniqueFd c(accept4(l, nullptr, nullptr, SOCK_CLOEXEC));
      if (c) (void)!write(c.get(), &letter, 1);
    }
  };
  std::thread sb(serve, blue.get(), 'B'), sg(serve, green.get(), 'G');
  std::atomic<int> failed{0}, blue_after{0}, total{0};
  std::atomic<bool> flipped{false};
  auto client = [&] {
    auto end = std::chrono::steady_clock::now() + 2s;
    while (std::chrono::steady_clock::now() < end) {
      bool after = flipped.load();
      UniqueFd c = connect_to(7300);
      char got = 0;
      pollfd q{c.get(), POLLIN, 0};
      if (!c || poll(&q, 1, 1000) != 1 || read(c.get(), &got, 1) != 1) {
        failed++;
        continue;
      }
      total++;
      if (after && got == 'B') blue_after++;
    }
  };
  std::thread c1(client), c2(client);
  std::this_thread::sleep_for(1s);
  *static_cast<volatile uint32_t*>(syr_array_elem(&active, 0)) = 1;
  flipped = true;
  c1.join();
  c2.join();
  stop = true;
  sb.join();
  sg.join();
  EXPECT_EQ(failed.load(), 0) << "of " << total.load() << " connects";
  EXPECT_EQ(blue_after.load(), 0) << "connections begun after the flip reached blue";
  EXPECT_GT(total.load(), 100);
  // Blue's established connection is untouched.
  ASSERT_EQ(write(kept.get(), "ping", 4), 4);
  char buf[4];
  ASSERT_EQ(read(kept_server.get(), buf, 4), 4);
  EXPECT_EQ(std::string(buf, 4), "ping");
  syr_map_munmap(&active);
}

// syrupctl --pid: the executors are the process's listening sockets in ascending fd
// order (the unmodified process is a child holding two listeners; this test holds the
// same sockets to see where connections land).
TEST_F(SocketLookup, DeployByPidTakesTheListenersInFdOrder) {
  UniqueFd first = bound(SOCK_STREAM, 7901), second = bound(SOCK_STREAM, 7902);
  UniqueFd udp = bound(SOCK_DGRAM, 7903);  // another protocol: not an executor
  ASSERT_TRUE(first && second && udp);
  ASSERT_LT(first.get(), second.get());
  ChildProcess server(0, [] {
    for (;;) pause();
  });
  ASSERT_GT(server.pid(), 0);
  std::string out;
  ASSERT_EQ(run_cmd(build_bin("syrupctl") + " --json deploy --hook socket-lookup --app pidtest --pid " +
                        std::to_string(server.pid()) + " --protocol tcp --port 7910 --port_end 7911 " +
                        source_path(kByPort),
                    out),
            0)
      << out;
  ids_.push_back(nlohmann::json::parse(out)["id"].get<int>());
  ASSERT_TRUE(connect_to(7910));
  EXPECT_TRUE(accepts(first.get()));
  ASSERT_TRUE(connect_to(7911));
  EXPECT_TRUE(accepts(second.get()));
  // A bad hook-specific value exits 2 naming the flag, before syrupd is asked.
  EXPECT_NE(run_cmd(build_bin("syrupctl") + " deploy --hook socket-lookup --pid 1 --protocol tcp --port 1 "
                        "--port_end 70000 x.c", out), 0);
  EXPECT_NE(out.find("--port_end"), std::string::npos) << out;
}

// The same application deploying to the same claim replaces its policy in the link
// (bpf_link_update): the new executor order takes effect, one policy is listed, and
// removing it leaves the ports to the kernel (the old link pin did not keep it alive).
TEST_F(SocketLookup, RedeployReplacesThePolicyInItsLink) {
  UniqueFd a = bound(SOCK_STREAM, 7961), b = bound(SOCK_STREAM, 7962);
  ASSERT_TRUE(a && b);
  int first = deploy(kByPort, {a.get(), b.get()}, "tcp", 7950, 7951, "replace");
  ASSERT_GT(first, 0) << syr_last_error();
  ASSERT_TRUE(connect_to(7950));
  EXPECT_TRUE(accepts(a.get()));
  int second = deploy(kByPort, {b.get(), a.get()}, "tcp", 7950, 7951, "replace");
  ASSERT_GT(second, 0) << syr_last_error();
  ASSERT_TRUE(connect_to(7950));
  EXPECT_TRUE(accepts(b.get()));
  EXPECT_FALSE(accepts(a.get(), 0));
  size_t mine = 0;
  for (const auto& p : list_policies())
    if (p.value("app", std::string()) == "replace") mine++;
  EXPECT_EQ(mine, 1u);
  ASSERT_EQ(syr_remove_policy(second), 0) << syr_last_error();
  ids_.clear();
  EXPECT_FALSE(connect_to(7950)) << "a link outlived the removed policy";
}

// A restarted syrupd adopts the policy: its link and SOCKMAP stay in the kernel while no
// syrupd runs, connections keep landing, and the adopted policy can be removed.
TEST(SocketLookupRestart, SigkillAndRestartAdoptsThePolicy) {
  SYRUP_REQUIRE_ROOT();
  OwnNetns ns;
  ASSERT_TRUE(ns.ok());
  Daemon d;
  d.start();
  ASSERT_EQ(d.answers(), "");
  UniqueFd a = bound(SOCK_STREAM, 7501), b = bound(SOCK_STREAM, 7502);
  ASSERT_TRUE(a && b);
  syr_deploy_opts o{};
  int fds[] = {a.get(), b.get()};
  o.sz = sizeof o;
  o.app = "restart";
  o.fds = fds;
  o.n_fds = 2;
  o.protocol = "tcp";
  o.port = 7600;
  o.port_end = 7601;
  int id = syr_deploy_policy(source_path(kByPort).c_str(), SYR_HOOK_SOCKET_LOOKUP, &o);
  ASSERT_GT(id, 0) << syr_last_error();
  d.crash();
  // No syrupd: the kernel still steers.
  ASSERT_TRUE(connect_to(7601));
  EXPECT_TRUE(accepts(b.get()));
  d.start();
  ASSERT_EQ(d.answers(), "");
  EXPECT_NE(d.log().find("adopted 1 policies"), std::string::npos) << d.log();
  ASSERT_TRUE(connect_to(7600));
  EXPECT_TRUE(accepts(a.get()));
  ASSERT_EQ(syr_remove_policy(id), 0) << syr_last_error();
  EXPECT_FALSE(connect_to(7600)) << "the link outlived its removed policy";
  EXPECT_EQ(d.stop(), 0) << d.log();
}

// Deploys by_port.c as `uid` with its own socket (bound to `own_port`) for [lo, hi]:
// {"id": N} or {"rc": -errno, "error": text}. The child holds the policy (its owner) and
// the socket until the HeldUser is released.
nlohmann::json deploy_as_user(uint16_t own_port, uint16_t lo, uint16_t hi, const std::string& app) {
  static UniqueFd keep;  // the child's socket, for its life
  keep = bound(SOCK_STREAM, own_port);
  if (!keep) return {{"error", "cannot bind " + std::to_string(own_port)}};
  int fd = keep.get();
  syr_deploy_opts o{};
  o.sz = sizeof o;
  o.app = app.c_str();
  o.fds = &fd;
  o.n_fds = 1;
  o.protocol = "tcp";
  o.port = lo;
  o.port_end = hi;
  int id = syr_deploy_policy(source_path(kByPort).c_str(), SYR_HOOK_SOCKET_LOOKUP, &o);
  if (id > 0) return {{"id", id}};
  return {{"rc", id}, {"error", syr_last_error()}};
}

std::unique_ptr<security::HeldUser> held(uid_t uid, uint16_t own_port, uint16_t lo, uint16_t hi,
                                         const std::string& app) {
  return std::make_unique<security::HeldUser>(uid, [=] { return deploy_as_user(own_port, lo, hi, app); });
}

// The digits in `s` made 'N', to compare refusals of different ports.
std::string without_ports(const std::string& s) { return std::regex_replace(s, std::regex("[0-9]+"), "N"); }

// Alice steers 7050, a port she holds a socket on. Mallory (no grant below 7400) can
// steer neither a free port, nor a range, nor alice's port, and reads the same words for
// all three: nothing tells her whose a port is.
TEST_F(SocketLookup, MalloryCannotSteerAFreePortOrAlicesAndCannotTellThemApart) {
  auto alice = held(kAlice, 7050, 7050, 7050, "alice-app");
  ASSERT_TRUE(alice->result().contains("id")) << alice->result().dump();
  auto free_port = held(kMallory, 7060, 7070, 7070, "mallory-app");
  auto range = held(kMallory, 7061, 7080, 7089, "mallory-app");
  auto alices = held(kMallory, 7062, 7050, 7050, "mallory-app");
  for (auto* h : {free_port.get(), range.get(), alices.get()}) {
    const nlohmann::json& r = h->result();
    ASSERT_TRUE(r.contains("rc")) << r.dump();
    EXPECT_EQ(r["rc"], -EPERM) << r.dump();
    EXPECT_EQ(r["error"].get<std::string>().find("alice"), std::string::npos) << r.dump();
  }
  std::string free_words = free_port->result()["error"];
  EXPECT_NE(free_words.find("cannot be steered by the caller"), std::string::npos) << free_words;
  EXPECT_EQ(without_ports(free_words), without_ports(alices->result()["error"]));
  // Alice's policy still steers: a connection to 7050 reaches her socket.
  EXPECT_TRUE(connect_to(7050));
}

// Claims are exclusive per (namespace, protocol, port): alice's granted range overlapping
// the range mallory's policy steers is refused in the words an ungranted range gets; the
// rest of her grant is hers.
TEST_F(SocketLookup, OverlappingClaimIsRefusedInTheWordsOfAnUngrantedOne) {
  auto mallory = held(kMallory, 7401, 7400, 7460, "mallory-app");
  ASSERT_TRUE(mallory->result().contains("id")) << "mallory's granted deploy: " << mallory->result().dump();
  auto overlap = held(kAlice, 7451, 7450, 7470, "alice-app");
  auto ungranted = held(kAlice, 7452, 7600, 7620, "alice-app");
  ASSERT_TRUE(overlap->result().contains("rc")) << overlap->result().dump();
  ASSERT_TRUE(ungranted->result().contains("rc")) << ungranted->result().dump();
  EXPECT_EQ(overlap->result()["rc"], -EPERM);
  EXPECT_EQ(without_ports(overlap->result()["error"]), without_ports(ungranted->result()["error"]));
  EXPECT_EQ(overlap->result()["error"].get<std::string>().find("mallory"), std::string::npos);
  auto outside = held(kAlice, 7453, 7461, 7470, "alice-app");
  EXPECT_TRUE(outside->result().contains("id")) << outside->result().dump();
}

// SO_REUSEADDR lets UDP sockets of two users share a port: holding a socket on it then
// is not enough, since the policy would take the other user's datagrams. Mallory's claim
// of a port alice shares is refused; of one she alone holds, accepted.
TEST_F(SocketLookup, APortSharedWithAnotherUsersSocketIsNotTheCallers) {
  auto reuse_udp = [](uint16_t port) {
    UniqueFd fd(socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    int on = 1;
    setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return bind(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) ? UniqueFd() : std::move(fd);
  };
  security::HeldUser alice(kAlice, [&] {
    static UniqueFd s;
    s = reuse_udp(7065);
    return nlohmann::json{{"bound", static_cast<bool>(s)}};
  });
  ASSERT_EQ(alice.result()["bound"], true) << alice.result().dump();
  auto mallory_claims = [&](uint16_t port) {
    return as_user(kMallory, [&] {
      UniqueFd s = reuse_udp(port);
      if (!s) return nlohmann::json{{"error", "cannot bind " + std::to_string(port)}};
      int fd = s.get();
      syr_deploy_opts o{};
      o.sz = sizeof o;
      o.app = "mallory-app";
      o.fds = &fd;
      o.n_fds = 1;
      o.protocol = "udp";
      o.port = port;
      int id = syr_deploy_policy(source_path(kByPort).c_str(), SYR_HOOK_SOCKET_LOOKUP, &o);
      return id > 0 ? nlohmann::json{{"id", id}} : nlohmann::json{{"rc", id}, {"error", syr_last_error()}};
    });
  };
  nlohmann::json shared = mallory_claims(7065), alone = mallory_claims(7066);
  ASSERT_TRUE(shared.contains("rc")) << shared.dump();
  EXPECT_EQ(shared["rc"], -EPERM);
  EXPECT_NE(shared["error"].get<std::string>().find("cannot be steered by the caller"), std::string::npos)
      << shared.dump();
  EXPECT_TRUE(alone.contains("id")) << alone.dump();
}

TEST_F(SocketLookup, PolicyCallingAHelperOutsideTheAllowlistIsRefused) {
  UniqueFd s = bound(SOCK_STREAM, 7701);
  ASSERT_TRUE(s);
  int r = deploy("hooks/socket_lookup/tests/policies/forbidden_helper.c", {s.get()}, "tcp", 7700, 7700);
  EXPECT_EQ(r, -EPERM) << syr_last_error();
  EXPECT_NE(std::string(syr_last_error()).find("get_current_pid_tgid"), std::string::npos) << syr_last_error();
}

// A thread policy deployed here, and this hook's policy deployed at socket-select, fail
// with errors that say where each belongs.
TEST_F(SocketLookup, PolicyForAnotherHookGetsAClearError) {
  UniqueFd s = bound(SOCK_STREAM, 7801);
  ASSERT_TRUE(s);
  EXPECT_LT(deploy("tests/policies/thread_prio.c", {s.get()}, "tcp", 7800, 7800), 0);
  EXPECT_NE(std::string(syr_last_error()).find("deploy it with --hook thread"), std::string::npos)
      << syr_last_error();
  UniqueFd g(socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  int on = 1;
  setsockopt(g.get(), SOL_SOCKET, SO_REUSEPORT, &on, sizeof on);
  UniqueFd u = bound(SOCK_DGRAM, 7802);
  setsockopt(u.get(), SOL_SOCKET, SO_REUSEPORT, &on, sizeof on);
  int fd = u.get();
  syr_deploy_opts o{};
  o.sz = sizeof o;
  o.app = "sltest";
  o.fds = &fd;
  o.n_fds = 1;
  int id = syr_deploy_policy(source_path(kByPort).c_str(), SYR_HOOK_SOCKET_SELECT, &o);
  if (id > 0) ids_.push_back(id);
  EXPECT_LT(id, 0);
  EXPECT_NE(std::string(syr_last_error()).find("syr_lookup_local_port"), std::string::npos) << syr_last_error();
}

}  // namespace
}  // namespace syrup::test
