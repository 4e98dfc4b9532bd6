// The hook registry: the one place that knows which hooks exist (hooks/hooks.def).
//
// A hook is a self-describing unit in two folders. Its *spec* (hooks/<id>/spec.cpp) is
// light, plain data and pure functions: its name on the wire, in YAML and on syrupctl's
// command line, the libsyrup enum value, the request keys its targets take, whether it
// needs a process, why its policies cannot outlive their process, and its help text.
// The config loader, syrupctl, the fuzzers and the docs read specs and link no kernel
// code. Its *implementation* (the rest of hooks/<id>/, a `Hook` of syrupd/hook.h made by
// make_<id>_hook()) is linked by syrupd alone.
//
// Invariants: names and abi ids are unique (checked by a unit test); the order of
// hooks.def is the order hooks are listed in help and errors; a hook not built into this
// syrupd does not exist (there is no "known but unavailable" hook).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace syrup {

struct HookSpec {
  const char* id;       // its folders' name: socket_select
  const char* name;     // on the wire, in YAML, syrupctl --hook: socket-select
  int abi_id;           // enum syr_hook in <syrup/syrup.h>
  const char* summary;  // one line: input -> executor
  // The request keys (protocol fields, YAML keys) of this hook's targets, beside the keys
  // every deploy takes (name, hook, policy, params, persist).
  std::vector<std::string> keys;
  // Whether a target names the process it schedules (process, pid or pidfile).
  bool needs_process = false;
  // Why a policy at this hook cannot outlive its process (persist: true refused); empty:
  // it can, and persists by default when deployed from --config.
  const char* persist_refusal = "";
  // syrupctl's usage line for a deploy at this hook.
  const char* usage = "";
};

// Every hook of this build, in hooks.def's order.
const std::vector<const HookSpec*>& hook_specs();
// The spec of the hook called `name`, or of abi id `abi_id`; null if there is none.
const HookSpec* find_hook(std::string_view name);
const HookSpec* find_hook(int abi_id);
// "socket-select, xdp, thread": for help text and errors.
std::string hook_names(std::string_view sep = ", ");

class Hook;
class Compiler;
// What a hook's implementation may use from syrupd when it is made.
struct HookContext {
  Compiler& compiler;             // for hook-wide programs it compiles (root programs)
  const std::vector<int>& agent_cpus;  // --agent_cpus (thread hook)
};
// syrupd's hooks, one per spec, in hooks.def's order (linked by syrupd only).
std::vector<std::unique_ptr<Hook>> make_hooks(const HookContext& ctx);

}  // namespace syrup
