// The socket-select hook's spec (hooks/registry.h): datagram or connection -> socket of
// an SO_REUSEPORT group.
#include "registry.h"
#include "socket_select/request.h"

namespace syrup {
namespace {

// One group per process, port, protocol and address; an unnamed protocol or address may
// be either, so it meets every one.
std::string same_target(const nlohmann::json& a, const nlohmann::json& b, const std::string& process) {
  if (a.value("port", 0) != b.value("port", 0)) return {};
  for (const char* k : {"protocol", "address"}) {
    std::string x = a.value(k, std::string()), y = b.value(k, std::string());
    if (!x.empty() && !y.empty() && x != y) return {};
  }
  return "the socket group of " + process + " on port " + std::to_string(a.value("port", 0));
}

}  // namespace

extern const HookSpec socket_select_spec = {
    .id = "socket_select",
    .name = "socket-select",
    .abi_id = 1,  // SYR_HOOK_SOCKET_SELECT
    .summary = "datagram or connection -> socket of an SO_REUSEPORT group",
    .keys = {"process", "pid", "pidfile", "cgroup", "port", "protocol", "address"},
    .needs_process = true,
    .persist_refusal =
        "a socket-select policy's executors are the process's sockets, which close with it: a persisting "
        "one would schedule nothing, and a new server's sockets form a new group that needs a deploy of its own",
    .usage = "syrupctl deploy --hook socket-select --pid PID|--cgroup PATH --port PORT [--protocol udp|tcp]\n"
             "                  [--address ADDR] [--app NAME] [--params K=V,...] POLICY.c",
    .check = request::check<socket_select::SocketSelectRequest, socket_select::parse, socket_select::to_json>,
    .same_target = same_target,
};

}  // namespace syrup
