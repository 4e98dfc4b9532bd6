// What the syrup_bench benchmarks share: a private syrupd, the kernel's run-time
// statistics of BPF programs, SO_REUSEPORT UDP groups with a client that loads them,
// veth pairs in network namespaces of their own (XDP benchmarks), and small statistics
// helpers.
//
// Design: each benchmark is one function, run_<name>(env, out), that prints its table
// to stdout and fills its part of the JSON report. Everything a benchmark creates
// (sockets, deployed policies, maps, veth pairs) is released before it returns; the
// private syrupd and the switch of the BPF statistics belong to main. On SIGINT/SIGTERM/
// SIGHUP main's signal thread stops syrupd and then deletes the veth pairs that are
// still alive (remove_all_nets). Functions return 0 or -errno and print what failed to
// stderr.
#pragma once

#include <linux/capability.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "syrup/syrup.h"
#include "unique_fd.h"

struct bpf_object;

namespace syrup_bench {

using syrup::UniqueFd;

class PrivateDaemon;

// What the benchmarks are run with (the command line, resolved).
struct Env {
  std::string policy_dir;       // the shipped policies (policies/*.c)
  std::string handwritten_obj;  // handwritten_rr.bpf.o
  std::string bpffs_root;       // the private syrupd's pin root
  std::string app;              // application name the bench deploys under
  uint32_t datagrams = 0;       // per measured run of the decision benchmark
  uint32_t rounds = 0;          // interleaved rounds (decision, hint)
  uint64_t hints = 0;           // mmap'ed stores per round
  uint64_t syscalls = 0;        // map-update syscalls per round
  uint32_t deploys = 0;         // cold and warm deploys each
  // XDP benchmarks (xdp-cost, xdp-scale, xdp-pps).
  std::string handwritten_xdp_obj;  // handwritten_xdp_rr.bpf.o
  std::string handwritten_sk_lookup_obj;  // handwritten_sk_lookup.bpf.o (socket-lookup)
  uint32_t xdp_repeat = 0;      // BPF_PROG_TEST_RUN repeat per measurement
  uint32_t xdp_rounds = 0;      // interleaved rounds of test runs
  uint32_t xdp_apps = 0;        // applications on the crowded interface (xdp-scale)
  double pps_seconds = 0;       // measured window per case (xdp-pps)
  uint32_t pps_rounds = 0;      // interleaved rounds (xdp-pps, xdp-veth)
  uint64_t veth_datagrams = 0;  // the counted burst of xdp-veth
  std::string syrupctl;         // next to this executable (isolation)
  double isolation_seconds = 0; // of lists per case (isolation)
  uint32_t isolation_lists = 0; // per case (isolation)
  std::string syrupd;           // next to this executable (config-swap starts two more)
  uint32_t config_tenants = 0;  // tenants of the --config file (config-swap)
  uint32_t config_rounds = 0;   // changes timed per case (config-swap)
  // control-plane: the most policies, policies per application, samples per request.
  uint32_t cp_max = 0, cp_per_app = 0, cp_samples = 0;
  uint32_t lu_gap_us = 0, lu_replaces = 0;  // live-upgrade: send pace, replacements per hook
  PrivateDaemon* daemon = nullptr;  // the private syrupd (control-plane restarts it)
};

// A syrupd of the bench's own (socket, bpffs root and cache in fresh places), started
// from `syrupd_path` and stopped with SIGTERM. stop() is idempotent and removes the
// directories; the daemon also gets SIGTERM if the bench dies (PR_SET_PDEATHSIG).
class PrivateDaemon {
 public:
  // `state_dir`: where syrupd writes its state file (default: the temporary directory
  // beside its socket); the file goes with stop(). `extra_args` go to syrupd; `tag` tells
  // the bpffs root of a second daemon of the same bench from the first's.
  int start(const std::string& syrupd_path, const std::string& state_dir = "",
            const std::vector<std::string>& extra_args = {}, const std::string& tag = "");
  void stop();
  pid_t pid() const { return pid_; }
  const std::string& dir() const { return tmp_dir_; }  // its socket, log and status file
  // SIGKILL, then the same syrupd started again on the same socket, pins and state file,
  // as a crash and a restart by its supervisor: `ms` from the start until it accepts a
  // connection (it adopts the previous one's policies before it listens).
  int restart_after_kill(std::chrono::seconds timeout, double& ms);
  const std::string& socket() const { return socket_; }
  const std::string& bpffs_root() const { return bpffs_root_; }

 private:
  int spawn(std::chrono::seconds timeout);

  pid_t pid_ = 0;
  std::string syrupd_path_, tmp_dir_, socket_, bpffs_root_, log_path_, state_file_;
  std::vector<std::string> extra_args_;  // start()'s, kept for a restart
};

// Turns on run_cnt/run_time_ns accounting of BPF programs for as long as `out` is open
// (BPF_ENABLE_STATS): the kernel turns it off by itself when the fd is closed, even if
// the bench is killed, and the kernel.bpf_stats_enabled sysctl is never written.
int enable_bpf_stats(UniqueFd& out);

struct ProgStats {
  uint64_t run_cnt = 0;
  uint64_t run_time_ns = 0;
};
int prog_stats(int prog_fd, ProgStats& out);

// A hand-written BPF object (bench/handwritten_*.bpf.c), the yardstick Syrup's policies
// are measured against: opened, its `const volatile` variables set, loaded; closed with
// this object.
// While one lives, the calling thread's effective capabilities are CAP_BPF and
// CAP_NET_ADMIN alone: what syrupd loads a socket hook's policy with (syrupd/loader.cpp),
// so the verifier applies the same Spectre mitigations to a hand-written program loaded
// meanwhile as to a policy.
class AsSyrupLoads {
 public:
  AsSyrupLoads();
  ~AsSyrupLoads();
  AsSyrupLoads(const AsSyrupLoads&) = delete;
  AsSyrupLoads& operator=(const AsSyrupLoads&) = delete;
  bool ok() const { return ok_; }

 private:
  __user_cap_data_struct saved_[2] = {};
  bool ok_ = false;
};

class HandwrittenObject {
 public:
  struct Var {
    const char* name;
    uint64_t value;  // must fit the variable's integer type
  };
  HandwrittenObject() = default;
  HandwrittenObject(const HandwrittenObject&) = delete;
  HandwrittenObject& operator=(const HandwrittenObject&) = delete;
  ~HandwrittenObject();

  // Once per object. 0 or -errno (and why on stderr). With `as_syrup_loads`, verified
  // with the capabilities syrupd gives a tenant's policy (AsSyrupLoads).
  int load(const std::string& path, std::initializer_list<Var> rodata, bool as_syrup_loads = false);
  int prog_fd(const char* name) const;  // -ENOENT when there is none
  int map_fd(const char* name) const;   // -ENOENT when there is none

 private:
  bpf_object* obj_ = nullptr;
};

// Room to read up to 64 datagrams of up to 64 bytes (the benches send 16) with one
// recvmmsg, whose contents nobody looks at: receivers only count.
class RecvBatch {
 public:
  static constexpr unsigned kSize = 64;
  RecvBatch();
  RecvBatch(const RecvBatch&) = delete;  // msgs_ points into the object itself
  RecvBatch& operator=(const RecvBatch&) = delete;
  // Datagrams read from `fd` without waiting, or -1 with errno.
  int read(int fd);

 private:
  char bufs_[kSize][64];
  iovec iov_[kSize];
  mmsghdr msgs_[kSize] = {};
};

// `n` SO_REUSEPORT UDP sockets bound to 127.0.0.1 on a free port, and one client
// socket connected to that port.
class UdpGroup {
 public:
  // 0 or -errno, said on stderr.
  int open(size_t n);
  const std::vector<int>& member_fds() const { return fds_; }
  // Options deploying a socket-select policy of `app` on the members (they point into
  // this group and `app`: keep both while the options are used).
  syr_deploy_opts deploy_opts(const std::string& app) const {
    return {.sz = sizeof(syr_deploy_opts), .app = app.c_str(), .fds = fds_.data(), .n_fds = fds_.size()};
  }
  uint16_t port() const { return port_; }
  // Sends `count` 16-byte datagrams (payload: __u32 type = seq % 4, then __u32 seq) in
  // batches, draining the members after each batch. 0 or -errno.
  int send(uint32_t count);
  // Datagrams each member received since open().
  const std::vector<uint64_t>& received() const { return received_; }

 private:
  void drain();
  uint64_t total_received() const;

  std::vector<UniqueFd> members_;
  std::vector<int> fds_;  // members_' descriptors, for syr_deploy_opts
  UniqueFd client_;
  uint16_t port_ = 0;
  uint32_t next_seq_ = 0;
  std::vector<uint64_t> received_;
};

// A veth pair the bench makes for the XDP benchmarks: `host_if` in the bench's network
// namespace with host_ip/30, its peer `peer_if` in a new namespace `ns` with peer_ip/30,
// fixed MAC addresses, the peer's TX checksum offload off (frames carry complete
// checksums, as a cpumap redirect needs) and the neighbour entries made up front.
// Names carry the bench's pid (netns "syrup-bench-<pid>-<n>", interfaces
// "sbh<pid>x<n>"/"sbp<pid>x<n>"). Removed by the destructor, or by remove_all_nets()
// (the signal path).
class VethNet {
 public:
  VethNet() = default;
  VethNet(const VethNet&) = delete;
  VethNet& operator=(const VethNet&) = delete;
  ~VethNet() { destroy(); }
  // 0 or -errno (the failing command's output on stderr). The peer's tx checksum offload
  // is turned off unless `default_offloads` (veth's default is on: partial checksums).
  int create(int n, bool default_offloads = false);
  void destroy();
  // A socket in the peer namespace (it stays there whichever thread uses it).
  int peer_socket(int domain, int type, int proto) const;

  std::string host_if, peer_if, ns, host_ip, peer_ip;
  int host_ifindex = 0;
  uint8_t host_mac[6] = {}, peer_mac[6] = {};
};
// Deletes every VethNet that is still alive (signal path; safe to call at any time).
void remove_all_nets();
// Removes what a syrup_bench killed with SIGKILL left behind: its namespaces and veths,
// and its private syrupd's bpffs root (/sys/fs/bpf/syrup-bench-<pid>), for every <pid>
// that no longer runs syrup_bench. Its /tmp/syrup-bench-* directory stays.
void remove_stale_leftovers();

// Set by the signal path before it cleans up: the benchmarks then stop asking the
// (stopping) syrupd for anything and leave the rest to it.
void set_terminating();
bool terminating();

// One `op` (list or stats) of everything, as syrupctl makes it: one connection, page after
// page (syrupd answers at most 1000 entries at a time), each answer received and parsed.
// `n`: the entries of `field` over all pages. 0 or -errno (said on stderr).
int request_all_pages(const char* op, const char* field, size_t& n);

// Runs `cmd` with /bin/sh; its exit status (or -1). stdout+stderr in `out` if given.
int run_cmd(const std::string& cmd, std::string* out = nullptr);

// Median and nearest-rank percentile (p in [0, 100]; 0 is the minimum, 100 the
// maximum) of a non-empty sample.
double median(std::vector<double> v);
double percentile(std::vector<double> v, double p);

// One line of a table's "targets:" section, e.g.
//   round_robin       51.20 ns/decision  <= 100 ns   ok
void print_target(const char* what, double value, const char* unit, const char* bound, bool met);

// The benchmarks.
int run_decision(const Env& env, nlohmann::json& out);
int run_hint(const Env& env, nlohmann::json& out);
int run_deploy(const Env& env, nlohmann::json& out);
int run_xdp_cost(const Env& env, nlohmann::json& out);
int run_xdp_scale(const Env& env, nlohmann::json& out);
int run_xdp_pps(const Env& env, nlohmann::json& out);
int run_xdp_veth(const Env& env, nlohmann::json& out);
int run_isolation(const Env& env, nlohmann::json& out);
int run_socket_lookup(const Env& env, nlohmann::json& out);
int run_recording(const Env& env, nlohmann::json& out);
int run_replay(const Env& env, nlohmann::json& out);  // workbench.cpp
int run_test(const Env& env, nlohmann::json& out);    // workbench.cpp
int run_config_swap(const Env& env, nlohmann::json& out);
int run_control_plane(const Env& env, nlohmann::json& out);
int run_live_upgrade(const Env& env, nlohmann::json& out);

}  // namespace syrup_bench
