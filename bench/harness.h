// What the syrup_bench benchmarks share: a private syrupd, the kernel's run-time
// statistics of BPF programs, SO_REUSEPORT UDP groups with a client that loads them, and
// small statistics helpers.
//
// Design: each benchmark is one function, run_<name>(env, out), that prints its table
// to stdout and fills its part of the JSON report. Everything a benchmark creates
// (sockets, deployed policies, maps) is released before it returns; the private syrupd
// and the switch of the BPF statistics belong to main. Functions return 0 or -errno and
// print what failed to stderr.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace syrup_bench {

// A file descriptor closed with its owner.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) reset(std::exchange(o.fd_, -1));
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }

  int get() const { return fd_; }
  explicit operator bool() const { return fd_ >= 0; }
  void reset(int fd = -1) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

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
};

// A syrupd of the bench's own (socket, bpffs root and cache in fresh places), started
// from `syrupd_path` and stopped with SIGTERM. stop() is idempotent and removes the
// directories; the daemon also gets SIGTERM if the bench dies (PR_SET_PDEATHSIG).
class PrivateDaemon {
 public:
  int start(const std::string& syrupd_path);
  void stop();
  const std::string& socket() const { return socket_; }
  const std::string& bpffs_root() const { return bpffs_root_; }

 private:
  pid_t pid_ = 0;
  std::string tmp_dir_, socket_, bpffs_root_, log_path_;
};

// Turns on run_cnt/run_time_ns accounting of BPF programs for as long as `out` is open
// (BPF_ENABLE_STATS): the kernel turns it off by itself when the fd is closed, even if
// the bench is killed, and the kernel.bpf_stats_enabled sysctl is never written.
int enable_bpf_stats(Fd& out);

struct ProgStats {
  uint64_t run_cnt = 0;
  uint64_t run_time_ns = 0;
};
int prog_stats(int prog_fd, ProgStats& out);

// `n` SO_REUSEPORT UDP sockets bound to 127.0.0.1 on a free port, and one client
// socket connected to that port.
class UdpGroup {
 public:
  int open(size_t n);
  std::vector<int> member_fds() const;
  uint16_t port() const { return port_; }
  // Sends `count` 16-byte datagrams (payload: __u32 type = seq % 4, then __u32 seq) in
  // batches, draining the members after each batch. 0 or -errno.
  int send(uint32_t count);
  // Datagrams each member received since open().
  const std::vector<uint64_t>& received() const { return received_; }

 private:
  void drain();
  uint64_t total_received() const;

  std::vector<Fd> members_;
  Fd client_;
  uint16_t port_ = 0;
  uint32_t next_seq_ = 0;
  std::vector<uint64_t> received_;
};

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

}  // namespace syrup_bench
