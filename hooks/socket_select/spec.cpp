// The socket-select hook's spec (hooks/registry.h): datagram or connection -> socket of
// an SO_REUSEPORT group.
#include "registry.h"

namespace syrup {

extern const HookSpec socket_select_spec = {
    .id = "socket_select",
    .name = "socket-select",
    .abi_id = 1,  // SYR_HOOK_SOCKET_SELECT
    .summary = "datagram or connection -> socket of an SO_REUSEPORT group",
    .keys = {"process", "pid", "pidfile", "port", "protocol", "address"},
    .needs_process = true,
    .persist_refusal =
        "a socket-select policy's executors are the process's sockets, which close with it: a persisting "
        "one would schedule nothing, and a new server's sockets form a new group that needs a deploy of its own",
    .usage = "syrupctl deploy --hook socket-select --pid PID --port PORT [--protocol udp|tcp]\n"
             "                  [--address ADDR] [--app NAME] [--params K=V,...] POLICY.c",
};

}  // namespace syrup
