// A deploy as a transaction: its steps and the undo of what each one did.
//
// Design: a deploy runs five steps in order -- compile, load and pin, install (executors
// and attach, atomically over a replaced policy), register, retire the replaced policy.
// Each change a step makes to the kernel, bpffs or syrupd's registry pushes its undo onto
// the transaction's stack as soon as the change is made (not when the step ends), so a
// failure anywhere -- in the middle of a hook's install too -- unwinds exactly what was
// done, newest first. One mechanism serves every hook: a Target's install pushes its own
// undo steps (hook.h).
// Invariants:
//  - until commit(), every change made under the transaction has its undo on the stack;
//    the stack is unwound in reverse order by rollback(), or by the destructor if the
//    deploy returned without committing: a failed deploy leaves the kernel and bpffs as
//    they were, and the policy already deployed on the target keeps running;
//  - an undo runs at most once, and is destroyed once run (what it captured -- socket
//    descriptors, a hook's root -- is released with it);
//  - the last step, retire, is irreversible (it unpins the replaced policy): whatever can
//    fail is done before it, so a deploy that reaches retire completes.
// Parking (docs/protocol.md, "Connection model"): a deploy parked for its compile or its
// load ends its run with hand_over(): what it did stays for the parked deploy, which runs
// again from the start with a new transaction.
//
// Fault injection (test builds only, CMake option SYRUP_FAULT_INJECTION, off by default):
// syrupd started with SYRUP_FAULT_STEP=<step>:<policy name>[,...] in its environment fails that
// step of every deploy of a policy of that name with EIO, after the step's own changes
// (so their undo runs) -- for retire, before it. Built without the option, fault() never
// fails and the variable is ignored.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

namespace syrup {

class DeployTxn {
 public:
  enum class Step { kCompile, kLoad, kInstall, kRegister, kRetire };
  static const char* step_name(Step s);

  // `policy`: the deploy's policy name, which fault injection matches.
  explicit DeployTxn(std::string policy = {}) : policy_(std::move(policy)) {}
  ~DeployTxn() { rollback(); }
  DeployTxn(const DeployTxn&) = delete;
  DeployTxn& operator=(const DeployTxn&) = delete;

  // Pushes the undo of a change just made; `what` names it for the log.
  void on_undo(std::string what, std::function<void()> undo);
  // The deploy succeeded: the undo steps are dropped, not run.
  void commit() { undo_.clear(); }
  // The deploy parked: what it did belongs to the parked deploy (same as commit, named
  // for the reader).
  void hand_over() { undo_.clear(); }
  // Runs the undo steps, newest first; the names of those it ran, oldest last.
  std::vector<std::string> rollback();
  size_t pending() const { return undo_.size(); }

  // The fault point of step `s`: 0, or (test builds, when SYRUP_FAULT_STEP names this
  // step and policy) -EIO with `err` saying so.
  int fault(Step s, std::string& err) const;
  // Test builds: reads SYRUP_FAULT_STEP (done once by the daemon at start; "" clears it).
  // 0, or -EINVAL with `err` when it names no step. Other builds: 0, nothing set.
  static int set_fault(const std::string& spec, std::string& err);
  static bool fault_injection_built();

 private:
  struct Undo {
    std::string what;
    std::function<void()> fn;
  };
  std::string policy_;
  std::vector<Undo> undo_;
};

}  // namespace syrup
