// The socket-lookup hook's spec (hooks/registry.h): new TCP connection or UDP datagram
// for a port range -> a listening or bound socket of the application, of any port.
#include "registry.h"
#include "socket_lookup/request.h"

namespace syrup {
namespace {

// Claims are exclusive per protocol and port: two entries meet where their ranges do.
std::string same_target(const nlohmann::json& a, const nlohmann::json& b, const std::string& process) {
  (void)process;
  if (a.value("protocol", std::string()) != b.value("protocol", std::string())) return {};
  int alo = a.value("port", 0), ahi = a.value("port_end", alo), blo = b.value("port", 0), bhi = b.value("port_end", blo);
  if (ahi < blo || bhi < alo) return {};
  return "socket-lookup " + a.value("protocol", std::string()) + " port " + std::to_string(std::max(alo, blo));
}

}  // namespace

extern const HookSpec socket_lookup_spec = {
    .id = "socket_lookup",
    .name = "socket-lookup",
    .abi_id = 4,  // SYR_HOOK_SOCKET_LOOKUP
    .summary = "new connection or datagram for a port range -> socket of the application, any port",
    .keys = {"process", "pid", "pidfile", "cgroup", "port", "port_end", "protocol", "address"},
    .needs_process = true,
    .persist_refusal =
        "a socket-lookup policy's executors are the process's sockets, which leave its SOCKMAP when they "
        "close: a persisting one would steer nothing and keep its ports from the new server's deploy",
    .usage = "syrupctl deploy --hook socket-lookup --pid PID|--cgroup PATH --protocol tcp|udp --port LO [--port_end HI]\n"
             "                  [--address ADDR] [--app NAME] [--params K=V,...] POLICY.c",
    .check = request::check<socket_lookup::SocketLookupRequest, socket_lookup::parse, socket_lookup::to_json>,
    .same_target = same_target,
};

}  // namespace syrup
