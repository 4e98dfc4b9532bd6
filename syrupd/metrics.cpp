#include "metrics.h"

#include "http_endpoint.h"

#include <arpa/inet.h>
#include <pthread.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <ctime>

namespace syrup::metrics {
namespace {

// A label value in the exposition format: backslash, double quote and newline escaped.
std::string escape(const std::string& v) {
  std::string s;
  s.reserve(v.size());
  for (char c : v) {
    if (c == '\\') s += "\\\\";
    else if (c == '"') s += "\\\"";
    else if (c == '\n') s += "\\n";
    else s += c;
  }
  return s;
}

using Labels = std::vector<std::pair<const char*, std::string>>;

class Writer {
 public:
  void family(const char* name, const char* type, const char* help) {
    out_ += "# HELP ";
    out_ += name;
    out_ += ' ';
    out_ += help;
    out_ += "\n# TYPE ";
    out_ += name;
    out_ += ' ';
    out_ += type;
    out_ += '\n';
  }
  void sample(const char* name, const Labels& labels, uint64_t v) { line(name, labels, std::to_string(v)); }
  void sample(const char* name, const Labels& labels, double v) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.17g", v);
    line(name, labels, buf);
  }
  std::string take() { return std::move(out_); }

 private:
  void line(const char* name, const Labels& labels, const std::string& value) {
    out_ += name;
    if (!labels.empty()) {
      out_ += '{';
      bool first = true;
      for (auto& [k, v] : labels) {
        if (!first) out_ += ',';
        first = false;
        out_ += k;
        out_ += "=\"";
        out_ += escape(v);
        out_ += '"';
      }
      out_ += '}';
    }
    out_ += ' ';
    out_ += value;
    out_ += '\n';
  }
  std::string out_;
};

Labels policy_labels(const PolicySample& p) {
  return {{"tenant", p.tenant}, {"hook", p.hook}, {"policy", p.policy}, {"id", std::to_string(p.id)}};
}

// Whether a request's Host header names this host's loopback (or is absent, as from
// HTTP/1.0 clients). Anything else is a browser talking to us under another name (DNS
// rebinding), which loopback binding alone does not stop.
bool loopback_host(const std::string& host) {
  if (host.empty()) return true;
  std::string h = host;
  if (h[0] == '[') {
    auto end = h.find(']');
    if (end == std::string::npos) return false;
    h = h.substr(1, end - 1);
  } else if (auto colon = h.rfind(':'); colon != std::string::npos) {
    h = h.substr(0, colon);
  }
  for (auto& c : h) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return h == "127.0.0.1" || h == "localhost" || h == "::1" || h == "ip6-localhost";
}

// An IP address literal as a Host header carries it ("10.0.0.5:9464", "[fd00::5]:9464").
bool ip_literal_host(const std::string& host) {
  std::string h = host;
  if (!h.empty() && h[0] == '[') {
    auto end = h.find(']');
    if (end == std::string::npos) return false;
    h = h.substr(1, end - 1);
    in6_addr a6;
    return inet_pton(AF_INET6, h.c_str(), &a6) == 1;
  }
  if (auto colon = h.rfind(':'); colon != std::string::npos) h = h.substr(0, colon);
  in_addr a4;
  return inet_pton(AF_INET, h.c_str(), &a4) == 1;
}

bool loopback_address(const std::string& a) { return a.empty() || a == "127.0.0.1" || a == "::1"; }

double now_unix() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
}

}  // namespace

void Totals::error(const std::string& op, int err) { errors[{op, errno_name(err)}]++; }

std::string errno_name(int err) {
  if (err < 0) err = -err;
  const char* n = strerrorname_np(err);
  return n ? n : "E" + std::to_string(err);
}

PolicySample policy_sample(const nlohmann::json& s, const std::string& hook, const std::string& target) {
  PolicySample p;
  auto u64 = [&](const char* k) {
    return s.contains(k) && s[k].is_number_unsigned() ? s[k].get<uint64_t>()
           : s.contains(k) && s[k].is_number_integer() && s[k].get<int64_t>() >= 0
               ? static_cast<uint64_t>(s[k].get<int64_t>())
               : 0;
  };
  p.id = s.contains("id") && s["id"].is_number_integer() ? s["id"].get<int>() : 0;
  p.tenant = s.contains("app") && s["app"].is_string() ? s["app"].get<std::string>() : "";
  p.policy = s.contains("name") && s["name"].is_string() ? s["name"].get<std::string>() : "";
  p.hook = hook;
  p.target = target;
  if (s.contains("executors") && s["executors"].is_array())
    for (auto& v : s["executors"]) p.executors.push_back(v.is_number_unsigned() ? v.get<uint64_t>() : 0);
  if (s.contains("open_executors") && s["open_executors"].is_number_integer())
    p.open_executors = s["open_executors"].get<int64_t>();
  p.pass = u64("pass");
  p.drop = u64("drop");
  p.fallback = u64("fallback");
  p.run_cnt = u64("run_cnt");
  p.run_time_ns = u64("run_time_ns");
  return p;
}

// The series whose labels name tenants' applications, policies and targets.
static void render_tenants(Writer& w, const Snapshot& s) {
  w.family("syrup_policy_info", "gauge", "A deployed policy (always 1), with its target.");
  for (auto& p : s.policies) {
    Labels l = policy_labels(p);
    l.push_back({"target", p.target});
    w.sample("syrup_policy_info", l, uint64_t{1});
  }
  w.family("syrup_policy_executors", "gauge", "Executors of a deployed policy.");
  for (auto& p : s.policies) w.sample("syrup_policy_executors", policy_labels(p), uint64_t{p.executors.size()});
  w.family("syrup_policy_open_executors", "gauge",
           "Executors of a socket-select policy whose socket is still open (the kernel empties a closed one's slot).");
  for (auto& p : s.policies)
    if (p.open_executors >= 0)
      w.sample("syrup_policy_open_executors", policy_labels(p), static_cast<uint64_t>(p.open_executors));
  w.family("syrup_policy_decisions_total", "counter",
           "Decisions of a policy that sent an input to an executor, per executor.");
  for (auto& p : s.policies)
    for (size_t i = 0; i < p.executors.size(); i++) {
      Labels l = policy_labels(p);
      l.push_back({"executor", std::to_string(i)});
      w.sample("syrup_policy_decisions_total", l, p.executors[i]);
    }
  struct Counter {
    const char* name;
    const char* help;
    uint64_t PolicySample::*field;
  };
  static const Counter counters[] = {
      {"syrup_policy_pass_total", "Decisions of a policy that left the input to the kernel (SYR_PASS).",
       &PolicySample::pass},
      {"syrup_policy_drop_total", "Decisions of a policy that dropped the input (SYR_DROP).", &PolicySample::drop},
      {"syrup_policy_fallback_total",
       "Decisions of a policy that named a missing executor; the kernel chose instead.", &PolicySample::fallback},
      {"syrup_policy_runs_total", "Runs of the policy's program (kernel bpf_stats; 0 unless enabled).",
       &PolicySample::run_cnt},
      {"syrup_policy_run_time_ns_total",
       "Nanoseconds spent in the policy's program (kernel bpf_stats; 0 unless enabled).",
       &PolicySample::run_time_ns},
  };
  for (auto& c : counters) {
    w.family(c.name, "counter", c.help);
    for (auto& p : s.policies) w.sample(c.name, policy_labels(p), p.*c.field);
  }

  w.family("syrup_tenant_policies", "gauge", "Policies deployed for a tenant (application).");
  for (auto& t : s.tenants) w.sample("syrup_tenant_policies", {{"tenant", t.tenant}}, t.policies);
  w.family("syrup_tenant_maps", "gauge", "Application maps of a tenant.");
  for (auto& t : s.tenants) w.sample("syrup_tenant_maps", {{"tenant", t.tenant}}, t.maps);
  w.family("syrup_tenant_map_bytes", "gauge", "Bytes of BPF map memory a tenant's policies use.");
  for (auto& t : s.tenants) w.sample("syrup_tenant_map_bytes", {{"tenant", t.tenant}}, t.map_bytes);
  w.family("syrup_tenant_quota", "gauge", "A tenant's limit on a resource (resources without a limit are left out).");
  for (auto& t : s.tenants)
    for (auto& [res, v] : t.quotas) w.sample("syrup_tenant_quota", {{"tenant", t.tenant}, {"resource", res}}, v);

}

// The --config file's series (only with --config): what this node applied and what not.
// Entries are named (tenant, policy) only with --metrics_per_tenant; else by errno name.
static void render_config(Writer& w, const Snapshot& s) {
  const ConfigSample& c = s.config;
  if (!c.present) return;
  w.family("syrup_config_generation", "counter",
           "Versions of the --config file syrupd has read (at start, on SIGHUP, when the watch saw it change), refused ones too.");
  w.sample("syrup_config_generation", {}, c.generation);
  w.family("syrup_config_file_errors", "gauge",
           "Errors in the version of the --config file read last; not 0: it was refused and the version before runs.");
  w.sample("syrup_config_file_errors", {}, c.file_errors);
  w.family("syrup_config_applied_policies", "gauge", "Entries of the running --config whose policy is deployed.");
  w.sample("syrup_config_applied_policies", {}, c.applied);
  w.family("syrup_config_failed_policies", "gauge",
           "Entries of the running --config whose policy is not deployed, by the errno name of their last try "
           "(pending: not tried yet, or ended and waiting for its process or interface).");
  uint64_t named = 0;
  for (auto& [kind, n] : c.failed_by_kind) {
    w.sample("syrup_config_failed_policies", {{"kind", kind}}, n);
    named += n;
  }
  if (c.not_applied > named) w.sample("syrup_config_failed_policies", {{"kind", "pending"}}, c.not_applied - named);
  w.family("syrup_config_last_apply_timestamp_seconds", "gauge",
           "Unix time syrupd last applied the --config file (0: never).");
  w.sample("syrup_config_last_apply_timestamp_seconds", {}, c.last_apply_unix);
  if (!s.per_tenant) return;
  w.family("syrup_config_policy_failed", "gauge", "An entry of the running --config whose policy failed to deploy (always 1).");
  for (auto& f : c.failed)
    w.sample("syrup_config_policy_failed", {{"tenant", f.tenant}, {"policy", f.policy}, {"kind", f.kind}}, uint64_t{1});
}

std::string render(const Snapshot& s) {
  Writer w;
  w.family("syrupd_start_time_seconds", "gauge", "Unix time syrupd started.");
  w.sample("syrupd_start_time_seconds", {}, s.start_time_unix);
  w.family("syrup_metrics_snapshot_timestamp_seconds", "gauge",
           "Unix time syrupd took the snapshot these metrics come from.");
  w.sample("syrup_metrics_snapshot_timestamp_seconds", {}, s.time_unix);

  if (s.per_tenant) render_tenants(w, s);
  w.family("syrup_deploys_total", "counter", "Policies deployed since syrupd started (replacements included).");
  w.sample("syrup_deploys_total", {}, s.totals.deploys);
  w.family("syrup_removals_total", "counter", "Policies removed since syrupd started (replacements included).");
  w.sample("syrup_removals_total", {}, s.totals.removals);
  w.family("syrup_errors_total", "counter", "Failed requests by operation and kind (an errno name, or quota).");
  for (auto& [k, v] : s.totals.errors) w.sample("syrup_errors_total", {{"op", k.first}, {"kind", k.second}}, v);
  w.family("syrup_config_reloads_total", "counter", "Loads of the --config file, by result.");
  w.sample("syrup_config_reloads_total", {{"result", "success"}}, s.totals.config_reloads - std::min(s.totals.config_reloads, s.totals.config_reload_failures));
  w.sample("syrup_config_reloads_total", {{"result", "failure"}}, s.totals.config_reload_failures);
  w.family("syrup_config_last_reload_success_timestamp_seconds", "gauge",
           "Unix time the --config file was last applied successfully (0: never).");
  w.sample("syrup_config_last_reload_success_timestamp_seconds", {}, s.totals.config_last_success_unix);
  render_config(w, s);
  const CompileSample& c = s.compiles;
  auto sum = [](const std::map<uid_t, uint64_t>& m) {
    uint64_t n = 0;
    for (auto& [uid, k] : m) n += k;
    return n;
  };
  w.family("syrup_compiles_queued", "gauge", "Policy compiles waiting for a compile worker.");
  w.sample("syrup_compiles_queued", {}, sum(c.queued_by_uid));
  w.family("syrup_compiles_running", "gauge", "Policy compiles running on the compile workers.");
  w.sample("syrup_compiles_running", {}, sum(c.running_by_uid));
  if (s.per_tenant) {
    w.family("syrup_user_compiles", "gauge",
             "Policy compiles of one user (the caller's uid) queued for or running on the compile workers.");
    for (auto& [uid, n] : c.queued_by_uid) w.sample("syrup_user_compiles", {{"uid", std::to_string(uid)}, {"state", "queued"}}, n);
    for (auto& [uid, n] : c.running_by_uid) w.sample("syrup_user_compiles", {{"uid", std::to_string(uid)}, {"state", "running"}}, n);
  }
  w.family("syrup_compiles_total", "counter", "Compiles the compile workers finished, by result.");
  w.sample("syrup_compiles_total", {{"result", "ok"}}, c.ok);
  w.sample("syrup_compiles_total", {{"result", "error"}}, c.failed);
  w.family("syrup_compile_wait_seconds", "summary", "Time finished compiles waited for a compile worker.");
  w.sample("syrup_compile_wait_seconds_sum", {}, c.wait_seconds);
  w.sample("syrup_compile_wait_seconds_count", {}, c.ok + c.failed);
  w.family("syrup_compile_duration_seconds", "summary", "Time the compile workers spent on finished compiles.");
  w.sample("syrup_compile_duration_seconds_sum", {}, c.compile_seconds);
  w.sample("syrup_compile_duration_seconds_count", {}, c.ok + c.failed);
  w.family("syrup_compile_cache_bytes", "gauge", "Bytes of the compiled policy objects in the compile cache.");
  w.sample("syrup_compile_cache_bytes", {}, c.cache_bytes);
  if (c.cache_max_bytes) {
    w.family("syrup_compile_cache_limit_bytes", "gauge",
             "The compile cache's bound (--cache_max_bytes); over it the objects used least recently are removed.");
    w.sample("syrup_compile_cache_limit_bytes", {}, c.cache_max_bytes);
  }
  w.family("syrup_compile_cache_evictions_total", "counter",
           "Objects removed from the compile cache to keep it within its bound.");
  w.sample("syrup_compile_cache_evictions_total", {}, c.cache_evictions);
  const ConnectionSample& k = s.connections;
  uint64_t root = 0, others = 0, busiest = 0;
  for (auto& [uid, n] : k.by_uid) {
    (uid == 0 ? root : others) += n;
    if (uid != 0) busiest = std::max(busiest, n);
  }
  w.family("syrup_control_connections", "gauge", "Open control connections, of root and of other users.");
  w.sample("syrup_control_connections", {{"user", "root"}}, root);
  w.sample("syrup_control_connections", {{"user", "other"}}, others);
  w.family("syrup_control_connections_busiest_user", "gauge",
           "The most open control connections one user other than root holds.");
  w.sample("syrup_control_connections_busiest_user", {}, busiest);
  if (s.per_tenant) {
    w.family("syrup_user_control_connections", "gauge", "Open control connections of one user (by uid).");
    for (auto& [uid, n] : k.by_uid) w.sample("syrup_user_control_connections", {{"uid", std::to_string(uid)}}, n);
  }
  w.family("syrup_control_connections_limit", "gauge",
           "Caps on the control connections of users other than root: all of them (--max_clients) and "
           "one user's (--max_clients_per_uid).");
  w.sample("syrup_control_connections_limit", {{"scope", "all"}}, k.max_others);
  w.sample("syrup_control_connections_limit", {{"scope", "per_user"}}, k.max_per_user);
  return w.take();
}

Metrics::Metrics() = default;

Metrics::~Metrics() {
  stop();
  if (refresh_fd_ >= 0) close(refresh_fd_);
}

void Metrics::publish(Snapshot s) {
  if (s.time_unix == 0) s.time_unix = now_unix();
  auto p = std::make_shared<const Snapshot>(std::move(s));
  {
    std::lock_guard lk(mu_);
    latest_ = std::move(p);
    latest_at_ = std::chrono::steady_clock::now();
  }
  if (endpoint_) endpoint_->wake();
}

std::shared_ptr<const Snapshot> Metrics::latest() const {
  std::lock_guard lk(mu_);
  return latest_;
}

int Metrics::refresh_fd(std::chrono::milliseconds max_age, std::chrono::milliseconds wait) {
  std::lock_guard lk(mu_);
  if (refresh_fd_ < 0) {
    refresh_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (refresh_fd_ < 0) return -errno;
  }
  max_age_ = max_age;
  wait_ = wait;
  return refresh_fd_;
}

std::string Metrics::scrape() const {
  auto s = latest();
  return s ? render(*s) : render(Snapshot{});
}

std::shared_ptr<const Snapshot> Metrics::fresh_or_ask(std::chrono::steady_clock::time_point arrived, bool last_call,
                                                      std::chrono::milliseconds& wait) {
  static const auto empty = std::make_shared<const Snapshot>();
  std::lock_guard lk(mu_);
  bool fresh = latest_ && (latest_at_ >= arrived || std::chrono::steady_clock::now() - latest_at_ <= max_age_);
  if (refresh_fd_ >= 0 && !fresh && !last_call) {
    uint64_t one = 1;
    if (write(refresh_fd_, &one, sizeof one) == sizeof one) {
      wait = wait_;
      return nullptr;
    }
  }
  return latest_ ? latest_ : empty;
}

int Metrics::start(const std::string& address, uint16_t port, std::string& err) {
  if (endpoint_) {
    err = "the metrics server is already running";
    return -EALREADY;
  }
  bool loopback = loopback_address(address);
  auto ep = std::make_unique<http::Endpoint>([this, loopback](const http::Request& req) -> http::Reply {
    // Only under a loopback name, or off loopback an address literal: a browser tricked
    // by DNS rebinding sends another.
    if (!loopback_host(req.host) && (loopback || !ip_literal_host(req.host)))
      return http::Response{.status = 403,
                            .body = loopback ? "syrupd metrics answer only to Host 127.0.0.1, [::1] or localhost\n"
                                             : "syrupd metrics answer only to a Host that is an IP address or localhost\n"};
    if (req.path == "/readyz")
      return ready_ ? http::Response{.body = "ready\n"}
                    : http::Response{.status = 503, .body = "syrupd is starting: adopting its policies and applying --config\n"};
    if (req.path == "/metrics") {
      std::chrono::milliseconds wait{};
      auto s = fresh_or_ask(req.arrived, req.last_call, wait);
      if (!s) return http::Later{wait};
      return http::Response{.content_type = kContentType, .body = render(*s)};
    }
    if (req.path == "/") return http::Response{.body = "syrupd: metrics are at /metrics\n"};
    return http::Response{.status = 404, .body = "not found; metrics are at /metrics\n"};
  });
  std::string host = loopback ? "127.0.0.1" : address;
  int bound = ep->add_listener(host, port);
  auto shown = [&](int p) {
    return (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" + std::to_string(p);
  };
  if (bound < 0) {
    err = "cannot listen on " + shown(port) + ": " + std::strerror(-bound);
    return bound;
  }
  std::vector<std::string> addresses = {shown(bound)};
  // Loopback: ::1 on the same port too; a host without IPv6 (or with the port taken
  // there) is served on 127.0.0.1 alone.
  if (loopback && ep->add_listener("::1", static_cast<uint16_t>(bound)) > 0)
    addresses.push_back("[::1]:" + std::to_string(bound));
  // The endpoint's thread inherits this mask: every signal stays with the daemon's
  // signalfd, never the metrics thread.
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  int r = ep->start();
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  if (r < 0) {
    err = std::string("cannot start the metrics server: ") + std::strerror(-r);
    return r;
  }
  endpoint_ = std::move(ep);
  port_ = static_cast<uint16_t>(bound);
  addresses_ = std::move(addresses);
  return 0;
}

void Metrics::stop() {
  endpoint_.reset();  // stops its thread and closes its sockets
  addresses_.clear();
  port_ = 0;
}

}  // namespace syrup::metrics
