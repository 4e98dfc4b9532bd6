// Benchmark: XDP steering to cores on a veth left at its default offloads, where a
// container's traffic arrives (issue #38). The peer keeps tx checksum offload on, so its
// datagrams carry partial checksums; steered from native-mode XDP through a CPUMAP they
// would all be dropped for a bad checksum, which is why syrupd attaches in generic mode on
// veth (docs/xdp.md). Two questions, each against the same veth without any XDP program:
//   delivered  a counted, paced burst of --veth_datagrams datagrams: how many arrived,
//              and the kernel's UDP InCsumErrors/RcvbufErrors over it (the 1.0 the issue
//              asks for is delivered/sent with Syrup steering);
//   pps        a flat-out blast for --pps_seconds, --pps_rounds interleaved rounds:
//              delivered packets per second, Syrup/none per round.
// Cases: none (no XDP program), syr_rr (Syrup's round_robin to every core through the
// root's CPUMAP, deployed through syrupd before its case and removed after it).
//
// Every phase is bounded by time: the paced sender waits at most 20 ms for the receiver per
// batch (a lost datagram cannot stall it), the main thread stops a burst after
// kBurstLimit whatever is left, and a flat-out blast lasts its window.
#include <bpf/libbpf.h>
#include <sys/socket.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
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

constexpr uint16_t kPort = 9110, kSrcPort = 40010;
constexpr auto kWarmup = 300ms;
constexpr auto kBurstLimit = 20s;

struct Burst {
  uint64_t sent = 0, received = 0, csum_errors = 0, rcvbuf_errors = 0;
  double seconds = 0;
  bool timed_out = false;
};

// One counted, paced burst of `count` datagrams over rx/tx.
Burst burst(int tx, int rx, int send_cpu, int recv_cpu, uint64_t count) {
  Burst b;
  uint64_t c0 = udp_counter("InCsumErrors"), e0 = udp_counter("RcvbufErrors");
  auto t0 = std::chrono::steady_clock::now();
  Blast blast(tx, rx, send_cpu, recv_cpu, count);
  while (!blast.done() && std::chrono::steady_clock::now() - t0 < kBurstLimit) std::this_thread::sleep_for(5ms);
  b.timed_out = !blast.done();
  // Stragglers: up to 500 ms for the last ones to arrive.
  for (int i = 0; i < 100 && blast.received() < blast.sent(); i++) std::this_thread::sleep_for(5ms);
  blast.stop();
  b.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  b.sent = blast.sent();
  b.received = blast.received();
  b.csum_errors = udp_counter("InCsumErrors") - c0;
  b.rcvbuf_errors = udp_counter("RcvbufErrors") - e0;
  return b;
}

// Delivered packets per second of one flat-out blast of `seconds`.
double blast_pps(int tx, int rx, int send_cpu, int recv_cpu, double seconds) {
  Blast blast(tx, rx, send_cpu, recv_cpu);
  std::this_thread::sleep_for(kWarmup);
  uint64_t r0 = blast.received();
  auto t0 = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  uint64_t r1 = blast.received();
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  blast.stop();
  return static_cast<double>(r1 - r0) / secs;
}

}  // namespace

int run_xdp_veth(const Env& env, json& out) {
  VethNet net;
  if (int r = net.create(4, /*default_offloads=*/true)) return r;
  std::string offload;
  run_cmd("ip netns exec " + net.ns + " ethtool -k " + net.peer_if + " | sed -n 's/^tx-checksumming: //p'", &offload);
  while (!offload.empty() && offload.back() == '\n') offload.pop_back();
  std::vector<int> cpus = all_cpus();
  int send_cpu = 0, recv_cpu = cpus.back();
  UniqueFd rx, tx;
  if (int r = udp_flow(net, kPort, kSrcPort, rx, tx)) return r;

  Deployed deployed;
  int id = -1;
  std::string rr_path = env.policy_dir + "/round_robin.c";
  struct Case {
    const char* name;
    std::function<int()> setup, teardown;
  };
  std::vector<Case> cases = {
      {"none", [] { return 0; }, [] { return 0; }},
      {"syr_rr",
       [&] {
         id = deployed.deploy(rr_path, "xdp-veth-rr", net.host_if, kPort, cpus);
         return id < 0 ? id : 0;
       },
       [&] {
         int r = deployed.remove(id);
         id = -1;
         return r;
       }},
  };
  auto in_case = [&](Case& c, const std::function<void()>& fn) {
    if (uint32_t p = attached_prog(net.host_ifindex)) {
      std::fprintf(stderr, "syrup_bench: %s still has XDP program %u before case %s\n", net.host_if.c_str(), p, c.name);
      return -EBUSY;
    }
    if (int r = c.setup()) return r;
    fn();
    if (int r = c.teardown()) {
      std::fprintf(stderr, "syrup_bench: ending case %s failed: %s\n", c.name, std::strerror(-r));
      return r;
    }
    return 0;
  };
  // Compiles the policy once (not measured).
  if (int r = cases[1].setup(); r || (r = cases[1].teardown())) return r;

  std::printf("\n== XDP steering to cores on a veth at its default offloads (peer tx-checksumming: %s) ==\n"
              "one UDP flow of 16-byte datagrams from namespace %s (core %d) to %s:%u (core %d); syr_rr: "
              "Syrup's round_robin to cores",
              offload.c_str(), net.ns.c_str(), send_cpu, net.host_ip.c_str(), kPort, recv_cpu);
  for (int c : cpus) std::printf(" %d", c);
  std::printf(".\n\nDelivered: %llu datagrams, paced (at most 1024 in flight)\n%-8s %9s %9s %10s %12s %12s %8s\n",
              static_cast<unsigned long long>(env.veth_datagrams), "case", "sent", "received", "delivered",
              "csum errors", "rcvbuf drops", "seconds");
  json jb = json::object();
  for (auto& c : cases) {
    Burst b;
    if (int r = in_case(c, [&] { b = burst(tx.get(), rx.get(), send_cpu, recv_cpu, env.veth_datagrams); })) return r;
    double ratio = b.sent ? static_cast<double>(b.received) / static_cast<double>(b.sent) : 0;
    std::printf("%-8s %9llu %9llu %10.4f %12llu %12llu %8.2f%s\n", c.name, static_cast<unsigned long long>(b.sent),
                static_cast<unsigned long long>(b.received), ratio, static_cast<unsigned long long>(b.csum_errors),
                static_cast<unsigned long long>(b.rcvbuf_errors), b.seconds, b.timed_out ? " (stopped at the limit)" : "");
    jb[c.name] = {{"sent", b.sent},         {"received", b.received},         {"delivered_over_sent", ratio},
                  {"csum_errors", b.csum_errors}, {"rcvbuf_errors", b.rcvbuf_errors}, {"seconds", b.seconds},
                  {"timed_out", b.timed_out}};
  }

  std::printf("\nPackets per second, flat out (%.1f s per case after %lld ms warm-up, %u rounds), delivered kpps:\n"
              "%-6s %9s %9s %9s\n",
              env.pps_seconds, static_cast<long long>(kWarmup.count()), env.pps_rounds, "round", "none", "syr_rr",
              "ratio");
  std::map<std::string, std::vector<double>> pps;
  std::vector<double> ratio;
  for (uint32_t round = 0; round < env.pps_rounds; round++) {
    for (size_t k = 0; k < cases.size(); k++) {
      Case& c = cases[(k + round) % cases.size()];
      double v = 0;
      if (int r = in_case(c, [&] { v = blast_pps(tx.get(), rx.get(), send_cpu, recv_cpu, env.pps_seconds); })) return r;
      pps[c.name].push_back(v);
    }
    ratio.push_back(pps["none"].back() > 0 ? pps["syr_rr"].back() / pps["none"].back() : 0);
    std::printf("%-6u %9.1f %9.1f %8.3fx\n", round + 1, pps["none"].back() / 1e3, pps["syr_rr"].back() / 1e3,
                ratio.back());
    std::fflush(stdout);
  }
  std::printf("%-6s %9.1f %9.1f %8.3fx\n", "median", median(pps["none"]) / 1e3, median(pps["syr_rr"]) / 1e3,
              median(ratio));
  out = {{"interface", net.host_if},
         {"peer_tx_checksumming", offload},
         {"datagrams", env.veth_datagrams},
         {"delivered", jb},
         {"pps",
          {{"seconds_per_case", env.pps_seconds},
           {"rounds", env.pps_rounds},
           {"none_per_round", pps["none"]},
           {"syr_rr_per_round", pps["syr_rr"]},
           {"median_none", median(pps["none"])},
           {"median_syr_rr", median(pps["syr_rr"])},
           {"syr_rr_over_none", {{"median", median(ratio)}, {"per_round", ratio}}}}}};
  return 0;
}

}  // namespace syrup_bench
