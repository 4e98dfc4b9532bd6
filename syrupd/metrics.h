// Prometheus metrics for syrupd (docs/operations.md#metrics).
//
// The daemon builds a plain Snapshot of what it knows (policies with their decision
// counters, tenants, totals) and hands it over with Metrics::publish(); a small HTTP
// server on a thread of its own (http_endpoint.h: one epoll loop, at most 64 connections,
// each closed within 5 s) answers GET /metrics on 127.0.0.1 and ::1 only, rendering the
// latest snapshot. Invariants: the HTTP thread never touches daemon state (it sees only
// published, immutable snapshots, handed over under a mutex as shared_ptr<const>); it
// blocks every signal, so SIGTERM/SIGHUP still reach the daemon's signalfd; clients of
// the endpoint hold at most 64 of syrupd's descriptors, clients that hold connections
// without sending a request neither delay a scrape nor keep one out, and a scrape that
// waits for a fresh snapshot is parked, never blocking the endpoint's thread.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace syrup::http {
class Endpoint;
}

namespace syrup::metrics {

struct PolicySample {
  int id = 0;
  std::string tenant;  // the application
  std::string hook;
  std::string policy;  // its name
  std::string target;  // e.g. udp/127.0.0.1:9000
  std::vector<uint64_t> executors;  // enforced decisions per executor
  int64_t open_executors = -1;      // socket-select: executors whose socket is open; else -1
  uint64_t pass = 0, drop = 0, fallback = 0;
  uint64_t run_cnt = 0, run_time_ns = 0;  // the kernel's bpf_stats (0 unless enabled)
};

struct TenantSample {
  std::string tenant;
  uint64_t policies = 0;
  uint64_t maps = 0;
  uint64_t map_bytes = 0;
  // Limits by resource name (policies, maps, map_bytes, insns, source_bytes,
  // requests_per_second); a resource without a limit is left out.
  std::map<std::string, uint64_t> quotas;
};

// Counters the daemon keeps for its whole run (copied into every snapshot).
struct Totals {
  uint64_t deploys = 0;   // successful deploys (replacements included)
  uint64_t removals = 0;  // policies removed, for any reason (replacements included)
  std::map<std::pair<std::string, std::string>, uint64_t> errors;  // (op, kind) -> count
  uint64_t config_reloads = 0, config_reload_failures = 0;
  double config_last_success_unix = 0;  // 0: never

  // Counts a failed request: op e.g. "deploy", `err` a positive or negative errno
  // (kind = its name, e.g. "EACCES"), or a kind of the daemon's own ("quota").
  void error(const std::string& op, int err);
  void error(const std::string& op, const std::string& kind) { errors[{op, kind}]++; }
};

// The compile workers (syrupd/compile_pool.h): what they hold now, and what they have
// done since syrupd started. Compiles syrupd runs on its main thread are not counted.
// The totals now (syrup_compiles_queued, _running) are summed from the per-uid counts.
struct CompileSample {
  std::map<uid_t, uint64_t> queued_by_uid, running_by_uid;  // now, by the callers' uids (no zeros)
  uint64_t ok = 0, failed = 0;       // finished
  double wait_seconds = 0;           // summed over finished compiles: submit to start
  double compile_seconds = 0;        // summed over finished compiles: start to end
  // The compile cache (--cache_dir/obj): its objects' bytes, its bound (0: none), and the
  // objects removed to keep it (syrupd/compiler.h).
  uint64_t cache_bytes = 0, cache_max_bytes = 0, cache_evictions = 0;
};

// The control connections (docs/protocol.md, "Connection model"), now, and their caps.
// Root's, the others' and the busiest user's counts are derived from `by_uid`.
struct ConnectionSample {
  std::map<uid_t, uint64_t> by_uid;           // open connections per uid (root's too; no zeros)
  uint64_t max_others = 0, max_per_user = 0;  // --max_clients, --max_clients_per_uid
};

// The --config file (docs/operations.md, "Watching the file"): what this node applied.
struct ConfigSample {
  bool present = false;     // syrupd runs with --config
  uint64_t generation = 0;  // versions of the file read (at start, SIGHUP, the watch), refused ones too
  uint64_t file_errors = 0; // diagnostics of the version read last; > 0: refused, the one before runs
  uint64_t applied = 0;     // entries of the running version whose policy is deployed
  uint64_t not_applied = 0; // its other entries (failed, waiting, compiling)
  std::map<std::string, uint64_t> failed_by_kind;  // failed entries by errno name
  double last_apply_unix = 0;  // 0: never
  struct Failed {
    std::string tenant, policy, kind;
  };
  std::vector<Failed> failed;  // per tenant: only rendered with per_tenant
};

struct Snapshot {
  // Series whose labels name a tenant's things (application, policy name and id, target,
  // uid): any local user can scrape the endpoint, so only with --metrics_per_tenant.
  // Without it `policies`, `tenants` and the by-uid counts are left out of the text.
  bool per_tenant = false;
  double time_unix = 0;        // when it was taken (publish() fills it in if 0)
  double start_time_unix = 0;  // when syrupd started
  std::vector<PolicySample> policies;
  std::vector<TenantSample> tenants;
  Totals totals;
  CompileSample compiles;
  ConnectionSample connections;
  ConfigSample config;
};

// A PolicySample from one entry of the `stats` response (Daemon::policy_stats) and the
// policy's hook and target.
PolicySample policy_sample(const nlohmann::json& stats, const std::string& hook, const std::string& target);

// "EACCES" for EACCES (either sign); "E<n>" when unnamed.
std::string errno_name(int err);

// The Prometheus text exposition format (version 0.0.4) of `s`.
std::string render(const Snapshot& s);
inline constexpr const char* kContentType = "text/plain; version=0.0.4; charset=utf-8";

class Metrics {
 public:
  Metrics();
  ~Metrics();  // stop()
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  // Any thread (not during start() or stop()), cheap: the snapshot is moved into place;
  // scrapes from now on render it, and scrapes waiting for a fresh one are answered.
  void publish(Snapshot s);
  std::shared_ptr<const Snapshot> latest() const;

  // Serves GET /metrics on 127.0.0.1:port and, when the host has IPv6, [::1]:port, on
  // threads of its own. port 0: an ephemeral port (see port()), the same on both.
  // 0 or -errno with `err`. Call once, before or after the first publish().
  int start(uint16_t port, std::string& err) { return start("", port, err); }
  // On `address` (numeric IPv4 or IPv6; "" or 127.0.0.1: 127.0.0.1 and ::1 as above).
  // Off loopback, a request's Host may also be an IP address literal (what Prometheus
  // and the kubelet send for a pod): such a name cannot be rebound by DNS.
  int start(const std::string& address, uint16_t port, std::string& err);
  // GET /readyz answers 200 from now on (503 before): syrupd has adopted its policies
  // and applied --config, and serves requests (the DaemonSet's readiness probe).
  void set_ready() { ready_ = true; }
  uint16_t port() const { return port_; }
  std::vector<std::string> addresses() const { return addresses_; }  // "127.0.0.1:9464", "[::1]:9464"
  void stop();

  // Optional fresh-on-scrape: returns an eventfd (non-blocking, close-on-exec, owned by
  // Metrics) that becomes readable when a scrape finds the latest snapshot older than
  // `max_age` (and not published since the scrape arrived). The daemon adds it to its
  // epoll loop; when readable it reads 8 bytes and publishes a new snapshot. The scrape
  // is parked (the endpoint serves other connections meanwhile) until that publish()
  // or for `wait` at most, then renders the snapshot it has (the daemon may be busy
  // compiling). Without this, scrapes render whatever was published last. -errno on
  // failure.
  int refresh_fd(std::chrono::milliseconds max_age = std::chrono::milliseconds(1000),
                 std::chrono::milliseconds wait = std::chrono::milliseconds(500));

  // The latest snapshot rendered, as GET /metrics answers once it has a fresh one (for
  // tests without HTTP).
  std::string scrape() const;

 private:
  // For a scrape that arrived at `arrived`: the snapshot to render, or nullptr after
  // asking the daemon for a fresher one (then `wait` is how long to wait for it).
  std::shared_ptr<const Snapshot> fresh_or_ask(std::chrono::steady_clock::time_point arrived, bool last_call,
                                               std::chrono::milliseconds& wait);

  mutable std::mutex mu_;
  std::shared_ptr<const Snapshot> latest_;
  std::chrono::steady_clock::time_point latest_at_{};
  int refresh_fd_ = -1;
  std::chrono::milliseconds max_age_{1000}, wait_{500};
  std::unique_ptr<http::Endpoint> endpoint_;
  uint16_t port_ = 0;
  std::vector<std::string> addresses_;
  std::atomic<bool> ready_{false};
};

}  // namespace syrup::metrics
