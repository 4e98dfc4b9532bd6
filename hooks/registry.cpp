// The spec side of the hook registry (registry.h): linked by everything that needs to
// know the hooks, including syrupctl.
#include "registry.h"

namespace syrup {

#define SYRUP_HOOK(id) extern const HookSpec id##_spec;
#include "hooks.def"
#undef SYRUP_HOOK

const std::vector<const HookSpec*>& hook_specs() {
  static const std::vector<const HookSpec*> specs = {
#define SYRUP_HOOK(id) &id##_spec,
#include "hooks.def"
#undef SYRUP_HOOK
  };
  return specs;
}

const HookSpec* find_hook(std::string_view name) {
  for (const HookSpec* s : hook_specs())
    if (name == s->name) return s;
  return nullptr;
}

const HookSpec* find_hook(int abi_id) {
  for (const HookSpec* s : hook_specs())
    if (abi_id == s->abi_id) return s;
  return nullptr;
}

std::string hook_names(std::string_view sep) {
  std::string out;
  for (const HookSpec* s : hook_specs()) out += (out.empty() ? "" : std::string(sep)) + s->name;
  return out;
}

}  // namespace syrup
