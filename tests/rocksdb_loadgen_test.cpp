// Tests of examples/rocksdb/kv_loadgen's accounting, against a server whose behaviour is
// known exactly, and of the latency histogram it records into.
//
// Design: the test runs its own UDP server in a thread: ONE worker, FIFO, a fixed
// service time per request type (a busy wait, so it does not depend on timer slack),
// echoing id and stamp as kv_server does. With Poisson arrivals that is an M/D/1 queue,
// whose latencies are known in closed form, so the generator's rate, latency and loss
// accounting can be checked against numbers that do not come from the generator. The
// server also records every arrival, which checks the generator's side: Poisson gaps
// (coefficient of variation 1) and 50 distinct flows. No syrupd and no root needed.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <fstream>
#include <mutex>
#include <string>
#include <set>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "harness.h"
#include "histogram.h"
#include "kv_clock.h"
#include "kv_proto.h"

namespace syrup::test {
namespace {

using nlohmann::json;

// One FIFO worker with a fixed service time per type; optionally never answers request
// ids that are multiples of `drop_every`.
class FixedServer {
 public:
  FixedServer(uint64_t get_ns, uint64_t scan_ns, uint64_t drop_every = 0) : get_ns_(get_ns), scan_ns_(scan_ns),
                                                                            drop_every_(drop_every) {
    fd_ = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t l = sizeof a;
    bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a);
    getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &l);
    port_ = ntohs(a.sin_port);
    timeval tv{0, 50000};  // wake up now and then to see stop_
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    // Arrival times from the kernel, taken when the datagram reaches the socket, so a
    // server thread that runs late does not make the generator look bursty.
    int one = 1;
    setsockopt(fd_, SOL_SOCKET, SO_TIMESTAMPNS, &one, sizeof one);
    realtime_minus_mono_ = kv_clock_ns(CLOCK_REALTIME) - kv_now_ns();
    thread_ = std::thread([this] { loop(); });
  }
  ~FixedServer() {
    stop_ = true;
    thread_.join();
    close(fd_);
  }
  uint16_t port() const { return port_; }
  std::vector<uint64_t> arrivals() {
    std::lock_guard lk(mu_);
    return arrivals_;
  }
  std::set<uint16_t> flows() {
    std::lock_guard lk(mu_);
    return flows_;
  }
  // How long the idle server took to wake up, on average: from the arrival of a request
  // that found it idle (nothing in service) to the moment it started it. 0 when fewer
  // than 100 requests found it idle (a server that is never idle).
  double wake_mean_us() {
    std::lock_guard lk(mu_);
    return wakes_.count() >= 100 ? wakes_.mean() / 1e3 : 0;
  }
  // The same wake-ups' 99th percentile (0 when fewer than 100), reckoned as the load
  // generator reckons its own.
  double wake_p99_us() {
    std::lock_guard lk(mu_);
    return wakes_.count() >= 100 ? wakes_.percentile(99) / 1e3 : 0;
  }
  // How long the server stood still with work to do, in all, counting only stalls over
  // kStallNs (a slow wake-up, a gap before it started a queued request, or time past the
  // service time until it had answered); and the longest.
  static constexpr uint64_t kStallNs = 200000;
  double stalled_ms() {
    std::lock_guard lk(mu_);
    return static_cast<double>(stalled_ns_) / 1e6;
  }
  double stalled_pct() {
    std::lock_guard lk(mu_);
    return done_ > first_ ? 100.0 * static_cast<double>(stalled_ns_) / static_cast<double>(done_ - first_) : 0;
  }
  double stall_max_ms() {
    std::lock_guard lk(mu_);
    return static_cast<double>(stall_max_ns_) / 1e6;
  }

 private:
  void loop() {
    char buf[2048];
    while (!stop_) {
      sockaddr_in from{};
      socklen_t fl = sizeof from;
      char ctrl[CMSG_SPACE(sizeof(timespec))];
      iovec iov{buf, sizeof buf};
      msghdr m{};
      m.msg_name = &from;
      m.msg_namelen = fl;
      m.msg_iov = &iov;
      m.msg_iovlen = 1;
      m.msg_control = ctrl;
      m.msg_controllen = sizeof ctrl;
      ssize_t n = recvmsg(fd_, &m, 0);
      uint64_t t0 = kv_now_ns();
      if (n < static_cast<ssize_t>(sizeof(kv_request))) continue;
      uint64_t arrived = 0;
      for (cmsghdr* c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_TIMESTAMPNS) {
          timespec ts;
          memcpy(&ts, CMSG_DATA(c), sizeof ts);
          arrived = static_cast<uint64_t>(ts.tv_sec) * 1000000000ULL + static_cast<uint64_t>(ts.tv_nsec);
        }
      }
      kv_request q;
      memcpy(&q, buf, sizeof q);
      {
        std::lock_guard lk(mu_);
        arrivals_.push_back(arrived);
        flows_.insert(ntohs(from.sin_port));
        uint64_t arrived_mono = arrived - realtime_minus_mono_;
        if (arrived && arrived_mono >= done_) {
          wakes_.record(t0 > arrived_mono ? t0 - arrived_mono : 0);
        }
        if (arrived) stall(t0, std::max(arrived_mono, done_));
        if (!first_) first_ = t0;
      }
      uint64_t id = le64toh(q.id);
      if (drop_every_ && id % drop_every_ == 0) continue;
      uint64_t service = le32toh(q.type) == KV_SCAN ? scan_ns_ : get_ns_;
      while (kv_now_ns() - t0 < service) {
      }
      kv_response r{};
      r.status = htole32(KV_OK);
      r.type = q.type;
      r.id = q.id;
      r.stamp = q.stamp;
      sendto(fd_, &r, sizeof r, 0, reinterpret_cast<sockaddr*>(&from), fl);
      std::lock_guard lk(mu_);
      done_ = kv_now_ns();
      stall(done_, t0 + service);
    }
  }
  void stall(uint64_t at, uint64_t from) {
    if (at <= from + kStallNs) return;
    stalled_ns_ += at - from;
    stall_max_ns_ = std::max(stall_max_ns_, at - from);
  }

  uint64_t get_ns_, scan_ns_, drop_every_;
  int fd_ = -1;
  uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::mutex mu_;
  std::vector<uint64_t> arrivals_;
  std::set<uint16_t> flows_;
  kv::Histogram wakes_;  // of the idle server, ns
  uint64_t realtime_minus_mono_ = 0, done_ = 0, stalled_ns_ = 0, stall_max_ns_ = 0, first_ = 0;
};

// Runs kv_loadgen against `port`; its JSON result.
json loadgen(uint16_t port, const std::string& args) {
  char tmpl[] = "/tmp/syrup-kvtest-lg-XXXXXX";
  int fd = mkstemp(tmpl);
  close(fd);
  std::string out;
  int rc = run_cmd(build_bin("kv_loadgen") + " --port=" + std::to_string(port) + " --json=" + tmpl + " " + args, out);
  std::string text = read_text(tmpl);
  unlink(tmpl);
  EXPECT_EQ(rc, 0) << out;
  json j = json::parse(text, nullptr, false);
  EXPECT_TRUE(j.is_object()) << out;
  return j;
}

std::string num(double v) { return std::to_string(v); }

// What one attempt of a check found wrong (nothing: it passed), and whether the host, not
// the code, may explain it. `found`: timing checks, which a disturbed host may fail;
// `exact`: checks that involve no timing (what was scheduled, counted, configured, and
// bounds no host can break, such as no response before its service time), which fail
// the test in any attempt.
struct Problems {
  std::vector<std::string> found, exact;
  std::string host_late;  // "": the server kept to its service times
  Problems() = default;
  Problems(std::string what) : found{std::move(what)} {}  // NOLINT: one problem
  bool empty() const { return found.empty() && exact.empty(); }
};

void check(Problems& p, bool ok, const std::string& what) {
  if (!ok) p.found.push_back(what);
}
void check_exact(Problems& p, bool ok, const std::string& what) {
  if (!ok) p.exact.push_back(what);
}

// The timing checks assume a host that runs the VM's threads promptly. These VMs' vCPUs
// halt when idle and the host runs them again when it can, and in some episodes it runs
// them late, which the CPU counts inside the VM do not always show: then the generator
// stands still as the server does, so the queue and the send schedule are no longer the
// ones the checks compute. A few stalls of milliseconds are enough to move a mean or a
// p99: the backlog each leaves waits behind it. Seen here over 24 runs of these tests:
// passing attempts had idle wake-ups of 17-80 us on average and stood still (stalls over
// 200 us) for 0-1.3% of the run; the failing ones, 105-6000 us or 4.4-12.7%.
void judge_server(Problems& p, FixedServer& srv) {
  constexpr double kWakeUs = 100, kStalledPct = 2;
  double wake = srv.wake_mean_us(), stalled = srv.stalled_ms(), pct = srv.stalled_pct();
  std::printf("  the idle server woke up in %.1f us on average; it stood still for %.1f ms in all (%.2f%%, longest %.1f ms)\n",
              wake, stalled, pct, srv.stall_max_ms());
  if (wake > kWakeUs)
    p.host_late = "the idle server woke up in " + num(wake) + " us on average (over " + num(kWakeUs) + ")";
  else if (pct > kStalledPct)
    p.host_late = "the server stood still with work to do for " + num(pct) + "% of the run (over " + num(kStalledPct) + "%)";
}

// |observed - expected| within k standard deviations of a Poisson count. The counts
// checked are of the send schedule, drawn in advance, so no timing is involved.
void check_poisson_count(Problems& p, double observed, double expected, const std::string& what, double k = 5) {
  check_exact(p, std::fabs(observed - expected) <= k * std::sqrt(expected),
        what + ": " + num(observed) + " is more than " + num(k) + " sd from the Poisson mean " + num(expected));
}

// CPU seconds the whole machine has been busy (all cores), from /proc/stat.
double machine_busy_s() {
  std::ifstream f("/proc/stat");
  std::string cpu;
  double v[8] = {};
  f >> cpu;
  for (double& x : v) f >> x;
  return (v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / static_cast<double>(sysconf(_SC_CLK_TCK));
}
// CPU seconds of this process and its waited-for children (the load generator runs).
double own_cpu_s() {
  double t = 0;
  for (int who : {RUSAGE_SELF, RUSAGE_CHILDREN}) {
    rusage ru{};
    getrusage(who, &ru);
    t += static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
  }
  return t;
}

// Runs `attempt` (a fresh server and generator run each time) until it finds no problem,
// at most 5 times. The timing checks need the two cores to themselves: while an attempt
// runs, the CPU time of everything else on the machine is measured, and an attempt that
// fails while others used more than 0.3 of a core, or while the host ran the server late
// (judge_server), is counted as disturbed, not as a failure; the next one waits 2 s, to
// give a slow episode of the host time to pass (they last from seconds to minutes). A bug
// shows in undisturbed attempts too and fails the test; if every attempt was disturbed (a
// busy shared machine or a slow host) the test is skipped, saying so. A failed exact
// check (Problems::exact) fails the test at once, disturbed or not: it needs no quiet
// machine, so on a busy one the accounting is still checked.
template <typename F>
void until_clean(F attempt) {
  Problems p, undisturbed;
  double others = 0;
  bool undisturbed_failure = false;
  for (int i = 0; i < 5; i++) {
    auto t0 = std::chrono::steady_clock::now();
    double b0 = machine_busy_s(), o0 = own_cpu_s();
    p = attempt();
    double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    others = std::max(0.0, (machine_busy_s() - b0) - (own_cpu_s() - o0)) / wall;
    for (auto& s : p.exact) ADD_FAILURE() << "attempt " << i + 1 << ": " << s << " (involves no timing)";
    if (!p.exact.empty()) return;
    if (p.empty()) return;
    bool disturbed = others > 0.3 || !p.host_late.empty();
    for (auto& s : p.found)
      fprintf(stderr, "attempt %d (others used %.2f cores%s%s): %s\n", i + 1, others, p.host_late.empty() ? "" : "; ",
              p.host_late.c_str(), s.c_str());
    if (!disturbed) {
      undisturbed_failure = true;
      undisturbed = p;
    } else if (i < 4) {
      std::this_thread::sleep_for(std::chrono::seconds(2));
    }
  }
  if (!undisturbed_failure)
    GTEST_SKIP() << "every attempt was disturbed (last: others used " << others << " cores"
                 << (p.host_late.empty() ? "" : "; " + p.host_late)
                 << "); timing checks need a quiet machine (last attempt: " << p.found.front()
                 << "); the checks that involve no timing passed in every attempt";
  for (auto& s : undisturbed.found) ADD_FAILURE() << s;
}

TEST(KvLoadgen, RateAndLatencyMatchAnMD1QueueWithAKnownServiceTime) {
  constexpr double kS = 200, kRate = 2000, kT = 2;  // us, req/s, s: rho = 0.4
  until_clean([&] {
    Problems p;
    FixedServer srv(static_cast<uint64_t>(kS * 1000), 0);
    json j = loadgen(srv.port(), "--rate=2000 --duration=2 --warmup=0.3 --get_pct=100 --drain_ms=500");
    if (!j.is_object()) return Problems{"no result"};
    check_poisson_count(p, j["sent"].get<double>(), kRate * kT, "requests sent in the window");
    check(p, j["lost"].get<uint64_t>() == 0, "lost " + j["lost"].dump());
    check(p, j["answered_ok"] == j["sent"], "answered " + j["answered_ok"].dump() + " of " + j["sent"].dump());
    // Answers received in the window: the offered rate, up to the requests in flight at
    // its two edges.
    check(p, std::fabs(j["throughput_rps"].get<double>() - j["offered_rps"].get<double>()) <= 0.02 * kRate,
          "throughput " + j["throughput_rps"].dump() + "/s, offered " + j["offered_rps"].dump() + "/s");
    check_exact(p, j["offered_rps"].get<double>() == j["sent"].get<double>() / kT, "offered != sent / T");

    // M/D/1, rho = 0.4: no response is faster than the service time; 60% of requests
    // find the server idle, so the median is the service time plus the loopback round
    // trip; the mean wait is rho*S/(2(1-rho)) = 66.7 us. Loopback adds tens of us.
    const double rho = kRate * kS / 1e6, wait = rho * kS / (2 * (1 - rho));
    auto g = j["types"]["get"];
    double mn = g["min_us"].get<double>(), p50 = g["p50_us"].get<double>(), mean = g["mean_us"].get<double>();
    check_exact(p, mn >= kS * 0.995, "a response faster than the service time: " + num(mn) + " us");
    check(p, p50 >= kS && p50 <= kS + 100, "p50 " + num(p50) + " us, want [S, S + 100]");
    check(p, mean >= kS + 0.5 * wait && mean <= kS + wait + 150,
          "mean " + num(mean) + " us, M/D/1 says " + num(kS + wait) + " + round trip");
    check_exact(p, j["types"]["scan"]["n"].get<uint64_t>() == 0, "SCANs in a 100% GET mix");

    // The generator's side, seen by the server: Poisson gaps (an exponential's
    // coefficient of variation is 1) at the rate, and 50 distinct flows.
    // Too few arrivals for the gap statistics is a problem of its own, added to the ones
    // found above; the server's judgement below still decides whether it counts.
    auto arr = srv.arrivals();
    check(p, arr.size() >= 1000, "server saw only " + num(arr.size()) + " requests");
    if (arr.size() >= 1000) {
      double sum = 0, sq = 0;
      for (size_t i = 1; i < arr.size(); i++) {
        double d = static_cast<double>(arr[i] - arr[i - 1]);
        sum += d;
        sq += d * d;
      }
      double n = static_cast<double>(arr.size() - 1), gap = sum / n, cv = std::sqrt(sq / n - gap * gap) / gap;
      check(p, std::fabs(gap - 1e9 / kRate) <= 0.1 * 1e9 / kRate, "mean gap " + num(gap) + " ns");
      check(p, std::fabs(cv - 1.0) <= 0.15, "arrivals are not Poisson: gap CV " + num(cv));
    }
    check_exact(p, srv.flows().size() == 50, "flows seen: " + num(srv.flows().size()));
    judge_server(p, srv);
    return p;
  });
}

TEST(KvLoadgen, LatencyIsAccountedPerRequestType) {
  // 80% GETs of 50 us, 20% SCANs of 600 us, 300 req/s: load under 5%, so each type's
  // median is its own service time plus the round trip. The round trip is the host's (the
  // idle server's wake-up: 50-150 us on this VM, depending on the moment), so the checks
  // are that no median is below its service time, that the medians are 550 us apart (the
  // round trip is common to both), and that the round trip stays under 350 us.
  until_clean([&] {
    Problems p;
    FixedServer srv(50000, 600000);
    json j = loadgen(srv.port(), "--rate=300 --duration=2 --warmup=0.2 --get_pct=80 --drain_ms=500");
    if (!j.is_object()) return Problems{"no result"};
    double gets = j["sent_by_type"]["get"].get<double>(), scans = j["sent_by_type"]["scan"].get<double>();
    double total = gets + scans;
    check_exact(p, std::fabs(scans / total - 0.2) <= 5 * std::sqrt(0.2 * 0.8 / total), "SCAN share " + num(scans / total));
    check(p, j["types"]["get"]["n"].get<double>() == gets, "GETs recorded != GETs sent");
    check(p, j["types"]["scan"]["n"].get<double>() == scans, "SCANs recorded != SCANs sent");
    double g50 = j["types"]["get"]["p50_us"].get<double>(), s50 = j["types"]["scan"]["p50_us"].get<double>();
    check_exact(p, g50 >= 50, "GET p50 " + num(g50) + " us, below its 50 us service time");
    check(p, g50 <= 400, "GET p50 " + num(g50) + " us, want at most 400");
    check_exact(p, s50 >= 600, "SCAN p50 " + num(s50) + " us, want at least 600");
    check(p, std::fabs((s50 - g50) - 550) <= 50,
          "SCAN p50 - GET p50 = " + num(s50 - g50) + " us, want 550 +- 50 (GET p50 " + num(g50) + ", SCAN p50 " + num(s50) + ")");
    judge_server(p, srv);
    return p;
  });
}

// --idle_sleep_us: between sends the generator sleeps instead of spinning, so its core
// is mostly free, yet its sends keep to the Poisson schedule and every answer is counted.
TEST(KvLoadgen, IdleSleepFreesTheCoreAndKeepsTheSchedule) {
  constexpr double kRate = 2000, kT = 1;
  until_clean([&] {
    Problems p;
    FixedServer srv(20000, 0);
    rusage r0{}, r1{};
    getrusage(RUSAGE_CHILDREN, &r0);
    auto t0 = std::chrono::steady_clock::now();
    json j = loadgen(srv.port(), "--rate=2000 --duration=1 --warmup=0.2 --tail=0.1 --get_pct=100 --drain_ms=300 "
                                 "--idle_sleep_us=20");
    double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    getrusage(RUSAGE_CHILDREN, &r1);
    if (!j.is_object()) return Problems{"no result"};
    auto secs = [](const timeval& a, const timeval& b) { return double(b.tv_sec - a.tv_sec) + double(b.tv_usec - a.tv_usec) / 1e6; };
    double cpu = secs(r0.ru_utime, r1.ru_utime) + secs(r0.ru_stime, r1.ru_stime);
    check_exact(p, j["config"]["idle_sleep_us"] == 20, "idle_sleep_us not in the result's config");
    check_poisson_count(p, j["sent"].get<double>(), kRate * kT, "requests sent in the window");
    check(p, j["lost"].get<uint64_t>() == 0 && j["answered_ok"] == j["sent"], "answered " + j["answered_ok"].dump() +
                                                                                 " of " + j["sent"].dump());
    // Waking 20 us ahead of each send and spinning to its time, most sends leave on the
    // dot: without the early wake-up the median send would be as late as the median
    // wake-up (~10 us on these VMs; ~55 us with the default timer slack). The tail is the
    // machine's, so it is judged side by side. Sleeping adds the host's wake-ups: those
    // of the generator's sleeps that ran to their end (reported by the generator), and
    // those of sleeps a response ended, which the generator cannot time; the idle
    // server's wake-ups in the same run, from the kernel's arrival stamp, are wake-ups of
    // that kind. The same generator without sleeping (right after, on the same server)
    // shows what the machine does to one that never sleeps. Sleeping never makes a send
    // later than the two together. (Quiet: sleeping p99 33-103 us, timed wake-ups 47-104
    // us, spinning 5-23 us.)
    double srv_wake99 = srv.wake_p99_us();
    json spin = loadgen(srv.port(), "--rate=2000 --duration=1 --warmup=0.2 --tail=0.1 --get_pct=100 --drain_ms=300");
    if (!spin.is_object()) return Problems{"no result without --idle_sleep_us"};
    const json& g = j["generator"];
    double lag50 = g["send_lag_p50_us"].get<double>(), lag99 = g["send_lag_p99_us"].get<double>();
    double wake50 = g["wake_late_p50_us"].get<double>(), wake99 = g["wake_late_p99_us"].get<double>();
    double spin99 = spin["generator"]["send_lag_p99_us"].get<double>();
    std::printf("  send lag p99: %.1f us sleeping (wake-ups at p99: timed %.1f us, the server's %.1f us), %.1f us spinning\n",
                lag99, wake99, srv_wake99, spin99);
    check(p, g["sleeps"].get<double>() > 0.5 * kRate * kT, "slept before only " + g["sleeps"].dump() + " sends");
    check(p, lag50 <= std::max(0.0, wake50 - 20) + 3,
          "send lag p50 " + num(lag50) + " us with the kernel's wake-ups " + num(wake50) + " us late at p50");
    check(p, lag99 <= std::max(wake99, srv_wake99) + spin99 + 10,
          "send lag p99 " + num(lag99) + " us with wake-ups at p99 " + num(wake99) + " us late (timed) and " +
              num(srv_wake99) + " us (the server's), and the generator's send lag without sleeping " + num(spin99) +
              " us at p99");
    // The slack as the kernel reports it: a median wake-up under some fixed bound is no
    // proof of it, since these VMs' wake-ups alone took 35-45 us at p50 on slow days.
    check_exact(p, g.value("timer_slack_ns", -1L) == 1,
                "the generator's timer slack is " + g.value("timer_slack_ns", json(nullptr)).dump() +
                    " ns while it sleeps, not 1 ns");
    // A spinning generator uses its whole core for the run (~1.3 s of CPU here); asleep
    // between sends it needs a small part of it (the drain at the end still spins).
    check(p, cpu <= 0.5 * wall, "the generator used " + num(cpu) + " s of CPU in " + num(wall) + " s");
    judge_server(p, srv);
    return p;
  });
}

TEST(KvLoadgen, LossIsCountedExactly) {
  // Every request whose id is a multiple of 10 goes unanswered; with no warm-up and no
  // tail every request is measured, so the loss is known exactly. (No timing involved.)
  FixedServer srv(20000, 20000, 10);
  json j = loadgen(srv.port(), "--rate=1000 --duration=1 --warmup=0 --tail=0 --get_pct=50 --drain_ms=300");
  ASSERT_TRUE(j.is_object());
  uint64_t sent = j["sent"].get<uint64_t>();
  EXPECT_EQ(j["lost"].get<uint64_t>(), (sent + 9) / 10);
  EXPECT_EQ(j["answered"].get<uint64_t>() + j["lost"].get<uint64_t>(), sent);
  EXPECT_EQ(j["lost_by_type"]["get"].get<uint64_t>() + j["lost_by_type"]["scan"].get<uint64_t>(),
            j["lost"].get<uint64_t>());
  EXPECT_EQ(j["errors"].get<uint64_t>(), 0u);
}

TEST(KvLoadgen, FixedSourcePortsAndTheTraceAccountForEveryRequest) {
  // --src_port_base: the 50 flows come from base .. base + 49 (the same 5-tuples in every
  // run, so the kernel hash spreads them the same way). --trace: one line per request,
  // answered ones with the worker that answered, unanswered ones (every 10th id here)
  // with -1. (No timing involved.)
  FixedServer srv(20000, 20000, 10);
  const int base = 21000 + static_cast<int>(getpid() % 500) * 64;
  char tmpl[] = "/tmp/syrup-kvtest-trace-XXXXXX";
  int fd = mkstemp(tmpl);
  close(fd);
  json j = loadgen(srv.port(), "--rate=1000 --duration=0.5 --warmup=0 --tail=0 --get_pct=50 --drain_ms=300 "
                               "--src_port_base=" + std::to_string(base) + " --trace=" + tmpl);
  std::ifstream f(tmpl);
  std::string line;
  std::getline(f, line);
  EXPECT_EQ(line, "id,type,sched_ns,sent_ns,answered_ns,worker,measured");
  uint64_t rows = 0, unanswered = 0, bad = 0;
  while (std::getline(f, line)) {
    uint64_t id, sched, sent, answered;
    int worker, measured;
    char type[8];
    if (sscanf(line.c_str(), "%lu,%7[a-z],%lu,%lu,%lu,%d,%d", &id, type, &sched, &sent, &answered, &worker,
               &measured) != 7 || id != rows) {
      ADD_FAILURE() << "trace line " << rows << ": " << line;
      break;
    }
    rows++;
    if (id % 10 == 0) {
      unanswered += worker == -1;
    } else if (worker != 0 || answered < sent || sent < sched) {
      bad++;
    }
  }
  unlink(tmpl);
  ASSERT_TRUE(j.is_object());
  EXPECT_EQ(rows, j["sent"].get<uint64_t>()) << "one trace line per request";
  EXPECT_EQ(unanswered, (rows + 9) / 10) << "the unanswered requests are the dropped ones";
  EXPECT_EQ(bad, 0u) << "answered requests with the wrong worker or times out of order";
  std::set<uint16_t> want;
  for (int i = 0; i < 50; i++) want.insert(static_cast<uint16_t>(base + i));
  EXPECT_EQ(srv.flows(), want) << "the flows did not come from --src_port_base + 0..49";
}

TEST(KvLoadgen, OpenLoopKeepsTheOfferedRateWhenTheServerCannot) {
  // A server that can do 1000 req/s offered 2000 req/s: a closed-loop client would slow
  // down to 1000; an open-loop one keeps sending 2000/s, the queue (and latency) grows
  // and the excess is lost at the socket.
  until_clean([&] {
    Problems p;
    FixedServer srv(1000000, 1000000);
    json j = loadgen(srv.port(), "--rate=2000 --duration=1.5 --warmup=0 --tail=0 --get_pct=100 --drain_ms=300");
    if (!j.is_object()) return Problems{"no result"};
    check_poisson_count(p, j["sent"].get<double>(), 3000, "requests sent");
    double thr = j["throughput_rps"].get<double>();
    check(p, thr >= 900 && thr <= 1050, "throughput " + num(thr) + "/s from a 1000/s server");
    check(p, j["lost"].get<uint64_t>() > 0, "nothing lost at twice the capacity");
    check_exact(p, j["answered"].get<uint64_t>() + j["lost"].get<uint64_t>() == j["sent"].get<uint64_t>(),
          "answered + lost != sent");
    check(p, j["types"]["get"]["p99_us"].get<double>() > 100000, "the queue does not show in the latency");
    check(p, j["generator"]["late_sends_pct"].get<double>() < 5.0, "the generator fell behind its schedule");
    judge_server(p, srv);
    return p;
  });
}

TEST(KvHistogram, PercentilesAreWithinHalfABucket) {
  kv::Histogram h;
  for (uint64_t v = 1; v <= 100000; v++) h.record(v * 1000);  // 1 us .. 100 ms, uniform
  EXPECT_EQ(h.count(), 100000u);
  EXPECT_EQ(h.min(), 1000u);
  EXPECT_EQ(h.max(), 100000000u);
  EXPECT_DOUBLE_EQ(h.mean(), 50000.5 * 1000);
  for (double p : {1.0, 50.0, 90.0, 99.0, 99.9}) {
    double want = p / 100 * 100000 * 1000;
    EXPECT_NEAR(h.percentile(p), want, want * 0.004 + 1000) << "p" << p;
  }
  EXPECT_EQ(h.percentile(100), 100000000.0);
  // Every value falls in the bucket whose bounds contain it, and small values are exact.
  for (uint64_t v : {0ULL, 1ULL, 255ULL, 256ULL, 257ULL, 1000ULL, 123456789ULL, 1ULL << 40}) {
    size_t i = kv::Histogram::index(v);
    EXPECT_LE(kv::Histogram::lower(i), v);
    EXPECT_GT(kv::Histogram::lower(i) + kv::Histogram::width(i), v);
    if (v < 256) {
      EXPECT_EQ(kv::Histogram::width(i), 1u);
    }
  }
  kv::Histogram a, b;
  a.record(10);
  b.record(30);
  a.merge(b);
  EXPECT_EQ(a.count(), 2u);
  EXPECT_EQ(a.percentile(50), 10.0);
  EXPECT_EQ(a.percentile(100), 30.0);
}

}  // namespace
}  // namespace syrup::test
