// What the XDP benchmarks (xdp.cpp, xdp_pps.cpp, xdp_veth.cpp) share: the hand-written standalone XDP
// programs, a realistic UDP frame, BPF_PROG_TEST_RUN timing, deploying a policy to an
// interface through libsyrup, and reading the root program syrupd attached.
//
// Invariants: every policy deployed through Deployed is removed when it goes out of
// scope (and, failing that, when the bench exits: policies belong to the deploying
// process); nothing here pins anything.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "harness.h"

namespace syrup_bench::xdp {

// handwritten_xdp_rr.bpf.o, loaded with its port and cores set and its CPUMAP filled.
class Handwritten {
 public:
  int load(const std::string& path, uint16_t port, const std::vector<int>& cpus);
  int rr_fd() const;    // handwritten_xdp_rr: round robin to the cores through the CPUMAP
  int pass_fd() const;  // handwritten_xdp_pass: same parsing, XDP_PASS
  // handwritten_tail_<which>: "target" (returns XDP_PASS), "direct" (a constant-index
  // tail call to it), "indirect" (the same call, its index loaded from memory).
  int tail_fd(const char* which) const;

 private:
  HandwrittenObject obj_;
};

// Ethernet (peer MAC -> host MAC) + IPv4 (peer_ip -> host_ip, DF, checksum) + UDP
// (40000 -> dport, checksum) + 16 bytes of payload (__u32 type = 1, __u32 seq = 0, 8
// zero bytes): 58 bytes, what the peer's socket sends.
std::vector<uint8_t> udp_frame(const VethNet& net, uint16_t dport);

struct TestRun {
  double ns = 0;           // per packet: the calling thread's CPU time over the call / repeat
  uint32_t kernel_ns = 0;  // per packet as the kernel reports it (`duration`, truncated to ns)
  uint32_t retval = 0;     // the XDP action of the last run
};
// One BPF_PROG_TEST_RUN of `prog_fd` over `frame`, `repeat` times. `live`:
// BPF_F_TEST_XDP_LIVE_FRAMES, so XDP_REDIRECT is carried out (frames really go to the
// CPUMAP) instead of only being returned. 0 or -errno.
int test_run(int prog_fd, const std::vector<uint8_t>& frame, uint32_t repeat, bool live, TestRun& out);

// XDP policies deployed through libsyrup, removed in the destructor (or by remove()).
class Deployed {
 public:
  Deployed() = default;
  Deployed(const Deployed&) = delete;
  Deployed& operator=(const Deployed&) = delete;
  ~Deployed() { remove_all(); }
  // Deploys `policy_path` for `app` on `ifname`, claiming UDP `port`, executors `cpus`.
  // The policy id, or -errno (syrupd's message on stderr).
  int deploy(const std::string& policy_path, const std::string& app, const std::string& ifname,
             uint16_t port, const std::vector<int>& cpus);
  int remove(int id);
  int remove_all();  // 0 or the first failure
  size_t size() const { return ids_.size(); }

 private:
  std::vector<int> ids_;
};

// The root program syrupd attached to `ifname` (its pin <bpffs_root>/xdp/<ifname>/prog).
int open_root(const Env& env, const std::string& ifname, UniqueFd& out);
// Sum over CPUs of one slot (SYR_XDP_ROOT_*) of the root's syr_xdp_root_stats.
uint64_t root_stat(const Env& env, const std::string& ifname, uint32_t slot);

constexpr unsigned kBatch = 64;  // datagrams per sendmmsg of a Blast

// A sender thread (one connected UDP socket, 16-byte datagrams, sendmmsg of kBatch) and a
// receiver thread (counting with recvmmsg), each pinned to its core, from construction to
// stop(). `count` 0: the sender sends as fast as it can until stop(). `count` > 0: it
// sends that many, paced so that at most `window` are in flight (sent, not yet received),
// waiting at most 20 ms for the receiver each time: losses cannot stall it, so it ends
// within count / kBatch x 20 ms at worst. Each datagram carries its sequence number.
class Blast {
 public:
  Blast(int send_fd, int recv_fd, int send_cpu, int recv_cpu, uint64_t count = 0, uint64_t window = 1024);
  ~Blast() { stop(); }
  Blast(const Blast&) = delete;
  Blast& operator=(const Blast&) = delete;
  // Stops sending, waits `linger_ms` for what is in flight, stops receiving.
  void stop(int linger_ms = 20);
  // Whether a counted sender has sent everything (or failed).
  bool done() const { return done_.load(); }
  // CPU time the sender thread has had so far (its sends, and whatever softirq work ran
  // in its context), in seconds.
  double sender_cpu_s();
  uint64_t sent() const { return sent_.load(std::memory_order_relaxed); }
  uint64_t received() const { return received_.load(std::memory_order_relaxed); }
  int error() const { return error_.load(); }

 private:
  void send_loop(int fd, int cpu, uint64_t count, uint64_t window);
  void recv_loop(int fd, int cpu);

  std::thread sender_, receiver_;
  std::atomic<bool> stop_send_{false}, stop_recv_{false}, done_{false};
  std::atomic<uint64_t> sent_{0}, received_{0};
  std::atomic<int> error_{0};
};

// One UDP flow over `net`: `rx` bound to host_ip:`port` (4 MiB receive buffer), `tx` in the
// peer namespace bound to peer_ip:`src_port` and connected to rx. 0 or -errno (on stderr).
int udp_flow(const VethNet& net, uint16_t port, uint16_t src_port, UniqueFd& rx, UniqueFd& tx);
void pin_to(int cpu);
// A counter of the Udp: line of /proc/net/snmp in this network namespace (RcvbufErrors:
// datagrams dropped at a full socket; InCsumErrors: dropped for a bad checksum).
uint64_t udp_counter(const char* name);
// The XDP program attached to `ifindex` (0: none).
uint32_t attached_prog(int ifindex);

// The online cores, 0..n-1.
std::vector<int> all_cpus();
// Whether the kernel's BPF run-time statistics are on (someone holds BPF_ENABLE_STATS or
// set kernel.bpf_stats_enabled): they add two clock reads to every program run.
bool bpf_stats_on();

}  // namespace syrup_bench::xdp
