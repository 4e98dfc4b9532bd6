// Benchmark 6: packets per second through a veth pair, without XDP, with hand-written
// standalone XDP programs and with Syrup's root program + policy, in one run.
//
// The bench makes a veth pair (peer in a namespace of its own). A sender thread, pinned
// to core 0, blasts 16-byte UDP datagrams from a socket in the peer namespace with
// sendmmsg (batches of 64, one flow) for the whole case; a receiver thread, pinned to the
// last core, counts what arrives on a UDP socket bound to the host end (recvmmsg). After
// kWarmup, the datagrams received during env.pps_seconds give the case's delivered pps.
// Cases, in a rotating order every round:
//   none      no XDP program on the host end;
//   hw_pass   handwritten_xdp_pass attached directly (native mode): what any XDP program
//             costs on a veth, the baseline for Syrup's pass;
//   syr_pass  Syrup: root program + pass policy for the port;
//   hw_rr     handwritten_xdp_rr attached directly: round robin to every core via CPUMAP;
//   syr_rr    Syrup: root program + round_robin to every core.
// Each Syrup policy is deployed through syrupd before its case and removed after it (the
// root program comes and goes with it); the hand-written programs are attached with
// bpf_xdp_attach() and detached. Reported: median pps per case, and the medians of the
// per-round ratios to `none` and Syrup/hand-written.
#include <arpa/inet.h>
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <linux/if_link.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <sys/socket.h>
#include <syrup/xdp_abi.h>
#include <time.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "harness.h"
#include "xdp_common.h"

namespace syrup_bench {
namespace {

using nlohmann::json;
using namespace xdp;
using namespace std::chrono_literals;

constexpr uint16_t kPort = 9100, kSrcPort = 40000;
constexpr auto kWarmup = 300ms;
constexpr double kStarved = 0.25;

struct CaseResult {
  double pps = 0, sent_pps = 0, dispatched_pps = 0;
  uint64_t rcvbuf_errors = 0;
  double sender_share = 0;  // the sender thread's CPU time / the window
};

}  // namespace

int run_xdp_pps(const Env& env, json& out) {
  VethNet net;
  if (int r = net.create(3)) return r;
  std::vector<int> cpus = all_cpus();
  int send_cpu = 0, recv_cpu = cpus.back();
  Handwritten hw;
  if (int r = hw.load(env.handwritten_xdp_obj, kPort, cpus)) return r;

  UniqueFd rx, tx;
  if (int r = udp_flow(net, kPort, kSrcPort, rx, tx)) return r;

  std::string rr_path = env.policy_dir + "/round_robin.c", pass_path = env.policy_dir + "/pass.c";
  Deployed deployed;
  int syr_id = -1;
  auto attach_hw = [&](int fd) {
    int r = bpf_xdp_attach(net.host_ifindex, fd, XDP_FLAGS_DRV_MODE, nullptr);
    if (r) std::fprintf(stderr, "syrup_bench: attaching a hand-written XDP program: %s\n", std::strerror(-r));
    return r;
  };
  auto detach_hw = [&] { return bpf_xdp_detach(net.host_ifindex, XDP_FLAGS_DRV_MODE, nullptr); };
  auto deploy = [&](const std::string& path, const char* app) {
    syr_id = deployed.deploy(path, app, net.host_if, kPort, cpus);
    return syr_id < 0 ? syr_id : 0;
  };
  auto undeploy = [&] {
    int r = deployed.remove(syr_id);
    syr_id = -1;
    return r;
  };
  struct Case {
    const char* name;
    bool syrup;
    std::function<int()> setup, teardown;
  };
  std::vector<Case> cases = {
      {"none", false, [] { return 0; }, [] { return 0; }},
      {"hw_pass", false, [&] { return attach_hw(hw.pass_fd()); }, detach_hw},
      {"syr_pass", true, [&] { return deploy(pass_path, "xdp-pps-pass"); }, undeploy},
      {"hw_rr", false, [&] { return attach_hw(hw.rr_fd()); }, detach_hw},
      {"syr_rr", true, [&] { return deploy(rr_path, "xdp-pps-rr"); }, undeploy},
  };

  // Compiles both policies once (not measured), so every measured deploy is warm.
  for (auto* c : {&cases[2], &cases[4]})
    if (int r = c->setup(); r || (r = c->teardown())) return r;

  std::printf("\n== Packets per second through a veth pair, with and without XDP ==\n"
              "sender: one UDP flow of 16-byte datagrams (sendmmsg x%u) from namespace %s, core %d;\n"
              "receiver: one UDP socket on %s:%u (recvmmsg), core %d. %.1f s measured per case after "
              "%lld ms warm-up, %u rounds.\nrr cases redirect to cores", kBatch, net.ns.c_str(), send_cpu,
              net.host_if.c_str(), kPort, recv_cpu, env.pps_seconds,
              static_cast<long long>(kWarmup.count()), env.pps_rounds);
  for (int c : cpus) std::printf(" %d", c);
  std::printf(" through a CPUMAP. Delivered kpps (received by the socket):\n\n%-6s", "round");
  for (auto& c : cases) std::printf(" %9s", c.name);
  std::printf("\n");

  std::map<std::string, std::vector<CaseResult>> res;
  for (uint32_t round = 0; round < env.pps_rounds; round++) {
    for (size_t k = 0; k < cases.size(); k++) {
      Case& c = cases[(k + round) % cases.size()];
      if (uint32_t id = attached_prog(net.host_ifindex)) {
        std::fprintf(stderr, "syrup_bench: %s still has XDP program %u before case %s\n", net.host_if.c_str(), id,
                     c.name);
        return -EBUSY;
      }
      if (int r = c.setup()) return r;
      CaseResult cr;
      int err = 0;
      {
        Blast blast(tx.get(), rx.get(), send_cpu, recv_cpu);
        std::this_thread::sleep_for(kWarmup);
        auto t0 = std::chrono::steady_clock::now();
        double c0 = blast.sender_cpu_s();
        uint64_t s0 = blast.sent(), r0 = blast.received(), e0 = udp_counter("RcvbufErrors");
        uint64_t d0 = c.syrup ? root_stat(env, net.host_if, SYR_XDP_ROOT_DISPATCHED) : 0;
        std::this_thread::sleep_for(std::chrono::duration<double>(env.pps_seconds));
        uint64_t s1 = blast.sent(), r1 = blast.received(), e1 = udp_counter("RcvbufErrors");
        double c1 = blast.sender_cpu_s();
        uint64_t d1 = c.syrup ? root_stat(env, net.host_if, SYR_XDP_ROOT_DISPATCHED) : 0;
        double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        blast.stop();
        err = blast.error();
        cr = {static_cast<double>(r1 - r0) / secs, static_cast<double>(s1 - s0) / secs,
              static_cast<double>(d1 - d0) / secs, e1 - e0, (c1 - c0) / secs};
      }
      if (int r = c.teardown()) {
        std::fprintf(stderr, "syrup_bench: ending case %s failed: %s\n", c.name, std::strerror(-r));
        return r;
      }
      if (err) {
        std::fprintf(stderr, "syrup_bench: sending failed in case %s: %s\n", c.name, std::strerror(-err));
        return err;
      }
      if (cr.pps <= 0) {
        std::fprintf(stderr, "syrup_bench: nothing arrived in case %s\n", c.name);
        return -ENODATA;
      }
      res[c.name].push_back(cr);
    }
    std::printf("%-6u", round + 1);
    for (auto& c : cases) std::printf(" %9.1f", res[c.name].back().pps / 1e3);
    std::printf("\n");
    std::fflush(stdout);
  }

  auto pps = [&](const std::string& name) {
    std::vector<double> v;
    for (auto& r : res[name]) v.push_back(r.pps);
    return v;
  };
  auto ratios = [&](const std::string& a, const std::string& b) {
    std::vector<double> v;
    for (size_t i = 0; i < res[a].size(); i++) v.push_back(res[a][i].pps / res[b][i].pps);
    return v;
  };
  std::printf("%-6s", "median");
  for (auto& c : cases) std::printf(" %9.1f", median(pps(c.name)) / 1e3);
  std::printf("\n\n%-10s %10s %10s %15s %12s %13s %9s\n", "case", "kpps rcvd", "kpps sent", "kpps dispatched",
              "sock drops/s", "sender core %", "vs none");
  json jc = json::object();
  for (auto& c : cases) {
    std::vector<double> sent, disp, drops, share;
    for (auto& r : res[c.name]) {
      share.push_back(r.sender_share * 100);
      sent.push_back(r.sent_pps);
      disp.push_back(r.dispatched_pps);
      drops.push_back(static_cast<double>(r.rcvbuf_errors) / env.pps_seconds);
    }
    auto vs_none = ratios(c.name, "none");
    char dispatched[32] = "-";
    if (c.syrup) std::snprintf(dispatched, sizeof dispatched, "%.1f", median(disp) / 1e3);
    std::printf("%-10s %10.1f %10.1f %15s %12.0f %13.0f %8.3fx\n", c.name, median(pps(c.name)) / 1e3,
                median(sent) / 1e3, dispatched, median(drops), median(share), median(vs_none));
    jc[c.name] = {{"median_pps", median(pps(c.name))},
                  {"pps_per_round", pps(c.name)},
                  {"median_sent_pps", median(sent)},
                  {"median_socket_drops_per_s", median(drops)},
                  {"median_sender_cpu_percent", median(share)},
                  {"sender_cpu_percent_per_round", share},
                  {"median_ratio_to_none", median(vs_none)},
                  {"ratio_to_none_per_round", vs_none}};
    if (c.syrup) jc[c.name]["median_dispatched_pps"] = median(disp);
  }
  // A window in which the sender ran for less than kStarved of the time: it was
  // descheduled (other load on its core, or the hypervisor's), so that window's rate says
  // more about the machine than about the path.
  int starved = 0;
  for (auto& [name, v] : res)
    for (auto& r : v) starved += r.sender_share < kStarved;
  if (starved)
    std::printf("\nnote: in %d of %zu windows the sender ran less than %.0f%% of the time (a busy machine);\n"
                "their rates are low for reasons outside the path measured, and the medians less reliable.\n",
                starved, cases.size() * env.pps_rounds, kStarved * 100);
  auto pass_ratio = ratios("syr_pass", "hw_pass"), rr_ratio = ratios("syr_rr", "hw_rr");
  std::printf("\nSyrup / hand-written (median of per-round ratios): pass %.3fx, round robin %.3fx\n",
              median(pass_ratio), median(rr_ratio));
  out = {{"interface", net.host_if},
         {"sender_core", send_cpu},
         {"receiver_core", recv_cpu},
         {"rr_cores", cpus},
         {"seconds_per_case", env.pps_seconds},
         {"warmup_ms", kWarmup.count()},
         {"rounds", env.pps_rounds},
         {"starved_windows", starved},
         {"cases", jc},
         {"syrup_over_handwritten",
          {{"pass", {{"median", median(pass_ratio)}, {"per_round", pass_ratio}}},
           {"round_robin", {{"median", median(rr_ratio)}, {"per_round", rr_ratio}}}}}};
  return 0;
}

}  // namespace syrup_bench
