// The `cgroup` field every hook's parse() takes (request::cgroup, hooks/hook_request.h):
// what a path may be before syrupd opens anything, and how each hook takes it.
#include <gtest/gtest.h>

#include "registry.h"
#include "socket_lookup/request.h"
#include "socket_select/request.h"
#include "thread/request.h"
#include "xdp/request.h"

namespace syrup {
namespace {

using nlohmann::json;

// What hook `name`'s check says of `fields` ("" if it takes them), and its canonical fields.
std::string refusal(const char* name, const json& fields, json* canonical = nullptr) {
  const HookSpec* s = find_hook(name);
  Bad bad;
  return s->check(fields, bad, canonical) ? "" : bad.str();
}

TEST(CgroupRequest, EveryHookTakesACgroupInsteadOfAPid) {
  json c;
  EXPECT_EQ(refusal("socket-select", {{"cgroup", "/system.slice/nginx.service"}, {"port", 80}}, &c), "");
  EXPECT_EQ(c, json({{"cgroup", "/system.slice/nginx.service"}, {"port", 80}}));
  EXPECT_EQ(refusal("socket-lookup", {{"cgroup", "/a"}, {"protocol", "tcp"}, {"port", 80}}, &c), "");
  EXPECT_EQ(c["cgroup"], "/a");
  EXPECT_EQ(refusal("thread", {{"cgroup", "/kubepods.slice/kubepods-pod1_2.slice/cri-containerd-ab12.scope"}}, &c), "");
  EXPECT_EQ(c, json({{"cgroup", "/kubepods.slice/kubepods-pod1_2.slice/cri-containerd-ab12.scope"}}));
  // xdp: the cgroup's processes give the ports when none are named.
  EXPECT_EQ(refusal("xdp", {{"ifname", "eth0"}, {"cgroup", "/user.slice/user-1000.slice/user@1000.service"}}, &c), "");
  EXPECT_FALSE(c.contains("ports"));
  EXPECT_EQ(c["cgroup"], "/user.slice/user-1000.slice/user@1000.service");
  EXPECT_EQ(refusal("xdp", {{"ifname", "eth0"}}),
            "ports: the xdp hook needs the ports it schedules: port or ports (or a cgroup: its processes' ports)");
  // socket-select still needs the port, and may choose the address among the cgroup's groups.
  EXPECT_EQ(refusal("socket-select", {{"cgroup", "/a"}}), "port: required key is missing");
  EXPECT_EQ(refusal("socket-select", {{"cgroup", "/a"}, {"port", 80}, {"address", "::"}}), "");
}

TEST(CgroupRequest, OneTargetNamedOneWay) {
  const std::string both = "cgroup: give either a process (pid) or a cgroup, not both";
  EXPECT_EQ(refusal("thread", {{"cgroup", "/a"}, {"pid", 7}}), both);
  EXPECT_EQ(refusal("socket-select", {{"cgroup", "/a"}, {"pid", 7}, {"port", 80}}), both);
  EXPECT_EQ(refusal("socket-lookup", {{"cgroup", "/a"}, {"pid", 7}, {"protocol", "udp"}, {"port", 80}}), both);
  EXPECT_EQ(refusal("xdp", {{"ifname", "eth0"}, {"port", 80}, {"cgroup", "/a"}, {"pid", 7}}), both);
}

TEST(CgroupRequest, OnlyAPathBelowTheRootOfAllowedNames) {
  const std::string accepts = "cgroup: must be a cgroup v2 path as /proc/PID/cgroup's 0:: line prints it "
                              "(e.g. /system.slice/nginx.service): '/' then names of letters, digits and . _ @ : + = , -";
  auto r = [](const json& v) { return refusal("thread", {{"cgroup", v}}); };
  EXPECT_EQ(r("/"), accepts + ", below the root, got \"/\"");
  EXPECT_EQ(r("a/b"), accepts + ", below the root, got \"a/b\"");
  EXPECT_EQ(r(""), accepts + ", below the root, got \"\"");
  EXPECT_EQ(r("/a/../b"), accepts + " (no empty, '.' or '..' name), got \"/a/../b\"");
  EXPECT_EQ(r("/.."), accepts + " (no empty, '.' or '..' name), got \"/..\"");
  EXPECT_EQ(r("/a/./b"), accepts + " (no empty, '.' or '..' name), got \"/a/./b\"");
  EXPECT_EQ(r("/a//b"), accepts + " (no empty, '.' or '..' name), got \"/a//b\"");
  EXPECT_EQ(r("/a/"), accepts + " (no empty, '.' or '..' name), got \"/a/\"");
  EXPECT_EQ(r("/a b"), accepts + ", got \"/a b\"");
  EXPECT_EQ(r("/a\\b"), accepts + ", got \"/a\\\\b\"");
  EXPECT_EQ(r(std::string("/a\0b", 4)), accepts + ", got \"/a\\u0000b\"");
  EXPECT_EQ(r("/a\nb"), accepts + ", got \"/a\\nb\"");
  EXPECT_EQ(r("/caf\xc3\xa9"), accepts + ", got \"/caf\\u00e9\"");
  EXPECT_EQ(r(7), accepts + ", got 7");
  EXPECT_EQ(r(json::array({"/a"})), accepts + ", got [\"/a\"]");
  EXPECT_EQ(r("/" + std::string(request::kMaxCgroupPath, 'a')).substr(0, 40),
            "cgroup: is longer than 1024 bytes, got \"");
  EXPECT_EQ(r("/" + std::string(request::kMaxCgroupPath - 1, 'a')), "");
  EXPECT_EQ(r("/a.b_c@d:e+f=g,h-i/J9"), "");
}

}  // namespace
}  // namespace syrup
