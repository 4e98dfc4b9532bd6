#include "thread_agent.h"

#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

#include "sched_attr.h"
#include "syrup/abi.h"
#include "thread/events.h"
#include "thread_tracer.skel.h"
#include "cgroup.h"

namespace syrup::thread {
namespace {

// Mirrors struct syr_thread / syr_thread_slot of <syrup/policy.h> and agent_wrapper.bpf.h.
struct SyrThread {
  uint32_t tid, tgid, executor, prev_cpu, nr_cpus, reason;
  uint64_t now_ns, runnable_ns, run_ns, key, slice_ns, oncore_ns;
};
struct Slot {
  SyrThread t;
  uint32_t core, pad;
};
static_assert(sizeof(SyrThread) == 72 && sizeof(Slot) == 80, "policy ABI layout changed");
constexpr uint32_t kBatch = 256;  // SYR_AGENT_BATCH
constexpr uint32_t kNoExecutor = 0xffffffffU;
constexpr uint64_t kDefaultSliceNs = 3'000'000;

// Reason codes (SYR_THREAD_*).
constexpr uint32_t kWakeup = 1, kNew = 2, kPreempted = 3, kTick = 4;

uint64_t mono_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

// The policy's slice as the EEVDF slice of a SCHED_OTHER thread: the preset (untouched)
// means the kernel's default; anything else is clamped to what the kernel accepts.
uint64_t eevdf_slice(uint64_t policy_slice_ns) {
  if (policy_slice_ns == kDefaultSliceNs || policy_slice_ns == 0) return 0;
  return std::clamp<uint64_t>(policy_slice_ns, 100'000, 100'000'000);
}

enum class St { kBlocked, kRunnable, kRunning };

struct Applied {
  int policy = -1;  // -1: never set by the agent
  int nice = 0;
  uint64_t slice_ns = 0;  // EEVDF slice (sched_attr.sched_runtime); 0: the kernel's default
  std::vector<int> cpus;
  bool operator==(const Applied&) const = default;
};

struct Thr {
  pid_t tid = 0;
  pid_t tgid = 0;  // its process (by cgroup: one of the cgroup's)
  uint32_t exec = kNoExecutor;
  St st = St::kBlocked;
  uint32_t cpu = 0;
  uint64_t runnable_ns = 0, run_start_ns = 0, run_ns = 0;
  uint32_t pending_reason = 0;
  uint64_t key = 0;  // blocked: the key it would get if it woke now (wake-ahead)
  uint32_t core = SYR_PASS;
  uint64_t slice_ns = 0;  // the policy's last slice, as an EEVDF slice (0: the kernel's default)
  uint64_t wake_ts = 0;  // for the wakeup-to-running latency histogram
  Applied applied;
};

// "R" -> runnable; field 39 -> cpu.
bool read_task_stat(pid_t tgid, pid_t tid, bool& runnable, uint32_t& cpu) {
  std::ifstream in("/proc/" + std::to_string(tgid) + "/task/" + std::to_string(tid) + "/stat");
  std::string s;
  if (!std::getline(in, s)) return false;
  auto rp = s.rfind(')');
  if (rp == std::string::npos) return false;
  std::istringstream ss(s.substr(rp + 2));
  std::vector<std::string> f;
  for (std::string w; ss >> w;) f.push_back(w);
  if (f.size() < 37) return false;
  runnable = f[0] == "R";
  cpu = static_cast<uint32_t>(std::stoul(f[36]));
  return true;
}

}  // namespace

int set_policy(pid_t tid, int policy, int nice, uint64_t slice_ns) {
  SchedAttr a;
  a.sched_policy = static_cast<uint32_t>(policy);
  a.sched_nice = policy == SCHED_IDLE ? 0 : nice;
  a.sched_runtime = policy == SCHED_IDLE ? 0 : slice_ns;
  return sched_attr_set(tid, a);
}

int set_cpus(pid_t tid, const std::vector<int>& cpus) {
  cpu_set_t s;
  CPU_ZERO(&s);
  for (int c : cpus) CPU_SET(c, &s);
  return sched_setaffinity(tid, sizeof s, &s) < 0 ? -errno : 0;
}

std::string cpus_to_string(const std::vector<int>& cpus) {
  std::string s;
  for (int c : cpus) s += (s.empty() ? "" : ",") + std::to_string(c);
  return s;
}

int cpus_from_string(const std::string& s, std::vector<int>& out) {
  std::vector<int> v;
  std::stringstream ss(s);
  auto number = [](const std::string& w, int& n) {
    if (w.empty() || w.size() > 5 || w.find_first_not_of("0123456789") != std::string::npos) return false;
    n = std::stoi(w);
    return n < CPU_SETSIZE;
  };
  for (std::string w; std::getline(ss, w, ',');) {
    size_t dash = w.find('-');
    int lo, hi;
    if (!number(w.substr(0, dash), lo)) return -EINVAL;
    if (dash == std::string::npos) hi = lo;
    else if (!number(w.substr(dash + 1), hi) || hi < lo) return -EINVAL;
    for (int c = lo; c <= hi; c++) v.push_back(c);
  }
  if (v.empty() || s.back() == ',') return -EINVAL;
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
  out = std::move(v);
  return 0;
}

int capture_baseline(pid_t tgid, Baseline& out) {
  SchedAttr a;
  if (int r = sched_attr_get(tgid, a)) return r;
  out.policy = static_cast<int>(a.sched_policy);
  out.nice = a.sched_nice;
  // A process already demoted by a previous agent of ours: its baseline is normal.
  if (out.policy == SCHED_IDLE) out.policy = SCHED_OTHER, out.nice = 0;
  if (out.policy == int(kSchedExt) /* a previous syrupd's sched_ext backend */) out.policy = SCHED_OTHER;
  cpu_set_t s;
  if (sched_getaffinity(tgid, sizeof s, &s) < 0) return -errno;
  out.cpus.clear();
  for (int c = 0; c < CPU_SETSIZE; c++)
    if (CPU_ISSET(c, &s)) out.cpus.push_back(c);
  return 0;
}

int restore_thread(pid_t tid, const Baseline& b) {
  int pol = b.policy == SCHED_OTHER || b.policy == SCHED_BATCH ? b.policy : SCHED_OTHER;
  int r1 = set_policy(tid, pol, b.nice);
  int r2 = set_cpus(tid, b.cpus);
  return r1 ? r1 : r2;
}

std::vector<pid_t> list_tids(pid_t tgid) {
  std::vector<pid_t> v;
  std::string dir = "/proc/" + std::to_string(tgid) + "/task";
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* de = readdir(d))
      if (de->d_name[0] != '.') v.push_back(std::atoi(de->d_name));
    closedir(d);
  }
  std::sort(v.begin(), v.end());
  return v;
}

int cgroup_threads(int dir, uid_t uid, std::vector<pid_t>& out, const std::function<bool(pid_t)>& known) {
  std::vector<pid_t> all;
  if (int r = cgroup::read_ids(dir, "cgroup.threads", kMaxCgroupThreads, all)) return r;
  out.clear();
  for (pid_t tid : all) {
    if (known && known(tid)) {
      out.push_back(tid);
      continue;
    }
    struct stat st;
    // /proc/TID is owned by the thread's (effective) uid, as syrupd's process_uid reads it.
    if (stat(("/proc/" + std::to_string(tid)).c_str(), &st) == 0 && st.st_uid == uid) out.push_back(tid);
  }
  return 0;
}

pid_t tgid_of_thread(pid_t tid) {
  std::ifstream in("/proc/" + std::to_string(tid) + "/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("Tgid:", 0) == 0) return static_cast<pid_t>(std::atoi(line.c_str() + 5));
  return 0;
}

int drop_exited_registrations(int threads_fd, const std::vector<pid_t>& stale) {
  int n = 0;
  if (stale.empty() || access("/proc/self", F_OK) != 0) return 0;  // no /proc: nothing is known gone
  for (pid_t tid : stale) {
    // /proc/TID resolves for any thread, not only a process's main one.
    if (access(("/proc/" + std::to_string(tid)).c_str(), F_OK) == 0 || errno != ENOENT) continue;
    uint32_t k = static_cast<uint32_t>(tid);
    n += bpf_map_delete_elem(threads_fd, &k) == 0;
  }
  return n;
}

namespace {

class Agent {
 public:
  explicit Agent(const AgentOptions& o) : o_(o) {}
  int run();
  void on_event(const syr_tev& e);

 private:
  int setup();
  void refresh_registrations();
  void decide(uint64_t now);
  void reconcile();
  void apply(Thr& t, const Applied& want);
  void restore_all();
  void heartbeat(uint64_t now);
  void report();
  bool by_cgroup() const { return o_.cgroup_fd >= 0; }
  // A thread the tracer reported new: may the agent take it? Its process, or 0.
  pid_t takes(pid_t tid) const;
  void forget_left(const std::map<pid_t, uint32_t>& reg, const std::vector<pid_t>& members);

  AgentOptions o_;
  thread_tracer* skel_ = nullptr;
  ring_buffer* rb_ = nullptr;
  int prog_fd_ = -1, batch_fd_ = -1, threads_fd_ = -1;
  Slot* batch_ = nullptr;
  size_t batch_len_ = 0;
  uint32_t nr_cpus_ = 1;
  std::map<pid_t, Thr> thr_;
  bool dirty_ = false;
  uint64_t last_hb_ = 0, last_refresh_ = 0;
  uint32_t next_exec_ = 0;
  // Counters for the report.
  uint64_t n_events_ = 0, n_runs_ = 0, n_decisions_ = 0, n_syscalls_ = 0, run_ns_total_ = 0;
  uint64_t start_ns_ = mono_ns();
  std::vector<uint64_t> wake_lat_;  // ns, wakeup -> switch-in, of managed threads
};

int ring_cb(void* ctx, void* data, size_t len) {
  if (len >= sizeof(syr_tev)) static_cast<Agent*>(ctx)->on_event(*static_cast<const syr_tev*>(data));
  return 0;
}

int Agent::setup() {
  long n = sysconf(_SC_NPROCESSORS_CONF);
  nr_cpus_ = n > 0 ? static_cast<uint32_t>(n) : 1;
  prog_fd_ = bpf_obj_get((o_.policy_dir + "/prog").c_str());
  batch_fd_ = bpf_obj_get((o_.policy_dir + "/" SYR_EXECUTORS_MAP).c_str());
  threads_fd_ = bpf_obj_get((o_.maps_dir + "/syrup_threads").c_str());
  int cs_fd = bpf_obj_get((o_.maps_dir + "/syrup_cs").c_str());
  if (prog_fd_ < 0 || batch_fd_ < 0 || threads_fd_ < 0 || cs_fd < 0) {
    std::fprintf(stderr, "syrup-agent: cannot open the policy's pins under %s / %s: %s\n",
                 o_.policy_dir.c_str(), o_.maps_dir.c_str(), std::strerror(errno));
    return -ENOENT;
  }
  batch_len_ = (sizeof(Slot) * kBatch + 4095) / 4096 * 4096;
  void* m = mmap(nullptr, batch_len_, PROT_READ | PROT_WRITE, MAP_SHARED, batch_fd_, 0);
  if (m == MAP_FAILED) {
    std::fprintf(stderr, "syrup-agent: cannot mmap the policy's batch map: %s\n", std::strerror(errno));
    return -errno;
  }
  batch_ = static_cast<Slot*>(m);

  skel_ = thread_tracer__open();
  if (!skel_) return -errno;
  skel_->rodata->target_tgid = static_cast<uint32_t>(o_.tgid);
  skel_->rodata->target_cgid = o_.cgroup_id;
  bpf_map__reuse_fd(skel_->maps.syrup_threads, threads_fd_);
  bpf_map__reuse_fd(skel_->maps.syrup_cs, cs_fd);
  close(cs_fd);
  if (int r = thread_tracer__load(skel_)) {
    std::fprintf(stderr, "syrup-agent: cannot load the scheduler tracepoint programs: %s\n",
                 std::strerror(-r));
    return r;
  }
  if (int r = thread_tracer__attach(skel_)) {
    std::fprintf(stderr, "syrup-agent: cannot attach to the sched tracepoints: %s\n", std::strerror(-r));
    return r;
  }
  rb_ = ring_buffer__new(bpf_map__fd(skel_->maps.events), ring_cb, this, nullptr);
  if (!rb_) return -errno;
  return 0;
}

pid_t Agent::takes(pid_t tid) const {
  if (!by_cgroup()) return o_.tgid;
  struct stat st;
  if (stat(("/proc/" + std::to_string(tid)).c_str(), &st) != 0 || st.st_uid != o_.uid) return 0;
  return tgid_of_thread(tid);
}

void Agent::on_event(const syr_tev& e) {
  n_events_++;
  auto it = thr_.find(static_cast<pid_t>(e.tid));
  pid_t tgid = 0;
  if (e.type == SYR_TEV_NEW && o_.all_threads && it == thr_.end() && (tgid = takes(e.tid)) > 0) {
    // A new thread of a --pid process (or of a process of the cgroup): registered at
    // once, in creation order.
    uint32_t tid = e.tid, idx = next_exec_++;
    bpf_map_update_elem(threads_fd_, &tid, &idx, BPF_NOEXIST);
    bpf_map_lookup_elem(threads_fd_, &tid, &idx);
    Thr t;
    t.tid = static_cast<pid_t>(e.tid);
    t.tgid = tgid;
    t.exec = idx;
    it = thr_.emplace(t.tid, t).first;
  }
  if (it == thr_.end()) return;
  Thr& t = it->second;
  switch (e.type) {
    case SYR_TEV_WAKEUP:
    case SYR_TEV_NEW:
      if (t.st == St::kBlocked) {
        t.st = St::kRunnable;
        t.runnable_ns = e.ts;
        t.run_ns = 0;
        t.pending_reason = e.type == SYR_TEV_NEW ? kNew : kWakeup;
        t.wake_ts = e.ts;
        dirty_ = true;
      }
      break;
    case SYR_TEV_SWITCH_IN:
      if (t.wake_ts && wake_lat_.size() < (1u << 20)) wake_lat_.push_back(e.ts - t.wake_ts);
      t.wake_ts = 0;
      if (t.st == St::kBlocked) t.runnable_ns = e.ts, t.run_ns = 0;
      t.st = St::kRunning;
      t.cpu = e.cpu;
      t.run_start_ns = e.ts;
      break;
    case SYR_TEV_SWITCH_OUT:
      if (t.st == St::kRunning && t.run_start_ns) t.run_ns += e.ts - t.run_start_ns;
      t.cpu = e.cpu;
      if (e.arg == 0) {
        t.st = St::kRunnable;
        t.pending_reason = kPreempted;
      } else {
        t.st = St::kBlocked;
        t.wake_ts = 0;
      }
      dirty_ = true;
      break;
    case SYR_TEV_EXIT:
      // Its registration went at the exit, in the tracer. Not here: the tid may be a new
      // thread's by now, registered anew.
      thr_.erase(it);
      dirty_ = true;
      break;
  }
}

// By cgroup: threads that left the cgroup (or its user's processes) are restored and
// unregistered, as are registrations naming a thread outside it.
void Agent::forget_left(const std::map<pid_t, uint32_t>& reg, const std::vector<pid_t>& members) {
  for (auto& [tid, exec] : reg) {
    if (std::binary_search(members.begin(), members.end(), tid)) continue;
    uint32_t k = static_cast<uint32_t>(tid);
    bpf_map_delete_elem(threads_fd_, &k);
    auto it = thr_.find(tid);
    if (it == thr_.end()) continue;
    if (it->second.applied.policy >= 0) restore_thread(tid, o_.baseline);
    thr_.erase(it);
    dirty_ = true;
  }
}

void Agent::refresh_registrations() {
  std::vector<pid_t> members;  // by cgroup: the threads the agent may take
  // A cgroup that cannot be read (removed): syrupd, which watches it, ends the policy.
  // (Every 20 ms: only threads not taken yet cost a look at their owner.)
  auto taken = [&](pid_t tid) { return thr_.count(tid) > 0; };
  if (by_cgroup() && cgroup_threads(o_.cgroup_fd, o_.uid, members, taken)) return;
  if (o_.all_threads) {
    for (pid_t tid : by_cgroup() ? members : list_tids(o_.tgid)) {
      uint32_t k = static_cast<uint32_t>(tid), v;
      if (bpf_map_lookup_elem(threads_fd_, &k, &v) == 0) continue;
      v = next_exec_++;
      bpf_map_update_elem(threads_fd_, &k, &v, BPF_NOEXIST);
    }
  }
  std::map<pid_t, uint32_t> reg;
  uint32_t key, next;
  bool first = true;
  while (bpf_map_get_next_key(threads_fd_, first ? nullptr : &key, &next) == 0) {
    first = false;
    key = next;
    uint32_t v;
    if (bpf_map_lookup_elem(threads_fd_, &key, &v) == 0) {
      reg[static_cast<pid_t>(key)] = v;
      if (v >= next_exec_ && v < SYR_MAX_EXECUTORS) next_exec_ = v + 1;
    }
  }
  if (by_cgroup()) {
    forget_left(reg, members);
    std::erase_if(reg, [&](auto& kv) { return !std::binary_search(members.begin(), members.end(), kv.first); });
  }
  // Forget threads that left (unregistered or gone): restore them.
  for (auto it = thr_.begin(); it != thr_.end();) {
    if (reg.count(it->first)) {
      it->second.exec = reg[it->first];
      ++it;
      continue;
    }
    if (it->second.applied.policy >= 0) restore_thread(it->first, o_.baseline);
    it = thr_.erase(it);
    dirty_ = true;
  }
  // New registrations: only threads of our process (a map entry naming another process's
  // thread is ignored: an application schedules its own threads only).
  uint64_t now = mono_ns();
  std::vector<pid_t> not_ours;
  for (auto& [tid, exec] : reg) {
    if (thr_.count(tid)) continue;
    bool runnable = false;
    uint32_t cpu = 0;
    pid_t tgid = by_cgroup() ? tgid_of_thread(tid) : o_.tgid;
    if (tgid <= 0 || !read_task_stat(tgid, tid, runnable, cpu)) {
      not_ours.push_back(tid);
      continue;
    }
    Thr t;
    t.tid = tid;
    t.tgid = tgid;
    t.exec = exec;
    t.cpu = cpu;
    t.st = runnable ? St::kRunnable : St::kBlocked;
    t.runnable_ns = now;
    t.pending_reason = kWakeup;
    thr_.emplace(tid, t);
    dirty_ = true;
  }
  drop_exited_registrations(threads_fd_, not_ours);
}

void Agent::decide(uint64_t now) {
  // Every thread, blocked ones too: a blocked thread is asked as if it woke now, so that
  // reconcile() can ready it to preempt before it wakes (wake-ahead).
  std::vector<Thr*> all;
  for (auto& [tid, t] : thr_) all.push_back(&t);
  for (size_t base = 0; base < all.size(); base += kBatch) {
    uint32_t n = static_cast<uint32_t>(std::min<size_t>(kBatch, all.size() - base));
    for (uint32_t i = 0; i < n; i++) {
      Thr& t = *all[base + i];
      bool blocked = t.st == St::kBlocked;
      uint32_t reason = blocked ? kWakeup : (t.pending_reason ? t.pending_reason : kTick);
      uint64_t since = blocked ? now : t.runnable_ns;
      uint64_t oncore = t.st == St::kRunning && t.run_start_ns ? now - std::min(now, t.run_start_ns) : 0;
      uint64_t ran = blocked ? 0 : t.run_ns + oncore;
      batch_[i].t = SyrThread{static_cast<uint32_t>(t.tid), static_cast<uint32_t>(t.tgid), t.exec, t.cpu,
                              nr_cpus_, reason, now, since, ran, since, kDefaultSliceNs, oncore};
      batch_[i].core = SYR_PASS;
    }
    struct {
      uint32_t n;
    } ctx{n};
    LIBBPF_OPTS(bpf_test_run_opts, ro, .ctx_in = &ctx, .ctx_size_in = sizeof ctx);
    uint64_t t0 = mono_ns();
    int r = bpf_prog_test_run_opts(prog_fd_, &ro);
    run_ns_total_ += mono_ns() - t0;
    n_runs_++;
    if (r < 0) {
      std::fprintf(stderr, "syrup-agent: running the policy failed: %s\n", std::strerror(errno));
      continue;
    }
    for (uint32_t i = 0; i < n; i++) {
      Thr& t = *all[base + i];
      t.key = batch_[i].t.key;
      t.core = batch_[i].core;
      t.slice_ns = eevdf_slice(batch_[i].t.slice_ns);
      if (t.st != St::kBlocked) {
        t.pending_reason = 0;
        n_decisions_++;
      }
    }
  }
}

void Agent::apply(Thr& t, const Applied& want) {
  if (t.applied == want) return;
  if (t.applied.policy != want.policy || t.applied.nice != want.nice || t.applied.slice_ns != want.slice_ns) {
    n_syscalls_++;
    if (set_policy(t.tid, want.policy, want.nice, want.slice_ns) < 0) return;
  }
  if (t.applied.cpus != want.cpus) {
    n_syscalls_++;
    set_cpus(t.tid, want.cpus);
  }
  t.applied = want;
}

void Agent::reconcile() {
  const auto& allowed = o_.baseline.cpus;
  // Better candidate for a core: lower key; ties to the one already chosen (no churn),
  // then to the one running there, then to the lower tid.
  auto better = [](const Thr* a, const Thr* b, uint32_t core) {
    if (a->key != b->key) return a->key < b->key;
    bool ac = a->applied.policy == SCHED_OTHER, bc = b->applied.policy == SCHED_OTHER;
    if (ac != bc) return ac;
    bool ar = a->st == St::kRunning && a->cpu == core, br = b->st == St::kRunning && b->cpu == core;
    if (ar != br) return ar;
    return a->tid < b->tid;
  };
  // The policy's answer names a core this process may run on (else: as SYR_PASS).
  auto own_core = [&](uint32_t c) {
    return c != SYR_PASS && c < nr_cpus_ && std::find(allowed.begin(), allowed.end(), int(c)) != allowed.end();
  };
  std::vector<Thr*> chosen(nr_cpus_, nullptr), pass;
  for (auto& [tid, t] : thr_) {
    if (t.st == St::kBlocked) continue;
    uint32_t c = t.core;
    if (own_core(c)) {
      if (!chosen[c] || better(&t, chosen[c], c)) chosen[c] = &t;
    } else {
      pass.push_back(&t);
    }
  }
  std::vector<int> free;
  for (int c : allowed)
    if (c >= 0 && uint32_t(c) < nr_cpus_ && !chosen[c]) free.push_back(c);
  std::sort(pass.begin(), pass.end(), [&](const Thr* a, const Thr* b) { return better(a, b, a->cpu); });
  int nice = o_.baseline.nice;
  for (auto& [tid, t] : thr_) {
    if (t.st == St::kBlocked) continue;
    uint32_t c = t.core;
    if (c != SYR_PASS && c < nr_cpus_ && chosen[c]) {
      apply(t, chosen[c] == &t ? Applied{SCHED_OTHER, nice, t.slice_ns, {int(c)}} : Applied{SCHED_IDLE, 0, 0, {int(c)}});
    }
  }
  // SYR_PASS: the best ones run, one per free core, each pinned to its own core (left to
  // itself the kernel may stack two of them on one core while a waiting thread gets the
  // other); a thread keeps the core it is on when that core is free. The rest wait as
  // SCHED_IDLE on all the cores.
  size_t n = std::min(pass.size(), free.size());
  std::vector<int> core_of(n, -1);
  std::vector<bool> taken(free.size(), false);
  for (size_t i = 0; i < n; i++)
    for (size_t f = 0; f < free.size(); f++)
      if (!taken[f] && free[f] == int(pass[i]->cpu)) {
        core_of[i] = free[f];
        taken[f] = true;
        break;
      }
  for (size_t i = 0; i < n; i++)
    for (size_t f = 0; f < free.size() && core_of[i] < 0; f++)
      if (!taken[f]) {
        core_of[i] = free[f];
        taken[f] = true;
      }
  for (size_t i = 0; i < pass.size(); i++)
    apply(*pass[i], i < n ? Applied{SCHED_OTHER, nice, pass[i]->slice_ns, {core_of[i]}}
                          : Applied{SCHED_IDLE, 0, 0, allowed});

  // Wake-ahead. A thread that wakes runs under the attributes it blocked with, long before
  // this agent hears of the wakeup; the sched_ext backend preempts a worse thread at once
  // (a kick), so this one readies a blocked thread that would win its core if it woke now:
  // SCHED_OTHER, its policy's slice (EEVDF lets a waking thread with a shorter slice than
  // the running one's preempt it), pinned where it would run. A blocked thread that would
  // lose is left as it is (demoting it would cost system calls on every change of the
  // chosen thread; the agent demotes it on its wakeup if it still loses then).
  const uint64_t kNone = ~0ULL;
  uint64_t pass_bar = pass.size() < free.size() ? kNone : (n > 0 ? pass[n - 1]->key : 0);
  for (auto& [tid, t] : thr_) {
    if (t.st != St::kBlocked) continue;
    uint32_t c = t.core;
    bool bound = own_core(c);
    uint64_t bar = bound ? (chosen[c] ? chosen[c]->key : kNone) : pass_bar;
    if (bar != kNone && t.key >= bar) continue;
    std::vector<int> cpus = bound ? std::vector<int>{int(c)} : (t.applied.cpus.empty() ? allowed : t.applied.cpus);
    apply(t, Applied{SCHED_OTHER, nice, t.slice_ns, cpus});
  }
}

void Agent::restore_all() {
  for (auto& [tid, t] : thr_)
    if (t.applied.policy >= 0) restore_thread(tid, o_.baseline);
}

void Agent::heartbeat(uint64_t now) {
  if (o_.heartbeat_fd < 0 || now - last_hb_ < 50'000'000) return;
  last_hb_ = now;
  char c = 'h';
  ssize_t w = write(o_.heartbeat_fd, &c, 1);
  (void)w;
}

void Agent::report() {
  std::sort(wake_lat_.begin(), wake_lat_.end());
  auto pct = [&](double p) {
    return wake_lat_.empty() ? 0ull : (unsigned long long)wake_lat_[std::min(wake_lat_.size() - 1, size_t(p * wake_lat_.size()))];
  };
  double secs = double(mono_ns() - start_ns_) / 1e9;
  std::fprintf(stderr,
               "syrup-agent: tgid %d: %.1f s, %llu events, %llu policy runs, %llu decisions (%.0f/s; %.0f ns per "
               "run of %.1f threads), %llu sched syscalls; wakeup->running ns p50 %llu p90 %llu p99 %llu "
               "p99.9 %llu max %llu (n=%zu)\n",
               o_.tgid, secs, (unsigned long long)n_events_, (unsigned long long)n_runs_,
               (unsigned long long)n_decisions_, secs > 0 ? double(n_decisions_) / secs : 0.0,
               n_runs_ ? double(run_ns_total_) / double(n_runs_) : 0.0,
               n_runs_ ? double(n_decisions_) / double(n_runs_) : 0.0, (unsigned long long)n_syscalls_, pct(0.5),
               pct(0.9), pct(0.99), pct(0.999), wake_lat_.empty() ? 0ull : (unsigned long long)wake_lat_.back(),
               wake_lat_.size());
}

int Agent::run() {
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGTERM);
  sigaddset(&mask, SIGINT);
  sigaddset(&mask, SIGUSR1);
  sigprocmask(SIG_BLOCK, &mask, nullptr);
  int sfd = signalfd(-1, &mask, SFD_CLOEXEC);
  // Off the application's cores if syrupd was told so (--agent_cpus): the agent's work
  // for every wakeup then does not take their time.
  if (!o_.agent_cpus.empty()) {
    if (int r = set_cpus(0, o_.agent_cpus)) {
      std::fprintf(stderr, "syrup-agent: cannot run on CPUs %s: %s\n", cpus_to_string(o_.agent_cpus).c_str(),
                   std::strerror(-r));
      return 1;
    }
  }
  if (setup()) return 1;
  // By cgroup the policy outlives any one process (syrupd ends it with its owner or the
  // cgroup): the agent does not stop when the owner exits.
  int pidfd = by_cgroup() ? -1 : static_cast<int>(syscall(SYS_pidfd_open, o_.tgid, 0));
  int ep = epoll_create1(EPOLL_CLOEXEC);
  for (int fd : {ring_buffer__epoll_fd(rb_), sfd, pidfd}) {
    if (fd < 0) continue;
    epoll_event ev{EPOLLIN, {.fd = fd}};
    epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
  }
  refresh_registrations();
  if (o_.ready_fd >= 0) {
    char c = 'r';
    ssize_t w = write(o_.ready_fd, &c, 1);
    (void)w;
    close(o_.ready_fd);
  }
  const uint64_t period = uint64_t(o_.period_us) * 1000;
  uint64_t next_tick = mono_ns();
  bool restore = true;
  int code = 0;
  for (;;) {
    uint64_t now = mono_ns();
    int timeout_ms = next_tick > now ? int((next_tick - now + 999'999) / 1'000'000) : 0;
    epoll_event evs[4];
    int n = epoll_wait(ep, evs, 4, timeout_ms);
    bool stop = false;
    for (int i = 0; i < n; i++) {
      if (evs[i].data.fd == sfd) {
        signalfd_siginfo si;
        if (read(sfd, &si, sizeof si) == sizeof si) {
          stop = true;
          if (si.ssi_signo == SIGUSR1) restore = false;  // hand-over to a replacement agent
        }
      } else if (evs[i].data.fd == pidfd) {
        stop = true;  // the scheduled process exited
        restore = false;
      }
    }
    ring_buffer__consume(rb_);
    if (stop) break;
    now = mono_ns();
    bool tick = now >= next_tick;
    if (tick) {
      next_tick = now + period;
      if (now - last_refresh_ >= 20'000'000) {  // registrations: every 20 ms
        last_refresh_ = now;
        refresh_registrations();
      }
    }
    if (tick || dirty_) {
      decide(now);
      reconcile();
      dirty_ = false;
    }
    heartbeat(now);
  }
  if (restore) restore_all();
  report();
  return code;
}

}  // namespace

int run_agent(const AgentOptions& o) {
  Agent a(o);
  return a.run();
}

}  // namespace syrup::thread
