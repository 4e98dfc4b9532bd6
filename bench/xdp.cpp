// Benchmarks 4 and 5: the per-packet cost of Syrup's XDP dispatch, measured with
// BPF_PROG_TEST_RUN over a realistic frame (Ethernet + IPv4 + UDP + 16 bytes).
//
// xdp-cost: on a veth the bench makes, syrupd attaches its root program because the bench
// deploys round_robin (UDP port kRrPort, executors: every core) and pass (kPassPort) for
// two applications. Each round test-runs, env.xdp_repeat times each:
//   unclaimed  the root program alone, for a frame to a port no application claimed;
//   syr_pass   root + tail call + pass (SYR_PASS -> XDP_PASS);
//   hw_pass    handwritten_xdp_pass: the same parsing and port match, XDP_PASS;
//   syr_rr     root + tail call + round_robin: bpf_redirect_map() on the policy's CPUMAP,
//              returns XDP_REDIRECT; a plain test run does not carry out the redirect;
//   hw_rr      handwritten_xdp_rr: the same parsing, counter, core lookup and
//              bpf_redirect_map() on its own CPUMAP (filled by the bench), XDP_REDIRECT;
//   syr_live, hw_live  the two round robins again with BPF_F_TEST_XDP_LIVE_FRAMES: the
//              kernel turns every run into a real frame and performs the redirect, so
//              each frame is queued to the chosen core's CPUMAP kthread (the full
//              sending-side redirect path: frame setup, program, enqueue, flush).
// Each Syrup/hand-written pair runs back to back and swaps order every round. Reported:
// medians over rounds and, per pair, the median of the per-round differences (Syrup's
// dispatch overhead) and ratios.
//
// xdp-scale: two veths, A and B. round_robin is deployed for one application on each
// (port kRrPort). Phase 1 measures the root+tail call+round_robin path on A and on B
// (both with one application: the control, how much two identical setups differ); then
// env.xdp_apps - 1 more applications are deployed on B, each claiming its own port
// (pass, executor core 0), and phase 2 measures A (1 application) against B
// (env.xdp_apps applications), interleaved. The other applications are then removed and
// phase 3 repeats the control. Reported: medians and the median of the per-round ratios
// B/A. The control operations are timed too: each filler deploy, the removals, and the
// `list` request (what `syrupctl list` sends) with 2, N/4, N/2, 3N/4 and N + 1 policies
// deployed, to show that listing grows linearly with the policies, not faster. The
// curve: on B, at 1, 10, 100, 1000 (and N) applications, the rr path and the root alone
// beside the hand-written rr and pass programs over the same frames (bench/plot_dispatch.py
// draws it).
//
// ns/packet is the calling thread's CPU time over the BPF_PROG_TEST_RUN call divided by
// repeat (sub-ns resolution; the kernel's own `duration` is truncated to whole ns and is
// reported next to it). Time the test loop spends preempted is not counted by either.
#include <bpf/bpf.h>
#include <linux/bpf.h>
#include <syrup/syrup.h>
#include <syrup/xdp_abi.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "client.h"
#include "harness.h"
#include "xdp_common.h"

namespace syrup_bench {
namespace {

using nlohmann::json;
using namespace xdp;

constexpr uint16_t kRrPort = 9001, kPassPort = 9002, kUnclaimedPort = 9003;
constexpr uint16_t kFillerPortBase = 20000;
constexpr double kTargetOverheadNs = 15;
constexpr double kTargetTotalNs = 40;
constexpr double kTargetGrowth = 1.05;
// `syrupctl list` with a thousand tenants should feel instant to an operator.
constexpr double kTargetListMs = 100;

// One program under test: what to run, over which frame, and what must come out.
struct Subject {
  std::string name;
  int prog_fd = -1;
  std::vector<uint8_t> frame;
  bool live = false;
  uint32_t expect_retval = XDP_PASS;  // not checked for live runs (the kernel reports none)
  std::string root_if;                // Syrup's: the interface whose root stats must move
  uint32_t root_slot = 0;             // ... in this slot, by exactly repeat
  std::vector<TestRun> runs;
};

bool g_stats_warned = false;

int run_subject(const Env& env, Subject& s, uint32_t repeat, bool record = true) {
  uint64_t before = s.root_if.empty() ? 0 : root_stat(env, s.root_if, s.root_slot);
  TestRun t;
  if (int r = test_run(s.prog_fd, s.frame, repeat, s.live, t)) {
    std::fprintf(stderr, "syrup_bench: (%s)\n", s.name.c_str());
    return r;
  }
  if (!s.live && t.retval != s.expect_retval) {
    std::fprintf(stderr, "syrup_bench: %s returned XDP action %u, expected %u\n", s.name.c_str(), t.retval,
                 s.expect_retval);
    return -EPROTO;
  }
  if (!s.root_if.empty()) {
    uint64_t moved = root_stat(env, s.root_if, s.root_slot) - before;
    // Stray frames on the veth can only add to "unclaimed"; a dispatch count must be exact.
    bool ok = s.root_slot == SYR_XDP_ROOT_DISPATCHED ? moved == repeat : moved >= repeat;
    if (!ok) {
      std::fprintf(stderr, "syrup_bench: %s: the root program counted %llu in slot %u for %u runs\n",
                   s.name.c_str(), static_cast<unsigned long long>(moved), s.root_slot, repeat);
      return -EPROTO;
    }
  }
  if (!g_stats_warned && bpf_stats_on()) {
    g_stats_warned = true;
    std::fprintf(stderr, "syrup_bench: note: BPF run-time statistics are on (another process?); every "
                         "top-level program run pays two extra clock reads\n");
  }
  if (record) s.runs.push_back(t);
  return 0;
}

// "" if the kernel runs `prog_fd` with BPF_F_TEST_XDP_LIVE_FRAMES, else why not (some
// kernels refuse live-frame test runs to everyone: EPERM).
std::string live_frames_refused(int prog_fd, const std::vector<uint8_t>& frame) {
  LIBBPF_OPTS(bpf_test_run_opts, o, .data_in = frame.data(), .data_size_in = static_cast<uint32_t>(frame.size()),
              .repeat = 1, .flags = BPF_F_TEST_XDP_LIVE_FRAMES);
  if (bpf_prog_test_run_opts(prog_fd, &o) == 0) return "";
  int e = errno;
  return std::strerror(e);
}

std::vector<double> ns_of(const Subject& s) {
  std::vector<double> v;
  for (auto& t : s.runs) v.push_back(t.ns);
  return v;
}

json subject_json(const Subject& s) {
  json kernel = json::array();
  for (auto& t : s.runs) kernel.push_back(t.kernel_ns);
  std::vector<double> k;
  for (auto& t : s.runs) k.push_back(t.kernel_ns);
  return {{"median_ns", median(ns_of(s))},
          {"ns_per_round", ns_of(s)},
          {"median_kernel_duration_ns", median(k)},
          {"kernel_duration_ns_per_round", kernel},
          {"live_frames", s.live},
          {"retval", s.live ? json(nullptr) : json(s.runs.back().retval)}};
}

struct Pair {
  const char* label;  // column header of the difference
  size_t syrup, hw;   // indices into the subjects
  std::vector<double> diffs, ratios;
};

}  // namespace

int run_xdp_cost(const Env& env, json& out) {
  VethNet net;
  if (int r = net.create(0)) return r;
  std::vector<int> cpus = all_cpus();
  Deployed deployed;
  std::string rr_path = env.policy_dir + "/round_robin.c", pass_path = env.policy_dir + "/pass.c";
  if (int id = deployed.deploy(rr_path, "xdp-cost-rr", net.host_if, kRrPort, cpus); id < 0) return id;
  if (int id = deployed.deploy(pass_path, "xdp-cost-pass", net.host_if, kPassPort, cpus); id < 0) return id;
  UniqueFd root;
  if (int r = open_root(env, net.host_if, root)) return r;
  Handwritten hw;
  if (int r = hw.load(env.handwritten_xdp_obj, kRrPort, cpus)) return r;

  auto rr_frame = udp_frame(net, kRrPort);
  // [0..4] Syrup and hand-written, [5..7] the tail call alone, [8, 9] the live pair, which
  // only a kernel that allows live-frame test runs gets.
  std::vector<Subject> s = {
      {"unclaimed", root.get(), udp_frame(net, kUnclaimedPort), false, XDP_PASS, net.host_if,
       SYR_XDP_ROOT_UNCLAIMED, {}},
      {"syr_pass", root.get(), udp_frame(net, kPassPort), false, XDP_PASS, net.host_if,
       SYR_XDP_ROOT_DISPATCHED, {}},
      {"hw_pass", hw.pass_fd(), rr_frame, false, XDP_PASS, "", 0, {}},
      {"syr_rr", root.get(), rr_frame, false, XDP_REDIRECT, net.host_if, SYR_XDP_ROOT_DISPATCHED, {}},
      {"hw_rr", hw.rr_fd(), rr_frame, false, XDP_REDIRECT, "", 0, {}},
      {"tc_none", hw.tail_fd("target"), rr_frame, false, XDP_PASS, "", 0, {}},
      {"tc_dir", hw.tail_fd("direct"), rr_frame, false, XDP_PASS, "", 0, {}},
      {"tc_ind", hw.tail_fd("indirect"), rr_frame, false, XDP_PASS, "", 0, {}},
      {"syr_live", root.get(), rr_frame, true, 0, net.host_if, SYR_XDP_ROOT_DISPATCHED, {}},
      {"hw_live", hw.rr_fd(), rr_frame, true, 0, "", 0, {}},
  };
  // The floor: one tail call alone, with a constant index (direct jump) and with one
  // loaded from memory (indirect), minus the target program run on its own.
  std::vector<double> tc_direct, tc_indirect;
  std::vector<Pair> pairs = {{"d_pass", 1, 2, {}, {}}, {"d_rr", 3, 4, {}, {}}, {"d_live", 8, 9, {}, {}}};
  std::string live_refused = live_frames_refused(hw.rr_fd(), rr_frame);
  if (!live_refused.empty()) {
    std::fprintf(stderr, "syrup_bench: note: this kernel refuses BPF_PROG_TEST_RUN with live frames (%s): "
                         "syr_live and hw_live are not measured\n", live_refused.c_str());
    s.resize(8);
    pairs.pop_back();
  }

  std::printf("\n== XDP dispatch cost per packet (BPF_PROG_TEST_RUN) ==\n"
              "veth %s, root program + round_robin (UDP %u, %zu cores) + pass (UDP %u) deployed "
              "through syrupd;\nhand-written standalone XDP programs next to them. %u runs per "
              "measurement, %u rounds.\nns/packet = CPU time of the BPF_PROG_TEST_RUN call / runs. "
              "d_* = Syrup - hand-written (same round).\n"
              "live = BPF_F_TEST_XDP_LIVE_FRAMES: the redirect to the CPUMAP is carried out.\n\n",
              net.host_if.c_str(), kRrPort, cpus.size(), kPassPort, env.xdp_repeat, env.xdp_rounds);
  // Warm-up (not recorded): caches, the CPUMAP kthreads, the page pool of live runs.
  for (auto& x : s)
    if (int r = run_subject(env, x, env.xdp_repeat / 10 + 1, false)) return r;

  std::printf("%-6s", "round");
  for (auto& x : s) std::printf(" %9s", x.name.c_str());
  for (auto& p : pairs) std::printf(" %7s", p.label);
  std::printf("\n");
  for (uint32_t round = 0; round < env.xdp_rounds; round++) {
    std::vector<size_t> order(s.size());
    for (size_t i = 0; i < order.size(); i++) order[i] = i;
    if (round % 2) {
      for (auto& p : pairs) std::swap(order[p.syrup], order[p.hw]);
      std::swap(order[5], order[7]);
    }
    for (size_t i : order)
      if (int r = run_subject(env, s[i], env.xdp_repeat)) return r;
    std::printf("%-6u", round + 1);
    for (auto& x : s) std::printf(" %9.2f", x.runs.back().ns);
    for (auto& p : pairs) {
      double a = s[p.syrup].runs.back().ns, b = s[p.hw].runs.back().ns;
      p.diffs.push_back(a - b);
      p.ratios.push_back(a / b);
      std::printf(" %7.2f", p.diffs.back());
    }
    tc_direct.push_back(s[6].runs.back().ns - s[5].runs.back().ns);
    tc_indirect.push_back(s[7].runs.back().ns - s[5].runs.back().ns);
    std::printf("\n");
    std::fflush(stdout);
  }
  std::printf("%-6s", "median");
  for (auto& x : s) std::printf(" %9.2f", median(ns_of(x)));
  for (auto& p : pairs) std::printf(" %7.2f", median(p.diffs));
  std::printf("\n%-6s", "kernel");
  for (auto& x : s) {
    std::vector<double> k;
    for (auto& t : x.runs) k.push_back(t.kernel_ns);
    std::printf(" %9.0f", median(k));
  }
  std::printf("   (the kernel's `duration`, whole ns)\n\n");
  for (auto& p : pairs)
    std::printf("%-7s Syrup %.2f ns vs hand-written %.2f ns: +%.2f ns per packet, %.2fx (medians of "
                "per-round values)\n",
                p.label + 2, median(ns_of(s[p.syrup])), median(ns_of(s[p.hw])), median(p.diffs),
                median(p.ratios));

  std::printf("one tail call alone: %.2f ns with a constant index (direct jump), %.2f ns with an index "
              "from memory (indirect jump)\n",
              median(tc_direct), median(tc_indirect));

  double overhead = median(pairs[1].diffs), total = median(ns_of(s[3]));
  std::printf("\ntargets:\n");
  print_target("dispatch overhead (syr_rr-hw_rr)", overhead, "ns/packet", "<= 15 ns", overhead <= kTargetOverheadNs);
  print_target("root+tail call+round_robin", total, "ns/packet", "< 40 ns", total < kTargetTotalNs);
  std::printf("  (the < 40 ns target is for 1000 applications: see xdp-scale)\n");

  json subjects = json::object(), jp = json::object();
  for (auto& x : s) subjects[x.name] = subject_json(x);
  for (auto& p : pairs)
    jp[p.label + 2] = {{"syrup", s[p.syrup].name},
                       {"handwritten", s[p.hw].name},
                       {"median_overhead_ns", median(p.diffs)},
                       {"overhead_ns_per_round", p.diffs},
                       {"median_ratio", median(p.ratios)},
                       {"ratio_per_round", p.ratios}};
  out = {{"interface", net.host_if},
         {"frame_bytes", rr_frame.size()},
         {"cores", cpus},
         {"repeat", env.xdp_repeat},
         {"rounds", env.xdp_rounds},
         {"bpf_stats_were_on", g_stats_warned},
         {"live_frames", {{"measured", live_refused.empty()}, {"refused", live_refused}}},
         {"programs", subjects},
         {"syrup_minus_handwritten", jp},
         {"tail_call_alone_ns",
          {{"direct", median(tc_direct)},
           {"indirect", median(tc_indirect)},
           {"direct_per_round", tc_direct},
           {"indirect_per_round", tc_indirect}}},
         {"targets",
          {{"overhead_ns_max", kTargetOverheadNs},
           {"overhead_met", overhead <= kTargetOverheadNs},
           {"total_ns_max", kTargetTotalNs},
           {"total_met", total < kTargetTotalNs}}}};
  return deployed.remove_all();
}

// Times `samples` lists of everything, each on its own connection as syrupctl makes it:
// connect, send, receive and parse the whole answer (every page). Adds one sample per list
// (ms) to `ms`; `listed` is the number of policies in the last one.
int time_list(int samples, std::vector<double>& ms, size_t& listed) {
  for (int i = 0; i < samples; i++) {
    auto t0 = std::chrono::steady_clock::now();
    if (int r = request_all_pages("list", "policies", listed)) return r;
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  return 0;
}

int run_xdp_scale(const Env& env, json& out) {
  if (env.xdp_apps < 2 || env.xdp_apps > SYR_XDP_MAX_APPS) {
    std::fprintf(stderr, "syrup_bench: --xdp_apps must be in 2..%d\n", SYR_XDP_MAX_APPS);
    return -EINVAL;
  }
  VethNet a, b;
  if (int r = a.create(1)) return r;
  if (int r = b.create(2)) return r;
  std::vector<int> cpus = all_cpus();
  std::string rr_path = env.policy_dir + "/round_robin.c", pass_path = env.policy_dir + "/pass.c";
  Deployed targets, fillers;
  if (int id = targets.deploy(rr_path, "xdp-scale-solo", a.host_if, kRrPort, cpus); id < 0) return id;
  if (int id = targets.deploy(rr_path, "xdp-scale-0000", b.host_if, kRrPort, cpus); id < 0) return id;
  UniqueFd root_a, root_b;
  if (int r = open_root(env, a.host_if, root_a)) return r;
  if (int r = open_root(env, b.host_if, root_b)) return r;

  auto make = [&](const char* name, const VethNet& n, int fd, uint16_t port, uint32_t retval, uint32_t slot) {
    return Subject{name, fd, udp_frame(n, port), false, retval, n.host_if, slot, {}};
  };
  // [0] A rr, [1] B rr, [2] A unclaimed, [3] B unclaimed; pairs (0,1) and (2,3).
  auto subjects = [&] {
    return std::vector<Subject>{
        make("A_rr", a, root_a.get(), kRrPort, XDP_REDIRECT, SYR_XDP_ROOT_DISPATCHED),
        make("B_rr", b, root_b.get(), kRrPort, XDP_REDIRECT, SYR_XDP_ROOT_DISPATCHED),
        make("A_unclaimed", a, root_a.get(), kUnclaimedPort, XDP_PASS, SYR_XDP_ROOT_UNCLAIMED),
        make("B_unclaimed", b, root_b.get(), kUnclaimedPort, XDP_PASS, SYR_XDP_ROOT_UNCLAIMED)};
  };

  std::printf("\n== XDP dispatch cost with 1 and with %u applications on one interface ==\n"
              "veth A: round_robin for 1 application; veth B: the same, then %u more applications "
              "(pass,\none UDP port each). Root + tail call + round_robin for a frame to that "
              "application (rr), and\nthe root alone for an unclaimed port. %u runs per "
              "measurement, %u rounds per phase.\n",
              env.xdp_apps, env.xdp_apps - 1, env.xdp_repeat, env.xdp_rounds);

  // Runs one phase; the per-round ratios B/A of both pairs in `ratios`.
  auto phase = [&](const char* title, std::vector<Subject>& s, std::vector<double> (&ratios)[2]) -> int {
    for (auto& x : s)
      if (int r = run_subject(env, x, env.xdp_repeat / 10 + 1, false)) return r;
    std::printf("\n%s\n%-6s %9s %9s %7s %12s %12s %7s\n", title, "round", "A_rr", "B_rr", "B/A", "A_unclaimed",
                "B_unclaimed", "B/A");
    for (uint32_t round = 0; round < env.xdp_rounds; round++) {
      std::vector<size_t> order = round % 2 ? std::vector<size_t>{1, 0, 3, 2} : std::vector<size_t>{0, 1, 2, 3};
      for (size_t i : order)
        if (int r = run_subject(env, s[i], env.xdp_repeat)) return r;
      for (int p = 0; p < 2; p++) ratios[p].push_back(s[2 * p + 1].runs.back().ns / s[2 * p].runs.back().ns);
      std::printf("%-6u %9.2f %9.2f %6.3fx %12.2f %12.2f %6.3fx\n", round + 1, s[0].runs.back().ns,
                  s[1].runs.back().ns, ratios[0].back(), s[2].runs.back().ns, s[3].runs.back().ns,
                  ratios[1].back());
      std::fflush(stdout);
    }
    std::printf("%-6s %9.2f %9.2f %6.3fx %12.2f %12.2f %6.3fx\n", "median", median(ns_of(s[0])),
                median(ns_of(s[1])), median(ratios[0]), median(ns_of(s[2])), median(ns_of(s[3])),
                median(ratios[1]));
    return 0;
  };

  // The curve: B's rr path and root alone beside the hand-written programs (loaded, not
  // attached) over the same frames, with 1, 10, 100, ... applications on B; each point
  // env.xdp_rounds interleaved rounds, the per-round ratios' medians reported.
  Handwritten hw;
  if (int r = hw.load(env.handwritten_xdp_obj, kRrPort, cpus)) return r;
  json curve = json::array();
  auto curve_point = [&](uint32_t apps) -> int {
    std::vector<Subject> c = {make("B_rr", b, root_b.get(), kRrPort, XDP_REDIRECT, SYR_XDP_ROOT_DISPATCHED),
                              {"hw_rr", hw.rr_fd(), udp_frame(b, kRrPort), false, XDP_REDIRECT, "", 0, {}},
                              make("B_unclaimed", b, root_b.get(), kUnclaimedPort, XDP_PASS, SYR_XDP_ROOT_UNCLAIMED),
                              {"hw_pass", hw.pass_fd(), udp_frame(b, kRrPort), false, XDP_PASS, "", 0, {}}};
    for (auto& x : c)
      if (int r = run_subject(env, x, env.xdp_repeat / 10 + 1, false)) return r;
    std::vector<double> rr_ratio, pass_ratio;
    for (uint32_t round = 0; round < env.xdp_rounds; round++) {
      std::vector<size_t> order = round % 2 ? std::vector<size_t>{1, 0, 3, 2} : std::vector<size_t>{0, 1, 2, 3};
      for (size_t i : order)
        if (int r = run_subject(env, c[i], env.xdp_repeat)) return r;
      rr_ratio.push_back(c[0].runs.back().ns / c[1].runs.back().ns);
      pass_ratio.push_back(c[2].runs.back().ns / c[3].runs.back().ns);
    }
    std::printf("curve: %4u applications on B: rr %.2f ns (hand-written %.2f, %.3fx), root alone %.2f ns "
                "(hand-written pass %.2f, %.3fx)\n",
                apps, median(ns_of(c[0])), median(ns_of(c[1])), median(rr_ratio), median(ns_of(c[2])),
                median(ns_of(c[3])), median(pass_ratio));
    std::fflush(stdout);
    json p = {{"applications", apps}, {"rr_over_hw_rr", median(rr_ratio)}, {"unclaimed_over_hw_pass", median(pass_ratio)}};
    for (auto& x : c) p[x.name] = subject_json(x);
    curve.push_back(std::move(p));
    return 0;
  };

  std::vector<Subject> before = subjects();
  std::vector<double> before_ratios[2];
  if (int r = phase("Phase 1 (control): 1 application on A, 1 on B", before, before_ratios)) return r;
  std::printf("\n");
  if (int r = curve_point(1)) return r;

  // `list` with 2, about N/4, N/2, 3N/4 and N + 1 policies: the time per extra policy
  // stays flat if listing is linear.
  constexpr int kListSamples = 30;
  struct ListPoint {
    size_t policies = 0;
    std::vector<double> ms;
  };
  std::vector<ListPoint> lists;
  auto measure_list = [&]() -> int {
    ListPoint p;
    if (int r = time_list(kListSamples, p.ms, p.policies)) return r;
    lists.push_back(std::move(p));
    return 0;
  };
  if (int r = measure_list()) return r;

  std::printf("\ndeploying %u applications on %s ...\n", env.xdp_apps - 1, b.host_if.c_str());
  std::fflush(stdout);
  std::vector<double> deploy_ms;
  const std::vector<int> core0 = {0};
  for (uint32_t i = 1; i < env.xdp_apps; i++) {
    char app[32];
    std::snprintf(app, sizeof app, "xdp-scale-%04u", i);
    auto t0 = std::chrono::steady_clock::now();
    int id = fillers.deploy(pass_path, app, b.host_if, static_cast<uint16_t>(kFillerPortBase + i), core0);
    if (id < 0) return id;
    deploy_ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    if (i == env.xdp_apps / 4 || i == env.xdp_apps / 2 || i == 3 * env.xdp_apps / 4)
      if (int r = measure_list()) return r;
    // Points at 10, 100, 1000 applications and at the last (i + 1 applications on B).
    bool decade = i + 1 == 10 || i + 1 == 100 || i + 1 == 1000;
    if (decade || i + 1 == env.xdp_apps)
      if (int r = curve_point(i + 1)) return r;
  }
  if (int r = measure_list()) return r;
  // Medians per block of (up to) 100 deploys, in order: whether a deploy gets slower as the
  // interface fills up.
  std::vector<double> by_block;
  for (size_t i = 1; i < deploy_ms.size(); i += 100) {  // [0] compiled pass.c
    std::vector<double> block(deploy_ms.begin() + static_cast<long>(i),
                              deploy_ms.begin() + static_cast<long>(std::min(i + 100, deploy_ms.size())));
    by_block.push_back(median(block));
  }
  std::printf("%zu deploys: median %.2f ms, p90 %.2f ms, max %.2f ms (the first compiles pass.c)\n"
              "median per 100 deploys, in order:",
              deploy_ms.size(), median(deploy_ms), percentile(deploy_ms, 90), percentile(deploy_ms, 100));
  for (double m : by_block) std::printf(" %.1f", m);
  std::printf(" ms\n");
  std::printf("list (%d requests each, one connection per request, as syrupctl list):\n", kListSamples);
  json list_json = json::array();
  for (auto& p : lists) {
    double med = median(p.ms);
    std::printf("  %5zu policies: median %.2f ms, p90 %.2f ms, max %.2f ms, %.1f us per policy\n", p.policies, med,
                percentile(p.ms, 90), percentile(p.ms, 100), p.policies ? 1000 * med / static_cast<double>(p.policies) : 0);
    list_json.push_back({{"policies", p.policies},
                         {"median_ms", med},
                         {"p90_ms", percentile(p.ms, 90)},
                         {"max_ms", percentile(p.ms, 100)},
                         {"samples_ms", p.ms}});
  }
  // Linear: the time per extra policy from the middle point to the last is about the same
  // as from the first to the middle (quadratic work would make it about three times as much).
  double per_lo = 0, per_hi = 0;
  if (lists.size() == 5) {
    per_lo = (median(lists[2].ms) - median(lists[0].ms)) / static_cast<double>(lists[2].policies - lists[0].policies);
    per_hi = (median(lists[4].ms) - median(lists[2].ms)) / static_cast<double>(lists[4].policies - lists[2].policies);
    std::printf("  ms per extra policy: %.4f (first half), %.4f (second half): %.2fx\n", per_lo, per_hi,
                per_lo > 0 ? per_hi / per_lo : 0);
  }

  std::vector<Subject> after = subjects();
  std::vector<double> after_ratios[2];
  char title[96];
  std::snprintf(title, sizeof title, "Phase 2: 1 application on A, %u on B", env.xdp_apps);
  if (int r = phase(title, after, after_ratios)) return r;

  auto t0 = std::chrono::steady_clock::now();
  int removed = fillers.remove_all();
  double remove_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (removed) return removed;
  std::printf("\nremoved the %u applications in %.1f s\n", env.xdp_apps - 1, remove_s);

  // Phase 3, a second control: B is back to one application. A difference that phase 2
  // showed and phase 3 does not comes from the other applications, not from B itself.
  std::vector<Subject> again = subjects();
  std::vector<double> again_ratios[2];
  if (int r = phase("Phase 3 (control): 1 application on A, 1 on B again", again, again_ratios)) return r;

  double growth = median(after_ratios[0]), control = median(before_ratios[0]);
  double control2 = median(again_ratios[0]);
  double total = median(ns_of(after[1]));
  std::printf("\nroot + tail call + round_robin: %.2f ns with 1 application, %.2f ns with %u: %.3fx "
              "(controls, 1 vs 1: %.3fx before, %.3fx after)\nroot alone, unclaimed port: %.3fx "
              "(controls %.3fx, %.3fx)\n",
              median(ns_of(after[0])), total, env.xdp_apps, growth, control, control2, median(after_ratios[1]),
              median(before_ratios[1]), median(again_ratios[1]));
  std::printf("\ntargets:\n");
  if (!lists.empty()) {
    double full = median(lists.back().ms);
    print_target("list with N + 1 policies (median)", full, "ms", "< 100 ms", full < kTargetListMs);
  }
  print_target("rr, N apps / 1 app", growth, "x", "<= 1.05x", growth <= kTargetGrowth);
  print_target("rr with N apps", total, "ns/packet", "< 40 ns", total < kTargetTotalNs);

  auto phase_json = [](std::vector<Subject>& s, std::vector<double> (&ratios)[2]) {
    json j = json::object();
    for (auto& x : s) j[x.name] = subject_json(x);
    j["rr_B_over_A"] = {{"median", median(ratios[0])}, {"per_round", ratios[0]}};
    j["unclaimed_B_over_A"] = {{"median", median(ratios[1])}, {"per_round", ratios[1]}};
    return j;
  };
  out = {{"interfaces", {a.host_if, b.host_if}},
         {"applications_on_B", env.xdp_apps},
         {"repeat", env.xdp_repeat},
         {"rounds", env.xdp_rounds},
         {"bpf_stats_were_on", g_stats_warned},
         {"phase1_control_1_vs_1", phase_json(before, before_ratios)},
         {"phase2_1_vs_N", phase_json(after, after_ratios)},
         {"phase3_control_1_vs_1_again", phase_json(again, again_ratios)},
         {"curve", curve},
         {"filler_deploy_ms",
          {{"median", median(deploy_ms)},
           {"p90", percentile(deploy_ms, 90)},
           {"max", percentile(deploy_ms, 100)},
           {"count", deploy_ms.size()},
           {"median_per_100_in_order", by_block},
           {"samples", deploy_ms}}},
         {"filler_remove_total_s", remove_s},
         {"list", {{"points", list_json}, {"ms_per_policy_first_half", per_lo}, {"ms_per_policy_second_half", per_hi}}},
         {"targets",
          {{"growth_max", kTargetGrowth},
           {"growth_met", growth <= kTargetGrowth},
           {"total_ns_max", kTargetTotalNs},
           {"total_met", total < kTargetTotalNs}}}};
  return targets.remove_all();
}

}  // namespace syrup_bench
