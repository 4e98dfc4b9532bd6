// The thread hook's user-space agent (Backend 2: any kernel, no sched_ext needed).
//
// Design (ghOSt's model on an unmodified kernel): one agent process per application's
// scheduled process, started and watched by syrupd (hooks/thread/agent_hook.h). It learns of the
// process's thread events (wakeup, new, switch in/out, exit) from BPF on the scheduler
// tracepoints (kernel/hooks/thread/tracer.bpf.c) through a ring buffer, asks the
// application's compiled thread policy -- the same C function the sched_ext backend runs
// in the kernel -- for a core and an ordering key with one BPF_PROG_TEST_RUN per batch of
// runnable threads, and enforces the answer with Linux's own mechanisms:
//  - per core, the runnable thread with the lowest key ("chosen") runs as a normal
//    SCHED_OTHER thread at the process's baseline nice, pinned to that core;
//  - every other runnable thread of the application waits as SCHED_IDLE, pinned to its
//    core (or, for SYR_PASS, allowed on all the baseline cores): it runs only when its
//    core has nothing else to do, so the chosen thread gets the core (~99.7% against two
//    SCHED_IDLE peers) while the rest of the system keeps its fair share -- the
//    application can only reorder its own threads ("below CFS" isolation, as ghOSt);
//  - the policy is asked again every period while a thread stays runnable, so a hint
//    written through a mapped map takes effect within one period without any event;
//  - wake-ahead: a blocked thread is asked too, as if it woke now; if it would beat the
//    thread its core runs (or the core is free), it is readied while blocked --
//    SCHED_OTHER, pinned there, its policy's slice as its EEVDF slice -- so that its
//    wakeup preempts at once without waiting for this agent (EEVDF runs a waking thread
//    with a shorter slice first), as the sched_ext backend kicks a worse thread off;
//  - the policy's slice (syr_thread.slice_ns) becomes the thread's EEVDF slice
//    (sched_attr.sched_runtime, Linux 6.12+) while it is SCHED_OTHER; the preset
//    means the kernel's default.
// Deployed by cgroup, "its process" is every process in the cgroup that belongs to the
// deploying process's uid (checked per thread as it is first seen): a process of another
// user moved into the cgroup is left to the kernel, so a policy never starts scheduling a
// process its tenant could not have named; a thread that leaves the cgroup is restored
// and unregistered.
// Invariants: the agent only touches threads of its process that are in the
// application's syrup_threads map; on SIGTERM it restores them (SCHED_OTHER, baseline
// nice and affinity) before exiting; on SIGUSR1 (hand-over to a replacement agent) it
// exits leaving them as they are; it writes a heartbeat byte at least every 100 ms, and
// syrupd restores the threads itself if the agent dies or stops beating.
#pragma once

#include <sched.h>
#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace syrup::thread {

// How the scheduled process's threads ran before Syrup touched them.
struct Baseline {
  int policy = SCHED_OTHER;
  int nice = 0;
  std::vector<int> cpus;  // allowed cores
};

// Reads the baseline from the process's main thread. 0 or -errno.
int capture_baseline(pid_t tgid, Baseline& out);
// Puts one thread back to the baseline. 0 or -errno (-ESRCH: gone).
int restore_thread(pid_t tid, const Baseline& b);
// Threads of a process, ascending.
std::vector<pid_t> list_tids(pid_t tgid);
// Deletes from syrup_threads (`threads_fd`) the entries `stale` names whose thread exists
// no more, in any process (it exited without unregistering): the map (4096 entries)
// would fill with them, and a new thread of the process given a dead one's tid would
// inherit its registration. A live thread of another process keeps its entry (ignored
// here, not ours to drop). Returns how many went.
int drop_exited_registrations(int threads_fd, const std::vector<pid_t>& stale);
// SCHED_OTHER/SCHED_IDLE/SCHED_BATCH with a nice value and, for SCHED_OTHER, an EEVDF
// slice (sched_attr.sched_runtime, Linux 6.12+; older kernels ignore it; 0: the default).
// 0 or -errno.
int set_policy(pid_t tid, int policy, int nice, uint64_t slice_ns = 0);
int set_cpus(pid_t tid, const std::vector<int>& cpus);
// {0,1,3} -> "0,1,3"
std::string cpus_to_string(const std::vector<int>& cpus);
// A CPU list as the kernel writes them ("0,1,3", "0-3,8"; cpuset(7) "List format") ->
// ascending, without repeats. 0, or -EINVAL for anything else (an empty string too).
int cpus_from_string(const std::string& s, std::vector<int>& out);

struct AgentOptions {
  pid_t tgid = 0;
  std::string policy_dir;  // pins of the policy: prog, syr_executors, syr_stats
  std::string maps_dir;    // the application's map pins: syrup_threads, syrup_cs, ...
  bool all_threads = false;  // --pid: every thread of the process, registered as it appears
  int period_us = 5000;      // re-decision period
  int heartbeat_fd = -1;
  int ready_fd = -1;         // written once when the agent is attached (then closed)
  std::vector<int> agent_cpus;  // where the agent itself runs (empty: where syrupd may)
  Baseline baseline;
  // Deployed by cgroup (--cgroup): its directory (O_PATH, opened by syrupd beneath the v2
  // root), its id (the tracer's filter) and the uid whose threads in it are taken; tgid is
  // then only the policy's owner, and the agent outlives it.
  int cgroup_fd = -1;
  uint64_t cgroup_id = 0;
  uid_t uid = 0;
};

// The threads in cgroup `dir` (cgroup.threads) whose process belongs to `uid`, ascending,
// at most kMaxCgroupThreads; those `known` says yes to are taken without a look at their
// owner (the agent's, checked when it took them). 0, or -errno (-ENOENT/-ENODEV: the
// cgroup was removed, -E2BIG: more threads than that).
inline constexpr size_t kMaxCgroupThreads = 4096;  // = syrup_threads' entries
int cgroup_threads(int dir, uid_t uid, std::vector<pid_t>& out, const std::function<bool(pid_t)>& known = {});
// The process of thread `tid` (/proc/TID/status), 0 if it is gone.
pid_t tgid_of_thread(pid_t tid);

// Runs the agent until SIGTERM/SIGUSR1 or the process exits. Returns the exit code.
int run_agent(const AgentOptions& o);

}  // namespace syrup::thread
