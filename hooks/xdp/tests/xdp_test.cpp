// Integration tests of the XDP hook: a real syrupd, its root program attached to one end
// of a veth pair, traffic from the peer in a network namespace the test makes. Each test
// asserts what each policy saw, which core processed a packet, which AF_XDP socket got
// which frame, and what the interface is left with.
#include <arpa/inet.h>
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <gtest/gtest.h>
#include <fcntl.h>
#include <linux/if_ether.h>
#include <linux/if_packet.h>
#include <sched.h>
#include <net/if.h>
#include <netinet/ip.h>
#include <netinet/ip6.h>
#include <netinet/udp.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>
#include <xdp/xsk.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "harness.h"
#include "syrup/syrup.h"

namespace syrup::test {
namespace {

using nlohmann::json;

void send_to(int fd, const std::string& ip, uint16_t port, uint32_t type, uint32_t key) {
  uint32_t p[4] = {type, key, 0, 0};
  sockaddr_in a{};
  a.sin_family = AF_INET;
  inet_pton(AF_INET, ip.c_str(), &a.sin_addr);
  a.sin_port = htons(port);
  ASSERT_EQ(sendto(fd, p, sizeof p, 0, reinterpret_cast<sockaddr*>(&a), sizeof a), (ssize_t)sizeof p)
      << strerror(errno);
}

// Datagrams waiting on `fd` (drains it), waiting up to `ms` for stragglers.
std::vector<std::string> drain(int fd, int ms = 300) {
  std::vector<std::string> out;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  char buf[2048];
  while (std::chrono::steady_clock::now() < deadline) {
    ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n >= 0) {
      out.emplace_back(buf, static_cast<size_t>(n));
      deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }
  return out;
}

uint64_t map_u64(const char* app, const char* map, uint32_t key) {
  int fd = syr_map_open_app(app, map);
  EXPECT_GE(fd, 0) << syr_last_error();
  uint64_t v = 0;
  if (fd >= 0) {
    syr_map_lookup_elem(fd, &key, &v);
    close(fd);
  }
  return v;
}

json policy_entry(int id) {
  std::string out;
  run_cmd(build_bin("syrupctl") + " --json list", out);
  for (auto& p : json::parse(out))
    if (p["id"] == id) return p;
  return json();
}

class Xdp : public ::testing::Test {
 protected:
  void SetUp() override {
    SYRUP_REQUIRE_ROOT();
    net_n_ = 100 + counter_++ % 100;
    net_ = std::make_unique<TestNet>(net_n_);
    ASSERT_TRUE(net_->ok());
    daemon_.start();
  }
  void TearDown() override {
    for (int id : ids_) syr_remove_policy(id);
    if (daemon_.pid() > 0) {
      EXPECT_EQ(daemon_.stop(), 0);
    }
    if (net_) {
      EXPECT_EQ(attached_xdp_prog(net_->host_if), 0u) << "syrupd left an XDP program attached";
    }
    net_.reset();
  }

  int deploy(const std::string& rel, const char* app, std::vector<uint16_t> ports,
             std::vector<int> cpus = {}, std::vector<int> xsks = {}) {
    syr_deploy_opts o{.sz = sizeof o, .app = app, .fds = xsks.empty() ? nullptr : xsks.data(),
                      .n_fds = xsks.size(), .ifname = net_->host_if.c_str(), .ports = ports.data(),
                      .n_ports = ports.size(), .cpus = cpus.empty() ? nullptr : cpus.data(),
                      .n_cpus = cpus.size()};
    int id = syr_deploy_policy(source_path(rel).c_str(), SYR_HOOK_XDP, &o);
    if (id > 0) ids_.push_back(id);
    return id;
  }

  static int counter_;
  Daemon daemon_;
  int net_n_ = 0;  // TestNet(net_n_) makes the same interfaces again
  std::unique_ptr<TestNet> net_;
  std::vector<int> ids_;
};
int Xdp::counter_ = 0;

// A tenant (not an admin) claims on an interface only ports a socket of its process is
// bound to in the interface's network namespace, syrupd's. A socket bound in a namespace
// of the process's own (a container's) holds that port there: claiming it would steer
// the host's traffic of the port. A child process of another uid does it, from a network
// namespace of its own, with one socket made before it moved there and one after.
TEST_F(Xdp, ATenantClaimsOnlyPortsItsSocketsHoldInTheInterfacesNamespace) {
  const std::string ifname = net_->host_if;
  std::string s = in_child([&] {
    nlohmann::json out;
    // [::] without IPV6_V6ONLY: the port's IPv4 and IPv6 frames, all a claim takes.
    auto bound = [](UniqueFd& fd) -> uint16_t {
      fd.reset(socket(AF_INET6, SOCK_DGRAM | SOCK_CLOEXEC, 0));
      int off = 0;
      sockaddr_in6 a{};
      a.sin6_family = AF_INET6;
      socklen_t l = sizeof a;
      if (!fd || setsockopt(fd.get(), IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof off) != 0 ||
          bind(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
          getsockname(fd.get(), reinterpret_cast<sockaddr*>(&a), &l) != 0)
        return 0;
      return ntohs(a.sin6_port);
    };
    UniqueFd here_fd, there_fd;
    uint16_t here = bound(here_fd);
    if (unshare(CLONE_NEWNET) != 0) return std::string("unshare failed");
    uint16_t there = bound(there_fd);
    if (!here || !there || here == there) return std::string("no two distinct ports");
    if (setgid(61004) || setuid(61004)) return std::string("setuid failed");
    auto claim = [&](uint16_t port) {
      syr_deploy_opts o{.sz = sizeof o, .app = "xdp-tenant", .ifname = ifname.c_str(), .ports = &port, .n_ports = 1};
      int id = syr_deploy_policy(source_path("tests/policies/xdp_count.c").c_str(), SYR_HOOK_XDP, &o);
      nlohmann::json r = {{"r", id}, {"err", syr_last_error()}, {"port", port}};
      if (id > 0) syr_remove_policy(id);
      return r;
    };
    out["there"] = claim(there);
    out["here"] = claim(here);
    return out.dump();
  });
  auto j = nlohmann::json::parse(s, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << s;
  EXPECT_EQ(j["there"]["r"], -EPERM) << j.dump();
  EXPECT_NE(j["there"]["err"].get<std::string>().find("the caller has no socket bound to udp:" +
                                                       std::to_string(j["there"]["port"].get<int>())),
            std::string::npos)
      << j.dump();
  EXPECT_GT(j["here"]["r"].get<int>(), 0) << "a socket bound here was not counted: " << j.dump();
}

TEST_F(Xdp, EachApplicationsPolicySeesOnlyItsOwnPacketsAndUnclaimedPortsPass) {
  UniqueFd s1(udp_server(net_->host_ip, 9301)), s2(udp_server(net_->host_ip, 9302)),
      s3(udp_server(net_->host_ip, 9303));
  int a = deploy("tests/policies/xdp_count.c", "app-a", {9301});
  ASSERT_GT(a, 0) << syr_last_error();
  int b = deploy("tests/policies/xdp_count.c", "app-b", {9302});
  ASSERT_GT(b, 0) << syr_last_error();
  UniqueFd peer(net_->peer_udp());
  for (int i = 0; i < 30; i++) send_to(peer.get(), net_->host_ip, 9301, 1, i);
  for (int i = 0; i < 20; i++) send_to(peer.get(), net_->host_ip, 9302, 1, i);
  for (int i = 0; i < 10; i++) send_to(peer.get(), net_->host_ip, 9303, 1, i);
  EXPECT_EQ(drain(s1.get()).size(), 30u);
  EXPECT_EQ(drain(s2.get()).size(), 20u);
  EXPECT_EQ(drain(s3.get()).size(), 10u) << "unclaimed port must pass untouched";
  EXPECT_EQ(map_u64("app-a", "seen", 0), 30u);
  EXPECT_EQ(map_u64("app-b", "seen", 0), 20u);
  EXPECT_EQ(map_u64("app-a", "seen", 1), 30u * 24) << "the policy sees the UDP header onwards";
  // Keys 0..29 at L4 offset 12, read through syr_ptr() (a copy: the policy is verified
  // as unprivileged code) and through syr_read_u32().
  EXPECT_EQ(map_u64("app-a", "seen", 2), 435u) << "syr_ptr() at the XDP hook";
  EXPECT_EQ(map_u64("app-a", "seen", 3), 435u) << "syr_read_u32() at the XDP hook";
  json pa = policy_entry(a);
  EXPECT_EQ(pa["ifname"], net_->host_if);
  EXPECT_TRUE(pa["mode"] == "native" || pa["mode"] == "generic") << pa.dump();
  EXPECT_GE(pa["root"]["unclaimed"].get<int>(), 10);
  EXPECT_EQ(pa["root"]["dispatched"].get<int>(), 50);
  // Another application cannot take a claimed port.
  EXPECT_EQ(deploy("tests/policies/xdp_count.c", "app-c", {9301}), -EBUSY);
  EXPECT_NE(std::string(syr_last_error()).find("is scheduled by application 'app-a'"), std::string::npos);
}

TEST_F(Xdp, PacketsSteeredToCoreKAreProcessedOnCoreK) {
  if (libbpf_num_possible_cpus() < 2) GTEST_SKIP() << "needs two cores to tell them apart";
  // A connected socket records the CPU that processed its last datagram (SO_INCOMING_CPU).
  UniqueFd peer(net_->peer_udp(7777));
  UniqueFd s(udp_server(net_->host_ip, 9311));
  sockaddr_in pa{};
  pa.sin_family = AF_INET;
  inet_pton(AF_INET, net_->peer_ip.c_str(), &pa.sin_addr);
  pa.sin_port = htons(7777);
  ASSERT_EQ(connect(s.get(), reinterpret_cast<sockaddr*>(&pa), sizeof pa), 0);
  for (int core : {1, 0, 1}) {
    ASSERT_GT(deploy("policies/round_robin.c", "steer", {9311}, {core}), 0) << syr_last_error();
    std::map<int, int> seen;
    for (int i = 0; i < 40; i++) {
      send_to(peer.get(), net_->host_ip, 9311, 1, i);
      char buf[64];
      for (int t = 0; t < 200 && recv(s.get(), buf, sizeof buf, 0) < 0; t++)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      int cpu = -1;
      socklen_t l = sizeof cpu;
      getsockopt(s.get(), SOL_SOCKET, SO_INCOMING_CPU, &cpu, &l);
      seen[cpu]++;
    }
    EXPECT_EQ(seen[core], 40) << "packets steered to core " << core << " were processed elsewhere";
  }
}

// A container's veth left at its defaults: the peer's tx checksum offload hands its frames
// over with partial checksums, which a native-mode redirect to a CPUMAP loses (every
// datagram dropped as corrupt). syrupd attaches in generic mode on veth, where the skb and
// its checksum state are redirected: every UDP datagram and every byte of a TCP stream
// steered to the cores arrives, and the policy counted each datagram.
TEST_F(Xdp, SteeringToCoresOnAVethAtItsDefaultOffloadsDeliversEverything) {
  net_.reset();  // the same interfaces again, offloads left on
  net_ = std::make_unique<TestNet>(net_n_, true);
  ASSERT_TRUE(net_->ok());
  std::string out;
  run_cmd("ip netns exec " + net_->ns + " ethtool -k " + net_->peer_if + " | grep '^tx-checksumming'", out);
  ASSERT_NE(out.find(": on"), std::string::npos) << "the peer's tx checksum offload is not on: " << out;
  std::vector<int> cores = {0};
  if (libbpf_num_possible_cpus() > 1) cores.push_back(1);
  UniqueFd u(udp_server(net_->host_ip, 9391));
  UniqueFd l(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  inet_pton(AF_INET, net_->host_ip.c_str(), &a.sin_addr);
  a.sin_port = htons(9392);
  ASSERT_EQ(bind(l.get(), reinterpret_cast<sockaddr*>(&a), sizeof a), 0) << strerror(errno);
  ASSERT_EQ(listen(l.get(), 4), 0);
  int udp = deploy("tests/policies/xdp_steer_count.c", "veth-udp", {9391}, cores);
  ASSERT_GT(udp, 0) << syr_last_error();
  uint16_t tcp_port = 9392;
  syr_deploy_opts o{.sz = sizeof o, .app = "veth-tcp", .ifname = net_->host_if.c_str(), .ports = &tcp_port,
                    .n_ports = 1, .cpus = cores.data(), .n_cpus = cores.size(), .protocol = "tcp"};
  int tcp = syr_deploy_policy(source_path("tests/policies/xdp_steer_count.c").c_str(), SYR_HOOK_XDP, &o);
  ASSERT_GT(tcp, 0) << syr_last_error();
  ids_.push_back(tcp);
  EXPECT_EQ(policy_entry(udp)["mode"], "generic") << "veth hands over partial checksums";

  UniqueFd peer(net_->peer_udp());
  constexpr int kDatagrams = 500;
  for (int i = 0; i < kDatagrams; i++) send_to(peer.get(), net_->host_ip, 9391, 1, i);
  EXPECT_EQ(drain(u.get()).size(), size_t(kDatagrams)) << "datagrams lost on the way to the cores";
  EXPECT_EQ(map_u64("veth-udp", "seen", 0), uint64_t(kDatagrams));

  // 1 MiB over one connection, both ways of its handshake through the root.
  UniqueFd c(net_->peer_tcp(net_->host_ip, 9392));
  ASSERT_GE(c.get(), 0);
  UniqueFd srv(accept4(l.get(), nullptr, nullptr, SOCK_CLOEXEC));
  ASSERT_GE(srv.get(), 0) << strerror(errno);
  timeval tv{5, 0};
  setsockopt(srv.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  constexpr size_t kBytes = 1 << 20;
  std::thread writer([&] {
    std::string chunk(16384, 'x');
    for (size_t sent = 0; sent < kBytes;) {
      ssize_t n = send(c.get(), chunk.data(), chunk.size(), MSG_NOSIGNAL);
      if (n <= 0) break;
      sent += size_t(n);
    }
    shutdown(c.get(), SHUT_WR);
  });
  size_t got = 0;
  char buf[65536];
  for (ssize_t n; (n = recv(srv.get(), buf, sizeof buf, 0)) > 0;) got += size_t(n);
  writer.join();
  EXPECT_EQ(got, kBytes) << "a TCP stream steered to the cores stalled (lost segments)";
  EXPECT_GT(map_u64("veth-tcp", "seen", 0), 0u);
  EXPECT_GE(map_u64("veth-tcp", "seen", 1), kBytes) << "every byte passed the policy";
}

// A minimal AF_XDP receiver with libxdp's xsk API (copy mode, queue 0).
struct XskReceiver {
  static constexpr int kFrames = 1024, kFrameSize = 2048;
  void* buf = nullptr;
  xsk_umem* umem = nullptr;
  xsk_socket* xsk = nullptr;
  xsk_ring_prod fq;
  xsk_ring_cons cq, rx;
  xsk_ring_prod tx;

  int open(const std::string& ifname) {
    buf = mmap(nullptr, kFrames * kFrameSize, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (buf == MAP_FAILED) return -errno;
    if (int r = xsk_umem__create(&umem, buf, kFrames * kFrameSize, &fq, &cq, nullptr)) return r;
    xsk_socket_config cfg{};
    cfg.rx_size = XSK_RING_CONS__DEFAULT_NUM_DESCS;
    cfg.tx_size = XSK_RING_PROD__DEFAULT_NUM_DESCS;
    cfg.libxdp_flags = XSK_LIBXDP_FLAGS__INHIBIT_PROG_LOAD;  // syrupd owns the XDP program
    cfg.bind_flags = XDP_COPY;
    if (int r = xsk_socket__create(&xsk, ifname.c_str(), 0, umem, &rx, &tx, &cfg)) return r;
    uint32_t idx;
    if (xsk_ring_prod__reserve(&fq, kFrames / 2, &idx) != kFrames / 2) return -ENOMEM;
    for (int i = 0; i < kFrames / 2; i++) *xsk_ring_prod__fill_addr(&fq, idx++) = uint64_t(i) * kFrameSize;
    xsk_ring_prod__submit(&fq, kFrames / 2);
    return 0;
  }
  int fd() const { return xsk_socket__fd(xsk); }
  // Keys (u32 at UDP payload offset 4) of the frames received.
  std::vector<uint32_t> keys(int ms = 300) {
    std::vector<uint32_t> out;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
    while (std::chrono::steady_clock::now() < deadline) {
      uint32_t idx;
      unsigned n = xsk_ring_cons__peek(&rx, 64, &idx);
      if (!n) {
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
        continue;
      }
      for (unsigned i = 0; i < n; i++) {
        const xdp_desc* d = xsk_ring_cons__rx_desc(&rx, idx + i);
        auto* p = static_cast<const uint8_t*>(xsk_umem__get_data(buf, d->addr));
        // Ethernet 14 + IPv4 20 + UDP 8, then type, key.
        uint32_t key;
        if (d->len >= 14 + 20 + 8 + 8) {
          memcpy(&key, p + 14 + 20 + 8 + 4, 4);
          out.push_back(key);
        }
        uint32_t fidx;
        if (xsk_ring_prod__reserve(&fq, 1, &fidx) == 1) {
          *xsk_ring_prod__fill_addr(&fq, fidx) = xsk_umem__extract_addr(d->addr);
          xsk_ring_prod__submit(&fq, 1);
        }
      }
      xsk_ring_cons__release(&rx, n);
    }
    return out;
  }
  ~XskReceiver() {
    if (xsk) xsk_socket__delete(xsk);
    if (umem) xsk_umem__delete(umem);
    if (buf && buf != MAP_FAILED) munmap(buf, kFrames * kFrameSize);
  }
};

// The shipped cross-layer pair: xdp_classify weighs each request and steers it to the
// core with the least outstanding work, recording it in core_work; socket_local, at the
// socket-select hook of the same application, reads core_work and picks the socket of
// that core. One client flow: without the pair the kernel hash would put it all on one
// socket.
TEST_F(Xdp, CrossLayerPairSharesTheWorkMapBetweenXdpAndSocketSelect) {
  if (libbpf_num_possible_cpus() < 2) GTEST_SKIP() << "needs two cores";
  UdpGroup g(2, 9371, net_->host_ip.c_str());
  ASSERT_EQ(g.size(), 2);
  std::vector<int> socks = g.fds();
  int sid = deploy_socket_select("policies/socket_local.c", socks, "xlayer");
  ASSERT_GT(sid, 0) << syr_last_error();
  ids_.push_back(sid);
  ASSERT_GT(deploy("policies/xdp_classify.c", "xlayer", {9371}, {0, 1}), 0) << syr_last_error();

  UniqueFd peer(net_->peer_udp());
  send_to(peer.get(), net_->host_ip, 9371, 2, 0);  // a SCAN: weight 70, to core 0
  for (int i = 1; i <= 20; i++) {
    send_to(peer.get(), net_->host_ip, 9371, 1, i);  // GETs: core 1 has less work
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  auto on0 = drain(socks[0]), on1 = drain(socks[1]);
  ASSERT_EQ(on0.size(), 1u);
  EXPECT_EQ(on0[0][0], 2) << "socket 0 must hold the SCAN";
  EXPECT_EQ(on1.size(), 20u);
  for (auto& p : on1) EXPECT_EQ(p[0], 1);
  EXPECT_EQ(map_u64("xlayer", "core_work", 0), 70u);
  EXPECT_EQ(map_u64("xlayer", "core_work", 1), 20u);
}

TEST_F(Xdp, AfXdpSocketGetsExactlyThePacketsItsPolicyChose) {
  XskReceiver rx;
  int r = rx.open(net_->host_if);
  if (r == -EOPNOTSUPP || r == -EPROTONOSUPPORT) GTEST_SKIP() << "AF_XDP unavailable: " << strerror(-r);
  ASSERT_EQ(r, 0) << strerror(-r);
  UniqueFd s(udp_server(net_->host_ip, 9321));
  ASSERT_GT(deploy("tests/policies/even_keys.c", "xskapp", {9321}, {}, {rx.fd()}), 0) << syr_last_error();
  UniqueFd peer(net_->peer_udp());
  for (uint32_t k = 0; k < 40; k++) send_to(peer.get(), net_->host_ip, 9321, 1, k);
  auto keys = rx.keys();
  auto stack = drain(s.get());
  ASSERT_EQ(keys.size(), 20u);
  for (uint32_t k : keys) EXPECT_EQ(k % 2, 0u) << "an odd key reached the AF_XDP socket";
  ASSERT_EQ(stack.size(), 20u);
  for (auto& p : stack) {
    uint32_t k;
    memcpy(&k, p.data() + 4, 4);
    EXPECT_EQ(k % 2, 1u) << "an even key reached the stack";
  }
}

// Hand-made frames from the peer: each is passed or dropped as documented, never
// mis-parsed, and only well-formed ones reach the policy. (A frame shorter than an
// Ethernet header cannot be sent through AF_PACKET; the root checks it all the same.)
TEST_F(Xdp, MalformedFramesNeverReachThePolicyAndArePassed) {
  ASSERT_GT(deploy("tests/policies/xdp_count.c", "parse", {9331}), 0) << syr_last_error();
  UniqueFd raw(net_->peer_raw());
  sockaddr_ll to{};
  to.sll_family = AF_PACKET;
  to.sll_protocol = htons(ETH_P_ALL);
  std::thread([&] {
    int nsfd = open(("/var/run/netns/" + net_->ns).c_str(), O_RDONLY | O_CLOEXEC);
    setns(nsfd, CLONE_NEWNET);
    to.sll_ifindex = static_cast<int>(if_nametoindex(net_->peer_if.c_str()));
    close(nsfd);
  }).join();
  ASSERT_GT(to.sll_ifindex, 0);

  auto frame = [](uint16_t ethertype) {
    std::string f(14, '\0');
    memset(f.data(), 0xff, 6);  // broadcast: every frame reaches the host end
    f[12] = static_cast<char>(ethertype >> 8);
    f[13] = static_cast<char>(ethertype & 0xff);
    return f;
  };
  auto ipv4 = [&](int ihl, size_t l4_len, uint16_t frag) {
    std::string f = frame(ETH_P_IP);
    std::string ip(20, '\0');
    ip[0] = static_cast<char>(0x40 | ihl);
    uint16_t tot = htons(static_cast<uint16_t>(20 + l4_len));
    memcpy(&ip[2], &tot, 2);
    uint16_t fo = htons(frag);
    memcpy(&ip[6], &fo, 2);
    ip[8] = 64;
    ip[9] = IPPROTO_UDP;
    return f + ip;
  };
  auto udp = [](uint16_t dport) {
    std::string u(8 + 16, '\0');
    uint16_t sp = htons(1234), dp = htons(dport), len = htons(24);
    memcpy(&u[0], &sp, 2);
    memcpy(&u[2], &dp, 2);
    memcpy(&u[4], &len, 2);
    return u;
  };
  auto ipv6 = [&](const std::string& ext, uint8_t first_next) {
    std::string f = frame(ETH_P_IPV6);
    std::string ip(40, '\0');
    ip[0] = 0x60;
    uint16_t pl = htons(static_cast<uint16_t>(ext.size() + 24));
    memcpy(&ip[4], &pl, 2);
    ip[6] = static_cast<char>(first_next);
    ip[7] = 64;
    return f + ip + ext;
  };
  auto sendf = [&](const std::string& f) {
    ASSERT_EQ(sendto(raw.get(), f.data(), f.size(), 0, reinterpret_cast<sockaddr*>(&to), sizeof to),
              static_cast<ssize_t>(f.size()))
        << strerror(errno);
  };
  struct Case {
    const char* what;
    std::string frame;
    const char* counter;  // root counter that must grow
  };
  std::string hop_dst(16, '\0');  // hop-by-hop (8 bytes) -> destination options (8) -> UDP
  hop_dst[0] = 60;                // next: destination options
  hop_dst[8] = IPPROTO_UDP;
  std::string frag6(8, '\0');
  frag6[0] = IPPROTO_UDP;
  std::vector<Case> cases = {
      {"truncated IPv4 header", frame(ETH_P_IP) + std::string(12, '\x45'), "malformed"},
      {"IHL below 5", ipv4(3, 24, 0) + udp(9331), "malformed"},
      {"IHL past the frame", ipv4(15, 24, 0) + udp(9331).substr(0, 8), "malformed"},
      {"truncated UDP header", ipv4(5, 24, 0) + udp(9331).substr(0, 6), "malformed"},
      {"IPv4 fragment", ipv4(5, 24, 0x2000) + udp(9331), "fragment"},
      {"IPv6 fragment header", ipv6(frag6, 44) + udp(9331), "fragment"},
      {"IPv6 truncated extension header", ipv6(std::string(1, '\0'), 0), "malformed"},
      {"ARP", frame(0x0806) + std::string(28, '\0'), "not_l4"},
  };
  json before = policy_entry(ids_[0])["root"];
  for (auto& c : cases) {
    json b = policy_entry(ids_[0])["root"];
    sendf(c.frame);
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    json a = policy_entry(ids_[0])["root"];
    EXPECT_EQ(a[c.counter].get<int>(), b[c.counter].get<int>() + 1) << c.what;
    EXPECT_EQ(a["dispatched"], b["dispatched"]) << c.what << " reached a policy";
  }
  EXPECT_EQ(map_u64("parse", "seen", 0), 0u);
  // Well-formed frames with options and extension headers are parsed to the right port.
  std::string opts_v4 = ipv4(6, 24, 0) + std::string(4, '\x01') + udp(9331);  // IHL 6: 4 bytes of NOPs
  sendf(opts_v4);
  sendf(ipv6(hop_dst, 0) + udp(9331));
  std::string ah(12, '\0');  // authentication header: length in 4-byte units, minus 2
  ah[0] = IPPROTO_UDP;
  ah[1] = 1;
  std::string hop_ah(8, '\0');  // hop-by-hop -> AH -> UDP: each length in its own units
  hop_ah[0] = IPPROTO_AH;
  sendf(ipv6(ah, IPPROTO_AH) + udp(9331));
  sendf(ipv6(hop_ah + ah, 0) + udp(9331));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(map_u64("parse", "seen", 0), 4u) << "IPv4 options / IPv6 extension headers mis-parsed";
  EXPECT_EQ(map_u64("parse", "seen", 1), 4u * 24) << "the policy's input must start at the UDP header";
  EXPECT_GT(daemon_.pid(), 0);
  (void)before;
}

TEST_F(Xdp, UpgradeUnderSteadyTrafficLosesNothingAndLeavesOtherAppsAlone) {
  constexpr int kPackets = 20000;
  UniqueFd s(udp_server(net_->host_ip, 9341)), other(udp_server(net_->host_ip, 9342));
  ASSERT_GT(deploy("policies/round_robin.c", "upg", {9341}, {0}), 0) << syr_last_error();
  int other_id = deploy("tests/policies/xdp_count.c", "bystander", {9342});
  ASSERT_GT(other_id, 0) << syr_last_error();
  std::atomic<bool> done{false};
  std::atomic<int> got{0};
  std::thread rx([&] {
    char buf[64];
    while (!done.load() || recv(s.get(), buf, sizeof buf, MSG_PEEK) >= 0) {
      if (recv(s.get(), buf, sizeof buf, 0) >= 0) got++;
      else std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  });
  std::thread tx([&] {
    UniqueFd peer(net_->peer_udp());
    for (int i = 0; i < kPackets; i++) {
      send_to(peer.get(), net_->host_ip, 9341, 1, i);
      if (i % 100 == 0) send_to(peer.get(), net_->host_ip, 9342, 1, i);
      // Paced so a busy machine never overflows the CPUMAP queue (2048 frames): what is
      // measured is the swap, not the capacity of a starved kthread.
      if (i % 8 == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  });
  int upgrades = 0;
  for (int i = 0; i < 8; i++) {
    int id = deploy(i % 2 ? "policies/round_robin.c" : "policies/pass.c", "upg", {9341},
                    {static_cast<int>(i % 2)});
    EXPECT_GT(id, 0) << syr_last_error();
    if (id <= 0) break;
    upgrades++;
  }
  tx.join();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  done = true;
  rx.join();
  EXPECT_EQ(upgrades, 8);
  EXPECT_EQ(got.load(), kPackets) << "packets lost across XDP upgrades";
  EXPECT_EQ(drain(other.get()).size(), static_cast<size_t>(kPackets / 100));
  EXPECT_EQ(map_u64("bystander", "seen", 0), static_cast<uint64_t>(kPackets / 100));
  EXPECT_EQ(policy_entry(other_id)["id"], other_id) << "the other application's policy must survive";
}

TEST_F(Xdp, RemovingTheLastPolicyDetachesAndLeavesTheInterfaceAsItWas) {
  int a = deploy("policies/pass.c", "rm-a", {9351});
  int b = deploy("policies/pass.c", "rm-b", {9352});
  ASSERT_GT(a, 0) << syr_last_error();
  ASSERT_GT(b, 0) << syr_last_error();
  uint32_t prog = attached_xdp_prog(net_->host_if);
  EXPECT_NE(prog, 0u);
  ASSERT_EQ(syr_remove_policy(a), 0);
  EXPECT_EQ(attached_xdp_prog(net_->host_if), prog) << "the root must stay while an app uses it";
  ASSERT_EQ(syr_remove_policy(b), 0);
  ids_.clear();
  EXPECT_EQ(attached_xdp_prog(net_->host_if), 0u);
  EXPECT_FALSE(std::filesystem::exists(daemon_.bpffs_root() + "/xdp/" + net_->host_if));
  // Traffic still flows to the stack.
  UniqueFd s(udp_server(net_->host_ip, 9351));
  UniqueFd peer(net_->peer_udp());
  for (int i = 0; i < 5; i++) send_to(peer.get(), net_->host_ip, 9351, 1, i);
  EXPECT_EQ(drain(s.get()).size(), 5u);
}

// Times syrupd's main thread has gone to sleep (voluntary context switches), -1 if unknown.
long main_thread_sleeps(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/task/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("voluntary_ctxt_switches:", 0) == 0) return std::stol(line.substr(24));
  return -1;
}

// An XDP policy's attachment ends only with news syrupd waits for (a link event), so a
// syrupd whose policies are all XDP sleeps until something happens. It used to wake every
// 2 s to look for ended socket-select groups it did not have.
TEST_F(Xdp, SyrupdWithOnlyXdpPoliciesSleepsUntilSomethingHappens) {
  ASSERT_GT(deploy("policies/pass.c", "idle", {9391}), 0) << syr_last_error();
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  long before = main_thread_sleeps(daemon_.pid());
  ASSERT_GE(before, 0);
  std::this_thread::sleep_for(std::chrono::seconds(5));
  EXPECT_LE(main_thread_sleeps(daemon_.pid()) - before, 1) << "syrupd woke with nothing to do";
}

// The kernel can take a policy's attachment away without syrupd: the interface is deleted
// (or moved to another network namespace), or another tool detaches the root program.
// syrupd then removes the policy at once, saying why, rather than list a policy that
// schedules nothing; and the next deploy to the interface attaches a new root program
// (before, it reused the lost one: "deployed", and nothing attached).
TEST_F(Xdp, APolicyWhoseInterfaceIsDeletedOrWhoseProgramIsDetachedIsRemovedAndTheNextDeployAttaches) {
  const std::string ifname = net_->host_if;
  int a = deploy("tests/policies/xdp_count.c", "gone-a", {9371});
  ASSERT_GT(a, 0) << syr_last_error();
  ASSERT_NE(attached_xdp_prog(ifname), 0u);
  auto removed_saying = [&](int id, const std::string& app, const std::string& why) {
    for (int t = 0; t < 60 && !policy_entry(id).is_null(); t++)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_TRUE(policy_entry(id).is_null()) << "policy " << id << " is still listed: " << daemon_.log();
    EXPECT_NE(daemon_.log().find("removed policy " + std::to_string(id) + " (xdp_count.c) of app '" + app + "': " + why),
              std::string::npos)
        << daemon_.log();
    EXPECT_FALSE(std::filesystem::exists(daemon_.bpffs_root() + "/xdp/" + ifname)) << "the lost root's pins stay";
    EXPECT_EQ(syr_remove_policy(id), -ENOENT);
    EXPECT_NE(std::string(syr_last_error()).find(why), std::string::npos) << syr_last_error();
  };

  net_.reset();  // deletes the interface
  removed_saying(a, "gone-a", "interface " + ifname + " is gone");
  ids_.clear();

  net_ = std::make_unique<TestNet>(net_n_);
  ASSERT_TRUE(net_->ok());
  int b = deploy("tests/policies/xdp_count.c", "gone-b", {9372});
  ASSERT_GT(b, 0) << syr_last_error();
  EXPECT_NE(attached_xdp_prog(ifname), 0u) << "deployed, but no root program on the new " << ifname;
  UniqueFd s(udp_server(net_->host_ip, 9372));
  UniqueFd peer(net_->peer_udp());
  for (int i = 0; i < 6; i++) send_to(peer.get(), net_->host_ip, 9372, 1, i);
  EXPECT_EQ(drain(s.get()).size(), 6u);
  EXPECT_EQ(map_u64("gone-b", "seen", 0), 6u) << "the new root does not reach the policy";

  std::string out;
  run_cmd("ip link set dev " + ifname + " xdpgeneric off; ip link set dev " + ifname + " xdpdrv off", out);
  ASSERT_EQ(attached_xdp_prog(ifname), 0u) << out;
  removed_saying(b, "gone-b", "the XDP root program was detached from " + ifname + " by another tool");
  ids_.clear();
  int c = deploy("tests/policies/xdp_count.c", "gone-b", {9372});
  ASSERT_GT(c, 0) << syr_last_error();
  EXPECT_NE(attached_xdp_prog(ifname), 0u);
  // libxdp's attempt at its own dispatcher, which fails on kernels without trampolines,
  // is not a warning the operator has to read.
  EXPECT_EQ(daemon_.log().find("warning: syrupd: libbpf"), std::string::npos) << daemon_.log();
}

// The kernel attaches XDP by interface index, so a renamed interface keeps syrupd's root
// program. Its policies follow the new name (list, pins, the next deploy to it, the state
// file), also when the rename happened while no syrupd ran. Before, they stayed under the
// old name and a deploy to the new one was refused as "an XDP program that this syrupd did
// not attach".
TEST_F(Xdp, APolicyFollowsItsInterfaceWhenItIsRenamedAlsoWhileNoSyrupdRuns) {
  // The new name has a dot, as a VLAN's has (eth0.100): bpffs refuses dots in pin names.
  const std::string first = net_->host_if, second = first + ".r";
  auto rename_to = [&](const std::string& to) {
    std::string out, from = net_->host_if;
    ASSERT_EQ(run_cmd("ip link set dev " + from + " down && ip link set dev " + from + " name " + to +
                          " && ip link set dev " + to + " up",
                      out),
              0)
        << out;
    net_->host_if = to;  // the fixture's checks and clean-up use the name the kernel has now
    run_cmd("ping -c1 -W1 -I " + to + " " + net_->peer_ip, out);
  };
  UniqueFd s(udp_server(net_->host_ip, 9381));
  UniqueFd peer(net_->peer_udp());
  uint64_t sent = 0;
  auto counted = [&](const char* when) {
    for (int i = 0; i < 5; i++) send_to(peer.get(), net_->host_ip, 9381, 1, i);
    sent += 5;
    EXPECT_EQ(drain(s.get()).size(), 5u) << when;
    EXPECT_EQ(map_u64("ren-a", "seen", 0), sent) << when << ": the policy does not see the port's packets";
  };
  auto pin_dir = [&](std::string ifname) {
    std::replace(ifname.begin(), ifname.end(), '.', ':');
    return daemon_.bpffs_root() + "/xdp/" + ifname;
  };
  auto pinned_as = [&](const std::string& ifname) {
    EXPECT_TRUE(std::filesystem::exists(pin_dir(ifname) + "/prog")) << ifname << daemon_.log();
    for (const auto& other : {first, second})
      EXPECT_TRUE(other == ifname || !std::filesystem::exists(pin_dir(other))) << other << "'s pins stay";
  };
  auto ifname_of = [](int id) {
    json p = policy_entry(id);
    return p.is_object() ? p.value("ifname", std::string()) : std::string("(not listed)");
  };
  int a = deploy("tests/policies/xdp_count.c", "ren-a", {9381});
  ASSERT_GT(a, 0) << syr_last_error();
  uint32_t prog = attached_xdp_prog(first);
  ASSERT_NE(prog, 0u);

  rename_to(second);
  for (int t = 0; t < 60 && ifname_of(a) != second; t++)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(ifname_of(a), second) << daemon_.log();
  EXPECT_NE(daemon_.log().find("interface " + first + " was renamed to " + second +
                               ": its XDP root program and policies follow it"),
            std::string::npos)
      << daemon_.log();
  EXPECT_EQ(attached_xdp_prog(second), prog);
  pinned_as(second);
  counted("after the rename");
  int b = deploy("tests/policies/xdp_count.c", "ren-b", {9382});
  EXPECT_GT(b, 0) << "a deploy to the new name: " << syr_last_error();
  EXPECT_EQ(attached_xdp_prog(second), prog) << "the second policy shares the root";
  syr_deploy_opts o{.sz = sizeof o, .app = "ren-c", .ifname = first.c_str()};
  uint16_t port = 9383;
  o.ports = &port;
  o.n_ports = 1;
  EXPECT_EQ(syr_deploy_policy(source_path("policies/pass.c").c_str(), SYR_HOOK_XDP, &o), -ENODEV);
  EXPECT_NE(std::string(syr_last_error()).find("no network interface '" + first + "'"), std::string::npos)
      << syr_last_error();

  // Renamed back while no syrupd runs: the next one adopts both policies from the state
  // file, finds the root program where the kernel has it, and follows the name.
  std::string root = daemon_.bpffs_root();
  daemon_.crash();
  rename_to(first);
  daemon_.start(root);
  EXPECT_NE(daemon_.log().find("adopted 2 policies"), std::string::npos) << daemon_.log();
  EXPECT_EQ(ifname_of(a), first) << daemon_.log();
  EXPECT_EQ(ifname_of(b), first) << daemon_.log();
  EXPECT_EQ(attached_xdp_prog(first), prog);
  pinned_as(first);
  counted("after a rename while no syrupd ran");

  // Without the state file, the next syrupd removes its predecessor's root from the
  // renamed interface, rather than leave it there refusing every deploy.
  daemon_.crash();
  ids_.clear();
  unlink(daemon_.state_file().c_str());
  rename_to(second);
  daemon_.start(root);
  EXPECT_EQ(attached_xdp_prog(second), 0u) << daemon_.log();
  EXPECT_NE(daemon_.log().find("removed the XDP root program a previous syrupd left on " + second +
                               " (pinned as " + first + ")"),
            std::string::npos)
      << daemon_.log();
  EXPECT_FALSE(std::filesystem::exists(root + "/xdp/" + first));
  // A first deploy to the dotted name attaches and pins a new root.
  int c = deploy("tests/policies/xdp_count.c", "ren-a", {9381});
  ASSERT_GT(c, 0) << syr_last_error();
  EXPECT_NE(attached_xdp_prog(second), 0u);
  pinned_as(second);
  sent = 0;
  counted("a new root on the dotted name");
}

// A deploy parked for its compile makes the target checks again when it resumes: a port
// another application claimed meanwhile is refused (EBUSY), and the claim stays with the
// application that took it, whose policy goes on counting the port's packets.
TEST_F(Xdp, APortClaimedWhileADeployCompilesIsRefusedWhenItResumes) {
  EXPECT_EQ(daemon_.stop(), 0);
  TempDir dir;
  daemon_.start("", {"--clang=" + slow_clang(dir.path(), 3)});
  int warm = deploy("tests/policies/xdp_count.c", "warm", {9361});  // cached from here on
  ASSERT_GT(warm, 0) << syr_last_error();
  ASSERT_EQ(syr_remove_policy(warm), 0) << syr_last_error();
  ids_.clear();

  int slow_r = 0;
  std::string slow_err;
  std::thread slow([&] {
    std::string src = uncached_source("tests/policies/xdp_count.c");
    std::vector<uint16_t> ports = {9362};
    syr_deploy_opts o{.sz = sizeof o, .app = "slowxdp", .ifname = net_->host_if.c_str(), .ports = ports.data(),
                      .n_ports = ports.size()};
    slow_r = syr_deploy_policy_source(src.data(), src.size(), "xdp_count.c", SYR_HOOK_XDP, &o);
    slow_err = syr_last_error();
  });
  bool parked = log_says(daemon_, kParkedLog, 1, 5000);
  int fast = parked ? deploy("tests/policies/xdp_count.c", "fastxdp", {9362}) : 0;
  slow.join();
  if (slow_r > 0) ids_.push_back(slow_r);
  ASSERT_TRUE(parked) << daemon_.log();
  ASSERT_GT(fast, 0) << syr_last_error();
  EXPECT_EQ(slow_r, -EBUSY) << slow_err;
  EXPECT_NE(slow_err.find("is scheduled by application 'fastxdp'"), std::string::npos) << slow_err;
  UniqueFd s(udp_server(net_->host_ip, 9362));
  UniqueFd peer(net_->peer_udp());
  for (int i = 0; i < 12; i++) send_to(peer.get(), net_->host_ip, 9362, 1, i);
  EXPECT_EQ(drain(s.get()).size(), 12u);
  EXPECT_EQ(map_u64("fastxdp", "seen", 0), 12u);
}

TEST_F(Xdp, CrashedDaemonIsAdoptedOrItsLeftoverRemovedAndAForeignProgramIsRefused) {
  ASSERT_GT(deploy("policies/pass.c", "crash", {9361}), 0) << syr_last_error();
  uint32_t leftover = attached_xdp_prog(net_->host_if);
  ASSERT_NE(leftover, 0u);
  std::string root = daemon_.bpffs_root();
  daemon_.crash();
  ids_.clear();
  EXPECT_EQ(attached_xdp_prog(net_->host_if), leftover) << "a crash leaves the data path in place";

  // Another syrupd with its own pin root must not silently replace it.
  {
    Daemon other;
    other.start("/sys/fs/bpf/syrup-test-other-" + std::to_string(getpid()));
    syr_deploy_opts o{.sz = sizeof o, .app = "crash", .ifname = net_->host_if.c_str()};
    uint16_t port = 9361;
    o.ports = &port;
    o.n_ports = 1;
    EXPECT_EQ(syr_deploy_policy(source_path("policies/pass.c").c_str(), SYR_HOOK_XDP, &o), -EBUSY);
    EXPECT_NE(std::string(syr_last_error()).find("already has an XDP program (id " + std::to_string(leftover)),
              std::string::npos)
        << syr_last_error();
    EXPECT_EQ(other.stop(), 0);
  }
  EXPECT_EQ(attached_xdp_prog(net_->host_if), leftover);

  // The next syrupd on the same pins and state adopts it: same program, same policy.
  UniqueFd s(udp_server(net_->host_ip, 9361));
  daemon_.start(root);
  EXPECT_EQ(attached_xdp_prog(net_->host_if), leftover);
  EXPECT_NE(daemon_.log().find("adopted 1 policies"), std::string::npos) << daemon_.log();
  json p = policy_entry(1);
  EXPECT_EQ(p["app"], "crash");
  EXPECT_EQ(p["ports"], json::array({"udp:9361"}));
  UniqueFd peer(net_->peer_udp());
  for (int i = 0; i < 5; i++) send_to(peer.get(), net_->host_ip, 9361, 1, i);
  EXPECT_EQ(drain(s.get()).size(), 5u);

  // Without its state file, the next syrupd recognises its predecessor's root and
  // removes it (the interface is left as it was).
  daemon_.crash();
  unlink(daemon_.state_file().c_str());
  daemon_.start(root);
  EXPECT_EQ(attached_xdp_prog(net_->host_if), 0u);
  EXPECT_NE(daemon_.log().find("removed the XDP root program a previous syrupd left on " + net_->host_if),
            std::string::npos)
      << daemon_.log();
  ASSERT_GT(deploy("policies/pass.c", "crash", {9361}), 0) << syr_last_error();
}

}  // namespace
}  // namespace syrup::test
