// kv_server: a multi-threaded key-value server over UDP on real RocksDB, scheduled by a
// Syrup policy it deploys itself (the Syrup talk's evaluation application).
//
// Design:
// - N workers, each a thread with its own SO_REUSEPORT UDP socket on one port; worker i
//   is executor i of the socket-select policy. All sockets are bound before the policy is
//   deployed, so the group is complete when the policy sees it.
// - The policy comes from the server's own code (syr_deploy_policy, --policy), and the
//   server writes the hints the shipped policies read through mmap'ed maps, if the policy
//   declares them: scan_map[i] non-zero while worker i holds a SCAN (a count: scan_avoid
//   adds one as it steers a SCAN, the worker takes one off when done, and off too for
//   a SCAN that never reaches it -- rejected as malformed, or dropped by the kernel at a
//   full socket buffer, found when the worker is idle; read by scan_avoid and by the
//   thread policy get_first, which share it), and queue_len[i] = work
//   waiting at worker i in GET units (least_loaded). A hint is one
//   store; a policy without the map costs the server nothing.
// - Requests (kv_proto.h): GET = RocksDB point lookup; SCAN = iterate scan_len keys,
//   where scan_len is calibrated at start so a SCAN costs --scan_ratio GETs (the talk:
//   10 us and 700 us, ratio 70) unless given. Malformed datagrams (truncated, oversized,
//   unknown type) are counted and answered with KV_BAD_REQUEST; nothing a client sends can
//   crash a worker. KV_STATS returns the counters as JSON.
// - A worker drains its socket in batches (recvmmsg) into a private FIFO and serves it in
//   order; with queue_len it tops the FIFO up before each request so the count it
//   publishes is current (one extra syscall per request, paid only by least_loaded).
// - Threads: the whole server is pinned to --cpus (so the load generator can own the
//   other core). Workers share that core, so a SCAN can yield it every --yield_keys keys
//   (the same for every policy) and workers may ask for a shorter slice (--slice_us).
//   With --core_share F each worker instead paces itself to F of a CPU (a slow core of
//   its own, emulated; see CorePacer), backed by a SCHED_DEADLINE reservation of F
//   (set_core_share) unless --core_deadline=false: a reservation must span every CPU,
//   so only pacing alone keeps the workers on --cpus.
//   With --thread_policy (e.g. get_first) the server deploys it at the thread hook before
//   starting the workers, each worker registers itself as executor i, and scan_map[i]
//   is set while it serves a SCAN. Where the thread hook is not available the deploy
//   fails with syrupd's message and the server exits with status 3.
// - Lifecycle: prints one JSON line {"event":"ready",...} on stdout when serving. SIGINT or
//   SIGTERM: workers stop (shutdown(SHUT_RD) wakes their blocking receive), the policy is
//   removed (its pins go with it), sockets and DB are closed, the final counters are
//   printed as {"event":"exit",...}, exit 0.
//
//   kv_server --db DIR [--keys N] [--workers N] [--port P] [--policy FILE.c] [--params k=v,..]
//             [--app NAME] [--scan_len N | --scan_ratio R] [--cpus LIST] [--slice_us U]
//             [--core_share F [--core_deadline=false] [--core_period_us U] [--core_hold_us U]]
//             [--calibrate_only]
//             [--thread_policy FILE.c]
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gflags/gflags.h>
#include <linux/sock_diag.h>
#include <nlohmann/json.hpp>

#include "cli.h"
#include "kv_clock.h"
#include "kv_db.h"
#include "kv_proto.h"
#include "sched_attr.h"  // hooks/: the one struct sched_attr of the tree
#include "syrup/syrup.h"

DEFINE_string(db, "", "database directory (created and loaded if missing)");
DEFINE_uint64(keys, 200000, "keys in the database");
DEFINE_uint64(cache_mb, 128, "RocksDB block cache, MiB (the default holds 200000 keys with room to spare)");
DEFINE_int32(workers, 4, "worker threads, one SO_REUSEPORT socket each");
DEFINE_int32(port, 0, "UDP port on 127.0.0.1 (0: pick a free one)");
DEFINE_string(policy, "", "socket-select policy to deploy (empty: none, the kernel's hash)");
DEFINE_string(params, "", "policy parameters, name=value[,name=value...]");
DEFINE_string(app, "kv", "Syrup application name (maps are shared under it)");
DEFINE_uint32(scan_len, 0, "keys per SCAN (0: calibrate to --scan_ratio)");
DEFINE_double(scan_ratio, 70, "cost of a SCAN in GETs when calibrating");
DEFINE_string(cpus, "", "CPUs the server may run on, e.g. 1 or 0-1 (empty: any)");
DEFINE_int32(slice_us, 0, "scheduler slice asked for each worker (sched_attr.sched_runtime; 0: default)");
DEFINE_double(core_share, 0,
              "emulate a core of its own per worker: each worker paces itself to this fraction of a "
              "CPU, backed by a SCHED_DEADLINE reservation unless --core_deadline=false (0: off, "
              "workers share --cpus in the fair class)");
DEFINE_bool(core_deadline, true,
            "with --core_share: back each emulated core with its SCHED_DEADLINE reservation (the "
            "workers then run on any CPU, the kernel refuses narrower affinity); false: pacing only, "
            "the workers stay on --cpus in the fair class");
DEFINE_int32(core_period_us, 100, "period of a --core_share reservation, us (>= 100)");
DEFINE_int32(core_hold_us, 200,
             "with --core_share: a worker more than this far ahead of its emulated core sleeps until "
             "the core would catch up, us");
DEFINE_uint32(yield_keys, 0, "a SCAN yields the core (sched_yield) every this many keys (0: never)");
DEFINE_int32(rcvbuf, 1 << 20, "receive buffer of each socket, bytes");
DEFINE_bool(calibrate_only, false, "load the DB, print the calibration as JSON and exit");
DEFINE_string(thread_policy, "", "thread policy to deploy for the workers (needs the thread hook)");

namespace {

using nlohmann::json;

std::atomic<bool> g_stop{false};

uint64_t thread_cpu_ns() { return kv_clock_ns(CLOCK_THREAD_CPUTIME_ID); }

// The other half of the --core_share emulation: a worker never runs far ahead of its
// emulated core, so it never owes the kernel much.
//
// Why: the kernel enforces a deadline task's budget only at scheduler events on its CPU
// (no HRTICK here, HZ=250), so a reservation alone let a SCAN run at full speed on an
// otherwise quiet CPU for a few hundred microseconds -- a SCAN took ~0.4 ms instead of
// the emulated core's ~2.6 ms -- and afterwards the worker carried the overrun as a
// deadline pushed milliseconds ahead: it lost every EDF race for about as long as the
// SCAN should have lasted. A policy that had just seen the SCAN end (scan_avoid clears
// its mark then) sent GETs to a worker that was in effect still busy. Not a slow core.
//
// How: from the moment a worker wakes up with work, it compares its CPU time with the
// wall time: on a core of share F, c of CPU takes c / F. When it is ahead by more than
// --core_hold_us, it sleeps until its emulated core would catch up (the deadline the
// kernel pushed ahead has then passed, so it wakes with a fresh budget), in the middle
// of a SCAN or between requests, with its hints unchanged: a SCAN holds its worker (and
// its scan_map mark) for as long as it would on the slow core. Yielding every period
// instead would cost a timer and two context switches per 11 us of work, which on these
// virtual machines is most of the budget. The CPU clock is a system call, so the cheap
// monotonic clock gates it: the worker cannot be ahead by the threshold before the wall
// clock has moved by threshold x F / (1 - F).
class CorePacer {
 public:
  void start(double share, int hold_us) {
    share_ = share;
    hold_ns_ = static_cast<double>(hold_us) * 1000;
    // How fast the lead over the emulated core can grow per ns of wall time, inverted:
    // the wall time it takes to gain 1 ns of lead. A whole core (share 1) never leads.
    wall_per_lead_ = share < 1 ? share / (1 - share) : 1e12;
    on_wakeup();
  }
  bool on() const { return share_ > 0; }

  // After a blocking receive returned: the emulated core was idle until now.
  void on_wakeup() {
    if (!on()) return;
    rebase(kv_now_ns());
  }

  // Between requests and after every key of a SCAN.
  void step() {
    if (!on()) return;
    uint64_t now = kv_now_ns();
    if (now < next_check_) return;
    double emulated = static_cast<double>(thread_cpu_ns() - cpu_base_) / share_;
    double ahead = emulated - static_cast<double>(now - wall_base_);
    if (ahead < hold_ns_) {
      next_check_ = now + wall_for_lead(hold_ns_ - ahead);
      return;
    }
    holds_.fetch_add(1, std::memory_order_relaxed);
    timespec until;
    uint64_t t = now + static_cast<uint64_t>(ahead);
    until.tv_sec = static_cast<time_t>(t / 1000000000ULL);
    until.tv_nsec = static_cast<long>(t % 1000000000ULL);
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &until, nullptr) == EINTR) {
    }
    rebase(kv_now_ns());
  }
  uint64_t holds() const { return holds_.load(std::memory_order_relaxed); }

 private:
  void rebase(uint64_t now) {
    wall_base_ = now;
    cpu_base_ = thread_cpu_ns();
    next_check_ = now + wall_for_lead(hold_ns_);
  }
  // The least wall time in which the worker can get `lead` ns ahead of its core.
  uint64_t wall_for_lead(double lead) const { return static_cast<uint64_t>(std::min(lead * wall_per_lead_, 1e15)); }

  double share_ = 0, hold_ns_ = 0, wall_per_lead_ = 0;
  uint64_t wall_base_ = 0, cpu_base_ = 0, next_check_ = 0;
  std::atomic<uint64_t> holds_{0};  // read by STATS from other workers
};

// A worker's counters: written by the worker only, read by STATS from any worker.
struct Counters {
  std::atomic<uint64_t> served[4]{};   // by type: [0] unused, GET, SCAN, STATS
  std::atomic<uint64_t> busy_ns[4]{};  // service time by type (receive done -> reply sent)
  std::atomic<uint64_t> truncated{}, oversized{}, bad_type{}, not_found{}, db_errors{}, send_errors{};
  std::atomic<uint64_t> scan_marks_cleared{};  // counts of SCANs that never arrived (scan_idle)
};

struct alignas(64) Worker {
  int idx = 0;
  int fd = -1;
  pid_t tid = 0;
  bool ready = false;  // started (and registered with the thread hook if asked)
  std::thread thread;
  CorePacer pacer;     // on with --core_share
  Counters c;
};

// One received datagram waiting in a worker's FIFO: what the server needs of it.
struct Pending {
  char head[sizeof(kv_request)];
  uint32_t len;  // bytes received (the datagram's full length if oversized)
  bool oversized;
  sockaddr_in from;
};

struct Server {
  kv::Db db;
  uint32_t scan_len = 0;
  uint32_t scan_weight = 70;  // a SCAN in GET units, for queue_len
  std::vector<std::unique_ptr<Worker>> workers;
  syr_mapped_array scan_map{}, queue_len{};
  bool have_scan_map = false, have_queue_len = false;
  int thread_policy_id = 0;
};
// Never destroyed: at exit RocksDB's own statics may already be gone, so the DB is
// closed explicitly instead (g.db.close()) on the paths that return normally.
Server& g = *new Server;

int parse_cpus(const std::string& s, cpu_set_t* set) {
  CPU_ZERO(set);
  size_t pos = 0;
  while (pos < s.size()) {
    size_t end = s.find(',', pos);
    std::string part = s.substr(pos, end == std::string::npos ? std::string::npos : end - pos);
    int lo, hi;
    if (sscanf(part.c_str(), "%d-%d", &lo, &hi) == 2) {
    } else if (sscanf(part.c_str(), "%d", &lo) == 1) {
      hi = lo;
    } else {
      return -EINVAL;
    }
    if (lo < 0 || hi < lo || hi >= CPU_SETSIZE) return -EINVAL;
    for (int c = lo; c <= hi; c++) CPU_SET(c, set);
    if (end == std::string::npos) break;
    pos = end + 1;
  }
  return CPU_COUNT(set) ? 0 : -EINVAL;
}

int parse_params(const std::string& s, std::vector<std::string>* names, std::vector<syr_param>* out) {
  size_t pos = 0;
  while (pos < s.size()) {
    size_t end = s.find(',', pos);
    std::string kv = s.substr(pos, end == std::string::npos ? std::string::npos : end - pos);
    size_t eq = kv.find('=');
    if (eq == std::string::npos || eq == 0) return -EINVAL;
    names->push_back(kv.substr(0, eq));
    out->push_back({nullptr, strtoull(kv.c_str() + eq + 1, nullptr, 0)});
    if (end == std::string::npos) break;
    pos = end + 1;
  }
  for (size_t i = 0; i < out->size(); i++) (*out)[i].name = (*names)[i].c_str();
  return 0;
}

uint64_t kernel_drops(int fd) {
  uint32_t mem[SK_MEMINFO_VARS] = {};
  socklen_t l = sizeof mem;
  if (getsockopt(fd, SOL_SOCKET, SO_MEMINFO, mem, &l) < 0) return 0;
  return mem[SK_MEMINFO_DROPS];
}

json stats_json() {
  json ws = json::array();
  json tot = {{"get", 0}, {"scan", 0}, {"stats", 0}, {"truncated", 0}, {"oversized", 0},
              {"bad_type", 0}, {"not_found", 0}, {"db_errors", 0}, {"send_errors", 0},
              {"kernel_drops", 0}, {"scan_marks_cleared", 0}, {"core_holds", 0}, {"get_ns", 0},
              {"scan_ns", 0}};
  for (auto& w : g.workers) {
    auto& c = w->c;
    json j = {{"get", c.served[KV_GET].load()},
              {"scan", c.served[KV_SCAN].load()},
              {"stats", c.served[KV_STATS].load()},
              {"truncated", c.truncated.load()},
              {"oversized", c.oversized.load()},
              {"bad_type", c.bad_type.load()},
              {"not_found", c.not_found.load()},
              {"db_errors", c.db_errors.load()},
              {"send_errors", c.send_errors.load()},
              {"kernel_drops", kernel_drops(w->fd)},
              {"scan_marks_cleared", c.scan_marks_cleared.load()},
              {"core_holds", w->pacer.holds()},
              {"get_ns", c.busy_ns[KV_GET].load()},
              {"scan_ns", c.busy_ns[KV_SCAN].load()}};
    for (auto& [k, v] : j.items()) tot[k] = tot[k].get<uint64_t>() + v.get<uint64_t>();
    ws.push_back(j);
  }
  return {{"total", tot}, {"workers", ws}};
}

// scan_map[i] as a count of the SCANs worker i holds (see policies/scan_avoid.c); atomic,
// as the policy adds to it from the kernel at the same time.
void scan_begin(const syr_mapped_array* m, uint32_t i) {
  uint64_t zero = 0;  // uncounted (no policy counts at steering): count it while it runs
  __atomic_compare_exchange_n(static_cast<uint64_t*>(syr_array_elem(m, i)), &zero, 1, false, __ATOMIC_RELAXED,
                              __ATOMIC_RELAXED);
}
void scan_end(const syr_mapped_array* m, uint32_t i) {
  auto* p = static_cast<uint64_t*>(syr_array_elem(m, i));
  uint64_t v = __atomic_load_n(p, __ATOMIC_RELAXED);
  while (v > 0 && !__atomic_compare_exchange_n(p, &v, v - 1, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
}
// A policy counts a SCAN by the type it reads (the datagram's first 4 bytes), before the
// server sees the datagram. A datagram of that type the server rejects (truncated,
// oversized) is no SCAN it serves, so the count comes off here.
void scan_rejected(const Pending& p, uint32_t i) {
  uint32_t type = 0;
  if (!g.have_scan_map || p.len < sizeof type) return;
  memcpy(&type, p.head, sizeof type);
  if (le32toh(type) == KV_SCAN) scan_end(&g.scan_map, i);
}
// Worker i is idle: its FIFO is empty and its socket has nothing queued, so it holds no
// SCAN, and a count left in scan_map[i] is of SCANs the policy steered here that never
// arrived: the kernel dropped them at a full socket buffer. Left there, scan_avoid would
// avoid this worker for good. Cleared, and counted. (A SCAN steered here between the
// empty receive and this store arrives uncounted; serving it marks the worker anyway.)
void scan_idle(Worker& w) {
  auto* p = static_cast<uint64_t*>(syr_array_elem(&g.scan_map, w.idx));
  uint64_t v = __atomic_load_n(p, __ATOMIC_RELAXED);
  if (v && __atomic_compare_exchange_n(p, &v, 0, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
    w.c.scan_marks_cleared.fetch_add(v, std::memory_order_relaxed);
}

// sched_setattr(2) with a custom slice for SCHED_OTHER (Linux 6.12+): a SCAN then cannot
// keep a core for a whole default slice while GET workers wait on the same core.
int set_slice(int slice_us) {
  syrup::SchedAttr a;
  a.sched_runtime = static_cast<uint64_t>(slice_us) * 1000;
  return syrup::sched_attr_set(0, a);
}

// --core_share: a SCHED_DEADLINE reservation of share x period every period (a short
// period, so a worker that used its share waits little: closer to a slow core), for the worker's
// whole life. This is how a 2-core machine emulates the talk's one-worker-per-core server:
// each worker gets a fixed share of CPU that nobody else can take and that it cannot
// exceed, so a SCAN occupies only its own worker's "core", and a socket the hash gives
// more flows saturates its worker as it would a dedicated core. The kernel refuses
// deadline tasks whose affinity is narrower than their root domain, so the worker first
// widens it to every CPU; deadline tasks cannot fork, hence SCHED_FLAG_RESET_ON_FORK. The
// reservation ends with the thread (switching a sleeping deadline task back to the fair
// class leaks its bandwidth on some kernels, exiting does not).
int set_core_share(double share, int period_us) {
  cpu_set_t all;
  CPU_ZERO(&all);
  for (long c = 0; c < CPU_SETSIZE && c < sysconf(_SC_NPROCESSORS_CONF); c++) CPU_SET(c, &all);
  if (sched_setaffinity(0, sizeof all, &all) < 0) return -errno;
  syrup::SchedAttr a;
  a.sched_policy = syrup::kSchedDeadline;
  a.sched_flags = syrup::kSchedFlagResetOnFork;
  a.sched_period = static_cast<uint64_t>(period_us) * 1000;
  a.sched_deadline = a.sched_period;
  a.sched_runtime = static_cast<uint64_t>(share * static_cast<double>(a.sched_period));
  return syrup::sched_attr_set(0, a);
}

void reply(Worker& w, const Pending& p, kv_response& r, const void* body, uint32_t len) {
  r.status = htole32(r.status);
  r.type = htole32(r.type);
  r.id = htole64(r.id);
  r.stamp = htole64(r.stamp);
  r.worker = htole32(r.worker);
  r.count = htole32(r.count);
  r.digest = htole64(r.digest);
  r.len = htole32(len);
  iovec iov[2] = {{&r, sizeof r}, {const_cast<void*>(body), len}};
  msghdr m{};
  m.msg_name = const_cast<sockaddr_in*>(&p.from);
  m.msg_namelen = sizeof p.from;
  m.msg_iov = iov;
  m.msg_iovlen = len ? 2 : 1;
  if (sendmsg(w.fd, &m, 0) < 0) w.c.send_errors.fetch_add(1, std::memory_order_relaxed);
}

void handle(Worker& w, const Pending& p, size_t waiting) {
  uint64_t t0 = kv_now_ns();
  kv_request q{};
  memcpy(&q, p.head, std::min<size_t>(p.len, sizeof q));
  q.type = le32toh(q.type);
  q.scan_len = le32toh(q.scan_len);
  q.key = le64toh(q.key);
  kv_response r{};
  r.type = q.type;
  r.id = le64toh(q.id);
  r.stamp = le64toh(q.stamp);
  r.worker = static_cast<uint32_t>(w.idx);
  auto& c = w.c;

  if (p.oversized) {
    c.oversized.fetch_add(1, std::memory_order_relaxed);
    scan_rejected(p, w.idx);
    r.status = KV_BAD_REQUEST;
    return reply(w, p, r, nullptr, 0);
  }
  if (p.len < sizeof(kv_request)) {
    c.truncated.fetch_add(1, std::memory_order_relaxed);
    scan_rejected(p, w.idx);
    r.status = KV_BAD_REQUEST;
    return reply(w, p, r, nullptr, 0);
  }
  if (g.have_queue_len)
    syr_hint_set(&g.queue_len, w.idx, waiting + (q.type == KV_SCAN ? g.scan_weight : 1));
  switch (q.type) {
    case KV_GET: {
      char value[KV_VALUE_LEN];
      uint32_t len = 0;
      int e = g.db.get(q.key, value, sizeof value, &len, &r.digest);
      if (e == -ENOENT) {
        c.not_found.fetch_add(1, std::memory_order_relaxed);
        r.status = KV_NOT_FOUND;
        len = 0;
      } else if (e) {
        c.db_errors.fetch_add(1, std::memory_order_relaxed);
        r.status = KV_ERROR;
        len = 0;
      }
      reply(w, p, r, value, std::min<uint32_t>(len, sizeof value));
      break;
    }
    case KV_SCAN: {
      // scan_map[i] counts the SCANs worker i holds: scan_avoid adds one when it steers a
      // SCAN here, this worker takes one off when it has served one. A SCAN no policy
      // counted (round robin, ...) is counted here while it runs, so a policy reading
      // scan_map always sees this worker busy during a SCAN.
      if (g.have_scan_map) scan_begin(&g.scan_map, w.idx);
      // Mid-SCAN the worker gives up its core: paced to its emulated core's budget, or
      // every --yield_keys keys on a shared core.
      uint32_t keys = 0;
      std::function<void()> after_key;
      if (w.pacer.on())
        after_key = [&w] { w.pacer.step(); };
      else if (FLAGS_yield_keys)
        after_key = [&keys] {
          if (++keys % FLAGS_yield_keys == 0) sched_yield();
        };
      int e = g.db.scan(q.key, q.scan_len ? q.scan_len : g.scan_len, &r.count, &r.digest, after_key);
      if (g.have_scan_map) scan_end(&g.scan_map, w.idx);
      if (e) {
        c.db_errors.fetch_add(1, std::memory_order_relaxed);
        r.status = KV_ERROR;
      }
      reply(w, p, r, nullptr, 0);
      break;
    }
    case KV_STATS: {
      std::string s = stats_json().dump();
      s.resize(std::min<size_t>(s.size(), KV_MAX_DATAGRAM * 8));
      reply(w, p, r, s.data(), static_cast<uint32_t>(s.size()));
      break;
    }
    default:
      c.bad_type.fetch_add(1, std::memory_order_relaxed);
      r.status = KV_BAD_REQUEST;
      reply(w, p, r, nullptr, 0);
      if (g.have_queue_len) syr_hint_set(&g.queue_len, w.idx, waiting);
      return;
  }
  if (g.have_queue_len) syr_hint_set(&g.queue_len, w.idx, waiting);
  c.served[q.type].fetch_add(1, std::memory_order_relaxed);
  c.busy_ns[q.type].fetch_add(kv_now_ns() - t0, std::memory_order_relaxed);
}

void worker_main(Worker* w) {
  w->tid = static_cast<pid_t>(syscall(SYS_gettid));
  char name[16];
  snprintf(name, sizeof name, "kv-w%d", w->idx);
  pthread_setname_np(pthread_self(), name);
  if (FLAGS_slice_us > 0) {
    int e = set_slice(FLAGS_slice_us);
    if (e) fprintf(stderr, "kv_server: worker %d: sched slice: %s\n", w->idx, strerror(-e));
  }
  if (FLAGS_core_share > 0 && FLAGS_core_deadline) {
    int e = set_core_share(FLAGS_core_share, FLAGS_core_period_us);
    if (e) {
      // Without the reservation it would be a different experiment: stop.
      fprintf(stderr, "kv_server: worker %d: SCHED_DEADLINE reservation of %.3f CPU: %s%s\n", w->idx,
              FLAGS_core_share, strerror(-e),
              e == -EBUSY ? " (the kernel admits no more deadline bandwidth: lower --core_share or --workers)"
                          : "");
      _exit(2);
    }
  }
  if (FLAGS_core_share > 0) w->pacer.start(FLAGS_core_share, FLAGS_core_hold_us);
  // The thread hook: the worker registers itself as executor idx of the application's
  // thread policy, so the policy can tell the workers apart and read their hints
  // (scan_map[idx]).
  if (g.thread_policy_id > 0 && syr_thread_register(static_cast<uint32_t>(w->idx)) != 0)
    fprintf(stderr, "kv_server: worker %d: thread hook registration: %s\n", w->idx, syr_last_error());
  __atomic_store_n(&w->ready, true, __ATOMIC_RELEASE);

  constexpr int kBatch = 32;
  constexpr size_t kFifo = 4096;
  static thread_local char bufs[kBatch][KV_MAX_DATAGRAM];
  mmsghdr msgs[kBatch];
  iovec iov[kBatch];
  sockaddr_in from[kBatch];
  std::vector<Pending> fifo(kFifo);
  size_t head = 0, count = 0;

  // Receives what is queued at the socket into the FIFO; blocks for the first datagram
  // if `wait`. Returns the number received, 0 when stopping, or -errno.
  auto pull = [&](bool wait) -> int {
    int room = static_cast<int>(std::min<size_t>(kBatch, kFifo - count));
    if (room == 0) return 0;
    for (int i = 0; i < room; i++) {
      iov[i] = {bufs[i], sizeof bufs[i]};
      msgs[i].msg_hdr = {};
      msgs[i].msg_hdr.msg_name = &from[i];
      msgs[i].msg_hdr.msg_namelen = sizeof from[i];
      msgs[i].msg_hdr.msg_iov = &iov[i];
      msgs[i].msg_hdr.msg_iovlen = 1;
    }
    int n = recvmmsg(w->fd, msgs, room, wait ? MSG_WAITFORONE : MSG_DONTWAIT, nullptr);
    if (n < 0) return errno == EAGAIN || errno == EINTR ? 0 : -errno;
    // shutdown(SHUT_RD) ends a blocking receive with an empty "datagram"; the stop flag
    // (set before the shutdown) tells it from a real zero-length one.
    if (g_stop.load(std::memory_order_relaxed)) return 0;
    for (int i = 0; i < n; i++) {
      Pending& p = fifo[(head + count) % kFifo];
      // MSG_TRUNC in msg_flags: the datagram was longer than our buffer (msg_len is
      // then the bytes copied, not the full length).
      p.oversized = msgs[i].msg_hdr.msg_flags & MSG_TRUNC;
      p.len = msgs[i].msg_len;
      memcpy(p.head, bufs[i], std::min<size_t>(p.len, sizeof p.head));
      p.from = from[i];
      count++;
    }
    return n;
  };

  while (!g_stop.load(std::memory_order_relaxed)) {
    if (count == 0) {
      int n = 0;
      // A mark while nothing is in the FIFO: a SCAN the policy counted is queued at the
      // socket, or it never will be (scan_idle). Only then is the socket looked at first.
      if (g.have_scan_map && syr_hint_get(&g.scan_map, w->idx) != 0 && (n = pull(false)) == 0 &&
          !g_stop.load(std::memory_order_relaxed))
        scan_idle(*w);
      if (n == 0) n = pull(true);
      if (n < 0) {
        fprintf(stderr, "kv_server: worker %d: recvmmsg: %s\n", w->idx, strerror(-n));
        break;
      }
      if (n == 0) continue;
      w->pacer.on_wakeup();
    } else if (g.have_queue_len) {
      pull(false);
    }
    w->pacer.step();
    Pending p = fifo[head];
    head = (head + 1) % kFifo;
    count--;
    handle(*w, p, count);
  }
}

int map_hint(const char* name, syr_mapped_array* out) {
  int fd = syr_map_open_app(FLAGS_app.c_str(), name);
  if (fd < 0) return fd;  // the policy does not declare it
  int e = syr_map_mmap(fd, out);
  close(fd);  // the mapping keeps the map alive
  return e;
}

}  // namespace

int main(int argc, char** argv) {
  syrup::cli::parse_flags(&argc, &argv, "RocksDB key-value server over UDP, scheduled by a Syrup policy");
  if (FLAGS_db.empty() || FLAGS_workers < 1 || FLAGS_workers > SYR_MAX_EXECUTORS || FLAGS_keys < 1 ||
      FLAGS_port < 0 || FLAGS_port > 65535) {
    fprintf(stderr, "kv_server: --db is required; --workers 1..%d, --keys >= 1, --port 0..65535\n",
            SYR_MAX_EXECUTORS);
    return 2;
  }
  if (FLAGS_core_share < 0 || FLAGS_core_share > 1 || FLAGS_core_period_us < 100 || FLAGS_core_hold_us < 0 || (FLAGS_core_share > 0 && FLAGS_core_deadline && (FLAGS_yield_keys || FLAGS_slice_us))) {
    // sched_yield() ends a deadline task's budget for the period: no yielding with reservations.
    fprintf(stderr, "kv_server: --core_share is 0..1, --core_period_us >= 100, --core_hold_us >= 0; a --core_share "
                    "backed by deadline reservations excludes --yield_keys and --slice_us\n");
    return 2;
  }

  // Signals are taken synchronously by main (sigwait) only; every thread inherits the mask.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  signal(SIGPIPE, SIG_IGN);

  if (!FLAGS_cpus.empty()) {
    cpu_set_t set;
    if (parse_cpus(FLAGS_cpus, &set) || sched_setaffinity(0, sizeof set, &set) < 0) {
      fprintf(stderr, "kv_server: cannot run on CPUs '%s'\n", FLAGS_cpus.c_str());
      return 2;
    }
  }

  std::string err;
  bool loaded = false;
  uint64_t t0 = kv_now_ns();
  kv::DbConfig cfg;
  cfg.path = FLAGS_db;
  cfg.keys = FLAGS_keys;
  cfg.cache_mb = FLAGS_cache_mb;
  if (g.db.open(cfg, &loaded, &err)) {
    fprintf(stderr, "kv_server: %s\n", err.c_str());
    return 1;
  }
  fprintf(stderr, "kv_server: %s %s (%llu keys) in %.1f s\n", loaded ? "loaded" : "opened",
          FLAGS_db.c_str(), static_cast<unsigned long long>(FLAGS_keys), (kv_now_ns() - t0) / 1e9);

  json cal_json;
  g.scan_len = FLAGS_scan_len;
  if (g.scan_len == 0 || FLAGS_calibrate_only) {
    kv::Calibration cal;
    int e = g.db.calibrate(FLAGS_scan_ratio, &cal);
    if (e) {
      fprintf(stderr, "kv_server: calibration failed: %s\n", strerror(-e));
      return 1;
    }
    cal_json = {{"get_ns", cal.get_ns}, {"key_ns", cal.key_ns}, {"scan_base_ns", cal.scan_base_ns},
                {"io_ns", cal.io_ns}, {"scan_len", cal.scan_len}, {"scan_ns", cal.scan_ns},
                {"ratio", cal.ratio}};
    if (FLAGS_calibrate_only) {
      printf("%s\n", json{{"event", "calibration"}, {"calibration", cal_json}}.dump().c_str());
      g.db.close();
      return 0;
    }
    if (g.scan_len == 0) g.scan_len = cal.scan_len;
  }
  g.scan_weight = static_cast<uint32_t>(std::max(1.0, FLAGS_scan_ratio + 0.5));

  // The whole group is bound before the policy is deployed.
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(FLAGS_port));
  std::vector<int> fds(FLAGS_workers);
  if (syr_open_reuseport_group(SOCK_DGRAM | SOCK_CLOEXEC, reinterpret_cast<sockaddr*>(&addr),
                               sizeof addr, fds.data(), fds.size())) {
    fprintf(stderr, "kv_server: %s\n", syr_last_error());
    return 1;
  }
  uint16_t port = ntohs(addr.sin_port);
  for (int i = 0; i < FLAGS_workers; i++) {
    int buf = FLAGS_rcvbuf;
    // SO_RCVBUFFORCE passes the rmem_max cap when we are root; otherwise the capped size.
    if (setsockopt(fds[i], SOL_SOCKET, SO_RCVBUFFORCE, &buf, sizeof buf) < 0)
      setsockopt(fds[i], SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
    auto w = std::make_unique<Worker>();
    w->idx = i;
    w->fd = fds[i];
    g.workers.push_back(std::move(w));
  }

  int policy_id = 0;
  if (!FLAGS_policy.empty()) {
    std::vector<std::string> names;
    std::vector<syr_param> params;
    if (parse_params(FLAGS_params, &names, &params)) {
      fprintf(stderr, "kv_server: bad --params '%s' (want name=value,...)\n", FLAGS_params.c_str());
      return 2;
    }
    syr_deploy_opts o{.sz = sizeof o, .app = FLAGS_app.c_str(), .fds = fds.data(),
                      .n_fds = fds.size(), .params = params.data(), .n_params = params.size()};
    policy_id = syr_deploy_policy(FLAGS_policy.c_str(), SYR_HOOK_SOCKET_SELECT, &o);
    if (policy_id < 0) {
      fprintf(stderr, "kv_server: deploying %s failed (%s):\n%s\n", FLAGS_policy.c_str(),
              strerror(-policy_id), syr_last_error());
      return 1;
    }
    g.have_scan_map = map_hint("scan_map", &g.scan_map) == 0;
    g.have_queue_len = map_hint("queue_len", &g.queue_len) == 0;
  }

  // The thread policy (GET-first, ...) is deployed before the workers start, so each
  // can register itself as it comes up.
  if (!FLAGS_thread_policy.empty()) {
    syr_deploy_opts o{.sz = sizeof o, .app = FLAGS_app.c_str()};
    g.thread_policy_id = syr_deploy_policy(FLAGS_thread_policy.c_str(), SYR_HOOK_THREAD, &o);
    if (g.thread_policy_id < 0) {
      fprintf(stderr, "kv_server: the thread hook is not available (%s): %s\n",
              strerror(-g.thread_policy_id), syr_last_error());
      if (policy_id > 0) syr_remove_policy(policy_id);
      return 3;
    }
    if (!g.have_scan_map) g.have_scan_map = map_hint("scan_map", &g.scan_map) == 0;
  }

  for (auto& w : g.workers) w->thread = std::thread(worker_main, w.get());
  for (auto& w : g.workers)
    while (!__atomic_load_n(&w->ready, __ATOMIC_ACQUIRE)) sched_yield();

  json ready = {{"event", "ready"},
                {"port", port},
                {"workers", FLAGS_workers},
                {"policy", FLAGS_policy},
                {"policy_id", policy_id},
                {"app", FLAGS_app},
                {"keys", FLAGS_keys},
                {"scan_len", g.scan_len},
                {"thread_policy", FLAGS_thread_policy},
                {"thread_policy_id", g.thread_policy_id},
                {"hints", {{"scan_map", g.have_scan_map}, {"queue_len", g.have_queue_len}}},
                {"pid", getpid()}};
  if (!cal_json.is_null()) ready["calibration"] = cal_json;
  printf("%s\n", ready.dump().c_str());
  fflush(stdout);

  int sig = 0;
  sigwait(&sigs, &sig);
  fprintf(stderr, "kv_server: %s, stopping\n", strsignal(sig));

  g_stop.store(true);
  for (auto& w : g.workers) shutdown(w->fd, SHUT_RD);  // wakes a worker blocked in recvmmsg
  for (auto& w : g.workers) w->thread.join();
  int rc = 0;
  if (g.thread_policy_id > 0 && syr_remove_policy(g.thread_policy_id)) {
    fprintf(stderr, "kv_server: removing thread policy %d: %s\n", g.thread_policy_id, syr_last_error());
    rc = 1;
  }
  if (policy_id > 0 && syr_remove_policy(policy_id)) {
    fprintf(stderr, "kv_server: removing policy %d: %s\n", policy_id, syr_last_error());
    rc = 1;
  }
  if (g.have_scan_map) syr_map_munmap(&g.scan_map);
  if (g.have_queue_len) syr_map_munmap(&g.queue_len);
  json fin = {{"event", "exit"}, {"stats", stats_json()}, {"policy_removed", rc == 0}};
  for (auto& w : g.workers) close(w->fd);
  g.db.close();
  printf("%s\n", fin.dump().c_str());
  fflush(stdout);
  return rc;
}
