// The thread hook's sched_ext backend (user side), ThreadScxHook: syrupd owns ONE
// partial-mode sched_ext scheduler, the root (kernel/hooks/thread/scx_root.bpf.c), shared
// by every application with a thread policy. In scx_hook.cpp: ScxBackend (the root, its
// slots and its monitor), ScxTarget (one process's slot) and the hook.
//
// Design:
//  - The root is compiled (by syrupd's compiler, cached like any object), loaded and
//    attached at the first thread deploy, and detached when the last thread policy goes.
//  - A target is one process. It gets a slot; its policy is compiled with
//    scx_wrapper.bpf.h into three programs (select_cpu, enqueue, dispatch) that share the
//    root's maps and sit in the root's prog arrays (syr_scx_sel, syr_scx_enq, syr_scx_disp)
//    at that slot; syr_scx_procs maps the process to the slot. Deploy, replace (same slot:
//    three prog-array updates) and remove never
//    detach the scheduler, so the other applications keep being scheduled.
//  - A target by cgroup (thread_hook.h) is the cgroup: syr_scx_cgroups maps its id to the
//    slot and the owner's uid, and the root takes a SCHED_EXT thread of no mapped process
//    into the slot of its cgroup if it is that uid's (syr_scx_slot_of, at every event). The
//    monitor registers and switches the threads of that uid's processes in the cgroup
//    (cgroup.threads) and restores those that left it; gone() reports the cgroup removed.
//  - A monitor thread (every kSyncMs): switches the registered threads of each scheduled
//    process to SCHED_EXT (and unregistered ones back to their baseline class), registers
//    new threads of --pid processes, and watches the root's exit record. A registered
//    thread that exits loses its entry in the kernel, at the exit (the root's
//    sched_process_exit program, syr_scx_threads: slot -> syrup_threads), so a new thread
//    given its tid before the next scan inherits nothing; and the monitor asks a thread's
//    class instead of trusting it switched that tid before. When the kernel
//    ejects the scheduler (watchdog stall, runtime error, sysrq), it blames a slot when it
//    can (the stalled thread's process; for a runtime error, the application whose
//    program is in the kernel's backtrace of the error, else the program last run on the
//    core that raised it), takes that policy out (its threads back to the fair class,
//    `list` status "ejected by the kernel: REASON: MESSAGE"), and re-attaches the root
//    for the others (status says they were restored, and why). More than kMaxEjections in
//    a minute: it gives up and restores every thread.
// Tunables (environment of syrupd): SYRUP_SCX_TIMEOUT_MS (the kernel's watchdog,
// default 30000), SYRUP_SCX_STARVE_MS (a queued thread waiting longer runs next whatever
// its key, so one application's policy cannot stall the scheduler of all; default 1000,
// 0 disables).
// Invariants: a slot is in syr_scx_procs exactly while its programs (and its
// syrup_threads, in syr_scx_threads) are in the root's arrays and its bit is in the
// root's active mask; the exit tracepoint is attached whenever the scheduler is; after uninstall() or an ejection no
// thread of the process is left SCHED_EXT by Syrup.
// Across a syrupd restart: the root's struct_ops link, exit tracepoint link and maps are pinned under
// <root>/thread_scx/ while attached, so a syrupd that dies (or exits with
// --on_exit=keep) leaves the scheduler attached and every application's policy running
// (its slot's programs are held by the pinned prog arrays). What stops until the next
// syrupd: the monitor (new threads of --pid processes are not switched to SCHED_EXT, an
// ejection is not reported nor repaired). A restarted syrupd adopts the root from the
// pins (ThreadScxHook::adopt, from each policy's saved slot); if the kernel ejected it
// meanwhile, adoption fails, the policies are released and their threads switched back
// to SCHED_OTHER (ThreadScxHook::release_leftover). --on_exit=remove detaches and unpins everything.
// Limits: 64 applications (slots): the root's active mask is one u64 and one dispatch
// round marks the slots it tried in another (syr_scx_round.tried); more would take
// per-round bitmaps in arrays. One dispatch round tries at most ~16 applications that
// have nothing for the core (two tail calls each, 33 at most: the kernel's tail-call
// limit), then leaves the core to its current thread.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "compiler.h"
#include "thread_hook.h"

namespace syrup::thread {

class ScxBackend;

// What a thread policy and the sched_ext wrapper (scx_wrapper.bpf.h) may call and
// declare: the common helpers, those the wrapper needs (the current task's ids, the tail
// call back into the root), and the sched_ext kernel functions the wrapper declares
// (scx_common.h), by BTF name; nothing else of the kernel.
Allowlist scx_allowlist();

class ThreadScxHook : public ThreadHookBase {
 public:
  // The root is compiled with `compiler` at the first deploy (none while refused()).
  explicit ThreadScxHook(Compiler& compiler);
  ~ThreadScxHook() override;
  const char* backend() const override { return "sched_ext"; }
  const char* wrapper() const override { return "thread/scx_wrapper.bpf.h"; }
  // sched_ext's struct_ops are verified with CAP_PERFMON: the policy is verified first as
  // the agent's BPF_PROG_TYPE_SYSCALL program, with CAP_BPF alone.
  const char* verify_wrapper() const override { return "thread/agent_wrapper.bpf.h"; }
  std::vector<std::string> system_maps() const override;
  Allowlist allowlist() const override { return scx_allowlist(); }
  // Also switches the threads of a policy that was not adopted back to the fair class.
  void release_leftover(std::string_view app, const std::string& policy_dir) override;
  // Once after the adoptions: clears what no adopted policy owns.
  void recover() override;
  // syrupd exits keeping its policies: the scheduler stays attached (pinned).
  void shutdown() override;

 protected:
  // Loads and checks the root first.
  int make_process_target(ProcessThreads rq, std::unique_ptr<Target>& out, std::string& err) override;
  // Takes over the slot in the pinned root scheduler.
  int adopt_target(const nlohmann::json& saved, LoadedPolicy& p, std::unique_ptr<Target>& out,
                   std::string& err) override;

 private:
  std::shared_ptr<ScxBackend> scx_;  // shared with its targets; null while refused()
};

}  // namespace syrup::thread
