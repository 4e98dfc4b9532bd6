// The shared pieces of syrup_bench (see harness.h): the private syrupd, BPF run-time
// statistics, UDP groups with their load generator, and veth pairs.
#include "harness.h"

#include <arpa/inet.h>
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <fcntl.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sched.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include <syrup/syrup.h>

#include "bpf_rodata.h"
#include "client.h"

namespace syrup_bench {
namespace fs = std::filesystem;
using namespace std::chrono_literals;

namespace {

constexpr auto kDaemonStartTimeout = 10s;
constexpr auto kDaemonStopTimeout = 5s;

int errno_or(int fallback) { return errno ? -errno : fallback; }

bool can_connect(const std::string& path) {
  UniqueFd s(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", path.c_str());
  return s && connect(s.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

int PrivateDaemon::start(const std::string& syrupd_path, const std::string& state_dir,
                         const std::vector<std::string>& extra_args, const std::string& tag) {
  if (access(syrupd_path.c_str(), X_OK) != 0) {
    std::fprintf(stderr, "syrup_bench: no syrupd at %s (build it: ninja -C build syrupd)\n",
                 syrupd_path.c_str());
    return -ENOENT;
  }
  char tmpl[] = "/tmp/syrup-bench-XXXXXX";
  if (!mkdtemp(tmpl)) {
    int e = errno;
    std::fprintf(stderr, "syrup_bench: cannot create a temporary directory: %s\n", std::strerror(e));
    return -e;
  }
  tmp_dir_ = tmpl;
  socket_ = tmp_dir_ + "/syrupd.sock";
  log_path_ = tmp_dir_ + "/syrupd.log";
  bpffs_root_ = "/sys/fs/bpf/syrup-bench-" + std::to_string(getpid()) + tag;
  state_file_ = (state_dir.empty() ? tmp_dir_ : state_dir) + "/syrup-bench-" + std::to_string(getpid()) + tag + ".state.json";
  extra_args_ = extra_args;

  syrupd_path_ = syrupd_path;
  return spawn(kDaemonStartTimeout);
}

int PrivateDaemon::restart_after_kill(std::chrono::seconds timeout, double& ms) {
  if (pid_ <= 0) return -ESRCH;
  int status;
  kill(pid_, SIGKILL);
  waitpid(pid_, &status, 0);
  pid_ = 0;
  auto t0 = std::chrono::steady_clock::now();
  int r = spawn(timeout);
  ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

int PrivateDaemon::spawn(std::chrono::seconds timeout) {
  // Everything the child needs is prepared before fork: it only calls async-signal-safe
  // functions.
  // --on_exit=remove: on SIGTERM (also the one PR_SET_PDEATHSIG sends if the bench dies)
  // syrupd removes every policy instead of leaving them for a successor; --undefok keeps a
  // syrupd without that flag (which always removes them) starting.
  std::string cache = tmp_dir_ + "/cache";
  std::vector<std::string> args = {syrupd_path_, "--socket", socket_, "--bpffs_root", bpffs_root_,
                                   "--cache_dir", cache, "--state_file", state_file_, "--on_exit=remove",
                                   "--undefok=on_exit"};
  args.insert(args.end(), extra_args_.begin(), extra_args_.end());
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) {
    int e = errno;
    std::fprintf(stderr, "syrup_bench: fork: %s\n", std::strerror(e));
    stop();
    return -e;
  }
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(1);
    int log = ::open(log_path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (log >= 0) {
      dup2(log, STDOUT_FILENO);
      dup2(log, STDERR_FILENO);
    }
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  pid_ = pid;

  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    int status;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = 0;
      std::fprintf(stderr, "syrup_bench: syrupd exited at start-up; its log:\n%s",
                   read_text(log_path_).c_str());
      stop();
      return -ECHILD;
    }
    if (can_connect(socket_)) return 0;
    std::this_thread::sleep_for(1ms);
  }
  std::fprintf(stderr, "syrup_bench: syrupd did not listen on %s in time; its log:\n%s",
               socket_.c_str(), read_text(log_path_).c_str());
  stop();
  return -ETIMEDOUT;
}

void PrivateDaemon::stop() {
  if (pid_ > 0) {
    kill(pid_, SIGTERM);
    auto deadline = std::chrono::steady_clock::now() + kDaemonStopTimeout;
    int status;
    while (waitpid(pid_, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() >= deadline) {
        std::fprintf(stderr, "syrup_bench: syrupd ignored SIGTERM; killing it\n");
        kill(pid_, SIGKILL);
        waitpid(pid_, &status, 0);
        break;
      }
      std::this_thread::sleep_for(10ms);
    }
    pid_ = 0;
  }
  std::error_code ec;
  if (!state_file_.empty()) fs::remove(state_file_, ec), fs::remove(state_file_ + ".journal", ec);
  if (!tmp_dir_.empty()) fs::remove_all(tmp_dir_, ec);
  if (!bpffs_root_.empty()) fs::remove_all(bpffs_root_, ec);
  tmp_dir_.clear();
  bpffs_root_.clear();
}

int enable_bpf_stats(UniqueFd& out) {
  int fd = bpf_enable_stats(BPF_STATS_RUN_TIME);
  if (fd < 0) {
    int e = errno_or(fd);
    std::fprintf(stderr, "syrup_bench: cannot enable BPF run-time statistics: %s\n", std::strerror(-e));
    return e;
  }
  out.reset(fd);
  return 0;
}

int prog_stats(int prog_fd, ProgStats& out) {
  bpf_prog_info info{};
  uint32_t len = sizeof info;
  if (bpf_prog_get_info_by_fd(prog_fd, &info, &len) < 0) return errno_or(-EIO);
  out = {info.run_cnt, info.run_time_ns};
  return 0;
}

HandwrittenObject::~HandwrittenObject() { bpf_object__close(obj_); }

AsSyrupLoads::AsSyrupLoads() {
  __user_cap_data_struct* saved = saved_;
  __user_cap_header_struct h{_LINUX_CAPABILITY_VERSION_3, 0};
  if (syscall(SYS_capget, &h, saved)) return;
  __user_cap_data_struct low[2] = {saved[0], saved[1]};
  low[0].effective = (1u << CAP_NET_ADMIN);
  low[1].effective = (1u << (CAP_BPF - 32));
  ok_ = syscall(SYS_capset, &h, low) == 0;
}

AsSyrupLoads::~AsSyrupLoads() {
  __user_cap_header_struct h{_LINUX_CAPABILITY_VERSION_3, 0};
  if (ok_) syscall(SYS_capset, &h, saved_);
}

int HandwrittenObject::load(const std::string& path, std::initializer_list<Var> rodata, bool as_syrup_loads) {
  obj_ = bpf_object__open_file(path.c_str(), nullptr);
  if (!obj_) {
    int e = errno;
    std::fprintf(stderr, "syrup_bench: cannot open %s: %s\n", path.c_str(), std::strerror(e));
    return -e;
  }
  for (auto& v : rodata)
    if (int r = syrup::set_rodata(obj_, v.name, v.value)) {
      std::fprintf(stderr, "syrup_bench: cannot set the const volatile variable %s of %s to %llu: %s\n", v.name,
                   path.c_str(), static_cast<unsigned long long>(v.value), std::strerror(-r));
      return r;
    }
  int r;
  if (as_syrup_loads) {
    AsSyrupLoads caps;
    r = caps.ok() ? bpf_object__load(obj_) : -EPERM;
  } else {
    r = bpf_object__load(obj_);
  }
  if (r) {
    std::fprintf(stderr, "syrup_bench: cannot load %s%s: %s\n", path.c_str(),
                 as_syrup_loads ? " with syrupd's capabilities" : "", std::strerror(-r));
    return r;
  }
  return 0;
}

int HandwrittenObject::prog_fd(const char* name) const {
  bpf_program* p = obj_ ? bpf_object__find_program_by_name(obj_, name) : nullptr;
  return p ? bpf_program__fd(p) : -ENOENT;
}

int HandwrittenObject::map_fd(const char* name) const {
  int fd = obj_ ? bpf_object__find_map_fd_by_name(obj_, name) : -ENOENT;
  return fd < 0 ? -ENOENT : fd;
}

int UdpGroup::open(size_t n) {
  members_.clear();
  fds_.assign(n, -1);
  received_.assign(n, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int r = syr_open_reuseport_group(SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, reinterpret_cast<sockaddr*>(&addr),
                                   sizeof addr, fds_.data(), n);
  if (!r) {
    port_ = ntohs(addr.sin_port);
    for (int fd : fds_) members_.emplace_back(fd);
    client_.reset(socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    if (!client_ || connect(client_.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) < 0) r = errno_or(-EIO);
  }
  if (r) {
    fds_.clear();
    std::fprintf(stderr, "syrup_bench: cannot open a UDP group: %s\n", std::strerror(-r));
  }
  return r;
}

uint64_t UdpGroup::total_received() const {
  uint64_t t = 0;
  for (auto r : received_) t += r;
  return t;
}

RecvBatch::RecvBatch() {
  for (unsigned i = 0; i < kSize; i++) {
    iov_[i] = {bufs_[i], sizeof bufs_[i]};
    msgs_[i].msg_hdr.msg_iov = &iov_[i];
    msgs_[i].msg_hdr.msg_iovlen = 1;
  }
}

int RecvBatch::read(int fd) { return recvmmsg(fd, msgs_, kSize, MSG_DONTWAIT, nullptr); }

void UdpGroup::drain() {
  RecvBatch batch;
  for (size_t m = 0; m < members_.size(); m++) {
    int r;
    while ((r = batch.read(members_[m].get())) > 0) received_[m] += static_cast<uint64_t>(r);
  }
}

int UdpGroup::send(uint32_t count) {
  constexpr uint32_t kBatch = 64;
  struct Payload {
    uint32_t type;  // read by sita at payload offset 0 (UDP offset 8)
    uint32_t seq;
    uint64_t pad;
  };
  static_assert(sizeof(Payload) == 16);
  Payload payload[kBatch];
  iovec iov[kBatch];
  mmsghdr msgs[kBatch] = {};
  for (uint32_t i = 0; i < kBatch; i++) {
    iov[i] = {&payload[i], sizeof payload[i]};
    msgs[i].msg_hdr.msg_iov = &iov[i];
    msgs[i].msg_hdr.msg_iovlen = 1;
  }
  uint64_t expected = total_received() + count;
  for (uint32_t sent = 0; sent < count;) {
    uint32_t n = std::min(kBatch, count - sent);
    for (uint32_t i = 0; i < n; i++) {
      uint32_t seq = next_seq_ + i;
      payload[i] = {seq % 4, seq, 0};
    }
    int r = sendmmsg(client_.get(), msgs, n, 0);
    if (r < 0) {
      if (errno == EINTR) continue;
      return -errno;
    }
    sent += static_cast<uint32_t>(r);
    next_seq_ += static_cast<uint32_t>(r);
    drain();
  }
  // Datagrams still in flight (softirq work deferred to ksoftirqd): wait while they keep
  // arriving. A datagram the kernel dropped was still scheduled, so this is only tidiness.
  std::vector<pollfd> pfds;
  for (auto& m : members_) pfds.push_back({m.get(), POLLIN, 0});
  while (total_received() < expected && poll(pfds.data(), pfds.size(), 50) > 0) drain();
  return 0;
}

namespace {
std::atomic<bool> g_terminating{false};
}  // namespace

void set_terminating() { g_terminating = true; }
bool terminating() { return g_terminating; }

int run_cmd(const std::string& cmd, std::string* out) {
  if (out) out->clear();
  FILE* f = popen((cmd + " 2>&1").c_str(), "r");
  if (!f) return -1;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0)
    if (out) out->append(buf, n);
  int st = pclose(f);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

namespace {

// Every VethNet between create() and destroy(), for the signal path.
std::mutex g_nets_mu;
std::set<VethNet*> g_nets;

// Deletes the pair and the namespace (the host end goes with its peer). Caller holds
// g_nets_mu.
void delete_net(const std::string& host_if, const std::string& ns) {
  run_cmd("ip link del " + host_if);
  run_cmd("ip netns del " + ns);
}

// Whether `pid` is a running syrup_bench (the owner of names carrying that pid).
bool bench_alive(long pid) {
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/" + std::to_string(pid) + "/exe", ec);
  return !ec && exe.filename() == "syrup_bench";
}

}  // namespace

// Namespaces, interfaces and bpffs roots that a syrup_bench killed with SIGKILL left behind.
void remove_stale_leftovers() {
  std::error_code ec;
  for (auto& e : fs::directory_iterator("/var/run/netns", ec)) {
    std::string name = e.path().filename();
    long pid = 0;
    if (std::sscanf(name.c_str(), "syrup-bench-%ld-", &pid) != 1 || pid == getpid() || bench_alive(pid))
      continue;
    std::fprintf(stderr, "syrup_bench: removing network namespace %s left by a killed bench\n",
                 name.c_str());
    run_cmd("ip netns del " + name);
  }
  for (auto& e : fs::directory_iterator("/sys/class/net", ec)) {
    std::string name = e.path().filename();
    long pid = 0;
    if ((std::sscanf(name.c_str(), "sbh%ldx", &pid) != 1 && std::sscanf(name.c_str(), "sbp%ldx", &pid) != 1) ||
        pid == getpid() || bench_alive(pid))
      continue;
    std::fprintf(stderr, "syrup_bench: removing interface %s left by a killed bench\n", name.c_str());
    run_cmd("ip link del " + name);
  }
  for (auto& e : fs::directory_iterator("/sys/fs/bpf", ec)) {
    std::string name = e.path().filename();
    long pid = 0;
    char rest = 0;
    if (std::sscanf(name.c_str(), "syrup-bench-%ld%c", &pid, &rest) != 1 || pid == getpid() || bench_alive(pid))
      continue;
    std::fprintf(stderr, "syrup_bench: removing the pins under /sys/fs/bpf/%s left by a killed bench\n",
                 name.c_str());
    std::error_code rec;
    fs::remove_all(e.path(), rec);
  }
}

namespace {

std::string mac_str(const uint8_t* m) {
  char b[18];
  std::snprintf(b, sizeof b, "%02x:%02x:%02x:%02x:%02x:%02x", m[0], m[1], m[2], m[3], m[4], m[5]);
  return b;
}

}  // namespace

int VethNet::create(int n, bool default_offloads) {
  if (n < 0 || n > 63) return -EINVAL;
  long pid = getpid();
  std::string tag = std::to_string(pid) + "x" + std::to_string(n);
  host_if = "sbh" + tag;
  peer_if = "sbp" + tag;
  ns = "syrup-bench-" + std::to_string(pid) + "-" + std::to_string(n);
  std::string net = "10.251." + std::to_string(pid % 250) + ".";
  host_ip = net + std::to_string(4 * n + 1);
  peer_ip = net + std::to_string(4 * n + 2);
  // Locally administered, unicast: 02:5b:<pid>:<n>:<end>.
  uint8_t base[6] = {0x02, 0x5b, static_cast<uint8_t>(pid >> 8), static_cast<uint8_t>(pid),
                     static_cast<uint8_t>(n), 1};
  std::memcpy(host_mac, base, 6);
  std::memcpy(peer_mac, base, 6);
  peer_mac[5] = 2;
  {
    std::lock_guard lk(g_nets_mu);
    g_nets.insert(this);  // from here on the signal path removes it
  }
  std::string v6off = "sysctl -qw net.ipv6.conf.";
  std::string cmd =
      "ip netns add " + ns + " && ip link add " + host_if + " address " + mac_str(host_mac) +
      " type veth peer name " + peer_if + " address " + mac_str(peer_mac) + " && ip link set " + peer_if +
      " netns " + ns + " && { " + v6off + host_if + ".disable_ipv6=1; ip netns exec " + ns + " " + v6off +
      peer_if + ".disable_ipv6=1; true; } && ip addr add " + host_ip + "/30 dev " + host_if +
      " && ip -n " + ns + " addr add " + peer_ip + "/30 dev " + peer_if +
      (default_offloads ? "" : " && ip netns exec " + ns + " ethtool -K " + peer_if + " tx off >/dev/null") +
      " && ip link set " + host_if + " up && ip -n " + ns +
      " link set " + peer_if + " up && ip -n " + ns + " link set lo up && ip neigh replace " + peer_ip +
      " lladdr " + mac_str(peer_mac) + " dev " + host_if + " nud permanent && ip -n " + ns +
      " neigh replace " + host_ip + " lladdr " + mac_str(host_mac) + " dev " + peer_if + " nud permanent";
  std::string out;
  if (run_cmd(cmd, &out) != 0) {
    std::fprintf(stderr, "syrup_bench: cannot make the veth pair %s/%s: %s", host_if.c_str(),
                 peer_if.c_str(), out.c_str());
    destroy();
    return -EIO;
  }
  host_ifindex = static_cast<int>(if_nametoindex(host_if.c_str()));
  if (!host_ifindex) {
    destroy();
    return -ENODEV;
  }
  return 0;
}

void VethNet::destroy() {
  std::lock_guard lk(g_nets_mu);
  if (g_nets.erase(this)) delete_net(host_if, ns);
}

void remove_all_nets() {
  std::lock_guard lk(g_nets_mu);
  for (VethNet* n : g_nets) delete_net(n->host_if, n->ns);
  g_nets.clear();
}

int VethNet::peer_socket(int domain, int type, int proto) const {
  int fd = -1, err = 0;
  std::thread t([&] {
    int nsfd = ::open(("/var/run/netns/" + ns).c_str(), O_RDONLY | O_CLOEXEC);
    if (nsfd >= 0 && setns(nsfd, CLONE_NEWNET) == 0)
      fd = socket(domain, type | SOCK_CLOEXEC, proto);
    if (fd < 0) err = errno;
    if (nsfd >= 0) ::close(nsfd);
  });
  t.join();
  return fd >= 0 ? fd : -(err ? err : EIO);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  size_t rank = static_cast<size_t>(std::ceil(p / 100.0 * static_cast<double>(v.size())));
  return v[std::clamp<size_t>(rank, 1, v.size()) - 1];
}

void print_target(const char* what, double value, const char* unit, const char* bound, bool met) {
  std::printf("  %-30s %9.2f %-12s %-10s %s\n", what, value, unit, bound, met ? "ok" : "MISSED");
}

int request_all_pages(const char* op, const char* field, size_t& n) {
  syrup::Client c;
  syrup::Message resp;
  nlohmann::json req = {{"op", op}};
  n = 0;
  int r = c.connect(syr_socket_path());
  while (!r) {
    r = c.call(req, resp);
    if (r || !resp.body.value("ok", false)) break;
    n += resp.body[field].size();
    if (!resp.body.contains("next")) return 0;
    req["after"] = resp.body["next"];
  }
  std::fprintf(stderr, "syrup_bench: %s failed: %s\n", op, r ? c.error().c_str() : resp.body.dump().c_str());
  return r ? r : -EIO;
}

}  // namespace syrup_bench
