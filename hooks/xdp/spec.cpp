// The XDP hook's spec (hooks/registry.h): packet -> core or AF_XDP socket.
#include "registry.h"

namespace syrup {

extern const HookSpec xdp_spec = {
    .id = "xdp",
    .name = "xdp",
    .abi_id = 2,  // SYR_HOOK_XDP
    .summary = "packet -> core or AF_XDP socket",
    .keys = {"ifname", "port", "ports", "protocol", "cpus", "process", "pid", "pidfile"},
    .needs_process = false,
    .persist_refusal = "",
    .usage = "syrupctl deploy --hook xdp --ifname IF --port PORT [--cpus C,...] [--pid PID [--persist]]\n"
             "                  [--app NAME] [--params K=V,...] POLICY.c",
};

}  // namespace syrup
