// Benchmark 1: the per-decision cost of each shipped policy at the socket-select hook,
// next to a hand-written sk_reuseport round robin (handwritten_rr.bpf.c), loaded twice:
// as root (handwritten_rr) and with the capabilities syrupd verifies a tenant's policy
// with (handwritten_rr_alike: CAP_BPF and CAP_NET_ADMIN, so the verifier adds the same
// Spectre mitigations). The first ratio is what Syrup costs against a program one would
// load as root; the second what Syrup's wrapper costs, privilege aside.
//
// A run gives one program a fresh group of kSockets SO_REUSEPORT UDP sockets: a shipped
// policy deployed through libsyrup, or the hand-written program loaded with libbpf and
// attached with SO_ATTACH_REUSEPORT_EBPF. After kWarmup datagrams, env.datagrams more are
// sent and the cost is the kernel's own accounting over exactly that window:
// delta run_time_ns / delta run_cnt of the program (Syrup's is opened from its pin).
// A round runs every program once, round_robin and handwritten_rr back to back in
// alternating order, so drift on a noisy machine hits both alike; the report is the
// median over rounds and the round robin ratio, both as the ratio of the medians and as
// the median of the per-round ratios (the paired one, which the target is checked on).
#include <bpf/bpf.h>
#include <sys/socket.h>
#include <syrup/syrup.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "harness.h"

namespace syrup_bench {
namespace {

using nlohmann::json;

constexpr size_t kSockets = 4;
constexpr uint32_t kWarmup = 2000;
constexpr double kTargetRoundRobinNs = 100;
constexpr double kTargetRatio = 1.1;
const std::string kHandwritten = "handwritten_rr";
const std::string kHandwrittenAlike = "handwritten_rr_alike";
// Every program measured, in the order of a round (round_robin and handwritten_rr swap
// places every other round; handwritten_rr_alike runs right after them).
const std::vector<std::string> kPrograms = {"pass", "round_robin", kHandwritten, kHandwrittenAlike,
                                            "scan_avoid", "sita", "least_loaded"};

struct Run {
  double ns_per_decision = 0;
  uint64_t run_cnt = 0;
  std::vector<uint64_t> received;  // per socket, warm-up included
};

int measure(UdpGroup& group, int prog_fd, uint32_t datagrams, Run& out) {
  ProgStats before, after;
  int r;
  if ((r = group.send(kWarmup)) || (r = prog_stats(prog_fd, before)) ||
      (r = group.send(datagrams)) || (r = prog_stats(prog_fd, after))) {
    std::fprintf(stderr, "syrup_bench: measuring failed: %s\n", std::strerror(-r));
    return r;
  }
  out.run_cnt = after.run_cnt - before.run_cnt;
  if (out.run_cnt == 0) {
    std::fprintf(stderr, "syrup_bench: the program never ran (are BPF statistics on?)\n");
    return -ENODATA;
  }
  out.ns_per_decision = static_cast<double>(after.run_time_ns - before.run_time_ns) /
                        static_cast<double>(out.run_cnt);
  out.received = group.received();
  return 0;
}

int run_policy(const Env& env, const std::string& policy, Run& out) {
  UdpGroup group;
  if (int r = group.open(kSockets)) return r;
  syr_deploy_opts opts = group.deploy_opts(env.app);
  std::string path = env.policy_dir + "/" + policy + ".c";
  int id = syr_deploy_policy(path.c_str(), SYR_HOOK_SOCKET_SELECT, &opts);
  if (id < 0) {
    std::fprintf(stderr, "syrup_bench: deploying %s failed: %s\n", path.c_str(), syr_last_error());
    return id;
  }
  // The pin layout of syrupd (syrupd/pins.h): <root>/apps/<app>/policies/<id>/prog.
  std::string pin = env.bpffs_root + "/apps/" + env.app + "/policies/" + std::to_string(id) + "/prog";
  UniqueFd prog(bpf_obj_get(pin.c_str()));
  int r;
  if (prog) {
    r = measure(group, prog.get(), env.datagrams, out);
  } else {
    r = -errno;
    std::fprintf(stderr, "syrup_bench: cannot open %s: %s\n", pin.c_str(), std::strerror(-r));
  }
  if (int rr = syr_remove_policy(id); rr && !r) {
    std::fprintf(stderr, "syrup_bench: removing policy %d failed: %s\n", id, syr_last_error());
    r = rr;
  }
  return r;
}

int run_handwritten(const Env& env, const HandwrittenObject& hw, const std::string& label, Run& out) {
  UdpGroup group;
  if (int r = group.open(kSockets)) return r;
  const std::vector<int>& fds = group.member_fds();
  for (uint32_t i = 0; i < fds.size(); i++) {
    uint64_t fd = static_cast<uint64_t>(fds[i]);
    if (bpf_map_update_elem(hw.map_fd("socks"), &i, &fd, BPF_ANY) < 0) {
      int e = errno;
      std::fprintf(stderr, "syrup_bench: filling the socket array failed: %s\n", std::strerror(e));
      return -e;
    }
  }
  int prog_fd = hw.prog_fd(kHandwritten.c_str());
  if (setsockopt(fds[0], SOL_SOCKET, SO_ATTACH_REUSEPORT_EBPF, &prog_fd, sizeof prog_fd) < 0) {
    int e = errno;
    std::fprintf(stderr, "syrup_bench: attaching %s failed: %s\n", label.c_str(), std::strerror(e));
    return -e;
  }
  return measure(group, prog_fd, env.datagrams, out);  // closing the group detaches it
}

}  // namespace

int run_decision(const Env& env, json& out) {
  // The hand-written program, loaded once for all its runs, as root and as syrupd loads.
  HandwrittenObject hw, hw_alike;
  if (int r = hw.load(env.handwritten_obj, {{"num_socks", kSockets}})) return r;
  if (int r = hw_alike.load(env.handwritten_obj, {{"num_socks", kSockets}}, true)) return r;

  std::printf("\n== Per-decision cost at the socket-select hook ==\n"
              "%zu SO_REUSEPORT UDP sockets on 127.0.0.1, %u datagrams of 16 bytes per run, %u "
              "rounds.\nns/decision = delta run_time_ns / delta run_cnt of the program (kernel BPF "
              "statistics).\n\n",
              kSockets, env.datagrams, env.rounds);
  std::printf("%-7s", "round");
  for (auto& c : kPrograms) {
    std::printf(" %*s", static_cast<int>(c.size()), c.c_str());
    if (c == kHandwritten) std::printf(" %7s", "rr/hw");
    if (c == kHandwrittenAlike) std::printf(" %7s", "rr/alk");
  }
  std::printf("\n");

  std::map<std::string, std::vector<Run>> runs;
  std::vector<double> ratios, ratios_alike;
  for (uint32_t round = 0; round < env.rounds; round++) {
    std::vector<std::string> order = kPrograms;
    if (round % 2) std::swap(order[1], order[2]);  // round_robin <-> handwritten_rr
    for (auto& name : order) {
      Run run;
      int r = name == kHandwritten        ? run_handwritten(env, hw, name, run)
              : name == kHandwrittenAlike ? run_handwritten(env, hw_alike, name, run)
                                          : run_policy(env, name, run);
      if (r) return r;
      if (run.run_cnt != env.datagrams)
        std::fprintf(stderr, "syrup_bench: note: %s ran %llu times for %u datagrams\n", name.c_str(),
                     static_cast<unsigned long long>(run.run_cnt), env.datagrams);
      runs[name].push_back(run);
    }
    double ratio = runs["round_robin"].back().ns_per_decision / runs[kHandwritten].back().ns_per_decision;
    ratios.push_back(ratio);
    double ratio_alike = runs["round_robin"].back().ns_per_decision / runs[kHandwrittenAlike].back().ns_per_decision;
    ratios_alike.push_back(ratio_alike);
    std::printf("%-7u", round + 1);
    for (auto& c : kPrograms) {
      std::printf(" %*.1f", static_cast<int>(c.size()), runs[c].back().ns_per_decision);
      if (c == kHandwritten) std::printf(" %6.2fx", ratio);
      if (c == kHandwrittenAlike) std::printf(" %6.2fx", ratio_alike);
    }
    std::printf("\n");
    std::fflush(stdout);
  }

  json programs = json::object();
  std::map<std::string, double> medians;
  for (auto& c : kPrograms) {
    std::vector<double> ns;
    json cnt = json::array();
    for (auto& run : runs[c]) {
      ns.push_back(run.ns_per_decision);
      cnt.push_back(run.run_cnt);
    }
    medians[c] = median(ns);
    programs[c] = {{"median_ns_per_decision", medians[c]},
                   {"ns_per_decision", ns},
                   {"run_cnt", cnt},
                   {"received_per_socket_last_run", runs[c].back().received}};
  }
  double rr = medians["round_robin"], ratio = rr / medians[kHandwritten];
  double paired = median(ratios);
  double ratio_alike = rr / medians[kHandwrittenAlike], paired_alike = median(ratios_alike);
  std::printf("%-7s", "median");
  for (auto& c : kPrograms) {
    std::printf(" %*.1f", static_cast<int>(c.size()), medians[c]);
    if (c == kHandwritten) std::printf(" %6.2fx", ratio);
    if (c == kHandwrittenAlike) std::printf(" %6.2fx", ratio_alike);
  }
  std::printf("\n\nrr/hw: %.2fx as the ratio of the medians, %.2fx as the median of the per-round\n"
              "ratios (each pairs two back-to-back runs; the target is checked on it).\n"
              "rr/alk (against the hand-written program verified with syrupd's capabilities): %.2fx,\n"
              "%.2fx per round.\n",
              ratio, paired, ratio_alike, paired_alike);
  std::printf("\ntargets:\n");
  print_target("round_robin", rr, "ns/decision", "<= 100 ns", rr <= kTargetRoundRobinNs);
  print_target("round_robin / handwritten_rr", paired, "x", "<= 1.1x", paired <= kTargetRatio);

  out = {{"sockets", kSockets},
         {"datagrams_per_run", env.datagrams},
         {"warmup_datagrams", kWarmup},
         {"rounds", env.rounds},
         {"programs", programs},
         {"round_robin_vs_handwritten",
          {{"ratio_of_medians", ratio}, {"per_round", ratios}, {"median_per_round", paired}}},
         {"round_robin_vs_handwritten_alike",
          {{"ratio_of_medians", ratio_alike}, {"per_round", ratios_alike}, {"median_per_round", paired_alike}}},
         {"targets",
          {{"round_robin_ns_max", kTargetRoundRobinNs},
           {"round_robin_ns_met", rr <= kTargetRoundRobinNs},
           {"ratio_max", kTargetRatio},
           {"ratio_met", paired <= kTargetRatio}}}};
  return 0;
}

}  // namespace syrup_bench
