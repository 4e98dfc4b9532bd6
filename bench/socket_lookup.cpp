// Benchmark: the decision cost at the socket-lookup hook, Syrup's wrapper around
// policies/round_robin.c beside a hand-written sk_lookup round robin
// (handwritten_sk_lookup.bpf.c) steering to the same four listeners.
//
// Method: BPF_PROG_TEST_RUN on each program with the same struct bpf_sk_lookup context
// (a TCP SYN for 127.0.0.1:kLo from 127.0.0.1:40000), --xdp_repeat runs per measurement,
// the kernel's own per-run average (duration). Each round measures both programs, in
// alternating order, so drift on a noisy machine hits both alike; the report is the
// median per program, the ratio of the medians and the median, minimum and maximum of
// the per-round ratios (the spread of the method). The hand-written program is measured
// as root loads it and as syrupd loads a policy (CAP_BPF + CAP_NET_ADMIN: the verifier's
// Spectre mitigations then apply), and with Syrup's per-executor counter added. Both programs must assign a socket
// in every run (the context's cookie comes back set), or the numbers compare nothing.
// Everything runs in a network namespace of the benchmark's own: the policy's link and
// listeners steer nothing of the host's.
#include <arpa/inet.h>
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <fcntl.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <linux/capability.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <syrup/syrup.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "bpf_rodata.h"
#include "harness.h"

namespace syrup_bench {
namespace {

using nlohmann::json;

constexpr int kListeners = 4;
constexpr uint16_t kLo = 20000, kHi = 20099, kFirstListener = 20100;
constexpr double kTargetRatio = 1.1;

// The calling thread into a new network namespace with loopback up. 0 or -errno.
int own_netns() {
  if (unshare(CLONE_NEWNET)) return -errno;
  UniqueFd s(socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  ifreq ifr{};
  std::strcpy(ifr.ifr_name, "lo");
  ifr.ifr_flags = IFF_UP | IFF_LOOPBACK | IFF_RUNNING;
  return ioctl(s.get(), SIOCSIFFLAGS, &ifr) ? -errno : 0;
}

int listeners(std::vector<UniqueFd>& out) {
  for (int i = 0; i < kListeners; i++) {
    UniqueFd fd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(kFirstListener + i));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (!fd || bind(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) || listen(fd.get(), 16)) return -errno;
    out.push_back(std::move(fd));
  }
  return 0;
}

// The hand-written program, loaded with its constants and its SOCKMAP filled; with
// `lowered`, verified with the capabilities syrupd gives a policy.
struct Handwritten {
  bpf_object* obj = nullptr;
  ~Handwritten() { bpf_object__close(obj); }
  int load(const std::string& path, const std::vector<UniqueFd>& socks, bool lowered) {
    obj = bpf_object__open_file(path.c_str(), nullptr);
    if (!obj) return -errno;
    for (auto [name, v] : {std::pair{"num_socks", uint64_t{kListeners}}, {"protocol", uint64_t{IPPROTO_TCP}},
                           {"port_lo", uint64_t{kLo}}, {"port_hi", uint64_t{kHi}}})
      if (int r = syrup::set_rodata(obj, name, v)) return r;
    if (lowered) {
      AsSyrupLoads caps;
      if (!caps.ok()) return -EPERM;
      if (int r = bpf_object__load(obj)) return r;
    } else if (int r = bpf_object__load(obj)) {
      return r;
    }
    int map = bpf_object__find_map_fd_by_name(obj, "socks");
    for (uint32_t i = 0; i < socks.size(); i++) {
      uint64_t fd = static_cast<uint64_t>(socks[i].get());
      if (bpf_map_update_elem(map, &i, &fd, BPF_ANY)) return -errno;
    }
    return 0;
  }
  int prog_fd(const char* name = "handwritten_sk_lookup") const {
    return bpf_program__fd(bpf_object__find_program_by_name(obj, name));
  }
};

// One measurement: the kernel's average ns per run over `repeat` runs. -errno, or
// -ENOENT if a run assigned no socket.
int measure(int prog_fd, uint32_t repeat, double& ns) {
  bpf_sk_lookup ctx{};
  ctx.family = AF_INET;
  ctx.protocol = IPPROTO_TCP;
  ctx.remote_ip4 = htonl(INADDR_LOOPBACK);
  ctx.local_ip4 = htonl(INADDR_LOOPBACK);
  ctx.remote_port = htons(40000);
  ctx.local_port = kLo;
  bpf_sk_lookup back{};
  LIBBPF_OPTS(bpf_test_run_opts, o, .ctx_in = &ctx, .ctx_out = &back, .ctx_size_in = sizeof ctx,
              .ctx_size_out = sizeof back, .repeat = static_cast<int>(repeat));
  if (bpf_prog_test_run_opts(prog_fd, &o)) return -errno;
  if (o.retval != SK_PASS || back.cookie == 0) return -ENOENT;
  ns = o.duration;
  return 0;
}

struct Sample {
  std::vector<double> syrup, hand, hand_low, counted, ratio, ratio_low, ratio_counted;
};

int run_in_netns(const Env& env, Sample& s) {
  if (int r = own_netns()) {
    std::fprintf(stderr, "syrup_bench: socket-lookup: cannot make a network namespace: %s\n", std::strerror(-r));
    return r;
  }
  std::vector<UniqueFd> socks;
  if (int r = listeners(socks)) return r;
  std::vector<int> fds;
  for (auto& f : socks) fds.push_back(f.get());
  syr_deploy_opts o{};
  o.sz = sizeof o;
  o.app = env.app.c_str();
  o.fds = fds.data();
  o.n_fds = fds.size();
  o.protocol = "tcp";
  o.port = kLo;
  o.port_end = kHi;
  std::string path = env.policy_dir + "/round_robin.c";
  int id = syr_deploy_policy(path.c_str(), SYR_HOOK_SOCKET_LOOKUP, &o);
  if (id < 0) {
    std::fprintf(stderr, "syrup_bench: deploying %s at socket-lookup failed: %s\n", path.c_str(), syr_last_error());
    return id;
  }
  // The pin layout of syrupd (syrupd/pins.h): <root>/apps/<app>/policies/<id>/prog.
  UniqueFd prog(bpf_obj_get((env.bpffs_root + "/apps/" + env.app + "/policies/" + std::to_string(id) + "/prog").c_str()));
  Handwritten hw, low;
  int r = prog ? hw.load(env.handwritten_sk_lookup_obj, socks, false) : -errno;
  if (!r) r = low.load(env.handwritten_sk_lookup_obj, socks, true);
  for (uint32_t round = 0; !r && round < env.xdp_rounds; round++) {
    double a = 0, b = 0, c = 0, d = 0;
    int counted = low.prog_fd("handwritten_sk_lookup_counted");
    r = round % 2 ? measure(hw.prog_fd(), env.xdp_repeat, b) ?: measure(low.prog_fd(), env.xdp_repeat, c)
                        ?: measure(counted, env.xdp_repeat, d) ?: measure(prog.get(), env.xdp_repeat, a)
                  : measure(prog.get(), env.xdp_repeat, a) ?: measure(counted, env.xdp_repeat, d)
                        ?: measure(low.prog_fd(), env.xdp_repeat, c) ?: measure(hw.prog_fd(), env.xdp_repeat, b);
    if (r) break;
    s.counted.push_back(d);
    s.ratio_counted.push_back(d > 0 ? a / d : 0);
    s.syrup.push_back(a);
    s.hand.push_back(b);
    s.hand_low.push_back(c);
    s.ratio.push_back(b > 0 ? a / b : 0);
    s.ratio_low.push_back(c > 0 ? a / c : 0);
  }
  if (r) std::fprintf(stderr, "syrup_bench: socket-lookup: measuring failed: %s\n", std::strerror(-r));
  syr_remove_policy(id);
  return r;
}

}  // namespace

int run_socket_lookup(const Env& env, json& out) {
  Sample s;
  int r = 0;
  // In a thread of its own: the namespace goes with it.
  std::thread t([&] { r = run_in_netns(env, s); });
  t.join();
  if (r) return r;
  double ms = median(s.syrup), mh = median(s.hand), ml = median(s.hand_low);
  auto spread = [](const std::vector<double>& v) {
    return json{{"median", median(v)}, {"min", percentile(v, 0)}, {"max", percentile(v, 100)}};
  };
  json root = spread(s.ratio), low = spread(s.ratio_low), counted = spread(s.ratio_counted);
  double mc = median(s.counted);
  std::printf("\n== Socket-lookup decision cost (BPF_PROG_TEST_RUN, %u runs x %u rounds) ==\n", env.xdp_repeat,
              env.xdp_rounds);
  std::printf("%-44s %8s %28s\n", "program", "ns/run", "syrup/it per round (min-max)");
  std::printf("%-44s %8.2f\n", "syrup wrapper + round_robin", ms);
  std::printf("%-44s %8.2f %10.3f (%.3f-%.3f)\n", "handwritten_sk_lookup, verified as syrupd does", ml,
              low["median"].get<double>(), low["min"].get<double>(), low["max"].get<double>());
  std::printf("%-44s %8.2f %10.3f (%.3f-%.3f)\n", "  + Syrup's per-executor counter", mc,
              counted["median"].get<double>(), counted["min"].get<double>(), counted["max"].get<double>());
  std::printf("%-44s %8.2f %10.3f (%.3f-%.3f)\n", "handwritten_sk_lookup, verified as root", mh,
              root["median"].get<double>(), root["min"].get<double>(), root["max"].get<double>());
  std::printf("\ntargets:\n");
  bool met = low["median"].get<double>() <= kTargetRatio;
  print_target("syrup/handwritten (same caps)", low["median"].get<double>(), "x", "<= 1.1x", met);
  print_target("syrup/handwritten+counter", counted["median"].get<double>(), "x", "<= 1.1x",
               counted["median"].get<double>() <= kTargetRatio);
  out = {{"method", "BPF_PROG_TEST_RUN sk_lookup ctx, kernel duration"},
         {"repeat", env.xdp_repeat},
         {"rounds", env.xdp_rounds},
         {"syrup_ns", ms},
         {"handwritten_same_caps_ns", ml},
         {"handwritten_root_ns", mh},
         {"handwritten_counted_ns", mc},
         {"ratio_same_caps", low},
         {"ratio_counted", counted},
         {"ratio_root", root},
         {"target_ratio", kTargetRatio},
         {"met", met}};
  return 0;
}

}  // namespace syrup_bench
