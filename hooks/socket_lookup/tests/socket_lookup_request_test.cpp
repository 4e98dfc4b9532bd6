// socket-lookup's parse() (hooks/socket_lookup/request.h), key by key: missing, wrong
// type, out of range, unknown. Pure logic: the same function syrupd, the config loader
// and syrupctl call.
#include <gtest/gtest.h>
#include <netinet/in.h>

#include "registry.h"
#include "socket_lookup/request.h"

namespace syrup::socket_lookup {
namespace {

using nlohmann::json;

// parse()'s refusal as "key: why", or "" if it took the fields.
std::string refusal(const json& f) {
  SocketLookupRequest r;
  Bad bad;
  return parse(f, r, bad) ? "" : bad.str();
}

TEST(SocketLookupRequest, TakesARangeAndCanonicalisesTheAddress) {
  SocketLookupRequest r;
  Bad bad;
  ASSERT_TRUE(parse({{"pid", 42}, {"protocol", "tcp"}, {"port", 7000}, {"port_end", 7099}, {"address", "0:0::1"}}, r,
                    bad))
      << bad.str();
  EXPECT_EQ(r.pid, 42);
  EXPECT_EQ(r.protocol, IPPROTO_TCP);
  EXPECT_EQ(r.port, 7000);
  EXPECT_EQ(r.port_end, 7099);
  EXPECT_EQ(r.address, "::1");
  EXPECT_EQ(to_json(r), json({{"protocol", "tcp"}, {"port", 7000}, {"port_end", 7099}, {"address", "::1"}}));
  // One port: port_end defaults to it and is not spelled out.
  ASSERT_TRUE(parse({{"protocol", "udp"}, {"port", 53}}, r, bad)) << bad.str();
  EXPECT_EQ(r.port_end, 53);
  EXPECT_EQ(to_json(r), json({{"protocol", "udp"}, {"port", 53}}));
}

TEST(SocketLookupRequest, ProtocolAndPortAreRequiredAndChecked) {
  EXPECT_EQ(refusal({{"port", 80}}), "protocol: required key is missing (tcp or udp)");
  EXPECT_EQ(refusal({{"protocol", "sctp"}, {"port", 80}}).substr(0, 10), "protocol: ");
  EXPECT_EQ(refusal({{"protocol", "tcp"}}), "port: required key is missing (the first port steered)");
  EXPECT_EQ(refusal({{"protocol", "tcp"}, {"port", 0}}), "port: must be an integer in 1..65535, got 0");
  EXPECT_EQ(refusal({{"protocol", "tcp"}, {"port", "80"}}), "port: must be an integer in 1..65535, got \"80\"");
}

TEST(SocketLookupRequest, PortEndIsAtLeastPortAndAtMost65535) {
  EXPECT_EQ(refusal({{"protocol", "tcp"}, {"port", 8000}, {"port_end", 7999}}),
            "port_end: must be an integer in 8000..65535, got 7999");
  EXPECT_EQ(refusal({{"protocol", "tcp"}, {"port", 8000}, {"port_end", 70000}}),
            "port_end: must be an integer in 8000..65535, got 70000");
}

TEST(SocketLookupRequest, AddressAndUnknownKeys) {
  EXPECT_EQ(refusal({{"protocol", "tcp"}, {"port", 80}, {"address", "localhost"}}),
            "address: must be an IPv4 or IPv6 address: the local address steered (e.g. 127.0.0.1, ::1), got "
            "\"localhost\"");
  EXPECT_NE(refusal({{"protocol", "tcp"}, {"port", 80}, {"ifname", "lo"}}).find("ifname: "), std::string::npos);
}

// The spec's check is the same parse, and its same_target sees overlapping ranges.
TEST(SocketLookupRequest, SpecChecksAndFindsOverlaps) {
  const HookSpec* s = find_hook("socket-lookup");
  ASSERT_NE(s, nullptr);
  Bad bad;
  EXPECT_FALSE(s->check({{"protocol", "tcp"}}, bad, nullptr));
  EXPECT_EQ(bad.key, "port");
  json a = {{"protocol", "tcp"}, {"port", 7000}, {"port_end", 7010}}, b = {{"protocol", "tcp"}, {"port", 7010}},
       c = {{"protocol", "udp"}, {"port", 7005}}, d = {{"protocol", "tcp"}, {"port", 7011}};
  EXPECT_EQ(s->same_target(a, b, "p"), "socket-lookup tcp port 7010");
  EXPECT_EQ(s->same_target(a, c, "p"), "");
  EXPECT_EQ(s->same_target(a, d, "p"), "");
}

}  // namespace
}  // namespace syrup::socket_lookup
