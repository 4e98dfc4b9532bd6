// The thread hook's sched_ext backend (scx_hook.h): the root scheduler (ScxBackend), one
// process's slot in it (ScxTarget), and the hook.
#include "scx_hook.h"

#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <fstream>
#include <map>
#include <mutex>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "log.h"
#include "pins.h"
#include "recorder.h"
#include "syrup/abi.h"
#include "thread_util.h"
#include "unique_fd.h"

namespace syrup::thread {
namespace {

using nlohmann::json;

constexpr int kSchedExt = 7;
// enum bpf_attach_type's BPF_STRUCT_OPS (uapi, since 6.4; Debian 12's headers are older).
constexpr int kAttachStructOps = 44;
constexpr int kMaxApps = 64;  // SYR_SCX_MAX_APPS
constexpr uint32_t kResume = kMaxApps;
// The monitor's period: kSyncMs for kBusyMs after anything changed (a deploy, a thread
// switched in or out, an ejection), then kIdleSyncMs. Every turn wakes syrupd in the fair
// class, which preempts whatever SCHED_EXT thread runs on that core: at a fixed 10 ms that
// was most of the preemptions left inside cs_aware's critical sections (bench/thread).
// SYRUP_SCX_SYNC_MS=N fixes the period at N ms.
constexpr int kSyncMs = 10;
constexpr int kIdleSyncMs = 250;
constexpr uint64_t kBusyMs = 1000;
constexpr int kMaxEjections = 3;  // per minute, then give up

// Mirrors of scx_common.h.
struct ExitRec {
  int32_t kind, exit_cpu;
  int64_t exit_code;
  uint32_t blamed_slot, seq;
  char reason[128];
  char msg[256];
  uint32_t bt_len, pad;
  uint64_t bt[32];  // SYR_SCX_EXIT_BT
};
struct Conf {
  uint64_t active, min_vtime;
};
struct CgSlot {  // struct syr_scx_cg
  uint32_t slot, uid;
};

// The root's struct_ops image as libbpf holds it before load (thread/scx_root.bpf.c's
// struct sched_ext_ops: nine callbacks, flags, timeout_ms, name).
struct RootOps {
  uint64_t callbacks[9];
  uint64_t flags;
  uint32_t timeout_ms;
  char name[128];
};

const char* kSharedMaps[] = {"syr_scx_tasks", "syr_scx_cpus", "syr_scx_round", "syr_scx_procs", "syr_scx_disp",
                             "syr_scx_cgroups"};
// Every map of the root, pinned under <root>/thread_scx/ with its link (so the scheduler
// outlives syrupd, and a restarted syrupd adopts it); syr_root_ops is the struct_ops map
// itself, from which an adopted root is attached again after an ejection.
const char* kRootMaps[] = {"syr_scx_tasks", "syr_scx_cpus", "syr_scx_round", "syr_scx_procs", "syr_scx_disp",
                           "syr_scx_enq",   "syr_scx_sel",  "syr_scx_conf", "syr_scx_exit",  "syr_scx_apps",
                           "syr_scx_threads", "syr_root_ops",
                           "syr_scx_cgroups"};
// The root's exit tracepoint (syr_root_on_exit): its link is pinned beside the
// scheduler's, as exit_link, and lives while the scheduler is attached.
constexpr const char* kExitProg = "syr_root_on_exit";

uint64_t env_u64(const char* name, uint64_t dflt) {
  const char* v = std::getenv(name);
  if (!v || !*v) return dflt;
  char* end = nullptr;
  unsigned long long x = std::strtoull(v, &end, 10);
  return end && *end == 0 ? x : dflt;
}

std::string sched_ext_state() {
  std::ifstream in("/sys/kernel/sched_ext/state");
  std::string s;
  std::getline(in, s);
  return s.empty() ? "unknown" : s;
}

// The process a thread belongs to, or -1.
pid_t tgid_of(pid_t tid) {
  std::ifstream in("/proc/" + std::to_string(tid) + "/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("Tgid:", 0) == 0) return std::atoi(line.c_str() + 5);
  return -1;
}

std::string exit_kind_name(int k) {
  switch (k) {
    case 1: return "done";
    case 64: return "unregistered";
    case 65: return "unregistered (BPF)";
    case 66: return "unregistered (kernel)";
    case 67: return "sysrq";
    case 1024: return "runtime error";
    case 1025: return "error raised by BPF";
    case 1026: return "watchdog stall";
  }
  return "kind " + std::to_string(k);
}

// The wrapper's programs (LoadSpec::programs).
std::vector<std::string> scx_programs() { return {"syr_app_enqueue", "syr_app_dispatch", "syr_app_select"}; }

}  // namespace

class ScxTarget;

class ScxBackend {
 public:
  explicit ScxBackend(Compiler& c) : compiler_(c) {
    timeout_ms_ = static_cast<uint32_t>(std::min<uint64_t>(env_u64("SYRUP_SCX_TIMEOUT_MS", 30000), 30000));
    starve_ns_ = env_u64("SYRUP_SCX_STARVE_MS", 1000) * 1000000ull;
    direct_ = env_u64("SYRUP_SCX_DIRECT", 1) != 0;
  }
  ~ScxBackend() {
    stop_monitor();
    std::lock_guard lk(mu_);
    // Leaving the policies to the next syrupd: closing our fd leaves the pinned link,
    // and the scheduler, attached.
    if (!leaving_) detach_locked();
    link_.reset();
    if (obj_) bpf_object__close(obj_);
  }
  void leave() {
    std::lock_guard lk(mu_);
    leaving_ = true;
  }
  bool leaving() const { return leaving_; }
  int adopt_root(std::string& err);
  // After adoption: slots the root still has but no adopted policy owns are cleared; a
  // root nothing was adopted into is detached and unpinned.
  void recover();
  bool adopt_slot(int slot) {
    std::lock_guard lk(mu_);
    if (slot < 0 || slot >= kMaxApps || used_[slot]) return false;
    used_[slot] = true;
    return true;
  }

  int ensure_root(std::string& err);
  int attach_locked(std::string& err);
  void detach_locked();
  void release_if_unused_locked() {
    for (bool u : used_)
      if (u) return;
    detach_locked();
  }

  int alloc_slot_locked() {
    for (int i = 0; i < kMaxApps; i++)
      if (!used_[i]) {
        used_[i] = true;
        return i;
      }
    return -ENOSPC;
  }
  void free_slot_locked(int s) {
    if (s >= 0 && s < kMaxApps) used_[s] = false;
  }
  // Slot s's entries in the root's per-slot arrays (its programs, its syrup_threads).
  void clear_slot_locked(uint32_t s) {
    for (const char* m : {"syr_scx_sel", "syr_scx_enq", "syr_scx_disp", "syr_scx_threads"})
      bpf_map_delete_elem(map_fd(m), &s);
  }
  void set_active_locked(int slot, bool on) {
    uint32_t z = 0;
    Conf c{};
    bpf_map_lookup_elem(map_fd("syr_scx_conf"), &z, &c);
    if (on) c.active |= 1ull << slot;
    else c.active &= ~(1ull << slot);
    bpf_map_update_elem(map_fd("syr_scx_conf"), &z, &c, 0);
  }
  uint64_t vtime_locked(int slot) const {
    uint32_t k = static_cast<uint32_t>(slot);
    uint64_t v = 0;
    bpf_map_lookup_elem(map_fd("syr_scx_apps"), &k, &v);
    return v;
  }
  void reset_vtime_locked(int slot) {
    uint32_t z = 0, k = static_cast<uint32_t>(slot);
    Conf c{};
    bpf_map_lookup_elem(map_fd("syr_scx_conf"), &z, &c);
    uint64_t v = c.min_vtime;
    bpf_map_update_elem(map_fd("syr_scx_apps"), &k, &v, 0);
  }
  int map_fd(const char* name) const {
    auto it = fds_.find(name);
    return it == fds_.end() ? -ENOENT : it->second.get();
  }
  uint64_t starve_ns() const { return starve_ns_; }
  bool direct() const { return direct_; }
  void busy_locked() { busy_until_ms_ = now_ms() + kBusyMs; }
  void add(ScxTarget* t) {
    std::lock_guard lk(mu_);
    targets_.insert(t);
  }
  void remove(ScxTarget* t) {
    std::lock_guard lk(mu_);
    targets_.erase(t);
  }
  std::mutex& mu() { return mu_; }
  json scheduler_locked() const {
    json ej = json::array();
    for (auto& e : ejections_) ej.push_back(e);
    return {{"state", sched_ext_state()}, {"attached", static_cast<bool>(link_)}, {"adopted", adopted_},
            {"ops", "syrup"},
            {"watchdog_ms", timeout_ms_}, {"starvation_guard_ms", starve_ns_ / 1000000},
            {"direct_wakeups", direct_},
            {"ejections", ej}};
  }

 private:
  void start_monitor();
  void stop_monitor();
  void monitor();
  void handle_exit_locked(const ExitRec& r);
  int slot_in_backtrace_locked(const ExitRec& r);

  void pin_locked();
  void unpin_locked();

  Compiler& compiler_;
  std::mutex mu_;
  bpf_object* obj_ = nullptr;  // null when adopted from the pins
  bool adopted_ = false;
  bool leaving_ = false;       // syrupd exits keeping the policies
  std::map<std::string, UniqueFd> fds_;  // kRootMaps, by name
  UniqueFd link_;              // the struct_ops link (also pinned while attached)
  UniqueFd exit_prog_;         // syr_root_on_exit, loaded or adopted (from exit_link's info)
  UniqueFd exit_link_;         // its tracepoint link (pinned as exit_link while attached)
  uint32_t timeout_ms_ = 30000;
  uint64_t starve_ns_ = 1000000000ull;
  bool direct_ = true;  // the wakeup direct path (scx_wrapper.bpf.h); SYRUP_SCX_DIRECT=0 for A/B
  bool used_[kMaxApps] = {};
  std::set<ScxTarget*> targets_;
  uint32_t exit_seq_ = 0;
  uint64_t busy_until_ms_ = 0;
  std::deque<json> ejections_;
  std::deque<uint64_t> ejection_times_;
  std::thread monitor_;
  UniqueFd stop_efd_;
};

// ---- Target -------------------------------------------------------------------------

class ScxTarget : public Target {
 public:
  ScxTarget(std::shared_ptr<ScxBackend> b, pid_t tgid, bool all, Baseline base, CgroupScope cg = {})
      : hold_(std::move(b)), b_(*hold_), tgid_(tgid), all_(all), baseline_(std::move(base)), cg_(std::move(cg)) {
    long n = sysconf(_SC_NPROCESSORS_CONF);
    ncpu_ = n > 0 ? static_cast<uint32_t>(n) : 1;
    b_.add(this);
  }
  ~ScxTarget() override {
    b_.remove(this);
    std::lock_guard lk(b_.mu());
    if (b_.leaving()) return;  // syrupd exits keeping its policies: the slot stays as it is
    if (active_ && !handed_over_) deactivate_locked(true);
    else if (owns_slot_) b_.free_slot_locked(slot_);  // a deploy that failed after prepare_load
  }

  std::string key() const override {
    return cg_.id ? "thread:cgroup:" + std::to_string(cg_.id) : "thread:" + std::to_string(tgid_);
  }
  uint32_t num_executors() const override { return ncpu_; }
  // By cgroup: the policy ends when the cgroup is removed, which tells no one.
  std::string gone() const override { return cg_.removed(); }
  bool ends_unannounced() const override { return cg_.id != 0; }

  int prepare_load(LoadSpec& spec, const Target* old, const LoadedPolicy*) override {
    std::lock_guard lk(b_.mu());
    auto* prev = static_cast<const ScxTarget*>(old);
    if (slot_ < 0) {
      if (prev && prev->slot_ >= 0 && prev->active()) {
        slot_ = prev->slot_;  // a replacement takes over the slot when installed
      } else {
        slot_ = b_.alloc_slot_locked();
        owns_slot_ = slot_ >= 0;
      }
    }
    if (slot_ < 0) return -ENOSPC;
    spec.params["syr_scx_slot"] = static_cast<uint64_t>(slot_);
    spec.params["syr_scx_starve_ns"] = b_.starve_ns();
    spec.params["syr_scx_direct_on"] = static_cast<uint64_t>(b_.direct());
    for (const char* m : kSharedMaps) spec.reuse_maps[m] = b_.map_fd(m);
    spec.programs = scx_programs();
    return 0;
  }

  int install(LoadedPolicy& p, const Target* old, std::string& err) override {
    std::lock_guard lk(b_.mu());
    auto* prev = const_cast<ScxTarget*>(static_cast<const ScxTarget*>(old));
    if (slot_ < 0) {
      err = "no free application slot in the sched_ext scheduler (" + std::to_string(kMaxApps) + " in use)";
      return -ENOSPC;
    }
    threads_fd_.reset(dup(p.map_fd("syrup_threads")));
    bpf_program* enq = bpf_object__find_program_by_name(p.obj, "syr_app_enqueue");
    bpf_program* disp = bpf_object__find_program_by_name(p.obj, "syr_app_dispatch");
    bpf_program* sel = bpf_object__find_program_by_name(p.obj, "syr_app_select");
    if (!threads_fd_ || !enq || !disp || !sel) {
      err = "the compiled thread policy lacks the sched_ext wrapper's programs or syrup_threads";
      return -EINVAL;
    }
    uint32_t slot = static_cast<uint32_t>(slot_), tgid = static_cast<uint32_t>(tgid_);
    int efd = bpf_program__fd(enq), dfd = bpf_program__fd(disp), sfd = bpf_program__fd(sel);
    int tfd = threads_fd_.get();
    // The registrations its exit tracepoint keeps (the application's map: a replacement
    // gives the same one).
    if (bpf_map_update_elem(b_.map_fd("syr_scx_threads"), &slot, &tfd, 0) < 0) {
      int e = errno;
      err = "cannot give the root scheduler the application's syrup_threads: " + std::string(std::strerror(e));
      return -e;
    }
    // The swap: enqueue first, then dispatch; both programs of either version work on
    // the same slot's queue, so every thread sees the old or the new policy.
    if (bpf_map_update_elem(b_.map_fd("syr_scx_enq"), &slot, &efd, 0) < 0 ||
        bpf_map_update_elem(b_.map_fd("syr_scx_disp"), &slot, &dfd, 0) < 0 ||
        bpf_map_update_elem(b_.map_fd("syr_scx_sel"), &slot, &sfd, 0) < 0) {
      int e = errno;
      err = "cannot install the policy in slot " + std::to_string(slot) + ": " + std::strerror(e);
      if (prev && prev->active_) {
        int pe = prev->enq_fd_, pd = prev->disp_fd_, ps = prev->sel_fd_;
        bpf_map_update_elem(b_.map_fd("syr_scx_enq"), &slot, &pe, 0);
        bpf_map_update_elem(b_.map_fd("syr_scx_disp"), &slot, &pd, 0);
        bpf_map_update_elem(b_.map_fd("syr_scx_sel"), &slot, &ps, 0);
      } else {
        clear_slot_locked();
      }
      return -e;
    }
    enq_fd_ = efd;
    disp_fd_ = dfd;
    sel_fd_ = sfd;
    if (!prev) b_.reset_vtime_locked(slot_);  // a new application starts level with the others
    map_target_locked(true);
    b_.set_active_locked(slot_, true);
    if (int r = b_.attach_locked(err)) {
      if (!prev) {
        map_target_locked(false);
        b_.set_active_locked(slot_, false);
        clear_slot_locked();
      }
      return r;
    }
    if (prev) {
      // The old policy's threads are ours now, already SCHED_EXT.
      switched_ = prev->switched_;
      next_exec_ = prev->next_exec_;
      prev->handed_over_ = true;
      prev->active_ = false;
      prev->owns_slot_ = false;
    }
    owns_slot_ = true;
    active_ = true;
    status_ = "running";
    sync_locked();  // registered threads run under the policy when deploy returns
    b_.busy_locked();  // threads that register next are picked up within kSyncMs
    log(LogLevel::kInfo, "sched_ext: %s scheduled by policy %d in slot %d%s",
        cg_.id ? ("cgroup " + cg_.path + " (uid " + std::to_string(cg_.uid) + "'s processes)").c_str()
               : ("process " + std::to_string(tgid_)).c_str(),
        p.policy_id, slot_, prev ? " (replaced its previous policy)" : "");
    return 0;
  }

  void uninstall(LoadedPolicy&) override {
    std::lock_guard lk(b_.mu());
    if (active_) deactivate_locked(true);
  }

  // What a restarted syrupd needs to take the slot over (ThreadScxHook::adopt).
  json save() const override {
    std::lock_guard lk(b_.mu());
    if (!active_) return nullptr;
    json j = {{"backend", "sched_ext"}, {"pid", tgid_}, {"slot", slot_}, {"all_threads", all_},
              {"next_exec", next_exec_}, {"baseline", baseline_to_json(baseline_)}};
    cg_.save(j);
    return j;
  }

  // Rebuilds the target of a policy a previous syrupd installed in slot `slot` of the
  // adopted root: the kernel state (the slot's programs, syr_scx_procs, the threads'
  // SCHED_EXT class) is left exactly as it is.
  int adopt_locked(const json& saved, LoadedPolicy& p, std::string& err) {
    slot_ = saved.value("slot", -1);
    next_exec_ = saved.value("next_exec", 0u);
    uint32_t slot = static_cast<uint32_t>(slot_), id = 0;
    if (mapped_slot_locked() != slot) {
      err = "the root scheduler no longer maps " + (cg_.id ? "cgroup " + cg_.path : "process " + std::to_string(tgid_)) +
            " to slot " + std::to_string(slot_);
      return -ENOENT;
    }
    // The programs in the slot (a prog array's lookup gives their ids), for a rollback
    // should a replacement fail to install.
    if (bpf_map_lookup_elem(b_.map_fd("syr_scx_enq"), &slot, &id) == 0) enq_own_.reset(bpf_prog_get_fd_by_id(id));
    if (bpf_map_lookup_elem(b_.map_fd("syr_scx_disp"), &slot, &id) == 0) disp_own_.reset(bpf_prog_get_fd_by_id(id));
    if (bpf_map_lookup_elem(b_.map_fd("syr_scx_sel"), &slot, &id) == 0) sel_own_.reset(bpf_prog_get_fd_by_id(id));
    if (!enq_own_ || !disp_own_) {
      err = "slot " + std::to_string(slot_) + " of the root scheduler has no programs";
      return -ENOENT;
    }
    enq_fd_ = enq_own_.get();
    disp_fd_ = disp_own_.get();
    sel_fd_ = sel_own_.get();
    threads_fd_.reset(dup(p.map_fd("syrup_threads")));
    if (!threads_fd_) {
      err = "its syrup_threads map was not adopted";
      return -EINVAL;
    }
    for (pid_t t : scheduled_tids()) {
      uint32_t k = static_cast<uint32_t>(t), e;
      if (bpf_map_lookup_elem(threads_fd_.get(), &k, &e) == 0 && sched_getscheduler(t) == kSchedExt)
        switched_.insert(t);
    }
    owns_slot_ = true;
    active_ = true;
    status_ = "running (adopted from a previous syrupd)";
    return 0;
  }

  json describe() const override {
    std::lock_guard lk(b_.mu());
    json j = {{"backend", "sched_ext"}, {"pid", tgid_}, {"slot", slot_}, {"all_threads", all_},
              {"status", status_}, {"threads", switched_.size()}, {"scheduler", b_.scheduler_locked()}};
    if (cg_.id) j["cgroup"] = cg_.path, j["uid"] = cg_.uid;
    if (active_ && slot_ >= 0) j["vtime_ms"] = b_.vtime_locked(slot_) / 1000000;
    return j;
  }

  // Under the backend's lock: switch registered threads to SCHED_EXT, others back.
  // Returns whether it switched any thread in or out.
  bool sync_locked() {
    if (!active_ || handed_over_ || !threads_fd_) return false;
    std::vector<pid_t> tids = scheduled_tids();
    // The process is gone (its owner's exit removes the policy); a cgroup may be empty
    // for a while, and threads that left it are restored below.
    if (tids.empty() && !cg_.id) return false;
    std::set<pid_t> alive(tids.begin(), tids.end());
    if (all_)
      for (pid_t tid : tids) {
        uint32_t k = static_cast<uint32_t>(tid), v;
        if (bpf_map_lookup_elem(threads_fd_.get(), &k, &v) == 0) continue;
        v = next_exec_++;
        bpf_map_update_elem(threads_fd_.get(), &k, &v, BPF_NOEXIST);
      }
    std::set<pid_t> reg;
    std::vector<pid_t> not_ours;
    uint32_t key, next;
    bool first = true;
    while (bpf_map_get_next_key(threads_fd_.get(), first ? nullptr : &key, &next) == 0) {
      first = false;
      key = next;
      pid_t t = static_cast<pid_t>(key);
      if (alive.count(t))
        reg.insert(t);
      else
        not_ours.push_back(t);  // exited (dropped), or another process's thread (ignored)
    }
    if (cg_.id)  // by cgroup: a thread outside it (or not its user's) is no longer registered
      for (pid_t t : not_ours) {
        uint32_t k = static_cast<uint32_t>(t);
        bpf_map_delete_elem(threads_fd_.get(), &k);
      }
    else
      drop_exited_registrations(threads_fd_.get(), not_ours);
    bool changed = false;
    for (pid_t t : reg) {
      // Asked, not remembered: a tid switched in may now be another thread's, given an
      // exited one's tid and registered before this scan (the root's exit tracepoint
      // dropped the old registration), and not SCHED_EXT.
      if (switched_.count(t) && sched_getscheduler(t) == kSchedExt) continue;
      if (set_policy(t, kSchedExt, baseline_.nice) == 0) switched_.insert(t), changed = true;
      else switched_.erase(t);
    }
    for (auto it = switched_.begin(); it != switched_.end();) {
      if (!alive.count(*it)) {
        if (cg_.id) restore(*it);  // moved out of the cgroup (or exited: ESRCH, nothing done)
        it = switched_.erase(it);
      } else if (!reg.count(*it)) {
        restore(*it);
        it = switched_.erase(it);
        changed = true;
      } else {
        ++it;
      }
    }
    return changed;
  }

  // Under the lock: out of the scheduler (threads restored, slot freed).
  void deactivate_locked(bool free_slot) {
    map_target_locked(false);
    if (slot_ >= 0) {
      b_.set_active_locked(slot_, false);
      clear_slot_locked();
    }
    for (pid_t t : switched_) restore(t);
    switched_.clear();
    active_ = false;
    if (free_slot && owns_slot_) {
      b_.free_slot_locked(slot_);
      owns_slot_ = false;
      slot_ = -1;
      b_.release_if_unused_locked();
    }
  }

  pid_t tgid() const { return tgid_; }
  int slot() const { return slot_; }
  bool active() const { return active_ && !handed_over_; }
  void set_status(std::string s) { status_ = std::move(s); }

 private:
  // The threads the policy may schedule: its process's, or by cgroup those of the owner's
  // uid in the cgroup.
  std::vector<pid_t> scheduled_tids() const { return cg_.id ? cg_.threads() : list_tids(tgid_); }

  // The root's lookup of this target's threads (syr_scx_slot_of): its process in
  // syr_scx_procs, or its cgroup and uid in syr_scx_cgroups; in (`on`) or out.
  void map_target_locked(bool on) {
    uint32_t slot = static_cast<uint32_t>(slot_), tgid = static_cast<uint32_t>(tgid_);
    uint64_t id = cg_.id;
    CgSlot v{slot, cg_.uid};
    if (cg_.id && on) bpf_map_update_elem(b_.map_fd("syr_scx_cgroups"), &id, &v, 0);
    else if (cg_.id) bpf_map_delete_elem(b_.map_fd("syr_scx_cgroups"), &id);
    else if (on) bpf_map_update_elem(b_.map_fd("syr_scx_procs"), &tgid, &slot, 0);
    else bpf_map_delete_elem(b_.map_fd("syr_scx_procs"), &tgid);
  }

  // The slot the root maps this target to, or ~0u.
  uint32_t mapped_slot_locked() const {
    uint32_t tgid = static_cast<uint32_t>(tgid_), v = ~0u;
    uint64_t id = cg_.id;
    CgSlot c{~0u, 0};
    if (cg_.id) return bpf_map_lookup_elem(b_.map_fd("syr_scx_cgroups"), &id, &c) == 0 ? c.slot : ~0u;
    return bpf_map_lookup_elem(b_.map_fd("syr_scx_procs"), &tgid, &v) == 0 ? v : ~0u;
  }

  // The slot's programs and registration map out of the root's arrays.
  void clear_slot_locked() { b_.clear_slot_locked(static_cast<uint32_t>(slot_)); }

  void restore(pid_t tid) {
    int pol = baseline_.policy == SCHED_BATCH ? SCHED_BATCH : SCHED_OTHER;
    set_policy(tid, pol, baseline_.nice);
  }

  std::shared_ptr<ScxBackend> hold_;
  ScxBackend& b_;
  pid_t tgid_;
  bool all_;
  Baseline baseline_;
  uint32_t ncpu_ = 1;
  int slot_ = -1;
  bool owns_slot_ = false;
  bool active_ = false, handed_over_ = false;
  int enq_fd_ = -1, disp_fd_ = -1, sel_fd_ = -1;
  UniqueFd enq_own_, disp_own_, sel_own_;  // adopted: the slot's programs (installed by a previous syrupd)
  UniqueFd threads_fd_;
  std::set<pid_t> switched_;
  uint32_t next_exec_ = 0;
  std::string status_ = "new";
  CgroupScope cg_;  // deployed by cgroup (cg_.id != 0)
};

// ---- Backend ------------------------------------------------------------------------

int ScxBackend::ensure_root(std::string& err) {
  std::lock_guard lk(mu_);
  if (obj_ || adopted_) return 0;
  std::string object_path;
  if (int e = compiler_.compile_own("thread/scx_root.bpf.c", "the sched_ext root scheduler", object_path, err))
    return e;
  LIBBPF_OPTS(bpf_object_open_opts, oo, .object_name = "syr_scx_root");
  bpf_object* obj = bpf_object__open_file(object_path.c_str(), &oo);
  if (!obj) {
    int e = -errno;
    err = "cannot open the sched_ext root scheduler: " + std::string(std::strerror(-e));
    return e;
  }
  bpf_map* ops = bpf_object__find_map_by_name(obj, "syr_root_ops");
  size_t sz = 0;
  auto* img = ops ? static_cast<RootOps*>(bpf_map__initial_value(ops, &sz)) : nullptr;
  if (!img || sz < sizeof(RootOps)) {
    bpf_object__close(obj);
    err = "the sched_ext root scheduler has no syr_root_ops of the expected layout";
    return -EINVAL;
  }
  bpf_program* exit_prog = bpf_object__find_program_by_name(obj, kExitProg);
  if (!exit_prog) {
    bpf_object__close(obj);
    err = std::string("the sched_ext root scheduler has no ") + kExitProg;
    return -EINVAL;
  }
  img->timeout_ms = timeout_ms_;
  if (int r = bpf_object__load(obj)) {
    bpf_object__close(obj);
    err = "cannot load the sched_ext root scheduler (is this kernel's sched_ext supported?): " +
          std::string(std::strerror(-r));
    return r;
  }
  obj_ = obj;
  for (const char* m : kRootMaps)
    if (bpf_map* bm = bpf_object__find_map_by_name(obj_, m)) fds_[m].reset(dup(bpf_map__fd(bm)));
  uint32_t resume = kResume;
  int rfd = bpf_program__fd(bpf_object__find_program_by_name(obj_, "syr_root_dispatch"));
  if (bpf_map_update_elem(map_fd("syr_scx_disp"), &resume, &rfd, 0) < 0) {
    int e = errno;
    bpf_object__close(obj_);
    obj_ = nullptr;
    fds_.clear();
    err = "cannot set up the sched_ext root's dispatch chain: " + std::string(std::strerror(e));
    return -e;
  }
  exit_prog_.reset(dup(bpf_program__fd(exit_prog)));
  uint32_t z = 0;
  ExitRec rec{};
  bpf_map_lookup_elem(map_fd("syr_scx_exit"), &z, &rec);
  exit_seq_ = rec.seq;
  start_monitor();
  log(LogLevel::kInfo, "sched_ext: root scheduler loaded (watchdog %u ms, starvation guard %llu ms)", timeout_ms_,
      static_cast<unsigned long long>(starve_ns_ / 1000000));
  return 0;
}

int ScxBackend::attach_locked(std::string& err) {
  if (link_) return 0;
  // The exit tracepoint first: registrations must not outlive their threads once the
  // scheduler runs them. It stays across an ejection (only the struct_ops link goes).
  bool new_tracer = !exit_link_;
  if (new_tracer) {
    exit_link_.reset(bpf_raw_tracepoint_open(nullptr, exit_prog_.get()));
    if (!exit_link_) {
      int e = errno;
      err = "cannot attach the sched_ext root's exit tracepoint (sched_process_exit): " +
            std::string(std::strerror(e));
      return -e;
    }
  }
  std::string st = sched_ext_state();
  int fd = -1, e = 0;
  if (obj_) {
    // libbpf writes the struct_ops image into the map (once; later attaches skip that)
    // and creates the link; we keep a dup of the link's fd, libbpf's handle goes.
    bpf_link* l = bpf_map__attach_struct_ops(bpf_object__find_map_by_name(obj_, "syr_root_ops"));
    if (l) {
      fd = dup(bpf_link__fd(l));
      if (fd < 0) e = errno;
      bpf_link__destroy(l);  // closes libbpf's fd only: ours keeps the link
    } else {
      e = errno;
    }
  } else {
    // Adopted: the struct_ops map already holds its image; a new link attaches it again.
    fd = bpf_link_create(map_fd("syr_root_ops"), 0, static_cast<bpf_attach_type>(kAttachStructOps), nullptr);
    if (fd < 0) e = -fd;
  }
  if (fd < 0) {
    err = "cannot attach the sched_ext scheduler: " + std::string(std::strerror(e)) +
          (st == "enabled" ? " (another sched_ext scheduler is running: only one can be)" : "");
    if (new_tracer) exit_link_.reset();
    return -e;
  }
  link_.reset(fd);
  pin_locked();
  log(LogLevel::kInfo, "sched_ext: root scheduler 'syrup' attached (partial mode: only registered threads)");
  return 0;
}

// The link and the maps in bpffs: the scheduler stays attached if syrupd dies, and the
// next syrupd finds it. A failure is logged, not fatal: the scheduler then ends with
// syrupd, as it did before pinning existed.
void ScxBackend::pin_locked() {
  if (int r = pins::make_dirs(pins::thread_scx_dir())) {
    log(LogLevel::kWarn, "sched_ext: cannot create %s: %s", pins::thread_scx_dir().c_str(), std::strerror(-r));
    return;
  }
  auto pin = [](int fd, const std::string& path) {
    unlink(path.c_str());
    if (bpf_obj_pin(fd, path.c_str()) < 0)
      log(LogLevel::kWarn, "sched_ext: cannot pin %s: %s (the scheduler will not survive syrupd)", path.c_str(),
          std::strerror(errno));
  };
  for (auto& [name, fd] : fds_) pin(fd.get(), pins::thread_scx_obj(name));
  pin(exit_link_.get(), pins::thread_scx_obj("exit_link"));
  pin(link_.get(), pins::thread_scx_obj("link"));
}

void ScxBackend::unpin_locked() {
  unlink(pins::thread_scx_obj("link").c_str());
  unlink(pins::thread_scx_obj("exit_link").c_str());
  for (const char* m : kRootMaps) unlink(pins::thread_scx_obj(m).c_str());
  rmdir(pins::thread_scx_dir().c_str());
}

void ScxBackend::detach_locked() {
  unpin_locked();
  exit_link_.reset();
  if (!link_) return;
  link_.reset();
  log(LogLevel::kInfo, "sched_ext: root scheduler detached (no thread policy left)");
}

int ScxBackend::adopt_root(std::string& err) {
  std::lock_guard lk(mu_);
  if (obj_ || adopted_) return 0;
  UniqueFd link(bpf_obj_get(pins::thread_scx_obj("link").c_str()));
  if (!link) {
    err = "the sched_ext root scheduler a previous syrupd left is gone (no link pinned at " +
          pins::thread_scx_obj("link") + ")";
    return -ENOENT;
  }
  std::string st = sched_ext_state();
  if (st != "enabled") {
    // The kernel ejected it while nobody watched: the threads run in the fair class.
    err = "the sched_ext scheduler a previous syrupd left is not running (sched_ext state '" + st +
          "': the kernel ejected it while syrupd was down)";
    return -ENOENT;
  }
  std::map<std::string, UniqueFd> fds;
  for (const char* m : kRootMaps) {
    UniqueFd fd(bpf_obj_get(pins::thread_scx_obj(m).c_str()));
    if (!fd) {
      int e = errno;
      err = "the sched_ext root's map " + std::string(m) + " is not pinned: " + std::strerror(e);
      return -e;
    }
    fds[m] = std::move(fd);
  }
  // The exit tracepoint's link, and its program (for attaching it again after the last
  // policy went and a new one came).
  UniqueFd exit_link(bpf_obj_get(pins::thread_scx_obj("exit_link").c_str()));
  bpf_link_info li{};
  uint32_t len = sizeof li;
  UniqueFd exit_prog;
  if (exit_link && bpf_link_get_info_by_fd(exit_link.get(), &li, &len) == 0)
    exit_prog.reset(bpf_prog_get_fd_by_id(li.prog_id));
  if (!exit_prog) {
    int e = errno ? errno : ENOENT;
    err = "the sched_ext root's exit tracepoint is not pinned at " + pins::thread_scx_obj("exit_link") + ": " +
          std::strerror(e);
    return -e;
  }
  fds_ = std::move(fds);
  link_ = std::move(link);
  exit_link_ = std::move(exit_link);
  exit_prog_ = std::move(exit_prog);
  adopted_ = true;
  uint32_t z = 0;
  ExitRec rec{};
  bpf_map_lookup_elem(map_fd("syr_scx_exit"), &z, &rec);
  exit_seq_ = rec.seq;
  start_monitor();
  log(LogLevel::kInfo, "sched_ext: adopted the root scheduler a previous syrupd left attached");
  return 0;
}

void ScxBackend::start_monitor() {
  stop_efd_.reset(eventfd(0, EFD_CLOEXEC));
  monitor_ = signal_free_thread([this] { monitor(); });
}

void ScxBackend::stop_monitor() {
  if (!monitor_.joinable()) return;
  uint64_t one = 1;
  ssize_t w = write(stop_efd_.get(), &one, sizeof one);
  (void)w;
  monitor_.join();
}

void ScxBackend::monitor() {
  const int fixed = static_cast<int>(env_u64("SYRUP_SCX_SYNC_MS", 0));
  int period = kSyncMs;
  for (;;) {
    pollfd pf{stop_efd_.get(), POLLIN, 0};
    if (poll(&pf, 1, period) > 0) return;
    std::lock_guard lk(mu_);
    period = fixed > 0 ? fixed : now_ms() < busy_until_ms_ ? kSyncMs : kIdleSyncMs;
    uint32_t z = 0;
    ExitRec rec{};
    if (bpf_map_lookup_elem(map_fd("syr_scx_exit"), &z, &rec) == 0 && rec.seq != exit_seq_) {
      exit_seq_ = rec.seq;
      // 64/65: unregistered by user space -- our own detach (only syrupd holds the link).
      if (rec.kind != 64 && rec.kind != 65) handle_exit_locked(rec);
      busy_locked();
    }
    bool changed = false;
    for (ScxTarget* t : targets_) changed |= t->sync_locked();
    if (changed) busy_locked();
  }
}

// The slot whose program (enqueue, dispatch or select_cpu, any of their functions) holds
// a return address of the exit's backtrace, or -1.
int ScxBackend::slot_in_backtrace_locked(const ExitRec& r) {
  uint32_t n = std::min<uint32_t>(r.bt_len, sizeof r.bt / sizeof r.bt[0]);
  if (n == 0) return -1;
  for (ScxTarget* t : targets_) {
    if (!t->active() || t->slot() < 0) continue;
    uint32_t slot = static_cast<uint32_t>(t->slot());
    for (const char* arr : {"syr_scx_enq", "syr_scx_disp", "syr_scx_sel"}) {
      uint32_t id = 0;
      if (bpf_map_lookup_elem(map_fd(arr), &slot, &id) != 0) continue;
      UniqueFd fd(bpf_prog_get_fd_by_id(id));
      if (fd.get() < 0) continue;
      bpf_prog_info info{};
      uint32_t len = sizeof info;
      if (bpf_prog_get_info_by_fd(fd.get(), &info, &len) != 0 || info.nr_jited_ksyms == 0) continue;
      std::vector<uint64_t> addrs(info.nr_jited_ksyms);
      std::vector<uint32_t> lens(info.nr_jited_func_lens);
      uint32_t nk = info.nr_jited_ksyms, nl = info.nr_jited_func_lens;
      info = {};
      info.nr_jited_ksyms = nk;
      info.jited_ksyms = reinterpret_cast<uint64_t>(addrs.data());
      info.nr_jited_func_lens = nl;
      info.jited_func_lens = reinterpret_cast<uint64_t>(lens.data());
      len = sizeof info;
      if (bpf_prog_get_info_by_fd(fd.get(), &info, &len) != 0) continue;
      for (uint32_t f = 0; f < nk && f < nl; f++)
        for (uint32_t i = 0; i < n; i++)
          if (addrs[f] && r.bt[i] >= addrs[f] && r.bt[i] < addrs[f] + lens[f]) return t->slot();
    }
  }
  return -1;
}

void ScxBackend::handle_exit_locked(const ExitRec& r) {
  // The kernel's words go to the tenants (`list`, `stats`): without kernel addresses.
  std::string reason = scrub_kernel_addresses(std::string(r.reason, strnlen(r.reason, sizeof r.reason)));
  std::string msg = scrub_kernel_addresses(std::string(r.msg, strnlen(r.msg, sizeof r.msg)));
  std::string why = reason + (msg.empty() ? "" : ": " + msg);
  bool was_attached = static_cast<bool>(link_);
  if (link_) {
    unlink(pins::thread_scx_obj("link").c_str());
    link_.reset();
  }
  // Who is to blame: the process of a stalled thread ("comm[tid] failed to run ..."), or
  // the application program last run on the core that raised a runtime error.
  ScxTarget* culprit = nullptr;
  const char* blamed_by = "";
  if (r.kind == 1026) {
    blamed_by = "the stalled thread";
    static const std::regex kTid(R"(\[(\d+)\] failed to run)");
    std::smatch m;
    if (std::regex_search(msg, m, kTid)) {
      pid_t tg = tgid_of(std::atoi(m[1].str().c_str()));
      for (ScxTarget* t : targets_)
        if (t->active() && t->tgid() == tg) culprit = t;
    }
  } else if (r.kind >= 1024) {
    // Exact when the kernel's backtrace runs through an application's program; else the
    // program last run on the exit core (racy: others may have run there since).
    int slot = slot_in_backtrace_locked(r);
    blamed_by = "the kernel's backtrace";
    if (slot < 0 && r.blamed_slot < static_cast<uint32_t>(kMaxApps)) {
      slot = static_cast<int>(r.blamed_slot);
      blamed_by = "the program last run on the exit core";
    }
    for (ScxTarget* t : targets_)
      if (slot >= 0 && t->active() && t->slot() == slot) culprit = t;
  }
  uint64_t now = now_ms();
  ejection_times_.push_back(now);
  while (!ejection_times_.empty() && now - ejection_times_.front() > 60000) ejection_times_.pop_front();
  bool give_up = ejection_times_.size() > static_cast<size_t>(kMaxEjections);
  json rec = {{"time", time(nullptr)}, {"kind", exit_kind_name(r.kind)}, {"kind_code", r.kind},
              {"reason", reason}, {"message", msg}, {"exit_cpu", r.exit_cpu}};
  if (culprit) rec["blamed_pid"] = culprit->tgid(), rec["blamed_by"] = blamed_by;
  ejections_.push_back(rec);
  if (ejections_.size() > 8) ejections_.pop_front();
  log(LogLevel::kWarn, "sched_ext: the kernel ejected the scheduler (%s): %s%s", exit_kind_name(r.kind).c_str(),
      why.c_str(), culprit ? (", blamed on process " + std::to_string(culprit->tgid())).c_str() : "");
  if (!was_attached) return;

  if (culprit) {
    culprit->set_status("ejected by the kernel (" + exit_kind_name(r.kind) + "): " + why +
                        "; its threads are back in the fair class");
    culprit->deactivate_locked(true);
  }
  std::vector<ScxTarget*> rest;
  for (ScxTarget* t : targets_)
    if (t->active()) rest.push_back(t);
  if (give_up) {
    for (ScxTarget* t : rest) {
      t->set_status("stopped: the kernel ejected the scheduler " + std::to_string(ejection_times_.size()) +
                    " times in a minute (last: " + why + "); threads back in the fair class");
      t->deactivate_locked(true);
    }
    return;
  }
  if (rest.empty()) return;
  std::string err;
  if (attach_locked(err)) {
    for (ScxTarget* t : rest) {
      t->set_status("stopped: re-attaching after an ejection (" + why + ") failed: " + err);
      t->deactivate_locked(true);
    }
    return;
  }
  for (ScxTarget* t : rest)
    t->set_status("running (restored after the kernel ejected the scheduler: " + why +
                  (culprit ? "; blamed on process " + std::to_string(culprit->tgid()) : std::string()) + ")");
  log(LogLevel::kInfo, "sched_ext: scheduler re-attached for %zu other process(es)", rest.size());
}

// ---- The hook ----------------------------------------------------------------------

ThreadScxHook::ThreadScxHook(Compiler& compiler) {
  if (refused().empty()) scx_ = std::make_shared<ScxBackend>(compiler);
}

ThreadScxHook::~ThreadScxHook() = default;

int ThreadScxHook::make_process_target(ProcessThreads rq, std::unique_ptr<Target>& out, std::string& err) {
  if (int r = scx_->ensure_root(err)) return r;
  out = std::make_unique<ScxTarget>(scx_, rq.pid, rq.all, std::move(rq.base), std::move(rq.cg));
  return 0;
}

int ThreadScxHook::adopt_target(const json& saved, LoadedPolicy& p, std::unique_ptr<Target>& out, std::string& err) {
  pid_t tgid = saved.value("pid", 0);
  if (tgid <= 0 || kill(tgid, 0) < 0) {
    err = "process " + std::to_string(tgid) + ", whose threads it scheduled, is gone";
    return -ESRCH;
  }
  CgroupScope cg;
  if (int r = cg.adopt(saved, err)) return r;
  if (int r = scx_->adopt_root(err)) return r;
  int slot = saved.value("slot", -1);
  if (!scx_->adopt_slot(slot)) {
    err = "slot " + std::to_string(slot) + " is not a free slot of the root scheduler";
    return -EINVAL;
  }
  // No saved cores (or an unreadable list): restored threads keep their affinity.
  auto t = std::make_unique<ScxTarget>(scx_, tgid, saved.value("all_threads", false), baseline_from_json(saved),
                                       std::move(cg));
  std::lock_guard lk(scx_->mu());
  if (int r = t->adopt_locked(saved, p, err)) {
    scx_->free_slot_locked(slot);
    return r;
  }
  log(LogLevel::kInfo, "sched_ext: process %d in slot %d adopted from a previous syrupd", tgid, slot);
  out = std::move(t);
  return 0;
}

void ThreadScxHook::recover() {
  if (scx_) scx_->recover();
}

void ThreadScxHook::shutdown() {
  if (scx_) scx_->leave();
}

void ScxBackend::recover() {
  std::lock_guard lk(mu_);
  bool any = false;
  for (bool u : used_) any |= u;
  if (!any) {
    // Nothing adopted into a root a previous syrupd left pinned (or none was left):
    // unpinning the link detaches it, and its threads go back to the fair class.
    if (!adopted_ && access(pins::thread_scx_obj("link").c_str(), F_OK) == 0)
      log(LogLevel::kWarn, "sched_ext: detaching the root scheduler a previous syrupd left (no policy adopted)");
    if (!adopted_) unpin_locked();
    else detach_locked();
    return;
  }
  // Slots the kernel still has that no adopted policy owns: emptied, so their threads
  // wait in the fallback FIFO until syrupd switches them back (release_leftover).
  Conf c{};
  uint32_t z = 0;
  bpf_map_lookup_elem(map_fd("syr_scx_conf"), &z, &c);
  for (uint32_t s = 0; s < static_cast<uint32_t>(kMaxApps); s++) {
    if (used_[s]) continue;
    c.active &= ~(1ull << s);
    clear_slot_locked(s);
  }
  bpf_map_update_elem(map_fd("syr_scx_conf"), &z, &c, 0);
  uint32_t key, next;
  std::vector<uint32_t> stale;
  bool first = true;
  while (bpf_map_get_next_key(map_fd("syr_scx_procs"), first ? nullptr : &key, &next) == 0) {
    first = false;
    key = next;
    uint32_t v;
    if (bpf_map_lookup_elem(map_fd("syr_scx_procs"), &key, &v) == 0 && (v >= static_cast<uint32_t>(kMaxApps) || !used_[v]))
      stale.push_back(key);
  }
  for (uint32_t k : stale) bpf_map_delete_elem(map_fd("syr_scx_procs"), &k);
  // Likewise the cgroups of policies deployed by cgroup.
  uint64_t ck, cnext;
  std::vector<uint64_t> stale_cg;
  for (first = true; bpf_map_get_next_key(map_fd("syr_scx_cgroups"), first ? nullptr : &ck, &cnext) == 0;) {
    first = false;
    ck = cnext;
    CgSlot v{};
    if (bpf_map_lookup_elem(map_fd("syr_scx_cgroups"), &ck, &v) == 0 &&
        (v.slot >= static_cast<uint32_t>(kMaxApps) || !used_[v.slot]))
      stale_cg.push_back(ck);
  }
  for (uint64_t k : stale_cg) bpf_map_delete_elem(map_fd("syr_scx_cgroups"), &k);
}

void ThreadScxHook::release_leftover(std::string_view app, const std::string& policy_dir) {
  ThreadHookBase::release_leftover(app, policy_dir);
  if (!scx_) return;
  // A sched_ext policy that was not adopted: its process's registered threads may still
  // be SCHED_EXT (running in the fair class once its slot is emptied by recover(), or the
  // root detached): back to SCHED_OTHER.
  UniqueFd m(pins::obj_get(pins::app_map(app, "syrup_threads")));
  if (!m) return;
  uint32_t key, next;
  bool first = true;
  int n = 0;
  while (bpf_map_get_next_key(m.get(), first ? nullptr : &key, &next) == 0) {
    first = false;
    key = next;
    pid_t t = static_cast<pid_t>(key);
    if (sched_getscheduler(t) == kSchedExt && set_policy(t, SCHED_OTHER, 0) == 0) n++;
  }
  if (n) log(LogLevel::kWarn, "sched_ext: %d threads of a policy that was not adopted are back in the fair class", n);
}

std::vector<std::string> ThreadScxHook::system_maps() const {
  return {SYR_STATS_MAP,   "syr_scx_pick",  "syr_scx_tasks", "syr_scx_cpus", "syr_scx_round",
          "syr_scx_procs", "syr_scx_disp",  "syr_app_ops",   "syr_app_ops2",
          "syr_scx_cgroups", kRecCtlMap,     kRecRingMap,     "syr_scx_rec_in"};
}

Allowlist scx_allowlist() {
  Allowlist a{policy_helpers(), {}, policy_map_types()};
  // The wrapper's: the waker's process, the tail call back to the root, and the thread's
  // entry in the root's task-local syr_scx_tasks (a map type no policy may declare).
  a.helpers.insert({BPF_FUNC_get_current_pid_tgid, BPF_FUNC_tail_call, BPF_FUNC_task_storage_get});
  a.kfuncs = {"scx_bpf_dsq_insert",      "scx_bpf_select_cpu_dfl",  "scx_bpf_dsq_insert_vtime",
              "scx_bpf_dsq_move_to_local", "scx_bpf_dsq_nr_queued", "scx_bpf_create_dsq",
              "scx_bpf_task_cpu",        "scx_bpf_nr_cpu_ids",      "scx_bpf_kick_cpu",
              "scx_bpf_dsq_peek",        "scx_bpf_task_set_slice",  "scx_bpf_pick_idle_cpu",
              "bpf_iter_scx_dsq_new",    "bpf_iter_scx_dsq_next",   "bpf_iter_scx_dsq_destroy",
              "scx_bpf_dsq_move",        "scx_bpf_dsq_move_set_slice", "scx_bpf_test_and_clear_cpu_idle",
              "bpf_cpumask_test_cpu"};
  return a;
}


}  // namespace syrup::thread
