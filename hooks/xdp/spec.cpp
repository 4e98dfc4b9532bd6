// The XDP hook's spec (hooks/registry.h): packet -> core or AF_XDP socket.
#include "registry.h"
#include "xdp/request.h"

namespace syrup {
namespace {

// A port of a protocol on an interface takes one policy, whichever process asks.
std::string same_target(const nlohmann::json& a, const nlohmann::json& b, const std::string&) {
  if (a.value("ifname", "") != b.value("ifname", "") || a.value("protocol", "") != b.value("protocol", ""))
    return {};
  for (auto& p : a.value("ports", nlohmann::json::array()))
    for (auto& q : b.value("ports", nlohmann::json::array()))
      if (p == q) return "xdp " + a.value("protocol", "") + " port " + p.dump() + " on " + a.value("ifname", "");
  return {};
}

}  // namespace

extern const HookSpec xdp_spec = {
    .id = "xdp",
    .name = "xdp",
    .abi_id = 2,  // SYR_HOOK_XDP
    .summary = "packet -> core or AF_XDP socket",
    .keys = {"ifname", "port", "ports", "protocol", "cpus", "process", "pid", "pidfile", "cgroup"},
    .needs_process = false,
    .persist_refusal = "",
    .usage = "syrupctl deploy --hook xdp --ifname IF --port PORT [--cpus C,...] [--pid PID [--persist]]\n"
             "                  [--cgroup PATH: its processes' ports, or those of --port]\n"
             "                  [--app NAME] [--params K=V,...] POLICY.c",
    .check = request::check<xdp::XdpRequest, xdp::parse, xdp::to_json>,
    .same_target = same_target,
};

}  // namespace syrup
