// What the thread hook's two backends share, and the one place that picks a backend
// (thread_hook.h).
#include "thread_hook.h"
#include "thread/request.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cctype>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

#include "agent_hook.h"
#include "cgroup.h"
#include "log.h"
#include "proc.h"
#include "registry.h"
#include "scx_hook.h"
#include "thread_util.h"
#include "unique_fd.h"

namespace syrup::thread {
namespace {

constexpr int kStopTimeoutMs = 1000;

// The cgroup `path` (--cgroup) as a target: its directory and id, and its owner, the
// oldest of its processes (a container's init outlives its workers), whose uid is the one
// whose processes the policy schedules (thread_hook.h). The caller may name it as for
// any hook (cgroup::processes: every process the caller's, unless an admin).
int cgroup_target(const Caller& caller, const std::string& path, ProcessThreads& rq, std::string& err) {
  std::vector<pid_t> pids;
  if (int r = cgroup::processes(path, caller.uid, caller.admin(), pids, err, &rq.cg.dir)) return r;
  struct stat st;
  if (fstat(rq.cg.dir.get(), &st) < 0) return -errno;
  uint64_t oldest = ~0ULL;
  for (pid_t p : pids)
    if (uint64_t t = process_start_time(p); t && t < oldest) oldest = t, rq.pid = p;
  uid_t uid = oldest != ~0ULL ? process_uid(rq.pid) : static_cast<uid_t>(-1);
  if (uid == static_cast<uid_t>(-1)) {
    err = "cgroup " + path + ": its processes exited while it was read";
    return -ESRCH;
  }
  rq.cg.path = path;
  rq.cg.id = st.st_ino;  // a cgroup v2 directory's inode number is its id
  rq.cg.uid = uid;
  rq.processes = pids.size();
  return 0;
}

// Parses and checks the request's body: which process, and whether all its threads.
int parse_request(const Caller& caller, const nlohmann::json& b, ProcessThreads& rq, std::string& err) {
  ThreadRequest asked;
  if (Bad bad; !parse(hook_fields(b), asked, bad)) {
    err = bad.str();
    return -EINVAL;
  }
  rq.pid = asked.pid ? asked.pid : caller.pid;
  rq.all = asked.pid != 0;  // another process: every thread of it
  if (!asked.cgroup.empty()) {
    if (int r = cgroup_target(caller, asked.cgroup, rq, err)) return r;
    rq.all = true;
  } else if (rq.all) {
    if (int r = check_target_process(caller, rq.pid, err)) return r;
  }
  // Scheduling classes of another process's threads: syrupd does it, as root, for the
  // caller's own process only (checked above).
  if (int r = capture_baseline(rq.pid, rq.base)) {
    err = "cannot read the scheduling state of process " + std::to_string(rq.pid) + ": " + std::strerror(-r);
    return r;
  }
  return 0;
}

// The agent started for `policy_dir` by a previous syrupd, found by its command line; 0
// if none runs.
pid_t leftover_agent(const std::string& policy_dir) {
  std::error_code ec;
  for (auto& e : std::filesystem::directory_iterator("/proc", ec)) {
    std::string name = e.path().filename();
    if (name.empty() || !std::isdigit(static_cast<unsigned char>(name[0]))) continue;
    std::ifstream in(e.path() / "cmdline");
    std::string cmd((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::vector<std::string> args;
    for (size_t a = 0, z; a < cmd.size(); a = z + 1) {
      z = cmd.find('\0', a);
      if (z == std::string::npos) z = cmd.size();
      args.push_back(cmd.substr(a, z - a));
    }
    bool agent = !args.empty() && args[0].size() >= 11 && args[0].rfind("syrup-agent") == args[0].size() - 11;
    for (size_t i = 1; agent && i + 1 < args.size(); i++)
      if (args[i] == "--policy-dir" && args[i + 1] == policy_dir) return std::atoi(name.c_str());
  }
  return 0;
}

}  // namespace

std::vector<pid_t> CgroupScope::threads() const {
  std::vector<pid_t> tids;
  if (!dir || cgroup_threads(dir.get(), uid, tids)) tids.clear();
  return tids;
}

std::string CgroupScope::removed() const {
  return id && cgroup::removed(dir.get()) ? "cgroup " + path + " was removed" : std::string();
}

void CgroupScope::save(nlohmann::json& j) const {
  if (id) j["cgroup"] = path, j["cgroup_id"] = id, j["uid"] = uid;
}

int CgroupScope::adopt(const nlohmann::json& saved, std::string& err) {
  path = saved.value("cgroup", std::string());
  if (path.empty()) return 0;
  id = saved.value("cgroup_id", uint64_t{0});
  uid = saved.value("uid", static_cast<uid_t>(-1));
  struct stat st;
  if (cgroup::open_dir(path, dir) || fstat(dir.get(), &st) < 0 || st.st_ino != id) {
    err = "cgroup " + path + ", whose threads it scheduled, was removed";
    return -ESRCH;
  }
  return 0;
}

nlohmann::json baseline_to_json(const Baseline& b) {
  return {{"policy", b.policy}, {"nice", b.nice}, {"cpus", cpus_to_string(b.cpus)}};
}

Baseline baseline_from_json(const nlohmann::json& saved) {
  Baseline b;
  const auto& bj = saved.value("baseline", nlohmann::json::object());
  b.policy = bj.value("policy", SCHED_OTHER);
  b.nice = bj.value("nice", 0);
  if (cpus_from_string(bj.value("cpus", std::string()), b.cpus)) b.cpus.clear();
  return b;
}

ThreadHookBase::ThreadHookBase() {
  if (uint64_t ns = pid_namespace(0); ns != kInitialPidNamespace) {
    refused_ = "syrupd runs in a pid namespace of its own (" +
               (ns ? "ns inode " + std::to_string(ns) : std::string("unreadable /proc/self/ns/pid")) +
               ", a container?): the thread hook needs the machine's, where the kernel's scheduler hooks "
               "number threads as syrupd does; run syrupd in the host's pid namespace (e.g. docker --pid=host)";
    log(LogLevel::kWarn, "thread hook: off: %s", refused_.c_str());
  }
}

int ThreadHookBase::make_target(const Caller& caller, proto::Message& req, std::unique_ptr<Target>& out,
                                pid_t& owner, std::string& err) {
  if (!refused_.empty()) {
    err = refused_;
    return -EOPNOTSUPP;
  }
  ProcessThreads rq;
  if (int r = parse_request(caller, req.body, rq, err)) return r;
  owner = rq.pid;
  return make_process_target(std::move(rq), out, err);
}

int ThreadHookBase::adopt(const nlohmann::json& saved, LoadedPolicy& p, std::unique_ptr<Target>& out,
                          std::string& err) {
  if (!refused_.empty()) {
    err = refused_;
    return -EOPNOTSUPP;
  }
  std::string was = saved.value("backend", std::string("agent"));
  if (was != backend()) {
    err = "it ran on the " + was + " backend, this syrupd uses " + backend();
    return -EOPNOTSUPP;
  }
  return adopt_target(saved, p, out, err);
}

void ThreadHookBase::release_leftover(std::string_view, const std::string& policy_dir) {
  pid_t pid = leftover_agent(policy_dir);
  if (pid <= 0) return;
  UniqueFd pfd(static_cast<int>(syscall(SYS_pidfd_open, pid, 0)));
  if (!pfd) return;
  syscall(SYS_pidfd_send_signal, pfd.get(), SIGTERM, nullptr, 0);
  if (!wait_pidfd(pfd.get(), kStopTimeoutMs)) syscall(SYS_pidfd_send_signal, pfd.get(), SIGKILL, nullptr, 0);
  log(LogLevel::kWarn, "stopped thread agent %d left on %s (it restores its threads)", pid, policy_dir.c_str());
}

bool sched_ext_usable(std::string& why) {
  const char* force = std::getenv("SYRUP_THREAD_BACKEND");
  bool have_scx = access("/sys/kernel/sched_ext/state", R_OK) == 0;
  if (force && std::string(force) == "agent") {
    why = "SYRUP_THREAD_BACKEND=agent";
    return false;
  }
  if (!have_scx) {
    why = "sched_ext is absent from this kernel (no /sys/kernel/sched_ext: CONFIG_SCHED_CLASS_EXT unset)";
    return false;
  }
  why = force && std::string(force) == "sched_ext" ? "SYRUP_THREAD_BACKEND=sched_ext"
                                                    : "sched_ext is present (/sys/kernel/sched_ext)";
  return true;
}

}  // namespace syrup::thread

namespace syrup {
// hooks/registry.h: the backend is chosen here, once.
std::unique_ptr<Hook> make_thread_hook(const HookContext& ctx) {
  std::string why;
  if (thread::sched_ext_usable(why)) {
    log(LogLevel::kInfo,
        "thread hook: %s: thread policies run in syrupd's sched_ext scheduler (one partial-mode "
        "root for all applications, loaded at the first thread deploy)",
        why.c_str());
    return std::make_unique<thread::ThreadScxHook>(ctx.compiler);
  }
  log(LogLevel::kInfo, "thread hook: %s: thread policies run in a per-process user-space agent", why.c_str());
  return std::make_unique<thread::ThreadAgentHook>(ctx.agent_cpus);
}
}  // namespace syrup
