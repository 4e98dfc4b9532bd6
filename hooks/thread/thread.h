// The thread hook backend (user side): schedules an application's threads with its
// thread policy (kernel/include/syrup/policy.h, SYR_HOOK_THREAD).
//
// Two backends, one policy source. With sched_ext in the kernel (CONFIG_SCHED_CLASS_EXT,
// /sys/kernel/sched_ext present) the policy runs inside syrupd's one partial-mode
// sched_ext root scheduler, shared by all applications (thread_scx.h); without it -- as
// on this project's CI hosts -- it runs in a per-process user-space agent
// (thread_agent.h). syrupd picks at start and logs which, with why;
// SYRUP_THREAD_BACKEND=agent|sched_ext in syrupd's environment forces one.
//
// Agent backend design: the target is one process (the deploying process, whose threads
// opt in with syr_thread_register(), or --pid PID, every thread of it registered in
// ascending tid order, new ones as they appear). install() starts `syrup-agent` (in its
// own session) and waits until it is attached; a watchdog thread per target watches the
// agent's pidfd and its heartbeat pipe: if the agent exits or misses its heartbeat for
// kHangMs, syrupd kills it and puts every registered thread back to the process's
// baseline (SCHED_OTHER, its nice, its affinity) itself, and reports the reason in
// `list` (status). A replacement policy's agent takes over from the old one without a
// restore in between (the old agent exits on SIGUSR1 leaving the threads as they are).
// Across a syrupd restart: the agent outlives syrupd (no parent-death signal, own
// session) and keeps the heartbeat pipe's read end open; Target::save() records the
// agent and the process (pid + start time) and the baseline. A restarted syrupd adopts
// the agent (pidfd, heartbeat read end via pidfd_getfd; the watchdog resumes) or, if it
// ended meanwhile, restores the threads and says so in `list`. While no syrupd runs,
// nobody watches the agent: if it dies then, its threads stay as it left them until
// syrupd is back. --on_exit=remove stops every agent (threads restored) as before.
// Invariants: at most one agent per process; after uninstall() or an agent failure no
// registered thread is left SCHED_IDLE or pinned by Syrup.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "compiler.h"
#include "hook.h"
#include "syrup/abi.h"

namespace syrup::thread {

enum class Backend { kAgent, kSchedExt };

// Which backend this kernel gets, and why (for the log and `list`).
Backend detect_backend(std::string& why);

class ScxBackend;

// What a thread policy and the agent wrapper (thread_agent.bpf.h, a
// BPF_PROG_TYPE_SYSCALL program run by the agent) may call and declare: the common
// helpers only. No kernel functions, none of the syscall program type's own helpers
// (bpf_sys_bpf, bpf_sys_close, bpf_kallsyms_lookup_name, bpf_btf_find_by_name_kind),
// none of the tracing ones (bpf_probe_read_kernel and the like).
Allowlist agent_allowlist();

class ThreadHook : public Hook {
 public:
  // agent_cpus: where the agent backend's agents run (syrupd --agent_cpus; empty: where
  // syrupd may run). The sched_ext backend has no agent and ignores it.
  explicit ThreadHook(Compiler& compiler, std::vector<int> agent_cpus = {});
  ~ThreadHook() override;
  const char* name() const override { return "thread"; }
  const char* compile_define() const override { return "SYR_HOOK_THREAD"; }
  const char* wrapper() const override {
    return backend_ == Backend::kSchedExt ? "thread/scx_wrapper.bpf.h" : "thread/agent_wrapper.bpf.h";
  }
  // sched_ext's struct_ops are verified with CAP_PERFMON: the policy is verified first as
  // the agent's BPF_PROG_TYPE_SYSCALL program, with CAP_BPF alone.
  const char* verify_wrapper() const override {
    return backend_ == Backend::kSchedExt ? "thread/agent_wrapper.bpf.h" : nullptr;
  }
  // Agent: syr_executors holds the agent's batch of threads (the executors are the cores).
  std::vector<std::string> system_maps() const override;
  // The running backend's (agent_allowlist(), scx_allowlist()).
  Allowlist allowlist() const override;
  int make_target(const Caller& caller, proto::Message& req, std::unique_ptr<Target>& out,
                  pid_t& owner, std::string& err) override;
  void release_leftover(std::string_view app, const std::string& policy_dir) override;
  void recover() override;
  // Agent: takes over the running agent (or restores the threads if it is gone);
  // sched_ext: takes over the slot in the pinned root scheduler.
  int adopt(const nlohmann::json& saved, LoadedPolicy& p, std::unique_ptr<Target>& out,
            std::string& err) override;
  void shutdown() override;
  Backend backend() const { return backend_; }

 private:
  Compiler& compiler_;
  Backend backend_;
  std::string why_;
  // Why thread policies cannot run here ("" if they can): syrupd outside the machine's
  // first pid namespace numbers threads otherwise than the kernel's hooks do.
  std::string refused_;
  std::vector<int> agent_cpus_;
  std::shared_ptr<ScxBackend> scx_;  // shared with its targets; null for the agent, or when refused_
  // Set by shutdown(): targets destroyed after it leave their threads scheduled.
  std::shared_ptr<std::atomic<bool>> leaving_ = std::make_shared<std::atomic<bool>>(false);
};

}  // namespace syrup::thread
