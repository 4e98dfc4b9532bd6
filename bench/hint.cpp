// Benchmark 2: a hint written through the mmap'ed map against bpf(BPF_MAP_UPDATE_ELEM).
//
// scan_avoid is deployed on a group of kSockets sockets (it declares SYR_ARRAY scan_map
// of __u64), and the map is opened and mapped through libsyrup, as an application does.
// A round times env.hints syr_hint_set() stores, then env.syscalls syr_map_update_elem()
// calls, both cycling over the executors' elements with a changing value; the report is
// the median over rounds. The stores cannot be optimised away: each is an atomic store
// into a MAP_SHARED mapping, with a new value and a compiler barrier per iteration. After
// each loop the last value is read back through the other path, which checks that both
// write the same map.
#include <linux/bpf.h>
#include <syrup/syrup.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "harness.h"

namespace syrup_bench {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr size_t kSockets = 4;
constexpr uint32_t kIndexMask = kSockets - 1;
constexpr double kTargetHintNs = 2;
constexpr double kTargetSpeedup = 200;

double ns_per_op(Clock::time_point start, uint64_t n) {
  std::chrono::duration<double, std::nano> elapsed = Clock::now() - start;
  return elapsed.count() / static_cast<double>(n);
}

// Out of line so the loop is timed as compiled here, not merged into the caller.
[[gnu::noinline]] void store_hints(const syr_mapped_array* arr, uint64_t n) {
  syr_mapped_array a = *arr;  // a local copy stays in registers across the barrier
  for (uint64_t i = 0; i < n; i++) {
    syr_hint_set(&a, static_cast<uint32_t>(i) & kIndexMask, i);
    asm volatile("" ::: "memory");
  }
}

int update_by_syscall(int map_fd, uint64_t n) {
  for (uint64_t i = 0; i < n; i++) {
    uint32_t key = static_cast<uint32_t>(i) & kIndexMask;
    uint64_t value = i;
    if (int r = syr_map_update_elem(map_fd, &key, &value, BPF_ANY)) return r;
  }
  return 0;
}

// The element the last of `n` writes went to holds n - 1, read through the other path.
int check_last(int map_fd, const syr_mapped_array& arr, uint64_t n, bool via_syscall) {
  uint32_t key = static_cast<uint32_t>(n - 1) & kIndexMask;
  uint64_t value = 0;
  if (via_syscall) {
    if (int r = syr_map_lookup_elem(map_fd, &key, &value)) return r;
  } else {
    value = syr_hint_get(&arr, key);
  }
  if (value == n - 1) return 0;
  std::fprintf(stderr, "syrup_bench: scan_map[%u] is %llu after writing %llu through the %s\n", key,
               static_cast<unsigned long long>(value), static_cast<unsigned long long>(n - 1),
               via_syscall ? "mapping" : "syscall");
  return -EIO;
}

int measure(const Env& env, int map_fd, const syr_mapped_array& arr, json& out) {
  std::printf("\n== Hint update: mmap'ed store vs bpf(BPF_MAP_UPDATE_ELEM) ==\n"
              "scan_map (SYR_ARRAY of __u64) of scan_avoid, %llu stores and %llu syscalls per "
              "round, %u rounds.\n\n",
              static_cast<unsigned long long>(env.hints), static_cast<unsigned long long>(env.syscalls),
              env.rounds);
  std::printf("%-7s %14s %18s %10s\n", "round", "mmap ns/hint", "syscall ns/update", "ratio");
  std::vector<double> mapped, syscall, ratios;
  for (uint32_t round = 0; round < env.rounds; round++) {
    auto start = Clock::now();
    store_hints(&arr, env.hints);
    mapped.push_back(ns_per_op(start, env.hints));
    if (int r = check_last(map_fd, arr, env.hints, true)) return r;

    start = Clock::now();
    if (int r = update_by_syscall(map_fd, env.syscalls)) {
      std::fprintf(stderr, "syrup_bench: map update failed: %s\n", syr_last_error());
      return r;
    }
    syscall.push_back(ns_per_op(start, env.syscalls));
    if (int r = check_last(map_fd, arr, env.syscalls, false)) return r;

    ratios.push_back(syscall.back() / mapped.back());
    std::printf("%-7u %14.3f %18.1f %9.0fx\n", round + 1, mapped.back(), syscall.back(), ratios.back());
  }
  double m = median(mapped), s = median(syscall), ratio = s / m;
  std::printf("%-7s %14.3f %18.1f %9.0fx\n", "median", m, s, ratio);
  std::printf("\ntargets:\n");
  print_target("mmap'ed hint", m, "ns/hint", "<= 2 ns", m <= kTargetHintNs);
  print_target("syscall / mmap'ed hint", ratio, "x", ">= 200x", ratio >= kTargetSpeedup);

  out = {{"map", "scan_map"},
         {"hints_per_round", env.hints},
         {"syscalls_per_round", env.syscalls},
         {"rounds", env.rounds},
         {"mmap_ns_per_hint", {{"median", m}, {"per_round", mapped}}},
         {"syscall_ns_per_update", {{"median", s}, {"per_round", syscall}}},
         {"speedup", {{"ratio_of_medians", ratio}, {"per_round", ratios}}},
         {"targets",
          {{"mmap_ns_max", kTargetHintNs},
           {"mmap_ns_met", m <= kTargetHintNs},
           {"speedup_min", kTargetSpeedup},
           {"speedup_met", ratio >= kTargetSpeedup}}}};
  return 0;
}

}  // namespace

int run_hint(const Env& env, json& out) {
  UdpGroup group;
  if (int r = group.open(kSockets)) return r;
  syr_deploy_opts opts = group.deploy_opts(env.app);
  std::string path = env.policy_dir + "/scan_avoid.c";
  int id = syr_deploy_policy(path.c_str(), SYR_HOOK_SOCKET_SELECT, &opts);
  if (id < 0) {
    std::fprintf(stderr, "syrup_bench: deploying %s failed: %s\n", path.c_str(), syr_last_error());
    return id;
  }
  int r = 0;
  UniqueFd map(syr_map_open_app(env.app.c_str(), "scan_map"));
  syr_mapped_array arr{};
  if (!map) {
    r = map.get();
    std::fprintf(stderr, "syrup_bench: opening scan_map failed: %s\n", syr_last_error());
  } else if ((r = syr_map_mmap(map.get(), &arr))) {
    std::fprintf(stderr, "syrup_bench: mapping scan_map failed: %s\n", syr_last_error());
  } else {
    r = measure(env, map.get(), arr, out);
    syr_map_munmap(&arr);
  }
  if (int rr = syr_remove_policy(id); rr && !r) {
    std::fprintf(stderr, "syrup_bench: removing policy %d failed: %s\n", id, syr_last_error());
    r = rr;
  }
  return r;
}

}  // namespace syrup_bench
