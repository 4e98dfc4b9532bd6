// Benchmarks of the policy author's workbench (docs/testing-policies.md):
//  - replay: inputs per second through the real JIT of a replay-sized test_run (synthetic
//    socket-select inputs shaped as a recording with --snap 64 keeps them: an 8-byte UDP
//    header and 56 bytes of payload, a flow hash each), batched as syrupd runs them (up to
//    4096 inputs per BPF_PROG_TEST_RUN) beside one test run per input (the request's
//    `batch` 1, the method before batching), in interleaved rounds, one syrupd. The rate
//    is the report's (inputs over the worker's run time, staging and reading back
//    included); the request's wall clock (compile cached, load, answer) is beside it.
//    Both methods must decide alike, input by input: a difference fails the benchmark.
//  - test: `syrupctl test` over every shipped policy's cases (policies/tests/*.yaml),
//    once cold (compiles) and then warm, in seconds.
#include <gflags/gflags.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "client.h"
#include "harness.h"

DEFINE_uint32(replay_inputs, 16000, "replay: inputs per test_run request (1..32768; 16000 of these fill 2.6 MB of the 4 MiB frame)");

namespace syrup_bench {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr double kTargetInputsPerS = 1e6, kTargetTestS = 5;

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Inputs as a recording of UDP datagrams with a 64-byte snap holds them (deterministic).
json replay_inputs(uint32_t n) {
  json inputs = json::array();
  uint64_t x = 0x9e3779b97f4a7c15ULL;
  static const char* hex = "0123456789abcdef";
  for (uint32_t i = 0; i < n; i++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    std::string b;
    for (int k = 0; k < 64; k++) {
      uint8_t v = static_cast<uint8_t>(x >> (8 * (k % 8)) ^ k);
      (b += hex[v >> 4]) += hex[v & 15];
    }
    inputs.push_back({{"bytes", b}, {"hash", static_cast<uint32_t>(x)}});
  }
  return inputs;
}

struct ReplayRun {
  double inputs_per_s = 0, wall_ms = 0;
  json decisions = json::array();
};

int replay_once(const json& base, uint32_t batch, ReplayRun& out) {
  json req = base;
  req["batch"] = batch;
  syrup::Client c;
  syrup::Message resp;
  auto t0 = Clock::now();
  if (const char* s = std::getenv("SYRUP_SOCKET"); !s || c.connect(s) || c.call(req, resp)) {
    std::fprintf(stderr, "syrup_bench replay: %s\n", c.error().c_str());
    return -ECONNREFUSED;
  }
  out.wall_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  if (!resp.body.value("ok", false)) {
    std::fprintf(stderr, "syrup_bench replay: %s\n", resp.body.dump().substr(0, 400).c_str());
    return -EIO;
  }
  const json& res = resp.body["results"];
  out.inputs_per_s = double(res.size()) / (resp.body["run_ns"].get<double>() / 1e9);
  for (auto& r : res) out.decisions.push_back(r["decision"]);
  return 0;
}

}  // namespace

int run_replay(const Env& env, json& out) {
  uint32_t n = std::clamp<uint32_t>(FLAGS_replay_inputs, 1, 32768);
  json base = {{"op", "test_run"},
               {"hook", "socket-select"},
               {"source", slurp(env.policy_dir + "/round_robin.c")},
               {"source_name", "round_robin.c"},
               {"executors", 4},
               {"seed", 1},
               {"inputs", replay_inputs(n)}};
  std::printf("\n== Replay through the JIT (socket-select, round_robin, %u inputs of 64 bytes) ==\n%u rounds; "
              "inputs/s over the worker's run time, the request's wall clock beside.\n\n%-7s %14s %14s %9s %10s %10s\n",
              n, env.rounds, "round", "batched/s", "per-input/s", "ratio", "wall b ms", "wall 1 ms");
  std::vector<double> batched, single, ratios, wall_b, wall_1;
  ReplayRun warm;
  if (int r = replay_once(base, 4096, warm)) return r;  // compiles once
  for (uint32_t round = 0; round < env.rounds; round++) {
    ReplayRun b, s;
    int r = round % 2 ? replay_once(base, 1, s) || replay_once(base, 4096, b)
                      : replay_once(base, 4096, b) || replay_once(base, 1, s);
    if (r) return -EIO;
    if (b.decisions != s.decisions || b.decisions.size() != n) {
      std::fprintf(stderr, "syrup_bench replay: the batched run decided otherwise than one run per input\n");
      return -EIO;
    }
    batched.push_back(b.inputs_per_s), single.push_back(s.inputs_per_s);
    ratios.push_back(b.inputs_per_s / s.inputs_per_s);
    wall_b.push_back(b.wall_ms), wall_1.push_back(s.wall_ms);
    std::printf("%-7u %14.0f %14.0f %8.2fx %10.1f %10.1f\n", round + 1, batched.back(), single.back(), ratios.back(),
                wall_b.back(), wall_1.back());
    std::fflush(stdout);
  }
  double rate = median(batched);
  std::printf("median  %14.0f %14.0f %8.2fx %10.1f %10.1f\n\ntargets:\n", rate, median(single), median(ratios),
              median(wall_b), median(wall_1));
  print_target("batched replay", rate / 1e6, "M inputs/s", "> 1 M/s", rate > kTargetInputsPerS);
  out = {{"inputs", n},
         {"rounds", env.rounds},
         {"batched_inputs_per_s", {{"per_round", batched}, {"median", rate}}},
         {"per_input_inputs_per_s", {{"per_round", single}, {"median", median(single)}}},
         {"batched_vs_per_input", {{"per_round", ratios}, {"median", median(ratios)}}},
         {"wall_ms", {{"batched", median(wall_b)}, {"per_input", median(wall_1)}}},
         {"same_decisions", true},
         {"targets", {{"inputs_per_s_min", kTargetInputsPerS}, {"met", rate > kTargetInputsPerS}}}};
  return 0;
}

int run_test(const Env& env, json& out) {
  std::vector<std::pair<std::string, std::string>> cases;
  for (auto& e : fs::directory_iterator(env.policy_dir + "/tests"))
    if (e.path().extension() == ".yaml")
      cases.push_back({env.policy_dir + "/" + e.path().stem().string() + ".c", e.path().string()});
  std::sort(cases.begin(), cases.end());
  auto pass = [&](double& secs) {
    auto t0 = Clock::now();
    for (auto& [policy, yaml] : cases) {
      std::string said;
      if (run_cmd(env.syrupctl + " test " + policy + " " + yaml , &said)) {
        std::fprintf(stderr, "syrup_bench test: %s failed:\n%s\n", yaml.c_str(), said.c_str());
        return -EIO;
      }
    }
    secs = std::chrono::duration<double>(Clock::now() - t0).count();
    return 0;
  };
  std::printf("\n== syrupctl test over every shipped policy's cases (%zu files) ==\n\n", cases.size());
  double cold = 0;
  if (int r = pass(cold)) return r;
  std::vector<double> warm;
  for (uint32_t round = 0; round < env.rounds; round++) {
    double s = 0;
    if (int r = pass(s)) return r;
    warm.push_back(s);
    std::printf("warm round %u: %.2f s\n", round + 1, s);
  }
  double w = median(warm);
  std::printf("cold (compiles): %.2f s; warm median %.2f s\n\ntargets:\n", cold, w);
  print_target("syrupctl test, all shipped policies, warm", w, "s", "< 5 s", w < kTargetTestS);
  out = {{"policies", cases.size()},
         {"cold_s", cold},
         {"warm_s", {{"per_round", warm}, {"median", w}}},
         {"targets", {{"warm_s_max", kTargetTestS}, {"met", w < kTargetTestS}}}};
  return 0;
}

}  // namespace syrup_bench
