// syrup_thread_bench: the thread hook's benchmarks (bench/thread/README.md).
//
//   syrup_thread_bench pingpong [--policy FILE | --scx-floor] [--rounds N] [--same-core]
//     Two threads bounce a timestamp through two pipes (perf bench sched pipe's
//     workload): microseconds per round trip, and the distribution of one hop's
//     wakeup-to-running latency (write -> the reader's read() returns).
//     --scx-floor: under the least sched_ext scheduler (scx_floor.bpf.c, next to this
//     program), loaded here, not by syrupd: what sched_ext itself costs.
//   syrup_thread_bench cs [--policy FILE [--param K=V]...] [--threads N] [--seconds S] [--cs-us U]
//                         [--out-us U] [--sleep-us U]
//     N threads (more than cores) loop: critical section of U us (syr_cs_enter/exit),
//     U us outside, then a short sleep (a server waiting for its next request). Counts
//     involuntary context switches inside critical sections (getrusage RUSAGE_THREAD
//     before and after each one).
// --policy deploys FILE as a thread policy of application "threadbench" (through
// syrupd: SYRUP_SOCKET) and registers the threads; without it the kernel's own
// scheduler runs them. Prints one human line and one JSON line ("RESULT {...}").
#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <bpf/libbpf.h>
#include <nlohmann/json.hpp>

#include "syrup/syrup.h"

namespace {

using nlohmann::json;

uint64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

void spin_us(uint64_t us) {
  uint64_t end = now_ns() + us * 1000;
  while (now_ns() < end) {
  }
}

long nivcsw() {
  rusage ru;
  getrusage(RUSAGE_THREAD, &ru);
  return ru.ru_nivcsw;
}

struct Opts {
  std::string cmd, policy;
  std::vector<std::pair<std::string, uint64_t>> params;  // --param K=V, for the policy
  long rounds = 100000;
  bool same_core = false;
  bool scx_floor = false;
  int threads = 4, seconds = 3;
  long cs_us = 500, out_us = 300, sleep_us = 200;
};

std::string backend() {
  return access("/sys/kernel/sched_ext/state", R_OK) == 0 ? "sched_ext" : "agent";
}

std::string exe_dir() {
  char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) return "./";
  std::string dir(self, size_t(n));
  return dir.substr(0, dir.rfind('/') + 1);
}

// Decisions syrupd counted for policy `id` so far (syrupctl stats), or 0.
uint64_t decisions(int id) {
  if (id <= 0) return 0;
  std::string dir = exe_dir();
  const char* sock = std::getenv("SYRUP_SOCKET");
  std::string cmd = dir + "syrupctl --json " + (sock ? std::string("--socket ") + sock + " " : "") + "stats " +
                    std::to_string(id) + " 2>/dev/null";
  FILE* f = popen(cmd.c_str(), "r");
  if (!f) return 0;
  std::string out;
  char buf[4096];
  while (size_t k = fread(buf, 1, sizeof buf, f)) out.append(buf, k);
  pclose(f);
  try {
    auto j = json::parse(out);
    if (j.is_array() && !j.empty()) return j[0].value("decisions", 0ull);
  } catch (...) {
  }
  return 0;
}

int deploy(const Opts& o) {
  if (o.policy.empty()) return 0;
  syr_set_app("threadbench");
  std::vector<syr_param> ps;
  for (auto& [k, v] : o.params) ps.push_back({k.c_str(), v});
  syr_deploy_opts d{.sz = sizeof d, .app = "threadbench"};
  d.params = ps.data();
  d.n_params = ps.size();
  int id = syr_deploy_policy(o.policy.c_str(), SYR_HOOK_THREAD, &d);
  if (id < 0) {
    std::fprintf(stderr, "syrup_thread_bench: deploying %s: %s\n", o.policy.c_str(), syr_last_error());
    std::exit(1);
  }
  return id;
}

// The sched_ext floor scheduler, attached while this object lives (--scx-floor).
class ScxFloor {
 public:
  ScxFloor() {
    std::string path = exe_dir() + "scx_floor.bpf.o";
    obj_ = bpf_object__open_file(path.c_str(), nullptr);
    if (!obj_ || bpf_object__load(obj_)) fail("cannot load " + path);
    link_ = bpf_map__attach_struct_ops(bpf_object__find_map_by_name(obj_, "floor_ops"));
    if (!link_) fail("cannot attach the floor scheduler (is sched_ext on, and no other scheduler attached?)");
  }
  ~ScxFloor() {
    bpf_link__destroy(link_);
    bpf_object__close(obj_);
  }
  // The calling thread into SCHED_EXT (partial mode: only such threads are the floor's).
  static void join() {
    struct {
      uint32_t size, policy;
      uint64_t flags;
      int32_t nice;
      uint32_t prio;
      uint64_t runtime, deadline, period;
    } a = {sizeof a, 7 /* SCHED_EXT */, 0, 0, 0, 0, 0, 0};
    if (syscall(SYS_sched_setattr, 0, &a, 0)) fail("sched_setattr(SCHED_EXT)");
  }

 private:
  [[noreturn]] static void fail(const std::string& what) {
    std::fprintf(stderr, "syrup_thread_bench: %s: %s\n", what.c_str(), std::strerror(errno));
    std::exit(1);
  }
  bpf_object* obj_ = nullptr;
  bpf_link* link_ = nullptr;
};

// The policy as results name it: its file name, and its parameters if any ("cs_aware.c use_hint=0").
std::string policy_label(const Opts& o) {
  if (o.policy.empty()) return "none";
  std::string s = o.policy.substr(o.policy.rfind('/') + 1);
  for (auto& [k, v] : o.params) s += " " + k + "=" + std::to_string(v);
  return s;
}

double pct(std::vector<uint64_t>& v, double p) {
  if (v.empty()) return 0;
  return double(v[std::min(v.size() - 1, size_t(p * double(v.size())))]) / 1000.0;
}

int pingpong(const Opts& o) {
  int id = deploy(o);
  std::unique_ptr<ScxFloor> floor;
  if (o.scx_floor) floor = std::make_unique<ScxFloor>();
  int ab[2], ba[2];
  if (pipe(ab) || pipe(ba)) return 1;
  std::atomic<int> registered{0};
  std::vector<uint64_t> lat_b, lat_a;
  lat_b.reserve(size_t(o.rounds) + 2000);
  lat_a.reserve(size_t(o.rounds) + 2000);
  const long warm = 2000;
  auto setup = [&](int exec) {
    if (o.same_core) {
      cpu_set_t s;
      CPU_ZERO(&s);
      CPU_SET(0, &s);
      sched_setaffinity(0, sizeof s, &s);
    }
    if (id > 0 && syr_thread_register(uint32_t(exec)) < 0) {
      std::fprintf(stderr, "syrup_thread_bench: register: %s\n", syr_last_error());
      std::exit(1);
    }
    if (floor) ScxFloor::join();
    registered++;
  };
  std::thread b([&] {
    setup(1);
    uint64_t ts;
    for (long i = 0; i < o.rounds + warm; i++) {
      if (read(ab[0], &ts, sizeof ts) != sizeof ts) break;
      uint64_t t = now_ns();
      if (i >= warm) lat_b.push_back(t - ts);
      t = now_ns();
      if (write(ba[1], &t, sizeof t) != sizeof t) break;
    }
  });
  setup(0);
  while (registered.load() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  if (id > 0) std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the backend picks them up
  uint64_t t0 = 0, d0 = 0;
  for (long i = 0; i < o.rounds + warm; i++) {
    if (i == warm) {
      d0 = decisions(id);
      t0 = now_ns();
    }
    uint64_t t = now_ns(), ts;
    if (write(ab[1], &t, sizeof t) != sizeof t) break;
    if (read(ba[0], &ts, sizeof ts) != sizeof ts) break;
    if (i >= warm) lat_a.push_back(now_ns() - ts);
  }
  uint64_t el = now_ns() - t0;
  uint64_t d1 = decisions(id);
  b.join();
  std::vector<uint64_t> lat = lat_a;
  lat.insert(lat.end(), lat_b.begin(), lat_b.end());
  std::sort(lat.begin(), lat.end());
  double us_rt = double(el) / 1000.0 / double(o.rounds);
  json r = {{"bench", "pingpong"},
            {"policy", o.scx_floor ? "scx_floor" : policy_label(o)},
            {"backend", o.scx_floor ? "sched_ext" : o.policy.empty() ? "kernel" : backend()},
            {"same_core", o.same_core},
            {"rounds", o.rounds},
            {"usec_per_roundtrip", us_rt},
            {"roundtrips_per_s", 1e6 / us_rt},
            {"wakeup_us", {{"p50", pct(lat, 0.5)}, {"p90", pct(lat, 0.9)}, {"p99", pct(lat, 0.99)},
                           {"p999", pct(lat, 0.999)}, {"max", lat.empty() ? 0 : double(lat.back()) / 1000.0}}}};
  if (id > 0) r["decisions_per_s"] = double(d1 - d0) / (double(el) / 1e9);
  std::printf("pingpong %-12s %-9s %8.2f us/roundtrip  wakeup->running us: p50 %.1f p90 %.1f p99 %.1f p99.9 %.1f max %.1f%s\n",
              r["policy"].get<std::string>().c_str(), r["backend"].get<std::string>().c_str(), us_rt,
              pct(lat, 0.5), pct(lat, 0.9), pct(lat, 0.99), pct(lat, 0.999), r["wakeup_us"]["max"].get<double>(),
              id > 0 ? ("  decisions/s " + std::to_string(long(r["decisions_per_s"].get<double>()))).c_str() : "");
  std::printf("RESULT %s\n", r.dump().c_str());
  if (id > 0) syr_remove_policy(id);
  return 0;
}

int cs(const Opts& o) {
  int id = deploy(o);
  struct Count {
    long cs = 0, cs_preempted = 0, inv_in_cs = 0, inv_total = 0;
  };
  std::vector<Count> counts(size_t(o.threads));
  std::atomic<int> ready{0};
  std::atomic<bool> go{false}, stop{false};
  std::vector<std::thread> th;
  for (int i = 0; i < o.threads; i++)
    th.emplace_back([&, i] {
      if (id > 0 && syr_thread_register(uint32_t(i)) < 0) {
        std::fprintf(stderr, "syrup_thread_bench: register: %s\n", syr_last_error());
        std::exit(1);
      }
      ready++;
      while (!go.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      Count c;
      long inv0 = nivcsw();
      while (!stop.load(std::memory_order_relaxed)) {
        long a = nivcsw();
        syr_cs_enter();
        spin_us(uint64_t(o.cs_us));
        syr_cs_exit();
        long b = nivcsw();
        c.cs++;
        if (b > a) c.cs_preempted++, c.inv_in_cs += b - a;
        spin_us(uint64_t(o.out_us));
        if (o.sleep_us > 0) usleep(useconds_t(o.sleep_us));
      }
      c.inv_total = nivcsw() - inv0;
      counts[size_t(i)] = c;
    });
  while (ready.load() < o.threads) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  if (id > 0) std::this_thread::sleep_for(std::chrono::milliseconds(200));
  uint64_t d0 = decisions(id), t0 = now_ns();
  go = true;
  std::this_thread::sleep_for(std::chrono::seconds(o.seconds));
  stop = true;
  for (auto& t : th) t.join();
  double el = double(now_ns() - t0) / 1e9;
  uint64_t d1 = decisions(id);
  Count tot;
  for (auto& c : counts) {
    tot.cs += c.cs;
    tot.cs_preempted += c.cs_preempted;
    tot.inv_in_cs += c.inv_in_cs;
    tot.inv_total += c.inv_total;
  }
  double pre = tot.cs ? 100.0 * double(tot.cs_preempted) / double(tot.cs) : 0;
  json r = {{"bench", "cs"},
            {"policy", policy_label(o)},
            {"backend", o.policy.empty() ? "kernel" : backend()},
            {"threads", o.threads},
            {"cores", sysconf(_SC_NPROCESSORS_ONLN)},
            {"cs_us", o.cs_us},
            {"out_us", o.out_us},
            {"sleep_us", o.sleep_us},
            {"seconds", el},
            {"critical_sections", tot.cs},
            {"cs_per_s", double(tot.cs) / el},
            {"cs_preempted_pct", pre},
            {"involuntary_switches_in_cs", tot.inv_in_cs},
            {"involuntary_switches_total", tot.inv_total}};
  if (id > 0) r["decisions_per_s"] = double(d1 - d0) / el;
  std::printf("cs %-12s %-9s %d threads: %.0f CS/s, %.2f%% of CS preempted (%ld involuntary switches in CS, %ld in all)\n",
              r["policy"].get<std::string>().c_str(), r["backend"].get<std::string>().c_str(), o.threads,
              double(tot.cs) / el, pre, tot.inv_in_cs, tot.inv_total);
  std::printf("RESULT %s\n", r.dump().c_str());
  if (id > 0) syr_remove_policy(id);
  return 0;
}

int usage() {
  std::fprintf(stderr,
               "usage: syrup_thread_bench pingpong [--policy FILE | --scx-floor] [--rounds N] [--same-core]\n"
               "       syrup_thread_bench cs [--policy FILE [--param K=V]...] [--threads N] [--seconds S] [--cs-us U] [--out-us U] "
               "[--sleep-us U]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return usage();
  Opts o;
  o.cmd = argv[1];
  for (int i = 2; i < argc; i++) {
    std::string a = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) std::exit(usage());
      return argv[++i];
    };
    if (a == "--policy") o.policy = val();
    else if (a == "--rounds") o.rounds = std::atol(val().c_str());
    else if (a == "--same-core") o.same_core = true;
    else if (a == "--scx-floor") o.scx_floor = true;
    else if (a == "--param") {
      std::string kv = val();
      size_t eq = kv.find('=');
      if (eq == std::string::npos) return usage();
      o.params.emplace_back(kv.substr(0, eq), std::strtoull(kv.c_str() + eq + 1, nullptr, 0));
    }
    else if (a == "--threads") o.threads = std::atoi(val().c_str());
    else if (a == "--seconds") o.seconds = std::atoi(val().c_str());
    else if (a == "--cs-us") o.cs_us = std::atol(val().c_str());
    else if (a == "--out-us") o.out_us = std::atol(val().c_str());
    else if (a == "--sleep-us") o.sleep_us = std::atol(val().c_str());
    else return usage();
  }
  setvbuf(stdout, nullptr, _IOLBF, 0);
  if (o.cmd == "pingpong") return pingpong(o);
  if (o.cmd == "cs") return cs(o);
  return usage();
}
