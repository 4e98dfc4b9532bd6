#include "registry.h"
#include "thread.h"

#include <bpf/bpf.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <iterator>
#include <sstream>
#include <cerrno>
#include <chrono>
#include <cctype>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <thread>
#include <vector>

#include "log.h"
#include "pins.h"
#include "proc.h"
#include "thread_agent.h"
#include "thread_scx.h"
#include "thread_util.h"
#include "unique_fd.h"

extern char** environ;

namespace syrup::thread {
namespace {

constexpr int kHangMs = 500;        // no heartbeat for this long: the agent is hung
constexpr int kStartTimeoutMs = 5000;
constexpr int kStopTimeoutMs = 1000;
// The agent keeps the heartbeat pipe's read end open as this fd (never reading it), so the
// pipe outlives syrupd and a restarted syrupd takes the read end with pidfd_getfd.
constexpr int kAgentHbReadFd = 5;

// Waits up to `ms` for the process behind `pidfd` to exit. True if it did.
bool wait_pidfd(int pidfd, int ms) {
  pollfd pf{pidfd, POLLIN, 0};
  return poll(&pf, 1, ms) == 1;
}

std::string agent_path() {
  if (const char* e = std::getenv("SYRUP_AGENT"); e && *e) return e;
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n > 0) {
    std::string self(buf, static_cast<size_t>(n));
    std::string p = self.substr(0, self.rfind('/') + 1) + "syrup-agent";
    if (access(p.c_str(), X_OK) == 0) return p;
  }
  return "syrup-agent";  // PATH
}

// Every registered thread of `tgid` back to `b`. Returns how many were restored.
int restore_registered(pid_t tgid, int threads_fd, const Baseline& b) {
  int n = 0;
  std::vector<pid_t> tids = list_tids(tgid);
  for (pid_t tid : tids) {
    uint32_t k = static_cast<uint32_t>(tid), v;
    if (threads_fd >= 0 && bpf_map_lookup_elem(threads_fd, &k, &v) != 0) continue;
    if (restore_thread(tid, b) == 0) n++;
  }
  return n;
}

class AgentTarget : public Target {
 public:
  // agent_cpus: where the agent this target starts runs (syrupd --agent_cpus; empty:
  // where syrupd may).
  AgentTarget(pid_t tgid, bool all, Baseline b, std::shared_ptr<std::atomic<bool>> leaving,
              std::vector<int> agent_cpus)
      : tgid_(tgid),
        all_(all),
        baseline_(std::move(b)),
        leaving_(std::move(leaving)),
        agent_cpus_(std::move(agent_cpus)) {
    long n = sysconf(_SC_NPROCESSORS_CONF);
    ncpu_ = n > 0 ? static_cast<uint32_t>(n) : 1;
  }
  ~AgentTarget() override {
    // syrupd exits keeping its policies (--on_exit=keep): the agent goes on scheduling
    // the threads, unwatched until the next syrupd adopts it (ThreadHook::adopt).
    if (leaving_ && leaving_->load()) {
      stop_watchdog();
      return;
    }
    stop(/*restore=*/!handed_over_);
  }

  std::string key() const override { return "thread:" + std::to_string(tgid_); }
  uint32_t num_executors() const override { return ncpu_; }

  int install(LoadedPolicy& p, const Target* old, std::string& err) override {
    threads_fd_.reset(dup(p.map_fd("syrup_threads")));
    if (!threads_fd_) {
      err = "the compiled thread policy has no syrup_threads map (was it built with <syrup/policy.h>?)";
      return -EINVAL;
    }
    if (all_) {
      uint32_t i = 0;
      for (pid_t tid : list_tids(tgid_)) {
        uint32_t k = static_cast<uint32_t>(tid), v = i++;
        bpf_map_update_elem(threads_fd_.get(), &k, &v, BPF_NOEXIST);
      }
    }
    auto* prev = const_cast<AgentTarget*>(static_cast<const AgentTarget*>(old));
    // A replacement keeps the first policy's baseline: the threads' current state is
    // the old agent's doing, not the application's.
    if (prev) baseline_ = prev->baseline_;
    if (prev) prev->hand_over();  // the old agent leaves the threads as they are
    if (int r = start_agent(p, err)) {
      if (prev) restore_registered(tgid_, threads_fd_.get(), baseline_);
      return r;
    }
    return 0;
  }

  void uninstall(LoadedPolicy&) override { stop(true); }

  nlohmann::json describe() const override {
    std::lock_guard lk(mu_);
    nlohmann::json d = {{"backend", "agent"}, {"pid", tgid_}, {"agent_pid", agent_pid_},
                        {"all_threads", all_}, {"status", status_}, {"adopted", adopted_},
                        {"baseline", {{"nice", baseline_.nice}, {"cpus", cpus_to_string(baseline_.cpus)}}}};
    if (!agent_cpus_.empty()) d["agent_cpus"] = cpus_to_string(agent_cpus_);
    return d;
  }

  // What a restarted syrupd needs to take the agent over: the scheduled process and the
  // agent, each by pid and start time (a reused pid is not them), the agent's cores, and
  // the baseline to restore the threads to should the agent be gone by then.
  nlohmann::json save() const override {
    std::lock_guard lk(mu_);
    return {{"backend", "agent"}, {"pid", tgid_}, {"pid_start", tgid_start_}, {"all_threads", all_},
            {"agent_pid", agent_pid_}, {"agent_start", agent_start_}, {"agent_cpus", cpus_to_string(agent_cpus_)},
            {"status", status_},
            {"baseline", {{"policy", baseline_.policy}, {"nice", baseline_.nice},
                          {"cpus", cpus_to_string(baseline_.cpus)}}}};
  }

  // Takes over the agent a previous syrupd started (see save()). If it is gone, the
  // threads are restored, as the watchdog would have, and the policy stays listed with
  // the reason. 0 or -errno with `err` (the process itself is gone: nothing to adopt).
  static int adopt(const nlohmann::json& saved, LoadedPolicy& p, std::shared_ptr<std::atomic<bool>> leaving,
                   std::unique_ptr<Target>& out, std::string& err) {
    pid_t tgid = saved.value("pid", 0);
    uint64_t tstart = saved.value("pid_start", uint64_t{0});
    if (tgid <= 0 || process_start_time(tgid) != tstart || tstart == 0) {
      err = "process " + std::to_string(tgid) + ", whose threads it scheduled, is gone";
      return -ESRCH;
    }
    Baseline b;
    const auto& bj = saved.value("baseline", nlohmann::json::object());
    b.policy = bj.value("policy", SCHED_OTHER);
    b.nice = bj.value("nice", 0);
    if (cpus_from_string(bj.value("cpus", std::string()), b.cpus)) {
      err = "the saved baseline has no cores";
      return -EINVAL;
    }
    // The running agent's cores, as the syrupd that started it recorded them.
    std::vector<int> agent_cpus;
    if (std::string ac = saved.value("agent_cpus", std::string()); !ac.empty() && cpus_from_string(ac, agent_cpus))
      agent_cpus.clear();
    auto t = std::make_unique<AgentTarget>(tgid, saved.value("all_threads", false), std::move(b), std::move(leaving),
                                           std::move(agent_cpus));
    t->tgid_start_ = tstart;
    t->adopted_ = true;
    t->threads_fd_.reset(dup(p.map_fd("syrup_threads")));
    if (!t->threads_fd_) {
      err = "its syrup_threads map was not adopted";
      return -EINVAL;
    }
    pid_t apid = saved.value("agent_pid", 0);
    uint64_t astart = saved.value("agent_start", uint64_t{0});
    std::string old_status = saved.value("status", std::string());
    UniqueFd pidfd;
    if (apid > 0 && astart != 0 && process_start_time(apid) == astart)
      pidfd.reset(static_cast<int>(syscall(SYS_pidfd_open, apid, 0)));
    // Between the check and pidfd_open the pid could be reused: check again, now pinned.
    if (pidfd && process_start_time(apid) != astart) pidfd.reset();
    UniqueFd hb;
    if (pidfd) hb.reset(static_cast<int>(syscall(SYS_pidfd_getfd, pidfd.get(), kAgentHbReadFd, 0)));
    if (!pidfd || !hb) {
      // Gone (or not ours any more): what the watchdog does on an agent's death.
      int n = restore_registered(tgid, t->threads_fd_.get(), t->baseline_);
      t->status_ = apid <= 0 ? old_status
                             : "failed: the agent (pid " + std::to_string(apid) +
                                   ") ended while syrupd was down; " + std::to_string(n) +
                                   " threads restored to normal scheduling when syrupd restarted";
      log(LogLevel::kWarn, "thread policy of process %d: %s", tgid, t->status_.c_str());
      out = std::move(t);
      return 0;
    }
    t->agent_pid_ = apid;
    t->agent_start_ = astart;
    t->agent_pidfd_ = std::move(pidfd);
    t->hb_rd_ = std::move(hb);
    t->status_ = "running";
    t->stop_efd_.reset(eventfd(0, EFD_CLOEXEC));
    AgentTarget* raw = t.get();
    t->watchdog_ = signal_free_thread([raw] { raw->watch(); });
    log(LogLevel::kInfo, "thread agent %d of process %d adopted (started by a previous syrupd)", apid, tgid);
    out = std::move(t);
    return 0;
  }

 private:
  int start_agent(LoadedPolicy& p, std::string& err) {
    int hb[2], ready[2];
    if (pipe2(hb, O_CLOEXEC | O_NONBLOCK) < 0) return -errno;
    hb_rd_.reset(hb[0]);
    UniqueFd hb_wr(hb[1]);
    if (pipe2(ready, O_CLOEXEC) < 0) return -errno;
    UniqueFd ready_rd(ready[0]), ready_wr(ready[1]);

    std::string bin = agent_path();
    std::vector<std::string> args = {bin,
                                     "--tgid", std::to_string(tgid_),
                                     "--policy-dir", pins::policy_dir(p.app, p.policy_id),
                                     "--maps-dir", pins::app_maps_dir(p.app),
                                     "--heartbeat-fd", "3", "--ready-fd", "4",
                                     "--nice", std::to_string(baseline_.nice),
                                     "--cpus", cpus_to_string(baseline_.cpus)};
    if (all_) args.push_back("--all");
    if (!agent_cpus_.empty()) {
      args.push_back("--agent-cpus");
      args.push_back(cpus_to_string(agent_cpus_));
    }
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, hb_wr.get(), 3);
    posix_spawn_file_actions_adddup2(&fa, ready_wr.get(), 4);
    posix_spawn_file_actions_adddup2(&fa, hb_rd_.get(), kAgentHbReadFd);
    posix_spawnattr_t sa;
    posix_spawnattr_init(&sa);
    sigset_t none;
    sigemptyset(&none);
    posix_spawnattr_setsigmask(&sa, &none);  // syrupd blocks SIGTERM for its signalfd
    // Its own session: a signal to syrupd's process group (a terminal's ^C, a service
    // manager stopping syrupd) does not reach it; it outlives syrupd (see save()).
    posix_spawnattr_setflags(&sa, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSID);
    pid_t pid;
    int r = posix_spawnp(&pid, bin.c_str(), &fa, &sa, argv.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&sa);
    if (r) {
      err = "cannot start the thread agent " + bin + ": " + std::strerror(r);
      return -r;
    }
    hb_wr.reset();
    ready_wr.reset();
    {
      std::lock_guard lk(mu_);
      agent_pid_ = pid;
      agent_start_ = process_start_time(pid);
      tgid_start_ = process_start_time(tgid_);
      status_ = "starting";
    }
    agent_pidfd_.reset(static_cast<int>(syscall(SYS_pidfd_open, pid, 0)));
    pollfd pf{ready_rd.get(), POLLIN, 0};
    char c = 0;
    if (poll(&pf, 1, kStartTimeoutMs) != 1 || read(ready_rd.get(), &c, 1) != 1) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
      agent_pid_ = 0;
      err = "the thread agent did not attach (its messages are in syrupd's log)";
      return -EIO;
    }
    {
      std::lock_guard lk(mu_);
      status_ = "running";
    }
    stop_efd_.reset(eventfd(0, EFD_CLOEXEC));
    watchdog_ = signal_free_thread([this] { watch(); });
    log(LogLevel::kInfo, "thread agent %d schedules process %d (%s)", pid, tgid_,
        all_ ? "all its threads" : "its registered threads");
    return 0;
  }

  // The watchdog: agent death or a missed heartbeat -> restore the threads ourselves.
  void watch() {
    uint64_t last_hb = now_ms();
    for (;;) {
      pollfd pf[3] = {{stop_efd_.get(), POLLIN, 0}, {agent_pidfd_.get(), POLLIN, 0}, {hb_rd_.get(), POLLIN, 0}};
      poll(pf, 3, 100);
      if (pf[0].revents) return;
      std::string why;
      if (pf[1].revents) {
        int st = 0;
        // An adopted agent is not our child: its exit status went to its new parent.
        if (adopted_ || waitpid(agent_pid_, &st, 0) != agent_pid_)
          why = "agent exited (exit status unknown: it was started by a previous syrupd)";
        else why = WIFSIGNALED(st) ? std::string("agent killed by signal ") + std::to_string(WTERMSIG(st)) + " (" +
                                    strsignal(WTERMSIG(st)) + ")"
                              : "agent exited with status " + std::to_string(WEXITSTATUS(st));
      } else {
        if (pf[2].revents) {
          char buf[64];
          while (read(hb_rd_.get(), buf, sizeof buf) > 0) {
          }
          last_hb = now_ms();
        }
        if (now_ms() - last_hb <= static_cast<uint64_t>(kHangMs)) continue;
        signal_agent(SIGKILL);
        wait_pidfd(agent_pidfd_.get(), kStopTimeoutMs);
        if (!adopted_) waitpid(agent_pid_, nullptr, 0);
        why = "agent hung (no heartbeat for " + std::to_string(kHangMs) + " ms): killed";
      }
      uint64_t t0 = now_ms();
      bool process_gone = kill(tgid_, 0) < 0 && errno == ESRCH;
      int n = process_gone ? 0 : restore_registered(tgid_, threads_fd_.get(), baseline_);
      std::lock_guard lk(mu_);
      agent_pid_ = 0;
      status_ = "failed: " + why + (process_gone ? std::string("; the process is gone")
                                                 : "; " + std::to_string(n) +
                                                       " threads restored to normal scheduling in " +
                                                       std::to_string(now_ms() - t0) + " ms");
      log(LogLevel::kWarn, "thread policy of process %d: %s", tgid_, status_.c_str());
      return;
    }
  }

  void stop_watchdog() {
    if (watchdog_.joinable()) {
      uint64_t one = 1;
      ssize_t w = write(stop_efd_.get(), &one, sizeof one);
      (void)w;
      watchdog_.join();
    }
  }

  // Tells the agent to exit without restoring (a replacement takes over).
  void hand_over() {
    stop_watchdog();
    handed_over_ = true;
    pid_t pid = agent_pid_;
    if (pid > 0) {
      signal_agent(SIGUSR1);
      wait_exit(pid);
    }
    agent_pid_ = 0;
  }

  // Through the pidfd: an agent that already exited (and, adopted, is not our child to
  // reap) may have its pid reused by now.
  void signal_agent(int sig) { syscall(SYS_pidfd_send_signal, agent_pidfd_.get(), sig, nullptr, 0); }

  void wait_exit(pid_t pid) {
    if (!wait_pidfd(agent_pidfd_.get(), kStopTimeoutMs)) {
      signal_agent(SIGKILL);
      wait_pidfd(agent_pidfd_.get(), kStopTimeoutMs);
    }
    if (!adopted_) waitpid(pid, nullptr, 0);
  }

  void stop(bool restore) {
    stop_watchdog();
    pid_t pid = agent_pid_;
    if (pid > 0) {
      signal_agent(restore ? SIGTERM : SIGUSR1);
      wait_exit(pid);
      agent_pid_ = 0;
    }
    if (restore && threads_fd_) restore_registered(tgid_, threads_fd_.get(), baseline_);
  }

  pid_t tgid_;
  bool all_;
  Baseline baseline_;
  std::shared_ptr<std::atomic<bool>> leaving_;  // ThreadHook::shutdown() with policies kept
  bool adopted_ = false;                        // the agent is a previous syrupd's child
  uint64_t tgid_start_ = 0, agent_start_ = 0;
  uint32_t ncpu_ = 1;
  UniqueFd threads_fd_, hb_rd_, agent_pidfd_, stop_efd_;
  std::thread watchdog_;
  bool handed_over_ = false;
  mutable std::mutex mu_;
  pid_t agent_pid_ = 0;
  std::vector<int> agent_cpus_;  // --agent-cpus for the agent this target starts
  std::string status_ = "new";
};

}  // namespace

Backend detect_backend(std::string& why) {
  const char* force = std::getenv("SYRUP_THREAD_BACKEND");
  bool have_scx = access("/sys/kernel/sched_ext/state", R_OK) == 0;
  if (force && std::string(force) == "agent") {
    why = "SYRUP_THREAD_BACKEND=agent";
    return Backend::kAgent;
  }
  if (!have_scx) {
    why = "sched_ext is absent from this kernel (no /sys/kernel/sched_ext: CONFIG_SCHED_CLASS_EXT unset)";
    return Backend::kAgent;
  }
  why = force && std::string(force) == "sched_ext" ? "SYRUP_THREAD_BACKEND=sched_ext"
                                                    : "sched_ext is present (/sys/kernel/sched_ext)";
  return Backend::kSchedExt;
}

ThreadHook::ThreadHook(Compiler& compiler, std::vector<int> agent_cpus)
    : compiler_(compiler), agent_cpus_(std::move(agent_cpus)) {
  backend_ = detect_backend(why_);
  if (uint64_t ns = pid_namespace(0); ns != kInitialPidNamespace) {
    refused_ = "syrupd runs in a pid namespace of its own (" +
               (ns ? "ns inode " + std::to_string(ns) : std::string("unreadable /proc/self/ns/pid")) +
               ", a container?): the thread hook needs the machine's, where the kernel's scheduler hooks "
               "number threads as syrupd does; run syrupd in the host's pid namespace (e.g. docker --pid=host)";
    log(LogLevel::kWarn, "thread hook: off: %s", refused_.c_str());
    return;
  }
  if (backend_ == Backend::kSchedExt) {
    scx_ = make_scx_backend(compiler_);
    log(LogLevel::kInfo,
        "thread hook: %s: thread policies run in syrupd's sched_ext scheduler (one partial-mode "
        "root for all applications, loaded at the first thread deploy)",
        why_.c_str());
  } else {
    log(LogLevel::kInfo, "thread hook: %s: thread policies run in a per-process user-space agent", why_.c_str());
  }
}

ThreadHook::~ThreadHook() = default;

Allowlist agent_allowlist() { return {policy_helpers(), {}, policy_map_types()}; }

Allowlist ThreadHook::allowlist() const {
  return backend_ == Backend::kSchedExt ? scx_allowlist() : agent_allowlist();
}

std::vector<std::string> ThreadHook::system_maps() const {
  if (backend_ == Backend::kSchedExt) return scx_system_maps();
  return {SYR_EXECUTORS_MAP, SYR_STATS_MAP};
}


int ThreadHook::make_target(const Caller& caller, proto::Message& req, std::unique_ptr<Target>& out,
                            pid_t& owner, std::string& err) {
  if (!refused_.empty()) {
    err = refused_;
    return -EOPNOTSUPP;
  }
  const auto& b = req.body;
  pid_t pid = caller.pid;
  bool all = false;
  if (b.contains("pid") && b["pid"].is_number_integer() && b["pid"].get<int>() != 0) {
    pid = b["pid"].get<pid_t>();
    all = true;
    if (pid <= 0) {
      err = "pid must be positive";
      return -EINVAL;
    }
    if (int r = check_target_process(caller, pid, err)) return r;
  }
  // Scheduling classes of another process's threads: syrupd does it, as root, for the
  // caller's own process only (checked above).
  Baseline base;
  if (int r = capture_baseline(pid, base)) {
    err = "cannot read the scheduling state of process " + std::to_string(pid) + ": " + std::strerror(-r);
    return r;
  }
  owner = pid;
  if (backend_ == Backend::kSchedExt) return scx_make_target(scx_, pid, all, std::move(base), out, err);
  out = std::make_unique<AgentTarget>(pid, all, std::move(base), leaving_, agent_cpus_);
  return 0;
}

int ThreadHook::adopt(const nlohmann::json& saved, LoadedPolicy& p, std::unique_ptr<Target>& out,
                      std::string& err) {
  if (!refused_.empty()) {
    err = refused_;
    return -EOPNOTSUPP;
  }
  std::string was = saved.value("backend", std::string("agent"));
  std::string now = backend_ == Backend::kSchedExt ? "sched_ext" : "agent";
  if (was != now) {
    err = "it ran on the " + was + " backend, this syrupd uses " + now + " (" + why_ + ")";
    return -EOPNOTSUPP;
  }
  if (backend_ == Backend::kSchedExt) return scx_adopt(scx_, saved, p, out, err);
  return AgentTarget::adopt(saved, p, leaving_, out, err);
}

void ThreadHook::release_leftover(std::string_view app, const std::string& policy_dir) {
  // A policy a previous syrupd left and this one could not adopt (no state file, its
  // process gone, another backend): an agent may still be running on its pins. It is
  // found by its command line and stopped with SIGTERM, on which it restores the
  // threads itself.
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
      if (args[i] == "--policy-dir" && args[i + 1] == policy_dir) {
        pid_t pid = std::atoi(name.c_str());
        UniqueFd pfd(static_cast<int>(syscall(SYS_pidfd_open, pid, 0)));
        if (!pfd) break;
        syscall(SYS_pidfd_send_signal, pfd.get(), SIGTERM, nullptr, 0);
        if (!wait_pidfd(pfd.get(), kStopTimeoutMs)) syscall(SYS_pidfd_send_signal, pfd.get(), SIGKILL, nullptr, 0);
        log(LogLevel::kWarn, "stopped thread agent %d left on %s (it restores its threads)", pid, policy_dir.c_str());
        break;
      }
  }
  if (scx_) scx_release_leftover(scx_, app);
}

void ThreadHook::recover() {
  if (scx_) scx_recover(scx_);
}

void ThreadHook::shutdown() {
  // Called after the policies were removed (--on_exit=remove) or left for the next
  // syrupd: what is still deployed now is left running.
  leaving_->store(true);
  if (scx_) scx_leave(scx_);
}

}  // namespace syrup::thread

namespace syrup {
// hooks/registry.h
std::unique_ptr<Hook> make_thread_hook(const HookContext& ctx) {
  return std::make_unique<thread::ThreadHook>(ctx.compiler, ctx.agent_cpus);
}
}  // namespace syrup
