// The thread hook's agent backend (agent_hook.h): the hook and its target, one agent
// per scheduled process.
#include "agent_hook.h"

#include <bpf/bpf.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "log.h"
#include "pins.h"
#include "proc.h"
#include "recorder.h"
#include "syrup/abi.h"
#include "thread_agent.h"
#include "thread_util.h"

extern char** environ;

namespace syrup::thread {
namespace {

constexpr int kHangMs = 500;        // no heartbeat for this long: the agent is hung
constexpr int kStartTimeoutMs = 5000;
constexpr int kStopTimeoutMs = 1000;
// The agent keeps the heartbeat pipe's read end open as this fd (never reading it), so the
// pipe outlives syrupd and a restarted syrupd takes the read end with pidfd_getfd.
constexpr int kAgentHbReadFd = 5;
constexpr int kAgentCgroupFd = 6;  // by cgroup: the cgroup's directory (O_PATH)

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

// Every registered thread among `tids` back to `b`. Returns how many were restored.
int restore_registered(const std::vector<pid_t>& tids, int threads_fd, const Baseline& b) {
  int n = 0;
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
  AgentTarget(pid_t tgid, bool all, Baseline b, std::shared_ptr<AgentNews> news, std::vector<int> agent_cpus,
              CgroupScope cg = {})
      : tgid_(tgid),
        all_(all),
        baseline_(std::move(b)),
        news_(std::move(news)),
        agent_cpus_(std::move(agent_cpus)),
        cg_(std::move(cg)) {
    long n = sysconf(_SC_NPROCESSORS_CONF);
    ncpu_ = n > 0 ? static_cast<uint32_t>(n) : 1;
  }
  ~AgentTarget() override {
    // syrupd exits keeping its policies (--on_exit=keep): the agent goes on scheduling
    // the threads, unwatched until the next syrupd adopts it (ThreadAgentHook::adopt).
    if (news_->leaving.load()) {
      stop_watchdog();
      return;
    }
    stop(/*restore=*/!handed_over_);
  }

  std::string key() const override {
    return cg_.id ? "thread:cgroup:" + std::to_string(cg_.id) : "thread:" + std::to_string(tgid_);
  }
  uint32_t num_executors() const override { return ncpu_; }

  int install(LoadedPolicy& p, const Target* old, std::string& err) override {
    threads_fd_.reset(dup(p.map_fd("syrup_threads")));
    if (!threads_fd_) {
      err = "the compiled thread policy has no syrup_threads map (was it built with <syrup/policy.h>?)";
      return -EINVAL;
    }
    if (all_) {
      uint32_t i = 0;
      for (pid_t tid : scheduled_tids()) {
        uint32_t k = static_cast<uint32_t>(tid), v = i++;
        bpf_map_update_elem(threads_fd_.get(), &k, &v, BPF_NOEXIST);
      }
    }
    // Hooks never mix backends: `old` is an agent target too.
    auto* prev = const_cast<AgentTarget*>(static_cast<const AgentTarget*>(old));
    // A replacement keeps the first policy's baseline: the threads' current state is
    // the old agent's doing, not the application's.
    if (prev) baseline_ = prev->baseline_;
    if (prev) prev->hand_over();  // the old agent leaves the threads as they are
    if (int r = start_agent(p, err)) {
      if (prev) restore_registered(scheduled_tids(), threads_fd_.get(), baseline_);
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
    if (cg_.id) d["cgroup"] = cg_.path, d["uid"] = cg_.uid;
    return d;
  }

  // What a restarted syrupd needs to take the agent over: the scheduled process and the
  // agent, each by pid and start time (a reused pid is not them), the agent's cores, and
  // the baseline to restore the threads to should the agent be gone by then.
  nlohmann::json save() const override {
    std::lock_guard lk(mu_);
    nlohmann::json j = {{"backend", "agent"}, {"pid", tgid_}, {"pid_start", tgid_start_}, {"all_threads", all_},
                        {"agent_pid", agent_pid_}, {"agent_start", agent_start_},
                        {"agent_cpus", cpus_to_string(agent_cpus_)}, {"status", status_},
                        {"baseline", baseline_to_json(baseline_)}};
    cg_.save(j);
    return j;
  }

  // Takes over the agent a previous syrupd started (see save()). If it is gone, the
  // threads are restored, as the watchdog would have, and the target reports itself
  // failed (gone(), news posted). 0 or -errno with `err` (the process itself is gone:
  // nothing to adopt).
  static int adopt(const nlohmann::json& saved, LoadedPolicy& p, std::shared_ptr<AgentNews> news,
                   std::unique_ptr<Target>& out, std::string& err) {
    pid_t tgid = saved.value("pid", 0);
    uint64_t tstart = saved.value("pid_start", uint64_t{0});
    if (tgid <= 0 || process_start_time(tgid) != tstart || tstart == 0) {
      err = "process " + std::to_string(tgid) + ", whose threads it scheduled, is gone";
      return -ESRCH;
    }
    Baseline b = baseline_from_json(saved);
    if (b.cpus.empty()) {
      err = "the saved baseline has no cores";
      return -EINVAL;
    }
    // The running agent's cores, as the syrupd that started it recorded them.
    std::vector<int> agent_cpus;
    if (std::string ac = saved.value("agent_cpus", std::string()); !ac.empty() && cpus_from_string(ac, agent_cpus))
      agent_cpus.clear();
    CgroupScope cg;
    if (int r = cg.adopt(saved, err)) return r;
    auto t = std::make_unique<AgentTarget>(tgid, saved.value("all_threads", false), std::move(b), std::move(news),
                                           std::move(agent_cpus), std::move(cg));
    t->tgid_start_ = tstart;
    t->adopted_ = true;
    t->threads_fd_.reset(dup(p.map_fd("syrup_threads")));
    if (!t->threads_fd_) {
      err = "its syrup_threads map was not adopted";
      return -EINVAL;
    }
    pid_t apid = saved.value("agent_pid", 0);
    if (!t->take_over(apid, saved.value("agent_start", uint64_t{0}))) {
      // Gone (or not ours any more): what the watchdog does on an agent's death.
      t->fail(apid > 0 ? "thread agent (pid " + std::to_string(apid) + ") ended while syrupd was down"
                       : "thread agent had failed before syrupd restarted: " + saved.value("status", std::string()),
              " when syrupd restarted");
    }
    out = std::move(t);
    return 0;
  }

  std::string gone() const override {
    std::lock_guard lk(mu_);
    return failed_;
  }

 private:
  // The threads this target schedules if registered: its process's, or by cgroup those
  // of the owner's uid in the cgroup.
  std::vector<pid_t> scheduled_tids() const {
    return cg_.id ? cg_.threads() : list_tids(tgid_);
  }

  // Adopts agent `apid` (started at `astart`) with its pidfd and heartbeat pipe, and
  // resumes the watchdog. False if it is gone or the pid is another process now.
  bool take_over(pid_t apid, uint64_t astart) {
    UniqueFd pidfd;
    if (apid > 0 && astart != 0 && process_start_time(apid) == astart)
      pidfd.reset(static_cast<int>(syscall(SYS_pidfd_open, apid, 0)));
    // Between the check and pidfd_open the pid could be reused: check again, now pinned.
    if (pidfd && process_start_time(apid) != astart) pidfd.reset();
    UniqueFd hb;
    if (pidfd) hb.reset(static_cast<int>(syscall(SYS_pidfd_getfd, pidfd.get(), kAgentHbReadFd, 0)));
    if (!pidfd || !hb) return false;
    agent_pid_ = apid;
    agent_start_ = astart;
    agent_pidfd_ = std::move(pidfd);
    hb_rd_ = std::move(hb);
    status_ = "running";
    stop_efd_.reset(eventfd(0, EFD_CLOEXEC));
    watchdog_ = signal_free_thread([this] { watch(); });
    log(LogLevel::kInfo, "thread agent %d of process %d adopted (started by a previous syrupd)", apid, tgid_);
    return true;
  }

  // The agent stopped scheduling (`why`): the threads back to the baseline, the reason
  // in gone() and `list`, and the hook's news posted so that syrupd removes the policy.
  void fail(const std::string& why, const char* when = "") {
    uint64_t t0 = now_ms();
    bool process_gone = !cg_.id && kill(tgid_, 0) < 0 && errno == ESRCH;
    int n = process_gone ? 0 : restore_registered(scheduled_tids(), threads_fd_.get(), baseline_);
    {
      std::lock_guard lk(mu_);
      agent_pid_ = 0;
      failed_ = cg_removed_ ? why : why + (process_gone ? std::string("; the process is gone")
                                    : "; " + std::to_string(n) + " threads restored to normal scheduling" +
                                          (*when ? std::string(when) : " in " + std::to_string(now_ms() - t0) + " ms"));
      status_ = "failed: " + failed_;
    }
    log(LogLevel::kWarn, "thread policy of process %d: %s", tgid_, failed_.c_str());
    news_->post();
  }

  // The agent's command line for policy `p`.
  std::vector<std::string> agent_args(const LoadedPolicy& p) const {
    std::vector<std::string> args = {agent_path(),
                                     "--tgid", std::to_string(tgid_),
                                     "--policy-dir", pins::policy_dir(p.app, p.policy_id),
                                     "--maps-dir", pins::app_maps_dir(p.app),
                                     "--heartbeat-fd", "3", "--ready-fd", "4",
                                     "--nice", std::to_string(baseline_.nice),
                                     "--cpus", cpus_to_string(baseline_.cpus)};
    if (all_) args.push_back("--all");
    if (cg_.id) {
      args.insert(args.end(), {"--cgroup-fd", std::to_string(kAgentCgroupFd), "--cgroup-id", std::to_string(cg_.id),
                               "--uid", std::to_string(cg_.uid)});
    }
    if (!agent_cpus_.empty()) {
      args.push_back("--agent-cpus");
      args.push_back(cpus_to_string(agent_cpus_));
    }
    return args;
  }

  // Spawns the agent with the heartbeat pipe's ends as fds 3 and kAgentHbReadFd and the
  // ready pipe's write end as fd 4. 0 or -errno with `err`.
  int spawn(std::vector<std::string> args, int hb_wr, int ready_wr, pid_t& pid, std::string& err) {
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, hb_wr, 3);
    posix_spawn_file_actions_adddup2(&fa, ready_wr, 4);
    posix_spawn_file_actions_adddup2(&fa, hb_rd_.get(), kAgentHbReadFd);
    if (cg_.dir) posix_spawn_file_actions_adddup2(&fa, cg_.dir.get(), kAgentCgroupFd);
    posix_spawnattr_t sa;
    posix_spawnattr_init(&sa);
    sigset_t none;
    sigemptyset(&none);
    posix_spawnattr_setsigmask(&sa, &none);  // syrupd blocks SIGTERM for its signalfd
    // Its own session: a signal to syrupd's process group (a terminal's ^C, a service
    // manager stopping syrupd) does not reach it; it outlives syrupd (see save()).
    posix_spawnattr_setflags(&sa, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSID);
    int r = posix_spawnp(&pid, args[0].c_str(), &fa, &sa, argv.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&sa);
    if (r) err = "cannot start the thread agent " + args[0] + ": " + std::strerror(r);
    return -r;
  }

  int start_agent(LoadedPolicy& p, std::string& err) {
    int hb[2], ready[2];
    if (pipe2(hb, O_CLOEXEC | O_NONBLOCK) < 0) return -errno;
    hb_rd_.reset(hb[0]);
    UniqueFd hb_wr(hb[1]);
    if (pipe2(ready, O_CLOEXEC) < 0) return -errno;
    UniqueFd ready_rd(ready[0]), ready_wr(ready[1]);
    pid_t pid;
    if (int r = spawn(agent_args(p), hb_wr.get(), ready_wr.get(), pid, err)) return r;
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
    if (cg_.id)
      log(LogLevel::kInfo, "thread agent %d schedules the threads of uid %u's processes in cgroup %s (owner %d)", pid,
          cg_.uid, cg_.path.c_str(), tgid_);
    else
      log(LogLevel::kInfo, "thread agent %d schedules process %d (%s)", pid, tgid_,
          all_ ? "all its threads" : "its registered threads");
    return 0;
  }

  // The watchdog: agent death or a missed heartbeat -> fail(): the threads restored by
  // syrupd itself, the policy reported gone.
  void watch() {
    uint64_t last_hb = now_ms();
    std::string who = "thread agent (pid " + std::to_string(agent_pid_) + ") ";
    for (;;) {
      pollfd pf[3] = {{stop_efd_.get(), POLLIN, 0}, {agent_pidfd_.get(), POLLIN, 0}, {hb_rd_.get(), POLLIN, 0}};
      poll(pf, 3, 100);
      if (pf[0].revents) return;
      if (pf[1].revents) return fail(who + exit_reason());
      // By cgroup: the policy ends with the cgroup (empty by then: nothing to restore).
      if (std::string why = cg_.removed(); !why.empty()) {
        signal_agent(SIGTERM);
        wait_exit(agent_pid_);
        cg_removed_ = true;
        return fail(why);
      }
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
      return fail(who + "hung (no heartbeat for " + std::to_string(kHangMs) + " ms): killed");
    }
  }

  // How the agent, whose pidfd says it exited, ended (reaping it).
  std::string exit_reason() {
    int st = 0;
    // An adopted agent is not our child: its exit status went to its new parent.
    if (adopted_ || waitpid(agent_pid_, &st, 0) != agent_pid_)
      return "exited (exit status unknown: it was started by a previous syrupd)";
    if (WIFSIGNALED(st))
      return "killed by signal " + std::to_string(WTERMSIG(st)) + " (" + strsignal(WTERMSIG(st)) + ")";
    return "exited with status " + std::to_string(WEXITSTATUS(st));
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
    if (restore && threads_fd_) restore_registered(scheduled_tids(), threads_fd_.get(), baseline_);
  }

  pid_t tgid_;
  bool all_;
  Baseline baseline_;
  std::shared_ptr<AgentNews> news_;  // the hook's event fd, and whether syrupd is leaving
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
  std::string failed_;  // gone(): why the agent stopped scheduling (set once)
  CgroupScope cg_;       // deployed by cgroup (cg_.id != 0)
  bool cg_removed_ = false;
};

}  // namespace

void AgentNews::post() {
  uint64_t one = 1;
  ssize_t w = write(fd.get(), &one, sizeof one);
  (void)w;  // the counter cannot overflow from a few failures
}

Allowlist agent_allowlist() { return {policy_helpers(), {}, policy_map_types()}; }

ThreadAgentHook::ThreadAgentHook(std::vector<int> agent_cpus)
    : agent_cpus_(std::move(agent_cpus)), news_(std::make_shared<AgentNews>()) {
  news_->fd.reset(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
}

std::vector<std::string> ThreadAgentHook::system_maps() const {
  return {SYR_EXECUTORS_MAP, SYR_STATS_MAP, kRecCtlMap, kRecRingMap};
}

bool ThreadAgentHook::refresh() {
  uint64_t n = 0;
  return read(news_->fd.get(), &n, sizeof n) == sizeof n && n > 0;
}

int ThreadAgentHook::make_process_target(ProcessThreads rq, std::unique_ptr<Target>& out, std::string&) {
  out = std::make_unique<AgentTarget>(rq.pid, rq.all, std::move(rq.base), news_, agent_cpus_, std::move(rq.cg));
  return 0;
}

int ThreadAgentHook::adopt_target(const nlohmann::json& saved, LoadedPolicy& p, std::unique_ptr<Target>& out,
                                  std::string& err) {
  return AgentTarget::adopt(saved, p, news_, out, err);
}

}  // namespace syrup::thread
