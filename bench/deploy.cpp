// Benchmark 3: deploy latency, cold and warm.
//
// A sample is the wall time of one syr_deploy_policy_source() call for round_robin.c on
// a fresh group of kSockets sockets (opened untimed): the request to syrupd, compiling
// (or the cache hit), loading and verifying, pinning, filling the executors and
// attaching. Fresh, because a socket stays in a removed policy's executor map until the
// kernel frees that map, some milliseconds later, and syrupd cannot add it to a new one
// before then (EBUSY). Cold: the source
// ends with a comment carrying this process's id and a counter, so its content hash is
// new and syrupd runs the compiler. Warm: the unchanged source, deployed once before
// timing, so syrupd takes the object from its content-addressed cache. Cold and warm
// deploys alternate; each policy is removed (untimed) before the next deploy. Reported:
// median and p90 of each.
#include <syrup/syrup.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "harness.h"

namespace syrup_bench {
namespace {

using nlohmann::json;

constexpr size_t kSockets = 4;
constexpr double kTargetWarmMs = 10;
constexpr const char* kPolicy = "round_robin.c";

// Deploys `source` on a new group, adds its latency in ms to `ms`, and removes it.
int deploy_once(const Env& env, const std::string& source, std::vector<double>& ms) {
  UdpGroup group;
  if (int r = group.open(kSockets)) return r;
  syr_deploy_opts opts = group.deploy_opts(env.app);
  auto start = std::chrono::steady_clock::now();
  int id = syr_deploy_policy_source(source.data(), source.size(), kPolicy,
                                    SYR_HOOK_SOCKET_SELECT, &opts);
  auto end = std::chrono::steady_clock::now();
  if (id < 0) {
    std::fprintf(stderr, "syrup_bench: deploying %s failed: %s\n", kPolicy, syr_last_error());
    return id;
  }
  ms.push_back(std::chrono::duration<double, std::milli>(end - start).count());
  if (int r = syr_remove_policy(id)) {
    std::fprintf(stderr, "syrup_bench: removing policy %d failed: %s\n", id, syr_last_error());
    return r;
  }
  return 0;
}

json summary(const std::vector<double>& ms) {
  return {{"median_ms", median(ms)},
          {"p90_ms", percentile(ms, 90)},
          {"min_ms", percentile(ms, 0)},
          {"max_ms", percentile(ms, 100)},
          {"samples_ms", ms}};
}

}  // namespace

int run_deploy(const Env& env, json& out) {
  std::string path = env.policy_dir + "/" + kPolicy;
  std::ifstream in(path);
  std::ostringstream ss;
  ss << in.rdbuf();
  std::string source = ss.str();
  if (!in || source.empty()) {
    std::fprintf(stderr, "syrup_bench: cannot read %s\n", path.c_str());
    return -ENOENT;
  }

  std::printf("\n== Deploy latency ==\n"
              "%s on %zu sockets (a new group each time), %u cold and %u warm deploys,\n"
              "alternating; wall time of syr_deploy_policy_source() until the policy is attached.\n\n",
              kPolicy, kSockets, env.deploys, env.deploys);
  std::fflush(stdout);
  std::vector<double> primed, cold, warm;
  if (int r = deploy_once(env, source, primed)) return r;  // fills the cache for `warm`
  for (uint32_t i = 0; i < env.deploys; i++) {
    std::string unique = source + "\n/* syrup_bench cold deploy " + std::to_string(getpid()) + "." +
                         std::to_string(i) + " */\n";
    if (int r = deploy_once(env, unique, cold)) return r;
    if (int r = deploy_once(env, source, warm)) return r;
  }

  out = {{"policy", kPolicy}, {"sockets", kSockets}, {"deploys", env.deploys},
         {"cold", summary(cold)}, {"warm", summary(warm)}};
  std::printf("%-6s %10s %10s %10s %10s\n", "", "median ms", "p90 ms", "min ms", "max ms");
  for (auto [name, ms] : {std::pair{"cold", &cold}, std::pair{"warm", &warm}})
    std::printf("%-6s %10.2f %10.2f %10.2f %10.2f\n", name, median(*ms), percentile(*ms, 90),
                percentile(*ms, 0), percentile(*ms, 100));
  double warm_median = median(warm);
  std::printf("\ntargets:\n");
  print_target("warm deploy (median)", warm_median, "ms", "< 10 ms", warm_median < kTargetWarmMs);
  out["targets"] = {{"warm_median_ms_max", kTargetWarmMs},
                    {"warm_median_met", warm_median < kTargetWarmMs}};
  return 0;
}

}  // namespace syrup_bench
