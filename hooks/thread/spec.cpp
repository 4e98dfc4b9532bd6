// The thread hook's spec (hooks/registry.h): thread -> core.
#include "registry.h"

namespace syrup {

extern const HookSpec thread_spec = {
    .id = "thread",
    .name = "thread",
    .abi_id = 3,  // SYR_HOOK_THREAD
    .summary = "thread -> core",
    .keys = {"process", "pid", "pidfile"},
    .needs_process = true,
    .persist_refusal = "a persisting thread policy would hold on to the exited process's threads",
    .usage = "syrupctl deploy --hook thread --pid PID [--app NAME] [--params K=V,...] POLICY.c",
};

}  // namespace syrup
