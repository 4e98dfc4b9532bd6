// The implementation side of the hook registry (registry.h): syrupd's hooks, made from
// hooks.def's list. Linked by syrupd only.
#include "hook.h"
#include "registry.h"

namespace syrup {

#define SYRUP_HOOK(id) std::unique_ptr<Hook> make_##id##_hook(const HookContext& ctx);
#include "hooks.def"
#undef SYRUP_HOOK

std::vector<std::unique_ptr<Hook>> make_hooks(const HookContext& ctx) {
  std::vector<std::unique_ptr<Hook>> hooks;
#define SYRUP_HOOK(id) hooks.push_back(make_##id##_hook(ctx));
#include "hooks.def"
#undef SYRUP_HOOK
  return hooks;
}

}  // namespace syrup
