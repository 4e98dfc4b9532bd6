// The thread hook's agent backend (any kernel, no sched_ext needed): each thread policy
// runs in a user-space agent, `syrup-agent` (thread_agent.h), one per scheduled process.
//
// Design: install() starts the agent (in its own session) and waits until it is
// attached; a watchdog thread per target watches the agent's pidfd and its heartbeat
// pipe. If the agent exits or misses its heartbeat for kHangMs, the watchdog kills it,
// puts every registered thread back to the process's baseline (SCHED_OTHER, its nice, its
// affinity) itself, records why, and makes the hook's event_fd() readable: the agent's
// failure is news of the kernel state as an XDP interface's deletion is. refresh() reads
// the news, the failed target's gone() says why, and syrupd removes the policy with that
// reason (its log, "no policy N (... was removed: thread agent ... killed by signal 9
// ...)"). A replacement policy's agent takes over from the old one without a restore in
// between (the old agent exits on SIGUSR1 leaving the threads as they are).
// Across a syrupd restart: the agent outlives syrupd (no parent-death signal, own
// session) and keeps the heartbeat pipe's read end open; Target::save() records the
// agent and the process (pid + start time) and the baseline. A restarted syrupd adopts
// the agent (pidfd, heartbeat read end via pidfd_getfd; the watchdog resumes) or, if it
// ended meanwhile, restores the threads and reports it as a failure at once (the policy
// is then removed with the reason). While no syrupd runs, nobody watches the agent: if
// it dies then, its threads stay as it left them until syrupd is back. --on_exit=remove
// stops every agent (threads restored).
// By cgroup (thread_hook.h): one agent for the cgroup, given the cgroup's directory (fd
// 6, opened by syrupd beneath the v2 root: the agent never resolves the tenant's path), its
// id and the owner's uid; the agent outlives any one of its processes. The watchdog also
// ends the policy when the cgroup is removed ("cgroup P was removed"); the baseline threads
// go back to is the owner's.
// Invariants: at most one agent per process; after uninstall() or an agent failure no
// registered thread is left SCHED_IDLE or pinned by Syrup; a target that failed says so
// in gone() from the moment the event fd is written, and stays failed.
#pragma once

#include <atomic>
#include <memory>
#include <vector>

#include "thread_hook.h"
#include "unique_fd.h"

namespace syrup::thread {

// What a thread policy and the agent wrapper (agent_wrapper.bpf.h, a
// BPF_PROG_TYPE_SYSCALL program run by the agent) may call and declare: the common
// helpers only. No kernel functions, none of the syscall program type's own helpers
// (bpf_sys_bpf, bpf_sys_close, bpf_kallsyms_lookup_name, bpf_btf_find_by_name_kind),
// none of the tracing ones (bpf_probe_read_kernel and the like).
Allowlist agent_allowlist();

// What the hook shares with its targets, which may outlive it by a moment (a watchdog
// reporting as syrupd shuts down).
struct AgentNews {
  UniqueFd fd;                       // eventfd: a watchdog found an agent failed
  std::atomic<bool> leaving{false};  // shutdown(): targets destroyed now leave agents running
  void post();
};

class ThreadAgentHook : public ThreadHookBase {
 public:
  // agent_cpus: where the agents run (syrupd --agent_cpus; empty: where syrupd may run).
  explicit ThreadAgentHook(std::vector<int> agent_cpus);
  const char* backend() const override { return "agent"; }
  const char* wrapper() const override { return "thread/agent_wrapper.bpf.h"; }
  // syr_executors holds the agent's batch of threads (the executors are the cores).
  std::vector<std::string> system_maps() const override;
  Allowlist allowlist() const override { return agent_allowlist(); }
  int event_fd() const override { return news_->fd.get(); }
  // Reads the news: true if some agent failed since the last call.
  bool refresh() override;
  void shutdown() override { news_->leaving.store(true); }

 protected:
  int make_process_target(ProcessThreads rq, std::unique_ptr<Target>& out, std::string& err) override;
  // Takes over the running agent, or, if it is gone, restores the threads and reports
  // the target failed.
  int adopt_target(const nlohmann::json& saved, LoadedPolicy& p, std::unique_ptr<Target>& out,
                   std::string& err) override;

 private:
  std::vector<int> agent_cpus_;
  std::shared_ptr<AgentNews> news_;
};

}  // namespace syrup::thread
