// Benchmark: live upgrade (`live-upgrade`): a policy replaced by another under steady load.
//
// Per hook, one sender thread sends numbered 16-byte UDP datagrams at a steady pace
// (--lu_gap_us apart, busy-waiting) while the main thread replaces the policy
// --lu_replaces times, alternating two policies the datagrams tell apart: round_robin.c
// (executors in turn) and a policy that picks executor 0 (both compiled before the load
// starts, so a replacement is a warm deploy: load, verify, install). A receiver thread
// reads every executor socket with the kernel's receive timestamps (SO_TIMESTAMPNS), so
// the times are the stack's, not the receiver's scheduling. Reported per hook: datagrams
// sent and lost (by sequence number; and how many of those were sent during a
// replacement or within 1 ms of one), the longest gap between consecutive arrivals that
// overlaps a replacement (from the deploy request to its answer), the longest gap
// elsewhere (the baseline of this machine's scheduling noise), the longest gap on the
// sender's side (a gap the sender made is nobody's decision), and, in and out of
// replacements, the most any pair of consecutive arrivals lagged beyond the gap between
// their sends (the pause the path itself added).
//
// Hooks: socket-select (4 SO_REUSEPORT sockets; replacement = SO_ATTACH_REUSEPORT_EBPF
// over the old program), socket-lookup (4 sockets on ports of their own, the datagrams
// sent to a port nothing is bound to; replacement = bpf_link_update), xdp (a veth pair,
// sender in the peer namespace, executors every core through the CPUMAP, one receiving
// socket; replacement = one prog-array update). The thread hook (agent backend on this
// kernel) has no datagrams to count: its case times each replacement of fifo.c on a
// sleeping child process, which bounds its gap in decisions (the old agent stops deciding
// when the new one is started, and the deploy answers once the new one decides).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <syrup/syrup.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "harness.h"
#include "xdp_common.h"

namespace syrup_bench {
namespace {

using nlohmann::json;

constexpr const char* kFirst = "#include <syrup/policy.h>\nSYR_POLICY(struct syr_input *in) { return 0; }\n";
constexpr size_t kReceivers = 4;

uint64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);  // the clock SO_TIMESTAMPNS stamps with
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

struct Arrival {
  uint64_t ns;
  uint32_t seq;
  uint32_t executor;
};

// A UDP socket on 127.0.0.1 (or `ip`) port `port` (0: any), with kernel receive
// timestamps and a large receive buffer.
int receiver(const char* ip, uint16_t port, bool reuseport, UniqueFd& out) {
  out.reset(socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  int one = 1, buf = 8 << 20;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  inet_pton(AF_INET, ip, &a.sin_addr);
  if (!out || setsockopt(out.get(), SOL_SOCKET, SO_TIMESTAMPNS, &one, sizeof one) ||
      setsockopt(out.get(), SOL_SOCKET, SO_RCVBUFFORCE, &buf, sizeof buf) ||
      (reuseport && setsockopt(out.get(), SOL_SOCKET, SO_REUSEPORT, &one, sizeof one)) ||
      bind(out.get(), reinterpret_cast<sockaddr*>(&a), sizeof a)) {
    int e = errno;
    std::fprintf(stderr, "syrup_bench: cannot open a receiving socket: %s\n", std::strerror(e));
    return -e;
  }
  return 0;
}

uint16_t port_of(int fd) {
  sockaddr_in a{};
  socklen_t l = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &l);
  return ntohs(a.sin_port);
}

// Reads every datagram of `fds` until `stop` and the sockets are drained.
void receive(const std::vector<int>& fds, const std::atomic<bool>& stop, std::vector<Arrival>& out) {
  std::vector<pollfd> pfds;
  for (int fd : fds) pfds.push_back({fd, POLLIN, 0});
  char buf[64], ctl[CMSG_SPACE(sizeof(timespec))];
  for (int idle = 0; idle < 20;) {
    if (poll(pfds.data(), pfds.size(), 10) <= 0) {
      idle += stop.load();
      continue;
    }
    for (uint32_t i = 0; i < fds.size(); i++)
      for (;;) {
        iovec iov{buf, sizeof buf};
        msghdr m{};
        m.msg_iov = &iov;
        m.msg_iovlen = 1;
        m.msg_control = ctl;
        m.msg_controllen = sizeof ctl;
        if (recvmsg(fds[i], &m, 0) < 8) break;
        Arrival a{0, 0, i};
        std::memcpy(&a.seq, buf + 4, 4);
        for (cmsghdr* c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c))
          if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SO_TIMESTAMPNS) {
            timespec ts;
            std::memcpy(&ts, CMSG_DATA(c), sizeof ts);
            a.ns = static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
          }
        out.push_back(a);
      }
  }
}

// One hook's case: its receivers, where the sender sends, and how a policy is deployed.
struct Case {
  const char* hook;
  std::vector<UniqueFd> receivers;
  UniqueFd sender;  // connected to the target
  std::function<int(const std::string& source, const char* name)> deploy;  // the id, or -errno
};

double ms(uint64_t ns) { return static_cast<double>(ns) / 1e6; }

int run_case(const Env& env, Case& c, json& out) {
  std::ifstream in(env.policy_dir + "/round_robin.c");
  std::ostringstream ss;
  ss << in.rdbuf();
  const std::string sources[2] = {ss.str(), kFirst};
  const char* names[2] = {"round_robin.c", "first.c"};
  int id = 0;
  for (int i : {1, 0})  // both compiled (cached) before the load; round_robin runs first
    if ((id = c.deploy(sources[i], names[i])) < 0) return id;
  std::vector<int> fds;
  for (auto& r : c.receivers) fds.push_back(r.get());
  std::atomic<bool> stop_send{false}, stop_recv{false};
  std::vector<Arrival> arrivals;
  arrivals.reserve(1 << 22);
  std::vector<uint64_t> sent_ns;
  sent_ns.reserve(1 << 22);
  std::thread rx([&] { receive(fds, stop_recv, arrivals); });
  std::thread tx([&] {
    uint64_t gap = static_cast<uint64_t>(env.lu_gap_us) * 1000, next = now_ns();
    for (uint32_t seq = 0; !stop_send.load(std::memory_order_relaxed); seq++) {
      while (now_ns() < next) {
      }
      uint32_t msg[4] = {seq % 4, seq, 0, 0};
      sent_ns.push_back(now_ns());
      send(c.sender.get(), msg, sizeof msg, 0);
      // Descheduled for a while (a loaded machine): go on from now rather than send the
      // missed datagrams in one burst, which would overflow queues no replacement touched.
      next = std::max(next + gap, now_ns() - gap);
    }
  });
  std::vector<std::pair<uint64_t, uint64_t>> windows;  // each replacement: request .. answer
  std::vector<double> replace_ms;
  int failed = 0;
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  for (uint32_t i = 0; i < env.lu_replaces && !failed; i++) {
    uint64_t t0 = now_ns();
    int r = c.deploy(sources[(i + 1) % 2], names[(i + 1) % 2]);
    uint64_t t1 = now_ns();
    if (r < 0) failed = r;
    windows.push_back({t0, t1});
    replace_ms.push_back(ms(t1 - t0));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  stop_send = true;
  tx.join();
  stop_recv = true;
  rx.join();
  if (failed) return failed;

  std::sort(arrivals.begin(), arrivals.end(), [](auto& a, auto& b) { return a.ns < b.ns; });
  std::vector<bool> seen(sent_ns.size());
  size_t unique = 0;
  for (auto& a : arrivals)
    if (a.seq < seen.size() && !seen[a.seq]) seen[a.seq] = true, unique++;
  // A gap between two arrivals that the sender also left between sending them is the
  // sender's (descheduled); what the path added is the arrival gap less the send gap.
  uint64_t in_replace = 0, elsewhere = 0, sender = 0, added_in = 0, added_else = 0;
  for (size_t i = 1; i < arrivals.size(); i++) {
    uint64_t a = arrivals[i - 1].ns, b = arrivals[i].ns;
    bool overlaps = std::any_of(windows.begin(), windows.end(), [&](auto& w) { return a < w.second && b > w.first; });
    (overlaps ? in_replace : elsewhere) = std::max(overlaps ? in_replace : elsewhere, b - a);
    uint32_t qa = arrivals[i - 1].seq, qb = arrivals[i].seq;
    if (qa < qb && qb < sent_ns.size()) {
      int64_t added = static_cast<int64_t>(b - a) - static_cast<int64_t>(sent_ns[qb] - sent_ns[qa]);
      uint64_t& m = overlaps ? added_in : added_else;
      m = std::max<uint64_t>(m, static_cast<uint64_t>(std::max<int64_t>(added, 0)));
    }
  }
  for (size_t i = 1; i < sent_ns.size(); i++) sender = std::max(sender, sent_ns[i] - sent_ns[i - 1]);
  std::vector<uint64_t> per(c.receivers.size());
  for (auto& a : arrivals) per[a.executor]++;
  size_t lost = sent_ns.size() - unique, lost_in_replacement = 0;
  // A lost datagram sent during a replacement (or within 1 ms of one) is the replacement's.
  for (size_t q = 0; q < seen.size(); q++)
    if (!seen[q] && std::any_of(windows.begin(), windows.end(), [&](auto& w) {
          return sent_ns[q] + 1000000 >= w.first && sent_ns[q] <= w.second + 1000000;
        }))
      lost_in_replacement++;
  out = {{"sent", sent_ns.size()},
         {"lost", lost},
         {"lost_in_replacement", lost_in_replacement},
         {"replacements", windows.size()},
         {"replace_ms_median", median(replace_ms)},
         {"longest_gap_in_replacement_us", in_replace / 1000.0},
         {"longest_gap_elsewhere_us", elsewhere / 1000.0},
         {"longest_sender_gap_us", sender / 1000.0},
         {"most_added_to_a_send_gap_in_replacement_us", added_in / 1000.0},
         {"most_added_to_a_send_gap_elsewhere_us", added_else / 1000.0},
         {"received_per_executor", per}};
  std::printf("%-14s %9zu %6zu %6zu %8zu %11.2f %14.1f %13.1f %12.1f %10.1f %10.1f\n", c.hook, sent_ns.size(), lost,
              lost_in_replacement, windows.size(), median(replace_ms), in_replace / 1000.0, elsewhere / 1000.0,
              sender / 1000.0, added_in / 1000.0, added_else / 1000.0);
  std::fflush(stdout);
  return 0;
}

int socket_select_case(const Env& env, json& out) {
  Case c{"socket-select", {}, {}, {}};
  c.receivers.resize(kReceivers);
  uint16_t port = 0;
  for (auto& r : c.receivers) {
    if (int e = receiver("127.0.0.1", port, true, r)) return e;
    port = port_of(r.get());
  }
  if (int e = receiver("127.0.0.1", 0, false, c.sender)) return e;
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(port);
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  connect(c.sender.get(), reinterpret_cast<sockaddr*>(&to), sizeof to);
  std::vector<int> fds;
  for (auto& r : c.receivers) fds.push_back(r.get());
  int last = 0;
  c.deploy = [&](const std::string& src, const char* name) {
    syr_deploy_opts o = {.sz = sizeof o, .app = "live_upgrade", .fds = fds.data(), .n_fds = fds.size()};
    int id = syr_deploy_policy_source(src.data(), src.size(), name, SYR_HOOK_SOCKET_SELECT, &o);
    if (id < 0) std::fprintf(stderr, "syrup_bench: deploying %s failed: %s\n", name, syr_last_error());
    return last = id;
  };
  int r = run_case(env, c, out);
  if (last > 0) syr_remove_policy(last);
  return r;
}

int socket_lookup_case(const Env& env, json& out) {
  Case c{"socket-lookup", {}, {}, {}};
  c.receivers.resize(kReceivers);
  for (auto& r : c.receivers)
    if (int e = receiver("127.0.0.1", 0, false, r)) return e;
  // The steered port: one that was free a moment ago, bound by nobody.
  UniqueFd probe;
  if (int e = receiver("127.0.0.1", 0, false, probe)) return e;
  uint16_t port = port_of(probe.get());
  probe.reset();
  if (int e = receiver("127.0.0.1", 0, false, c.sender)) return e;
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(port);
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  connect(c.sender.get(), reinterpret_cast<sockaddr*>(&to), sizeof to);
  std::vector<int> fds;
  for (auto& r : c.receivers) fds.push_back(r.get());
  int last = 0;
  c.deploy = [&](const std::string& src, const char* name) {
    syr_deploy_opts o = {.sz = sizeof o, .app = "live_upgrade", .fds = fds.data(), .n_fds = fds.size(),
                         .port = port, .protocol = "udp", .address = "127.0.0.1"};
    int id = syr_deploy_policy_source(src.data(), src.size(), name, SYR_HOOK_SOCKET_LOOKUP, &o);
    if (id < 0) std::fprintf(stderr, "syrup_bench: deploying %s failed: %s\n", name, syr_last_error());
    return last = id;
  };
  int r = run_case(env, c, out);
  if (last > 0) syr_remove_policy(last);
  return r;
}

int xdp_case(const Env& env, json& out) {
  VethNet net;
  if (int r = net.create(7)) return r;
  Case c{"xdp", {}, {}, {}};
  c.receivers.resize(1);
  if (int e = receiver(net.host_ip.c_str(), 0, false, c.receivers[0])) return e;
  uint16_t port = port_of(c.receivers[0].get());
  c.sender.reset(net.peer_socket(AF_INET, SOCK_DGRAM, 0));
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(port);
  inet_pton(AF_INET, net.host_ip.c_str(), &to.sin_addr);
  if (!c.sender || connect(c.sender.get(), reinterpret_cast<sockaddr*>(&to), sizeof to)) {
    std::fprintf(stderr, "syrup_bench: cannot open the sender in %s: %s\n", net.ns.c_str(), std::strerror(errno));
    return -EIO;
  }
  std::vector<int> cpus = xdp::all_cpus();
  int last = 0;
  c.deploy = [&](const std::string& src, const char* name) {
    syr_deploy_opts o = {.sz = sizeof o, .app = "live_upgrade", .port = port, .ifname = net.host_if.c_str(),
                         .cpus = cpus.data(), .n_cpus = cpus.size()};
    int id = syr_deploy_policy_source(src.data(), src.size(), name, SYR_HOOK_XDP, &o);
    if (id < 0) std::fprintf(stderr, "syrup_bench: deploying %s failed: %s\n", name, syr_last_error());
    return last = id;
  };
  int r = run_case(env, c, out);
  if (last > 0) syr_remove_policy(last);
  return r;
}

int thread_case(const Env& env, json& out) {
  pid_t child = fork();
  if (child == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    for (;;) pause();
  }
  if (child < 0) return -errno;
  std::ifstream in(env.policy_dir + "/fifo.c");
  std::ostringstream ss;
  ss << in.rdbuf();
  // Two objects: the second differs by a comment, so each replacement loads a new program.
  const std::string sources[2] = {ss.str(), ss.str() + "/* live-upgrade twin */\n"};
  std::vector<double> replace_ms;
  int id = 0;
  for (uint32_t i = 0; i < env.lu_replaces + 2 && id >= 0; i++) {
    syr_deploy_opts o = {.sz = sizeof o, .app = "live_upgrade_thread", .pid = child};
    auto t0 = std::chrono::steady_clock::now();
    id = syr_deploy_policy_source(sources[i % 2].data(), sources[i % 2].size(), "fifo.c", SYR_HOOK_THREAD, &o);
    double took = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (id < 0) std::fprintf(stderr, "syrup_bench: deploying fifo.c (thread) failed: %s\n", syr_last_error());
    if (i >= 2) replace_ms.push_back(took);  // the first two: no predecessor, then a cold compile
  }
  if (id > 0) syr_remove_policy(id);
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  if (id < 0) return id;
  out = {{"replacements", replace_ms.size()},
         {"replace_ms_median", median(replace_ms)},
         {"replace_ms_max", percentile(replace_ms, 100)}};
  std::printf("%-14s %9s %6s %6s %8zu %11.2f %14s %13s %12s   (gap <= replace time: agent hand-over)\n",
              "thread-agent", "-", "-", "-", replace_ms.size(), median(replace_ms), "-", "-", "-");
  return 0;
}

}  // namespace

int run_live_upgrade(const Env& env, json& out) {
  if (!env.lu_gap_us || !env.lu_replaces) {
    std::fprintf(stderr, "syrup_bench: --lu_gap_us and --lu_replaces must be > 0\n");
    return -EINVAL;
  }
  std::printf("\n== Live upgrade: a policy replaced under steady load ==\n"
              "one datagram every %u us; %u replacements, alternating round_robin.c and a policy\n"
              "that picks executor 0; gaps between consecutive arrivals (kernel receive timestamps).\n\n",
              env.lu_gap_us, env.lu_replaces);
  std::printf("%-14s %9s %6s %6s %8s %11s %14s %13s %12s %10s %10s\n", "hook", "sent", "lost", "in rep", "replaces",
              "replace ms", "gap in repl us", "gap else us", "sender gap us", "+repl us", "+else us");
  out = json::object();
  int failed = 0;
  using CaseFn = int (*)(const Env&, json&);
  const std::pair<const char*, CaseFn> cases[] = {{"socket-select", socket_select_case},
                                                  {"socket-lookup", socket_lookup_case},
                                                  {"xdp", xdp_case},
                                                  {"thread-agent", thread_case}};
  for (auto [name, fn] : cases) {
    json part;
    if (int r = fn(env, part)) {
      std::fprintf(stderr, "syrup_bench: live-upgrade %s failed: %s\n", name, std::strerror(-r));
      part = {{"error", std::strerror(-r)}};
      failed = r;
    }
    out[name] = part;
  }
  return failed;
}

}  // namespace syrup_bench
