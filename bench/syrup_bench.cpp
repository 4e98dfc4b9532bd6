// syrup_bench: Syrup's benchmarks (see README.md).
//
//   syrup_bench [all|decision|hint|deploy|xdp|xdp-cost|xdp-scale|xdp-pps|xdp-veth|socket-lookup|recording|replay|test|config-swap|isolation|control-plane|live-upgrade] [--out PATH] [flags]
//
// Design: runs as root. It starts a private syrupd found next to its own executable
// (its own socket, bpffs root and cache under fresh temporary paths) and points libsyrup
// at it with SYRUP_SOCKET, turns on the kernel's BPF run-time statistics for the
// decision benchmark (BPF_ENABLE_STATS: off again when the process exits), runs the
// benchmarks asked for, each printing its table, and writes every result to --out as
// JSON. On any exit, including SIGINT/SIGTERM/SIGHUP (caught by a thread that waits for
// them), syrupd is stopped with SIGTERM and its directories are removed, and the veth
// pairs and network namespaces the XDP benchmarks made are deleted.
#include <gflags/gflags.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>

#include "cli.h"
#include "harness.h"

DEFINE_string(out, "bench/results/latest.json", "where to write the results as JSON");
DEFINE_uint32(datagrams, 200000, "decision: datagrams per measured run");
DEFINE_uint32(rounds, 5, "decision and hint: interleaved rounds (medians are reported)");
DEFINE_uint64(hints, 10000000, "hint: mmap'ed stores per round");
DEFINE_uint64(syscalls, 100000, "hint: bpf(BPF_MAP_UPDATE_ELEM) calls per round");
DEFINE_uint32(deploys, 20, "deploy: cold and warm deploys each");
DEFINE_string(state_dir, "",
              "directory of the private syrupd's state file, which it rewrites at every deploy and removal "
              "(default: its temporary directory under /tmp; e.g. /dev/shm for a tmpfs, like a usual /run)");
DEFINE_string(policies, SYRUP_BENCH_POLICY_DIR, "directory of the shipped policies");
DEFINE_uint32(xdp_repeat, 1000000, "xdp-cost, xdp-scale: BPF_PROG_TEST_RUN repeat per measurement");
DEFINE_uint32(xdp_rounds, 15, "xdp-cost, xdp-scale: interleaved rounds (medians are reported)");
DEFINE_uint32(xdp_apps, 1000, "xdp-scale: applications on the crowded interface (2..1024)");
DEFINE_double(pps_seconds, 1, "xdp-pps, xdp-veth: measured seconds per case");
DEFINE_uint32(pps_rounds, 7, "xdp-pps, xdp-veth: interleaved rounds (medians are reported)");
DEFINE_uint64(veth_datagrams, 100000, "xdp-veth: datagrams of the counted burst (delivered / sent)");
DEFINE_double(isolation_seconds, 10, "isolation: seconds of lists per case");
DEFINE_uint32(isolation_lists, 200, "isolation: lists per case");
DEFINE_uint32(config_tenants, 100, "config-swap: tenants of the --config file, one policy each");
DEFINE_uint32(config_rounds, 5, "config-swap: changes timed per case (medians are reported)");
DEFINE_uint32(cp_max, 10000, "control-plane: the most policies deployed (the curve's last point)");
DEFINE_uint32(cp_per_app, 10, "control-plane: policies per application");
DEFINE_uint32(lu_gap_us, 20, "live-upgrade: microseconds between two datagrams of the steady load");
DEFINE_uint32(lu_replaces, 10, "live-upgrade: replacements per hook");
DEFINE_uint32(cp_samples, 5, "control-plane: list and stats requests per point (medians are reported)");

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using namespace syrup_bench;

constexpr const char* kApp = "syrup_bench";

struct Benchmark {
  const char* name;
  int (*run)(const Env&, json&);
};
constexpr Benchmark kBenchmarks[] = {
    {"decision", run_decision},
    {"hint", run_hint},
    {"deploy", run_deploy},
    {"xdp-cost", run_xdp_cost},
    {"xdp-scale", run_xdp_scale},
    {"xdp-pps", run_xdp_pps},
    {"xdp-veth", run_xdp_veth},
    {"isolation", run_isolation},  // by name only: not part of "all"
    {"socket-lookup", run_socket_lookup},
    {"recording", run_recording},
    {"replay", run_replay},
    {"test", run_test},
    {"config-swap", run_config_swap},
    {"control-plane", run_control_plane},
    {"live-upgrade", run_live_upgrade},
};

std::mutex g_cleanup_mu;
PrivateDaemon g_daemon;

void cleanup() {
  std::lock_guard lk(g_cleanup_mu);
  g_daemon.stop();  // first: syrupd detaches its root programs while the interfaces exist
  remove_all_nets();
}

// Termination signals go to a thread that cleans up and exits, whatever main is doing.
void handle_termination_signals() {
  sigset_t set;
  sigemptyset(&set);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&set, sig);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  std::thread([set] {
    int sig = 0;
    sigwait(&set, &sig);
    set_terminating();
    std::fprintf(stderr, "\nsyrup_bench: %s: stopping syrupd and cleaning up\n", strsignal(sig));
    cleanup();
    std::fflush(stdout);  // the tables so far (a thread, not a handler: stdio is allowed)
    _exit(128 + sig);
  }).detach();
}

json machine() {
  utsname u{};
  uname(&u);
  double load[3] = {0, 0, 0};
  getloadavg(load, 3);
  for (double& l : load) l = std::round(l * 100) / 100;
  char when[32];
  time_t now = time(nullptr);
  strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
  return {{"kernel", u.release},
          {"cpus", sysconf(_SC_NPROCESSORS_ONLN)},
          {"loadavg_at_start", load},
          {"date", when}};
}

int write_json(const std::string& path, const json& j) {
  std::error_code ec;
  fs::path p(path);
  if (p.has_parent_path()) fs::create_directories(p.parent_path(), ec);
  std::ofstream out(path, std::ios::trunc);
  out << j.dump(2) << "\n";
  out.close();
  if (!out) {
    std::fprintf(stderr, "syrup_bench: cannot write %s\n", path.c_str());
    return -EIO;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  syrup::cli::parse_flags(&argc, &argv,
      "Syrup's benchmarks (bench/README.md).\n\n"
      "Usage: syrup_bench [all|decision|hint|deploy|xdp|xdp-cost|xdp-scale|xdp-pps|xdp-veth|socket-lookup|recording|replay|test|config-swap|control-plane|live-upgrade] [flags]\n\n"
      "  decision   ns/decision of each shipped policy at the socket-select hook, and of a\n"
      "             hand-written sk_reuseport round robin (kernel BPF statistics)\n"
      "  hint       mmap'ed hint store vs bpf(BPF_MAP_UPDATE_ELEM)\n"
      "  deploy     cold and warm deploy latency\n"
      "  xdp-cost   ns/packet of Syrup's XDP root + tail call + policy vs hand-written\n"
      "             standalone XDP programs (BPF_PROG_TEST_RUN)\n"
      "  xdp-scale  the same dispatch path with 1 and with --xdp_apps applications\n"
      "  xdp-pps    packets/s through a veth pair without XDP, hand-written, and Syrup\n"
      "  xdp-veth   Syrup steering to cores on a veth at its default offloads: delivered/sent\n"
      "             of --veth_datagrams, and packets/s beside the veth without XDP\n"
      "  xdp        the four XDP benchmarks\n"
      "  socket-lookup  ns/decision of Syrup's socket-lookup wrapper + round_robin vs a hand-written\n"
      "             sk_lookup round robin (BPF_PROG_TEST_RUN, --xdp_repeat x --xdp_rounds)\n"
      "  recording  ns/decision of round_robin without the recording capture, with it off and\n"
      "             with a recording running; inputs/s recorded (docs/recording.md)\n"
      "  replay     inputs/s of a replay through the JIT, batched beside one test run per input\n"
      "  test       seconds of syrupctl test over every shipped policy's cases, cold and warm\n"
      "  config-swap  a ConfigMap change replacing --config_tenants policies: ..data swap to\n"
      "             applied, with --config_watch and with SIGHUP (two private syrupds)\n"
      "  isolation  p99 of one user's list on an idle syrupd and while another user trickles\n"
      "             requests, has a policy verified for seconds, compiles a bomb, dumps a huge\n"
      "             map (not part of all)\n"
      "  control-plane  deploy, list, stats, restart after SIGKILL, syrupd's RSS and descriptors\n"
      "             at 10 .. --cp_max policies\n"
      "  live-upgrade  datagrams lost and the longest gap while a policy is replaced under load,\n"
      "             per hook (socket-select, socket-lookup, xdp)\n\n"
      "Runs as root; starts its own syrupd from the directory of this executable.");
  std::string what = argc > 1 ? argv[1] : "all";
  // "xdp": the four XDP benchmarks.
  auto selected = [&](const std::string& name) {
    return (what == "all" && name != "isolation") || what == name || (what == "xdp" && name.starts_with("xdp-"));
  };
  bool known = what == "all" || what == "xdp";
  for (auto& b : kBenchmarks) known |= what == b.name;
  if (argc > 2 || !known) {
    std::fprintf(stderr,
                 "syrup_bench: expected one of all, decision, hint, deploy, xdp, xdp-cost, xdp-scale, xdp-pps, xdp-veth, socket-lookup, recording, replay, test, config-swap, "
                 "isolation, control-plane, live-upgrade "
                 "(see --help)\n");
    return 2;
  }
  if (!FLAGS_datagrams || !FLAGS_rounds || !FLAGS_hints || !FLAGS_syscalls || !FLAGS_deploys ||
      !FLAGS_xdp_repeat || !FLAGS_xdp_rounds || !FLAGS_pps_rounds || !(FLAGS_pps_seconds > 0) || !FLAGS_veth_datagrams ||
      !FLAGS_config_tenants || !FLAGS_config_rounds) {
    std::fprintf(stderr,
                 "syrup_bench: --datagrams, --rounds, --hints, --syscalls, --deploys, --xdp_repeat, "
                 "--xdp_rounds, --pps_seconds, --pps_rounds, --veth_datagrams, --config_tenants and --config_rounds must be > 0\n");
    return 2;
  }
  if (FLAGS_xdp_apps < 2 || FLAGS_xdp_apps > 1024) {
    std::fprintf(stderr, "syrup_bench: --xdp_apps must be in 2..1024\n");
    return 2;
  }
  if (geteuid() != 0) {
    std::fprintf(stderr, "syrup_bench: run as root (it starts syrupd and reads BPF statistics)\n");
    return 1;
  }

  handle_termination_signals();
  // syrupd (started from here, so it inherits this) holds several descriptors per policy;
  // xdp-scale deploys ~1000 policies, more than the usual soft limit of 1024 allows, and
  // control-plane 10,000, one socket each in this process, more than a usual hard limit
  // of 20,000 allows for both (root may raise it).
  rlimit nofile{};
  if (getrlimit(RLIMIT_NOFILE, &nofile) == 0) {
    rlimit more{std::max<rlim_t>(nofile.rlim_max, 1 << 18), std::max<rlim_t>(nofile.rlim_max, 1 << 18)};
    nofile.rlim_cur = nofile.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &more) != 0) setrlimit(RLIMIT_NOFILE, &nofile);
  }
  std::error_code ec;
  fs::path exe_dir = fs::read_symlink("/proc/self/exe", ec).parent_path();
  if (ec) {
    std::fprintf(stderr, "syrup_bench: cannot resolve /proc/self/exe: %s\n", ec.message().c_str());
    return 1;
  }
  remove_stale_leftovers();
  if (g_daemon.start(exe_dir / "syrupd", FLAGS_state_dir)) return 1;
  setenv("SYRUP_SOCKET", g_daemon.socket().c_str(), 1);

  Env env;
  env.policy_dir = FLAGS_policies;
  env.syrupd = exe_dir / "syrupd";
  env.config_tenants = FLAGS_config_tenants;
  env.config_rounds = FLAGS_config_rounds;
  env.handwritten_obj = exe_dir / "handwritten_rr.bpf.o";
  env.bpffs_root = g_daemon.bpffs_root();
  env.app = kApp;
  env.datagrams = FLAGS_datagrams;
  env.rounds = FLAGS_rounds;
  env.hints = FLAGS_hints;
  env.syscalls = FLAGS_syscalls;
  env.deploys = FLAGS_deploys;
  env.handwritten_xdp_obj = exe_dir / "handwritten_xdp_rr.bpf.o";
  env.handwritten_sk_lookup_obj = exe_dir / "handwritten_sk_lookup.bpf.o";
  env.xdp_repeat = FLAGS_xdp_repeat;
  env.xdp_rounds = FLAGS_xdp_rounds;
  env.xdp_apps = FLAGS_xdp_apps;
  env.pps_seconds = FLAGS_pps_seconds;
  env.pps_rounds = FLAGS_pps_rounds;
  env.veth_datagrams = FLAGS_veth_datagrams;
  env.syrupctl = exe_dir / "syrupctl";
  env.isolation_seconds = FLAGS_isolation_seconds;
  env.isolation_lists = FLAGS_isolation_lists;
  env.cp_max = FLAGS_cp_max;
  env.cp_per_app = FLAGS_cp_per_app;
  env.cp_samples = FLAGS_cp_samples;
  env.daemon = &g_daemon;
  env.lu_gap_us = FLAGS_lu_gap_us;
  env.lu_replaces = FLAGS_lu_replaces;

  json report = {{"machine", machine()},
                 {"command", what},
                 {"config",
                  {{"datagrams", env.datagrams},
                   {"rounds", env.rounds},
                   {"hints", env.hints},
                   {"syscalls", env.syscalls},
                   {"deploys", env.deploys},
                   {"xdp_repeat", env.xdp_repeat},
                   {"xdp_rounds", env.xdp_rounds},
                   {"xdp_apps", env.xdp_apps},
                   {"pps_seconds", env.pps_seconds},
                   {"pps_rounds", env.pps_rounds},
                   {"veth_datagrams", env.veth_datagrams},
                   {"cp_max", env.cp_max},
                   {"policies", env.policy_dir}}}};
  std::printf("syrup_bench: kernel %s, %ld CPUs; private syrupd on %s\n",
              report["machine"]["kernel"].get<std::string>().c_str(), sysconf(_SC_NPROCESSORS_ONLN),
              g_daemon.socket().c_str());

  UniqueFd stats;
  int failed = 0;
  for (auto& b : kBenchmarks) {
    if (!selected(b.name)) continue;
    json part = json::object();
    bool kernel_stats = std::string(b.name) == "decision" || std::string(b.name) == "recording";
    int r = kernel_stats ? enable_bpf_stats(stats) : 0;
    if (!r) r = b.run(env, part);
    stats.reset();
    if (r) {
      std::fprintf(stderr, "syrup_bench: %s failed: %s\n", b.name, std::strerror(-r));
      part["error"] = std::strerror(-r);
      failed++;
    }
    report[b.name] = part;
  }
  cleanup();

  if (write_json(FLAGS_out, report)) return 1;
  std::printf("\nresults: %s\n", FLAGS_out.c_str());
  return failed ? 1 : 0;
}
