// kv_loadgen: an open-loop load generator for kv_server (kv_proto.h).
//
// Design:
// - Open loop: request i is scheduled at t_i, with exponential gaps at the offered rate
//   (Poisson arrivals), decided in advance of and independently from the responses, so
//   a slow server cannot slow the offered load. A request's latency is measured from its
//   SCHEDULED time (carried in the request and echoed), not from when it actually left,
//   so a generator that falls behind shows up as latency instead of hiding it.
// - 50 client flows (by default): 50 UDP sockets, each bound to its own source port and
//   connected to the server, i.e. 50 distinct 5-tuples; each request picks a flow at
//   random (the sum of 50 Poisson flows of rate/50). Types follow the mix (--get_pct),
//   keys are uniform. The kernel's SO_REUSEPORT hash of the 5-tuples decides how evenly
//   the flows spread over the server's sockets; with --src_port_base the ports (and so
//   that spread) are the same in every run, as with a fixed set of clients.
// - One thread, pinned (--cpu), busy-polling: send whatever is due, then take whatever
//   responses are ready (epoll with a zero timeout), timestamping each on arrival. No
//   sleeping means no wake-up latency in the measurement, and one thread means the
//   sender and the receiver never wait for each other. With --idle_sleep_us W it blocks
//   in epoll instead while the next send is more than 2W away, waking W before it is due
//   (or at the first response): the generator's core is then free between requests for
//   whatever else must run there (a thread hook's agent), at the price of a wake-up in
//   the measured latency of responses that arrive while it sleeps.
// - Phases: warm-up (not recorded), measurement (every request scheduled in it is
//   recorded), a tail that keeps the load on while the last measured requests finish,
//   then a drain: measured requests still unanswered after --drain_ms count as lost.
// - Histograms (histogram.h, < 0.4% error) per request type; achieved throughput = good
//   answers RECEIVED during the measurement window / its length (so under overload it is
//   the server's rate, not the offered one); lost = measured requests sent and never
//   answered (dropped by a full socket, or still queued past the drain).
// - Is the generator the bottleneck? It reports how late its sends were against their
//   schedule (send_lag) and the share of its time spent in send/receive system calls
//   (busy); both are in the JSON so a sweep can reject points where it could not keep up.
//   With --idle_sleep_us it also reports how late the kernel woke it from the sleeps that
//   ran to their end (wake_late): a send can only be late by what that exceeds W; its
//   timer slack is 1 ns then (timer_slack_ns, as the kernel reports it).
//
//   kv_loadgen --port P --rate R [--duration S] [--warmup S] [--get_pct 99.5] [--flows 50]
//              [--keys N] [--cpu C] [--seed N] [--json FILE] [--verify] [--trace FILE.csv]
//              [--src_port_base P] [--idle_sleep_us W]
// - --trace keeps every request's times and serving worker and writes them out at the
//   end, for questions the histograms cannot answer (which GETs waited behind a SCAN).
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <gflags/gflags.h>
#include <nlohmann/json.hpp>

#include "cli.h"
#include "histogram.h"
#include "kv_clock.h"
#include "kv_proto.h"

DEFINE_int32(port, 0, "server UDP port on 127.0.0.1");
DEFINE_double(rate, 10000, "offered load, requests per second (Poisson)");
DEFINE_double(duration, 3, "measurement time, seconds");
DEFINE_double(warmup, 0.5, "warm-up time before measuring, seconds");
DEFINE_double(tail, 0.2, "load kept on after the measurement, seconds");
DEFINE_int32(drain_ms, 1000, "how long to wait for the last responses");
DEFINE_double(get_pct, 99.5, "percentage of GETs; the rest are SCANs");
DEFINE_int32(flows, 50, "client flows (sockets with distinct source ports)");
DEFINE_int32(src_port_base, 0,
             "flow i uses source port base + i, so runs with the same base have the same 5-tuples "
             "(0: ephemeral ports, new ones every run)");
DEFINE_uint64(keys, 200000, "keys in the server's database (GET/SCAN keys are uniform below it)");
DEFINE_uint32(scan_len, 0, "keys per SCAN sent in the request (0: the server's default)");
DEFINE_int32(cpu, -1, "CPU to pin the generator to (-1: none)");
DEFINE_uint32(idle_sleep_us, 0,
              "block in epoll while the next send is more than twice this far away, waking this long "
              "before it is due (0: busy-poll, never sleep)");
DEFINE_uint64(seed, 1, "random seed (same seed, same schedule)");
DEFINE_string(json, "", "write the results as JSON to this file ('-': stdout)");
DEFINE_bool(verify, false, "check every GET answer's digest against the expected value");
DEFINE_string(trace, "",
              "write every request as a CSV line to this file: id, type, scheduled, sent and answered "
              "time (ns from the start), serving worker (-1: unanswered), measured");

namespace {

using nlohmann::json;

// What the generator remembers of each request (index = id).
struct Sent {
  uint32_t key;
  uint8_t type;
  uint8_t measured;
  uint8_t answered;
};

// With --trace, per request: times relative to the start, and who answered (-1: nobody).
struct Trace {
  uint64_t sched, sent, answered;
  int32_t worker;
};

json latency_json(const kv::Histogram& h) {
  auto us = [](double ns) { return ns / 1000.0; };
  return {{"n", h.count()},
          {"min_us", us(static_cast<double>(h.min()))},
          {"mean_us", us(h.mean())},
          {"p50_us", us(h.percentile(50))},
          {"p90_us", us(h.percentile(90))},
          {"p99_us", us(h.percentile(99))},
          {"p999_us", us(h.percentile(99.9))},
          {"max_us", us(static_cast<double>(h.max()))}};
}

int open_flow(uint16_t port, int src_port) {
  int fd = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -errno;
  int buf = 1 << 20;
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  // Its own source port (ephemeral if src_port is 0): one 5-tuple per flow.
  a.sin_port = htons(static_cast<uint16_t>(src_port));
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) < 0) {
    int e = -errno;
    close(fd);
    return e;
  }
  a.sin_port = htons(port);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) < 0) {
    int e = -errno;
    close(fd);
    return e;
  }
  return fd;
}

}  // namespace

int main(int argc, char** argv) {
  syrup::cli::parse_flags(&argc, &argv, "open-loop Poisson load generator for kv_server");
  if (FLAGS_port <= 0 || FLAGS_port > 65535 || FLAGS_rate <= 0 || FLAGS_duration <= 0 ||
      FLAGS_warmup < 0 || FLAGS_tail < 0 || FLAGS_get_pct < 0 || FLAGS_get_pct > 100 ||
      FLAGS_flows < 1 || FLAGS_keys < 1 || FLAGS_src_port_base < 0 ||
      (FLAGS_src_port_base && FLAGS_src_port_base + FLAGS_flows > 65536)) {
    fprintf(stderr, "kv_loadgen: need --port 1..65535, --rate > 0, --duration > 0, --get_pct 0..100, --flows >= 1, "
                    "--src_port_base + --flows <= 65536\n");
    return 2;
  }
  if (FLAGS_cpu >= 0) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(FLAGS_cpu, &set);
    if (sched_setaffinity(0, sizeof set, &set) < 0) {
      perror("kv_loadgen: sched_setaffinity");
      return 2;
    }
  }

  const uint64_t idle_ns = static_cast<uint64_t>(FLAGS_idle_sleep_us) * 1000ULL;
  // Sleeps end when asked, not up to 50 us later (the default timer slack). The slack in
  // force is reported (generator.timer_slack_ns), read back from the kernel.
  if (idle_ns && prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0) < 0) perror("kv_loadgen: PR_SET_TIMERSLACK");
  const long timer_slack_ns = prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0);
  int ep = epoll_create1(EPOLL_CLOEXEC);
  std::vector<int> flows;
  for (int i = 0; i < FLAGS_flows; i++) {
    int src = FLAGS_src_port_base ? FLAGS_src_port_base + i : 0;
    int fd = open_flow(static_cast<uint16_t>(FLAGS_port), src);
    if (fd < 0) {
      fprintf(stderr, "kv_loadgen: flow socket (source port %d): %s\n", src, strerror(-fd));
      return 1;
    }
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u32 = static_cast<uint32_t>(i);
    epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
    flows.push_back(fd);
  }

  const double total_s = FLAGS_warmup + FLAGS_duration + FLAGS_tail;
  std::vector<Sent> sent;
  sent.reserve(static_cast<size_t>(FLAGS_rate * total_s * 1.05 + 1024));
  kv::Histogram lat[4], lag;  // lat by type (KV_GET, KV_SCAN); lag of every send
  kv::Histogram wake_late;    // --idle_sleep_us: past its end, each sleep that timed out
  std::vector<uint64_t> by_worker;
  const bool tracing = !FLAGS_trace.empty();
  std::vector<Trace> trace;
  if (tracing) trace.reserve(sent.capacity());
  uint64_t rng = FLAGS_seed * 0x9e3779b97f4a7c15ULL + 7;
  auto uniform = [&rng] { return (static_cast<double>(kv_mix64(&rng) >> 11) + 0.5) * 0x1.0p-53; };
  const double gap_ns = 1e9 / FLAGS_rate;
  const double get_frac = FLAGS_get_pct / 100.0;

  uint64_t errors = 0, bad_digest = 0, unknown = 0, send_errors = 0, late = 0, busy_ns = 0;
  uint64_t start = kv_now_ns() + 1000000;  // 1 ms to settle
  const uint64_t measure_from = start + static_cast<uint64_t>(FLAGS_warmup * 1e9);
  const uint64_t measure_to = measure_from + static_cast<uint64_t>(FLAGS_duration * 1e9);
  const uint64_t send_until = measure_to + static_cast<uint64_t>(FLAGS_tail * 1e9);
  double next = static_cast<double>(start);
  uint64_t measured_sent = 0, measured_answered = 0, measured_ok = 0, ok_in_window = 0;
  epoll_event evs[64];
  char buf[KV_MAX_DATAGRAM];
  uint64_t drain_deadline = 0;

  for (;;) {
    uint64_t now = kv_now_ns();
    // Send everything that is due.
    while (next <= static_cast<double>(now) && static_cast<uint64_t>(next) < send_until) {
      uint64_t sched = static_cast<uint64_t>(next);
      uint64_t id = sent.size();
      Sent s{};
      s.type = uniform() < get_frac ? KV_GET : KV_SCAN;
      s.key = static_cast<uint32_t>(kv_mix64(&rng) % FLAGS_keys);
      s.measured = sched >= measure_from && sched < measure_to;
      kv_request q{};
      q.type = htole32(s.type);
      q.scan_len = htole32(FLAGS_scan_len);
      q.key = htole64(s.key);
      q.id = htole64(id);
      q.stamp = htole64(sched);
      int fd = flows[kv_mix64(&rng) % flows.size()];
      uint64_t t0 = kv_now_ns();
      if (send(fd, &q, sizeof q, 0) != sizeof q) send_errors++;
      uint64_t t1 = kv_now_ns();
      busy_ns += t1 - t0;
      lag.record(t0 - sched);
      if (t0 - sched > 50000) late++;
      measured_sent += s.measured;
      sent.push_back(s);
      if (tracing) trace.push_back({sched - start, t0 - start, 0, -1});
      next += -std::log(uniform()) * gap_ns;
      now = t1;
    }
    // Take every response that is ready (with --idle_sleep_us: wait for one, or until
    // shortly before the next send is due).
    int n = epoll_wait(ep, evs, 64, 0);
    if (n == 0 && idle_ns && static_cast<uint64_t>(next) < send_until) {
      uint64_t due = static_cast<uint64_t>(next), t = kv_now_ns();
      if (due > t + 2 * idle_ns) {
        uint64_t wait = due - t - idle_ns;
        timespec to{static_cast<time_t>(wait / 1000000000ULL), static_cast<long>(wait % 1000000000ULL)};
        n = epoll_pwait2(ep, evs, 64, &to, nullptr);
        if (n == 0) {
          uint64_t woke = kv_now_ns();
          wake_late.record(woke > t + wait ? woke - t - wait : 0);
        }
      }
    }
    for (int i = 0; i < n; i++) {
      int fd = flows[evs[i].data.u32];
      for (;;) {
        uint64_t t0 = kv_now_ns();
        ssize_t len = recv(fd, buf, sizeof buf, 0);
        uint64_t t1 = kv_now_ns();
        if (len < 0) break;
        busy_ns += t1 - t0;
        if (static_cast<size_t>(len) < sizeof(kv_response)) {
          unknown++;
          continue;
        }
        kv_response r;
        memcpy(&r, buf, sizeof r);
        uint64_t id = le64toh(r.id);
        if (id >= sent.size() || sent[id].answered) {
          unknown++;
          continue;
        }
        Sent& s = sent[id];
        s.answered = 1;
        measured_answered += s.measured;
        uint32_t w = le32toh(r.worker);
        if (w < 4096) {
          if (by_worker.size() <= w) by_worker.resize(w + 1);
          by_worker[w]++;
        }
        if (tracing) {
          trace[id].answered = t0 - start;
          trace[id].worker = w < 4096 ? static_cast<int32_t>(w) : -1;
        }
        if (le32toh(r.status) != KV_OK) {
          errors++;
          continue;
        }
        ok_in_window += t0 >= measure_from && t0 < measure_to;
        if (FLAGS_verify && s.type == KV_GET) {
          char v[KV_VALUE_LEN];
          kv_value(s.key, v);
          if (le64toh(r.digest) != kv_digest(KV_FNV_BASIS, v, sizeof v)) bad_digest++;
        }
        if (!s.measured) continue;
        measured_ok++;
        lat[s.type].record(t0 - le64toh(r.stamp));
      }
    }
    if (static_cast<uint64_t>(next) >= send_until) {
      if (drain_deadline == 0) drain_deadline = now + static_cast<uint64_t>(FLAGS_drain_ms) * 1000000ULL;
      if (measured_answered >= measured_sent || now > drain_deadline) break;
    }
  }
  uint64_t end = kv_now_ns();

  // Requests of the measurement window that never got an answer, by type.
  uint64_t lost[4] = {}, sent_by_type[4] = {};
  for (auto& s : sent) {
    if (!s.measured) continue;
    sent_by_type[s.type]++;
    if (!s.answered) lost[s.type]++;
  }
  const double window = FLAGS_duration;
  json out = {
      {"config",
       {{"port", FLAGS_port}, {"rate", FLAGS_rate}, {"duration_s", FLAGS_duration},
        {"warmup_s", FLAGS_warmup}, {"get_pct", FLAGS_get_pct}, {"flows", FLAGS_flows},
        {"keys", FLAGS_keys}, {"seed", FLAGS_seed}, {"cpu", FLAGS_cpu}, {"idle_sleep_us", FLAGS_idle_sleep_us},
        {"src_port_base", FLAGS_src_port_base}}},
      {"offered_rps", measured_sent / window},
      {"throughput_rps", ok_in_window / window},
      {"sent", measured_sent},
      {"answered", measured_answered},
      {"answered_ok", measured_ok},
      {"lost", lost[KV_GET] + lost[KV_SCAN]},
      {"loss_pct", measured_sent ? 100.0 * (lost[KV_GET] + lost[KV_SCAN]) / measured_sent : 0.0},
      {"errors", errors},
      {"bad_digest", bad_digest},
      {"unknown_responses", unknown},
      {"send_errors", send_errors},
      {"types",
       {{"get", latency_json(lat[KV_GET])}, {"scan", latency_json(lat[KV_SCAN])}}},
      {"lost_by_type", {{"get", lost[KV_GET]}, {"scan", lost[KV_SCAN]}}},
      {"sent_by_type", {{"get", sent_by_type[KV_GET]}, {"scan", sent_by_type[KV_SCAN]}}},
      {"answers_by_worker", by_worker},
      {"generator",
       {{"send_lag_p50_us", lag.percentile(50) / 1000.0},
        {"send_lag_p99_us", lag.percentile(99) / 1000.0},
        {"send_lag_max_us", lag.max() / 1000.0},
        {"late_sends_pct", sent.empty() ? 0.0 : 100.0 * late / sent.size()},
        {"sleeps", wake_late.count()},
        {"timer_slack_ns", timer_slack_ns},
        {"wake_late_p50_us", wake_late.percentile(50) / 1000.0},
        {"wake_late_p99_us", wake_late.percentile(99) / 1000.0},
        {"busy_pct", 100.0 * busy_ns / static_cast<double>(end - start)}}}};

  fprintf(stderr,
          "kv_loadgen: offered %.0f/s, achieved %.0f/s, lost %llu, errors %llu; GET p50 %.1f p99 %.1f "
          "p99.9 %.1f us; SCAN p50 %.1f p99 %.1f us; send lag p99 %.1f us, busy %.0f%%\n",
          measured_sent / window, ok_in_window / window,
          static_cast<unsigned long long>(lost[KV_GET] + lost[KV_SCAN]),
          static_cast<unsigned long long>(errors), lat[KV_GET].percentile(50) / 1e3,
          lat[KV_GET].percentile(99) / 1e3, lat[KV_GET].percentile(99.9) / 1e3,
          lat[KV_SCAN].percentile(50) / 1e3, lat[KV_SCAN].percentile(99) / 1e3,
          lag.percentile(99) / 1e3, 100.0 * busy_ns / static_cast<double>(end - start));
  if (!FLAGS_json.empty()) {
    if (FLAGS_json == "-") {
      printf("%s\n", out.dump(1).c_str());
    } else {
      std::ofstream f(FLAGS_json);
      f << out.dump(1) << "\n";
      if (!f) {
        fprintf(stderr, "kv_loadgen: cannot write %s\n", FLAGS_json.c_str());
        return 1;
      }
    }
  }
  if (tracing) {
    FILE* f = fopen(FLAGS_trace.c_str(), "w");
    if (!f) {
      fprintf(stderr, "kv_loadgen: cannot write %s: %s\n", FLAGS_trace.c_str(), strerror(errno));
      return 1;
    }
    fprintf(f, "id,type,sched_ns,sent_ns,answered_ns,worker,measured\n");
    for (size_t i = 0; i < trace.size(); i++)
      fprintf(f, "%zu,%s,%llu,%llu,%llu,%d,%d\n", i, sent[i].type == KV_GET ? "get" : "scan",
              static_cast<unsigned long long>(trace[i].sched), static_cast<unsigned long long>(trace[i].sent),
              static_cast<unsigned long long>(trace[i].answered), trace[i].worker,
              sent[i].measured);
    if (fclose(f)) {
      fprintf(stderr, "kv_loadgen: cannot write %s\n", FLAGS_trace.c_str());
      return 1;
    }
  }
  for (int fd : flows) close(fd);
  close(ep);
  return bad_digest ? 1 : 0;
}
