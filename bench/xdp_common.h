// What the XDP benchmarks (xdp.cpp, xdp_pps.cpp) share: the hand-written standalone XDP
// programs, a realistic UDP frame, BPF_PROG_TEST_RUN timing, deploying a policy to an
// interface through libsyrup, and reading the root program syrupd attached.
//
// Invariants: every policy deployed through Deployed is removed when it goes out of
// scope (and, failing that, when the bench exits: policies belong to the deploying
// process); nothing here pins anything.
#pragma once

#include <cstdint>
#include <string>
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

// The online cores, 0..n-1.
std::vector<int> all_cpus();
// Whether the kernel's BPF run-time statistics are on (someone holds BPF_ENABLE_STATS or
// set kernel.bpf_stats_enabled): they add two clock reads to every program run.
bool bpf_stats_on();

}  // namespace syrup_bench::xdp
