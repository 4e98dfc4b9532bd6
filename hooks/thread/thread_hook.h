// The thread hook (user side): schedules an application's threads with its thread policy
// (kernel/include/syrup/policy.h, SYR_HOOK_THREAD), on one of two backends, each a full
// Hook of its own:
//  - ThreadScxHook (scx_hook.h): with sched_ext in the kernel (CONFIG_SCHED_CLASS_EXT,
//    /sys/kernel/sched_ext present) the policy runs inside syrupd's one partial-mode
//    sched_ext root scheduler, shared by all applications;
//  - ThreadAgentHook (agent_hook.h): without it -- as on this project's CI hosts -- in a
//    per-process user-space agent (thread_agent.h).
// make_thread_hook() picks one once, at start, and logs which and why;
// SYRUP_THREAD_BACKEND=agent in syrupd's environment forces the agent.
//
// This file holds what both share: the request (one process: the deploying one, whose
// threads opt in with syr_thread_register(), or --pid PID, every thread of it registered
// in ascending tid order, new ones as they appear; or --cgroup PATH, every thread of the
// cgroup's processes, those that join later included, see below), the baseline the threads go back to,
// the refusal when syrupd sits in a pid namespace of its own, the check that an adopted
// policy ran on this backend, and stopping a leftover agent.
// By cgroup: the policy's owner is the cgroup's oldest process (it ends when that exits,
// as a --pid policy ends with its process, or when the cgroup is removed), and it
// schedules the processes in the cgroup itself (not its descendants) that belong to the
// owner's uid, checked for each process as it is first seen: a process of another user
// moved into the cgroup later is left to the kernel, whoever deployed (root included).
// Invariants: a backend never runs a policy another backend saved (adopt refuses);
// at most one policy per process (key "thread:PID") and per cgroup ("thread:cgroup:ID").
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "hook.h"
#include "thread_agent.h"
#include "unique_fd.h"

namespace syrup::thread {

// What a policy deployed by cgroup schedules (below): the cgroup, and whose processes in it.
struct CgroupScope {
  std::string path;  // as the tenant gave it (for messages, and to reopen it on adoption)
  UniqueFd dir;      // O_PATH, opened beneath the v2 root (cgroup::open_dir)
  uint64_t id = 0;   // its id (the directory's inode number); 0: not deployed by cgroup
  uid_t uid = 0;     // the owner's: only this user's processes are scheduled
  // The threads in it of `uid`'s processes (cgroup_threads); empty once it is removed.
  std::vector<pid_t> threads() const;
  // Whether it was removed (rmdir): the policy ends, and gone() says this.
  std::string removed() const;
  // Into Target::save()'s record, and back (reopened by path; -ESRCH with `err` if it was
  // removed meanwhile: a cgroup made anew under the path has another id).
  void save(nlohmann::json& j) const;
  int adopt(const nlohmann::json& saved, std::string& err);
};

// What a thread deploy request asks for, checked.
struct ProcessThreads {
  pid_t pid = 0;     // the process whose threads are scheduled (the policy's owner)
  bool all = false;  // --pid: every thread, not only registered ones
  Baseline base;     // how its threads ran before
  // --cgroup: the cgroup, and how many processes it held at the deploy. pid is then the
  // owner: the cgroup's oldest process (a container's init).
  CgroupScope cg;
  size_t processes = 1;
};

// The baseline as Target::save() writes it, and back ("cpus" may be empty: keep them).
nlohmann::json baseline_to_json(const Baseline& b);
Baseline baseline_from_json(const nlohmann::json& saved);

class ThreadHookBase : public Hook {
 public:
  const char* name() const override { return "thread"; }
  const char* compile_define() const override { return "SYR_HOOK_THREAD"; }
  int make_target(const Caller& caller, proto::Message& req, std::unique_ptr<Target>& out, pid_t& owner,
                  std::string& err) final;
  int adopt(const nlohmann::json& saved, LoadedPolicy& p, std::unique_ptr<Target>& out,
            std::string& err) final;
  // A policy a previous syrupd left and this one did not adopt: an agent still running on
  // its pins (whatever this syrupd's backend) is stopped; it restores its threads.
  void release_leftover(std::string_view app, const std::string& policy_dir) override;
  // "agent" or "sched_ext", as Target::save() records it.
  virtual const char* backend() const = 0;

 protected:
  ThreadHookBase();
  // Why thread policies cannot run here ("" if they can): syrupd outside the machine's
  // first pid namespace numbers threads otherwise than the kernel's hooks do.
  const std::string& refused() const { return refused_; }
  virtual int make_process_target(ProcessThreads rq, std::unique_ptr<Target>& out, std::string& err) = 0;
  virtual int adopt_target(const nlohmann::json& saved, LoadedPolicy& p, std::unique_ptr<Target>& out,
                           std::string& err) = 0;

 private:
  std::string refused_;
};

// Which backend this kernel gets: true for sched_ext, with why (for the log).
bool sched_ext_usable(std::string& why);

}  // namespace syrup::thread
