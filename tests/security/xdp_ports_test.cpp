// Class 9 of the security suite (docs/security/input.md): an XDP port claim takes every
// frame of (protocol, port) on the interface, IPv4 and IPv6 to any address, so a tenant
// may claim only a port its own sockets receive all of. The audit's user held only
// [::]:9200 with IPV6_V6ONLY, claimed UDP 9200 and dropped another user's IPv4 traffic to
// 0.0.0.0:9200. Here Mallory tries that (and a socket bound to one address) with a policy
// that drops everything, on a veth pair whose peer is in a namespace the test makes, and
// Alice's IPv4 datagrams from the peer to her 0.0.0.0 socket must still arrive.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <thread>

#include "security/held_user.h"
#include "security/security.h"

namespace syrup::test::security {
namespace {

using nlohmann::json;

TEST(XdpPorts, AV6OnlyHolderCannotClaimThePortForIpv4AndAnotherUsersIpv4TrafficArrives) {
  SYRUP_REQUIRE_ROOT();
  TestNet net(240 + getpid() % 10);
  ASSERT_TRUE(net.ok());
  Daemon d;
  d.start();
  std::string ifname = net.host_if;
  std::string drop = source_path("tests/policies/drop_all.c");

  UniqueFd v6only, specific, dual;
  HeldUser mallory(kMallory, [&] {
    auto claim = [&](uint16_t port, const char* app) {
      syr_deploy_opts o{.sz = sizeof o, .app = app, .ifname = ifname.c_str(), .ports = &port, .n_ports = 1};
      int id = syr_deploy_policy(drop.c_str(), SYR_HOOK_XDP, &o);
      return json{{"r", id}, {"err", syr_last_error()}, {"port", port}};
    };
    json out;
    out["v6only"] = claim(bound_udp(v6only, AF_INET6, "::", true), "mallory-v6only");
    out["specific"] = claim(bound_udp(specific, AF_INET, "127.0.0.1"), "mallory-specific");
    // What may be claimed: [::] without IPV6_V6ONLY receives the port's IPv4 and IPv6.
    out["dual"] = claim(bound_udp(dual, AF_INET6, "::", false), "mallory-dual");
    return out;
  });
  const json& m = mallory.result();
  ASSERT_TRUE(m.contains("v6only")) << m.dump();
  EXPECT_EQ(m["v6only"]["r"], -EPERM) << m.dump();
  EXPECT_NE(m["v6only"]["err"].get<std::string>().find("with IPV6_V6ONLY (IPv6 only)"), std::string::npos)
      << m.dump();
  EXPECT_NE(m["v6only"]["err"].get<std::string>().find("a claim needs sockets bound to the wildcard address"),
            std::string::npos)
      << m.dump();
  EXPECT_EQ(m["specific"]["r"], -EPERM) << m.dump();
  EXPECT_NE(m["specific"]["err"].get<std::string>().find("127.0.0.1 (that address only)"), std::string::npos)
      << m.dump();
  EXPECT_GT(m["dual"]["r"].get<int>(), 0) << m.dump();

  // Alice binds 0.0.0.0 on the port Mallory holds for IPv6 only (she may: the families do
  // not share a binding) and sends to it from the peer while Mallory's process lives.
  uint16_t port = m["v6only"]["port"].get<uint16_t>();
  UniqueFd peer(net.peer_udp());
  std::string host_ip = net.host_ip;
  json a = as_user(kAlice, [&] {
    UniqueFd mine(socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    sockaddr_in any{};
    any.sin_family = AF_INET;
    any.sin_port = htons(port);
    if (bind(mine.get(), reinterpret_cast<sockaddr*>(&any), sizeof any))
      return json{{"error", std::string("bind: ") + strerror(errno)}};
    timeval tv{0, 300000};
    setsockopt(mine.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_port = htons(port);
    inet_pton(AF_INET, host_ip.c_str(), &to.sin_addr);
    int got = 0;
    for (int i = 0; i < 20; i++) {
      uint32_t p[4] = {1, static_cast<uint32_t>(i), 0, 0};
      sendto(peer.get(), p, sizeof p, 0, reinterpret_cast<sockaddr*>(&to), sizeof to);
      char buf[64];
      if (recv(mine.get(), buf, sizeof buf, 0) > 0) got++;
    }
    return json{{"sent", 20}, {"got", got}};
  });
  EXPECT_EQ(a.value("got", -1), 20) << a.dump();

  if (m["dual"]["r"].get<int>() > 0) syr_remove_policy(m["dual"]["r"].get<int>());
  mallory.release();
  EXPECT_EQ(d.stop(), 0);
}

// A port another user's application claimed is refused without naming that application
// (a claim is checked when it is made: Alice's socket may close while her claim stays).
TEST(XdpPorts, AClaimedPortIsRefusedWithoutNamingAnotherUsersApplication) {
  SYRUP_REQUIRE_ROOT();
  TestNet net(230 + getpid() % 10);
  ASSERT_TRUE(net.ok());
  Daemon d;
  d.start();
  std::string ifname = net.host_if;
  std::string drop = source_path("tests/policies/drop_all.c");
  UniqueFd hers;
  HeldUser alice(kAlice, [&] {
    uint16_t port = bound_udp(hers, AF_INET6, "::", false);
    syr_deploy_opts o{.sz = sizeof o, .app = "alice-secret-app", .ifname = ifname.c_str(), .ports = &port, .n_ports = 1};
    int id = syr_deploy_policy(drop.c_str(), SYR_HOOK_XDP, &o);
    hers.reset();  // the claim stays with her policy
    return json{{"r", id}, {"err", syr_last_error()}, {"port", port}};
  });
  const json& a = alice.result();
  ASSERT_GT(a.value("r", 0), 0) << a.dump();
  uint16_t port = a["port"].get<uint16_t>();
  json m = as_user(kMallory, [&] {
    UniqueFd mine(socket(AF_INET6, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    int off = 0;
    setsockopt(mine.get(), IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof off);
    sockaddr_in6 any{};
    any.sin6_family = AF_INET6;
    any.sin6_port = htons(port);
    if (bind(mine.get(), reinterpret_cast<sockaddr*>(&any), sizeof any))
      return json{{"error", std::string("bind: ") + strerror(errno)}};
    uint16_t p = port;
    syr_deploy_opts o{.sz = sizeof o, .app = "mallory-app", .ifname = ifname.c_str(), .ports = &p, .n_ports = 1};
    int id = syr_deploy_policy(drop.c_str(), SYR_HOOK_XDP, &o);
    return json{{"r", id}, {"err", syr_last_error()}};
  });
  ASSERT_TRUE(m.contains("r")) << m.dump();
  EXPECT_EQ(m["r"], -EBUSY) << m.dump();
  std::string e = m["err"].get<std::string>();
  EXPECT_EQ(e.find("alice-secret-app"), std::string::npos) << e;
  EXPECT_NE(e.find("is scheduled by another application"), std::string::npos) << e;
  alice.release();
  EXPECT_EQ(d.stop(), 0);
}

}  // namespace
}  // namespace syrup::test::security
