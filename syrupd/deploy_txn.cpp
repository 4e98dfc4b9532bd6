// DeployTxn (deploy_txn.h): the undo stack, and the fault points of test builds, whose
// setting is read once at start on the main thread and never changes after.
#include "deploy_txn.h"

#include <algorithm>
#include <cerrno>

namespace syrup {

namespace {
constexpr DeployTxn::Step kSteps[] = {DeployTxn::Step::kCompile, DeployTxn::Step::kLoad, DeployTxn::Step::kInstall,
                                      DeployTxn::Step::kRegister, DeployTxn::Step::kRetire};
#ifdef SYRUP_FAULT_INJECTION
// Set once at start, before any worker runs; read on the main thread only.
struct Fault {
  DeployTxn::Step step{};
  std::string policy;
};
std::vector<Fault> g_faults;
#endif
}  // namespace

const char* DeployTxn::step_name(Step s) {
  switch (s) {
    case Step::kCompile: return "compile";
    case Step::kLoad: return "load";
    case Step::kInstall: return "install";
    case Step::kRegister: return "register";
    case Step::kRetire: return "retire";
  }
  return "?";
}

void DeployTxn::on_undo(std::string what, std::function<void()> undo) {
  undo_.push_back({std::move(what), std::move(undo)});
}

std::vector<std::string> DeployTxn::rollback() {
  std::vector<std::string> ran;
  while (!undo_.empty()) {
    // Taken off before it runs: an undo that pushes or throws cannot run twice.
    Undo u = std::move(undo_.back());
    undo_.pop_back();
    u.fn();
    ran.push_back(std::move(u.what));
  }
  return ran;
}

bool DeployTxn::fault_injection_built() {
#ifdef SYRUP_FAULT_INJECTION
  return true;
#else
  return false;
#endif
}

int DeployTxn::set_fault(const std::string& spec, std::string& err) {
#ifdef SYRUP_FAULT_INJECTION
  g_faults.clear();
  for (size_t at = 0; at < spec.size();) {
    size_t end = std::min(spec.find(',', at), spec.size());
    std::string one = spec.substr(at, end - at);
    at = end + 1;
    auto colon = one.find(':');
    bool found = false;
    for (Step s : kSteps)
      if (colon != std::string::npos && colon + 1 < one.size() && one.substr(0, colon) == step_name(s)) {
        g_faults.push_back({s, one.substr(colon + 1)});
        found = true;
      }
    if (found) continue;
    g_faults.clear();
    err = "SYRUP_FAULT_STEP must be <step>:<policy name>[,...] with step one of compile, load, install, register, "
          "retire; got '" + one + "'";
    return -EINVAL;
  }
  return 0;
#else
  (void)spec, (void)err;
  (void)kSteps;
  return 0;
#endif
}

int DeployTxn::fault(Step s, std::string& err) const {
#ifdef SYRUP_FAULT_INJECTION
  for (const Fault& f : g_faults) {
    if (f.step != s || f.policy != policy_) continue;
    err = std::string("injected fault at the ") + step_name(s) + " step of policy " + policy_ + " (SYRUP_FAULT_STEP)";
    return -EIO;
  }
#else
  (void)s, (void)err;
#endif
  return 0;
}

}  // namespace syrup
