// Unit tests of the metrics modules (no kernel, no syrupd): the Prometheus text renderer
// (syrupd/metrics.h), the hand-off of snapshots to the scrape thread, and the HTTP
// endpoint (syrupd/http_endpoint.h) on 127.0.0.1 with an ephemeral port: exact requests
// byte for byte, slow and silent clients, deadlines, the connection bound, parked
// scrapes. A real syrupd's endpoint is scraped in tests/config_test.cpp.
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <poll.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "http_client.h"
#include "http_endpoint.h"
#include "metrics.h"

namespace syrup {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using test::http_exchange;
using test::read_all;
using test::tcp_connect;

metrics::Snapshot sample_snapshot() {
  metrics::Snapshot s;
  s.per_tenant = true;  // syrupd --metrics_per_tenant
  s.time_unix = 1700000000.5;
  s.start_time_unix = 1699999000;
  metrics::PolicySample p;
  p.id = 3;
  p.tenant = "kv";
  p.hook = "socket-select";
  p.policy = "rr.c";
  p.target = "udp/127.0.0.1:9000";
  p.executors = {5, 7};
  p.open_executors = 1;
  p.pass = 1;
  p.drop = 2;
  p.fallback = 3;
  p.run_cnt = 18;
  p.run_time_ns = 990;
  s.policies.push_back(p);
  metrics::TenantSample t;
  t.tenant = "kv";
  t.policies = 1;
  t.maps = 2;
  t.map_bytes = 4096;
  t.quotas = {{"policies", 8}, {"map_bytes", 16777216}};
  s.tenants.push_back(t);
  s.totals.deploys = 4;
  s.totals.removals = 3;
  s.totals.error("deploy", -EACCES);
  s.totals.error("deploy", EACCES);
  s.totals.error("deploy", "quota");
  s.totals.config_reloads = 3;
  s.totals.config_reload_failures = 1;
  s.totals.config_last_success_unix = 1700000000;
  s.compiles = {.queued_by_uid = {{1000, 2}},
                .running_by_uid = {{0, 1}},
                .ok = 5,
                .failed = 1,
                .wait_seconds = 1.5,
                .compile_seconds = 9.25,
                .cache_bytes = 123456,
                .cache_max_bytes = 268435456,
                .cache_evictions = 7};
  s.connections = {.by_uid = {{0, 1}, {1000, 3}, {1001, 2}, {1002, 2}},
                   .max_others = 128,
                   .max_per_user = 32};
  return s;
}

const char* kRendered = R"(# HELP syrupd_start_time_seconds Unix time syrupd started.
# TYPE syrupd_start_time_seconds gauge
syrupd_start_time_seconds 1699999000
# HELP syrup_metrics_snapshot_timestamp_seconds Unix time syrupd took the snapshot these metrics come from.
# TYPE syrup_metrics_snapshot_timestamp_seconds gauge
syrup_metrics_snapshot_timestamp_seconds 1700000000.5
# HELP syrup_policy_info A deployed policy (always 1), with its target.
# TYPE syrup_policy_info gauge
syrup_policy_info{tenant="kv",hook="socket-select",policy="rr.c",id="3",target="udp/127.0.0.1:9000"} 1
# HELP syrup_policy_executors Executors of a deployed policy.
# TYPE syrup_policy_executors gauge
syrup_policy_executors{tenant="kv",hook="socket-select",policy="rr.c",id="3"} 2
# HELP syrup_policy_open_executors Executors of a socket-select policy whose socket is still open (the kernel empties a closed one's slot).
# TYPE syrup_policy_open_executors gauge
syrup_policy_open_executors{tenant="kv",hook="socket-select",policy="rr.c",id="3"} 1
# HELP syrup_policy_decisions_total Decisions of a policy that sent an input to an executor, per executor.
# TYPE syrup_policy_decisions_total counter
syrup_policy_decisions_total{tenant="kv",hook="socket-select",policy="rr.c",id="3",executor="0"} 5
syrup_policy_decisions_total{tenant="kv",hook="socket-select",policy="rr.c",id="3",executor="1"} 7
# HELP syrup_policy_pass_total Decisions of a policy that left the input to the kernel (SYR_PASS).
# TYPE syrup_policy_pass_total counter
syrup_policy_pass_total{tenant="kv",hook="socket-select",policy="rr.c",id="3"} 1
# HELP syrup_policy_drop_total Decisions of a policy that dropped the input (SYR_DROP).
# TYPE syrup_policy_drop_total counter
syrup_policy_drop_total{tenant="kv",hook="socket-select",policy="rr.c",id="3"} 2
# HELP syrup_policy_fallback_total Decisions of a policy that named a missing executor; the kernel chose instead.
# TYPE syrup_policy_fallback_total counter
syrup_policy_fallback_total{tenant="kv",hook="socket-select",policy="rr.c",id="3"} 3
# HELP syrup_policy_runs_total Runs of the policy's program (kernel bpf_stats; 0 unless enabled).
# TYPE syrup_policy_runs_total counter
syrup_policy_runs_total{tenant="kv",hook="socket-select",policy="rr.c",id="3"} 18
# HELP syrup_policy_run_time_ns_total Nanoseconds spent in the policy's program (kernel bpf_stats; 0 unless enabled).
# TYPE syrup_policy_run_time_ns_total counter
syrup_policy_run_time_ns_total{tenant="kv",hook="socket-select",policy="rr.c",id="3"} 990
# HELP syrup_tenant_policies Policies deployed for a tenant (application).
# TYPE syrup_tenant_policies gauge
syrup_tenant_policies{tenant="kv"} 1
# HELP syrup_tenant_maps Application maps of a tenant.
# TYPE syrup_tenant_maps gauge
syrup_tenant_maps{tenant="kv"} 2
# HELP syrup_tenant_map_bytes Bytes of BPF map memory a tenant's policies use.
# TYPE syrup_tenant_map_bytes gauge
syrup_tenant_map_bytes{tenant="kv"} 4096
# HELP syrup_tenant_quota A tenant's limit on a resource (resources without a limit are left out).
# TYPE syrup_tenant_quota gauge
syrup_tenant_quota{tenant="kv",resource="map_bytes"} 16777216
syrup_tenant_quota{tenant="kv",resource="policies"} 8
# HELP syrup_deploys_total Policies deployed since syrupd started (replacements included).
# TYPE syrup_deploys_total counter
syrup_deploys_total 4
# HELP syrup_removals_total Policies removed since syrupd started (replacements included).
# TYPE syrup_removals_total counter
syrup_removals_total 3
# HELP syrup_errors_total Failed requests by operation and kind (an errno name, or quota).
# TYPE syrup_errors_total counter
syrup_errors_total{op="deploy",kind="EACCES"} 2
syrup_errors_total{op="deploy",kind="quota"} 1
# HELP syrup_config_reloads_total Loads of the --config file, by result.
# TYPE syrup_config_reloads_total counter
syrup_config_reloads_total{result="success"} 2
syrup_config_reloads_total{result="failure"} 1
# HELP syrup_config_last_reload_success_timestamp_seconds Unix time the --config file was last applied successfully (0: never).
# TYPE syrup_config_last_reload_success_timestamp_seconds gauge
syrup_config_last_reload_success_timestamp_seconds 1700000000
# HELP syrup_compiles_queued Policy compiles waiting for a compile worker.
# TYPE syrup_compiles_queued gauge
syrup_compiles_queued 2
# HELP syrup_compiles_running Policy compiles running on the compile workers.
# TYPE syrup_compiles_running gauge
syrup_compiles_running 1
# HELP syrup_user_compiles Policy compiles of one user (the caller's uid) queued for or running on the compile workers.
# TYPE syrup_user_compiles gauge
syrup_user_compiles{uid="1000",state="queued"} 2
syrup_user_compiles{uid="0",state="running"} 1
# HELP syrup_compiles_total Compiles the compile workers finished, by result.
# TYPE syrup_compiles_total counter
syrup_compiles_total{result="ok"} 5
syrup_compiles_total{result="error"} 1
# HELP syrup_compile_wait_seconds Time finished compiles waited for a compile worker.
# TYPE syrup_compile_wait_seconds summary
syrup_compile_wait_seconds_sum 1.5
syrup_compile_wait_seconds_count 6
# HELP syrup_compile_duration_seconds Time the compile workers spent on finished compiles.
# TYPE syrup_compile_duration_seconds summary
syrup_compile_duration_seconds_sum 9.25
syrup_compile_duration_seconds_count 6
# HELP syrup_compile_cache_bytes Bytes of the compiled policy objects in the compile cache.
# TYPE syrup_compile_cache_bytes gauge
syrup_compile_cache_bytes 123456
# HELP syrup_compile_cache_limit_bytes The compile cache's bound (--cache_max_bytes); over it the objects used least recently are removed.
# TYPE syrup_compile_cache_limit_bytes gauge
syrup_compile_cache_limit_bytes 268435456
# HELP syrup_compile_cache_evictions_total Objects removed from the compile cache to keep it within its bound.
# TYPE syrup_compile_cache_evictions_total counter
syrup_compile_cache_evictions_total 7
# HELP syrup_control_connections Open control connections, of root and of other users.
# TYPE syrup_control_connections gauge
syrup_control_connections{user="root"} 1
syrup_control_connections{user="other"} 7
# HELP syrup_control_connections_busiest_user The most open control connections one user other than root holds.
# TYPE syrup_control_connections_busiest_user gauge
syrup_control_connections_busiest_user 3
# HELP syrup_user_control_connections Open control connections of one user (by uid).
# TYPE syrup_user_control_connections gauge
syrup_user_control_connections{uid="0"} 1
syrup_user_control_connections{uid="1000"} 3
syrup_user_control_connections{uid="1001"} 2
syrup_user_control_connections{uid="1002"} 2
# HELP syrup_control_connections_limit Caps on the control connections of users other than root: all of them (--max_clients) and one user's (--max_clients_per_uid).
# TYPE syrup_control_connections_limit gauge
syrup_control_connections_limit{scope="all"} 128
syrup_control_connections_limit{scope="per_user"} 32
)";

TEST(Metrics, RendersThePrometheusTextFormat) { EXPECT_EQ(metrics::render(sample_snapshot()), kRendered); }

// Any local user can scrape the endpoint: without --metrics_per_tenant no series names an
// application, policy, target or uid.
TEST(Metrics, PerTenantSeriesOnlyWithTheFlag) {
  metrics::Snapshot s = sample_snapshot();
  s.per_tenant = false;
  std::string out = metrics::render(s);
  for (const char* secret : {"tenant=", "uid=", "policy=", "target=", "\"kv\"", "rr.c"})
    EXPECT_EQ(out.find(secret), std::string::npos) << secret << " in:\n" << out;
  EXPECT_NE(out.find("syrup_deploys_total"), std::string::npos) << out;
}

TEST(Metrics, EscapesLabelValues) {
  metrics::Snapshot s;
  s.per_tenant = true;
  metrics::PolicySample p;
  p.tenant = "a\"b\\c\nd";
  p.executors = {1};
  s.policies.push_back(p);
  std::string out = metrics::render(s);
  EXPECT_NE(out.find(R"(syrup_policy_executors{tenant="a\"b\\c\nd",hook="",policy="",id="0"} 1)"), std::string::npos) << out;
  // Every line is a comment or a sample; every family has HELP and TYPE before its samples
  // (a summary's are its name with _sum and _count).
  std::istringstream in(out);
  std::set<std::string> typed;
  for (std::string line; std::getline(in, line);) {
    if (line.starts_with("# TYPE ")) {
      size_t end = line.find(' ', 7);
      std::string name = line.substr(7, end - 7);
      if (line.substr(end + 1) == "summary") {
        typed.insert(name + "_sum");
        typed.insert(name + "_count");
      } else {
        typed.insert(name);
      }
      continue;
    }
    if (line.starts_with("# HELP ")) continue;
    std::string name = line.substr(0, line.find_first_of("{ "));
    EXPECT_TRUE(typed.count(name)) << line;
  }
}

TEST(Metrics, ErrnoNamesAndSamplesFromStats) {
  EXPECT_EQ(metrics::errno_name(EPERM), "EPERM");
  EXPECT_EQ(metrics::errno_name(-ENOENT), "ENOENT");
  EXPECT_EQ(metrics::errno_name(4000), "E4000");
  json stats = json::parse(R"({"id":7,"app":"kv","name":"sita.c","executors":[1,2,3],"pass":4,"drop":5,
                               "fallback":6,"decisions":21,"run_cnt":8,"run_time_ns":900,"open_executors":2})");
  metrics::PolicySample p = metrics::policy_sample(stats, "xdp", "eth0");
  EXPECT_EQ(p.id, 7);
  EXPECT_EQ(p.tenant, "kv");
  EXPECT_EQ(p.policy, "sita.c");
  EXPECT_EQ(p.hook, "xdp");
  EXPECT_EQ(p.target, "eth0");
  EXPECT_EQ(p.executors, (std::vector<uint64_t>{1, 2, 3}));
  EXPECT_EQ(p.pass, 4u);
  EXPECT_EQ(p.drop, 5u);
  EXPECT_EQ(p.fallback, 6u);
  EXPECT_EQ(p.run_cnt, 8u);
  EXPECT_EQ(p.run_time_ns, 900u);
  EXPECT_EQ(p.open_executors, 2);
  EXPECT_EQ(metrics::policy_sample(json::object(), "", "").executors.size(), 0u);
  EXPECT_EQ(metrics::policy_sample(json::object(), "", "").open_executors, -1) << "not a socket-select policy";
}

TEST(Metrics, PublishHandsOverSnapshots) {
  metrics::Metrics m;
  EXPECT_EQ(m.latest(), nullptr);
  EXPECT_NE(m.scrape().find("syrup_deploys_total 0\n"), std::string::npos);
  m.publish(sample_snapshot());
  EXPECT_EQ(m.scrape(), kRendered);
  metrics::Snapshot s;
  m.publish(s);
  EXPECT_GT(m.latest()->time_unix, 1.6e9) << "publish stamps the time";
}

std::set<int> blocked_signals_of_other_threads() {
  // SIGTERM blocked in every thread but this one?
  std::set<int> unblocked_tids;
  for (auto& t : fs::directory_iterator("/proc/self/task")) {
    int tid = std::stoi(t.path().filename());
    if (tid == gettid()) continue;
    std::ifstream in(t.path() / "status");
    for (std::string line; std::getline(in, line);)
      if (line.starts_with("SigBlk:")) {
        uint64_t mask = std::stoull(line.substr(7), nullptr, 16);
        if (!(mask & (1ull << (SIGTERM - 1))) || !(mask & (1ull << (SIGHUP - 1)))) unblocked_tids.insert(tid);
      }
  }
  return unblocked_tids;
}

TEST(MetricsHttp, ServesMetricsOnLoopbackWithAnEphemeralPort) {
  metrics::Metrics m;
  std::string err;
  ASSERT_EQ(m.start(0, err), 0) << err;
  ASSERT_GT(m.port(), 0);
  ASSERT_FALSE(m.addresses().empty());
  EXPECT_EQ(m.addresses()[0], "127.0.0.1:" + std::to_string(m.port()));
  EXPECT_TRUE(blocked_signals_of_other_threads().empty()) << "metrics threads must block the daemon's signals";
  m.publish(sample_snapshot());

  httplib::Client c("127.0.0.1", m.port());
  auto r = c.Get("/metrics");
  ASSERT_TRUE(r) << httplib::to_string(r.error());
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->get_header_value("Content-Type"), metrics::kContentType);
  EXPECT_EQ(r->body, kRendered);
  auto nf = c.Get("/nothing-here");
  ASSERT_TRUE(nf);
  EXPECT_EQ(nf->status, 404);

  // Only under a loopback name (no DNS rebinding from a browser).
  for (const char* host : {"localhost:1", "127.0.0.1", "[::1]:9464", "LOCALHOST"}) {
    auto ok = c.Get("/metrics", {{"Host", host}});
    ASSERT_TRUE(ok);
    EXPECT_EQ(ok->status, 200) << host;
  }
  for (const char* host : {"evil.example:9464", "127.0.0.1.evil.example", "[::2]:1"}) {
    auto no = c.Get("/metrics", {{"Host", host}});
    ASSERT_TRUE(no);
    EXPECT_EQ(no->status, 403) << host;
  }

  // A new snapshot shows in the next scrape.
  metrics::Snapshot s = sample_snapshot();
  s.totals.deploys = 99;
  m.publish(s);
  r = c.Get("/metrics");
  ASSERT_TRUE(r);
  EXPECT_NE(r->body.find("syrup_deploys_total 99\n"), std::string::npos);

  // ::1 too, when the host has IPv6.
  if (m.addresses().size() > 1) {
    EXPECT_EQ(m.addresses()[1], "[::1]:" + std::to_string(m.port()));
    httplib::Client c6("::1", m.port());
    auto r6 = c6.Get("/metrics");
    ASSERT_TRUE(r6) << httplib::to_string(r6.error());
    EXPECT_EQ(r6->status, 200);
  }

  // The same port twice: refused, and the first server keeps serving.
  metrics::Metrics other;
  EXPECT_LT(other.start(m.port(), err), 0);
  EXPECT_NE(err.find("cannot listen on 127.0.0.1:" + std::to_string(m.port())), std::string::npos) << err;
  int port = m.port();
  m.stop();
  httplib::Client after("127.0.0.1", port);
  after.set_connection_timeout(1);
  EXPECT_FALSE(after.Get("/metrics")) << "stopped";
}

size_t open_fds() {
  size_t n = 0;
  for ([[maybe_unused]] auto& e : fs::directory_iterator("/proc/self/fd")) n++;
  return n;
}

// Whether the server has closed `c` (reads 0 within `ms`), as opposed to keeping it open.
bool closed_by_server(int c, int ms) {
  pollfd p{c, POLLIN, 0};
  if (poll(&p, 1, ms) != 1) return false;
  char b;
  return recv(c, &b, 1, MSG_DONTWAIT) == 0;
}

// Clients that connect and say nothing hold at most the endpoint's 64 connections of
// syrupd's descriptors, not one each, and a scrape is served at once while they are
// there (before the epoll endpoint, 2 threads took them one at a time, each waiting out
// its 5 s read timeout, and the scrape waited in the listen backlog behind them).
TEST(MetricsHttp, IdleClientsNeitherTakeTheDaemonsDescriptorsNorDelayAScrape) {
  metrics::Metrics m;
  std::string err;
  ASSERT_EQ(m.start(0, err), 0) << err;
  m.publish(sample_snapshot());
  size_t before = open_fds();
  constexpr size_t kClients = 200;
  std::vector<int> clients;
  for (size_t i = 0; i < kClients; i++) {
    int c = tcp_connect(m.port(), true);  // EINPROGRESS: the kernel goes on
    ASSERT_GE(c, 0);
    clients.push_back(c);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // the endpoint accepts what it may
  size_t held = open_fds() - before - kClients;
  EXPECT_LE(held, 64u) << "the endpoint accepted a connection per idle client";
  auto t0 = std::chrono::steady_clock::now();
  std::string r = http_exchange(m.port(), "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(r.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << r;
  EXPECT_NE(r.find(kRendered), std::string::npos);
  EXPECT_LT(s, 1.0) << "the scrape waited behind the idle clients";
  for (int c : clients) close(c);
}

// The HTTP endpoint itself (http_endpoint.h), with a handler that echoes what it got.
struct EchoEndpoint {
  std::vector<http::Request> seen;
  http::Endpoint ep;
  uint16_t port = 0;
  explicit EchoEndpoint(http::Limits limits = {})
      : ep([this](const http::Request& r) {
          seen.push_back(r);
          return http::Response{r.path == "/missing" ? 404 : 200, "text/plain", r.method + " " + r.path + " " + r.host};
        }, limits) {
    int p = ep.add_listener("127.0.0.1", 0);
    EXPECT_GT(p, 0);
    port = static_cast<uint16_t>(p);
    EXPECT_EQ(ep.start(), 0);
  }
};

TEST(HttpEndpoint, AnswersEachRequestAndClosesTheConnection) {
  EchoEndpoint e;
  EXPECT_EQ(http_exchange(e.port, "GET /metrics?x=1 HTTP/1.1\r\nhOsT:  localhost:9 \r\nAccept: */*\r\n\r\n"),
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 24\r\nConnection: close\r\n\r\n"
            "GET /metrics localhost:9");
  // HEAD: the same head, no body.
  EXPECT_EQ(http_exchange(e.port, "HEAD / HTTP/1.0\r\n\r\n"),
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 7\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(http_exchange(e.port, "GET /missing HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 404 Not Found\r\n", 0), 0u);
  // Refused before the handler: other methods, a malformed line, too long a head.
  std::string post = http_exchange(e.port, "POST /metrics HTTP/1.1\r\nContent-Length: 2\r\n\r\nhi");
  EXPECT_EQ(post.rfind("HTTP/1.1 405 Method Not Allowed\r\n", 0), 0u) << post;
  EXPECT_NE(post.find("\r\nAllow: GET, HEAD\r\n"), std::string::npos) << post;
  EXPECT_EQ(http_exchange(e.port, "hello\r\n\r\n").rfind("HTTP/1.1 400 Bad Request\r\n", 0), 0u);
  EXPECT_EQ(http_exchange(e.port, "GET / SPDY/3\r\n\r\n").rfind("HTTP/1.1 400 Bad Request\r\n", 0), 0u);
  EXPECT_EQ(http_exchange(e.port, "GET http://x/ HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 400 Bad Request\r\n", 0), 0u);
  EXPECT_EQ(http_exchange(e.port, "GET ?a HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 400 Bad Request\r\n", 0), 0u);
  EXPECT_EQ(http_exchange(e.port, "GET / HTTP/1.1\r\nHost: a\rb\r\n\r\n").rfind("HTTP/1.1 400 Bad Request\r\n", 0), 0u);
  std::string big = http_exchange(e.port, "GET / HTTP/1.1\r\nX-Pad: " + std::string(10000, 'a') + "\r\n\r\n");
  EXPECT_EQ(big.rfind("HTTP/1.1 431 Request Header Fields Too Large\r\n", 0), 0u) << big.substr(0, 100);
  // Bare line ends, as typed into nc.
  EXPECT_NE(http_exchange(e.port, "GET /typed HTTP/1.0\n\n").find("\r\n\r\nGET /typed "), std::string::npos);
  // A request that arrives a few bytes at a time is answered when it is whole.
  int c = tcp_connect(e.port);
  ASSERT_GE(c, 0);
  for (const char* part : {"GE", "T /slow HT", "TP/1.1\r\n", "\r\n"}) {
    send(c, part, strlen(part), MSG_NOSIGNAL);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_NE(read_all(c).find("\r\n\r\nGET /slow "), std::string::npos);
  close(c);
  // Only the well-formed GET and HEAD requests reached the handler.
  e.ep.stop();  // its thread wrote `seen`
  ASSERT_EQ(e.seen.size(), 5u);
  EXPECT_EQ(e.seen[0].path, "/metrics");
  EXPECT_EQ(e.seen[1].method, "HEAD");
  EXPECT_EQ(e.seen[3].path, "/typed");
  EXPECT_EQ(e.seen[4].path, "/slow");
}

// A handler without an answer yet returns Later: it is asked again on wake(), or once
// more when the wait is over (then a second Later is answered 503), and the other
// connections are served meanwhile.
TEST(HttpEndpoint, ALaterAnswerIsAskedForAgainOnWakeOrWhenItsWaitIsOver) {
  std::atomic<bool> ready{false};
  std::atomic<int> calls{0};
  http::Endpoint ep([&](const http::Request& r) -> http::Reply {
    calls++;
    if (r.path == "/now") return http::Response{.body = "now"};
    if (r.path == "/never" || (!ready && !r.last_call)) return http::Later{std::chrono::milliseconds(300)};
    return http::Response{.body = r.last_call ? "late" : "woken"};
  });
  int port = ep.add_listener("127.0.0.1", 0);
  ASSERT_GT(port, 0);
  ASSERT_EQ(ep.start(), 0);
  auto get = [&](const std::string& path, const std::string& method = "GET") {
    return http_exchange(static_cast<uint16_t>(port), method + " " + path + " HTTP/1.1\r\nHost: x\r\n\r\n");
  };
  auto body = [](const std::string& r) { return r.substr(r.find("\r\n\r\n") + 4); };

  // Woken: answered by the call after wake(), not at the end of its wait.
  std::string woken;
  std::thread t([&] { woken = get("/wait"); });
  for (int i = 0; i < 300 && calls < 1; i++) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(calls.load(), 1);  // not ASSERT: `t` is joined below in any case
  EXPECT_EQ(body(get("/now")), "now") << "the parked request held up another";
  ready = true;
  ep.wake();
  t.join();
  EXPECT_EQ(woken.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << woken;
  EXPECT_EQ(body(woken), "woken");
  ready = false;

  // Nobody wakes it: asked once more when the wait is over.
  auto t0 = std::chrono::steady_clock::now();
  std::string late = get("/wait", "HEAD");
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(300));
  EXPECT_EQ(late.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << late;
  EXPECT_NE(late.find("Content-Length: 4\r\n"), std::string::npos) << late;
  EXPECT_EQ(body(late), "") << "a body for HEAD";

  // Still no answer then: 503.
  std::string never = get("/never");
  EXPECT_EQ(never.rfind("HTTP/1.1 503 Service Unavailable\r\n", 0), 0u) << never;
}

TEST(HttpEndpoint, ClosesAConnectionAtItsDeadlineWhateverTheClientDoes) {
  EchoEndpoint e(http::Limits{.deadline = std::chrono::milliseconds(300)});
  int silent = tcp_connect(e.port), partial = tcp_connect(e.port);
  ASSERT_GE(silent, 0);
  ASSERT_GE(partial, 0);
  send(partial, "GET / HTTP/1.1\r\n", 16, MSG_NOSIGNAL);
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(closed_by_server(silent, 100)) << "closed before its deadline";
  EXPECT_TRUE(closed_by_server(silent, 2000));
  EXPECT_TRUE(closed_by_server(partial, 2000));
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(s, 1.5);
  close(silent);
  close(partial);
  e.ep.stop();
  EXPECT_TRUE(e.seen.empty());
}

TEST(HttpEndpoint, TheOldestSilentConnectionMakesRoomForANewOne) {
  EchoEndpoint e(http::Limits{.max_connections = 4});
  std::vector<int> silent;
  for (int i = 0; i < 4; i++) {
    silent.push_back(tcp_connect(e.port));
    ASSERT_GE(silent.back(), 0);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // accepted in this order
  }
  // The fifth is served, in place of the first silent one; the other three stay.
  EXPECT_EQ(http_exchange(e.port, "GET /fifth HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 200 OK\r\n", 0), 0u);
  EXPECT_TRUE(closed_by_server(silent[0], 1000));
  for (int i = 1; i < 4; i++) EXPECT_FALSE(closed_by_server(silent[i], 100)) << "silent connection " << i;
  for (int c : silent) close(c);
}

TEST(MetricsHttp, ListensOnLoopbackOnly) {
  metrics::Metrics m;
  std::string err;
  ASSERT_EQ(m.start(0, err), 0) << err;
  // Every listening socket on the port is bound to a loopback address.
  int found = 0;
  for (const char* file : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(file);
    std::string line;
    std::getline(in, line);
    while (std::getline(in, line)) {
      std::istringstream ls(line);
      std::string sl, local, remote, st;
      ls >> sl >> local >> remote >> st;
      if (st != "0A") continue;  // LISTEN
      auto colon = local.rfind(':');
      if (std::stoul(local.substr(colon + 1), nullptr, 16) != m.port()) continue;
      std::string addr = local.substr(0, colon);
      found++;
      EXPECT_TRUE(addr == "0100007F" || addr == "00000000000000000000000001000000") << file << ": " << addr;
    }
  }
  EXPECT_GE(found, 1);
}

// --metrics_address: the endpoint listens on that address alone; off loopback a Host that
// is an IP address literal is served (what Prometheus and the kubelet send), a name only
// if it is a loopback one (no DNS rebinding). /readyz: 503 until set_ready(), then 200.
// 127.0.0.2 stands for a pod's address: loopback to the kernel, not to the endpoint.
TEST(MetricsHttp, ServesAnotherAddressAndReadyz) {
  metrics::Metrics m;
  std::string err;
  ASSERT_EQ(m.start("127.0.0.2", 0, err), 0) << err;
  ASSERT_EQ(m.addresses(), std::vector<std::string>{"127.0.0.2:" + std::to_string(m.port())});
  auto get = [&](const std::string& path, const std::string& host) {
    int c = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(m.port());
    inet_pton(AF_INET, "127.0.0.2", &a.sin_addr);
    if (connect(c, reinterpret_cast<sockaddr*>(&a), sizeof a) < 0) {
      close(c);
      return std::string("connect: ") + std::strerror(errno);
    }
    std::string req = "GET " + path + " HTTP/1.1\r\nHost: " + host + "\r\n\r\n";
    send(c, req.data(), req.size(), MSG_NOSIGNAL);
    std::string r = read_all(c);
    close(c);
    return r.substr(0, r.find("\r\n"));
  };
  EXPECT_EQ(get("/metrics", "127.0.0.2:" + std::to_string(m.port())), "HTTP/1.1 200 OK");
  EXPECT_EQ(get("/metrics", "[fd00::5]:9464"), "HTTP/1.1 200 OK");
  EXPECT_EQ(get("/metrics", "localhost"), "HTTP/1.1 200 OK");
  for (const char* host : {"evil.example", "10.0.0.1.evil.example:9464", "[fd00::5"})
    EXPECT_EQ(get("/metrics", host), "HTTP/1.1 403 Forbidden") << host;
  EXPECT_EQ(get("/readyz", "127.0.0.2"), "HTTP/1.1 503 Service Unavailable");
  m.set_ready();
  EXPECT_EQ(get("/readyz", "127.0.0.2"), "HTTP/1.1 200 OK");
  EXPECT_EQ(get("/readyz", "evil.example"), "HTTP/1.1 403 Forbidden");
  // Nothing listens on 127.0.0.1 at that port.
  EXPECT_EQ(http_exchange(m.port(), "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").rfind("connect: ", 0), 0u);
}

TEST(MetricsHttp, ScrapeAsksTheDaemonForAFreshSnapshot) {
  metrics::Metrics m;
  int efd = m.refresh_fd(std::chrono::milliseconds(0), std::chrono::milliseconds(2000));
  ASSERT_GE(efd, 0);
  std::string err;
  ASSERT_EQ(m.start(0, err), 0) << err;
  // The "daemon": waits for the request on the eventfd, then publishes.
  std::atomic<bool> stop{false};
  std::thread daemon([&] {
    uint64_t n = 0;
    while (!stop) {
      if (read(efd, &n, sizeof n) == sizeof n) {
        metrics::Snapshot s;
        s.totals.deploys = 42;
        m.publish(s);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  });
  httplib::Client c("127.0.0.1", m.port());
  auto r = c.Get("/metrics");
  stop = true;
  daemon.join();
  ASSERT_TRUE(r);
  EXPECT_NE(r->body.find("syrup_deploys_total 42\n"), std::string::npos) << r->body;

  // Nobody answers: the scrape gives what it has after the wait.
  metrics::Metrics m2;
  ASSERT_GE(m2.refresh_fd(std::chrono::milliseconds(0), std::chrono::milliseconds(50)), 0);
  ASSERT_EQ(m2.start(0, err), 0) << err;
  metrics::Snapshot s;
  s.totals.deploys = 7;
  m2.publish(s);
  auto t0 = std::chrono::steady_clock::now();
  std::string r2 = http_exchange(m2.port(), "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(50)) << "it did not wait";
  EXPECT_NE(r2.find("syrup_deploys_total 7\n"), std::string::npos) << r2;
}

// A scrape waiting for a fresh snapshot is parked: the endpoint answers other requests
// meanwhile, and one publish answers every waiting scrape. (Before, the scrape blocked
// the endpoint's one thread for up to its wait.)
TEST(MetricsHttp, AScrapeWaitingForAFreshSnapshotHoldsUpNoOtherRequest) {
  metrics::Metrics m;
  int efd = m.refresh_fd(std::chrono::milliseconds(0), std::chrono::milliseconds(4000));
  ASSERT_GE(efd, 0);
  std::string err;
  ASSERT_EQ(m.start(0, err), 0) << err;
  m.publish(sample_snapshot());
  const std::string get_metrics = "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
  auto asked = [&] {  // the scrape asked the daemon: the eventfd is readable
    pollfd p{efd, POLLIN, 0};
    uint64_t n;
    return poll(&p, 1, 3000) == 1 && read(efd, &n, sizeof n) == sizeof n;
  };
  std::atomic<int> done{0};
  std::string ra, rc;
  // No ASSERT while the client threads run: they are joined below in any case.
  std::thread a([&] { ra = http_exchange(m.port(), get_metrics); done++; });
  bool a_asked = asked();
  std::thread c([&] { rc = http_exchange(m.port(), get_metrics); done++; });
  bool c_asked = asked();

  std::string rb = http_exchange(m.port(), "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
  EXPECT_EQ(rb.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << rb;
  EXPECT_EQ(done.load(), 0) << "a request was answered only after the waiting scrapes";

  metrics::Snapshot s;
  s.totals.deploys = 42;
  m.publish(s);
  a.join();
  c.join();
  EXPECT_TRUE(a_asked) << "the first scrape did not ask for a fresh snapshot";
  EXPECT_TRUE(c_asked) << "the second scrape did not ask for a fresh snapshot";
  EXPECT_NE(ra.find("syrup_deploys_total 42\n"), std::string::npos) << ra;
  EXPECT_NE(rc.find("syrup_deploys_total 42\n"), std::string::npos) << rc;
}

}  // namespace
}  // namespace syrup
