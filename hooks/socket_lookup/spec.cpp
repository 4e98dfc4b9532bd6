// The socket-lookup hook's spec (hooks/registry.h): new TCP connection or UDP datagram
// for a port range -> a listening or bound socket of the application, of any port.
#include "registry.h"

namespace syrup {

extern const HookSpec socket_lookup_spec = {
    .id = "socket_lookup",
    .name = "socket-lookup",
    .abi_id = 4,  // SYR_HOOK_SOCKET_LOOKUP
    .summary = "new connection or datagram for a port range -> socket of the application, any port",
    // port_end (the last port of a range) is taken from the protocol, libsyrup and
    // syrupctl; the config file claims one port per policy.
    .keys = {"process", "pid", "pidfile", "port", "protocol", "address"},
    .needs_process = true,
    .persist_refusal =
        "a socket-lookup policy's executors are the process's sockets, which leave its SOCKMAP when they "
        "close: a persisting one would steer nothing and keep its ports from the new server's deploy",
    .usage = "syrupctl deploy --hook socket-lookup --pid PID --protocol tcp|udp --port LO [--port_end HI]\n"
             "                  [--address ADDR] [--app NAME] [--params K=V,...] POLICY.c",
};

}  // namespace syrup
