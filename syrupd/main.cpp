// syrupd: the Syrup daemon. Compiles, loads, attaches and keeps the scheduling policies
// applications deploy through libsyrup or syrupctl (see README.md and docs/).
#include <gflags/gflags.h>
#include <arpa/inet.h>
#include <grp.h>
#include <sys/stat.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <fstream>
#include <filesystem>
#include <string>

#include "cli.h"
#include "daemon.h"
#include "thread_agent.h"
#include "log.h"
#include "protocol.h"

DEFINE_string(socket, syrup::proto::kDefaultSocket, "Unix socket to serve the control protocol on");
DEFINE_string(bpffs_root, "/sys/fs/bpf/syrup", "bpffs directory for Syrup's pins (docs/pin-layout.md)");
DEFINE_string(clang, "/usr/bin/clang-19", "clang used to compile policies to BPF");
DEFINE_string(kernel_dir, "",
              "directory with include/syrup/policy.h and hooks/*.bpf.h (default: the source "
              "tree's kernel/ when run from a build tree, else the installed copy)");
DEFINE_string(cache_dir, "/var/cache/syrup", "where compiled policy objects are cached by content, and clang's version by its binary");
DEFINE_uint64(cache_max_bytes, 256ull << 20,
              "bound on the compiled objects kept under --cache_dir/obj, in bytes; over it the "
              "objects used least recently are removed (0: no bound)");
DEFINE_uint32(test_run_max_ms, 10000, "the longest a test run (syrupctl test, replay) runs on its worker, in ms (100 to 600000)");
DEFINE_uint32(load_timeout_s, 30,
              "a deploy whose policy the kernel has not verified and loaded within this many seconds is answered "
              "ETIMEDOUT (the load runs on a worker; it is undone when the kernel returns)");
DEFINE_uint64(record_max_bytes, 64ull << 20,
              "the size quota of one recording (syrupctl record/trace), in bytes; a recording that reaches "
              "it ends (docs/recording.md)");
DEFINE_uint32(record_max_seconds, 3600, "the longest a recording (syrupctl record/trace) runs, in seconds (1 to 86400)");
DEFINE_uint32(max_recordings, 16, "recordings running at once, over all users (each one per policy)");
DEFINE_uint32(compile_workers, 2,
              "threads compiling policies, and as many loading them; a deploy waiting for clang or "
              "the verifier holds up no other request (1 to 64)");
DEFINE_uint32(quota_compiles_per_uid, 1,
              "most compiles one user other than root may have running at once; more wait their turn, "
              "so one user cannot occupy every compile worker (0: no limit)");
DEFINE_uint32(compiler_uid, 65534,
              "uid (and gid) the policy compiler runs as, with no capabilities, in its sandbox "
              "(docs/security/compiler.md); not 0");
DEFINE_uint64(compile_memory_mb, 1024, "address space of one policy compile, in MiB (clang needs about 300)");
DEFINE_uint32(compile_cpu_seconds, 30,
              "CPU time of one policy compile, in seconds; a compile over it is stopped");
DEFINE_uint32(compile_timeout_s, 60,
              "wall-clock time of one policy compile, in seconds (1 to 3600); a compile over it is stopped. "
              "Raise it where the compiler's CPU is slow or shared (an emulated machine, a loaded host)");
DEFINE_bool(allow_unconfined_compiler, false,
            "start even when the policy compiler cannot be confined to the headers by Landlock (no "
            "Landlock, or --clang is a script): tenants' compiles can then read every file the "
            "--compiler_uid can. Off: syrupd refuses to start then");
DEFINE_string(log_level, "info", "debug, info, warn or error");
DEFINE_uint64(max_source_bytes, 1 << 20, "largest policy source accepted, in bytes");
DEFINE_string(state_file, "",
              "where syrupd records what it deployed, so a restarted syrupd adopts it without "
              "disturbing the data path (default: syrupd.state.json next to --socket)");
DEFINE_uint64(quota_policies, 32, "most policies per application (callers that are not admins)");
DEFINE_uint64(quota_maps, 64, "most maps per application");
DEFINE_uint64(quota_map_bytes, 64ull << 20, "most bytes of map keys and values per application");
DEFINE_uint64(quota_insns, 200000, "most BPF instructions over all of an application's programs");
DEFINE_uint32(quota_rps, 200, "most control requests per second per uid");
DEFINE_uint64(quota_uid_policies, 64, "most policies per uid, over all the applications it owns");
DEFINE_uint64(quota_uid_maps, 256, "most maps per uid, over all the applications it owns");
DEFINE_uint64(quota_uid_map_bytes, 256ull << 20,
              "most bytes of map keys and values per uid, over all the applications it owns");
DEFINE_uint64(quota_uid_insns, 1000000, "most BPF instructions per uid, over all the applications it owns");
DEFINE_uint64(max_clients, 128,
              "most open control connections of users other than root; more are answered EBUSY "
              "(root is never refused)");
DEFINE_uint64(max_clients_per_uid, 32,
              "most open control connections of one user other than root; more are answered EBUSY");
DEFINE_uint32(client_idle_timeout_s, 60,
              "close a control connection that sends no request for this many seconds (0: never)");
DEFINE_string(config, "", "YAML file of tenants and their policies, applied at start and on SIGHUP "
              "(docs/operations.md; check one with syrupctl validate)");
DEFINE_bool(config_watch, false,
            "also apply --config when the file changes: inotify on its directory, which sees a "
            "Kubernetes ConfigMap update (the kubelet's ..data symlink swap) and editors' "
            "replacements; a version with errors is refused as on SIGHUP");
DEFINE_string(status_file, "",
              "with --config: where syrupd writes, as JSON, what the running version of the file "
              "applied and what failed (default: status.json next to --socket; its directory "
              "must be root's and writable by root alone)");
DEFINE_uint32(metrics_port, 0, "serve Prometheus metrics (and /readyz) on --metrics_address:PORT (0: off)");
DEFINE_string(metrics_address, "127.0.0.1",
              "numeric IPv4 or IPv6 address the metrics endpoint listens on: 127.0.0.1 (the "
              "default) serves 127.0.0.1 and ::1; 0.0.0.0, :: or a pod's address serve a network, "
              "where every host that reaches it may scrape");
DEFINE_bool(metrics_per_tenant, false,
            "also serve the series labelled by application, policy and uid (any local user can "
            "scrape the endpoint, so they are off by default)");
DEFINE_string(admin_group, "", "members of this group may act for any process, as root does");
DEFINE_string(agent_cpus, "",
              "CPUs the thread hook's user-space agents run on, as a CPU list (0 or 0-1,4); keep them "
              "off the scheduled applications' cores so the agents' work does not take their time "
              "(default: wherever syrupd may run)");
DEFINE_string(on_exit, "keep",
              "on SIGINT/SIGTERM: 'keep' every policy running (thread agents and the sched_ext "
              "scheduler too) for the next syrupd to adopt, or 'remove' them all");

namespace {

// The headers policies compile against: the source tree's kernel/ when this syrupd is the
// build tree's (an edit there is used at once, no install needed), else the installed
// copy beside this binary (<prefix>/bin/syrupd -> <prefix>/share/syrup/kernel), else the
// configured install path. An installed syrupd never follows a source tree that happens
// to still exist on the machine.
std::string default_kernel_dir() {
  namespace fs = std::filesystem;
  auto has_headers = [](const fs::path& d) { return fs::exists(d / "include/syrup/policy.h"); };
  std::error_code ec;
  fs::path bin = fs::read_symlink("/proc/self/exe", ec).parent_path();
  if (ec) return SYRUP_INSTALL_KERNEL_DIR;
  if (fs::equivalent(bin, SYRUP_BUILD_BIN_DIR, ec) && has_headers(SYRUP_SOURCE_KERNEL_DIR))
    return SYRUP_SOURCE_KERNEL_DIR;
  fs::path beside = (bin / SYRUP_KERNEL_FROM_BINDIR).lexically_normal();
  return has_headers(beside) ? beside.string() : SYRUP_INSTALL_KERNEL_DIR;
}

// syrupd's start, in phases: each reads a group of flags into the DaemonConfig, in the
// order the flags are checked, and returns 0 or -EINVAL after saying on stderr which flag
// is wrong (syrupd then exits with 2). Nothing is made before Daemon::init(), so a phase
// has nothing to undo.

// Where syrupd listens and pins, what one request may carry, the quotas, who administers
// and what becomes of the policies on exit.
int access_from_flags(syrup::DaemonConfig& cfg) {
  cfg.socket_path = FLAGS_socket;
  cfg.bpffs_root = FLAGS_bpffs_root;
  if (FLAGS_max_source_bytes > syrup::proto::kMaxPayload) {
    std::fprintf(stderr, "syrupd: --max_source_bytes must be in 0..%u: a request frame carries at most 4 MiB\n",
                 syrup::proto::kMaxPayload);
    return -EINVAL;
  }
  cfg.max_source_bytes = FLAGS_max_source_bytes;
  cfg.quotas = {FLAGS_quota_policies,     FLAGS_quota_maps,     FLAGS_quota_map_bytes,     FLAGS_quota_insns,
                FLAGS_quota_rps,          FLAGS_quota_uid_policies, FLAGS_quota_uid_maps, FLAGS_quota_uid_map_bytes,
                FLAGS_quota_uid_insns};
  if (!FLAGS_admin_group.empty()) {
    struct group* g = getgrnam(FLAGS_admin_group.c_str());
    if (!g) {
      std::fprintf(stderr, "syrupd: --admin_group: no group '%s'\n", FLAGS_admin_group.c_str());
      return -EINVAL;
    }
    cfg.admin_gids.push_back(g->gr_gid);
  }
  if (FLAGS_on_exit != "keep" && FLAGS_on_exit != "remove") {
    std::fprintf(stderr, "syrupd: --on_exit must be keep or remove\n");
    return -EINVAL;
  }
  cfg.remove_on_exit = FLAGS_on_exit == "remove";
  return 0;
}

// The CPUs the thread agent runs on: a CPU list of online CPUs.
int agent_cpus_from_flags(syrup::DaemonConfig& cfg) {
  if (FLAGS_agent_cpus.empty()) return 0;
  if (syrup::thread::cpus_from_string(FLAGS_agent_cpus, cfg.agent_cpus)) {
    std::fprintf(stderr, "syrupd: --agent_cpus: '%s' is not a CPU list (e.g. 0 or 0-1,4)\n", FLAGS_agent_cpus.c_str());
    return -EINVAL;
  }
  std::vector<int> online;
  std::ifstream f("/sys/devices/system/cpu/online");
  std::string line;
  std::getline(f, line);
  if (syrup::thread::cpus_from_string(line, online) == 0)
    for (int c : cfg.agent_cpus)
      if (!std::binary_search(online.begin(), online.end(), c)) {
        std::fprintf(stderr, "syrupd: --agent_cpus: CPU %d is not online (online: %s)\n", c, line.c_str());
        return -EINVAL;
      }
  return 0;
}

// The config file, the clients' bounds and the compile workers' bounds.
int clients_from_flags(syrup::DaemonConfig& cfg) {
  cfg.config_path = FLAGS_config;
  if (FLAGS_config_watch && FLAGS_config.empty()) {
    std::fprintf(stderr, "syrupd: --config_watch needs --config (the file to watch)\n");
    return -EINVAL;
  }
  cfg.config_watch = FLAGS_config_watch;
  cfg.status_file = FLAGS_status_file.empty()
                        ? (std::filesystem::path(FLAGS_socket).parent_path() / "status.json").string()
                        : FLAGS_status_file;
  if (FLAGS_max_clients == 0) {
    std::fprintf(stderr, "syrupd: --max_clients must be at least 1\n");
    return -EINVAL;
  }
  if (FLAGS_max_clients_per_uid == 0) {
    std::fprintf(stderr, "syrupd: --max_clients_per_uid must be at least 1\n");
    return -EINVAL;
  }
  cfg.max_clients = FLAGS_max_clients;
  cfg.max_clients_per_uid = FLAGS_max_clients_per_uid;
  cfg.client_idle_timeout_s = FLAGS_client_idle_timeout_s;
  if (FLAGS_compile_workers < 1 || FLAGS_compile_workers > 64) {
    std::fprintf(stderr, "syrupd: --compile_workers must be 1 to 64\n");
    return -EINVAL;
  }
  cfg.compile_workers = FLAGS_compile_workers;
  cfg.compiles_per_uid = FLAGS_quota_compiles_per_uid;
  return 0;
}

// The compiler's sandbox and bounds, the load timeout, the metrics endpoint and the
// state file.
int compiler_from_flags(syrup::DaemonConfig& cfg) {
  if (FLAGS_compiler_uid == 0) {
    std::fprintf(stderr, "syrupd: --compiler_uid must not be 0: the compiler runs without root's rights\n");
    return -EINVAL;
  }
  if (FLAGS_compile_memory_mb < 64 || FLAGS_compile_memory_mb > (1u << 20)) {
    std::fprintf(stderr, "syrupd: --compile_memory_mb must be 64 to 1048576\n");
    return -EINVAL;
  }
  if (FLAGS_compile_cpu_seconds < 1 || FLAGS_compile_cpu_seconds > 3600) {
    std::fprintf(stderr, "syrupd: --compile_cpu_seconds must be 1 to 3600\n");
    return -EINVAL;
  }
  if (FLAGS_compile_timeout_s < 1 || FLAGS_compile_timeout_s > 3600) {
    std::fprintf(stderr, "syrupd: --compile_timeout_s must be 1 to 3600\n");
    return -EINVAL;
  }
  if (FLAGS_load_timeout_s < 1) {
    std::fprintf(stderr, "syrupd: --load_timeout_s must be at least 1\n");
    return -EINVAL;
  }
  cfg.load_timeout_s = FLAGS_load_timeout_s;
  if (FLAGS_test_run_max_ms < 100 || FLAGS_test_run_max_ms > 600000) {
    std::fprintf(stderr, "syrupd: --test_run_max_ms must be 100 to 600000\n");
    return -EINVAL;
  }
  cfg.test_run_max_ms = FLAGS_test_run_max_ms;
  if (FLAGS_record_max_seconds < 1 || FLAGS_record_max_seconds > 86400 || FLAGS_record_max_bytes < 4096) {
    std::fprintf(stderr, "syrupd: --record_max_seconds must be 1 to 86400 and --record_max_bytes at least 4096\n");
    return -EINVAL;
  }
  cfg.record = {FLAGS_record_max_bytes, FLAGS_record_max_seconds, FLAGS_max_recordings};
  if (FLAGS_metrics_port > 65535) {
    std::fprintf(stderr, "syrupd: --metrics_port must be at most 65535\n");
    return -EINVAL;
  }
  cfg.metrics_port = static_cast<uint16_t>(FLAGS_metrics_port);
  in6_addr a6;
  in_addr a4;
  if (inet_pton(AF_INET, FLAGS_metrics_address.c_str(), &a4) != 1 &&
      inet_pton(AF_INET6, FLAGS_metrics_address.c_str(), &a6) != 1) {
    std::fprintf(stderr,
                 "syrupd: --metrics_address must be a numeric IPv4 or IPv6 address (e.g. 127.0.0.1, 0.0.0.0, ::), "
                 "not '%s'\n",
                 FLAGS_metrics_address.c_str());
    return -EINVAL;
  }
  cfg.metrics_address = FLAGS_metrics_address;
  cfg.metrics_per_tenant = FLAGS_metrics_per_tenant;
  cfg.state_file = FLAGS_state_file.empty()
                       ? (std::filesystem::path(FLAGS_socket).parent_path() / "syrupd.state.json").string()
                       : FLAGS_state_file;
  cfg.compiler.clang = FLAGS_clang;
  cfg.compiler.kernel_dir = FLAGS_kernel_dir.empty() ? default_kernel_dir() : FLAGS_kernel_dir;
  cfg.compiler.cache_dir = FLAGS_cache_dir;
  cfg.compiler.cache_max_bytes = FLAGS_cache_max_bytes;
  cfg.compiler.multiarch_include = SYRUP_MULTIARCH_INCLUDE;
  cfg.compiler.uid = FLAGS_compiler_uid;
  cfg.compiler.memory_bytes = FLAGS_compile_memory_mb << 20;
  cfg.compiler.cpu_seconds = FLAGS_compile_cpu_seconds;
  cfg.compiler.timeout_ms = static_cast<int>(FLAGS_compile_timeout_s) * 1000;
  cfg.compiler.allow_unconfined = FLAGS_allow_unconfined_compiler;
  return 0;
}

// systemd (Type=notify): ready once adoption and the config are done, so units ordered
// after syrupd find their policies in place. Without NOTIFY_SOCKET these do nothing.
// The notify socket stays in the environment for STOPPING=1; processes syrupd starts
// inherit it, but systemd's default NotifyAccess=main takes messages from syrupd only.
void notify_systemd(syrup::DaemonConfig& cfg) {
  cfg.on_ready = [](size_t policies) {
    sd_notifyf(0, "READY=1\nSTATUS=serving; %zu policies at start", policies);
  };
  cfg.on_stopping = [] { sd_notify(0, "STOPPING=1\nSTATUS=shutting down"); };
}

}  // namespace

int main(int argc, char** argv) {
  syrup::cli::parse_flags(&argc, &argv,
      "the Syrup daemon: deploys user-defined scheduling policies.\n\n"
      "Usage: syrupd [--socket PATH] [--bpffs_root DIR] [--clang PATH] [--log_level LEVEL]\n\n"
      "Runs as root in the foreground; logs to stderr. On SIGINT/SIGTERM it exits and, by\n"
      "default, leaves every policy running: the next syrupd adopts them (--on_exit).\n"
      "Talk to it with syrupctl or libsyrup.");
  if (argc > 1) {
    std::fprintf(stderr, "syrupd: unexpected argument '%s' (see --help)\n", argv[1]);
    return 2;
  }
  // Every file syrupd writes (state file, compile cache, pins' directories) is its own:
  // created without group or other bits, whatever umask it was started with.
  umask(077);
  syrup::LogLevel level;
  if (!syrup::parse_log_level(FLAGS_log_level, level)) {
    std::fprintf(stderr, "syrupd: --log_level must be debug, info, warn or error\n");
    return 2;
  }
  syrup::set_log_level(level);

  syrup::DaemonConfig cfg;
  if (access_from_flags(cfg) || agent_cpus_from_flags(cfg) || clients_from_flags(cfg) ||
      compiler_from_flags(cfg))
    return 2;
  notify_systemd(cfg);

  syrup::Daemon d;
  if (int r = d.init(cfg); r) return 1;
  return d.run();
}
