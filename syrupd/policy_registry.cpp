// The policy registry: the deployed policies by id, the applications' owners, the list of
// recently removed ids, who may see and act on what, and the quotas.
//
// Design: the registry is read and changed on the main thread only (workers ask it
// through the control server), so it needs no locks.
// Invariants:
//  - every registered policy is loaded, pinned and attached;
//  - at most one policy per target key; an application is owned by the uid that first
//    deployed for it, and exists while it has a policy (or a load into it is in flight);
//  - an application's map pins exist exactly while some policy of it declares the map, or
//    a load into the application is in flight (gc_app);
//  - a caller who may not see a policy or application is answered as if it did not exist
//    ("no policy N", "no application"), in the same words either way;
//  - gone_ keeps the last kGoneKept removals, shown to their uid and admins only.
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <stdexcept>

#include "daemon.h"
#include "daemon_util.h"
#include "log.h"
#include "names.h"
#include "pins.h"
#include "syrup/recording.h"
#include "proc.h"
#include "syrup/abi.h"
#include "text.h"

namespace syrup {
namespace fs = std::filesystem;
using nlohmann::json;

Hook* Daemon::hook_named(const std::string& name) const {
  for (auto& h : hooks_)
    if (h->name() == name) return h.get();
  return nullptr;
}

Hook* Daemon::hook_watching(int fd) const {
  for (auto& h : hooks_)
    if (h->event_fd() == fd) return h.get();
  return nullptr;
}

std::string Daemon::may_use_app(const Caller& caller, const std::string& app) const {
  auto it = app_owner_.find(app);
  if (it == app_owner_.end() || caller.admin() || it->second == caller.uid) return {};
  // Whose it is stays unsaid: another user learns only that the name is taken.
  return "application name '" + app + "' is taken by another user; choose another name";
}

bool Daemon::visible(const Caller& caller, const Policy& p) const {
  return caller.admin() || p.uid == caller.uid || may_use_app(caller, p.app).empty();
}

std::string Daemon::no_policy(const Caller& caller, int id) const {
  std::string text = "no policy " + std::to_string(id);
  auto it = gone_.find(id);
  if (it == gone_.end() || (!caller.admin() && it->second.uid != caller.uid)) return text;
  const Gone& g = it->second;
  return text + " (" + g.name + " of app '" + g.app + "' was removed: " + g.why + ")";
}

void Daemon::remember_gone(int id, Gone g) {
  json entry{{"id", id}, {"uid", g.uid}, {"app", g.app}, {"name", g.name}, {"why", g.why}};
  if (g.ended) entry["ended"] = true;
  g.state_json = state_entry(entry);
  journal_.gone.insert(id);
  gone_[id] = std::move(g);
  if (gone_.size() > kGoneKept) gone_.erase(gone_.begin());
}

config::Quotas Daemon::quotas_for(const std::string& app) const {
  if (const config::Tenant* t = config_.tenant(app)) return t->effective;
  config::Quotas q;
  q.policies = cfg_.quotas.policies;
  q.maps = cfg_.quotas.maps;
  q.map_bytes = cfg_.quotas.map_bytes;
  q.insns = cfg_.quotas.insns;
  q.source_bytes = cfg_.max_source_bytes;
  q.requests_per_second = cfg_.quotas.requests_per_second;
  return q;
}

std::string Daemon::check_quota(const std::string& app, const Policy* replaced, const LoadFootprint& fp) const {
  config::Quotas cq = quotas_for(app);
  Quotas q{config::Quotas::limit(cq.policies), config::Quotas::limit(cq.maps),
           config::Quotas::limit(cq.map_bytes), config::Quotas::limit(cq.insns), 0};
  size_t policies = 0, insns = fp.insns;
  for (int id : policies_of(app)) {
    const Policy* p = policies_.at(id).get();
    if (p == replaced) continue;
    policies++;
    insns += p->insns;
  }
  MapUsage pinned = pinned_map_usage(app);
  size_t maps = fp.new_maps.size() + pinned.maps;
  uint64_t bytes = fp.new_map_bytes + pinned.bytes;
  const config::Tenant* tenant = config_.tenant(app);
  auto over = [&](const char* what, uint64_t have, uint64_t limit) {
    std::string flag = what == std::string("bytes of maps") ? "map_bytes" : what;
    std::string where = " (syrupd --quota_" + flag + ")";
    if (tenant) {
      auto src = tenant->quota_sources.find(flag);
      where = src == tenant->quota_sources.end()
                  ? " (tenant quota " + flag + " in " + config_.path + ")"
                  : " (" + src->second.key + " at " + config_.path + ":" + std::to_string(src->second.line) + ")";
    }
    return "application '" + app + "' would have " + std::to_string(have) + " " + what +
           "; its quota is " + std::to_string(limit) + where;
  };
  if (policies + 1 > q.policies) return over("policies", policies + 1, q.policies);
  if (maps > q.maps) return over("maps", maps, q.maps);
  if (bytes > q.map_bytes) return over("bytes of maps", bytes, q.map_bytes);
  if (insns > q.insns) return over("insns", insns, q.insns);

  return check_uid_quota(app, replaced, fp, pinned);
}

// The same over every application of the uid that owns `app` (the caller, or a --config
// tenant's uid): per-application quotas alone let one user make 20 applications of 32 MiB
// of maps each. Root's applications are not bound. `pinned`: `app`'s own, counted already.
std::string Daemon::check_uid_quota(const std::string& app, const Policy* replaced, const LoadFootprint& fp,
                                    const MapUsage& pinned) const {
  auto owner = app_owner_.find(app);
  if (owner == app_owner_.end() || owner->second == 0) return {};
  uid_t uid = owner->second;
  struct Limit {
    const char* key;   // the flag's suffix and the config key
    const char* what;  // in the message
    uint64_t limit;
    std::string where;
  };
  Limit lim[] = {{"uid_policies", "policies", cfg_.quotas.uid_policies, {}},
                 {"uid_maps", "maps", cfg_.quotas.uid_maps, {}},
                 {"uid_map_bytes", "bytes of maps", cfg_.quotas.uid_map_bytes, {}},
                 {"uid_insns", "insns", cfg_.quotas.uid_insns, {}}};
  for (auto& l : lim) l.where = std::string(" (syrupd --quota_") + l.key + ")";
  // A tenant of the file with this uid sets its own (the last one in the file that sets
  // it, as for requests_per_second).
  for (auto& t : config_.tenants) {
    if (t.uid != uid) continue;
    for (auto& l : lim) {
      auto v = std::string(l.key) == "uid_policies" ? t.effective.uid_policies
               : std::string(l.key) == "uid_maps"   ? t.effective.uid_maps
               : std::string(l.key) == "uid_map_bytes" ? t.effective.uid_map_bytes
                                                       : t.effective.uid_insns;
      if (!v) continue;
      l.limit = *v;
      auto src = t.quota_sources.find(l.key);
      l.where = src == t.quota_sources.end()
                    ? " (tenant quota " + std::string(l.key) + " in " + config_.path + ")"
                    : " (" + src->second.key + " at " + config_.path + ":" + std::to_string(src->second.line) + ")";
    }
  }
  uint64_t have[4] = {1, fp.new_maps.size(), fp.new_map_bytes, fp.insns};
  std::set<std::string> apps;
  for (auto& [a, u] : app_owner_)
    if (u == uid) apps.insert(a);
  for (auto& a : apps)
    for (int id : policies_of(a)) {
      const Policy* p = policies_.at(id).get();
      if (p == replaced) continue;
      have[0]++;
      have[3] += p->insns;
    }
  for (auto& a : apps) {
    MapUsage u = a == app ? pinned : pinned_map_usage(a);
    have[1] += u.maps;
    have[2] += u.bytes;
  }
  for (size_t i = 0; i < 4; i++)
    if (lim[i].limit != config::kUnlimited && have[i] > lim[i].limit)
      return "uid " + std::to_string(uid) + " would have " + std::to_string(have[i]) + " " + lim[i].what +
             " over all its applications; its quota is " + std::to_string(lim[i].limit) + lim[i].where;
  return {};
}

void Daemon::remove_policy(int id, bool detach_hook, const char* why, bool ended) {
  auto it = policies_.find(id);
  if (it == policies_.end()) return;
  Policy& p = *it->second;
  recorder_.stop(id, SYR_REC_END_REMOVED);
  // A replaced policy's attachment now belongs to its successor: only a real removal
  // uninstalls.
  if (detach_hook && p.loaded) p.target->uninstall(*p.loaded);
  // Its owner's pidfd leaves epoll when its last policy closes it.
  if (auto it = owner_fds_.find(p.owner_pid); p.owner_pidfd.use_count() == 1 && it != owner_fds_.end() &&
                                               it->second.lock() == p.owner_pidfd)
    owner_fds_.erase(it);
  if (p.loaded) p.loaded->unpin();
  std::string app = p.app;
  log(LogLevel::kInfo, "removed policy %d (%s) of app '%s': %s", id, p.name.c_str(), app.c_str(), why);
  remember_gone(id, Gone{p.uid, app, p.name, why, {}, ended});
  unindex(p);
  journal_.policies.insert(id);
  policies_.erase(it);
  gc_app(app);
  totals_.removals++;
  changed();
}

void Daemon::gc_app(const std::string& app) {
  // A worker is loading into the application's pins: collected once it is done.
  if (loading_apps_.count(app)) return;
  bool any = false;
  std::map<std::string, bool> used;
  for (int id : policies_of(app)) {
    any = true;
    for (auto& m : policies_.at(id)->loaded->user_maps) used[m] = true;
  }
  for (const auto& name : pins::app_map_names(app))
    if (!used.count(name)) unlink(pins::app_map(app, name).c_str());
  if (!any) {
    pins::remove_tree(pins::app_dir(app));
    app_owner_.erase(app);
  }
}

void Daemon::owner_exited(int pidfd) {
  // An event fetched in one batch with a request or news that ended its policy is stale,
  // and by the time it is handled its number may be a new policy's pidfd: only an exit
  // the pidfd still shows ends policies.
  if (!exited(pidfd)) return;
  std::vector<int> ids;
  pid_t owner = 0;
  for (auto& [id, p] : policies_)
    if (p->owner_pidfd && p->owner_pidfd->get() == pidfd) ids.push_back(id), owner = p->owner_pid;
  if (owner) owner_fds_.erase(owner);
  for (int id : ids) end_policy(id, owner_exited_reason(*policies_[id]));
  if (ids.empty()) epoll_ctl(epoll_fd_.get(), EPOLL_CTL_DEL, pidfd, nullptr);
}

std::shared_ptr<UniqueFd> Daemon::owner_fd(pid_t pid) {
  auto& known = owner_fds_[pid];
  // A pidfd of a process that exited stays with the policies it ends; a new process that
  // reused the pid gets its own.
  if (auto fd = known.lock(); fd && !exited(fd->get())) return fd;
  auto fd = std::make_shared<UniqueFd>(static_cast<int>(syscall(SYS_pidfd_open, pid, 0)));
  if (!*fd) {
    owner_fds_.erase(pid);
    return nullptr;
  }
  if (epoll_fd_) {
    epoll_event ev{EPOLLIN, {.fd = fd->get()}};
    epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, fd->get(), &ev);
  }
  known = fd;
  return fd;
}

std::string Daemon::owner_exited_reason(const Policy& p) {
  return "owner process " + std::to_string(p.owner_pid) + " exited";
}

std::string Daemon::why_ended(const Policy& p) {
  return p.owner_pidfd && exited(p.owner_pidfd->get()) ? owner_exited_reason(p) : p.target->gone();
}

bool Daemon::some_end_unannounced() const {
  return std::any_of(policies_.begin(), policies_.end(),
                     [](const auto& e) { return e.second->target->ends_unannounced(); });
}

bool Daemon::remove_ended() {
  std::vector<std::pair<int, std::string>> gone;
  // Every kEndedCheckSec over every policy (3 us each at 5000 policies): an owner's exit
  // is asked of its pidfd once, not once per policy it owns.
  std::map<int, bool> owner_exited;  // by pidfd
  for (auto& [id, p] : policies_) {
    std::string why;
    if (p->owner_pidfd) {
      auto [it, fresh] = owner_exited.try_emplace(p->owner_pidfd->get(), false);
      if (fresh) it->second = exited(it->first);
      if (it->second) why = owner_exited_reason(*p);
    }
    if (why.empty()) why = p->target->gone();
    if (!why.empty()) gone.emplace_back(id, std::move(why));
  }
  for (auto& [id, why] : gone) end_policy(id, why);
  return !gone.empty();
}

void Daemon::follow_kernel() {
  remove_ended();
  // What the others save may have changed with the kernel (an interface's new name). Rare
  // enough to serialise them all again.
  for (auto& [id, p] : policies_) {
    record(*p);
    if (p->target->key() != p->key) {
      unindex(*p);
      index(*p);
    }
  }
  changed();
}

void Daemon::index(Policy& p) {
  p.key = p.target->key();
  by_key_[p.key].insert(p.id);
  by_app_[p.app].insert(p.id);
}

void Daemon::unindex(const Policy& p) {
  for (auto [index, k] : {std::pair{&by_key_, &p.key}, std::pair{&by_app_, &p.app}})
    if (auto it = index->find(*k); it != index->end() && it->second.erase(p.id) && it->second.empty())
      index->erase(it);
}

const std::set<int>& Daemon::policies_of(const std::string& app) const {
  static const std::set<int> none;
  auto it = by_app_.find(app);
  return it == by_app_.end() ? none : it->second;
}

void Daemon::end_policy(int id, const std::string& why) {
  // A --config entry's policy comes back on its process's successor, its process's new
  // group, its interface made again.
  if (const std::string& entry = policies_[id]->config_identity; !entry.empty()) {
    if (config_waiting_.empty()) config_retry_at_ = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    config_waiting_.insert(entry);
  }
  remove_policy(id, true, why.c_str(), true);
}

// The fields describe() adds to the target's.
static constexpr const char* kFixedFields[] = {"id",     "app",       "hook",   "name",    "uid",
                                               "owner_pid", "persist", "target", "executors", "params",
                                               "prog_id", "created", "pin"};

void Daemon::list_entry(const Policy& p, std::string& out) const {
  if (p.list_json.empty()) {
    // Of the target's fields, the live ones (all, for a target that does not split) are
    // left out, to be serialised per request.
    json fixed = describe(p), own = p.target->describe();
    std::vector<std::string> live = p.target->live_keys();
    for (auto& [k, v] : own.items()) {
      bool policy_field = std::ranges::find_if(kFixedFields, [&](const char* f) { return k == f; }) != std::end(kFixedFields);
      if (live.empty() ? !policy_field : std::ranges::count(live, k) > 0) fixed.erase(k);
    }
    p.list_json = state_entry(fixed);
    p.list_json.pop_back();  // '}'
  }
  out += p.list_json;
  if (p.target->describe_live(out)) {
    out += '}';
    return;
  }
  json live = p.target->describe();
  for (const char* f : kFixedFields) live.erase(f);
  if (live.empty()) {
    out += '}';
    return;
  }
  std::string d = state_entry(live);
  d[0] = p.list_json.size() > 1 ? ',' : ' ';
  out += d;
}

json Daemon::describe(const Policy& p) const {
  json j = p.target->describe();
  j.update(json{{"id", p.id},
          {"app", p.app},
          {"hook", p.hook},
          {"name", p.name},
          {"uid", p.uid},
          {"owner_pid", p.owner_pid},
          {"persist", p.owner_pid == 0},
          {"target", p.target->key()},
          {"executors", p.target->num_executors()},
          {"params", p.params},
          {"prog_id", p.prog_id},
          {"created", p.created},
          {"pin", pins::policy_dir(p.app, p.id)}});
  return j;
}

// The policy's statistics slots 0 .. SYR_STAT_EXECUTOR_BASE + executors - 1, each summed
// over CPUs, read with one BPF_MAP_LOOKUP_BATCH rather than one lookup per slot (a
// `stats` of 10,000 policies was 40,000 syscalls), else slot by slot.
static std::vector<uint64_t> stat_slots(int fd, uint32_t executors) {
  int ncpu = std::max(libbpf_num_possible_cpus(), 1);
  uint32_t n = SYR_STAT_EXECUTOR_BASE + executors, count = n, out_batch = 0;
  std::vector<uint32_t> keys(n);
  std::vector<uint64_t> vals(static_cast<size_t>(n) * ncpu), sums(n, 0);
  LIBBPF_OPTS(bpf_map_batch_opts, opts);
  int r = bpf_map_lookup_batch(fd, nullptr, &out_batch, keys.data(), vals.data(), &count, &opts);
  if ((r == 0 || errno == ENOENT) && count == n) {
    for (uint32_t i = 0; i < n; i++)
      if (keys[i] < n)
        for (int c = 0; c < ncpu; c++) sums[keys[i]] += vals[static_cast<size_t>(i) * ncpu + c];
    return sums;
  }
  for (uint32_t k = 0; k < n; k++)
    if (bpf_map_lookup_elem(fd, &k, vals.data()) == 0)
      for (int c = 0; c < ncpu; c++) sums[k] += vals[c];
  return sums;
}

// Appends `v` in decimal.
static void append_number(std::string& out, uint64_t v) {
  char buf[24];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, end);
}

bool Daemon::bpf_stats_enabled() {
  char c = '0';
  UniqueFd fd(open("/proc/sys/kernel/bpf_stats_enabled", O_RDONLY | O_CLOEXEC));
  return !fd || read(fd.get(), &c, 1) != 1 || c != '0';  // unknown: read the counts
}

void Daemon::stats_entry(const Policy& p, bool runs_counted, std::string& out) const {
  if (p.stats_json.empty())
    p.stats_json = state_entry(json{{"id", p.id}, {"app", p.app}, {"name", p.name}, {"hook", p.hook}});
  std::vector<uint64_t> slots = stat_slots(p.loaded->map_fd(SYR_STATS_MAP), p.target->num_executors());
  p.loaded->close_reopened();
  // The program's run counts, which the kernel keeps only while kernel.bpf_stats_enabled
  // is on: read while it is, and once more after it went off (they stopped there); else
  // the last read stands, without reopening the program (3 syscalls per policy).
  if (runs_counted || !p.runs_final) {
    bpf_prog_info info{};
    if (p.loaded->prog_info(info) == 0) {
      p.run_cnt = info.run_cnt;
      p.run_time_ns = info.run_time_ns;
    }
    p.runs_final = !runs_counted;
  }
  out.append(p.stats_json, 0, p.stats_json.size() - 1);  // without its '}'
  out += ",\"executors\":[";
  uint64_t total = 0;
  for (uint32_t i = 0; i < p.target->num_executors(); i++) {
    uint64_t v = slots[SYR_STAT_EXECUTOR_BASE + i];
    if (i) out += ',';
    append_number(out, v);
    total += v;
  }
  uint64_t pass = slots[SYR_STAT_PASS], drop = slots[SYR_STAT_DROP], fb = slots[SYR_STAT_FALLBACK];
  std::pair<const char*, uint64_t> counters[] = {{"],\"pass\":", pass},
                                                 {",\"drop\":", drop},
                                                 {",\"fallback\":", fb},
                                                 {",\"decisions\":", total + pass + drop + fb},
                                                 {",\"run_cnt\":", p.run_cnt},
                                                 {",\"run_time_ns\":", p.run_time_ns}};
  for (auto [k, v] : counters) {
    out += k;
    append_number(out, v);
  }
  // What `list` shows of the executors' state: a hook's health (a thread policy the kernel
  // ejected, a socket-select group that ended) and the socket-select executors still open.
  std::string live;
  if (!p.target->describe_live(live)) {
    json d = p.target->describe();
    for (const char* k : {"status", "open_executors"})
      if (d.is_object() && d.contains(k)) live += ",\"" + std::string(k) + "\":" + state_entry(d[k]);
  }
  out += live;
  out += '}';
}

json Daemon::policy_stats(const Policy& p, bool runs_counted) const {
  std::string text;
  stats_entry(p, runs_counted, text);
  return json::parse(text);
}

}  // namespace syrup
