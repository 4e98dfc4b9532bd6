// Benchmark 9: a --config change applied on every node's policies -- the time from the
// kubelet's ..data symlink swap in a ConfigMap directory (syrupd/tests/configmap_dir.h)
// to the status file saying that every entry of the new version is deployed, with
// --config_tenants tenants (100) of one socket-select policy each, every one of which the
// change replaces (its source changes).
//
// Side by side, each round: the same change on a second private syrupd without the watch,
// applied on SIGHUP sent right after the swap. The watch adds its debounce
// (kConfigWatchDebounceMs) and the inotify wake-up; the rest -- plan, 100 replacements,
// state and status files -- is the same work. Both daemons alternate between two versions
// whose objects are compiled before timing (a warm change: the sources are in the cache).
// Reported: median and p90 of each, and their ratio. The status file is polled every
// millisecond, parsed when it was replaced since the last look (and every 10 ms).
#include <signal.h>
#include <sys/stat.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "configmap_dir.h"
#include "harness.h"

namespace syrup_bench {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

// Two versions of the one policy every tenant runs: the change swaps them.
const char* kSource[2] = {
    "#include <syrup/policy.h>\nstatic __u32 next;\n"
    "SYR_POLICY(struct syr_input *in) { return __sync_fetch_and_add(&next, 1) % syr_num_executors; }\n",
    "#include <syrup/policy.h>\nSYR_POLICY(struct syr_input *in) { return 0; }\n"};

struct Node {
  const char* name;
  bool watch;
  std::string cm_dir;
  std::unique_ptr<syrup::test::ConfigMapDir> cm;
  PrivateDaemon d;
  std::vector<UdpGroup> groups;
  std::set<int> ids;  // the deployed entries' policy ids, after the last apply
  timespec seen{};  // the status file when last parsed
  ino_t seen_ino = 0;
  off_t seen_size = 0;
  Clock::time_point parsed_at{};
  int generation = 0;  // the status file's, at the last apply seen
  std::vector<double> ms;
  std::vector<int> reads;  // versions of the file syrupd read per change (1 unless an event came late)
};

std::map<std::string, std::string> version(const Node& n, int v) {
  std::string y = "version: 1\ntenants:\n";
  for (size_t i = 0; i < n.groups.size(); i++)
    y += "  - name: t" + std::to_string(i) + "\n    uid: 0\n    policies:\n      - name: p\n"
         "        hook: socket-select\n        policy: policy.c\n        pid: " + std::to_string(getpid()) +
         "\n        port: " + std::to_string(n.groups[i].port()) + "\n";
  return {{"syrup.yaml", y}, {"policy.c", kSource[v]}};
}

// Whether the status file says every entry is deployed, each with an id not in `before`
// (all replaced); then their ids go to `now`. Parsed when the file was replaced since the
// last look (its inode, mtime or size moved: the mtime alone is as coarse as the clock
// tick), and at least every 10 ms.
bool all_applied(Node& n, const std::set<int>& before, std::set<int>& now) {
  std::string path = n.d.dir() + "/status.json";
  struct stat st;
  if (stat(path.c_str(), &st) < 0) return false;
  auto t = Clock::now();
  bool moved = st.st_ino != n.seen_ino || st.st_size != n.seen_size || st.st_mtim.tv_nsec != n.seen.tv_nsec ||
               st.st_mtim.tv_sec != n.seen.tv_sec;
  if (!moved && t - n.parsed_at < std::chrono::milliseconds(10)) return false;
  n.seen = st.st_mtim;
  n.seen_ino = st.st_ino;
  n.seen_size = st.st_size;
  n.parsed_at = t;
  std::ifstream f(path);
  json s = json::parse(f, nullptr, false);
  if (s.is_discarded() || s.value("file", "") != "applied" || s.value("not_applied", 1) != 0 ||
      s.value("applied", 0u) != n.groups.size())
    return false;
  std::set<int> ids;
  for (auto& p : s["policies"]) {
    int id = p.value("id", 0);
    if (before.count(id)) return false;
    ids.insert(id);
  }
  now = std::move(ids);
  n.generation = s.value("generation", 0);
  return true;
}

// Publishes version `v` on `n` (and SIGHUPs it without the watch); the ms until applied.
int change(Node& n, int v, double timeout_s, double& ms) {
  int before_gen = n.generation;
  n.seen = {};
  n.seen_ino = 0;
  auto t0 = n.cm->publish(version(n, v));
  if (t0 == Clock::time_point{}) return -errno;
  if (!n.watch) kill(n.d.pid(), SIGHUP);
  std::set<int> now;
  while (!all_applied(n, n.ids, now)) {
    if (Clock::now() - t0 > std::chrono::duration<double>(timeout_s)) {
      std::fprintf(stderr, "syrup_bench: config-swap: %s did not apply version %d within %.0f s (log: %s/syrupd.log)\n",
                   n.name, v, timeout_s, n.d.dir().c_str());
      std::error_code ec;
      std::filesystem::copy_file(n.d.dir() + "/syrupd.log", "/tmp/syrup-bench-config-swap.log",
                                 std::filesystem::copy_options::overwrite_existing, ec);
      std::filesystem::copy_file(n.d.dir() + "/status.json", "/tmp/syrup-bench-config-swap.status.json",
                                 std::filesystem::copy_options::overwrite_existing, ec);
      return -ETIMEDOUT;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  n.ids = std::move(now);
  n.reads.push_back(n.generation - before_gen);
  return 0;
}

int start_node(const Env& env, Node& n) {
  char tmpl[] = "/tmp/syrup-bench-cm-XXXXXX";
  if (!mkdtemp(tmpl)) return -errno;
  n.cm_dir = tmpl;
  n.cm = std::make_unique<syrup::test::ConfigMapDir>(n.cm_dir);
  n.groups.resize(env.config_tenants);
  for (auto& g : n.groups)
    if (int r = g.open(2)) return r;
  n.cm->publish(version(n, 0));
  // A pin root of its own (the bench's other syrupd has /sys/fs/bpf/syrup-bench-<pid>):
  // two daemons on one root would pin their policies over each other's. Emptied and
  // removed by syrupd itself on SIGTERM (--on_exit=remove).
  std::vector<std::string> args = {"--config=" + n.cm_dir + "/syrup.yaml",
                                   "--bpffs_root=/sys/fs/bpf/syrup-bench-" + std::to_string(getpid()) + "-" + n.name};
  if (n.watch) args.push_back("--config_watch");
  if (int r = n.d.start(env.syrupd, "", args)) return r;
  // At start the file is applied before syrupd serves; wait for it (cold: compiled once
  // per entry), then compile the second version once, untimed.
  std::set<int> now;
  for (auto t0 = Clock::now(); !all_applied(n, {}, now); std::this_thread::sleep_for(std::chrono::milliseconds(10)))
    if (Clock::now() - t0 > std::chrono::seconds(300)) return -ETIMEDOUT;
  n.ids = std::move(now);
  double ms;
  if (int r = change(n, 1, 300, ms)) return r;
  return change(n, 0, 300, ms);
}

}  // namespace

int run_config_swap(const Env& env, json& out) {
  Node nodes[2];
  nodes[0].name = "watch";
  nodes[0].watch = true;
  nodes[1].name = "sighup";
  nodes[1].watch = false;
  int r = 0;
  for (auto& n : nodes)
    if ((r = start_node(env, n))) break;
  for (uint32_t round = 0; !r && round < env.config_rounds; round++)
    for (auto& n : nodes) {
      double ms;
      if ((r = change(n, static_cast<int>(round + 1) % 2, 60, ms))) break;
      n.ms.push_back(ms);
    }
  for (auto& n : nodes) {
    n.d.stop();
    std::error_code ec;
    std::filesystem::remove_all(n.cm_dir, ec);
  }
  if (r) return r;
  double w = median(nodes[0].ms), h = median(nodes[1].ms);
  std::printf("\n== config-swap: a ConfigMap change replacing %u tenants' policies, swap to applied ==\n",
              env.config_tenants);
  std::printf("%-34s %10s %10s\n", "case", "median ms", "p90 ms");
  std::printf("%-34s %10.1f %10.1f\n", "..data swap, --config_watch", w, percentile(nodes[0].ms, 90));
  std::printf("%-34s %10.1f %10.1f\n", "same change, SIGHUP at the swap", h, percentile(nodes[1].ms, 90));
  std::printf("watch / SIGHUP: %.2f (%u rounds; the watch waits %d ms after the first event)\n", w / h,
              env.config_rounds, 100);
  out = {{"tenants", env.config_tenants},
         {"rounds", env.config_rounds},
         {"watch_ms", {{"median", w}, {"p90", percentile(nodes[0].ms, 90)}, {"samples", nodes[0].ms}, {"file_reads", nodes[0].reads}}},
         {"sighup_ms", {{"median", h}, {"p90", percentile(nodes[1].ms, 90)}, {"samples", nodes[1].ms}, {"file_reads", nodes[1].reads}}},
         {"watch_over_sighup", w / h}};
  return 0;
}

}  // namespace syrup_bench
