// Shared pieces of the XDP benchmarks (see xdp_common.h).
#include "xdp_common.h"

#include <arpa/inet.h>
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <linux/bpf.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <syrup/syrup.h>
#include <syrup/xdp_abi.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

namespace syrup_bench::xdp {
namespace {

uint16_t csum_fold(uint32_t sum) {
  while (sum >> 16) sum = (sum & 0xffff) + (sum >> 16);
  return static_cast<uint16_t>(~sum);
}

uint32_t csum_add(uint32_t sum, const uint8_t* p, size_t len) {
  for (size_t i = 0; i + 1 < len; i += 2) sum += static_cast<uint32_t>(p[i] << 8 | p[i + 1]);
  if (len % 2) sum += static_cast<uint32_t>(p[len - 1] << 8);
  return sum;
}

std::string pin(const Env& env, const std::string& ifname, const char* obj) {
  return env.bpffs_root + "/xdp/" + ifname + "/" + obj;
}

}  // namespace

int Handwritten::load(const std::string& path, uint16_t port, const std::vector<int>& cpus) {
  uint32_t n = static_cast<uint32_t>(cpus.size());
  if (int r = obj_.load(path, {{"port", port}, {"num_cpus", n}})) return r;
  int cpumap = obj_.map_fd("cpu_map"), avail = obj_.map_fd("cpus_available");
  for (uint32_t i = 0; i < n; i++) {
    uint32_t cpu = static_cast<uint32_t>(cpus[i]);
    bpf_cpumap_val v{};
    v.qsize = 2048;  // what syrupd gives its CPUMAP entries
    if (bpf_map_update_elem(cpumap, &cpu, &v, BPF_ANY) < 0 ||
        bpf_map_update_elem(avail, &i, &cpu, BPF_ANY) < 0) {
      int e = errno;
      std::fprintf(stderr, "syrup_bench: cannot add core %u to the hand-written CPUMAP: %s\n", cpu,
                   std::strerror(e));
      return -e;
    }
  }
  uint32_t zero = 0;
  int target = obj_.prog_fd("handwritten_tail_target");
  if (bpf_map_update_elem(obj_.map_fd("tail_progs"), &zero, &target, BPF_ANY) < 0) {
    int e = errno;
    std::fprintf(stderr, "syrup_bench: cannot fill the hand-written prog array: %s\n", std::strerror(e));
    return -e;
  }
  return 0;
}

int Handwritten::tail_fd(const char* which) const {
  return obj_.prog_fd((std::string("handwritten_tail_") + which).c_str());
}

int Handwritten::rr_fd() const { return obj_.prog_fd("handwritten_xdp_rr"); }
int Handwritten::pass_fd() const { return obj_.prog_fd("handwritten_xdp_pass"); }

std::vector<uint8_t> udp_frame(const VethNet& net, uint16_t dport) {
  constexpr size_t kPayload = 16;
  std::vector<uint8_t> f(14 + 20 + 8 + kPayload, 0);
  uint8_t* eth = f.data();
  std::memcpy(eth, net.host_mac, 6);
  std::memcpy(eth + 6, net.peer_mac, 6);
  eth[12] = 0x08;  // ETH_P_IP
  eth[13] = 0x00;
  uint8_t* ip = eth + 14;
  uint16_t ip_len = static_cast<uint16_t>(20 + 8 + kPayload);
  ip[0] = 0x45;
  ip[2] = static_cast<uint8_t>(ip_len >> 8);
  ip[3] = static_cast<uint8_t>(ip_len);
  ip[6] = 0x40;  // DF
  ip[8] = 64;    // TTL
  ip[9] = 17;    // UDP
  inet_pton(AF_INET, net.peer_ip.c_str(), ip + 12);
  inet_pton(AF_INET, net.host_ip.c_str(), ip + 16);
  uint16_t c = csum_fold(csum_add(0, ip, 20));
  ip[10] = static_cast<uint8_t>(c >> 8);
  ip[11] = static_cast<uint8_t>(c);
  uint8_t* udp = ip + 20;
  uint16_t udp_len = static_cast<uint16_t>(8 + kPayload);
  udp[0] = 40000 >> 8;
  udp[1] = 40000 & 0xff;
  udp[2] = static_cast<uint8_t>(dport >> 8);
  udp[3] = static_cast<uint8_t>(dport);
  udp[4] = static_cast<uint8_t>(udp_len >> 8);
  udp[5] = static_cast<uint8_t>(udp_len);
  udp[8] = 1;  // __u32 type = 1 (little endian), then seq = 0 and padding
  uint32_t sum = csum_add(0, ip + 12, 8);  // pseudo-header: addresses, protocol, length
  sum += 17 + udp_len;
  sum = csum_add(sum, udp, udp_len);
  c = csum_fold(sum);
  if (c == 0) c = 0xffff;
  udp[6] = static_cast<uint8_t>(c >> 8);
  udp[7] = static_cast<uint8_t>(c);
  return f;
}

int test_run(int prog_fd, const std::vector<uint8_t>& frame, uint32_t repeat, bool live, TestRun& out) {
  LIBBPF_OPTS(bpf_test_run_opts, o, .data_in = frame.data(),
              .data_size_in = static_cast<uint32_t>(frame.size()), .repeat = static_cast<int>(repeat),
              .flags = live ? BPF_F_TEST_XDP_LIVE_FRAMES : 0u);
  timespec a{}, b{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &a);
  int r = bpf_prog_test_run_opts(prog_fd, &o);
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &b);
  if (r < 0) {
    int e = errno ? errno : -r;
    std::fprintf(stderr, "syrup_bench: BPF_PROG_TEST_RUN%s failed: %s\n", live ? " (live frames)" : "",
                 std::strerror(e));
    return -e;
  }
  double ns = static_cast<double>(b.tv_sec - a.tv_sec) * 1e9 + static_cast<double>(b.tv_nsec - a.tv_nsec);
  out.ns = ns / repeat;
  out.kernel_ns = o.duration;
  out.retval = o.retval;
  return 0;
}

int Deployed::deploy(const std::string& policy_path, const std::string& app, const std::string& ifname,
                     uint16_t port, const std::vector<int>& cpus) {
  syr_deploy_opts o{.sz = sizeof o, .app = app.c_str(), .ifname = ifname.c_str(), .ports = &port,
                    .n_ports = 1, .cpus = cpus.data(), .n_cpus = cpus.size()};
  int id = syr_deploy_policy(policy_path.c_str(), SYR_HOOK_XDP, &o);
  if (id < 0) {
    if (terminating()) return id;
    std::fprintf(stderr, "syrup_bench: deploying %s for %s on %s:%u failed: %s\n", policy_path.c_str(),
                 app.c_str(), ifname.c_str(), port, syr_last_error());
    return id;
  }
  ids_.push_back(id);
  return id;
}

int Deployed::remove(int id) {
  std::erase(ids_, id);
  if (terminating()) return 0;  // syrupd is being stopped, and removes every policy itself
  int r = syr_remove_policy(id);
  if (r) std::fprintf(stderr, "syrup_bench: removing policy %d failed: %s\n", id, syr_last_error());
  return r;
}

int Deployed::remove_all() {
  int first = 0;
  // Newest first: the interface's first application goes last.
  while (!ids_.empty()) {
    int r = remove(ids_.back());
    if (r && !first) first = r;
  }
  return first;
}

int open_root(const Env& env, const std::string& ifname, UniqueFd& out) {
  std::string p = pin(env, ifname, "prog");
  out.reset(bpf_obj_get(p.c_str()));
  if (out) return 0;
  int e = errno;
  std::fprintf(stderr, "syrup_bench: cannot open the XDP root program %s: %s\n", p.c_str(), std::strerror(e));
  return -e;
}

uint64_t root_stat(const Env& env, const std::string& ifname, uint32_t slot) {
  UniqueFd map(bpf_obj_get(pin(env, ifname, "syr_xdp_root_stats").c_str()));
  if (!map) return 0;
  std::vector<uint64_t> v(static_cast<size_t>(libbpf_num_possible_cpus()));
  uint64_t sum = 0;
  if (bpf_map_lookup_elem(map.get(), &slot, v.data()) == 0)
    for (auto x : v) sum += x;
  return sum;
}

std::vector<int> all_cpus() {
  std::vector<int> v;
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  for (int i = 0; i < n; i++) v.push_back(i);
  return v;
}

bool bpf_stats_on() {
  std::ifstream in("/proc/sys/kernel/bpf_stats_enabled");
  int v = 0;
  in >> v;
  return v != 0;
}

Blast::Blast(int send_fd, int recv_fd, int send_cpu, int recv_cpu, uint64_t count, uint64_t window) {
  sender_ = std::thread([=, this] { send_loop(send_fd, send_cpu, count, window); });
  receiver_ = std::thread([=, this] { recv_loop(recv_fd, recv_cpu); });
}

void Blast::stop(int linger_ms) {
  stop_send_ = true;
  if (sender_.joinable()) sender_.join();
  if (receiver_.joinable()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(linger_ms));  // what is in flight
    stop_recv_ = true;
    receiver_.join();
  }
}

double Blast::sender_cpu_s() {
  clockid_t c;
  timespec t{};
  if (pthread_getcpuclockid(sender_.native_handle(), &c) || clock_gettime(c, &t)) return 0;
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

void Blast::send_loop(int fd, int cpu, uint64_t count, uint64_t window) {
  pin_to(cpu);
  struct Payload {
    uint32_t type, seq;
    uint64_t pad;
  } payload[kBatch];
  iovec iov[kBatch];
  mmsghdr msgs[kBatch] = {};
  for (unsigned i = 0; i < kBatch; i++) {
    payload[i] = {1, i, 0};
    iov[i] = {&payload[i], sizeof payload[i]};
    msgs[i].msg_hdr.msg_iov = &iov[i];
    msgs[i].msg_hdr.msg_iovlen = 1;
  }
  while (!stop_send_.load(std::memory_order_relaxed)) {
    uint64_t s = sent();
    if (count && s >= count) break;
    unsigned n = count ? static_cast<unsigned>(std::min<uint64_t>(kBatch, count - s)) : kBatch;
    if (count) {
      for (unsigned i = 0; i < n; i++) payload[i].seq = static_cast<uint32_t>(s + i);
      auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(20);
      while (s + n > received() + window && std::chrono::steady_clock::now() < deadline &&
             !stop_send_.load(std::memory_order_relaxed))
        std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    int r = sendmmsg(fd, msgs, n, 0);
    if (r > 0) {
      sent_.fetch_add(static_cast<uint64_t>(r), std::memory_order_relaxed);
    } else if (r < 0 && errno != EINTR && errno != ENOBUFS && errno != EAGAIN) {
      error_ = -errno;
      break;
    }
  }
  done_ = true;
}

void Blast::recv_loop(int fd, int cpu) {
  pin_to(cpu);
  RecvBatch batch;
  pollfd p{fd, POLLIN, 0};
  while (!stop_recv_.load(std::memory_order_relaxed)) {
    int r = batch.read(fd);
    if (r > 0) received_.fetch_add(static_cast<uint64_t>(r), std::memory_order_relaxed);
    else poll(&p, 1, 10);
  }
}

int udp_flow(const VethNet& net, uint16_t port, uint16_t src_port, UniqueFd& rx, UniqueFd& tx) {
  rx.reset(socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  int buf = 4 << 20;
  sockaddr_in host{}, peer{};
  host.sin_family = peer.sin_family = AF_INET;
  inet_pton(AF_INET, net.host_ip.c_str(), &host.sin_addr);
  inet_pton(AF_INET, net.peer_ip.c_str(), &peer.sin_addr);
  host.sin_port = htons(port);
  peer.sin_port = htons(src_port);
  if (!rx || setsockopt(rx.get(), SOL_SOCKET, SO_RCVBUFFORCE, &buf, sizeof buf) < 0 ||
      bind(rx.get(), reinterpret_cast<sockaddr*>(&host), sizeof host) < 0) {
    int e = errno;
    std::fprintf(stderr, "syrup_bench: receiver socket on %s:%u: %s\n", net.host_ip.c_str(), port, std::strerror(e));
    return -e;
  }
  int sfd = net.peer_socket(AF_INET, SOCK_DGRAM, 0);
  if (sfd < 0) {
    std::fprintf(stderr, "syrup_bench: sender socket in %s: %s\n", net.ns.c_str(), std::strerror(-sfd));
    return sfd;
  }
  tx.reset(sfd);
  if (bind(tx.get(), reinterpret_cast<sockaddr*>(&peer), sizeof peer) < 0 ||
      connect(tx.get(), reinterpret_cast<sockaddr*>(&host), sizeof host) < 0) {
    int e = errno;
    std::fprintf(stderr, "syrup_bench: sender socket: %s\n", std::strerror(e));
    return -e;
  }
  return 0;
}

void pin_to(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}

uint64_t udp_counter(const char* name) {
  std::ifstream in("/proc/net/snmp");
  std::string header, values, line;
  while (std::getline(in, line)) {
    if (line.rfind("Udp: ", 0) != 0) continue;
    if (header.empty()) header = line;
    else values = line;
  }
  std::istringstream h(header), v(values);
  std::string n, val;
  while (h >> n && v >> val)
    if (n == name) return std::stoull(val);
  return 0;
}

uint32_t attached_prog(int ifindex) {
  LIBBPF_OPTS(bpf_xdp_query_opts, q);
  if (bpf_xdp_query(ifindex, 0, &q)) return 0;
  return q.prog_id;
}

}  // namespace syrup_bench::xdp
