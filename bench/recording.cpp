// Benchmark: what recording (`syrupctl record`, docs/recording.md) costs a decision at
// the socket-select hook, and how many inputs per second it records.
//
// One policy (round_robin) as three programs, each on a fresh group of kSockets UDP
// sockets, measured as decision.cpp measures (delta run_time_ns / delta run_cnt of the
// program over env.datagrams datagrams, after a warm-up):
//  - "without": the wrapper without the capture, compiled by a second private syrupd
//    whose --kernel_dir is a copy of kernel/ with a recording.bpf.h that captures nothing;
//  - "off": the wrapper as shipped, no recording running;
//  - "on": the same while a recording of every input (snap 64) runs and a thread reads it.
// Rounds interleave the three (order rotating), so drift hits them alike; reported are
// the medians, off/without as the median of per-round ratios (target <= 1.02x) and on -
// off (target < 50 ns). Then env.datagrams are sent as fast as one sender goes while a
// recording runs: the inputs per second recorded and what the trailer says was lost.
#include <bpf/bpf.h>
#include <fcntl.h>
#include <poll.h>
#include <syrup/recording.h>
#include <syrup/syrup.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "client.h"
#include "harness.h"

namespace syrup_bench {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr size_t kSockets = 4;
constexpr uint32_t kWarmup = 2000;
constexpr double kTargetOffRatio = 1.02, kTargetAddedNs = 50;

// recording.bpf.h for the "without" build: the wrapper's calls compile to nothing.
constexpr const char* kNoCapture =
    "#ifndef SYRUP_HOOK_RECORDING_H\n#define SYRUP_HOOK_RECORDING_H\n"
    "#define syr_rec_input(in, decision, slot) ((void)0)\n#endif\n";

// A recording of policy `id` streamed into a thread that counts its bytes and keeps the
// trailer; stop() ends it (record_stop) and waits for the end of the stream.
class LiveRecording {
 public:
  int start(const std::string& socket, int id) {
    syrup::Client c;
    syrup::Message resp;
    if (c.connect(socket) || c.call({{"op", "record"}, {"id", id}, {"snap", 64}}, resp)) return -ECONNREFUSED;
    if (!resp.body.value("ok", false) || resp.fds.size() != 1) {
      std::fprintf(stderr, "syrup_bench: record refused: %s\n", resp.body.dump().c_str());
      return -EIO;
    }
    socket_ = socket;
    id_ = id;
    pipe_ = std::move(resp.fds[0]);
    reader_ = std::thread([this] { read_all(); });
    return 0;
  }
  // The trailer's counts: recorded, lost (buffer full, unread).
  std::pair<uint64_t, uint64_t> stop() {
    syrup::Client c;
    syrup::Message resp;
    if (!c.connect(socket_)) c.call({{"op", "record_stop"}, {"id", id_}}, resp);
    if (reader_.joinable()) reader_.join();
    return {trailer_.trailer.recorded, trailer_.trailer.not_recorded_full + trailer_.trailer.not_recorded_quota};
  }
  ~LiveRecording() {
    if (reader_.joinable()) stop();
  }

 private:
  void read_all() {
    std::string tail;
    char buf[1 << 16];
    for (ssize_t n; (n = read(pipe_.get(), buf, sizeof buf)) > 0;) {
      tail.append(buf, static_cast<size_t>(n));
      if (tail.size() > 4096) tail.erase(0, tail.size() - 4096);
    }
    if (tail.size() >= sizeof trailer_) std::memcpy(&trailer_, tail.data() + tail.size() - sizeof trailer_, sizeof trailer_);
  }
  std::string socket_;
  int id_ = 0;
  syrup::UniqueFd pipe_;
  std::thread reader_;
  syr_rec_record trailer_{};
};

struct Variant {
  std::string name, socket, bpffs_root;
  bool record = false;
};

// Deploys round_robin on a fresh group through `v`'s syrupd and measures it. 0 or -errno.
int run_once(const Env& env, const Variant& v, double& ns) {
  UdpGroup group;
  if (int r = group.open(kSockets)) return r;
  setenv("SYRUP_SOCKET", v.socket.c_str(), 1);
  syr_deploy_opts opts = group.deploy_opts(env.app);
  std::string path = env.policy_dir + "/round_robin.c";
  int id = syr_deploy_policy(path.c_str(), SYR_HOOK_SOCKET_SELECT, &opts);
  if (id < 0) {
    std::fprintf(stderr, "syrup_bench: deploying %s (%s) failed: %s\n", path.c_str(), v.name.c_str(), syr_last_error());
    return id;
  }
  std::string pin = v.bpffs_root + "/apps/" + env.app + "/policies/" + std::to_string(id) + "/prog";
  UniqueFd prog(bpf_obj_get(pin.c_str()));
  int r = prog ? 0 : -errno;
  LiveRecording rec;
  if (!r && v.record) r = rec.start(v.socket, id);
  ProgStats before, after;
  if (!r && !(r = group.send(kWarmup)) && !(r = prog_stats(prog.get(), before)) && !(r = group.send(env.datagrams)))
    r = prog_stats(prog.get(), after);
  if (v.record) rec.stop();
  syr_remove_policy(id);
  if (r) return r;
  ns = after.run_cnt > before.run_cnt ? static_cast<double>(after.run_time_ns - before.run_time_ns) /
                                            static_cast<double>(after.run_cnt - before.run_cnt)
                                      : 0;
  return ns > 0 ? 0 : -ENODATA;
}

// env.datagrams as fast as one sender goes while a recording runs: inputs/s recorded.
int throughput(const Env& env, const Variant& v, json& out) {
  UdpGroup group;
  if (int r = group.open(kSockets)) return r;
  setenv("SYRUP_SOCKET", v.socket.c_str(), 1);
  syr_deploy_opts opts = group.deploy_opts(env.app);
  std::string path = env.policy_dir + "/round_robin.c";
  int id = syr_deploy_policy(path.c_str(), SYR_HOOK_SOCKET_SELECT, &opts);
  if (id < 0) return id;
  LiveRecording rec;
  int r = rec.start(v.socket, id);
  auto t0 = std::chrono::steady_clock::now();
  if (!r) r = group.send(env.datagrams);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  auto [recorded, lost] = rec.stop();
  syr_remove_policy(id);
  if (r) return r;
  double rate = static_cast<double>(recorded) / secs;
  std::printf("\nrecording every input of one sender's %u datagrams: %.0f inputs/s recorded, %llu lost\n",
              env.datagrams, rate, static_cast<unsigned long long>(lost));
  out = {{"datagrams", env.datagrams}, {"recorded", recorded}, {"lost", lost}, {"seconds", secs},
         {"inputs_per_second", rate}};
  return 0;
}

// A copy of kernel/ whose recording.bpf.h captures nothing, under `dir`.
int kernel_without_capture(const Env& env, const std::string& dir, std::string& kernel_dir) {
  std::error_code ec;
  fs::path src = fs::path(env.policy_dir).parent_path() / "kernel";
  kernel_dir = dir + "/kernel";
  fs::copy(src, kernel_dir, fs::copy_options::recursive, ec);
  std::ofstream(kernel_dir + "/hooks/recording.bpf.h", std::ios::trunc) << kNoCapture;
  if (ec || !fs::exists(kernel_dir + "/include/syrup/policy.h")) {
    std::fprintf(stderr, "syrup_bench: cannot copy %s: %s\n", src.c_str(), ec.message().c_str());
    return -EIO;
  }
  return 0;
}

}  // namespace

int run_recording(const Env& env, json& out) {
  char tmpl[] = "/tmp/syrup-bench-rec-XXXXXX";
  if (!mkdtemp(tmpl)) return -errno;
  std::string dir = tmpl, kernel_dir;
  PrivateDaemon bare;
  int r = kernel_without_capture(env, dir, kernel_dir);
  if (!r) r = bare.start(fs::path(env.syrupctl).parent_path() / "syrupd", "", {"--kernel_dir", kernel_dir}, "-norec");
  std::string shipped = std::getenv("SYRUP_SOCKET") ? std::getenv("SYRUP_SOCKET") : "";
  std::vector<Variant> variants = {{"without", bare.socket(), bare.bpffs_root(), false},
                                   {"off", shipped, env.bpffs_root, false},
                                   {"on", shipped, env.bpffs_root, true}};
  std::printf("\n== Recording at the socket-select hook (round_robin) ==\n%zu sockets, %u datagrams per run, "
              "%u rounds; ns/decision from the kernel's BPF statistics.\n\n%-7s %9s %9s %9s %9s %9s\n",
              kSockets, env.datagrams, env.rounds, "round", "without", "off", "on", "off/w", "on-off");
  std::map<std::string, std::vector<double>> ns;
  std::vector<double> ratios, added;
  for (uint32_t round = 0; !r && round < env.rounds; round++) {
    std::map<std::string, double> got;
    for (size_t k = 0; !r && k < variants.size(); k++) {
      const Variant& v = variants[(k + round) % variants.size()];
      r = run_once(env, v, got[v.name]);
    }
    if (r) break;
    for (auto& [n, x] : got) ns[n].push_back(x);
    ratios.push_back(got["off"] / got["without"]);
    added.push_back(got["on"] - got["off"]);
    std::printf("%-7u %9.1f %9.1f %9.1f %8.3fx %9.1f\n", round + 1, got["without"], got["off"], got["on"],
                ratios.back(), added.back());
    std::fflush(stdout);
  }
  json rate;
  if (!r) r = throughput(env, variants[2], rate);
  setenv("SYRUP_SOCKET", shipped.c_str(), 1);
  bare.stop();
  std::error_code ec;
  fs::remove_all(dir, ec);
  if (r) return r;
  double ratio = median(ratios), plus = median(added);
  std::printf("median  %9.1f %9.1f %9.1f %8.3fx %9.1f\n\ntargets:\n", median(ns["without"]), median(ns["off"]),
              median(ns["on"]), ratio, plus);
  print_target("off / without (paired)", ratio, "x", "<= 1.02x", ratio <= kTargetOffRatio);
  print_target("on - off", plus, "ns", "< 50 ns", plus < kTargetAddedNs);
  json programs = json::object();
  for (auto& [n, v] : ns) programs[n] = {{"ns_per_decision", v}, {"median_ns_per_decision", median(v)}};
  out = {{"sockets", kSockets},
         {"datagrams_per_run", env.datagrams},
         {"rounds", env.rounds},
         {"programs", programs},
         {"off_vs_without", {{"per_round", ratios}, {"median_per_round", ratio}}},
         {"on_minus_off_ns", {{"per_round", added}, {"median_per_round", plus}}},
         {"throughput", rate},
         {"targets",
          {{"off_ratio_max", kTargetOffRatio},
           {"off_ratio_met", ratio <= kTargetOffRatio},
           {"added_ns_max", kTargetAddedNs},
           {"added_ns_met", plus < kTargetAddedNs}}}};
  return 0;
}

}  // namespace syrup_bench
