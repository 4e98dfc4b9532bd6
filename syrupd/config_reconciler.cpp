// The config reconciler: --config's tenants and policies, applied at start, on SIGHUP and
// as entries waiting for their process or interface come back (docs/operations.md).
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
//    and logged once.
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/socket.h>
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

void Daemon::reload_config() {
  config::Config next;
  std::vector<config::Diagnostic> errs;
  config::LoadOptions lo;
  lo.max_source_bytes = cfg_.max_source_bytes;
  if (config::load(cfg_.config_path, next, errs, lo)) {
    for (auto& d : errs) log(LogLevel::kError, "%s", d.str().c_str());
    log(LogLevel::kError, "SIGHUP: %s has errors; the running configuration stays", cfg_.config_path.c_str());
    totals_.config_reloads++;
    totals_.config_reload_failures++;
    changed();
    return;
  }
  config_ = std::move(next);
  warm_config();
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
  log(LogLevel::kInfo, "SIGHUP: compiling %zu policies of %s before applying it", config_warming_.size(),
      cfg_.config_path.c_str());
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
  int id = resp.body["id"];
  policies_[id]->config_identity = e.identity;
  policies_[id]->config_hash = e.hash;
  record(*policies_[id]);
  if (d.replaces && resp.body.value("replaced", 0) != d.replaces)
    remove_policy(d.replaces, true, ("replaced by " + e.identity).c_str());
  return true;
}

}  // namespace syrup
