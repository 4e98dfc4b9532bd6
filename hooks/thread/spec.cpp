// The thread hook's spec (hooks/registry.h): thread -> core.
#include "registry.h"
#include "thread/request.h"

namespace syrup {
namespace {

// A process's threads take one policy.
std::string same_target(const nlohmann::json&, const nlohmann::json&, const std::string& process) {
  return "the threads of " + process;
}

}  // namespace

extern const HookSpec thread_spec = {
    .id = "thread",
    .name = "thread",
    .abi_id = 3,  // SYR_HOOK_THREAD
    .summary = "thread -> core",
    .keys = {"process", "pid", "pidfile", "cgroup"},
    .needs_process = true,
    .persist_refusal = "a persisting thread policy would hold on to the exited process's threads",
    .usage = "syrupctl deploy --hook thread --pid PID|--cgroup PATH [--app NAME] [--params K=V,...] POLICY.c",
    .check = request::check<thread::ThreadRequest, thread::parse, thread::to_json>,
    .same_target = same_target,
};

}  // namespace syrup
