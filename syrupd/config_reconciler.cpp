// The config reconciler: --config's tenants and policies, applied at start, on SIGHUP, when
// the watch saw the file change (--config_watch, config_watch.h) and as entries waiting
// for their process or interface come back (docs/operations.md). What the running version
// applied and what not goes to --status_file and the metrics.
//
// Design: config::plan() compares the file with the policies deployed from it (identity
// and content hash) and yields what to deploy, replace and remove; only that changes. On
// SIGHUP the sources not cached are compiled on the workers first, while requests are
// served; the file is applied once they all have.
// Invariants:
//  - a file with errors changes nothing (at start it is fatal);
//  - an entry's policy is deployed for its tenant with an operator's rights but its
//    tenant's quotas;
//  - an entry whose process or interface is missing waits, retried every kConfigRetrySec
//    and logged once;
//  - the status file is written whole or not at all (a new file renamed over the old),
//    by root, in a directory that only root may write: no tenant can point it elsewhere.
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
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
#include "proc.h"
#include "syrup/abi.h"
#include "text.h"

namespace syrup {
namespace fs = std::filesystem;
using nlohmann::json;

void Daemon::reload_config(const char* trigger) {
  config_trigger_ = trigger;
  config::Config next;
  std::vector<config::Diagnostic> errs;
  config::LoadOptions lo;
  lo.max_source_bytes = cfg_.max_source_bytes;
  config_generation_++;
  config_file_errors_.clear();
  if (config::load(cfg_.config_path, next, errs, lo)) {
    for (auto& d : errs) {
      log(LogLevel::kError, "%s", d.str().c_str());
      config_file_errors_.push_back(d.str());
    }
    log(LogLevel::kError, "%s: %s has errors; the running configuration stays", trigger, cfg_.config_path.c_str());
    totals_.config_reloads++;
    totals_.config_reload_failures++;
    changed();
    return;
  }
  config_ = std::move(next);
  warm_config();
}

void Daemon::config_file_event() {
  std::string err;
  if (!config_watch_.on_event(err)) {
    log(LogLevel::kWarn, "%s", err.c_str());
    epoll_ctl(epoll_fd_.get(), EPOLL_CTL_DEL, config_watch_.fd(), nullptr);
  }
}

std::vector<config::Applied> Daemon::config_applied() const {
  std::vector<config::Applied> current;
  for (auto& [id, p] : policies_)
    if (!p->config_identity.empty()) current.push_back({p->config_identity, p->config_hash, id});
  return current;
}

void Daemon::warm_config() {
  config_warming_.clear();  // a reload during another's compiles starts over
  config_warm_failed_.clear();
  for (auto& d : config::plan(config_, config_applied()).to_deploy) {
    const json& b = d.entry.request;
    Hook* h = b.contains("hook") && b["hook"].is_string() ? hook_named(b["hook"].get<std::string>()) : nullptr;
    if (!h || !b.contains("source") || !b["source"].is_string()) continue;
    std::string name, source_name;
    policy_names(b, name, source_name);
    CompileJob job{b["source"].get<std::string>(), source_name, h->compile_define(), h->wrapper()};
    if (compiler_.cached(job)) continue;
    uint64_t ticket = next_ticket_++;
    config_warming_.emplace(ticket, compiler_.key(job));
    compile_pool_.submit(ticket, d.entry.uid, std::move(job));
  }
  if (config_warming_.empty()) {
    apply_config();
    changed();
    return;
  }
  log(LogLevel::kInfo, "%s: compiling %zu policies of %s before applying it", config_trigger_.c_str(),
      config_warming_.size(), cfg_.config_path.c_str());
}

void Daemon::apply_config(bool retry) {
  config::Plan plan = config::plan(config_, config_applied());
  if (retry) {
    // Only what waits for its process or interface; the rest of the plan is the next reload's.
    std::erase_if(plan.to_deploy, [&](const config::PlannedDeploy& d) { return !config_waiting_.count(d.entry.identity); });
    plan.to_remove.clear();
    std::set<std::string> planned;
    for (auto& d : plan.to_deploy) planned.insert(d.entry.identity);
    std::erase_if(config_waiting_, [&](const std::string& id) { return !planned.count(id); });
  } else {
    config_waiting_.clear();
    config_failures_.clear();
    config_last_apply_unix_ = static_cast<double>(time(nullptr));
    config_retry_at_ = std::chrono::steady_clock::now() + std::chrono::seconds(kConfigRetrySec);
  }
  for (auto& a : plan.to_remove) remove_policy(a.policy_id, true, ("no longer in " + cfg_.config_path).c_str());
  int failed = 0, deployed = 0;
  for (auto& d : plan.to_deploy) (apply_entry(d, retry) ? deployed : failed)++;
  if (retry) {
    if (deployed) {
      log(LogLevel::kInfo, "retried %s entries waiting for their process or interface: %d deployed, %zu still waiting",
          cfg_.config_path.c_str(), deployed, config_waiting_.size());
      changed();
    }
    return;
  }
  totals_.config_reloads++;
  if (failed) totals_.config_reload_failures++;
  else totals_.config_last_success_unix = static_cast<double>(time(nullptr));
  log(LogLevel::kInfo, "applied %s: %zu deployed, %zu removed, %zu unchanged, %d failed", cfg_.config_path.c_str(),
      plan.to_deploy.size() - failed, plan.to_remove.size(), plan.unchanged.size(), failed);
}

// Deploys --config entry `d` (a retry: quietly, see apply_config). True if it was
// deployed; else it waits for the next retry or reload, logged.
bool Daemon::apply_entry(const config::PlannedDeploy& d, bool retry) {
  const config::PolicyEntry& e = d.entry;
  std::string where = config_.path + ":" + std::to_string(e.line) + ": " + e.where;
  bool was_waiting = retry && config_waiting_.count(e.identity);
  // A failure that may pass by itself -- no such process yet, or no such interface
  // (ENODEV from the deploy) -- waits: retried every kConfigRetrySec, logged once. Any
  // other waits for the next reload.
  auto fail = [&](int r, bool waits, const std::string& why) {
    bool again = was_waiting && waits;
    log(again ? LogLevel::kDebug : LogLevel::kError, "%s: %s%s", where.c_str(), why.c_str(),
        waits && !again ? " (retried every 5 s)" : "");
    if (waits) config_waiting_.insert(e.identity);
    else config_waiting_.erase(e.identity);
    config_failures_[e.identity] = {metrics::errno_name(r), why.substr(0, why.find('\n'))};
    if (!again) totals_.error("config", r);
  };
  proto::Message msg;
  std::string err;
  if (int r = config::make_request(e, msg.body, err)) {
    fail(r, r == -ESRCH || r == -ENOENT, err);
    return false;
  }
  // Deployed for the tenant (its uid owns the application), with an operator's rights:
  // the operator who wrote the file may name any port or process. The tenant's quotas
  // still apply: an operator who writes a quota for a tenant means all of its policies,
  // those the file declares included (otherwise a typo in the file could deploy a map
  // of gigabytes that the tenant's own deploys could never get).
  Caller as{getpid(), e.uid, e.uid, true};
  Response resp = deploy(as, msg, true);
  if (!resp.body.value("ok", false)) {
    int r = resp.body.value("errno", EIO);
    fail(r, r == ENODEV,
         resp.body.value("error", std::string()) +
             (resp.body.contains("log") ? "\n" + resp.body["log"].get<std::string>() : std::string()));
    return false;
  }
  config_waiting_.erase(e.identity);
  config_failures_.erase(e.identity);
  int id = resp.body["id"];
  policies_[id]->config_identity = e.identity;
  policies_[id]->config_hash = e.hash;
  record(*policies_[id]);
  if (d.replaces && resp.body.value("replaced", 0) != d.replaces)
    remove_policy(d.replaces, true, ("replaced by " + e.identity).c_str());
  return true;
}

// Each entry of the running version: deployed (its policy's id), failed (its last try's
// errno name and error; `waits`: retried every kConfigRetrySec), or pending (compiling,
// or its policy ended and it waits for its process or interface).
json Daemon::config_status() const {
  std::map<std::string, int> live;
  for (auto& [id, p] : policies_)
    if (!p->config_identity.empty()) live[p->config_identity] = id;
  json entries = json::array();
  size_t applied = 0;
  for (const config::PolicyEntry* e : config_.entries()) {
    json j = {{"tenant", e->tenant}, {"name", e->name}, {"hook", e->hook}, {"line", e->line}};
    if (auto l = live.find(e->identity); l != live.end()) {
      j["state"] = "deployed";
      j["id"] = l->second;
      applied++;
    } else if (auto f = config_failures_.find(e->identity); f != config_failures_.end()) {
      j["state"] = "failed";
      j["kind"] = f->second.kind;
      j["error"] = f->second.error;
      j["retried"] = config_waiting_.count(e->identity) > 0;
    } else {
      j["state"] = "pending";
    }
    entries.push_back(std::move(j));
  }
  char host[256] = "";
  gethostname(host, sizeof host - 1);
  return {{"node", host},
          {"config", cfg_.config_path},
          {"generation", config_generation_},
          {"file", config_file_errors_.empty() ? "applied" : "refused"},
          {"file_errors", config_file_errors_},
          {"last_apply_unix", config_last_apply_unix_},
          {"applied", applied},
          {"not_applied", entries.size() - applied},
          {"policies", entries},
          {"ready", ready_},
          {"syrupd_pid", getpid()},
          {"written_unix", static_cast<double>(time(nullptr))}};
}

metrics::ConfigSample Daemon::config_sample() const {
  metrics::ConfigSample c;
  if (cfg_.config_path.empty()) return c;
  json st = config_status();
  c.present = true;
  c.generation = config_generation_;
  c.file_errors = config_file_errors_.size();
  c.last_apply_unix = config_last_apply_unix_;
  c.applied = st["applied"].get<uint64_t>();
  c.not_applied = st["not_applied"].get<uint64_t>();
  for (auto& e : st["policies"])
    if (e["state"] == "failed") {
      std::string kind = e["kind"].get<std::string>();
      c.failed_by_kind[kind]++;
      c.failed.push_back({e["tenant"].get<std::string>(), e["name"].get<std::string>(), kind});
    }
  return c;
}

// The status file's directory must be root's and writable by root alone, else a tenant
// could swap the file's name for a link to somewhere root writes; the file is made anew
// (O_EXCL, no links followed) and renamed over the old one, so a reader sees one whole
// version. A failure is logged once per kind, not fatal: the metrics say the same.
void Daemon::write_status() const {
  if (cfg_.config_path.empty() || cfg_.status_file.empty()) return;
  static std::string last_err;
  auto fail = [&](const std::string& why) {
    if (why != last_err) log(LogLevel::kWarn, "status file %s: %s", cfg_.status_file.c_str(), why.c_str());
    last_err = why;
  };
  fs::path p(cfg_.status_file);
  struct stat dir;
  if (lstat(p.parent_path().c_str(), &dir) < 0) return fail(std::string("its directory: ") + std::strerror(errno));
  if (!S_ISDIR(dir.st_mode) || dir.st_uid != 0 || (dir.st_mode & 022))
    return fail("its directory must be root's and writable by root alone; not written");
  std::string tmp = cfg_.status_file + ".tmp";
  unlink(tmp.c_str());
  UniqueFd fd(open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!fd) return fail(std::string("cannot create ") + tmp + ": " + std::strerror(errno));
  std::string text = config_status().dump(2) + "\n";
  if (write(fd.get(), text.data(), text.size()) != static_cast<ssize_t>(text.size()) ||
      rename(tmp.c_str(), cfg_.status_file.c_str()) < 0) {
    fail(std::string("cannot write it: ") + std::strerror(errno));
    unlink(tmp.c_str());
    return;
  }
  last_err.clear();
}

}  // namespace syrup
