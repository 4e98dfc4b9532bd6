// The XDP hook's parse() (hooks/xdp/request.h), key by key: ifname, port and ports,
// protocol, cpus, pid, and keys it does not take.
#include <gtest/gtest.h>
#include <netinet/in.h>

#include "registry.h"
#include "xdp/request.h"

namespace syrup::xdp {
namespace {

using nlohmann::json;

std::string refusal(json f) {
  XdpRequest r;
  Bad bad;
  return parse(f, r, bad) ? "" : bad.str();
}

// A valid request with `k` set to `v` (or removed, for a null `v`).
json with(const char* k, json v) {
  json f = {{"ifname", "eth0"}, {"port", 9000}};
  if (v.is_null()) f.erase(k);
  else f[k] = v;
  return f;
}

TEST(XdpRequest, DefaultsAndCanonicalFields) {
  XdpRequest r;
  Bad bad;
  ASSERT_TRUE(parse({{"ifname", "eth0"}, {"port", 9000}, {"ports", {9002, 9001}}, {"cpus", {3, "0-1"}}, {"pid", 5}},
                    r, bad))
      << bad.str();
  EXPECT_EQ(r.protocol, IPPROTO_UDP);
  EXPECT_EQ(r.ports, (std::set<uint16_t>{9000, 9001, 9002}));
  EXPECT_EQ(r.cpus, (std::vector<uint32_t>{3, 0, 1}));
  EXPECT_EQ(r.pid, 5);
  EXPECT_EQ(to_json(r), json({{"ifname", "eth0"}, {"protocol", "udp"}, {"ports", {9000, 9001, 9002}}, {"cpus", {3, 0, 1}}}));
}

TEST(XdpRequest, Ifname) {
  const std::string why = "ifname: must be an interface name (1..15 characters, no '/', ':', spaces or control "
                          "characters), got ";
  EXPECT_EQ(refusal(with("ifname", nullptr)), "ifname: required key is missing");
  EXPECT_EQ(refusal(with("ifname", 7)), why + "7");
  EXPECT_EQ(refusal(with("ifname", "")), why + "\"\"");
  EXPECT_EQ(refusal(with("ifname", "a/b")), why + "\"a/b\"");
  EXPECT_EQ(refusal(with("ifname", "sixteen-chars-xx")), why + "\"sixteen-chars-xx\"");
  EXPECT_EQ(refusal(with("ifname", "lo\n")), why + "\"lo\\n\"");
}

TEST(XdpRequest, PortAndPorts) {
  EXPECT_EQ(refusal({{"ifname", "eth0"}}), "ports: the xdp hook needs the ports it schedules: port or ports (or a cgroup: its processes' ports)");
  EXPECT_EQ(refusal(with("port", 70000)), "port: must be an integer in 1..65535, got 70000");
  EXPECT_EQ(refusal(with("port", "9000")), "port: must be an integer in 1..65535, got \"9000\"");
  const std::string why = "ports: must be a list of ports, each an integer in 1..65535, got ";
  EXPECT_EQ(refusal(with("ports", 9001)), why + "9001");
  EXPECT_EQ(refusal(with("ports", json::array())), why + "[]");
  EXPECT_EQ(refusal(with("ports", {9001, 4294976396ull})), why + "4294976396");
  EXPECT_EQ(refusal(with("ports", {9001, {1}})), why + "[1]");
  EXPECT_EQ(refusal(with("ports", {9001, 9000})), "ports: port 9000 is listed twice");
}

TEST(XdpRequest, Protocol) {
  EXPECT_EQ(refusal(with("protocol", "sctp")), "protocol: must be udp or tcp, got \"sctp\"");
  XdpRequest r;
  Bad bad;
  ASSERT_TRUE(parse(with("protocol", "tcp"), r, bad));
  EXPECT_EQ(r.protocol, IPPROTO_TCP);
}

TEST(XdpRequest, Cpus) {
  const std::string why = "cpus: must be a list of CPU numbers (0..4095) or ranges such as 0-3, got ";
  EXPECT_EQ(refusal(with("cpus", 1)), why + "1");
  EXPECT_EQ(refusal(with("cpus", json::array())), why + "[]");
  EXPECT_EQ(refusal(with("cpus", {4096})), why + "4096");
  EXPECT_EQ(refusal(with("cpus", {-1})), why + "-1");
  EXPECT_EQ(refusal(with("cpus", {4294967296ull})), why + "4294967296");
  EXPECT_EQ(refusal(with("cpus", {"3-1"})), why + "\"3-1\"");
  EXPECT_EQ(refusal(with("cpus", {"0-4096"})), why + "\"0-4096\"");
  EXPECT_EQ(refusal(with("cpus", {"x"})), why + "\"x\"");
  EXPECT_EQ(refusal(with("cpus", {"99999999999999999999-1"})), why + "\"99999999999999999999-1\"");
  EXPECT_EQ(refusal(with("cpus", {0, "0-2"})), "cpus: CPU 0 is listed twice");
  EXPECT_EQ(refusal(with("cpus", {"0-256"})), "cpus: at most 256 executors per policy");
}

TEST(XdpRequest, PidAndUnknownKeys) {
  EXPECT_EQ(refusal(with("pid", -3)), "pid: must be an integer in 1..4194304, got -3");
  EXPECT_EQ(refusal(with("address", "::1")),
            "address: is not a key of the xdp hook (its keys: ifname, port, ports, protocol, cpus, pid, cgroup)");
}

TEST(XdpRequest, OnePortOfAnInterfaceOnePolicy) {
  const HookSpec* s = find_hook("xdp");
  ASSERT_TRUE(s && s->check && s->same_target);
  Bad bad;
  json a, b;
  ASSERT_TRUE(s->check({{"ifname", "lo"}, {"ports", {1, 2}}}, bad, &a));
  ASSERT_TRUE(s->check({{"ifname", "lo"}, {"port", 2}}, bad, &b));
  EXPECT_EQ(s->same_target(a, b, ""), "xdp udp port 2 on lo");
  ASSERT_TRUE(s->check({{"ifname", "lo"}, {"port", 2}, {"protocol", "tcp"}}, bad, &b));
  EXPECT_EQ(s->same_target(a, b, ""), "");
}

}  // namespace
}  // namespace syrup::xdp
