#include "harness.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <grp.h>
#include <bpf/libbpf.h>
#include <linux/if_ether.h>
#include <net/if.h>
#include <sched.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "client.h"
#include "http_client.h"

namespace syrup::test {
namespace fs = std::filesystem;

std::string build_bin(const std::string& name) { return std::string(SYRUP_BUILD_BIN) + "/" + name; }
std::string source_path(const std::string& rel) { return std::string(SYRUP_SOURCE_DIR) + "/" + rel; }

void Daemon::start(const std::string& bpffs_root, const std::vector<std::string>& extra_args) {
  if (dir_.empty()) {  // a restart after crash() keeps the directory (and the state file)
    char tmpl[] = "/tmp/syrup-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  chmod(dir_.c_str(), 0755);  // unprivileged test clients must reach the socket
  socket_ = dir_ + "/syrupd.sock";
  bpffs_root_ = bpffs_root.empty() ? "/sys/fs/bpf/syrup-test-" + std::to_string(getpid()) : bpffs_root;
  std::string logf = dir_ + "/syrupd.log";
  if (access(logf.c_str(), F_OK) == 0) rename(logf.c_str(), (logf + ".previous").c_str());
  // A --clang that is a script (slow_clang) cannot be confined by the compiler sandbox's
  // Landlock rules (it runs an interpreter): syrupd starts with it only when told to accept
  // an unconfined compiler. The uid, limits and death signal still apply to it.
  std::vector<std::string> extra = extra_args;
  // Where compiles are slow (the emulated VM guest, tests/vm/guest.sh), the suite asks for
  // a longer wall-clock bound than syrupd's default; a test's own flag comes later and wins.
  if (const char* t = getenv("SYRUP_TEST_COMPILE_TIMEOUT_S"); t && atoi(t) > 0)
    extra.insert(extra.begin(), std::string("--compile_timeout_s=") + t);
  // ... and for test runs (a replay there ran 613 of 1487 inputs in syrupd's default 10 s).
  if (const char* t = getenv("SYRUP_TEST_RUN_MAX_MS"); t && atoi(t) > 0)
    extra.insert(extra.begin(), std::string("--test_run_max_ms=") + t);
  for (auto& a : extra_args)
    if (a.starts_with("--clang=") && read_text(a.substr(8)).starts_with("#!"))
      extra.push_back("--allow_unconfined_compiler");
  pid_t parent = getpid();
  pid_ = fork();
  ASSERT_GE(pid_, 0);
  if (pid_ == 0) {
    // A test process that dies without stop() (a ctest timeout, SIGPIPE from a closed
    // pipe) takes its syrupd along: SIGTERM, on which --on_exit=remove detaches and unpins
    // what it deployed. (The signal follows the thread that forked: a test's own.)
    // If the test process died before that, syrupd has been reparented already (getppid()
    // is 0 only when the parent is outside syrupd's pid namespace: a test that starts it
    // in one of its own).
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (pid_t pp = getppid(); pp != parent && pp != 0) _exit(127);
    FILE* f = freopen(logf.c_str(), "w", stderr);
    (void)f;
    std::string bin = build_bin("syrupd");
    std::string a1 = "--socket=" + socket_, a2 = "--bpffs_root=" + bpffs_root_,
                a3 = "--cache_dir=" + cache_dir(dir_), a4 = "--log_level=debug",
                a5 = "--on_exit=remove";
    std::vector<std::string> args = launcher;
    args.insert(args.end(), {bin, a1, a2, a3, a4, a5});
    args.insert(args.end(), extra.begin(), extra.end());
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(args[0].c_str(), argv.data());
    _exit(127);
  }
  std::string why = answers();
  if (why.empty()) {
    setenv("SYRUP_SOCKET", socket_.c_str(), 1);
    return;
  }
  FAIL() << why;
}

// The compile cache a test's syrupd uses: its own, unless SYRUP_TEST_CACHE_DIR names one
// that every syrupd of the run shares. The emulated VM guest shares one
// (tests/vm/guest.sh), so that a policy source, and the sched_ext root scheduler, is
// compiled once per guest run rather than once per test suite (a compile there takes tens
// of seconds); no test of the guest's asserts on what is or is not cached.
std::string Daemon::cache_dir(const std::string& dir) {
  const char* shared = getenv("SYRUP_TEST_CACHE_DIR");
  return shared && *shared ? std::string(shared) : dir + "/cache";
}

// Ready when it answers a ping, within SYRUP_TEST_DAEMON_START_S (default 15 s: a
// restart that adopts policies under load needs more than 5). The emulated sched_ext
// guest sets 60 (tests/vm/guest.sh): there loading syrupd takes 1.5 s and its first
// `clang --version` 3 s on an idle host (a restart reads the version from the cache),
// and a restart took 7 to 19 s as the host's load varied.
std::string Daemon::answers() {
  if (pid_ <= 0) return "syrupd is not running";
  const char* limit_env = getenv("SYRUP_TEST_DAEMON_START_S");
  const int asked_s = limit_env ? atoi(limit_env) : 0, limit_s = asked_s > 0 ? asked_s : 15;
  for (int i = 0; i < limit_s * 40; i++) {
    Client c;
    Message resp;
    if (c.connect(socket_) == 0 && c.call({{"op", "ping"}}, resp) == 0) return "";
    int st;
    if (waitpid(pid_, &st, WNOHANG) == pid_) {
      pid_ = -1;
      return std::string("syrupd ") +
             (WIFSIGNALED(st) ? "was killed by signal " + std::to_string(WTERMSIG(st))
                              : "exited with status " + std::to_string(WEXITSTATUS(st))) +
             ":\n" + log();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  return "syrupd did not answer within " + std::to_string(limit_s) + " s:\n" + log();
}

// SIGTERM, and syrupd's exit status once it exits (-1 for a signal). A syrupd that does not
// exit within 180 s is killed and -1 returned, so a test never waits for it without end.
// Its shutdown waits for a verify still in the kernel: one of tests/security's heavy
// policies, timed out after 30 s, held it 60 more on a host at load 11.
static int terminate_and_wait(pid_t pid) {
  kill(pid, SIGTERM);
  int st = 0;
  if (wait_for([&] { return waitpid(pid, &st, WNOHANG) == pid; }, 180000) < 0) {
    std::fprintf(stderr, "harness: syrupd %d did not exit within 180 s of SIGTERM: killing it\n", pid);
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    return -1;
  }
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

int Daemon::stop() {
  int status = -1;
  if (pid_ > 0) {
    status = terminate_and_wait(pid_);
    pid_ = -1;
  }
  if (!dir_.empty()) {
    std::error_code ec;
    fs::remove_all(dir_, ec);
    fs::remove_all(bpffs_root_, ec);
    dir_.clear();
  }
  return status;
}

int Daemon::terminate() {
  if (pid_ <= 0) return -1;
  int status = terminate_and_wait(pid_);
  pid_ = -1;
  return status;
}

void Daemon::crash() {
  if (pid_ <= 0) return;
  kill(pid_, SIGKILL);
  waitpid(pid_, nullptr, 0);
  pid_ = -1;
}

std::string Daemon::log() const { return read_text(dir_ + "/syrupd.log"); }
// syrupd's default: beside its socket.
std::string Daemon::state_file() const { return dir_ + "/syrupd.state.json"; }

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TempDir::TempDir() {
  char tmpl[] = "/tmp/syrup-test-XXXXXX";
  if (mkdtemp(tmpl)) path_ = tmpl;
}

TempDir::~TempDir() {
  std::error_code ec;
  if (!path_.empty()) fs::remove_all(path_, ec);
}

std::string slow_clang(const std::string& dir, double secs) {
  std::string path = dir + "/slow-clang";
  std::ofstream f(path);
  f << "#!/bin/sh\n"
       "case \" $* \" in *\" -c \"*) exec /usr/bin/python3 -c 'import os, sys, time; time.sleep("
    << secs << "); os.execv(sys.argv[1], sys.argv[1:])' /usr/bin/clang-19 \"$@\";; esac\n"
               "exec /usr/bin/clang-19 \"$@\"\n";
  f.close();
  chmod(path.c_str(), 0755);
  return path;
}

std::string uncached_source(const std::string& rel) {
  static std::atomic<int> n{0};
  return read_text(source_path(rel)) + "\n// " + std::to_string(getpid()) + " " + std::to_string(++n) + " " +
         std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()) + "\n";
}

bool log_says(const Daemon& d, const std::string& what, size_t n, int ms) {
  auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (occurrences(d.log(), what) < n) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

Daemon* start_suite_daemon() {
  if (geteuid() != 0) return nullptr;
  auto* d = new Daemon();
  d->start();
  return d;
}

void stop_suite_daemon(Daemon*& daemon) {
  if (!daemon) return;
  int status = daemon->terminate();  // keeps the log, with what syrupd said on the way out
  std::string log = daemon->log();
  EXPECT_EQ(status, 0) << "syrupd did not exit cleanly; the end of its log:\n"
                       << log.substr(log.size() > 4000 ? log.size() - 4000 : 0);
  delete daemon;  // removes its directory and bpffs root
  daemon = nullptr;
}

UdpGroup::UdpGroup(int n, uint16_t port, const char* address) : port_(port), address_(address) {
  open(n);
}

void UdpGroup::add() { open(1); }

void UdpGroup::open(int n) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  inet_pton(AF_INET, address_.c_str(), &a.sin_addr);
  a.sin_port = htons(port_);
  std::vector<int> fds(n);
  if (int r = syr_open_reuseport_group(SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK,
                                       reinterpret_cast<sockaddr*>(&a), sizeof a, fds.data(), n)) {
    ADD_FAILURE() << "SO_REUSEPORT group: " << strerror(-r) << ": " << syr_last_error();
    return;
  }
  port_ = ntohs(a.sin_port);
  int buf = 4 << 20;
  for (int fd : fds) {
    setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &buf, sizeof buf);
    socks_.emplace_back(fd);
  }
}

std::vector<int> UdpGroup::fds() const {
  std::vector<int> v;
  for (auto& s : socks_) v.push_back(s.get());
  return v;
}

std::vector<int> UdpGroup::drain(std::vector<std::vector<std::string>>* payloads, int wait_ms) {
  std::vector<int> counts(socks_.size());
  if (payloads) payloads->assign(socks_.size(), {});
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(wait_ms);
  char buf[2048];
  for (;;) {
    bool any = false;
    for (size_t i = 0; i < socks_.size(); i++) {
      ssize_t n;
      while ((n = recv(socks_[i].get(), buf, sizeof buf, 0)) >= 0) {
        counts[i]++;
        any = true;
        if (payloads) (*payloads)[i].emplace_back(buf, static_cast<size_t>(n));
      }
    }
    if (!any) {
      if (std::chrono::steady_clock::now() > deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  return counts;
}

UdpClient::UdpClient(uint16_t port, const char* address) {
  fd_.reset(socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  inet_pton(AF_INET, address, &a.sin_addr);
  a.sin_port = htons(port);
  dst_ = a;
  // Bound but not connected: one 5-tuple for the client's life, and a datagram a policy
  // drops (ICMP port unreachable) does not fail the next send.
  a.sin_port = 0;
  if (bind(fd_.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) < 0)
    ADD_FAILURE() << "bind: " << strerror(errno);
}

void UdpClient::send(const void* data, size_t len) {
  ASSERT_EQ(::sendto(fd_.get(), data, len, 0, reinterpret_cast<const sockaddr*>(&dst_), sizeof dst_),
            static_cast<ssize_t>(len))
      << strerror(errno);
}

void UdpClient::send_request(uint32_t type, uint32_t key, size_t extra) {
  std::string p(8 + extra, '\0');
  memcpy(p.data(), &type, 4);
  memcpy(p.data() + 4, &key, 4);
  send(p.data(), p.size());
}

nlohmann::json list_policies() {
  std::string out;
  run_cmd(build_bin("syrupctl") + " --json list", out);
  return nlohmann::json::parse(out, nullptr, false);
}

int deploy_socket_select(const std::string& rel, const std::vector<int>& fds, const char* app,
                         const std::vector<syr_param>& params) {
  syr_deploy_opts o{.sz = sizeof o, .app = app, .fds = fds.data(), .n_fds = fds.size(),
                    .params = params.data(), .n_params = params.size()};
  return syr_deploy_policy(source_path(rel).c_str(), SYR_HOOK_SOCKET_SELECT, &o);
}

int deploy_socket_select_source(const std::string& source, const std::string& name, const std::vector<int>& fds,
                                const char* app) {
  syr_deploy_opts o{.sz = sizeof o, .app = app, .fds = fds.data(), .n_fds = fds.size()};
  return syr_deploy_policy_source(source.data(), source.size(), name.c_str(), SYR_HOOK_SOCKET_SELECT, &o);
}

int deploy_on(const UdpGroup& g, const char* rel, const char* app) { return deploy_socket_select(rel, g.fds(), app); }

std::vector<UniqueFd> tcp_listeners(int n, sockaddr_in& a) {
  a = sockaddr_in{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::vector<int> fds(static_cast<size_t>(n));
  std::vector<UniqueFd> ls;
  if (int r = syr_open_reuseport_group(SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, reinterpret_cast<sockaddr*>(&a),
                                       sizeof a, fds.data(), fds.size())) {
    ADD_FAILURE() << "TCP SO_REUSEPORT group: " << strerror(-r) << ": " << syr_last_error();
    return ls;
  }
  for (int fd : fds) ls.emplace_back(fd);
  for (int fd : fds)
    if (listen(fd, 64) != 0) ADD_FAILURE() << "listen: " << strerror(errno);
  return ls;
}

std::vector<int> raw_fds(const std::vector<UniqueFd>& v) {
  std::vector<int> fds;
  for (auto& f : v) fds.push_back(f.get());
  return fds;
}

nlohmann::json as_user(uid_t uid, const std::function<nlohmann::json()>& fn) {
  std::string s = in_child([&] {
    if (setgroups(0, nullptr) || setgid(uid) || setuid(uid))
      return nlohmann::json{{"error", "cannot become uid " + std::to_string(uid)}}.dump();
    return fn().dump();
  });
  nlohmann::json j = nlohmann::json::parse(s, nullptr, false);
  return j.is_discarded() ? nlohmann::json{{"error", "child reported nothing: " + s}} : j;
}

std::string mmap_app_map(const char* name, syr_mapped_array* out, const char* app) {
  int fd = app ? syr_map_open_app(app, name) : syr_map_open(name);
  if (fd < 0) return std::string("syr_map_open(") + name + "): " + syr_last_error();
  int r = syr_map_mmap(fd, out);
  close(fd);
  return r == 0 ? "" : std::string("syr_map_mmap(") + name + "): " + syr_last_error();
}

pid_t register_and_exit(uint32_t exec) {
  pid_t tid = -1;
  std::thread([&] {
    if (syr_thread_register(exec) == 0) tid = static_cast<pid_t>(syscall(SYS_gettid));
  }).join();
  return tid;
}

std::string exited_registrations_dropped(const std::vector<pid_t>& exited, int within_ms, int settle_ms) {
  ChildProcess other(1, [] { for (;;) std::this_thread::sleep_for(std::chrono::milliseconds(5)); });
  if (other.pid() <= 0) return "cannot start a child process";
  int threads = syr_map_open("syrup_threads");
  if (threads < 0) return syr_last_error();
  uint32_t key = static_cast<uint32_t>(other.pid()), exec = 4;
  if (syr_map_update_elem(threads, &key, &exec, 0) != 0) {
    close(threads);
    return syr_last_error();
  }
  auto registered = [&](pid_t tid) {
    uint32_t k = static_cast<uint32_t>(tid), v;
    return syr_map_lookup_elem(threads, &k, &v) == 0;
  };
  int ms = wait_for([&] {
    for (pid_t t : exited)
      if (registered(t)) return false;
    return true;
  }, within_ms);
  std::printf("  the exited threads' entries went after %d ms\n", ms);
  std::string err;
  for (pid_t t : exited)
    if (registered(t))
      err += "thread " + std::to_string(t) + " exited " + std::to_string(within_ms) +
             " ms ago and is still in syrup_threads; ";
  std::this_thread::sleep_for(std::chrono::milliseconds(settle_ms));
  if (!registered(other.pid())) err += "the entry of another process's live thread was dropped";
  close(threads);
  return err;
}

std::string thread_with_tid(pid_t tid, const std::function<void()>& body, std::thread& out) {
  // A joined thread's tid is freed when the kernel releases the thread, a moment after
  // the join (longer in the emulated guest): until then every attempt would get another.
  wait_for([&] { return syscall(SYS_tgkill, getpid(), tid, 0) != 0; }, 5000);
  for (int attempt = 0; attempt < 200; attempt++) {
    std::ofstream last("/proc/sys/kernel/ns_last_pid");
    if (!(last << tid - 1 << std::flush)) return "cannot write /proc/sys/kernel/ns_last_pid";
    std::atomic<int> got{0};  // 1: this thread has the tid; 2: it has another
    std::thread c([&got, tid, body] {
      bool mine = static_cast<pid_t>(syscall(SYS_gettid)) == tid;
      got = mine ? 1 : 2;
      if (mine) body();
    });
    while (got == 0) std::this_thread::yield();
    if (got == 1) {
      out = std::move(c);
      return "";
    }
    c.join();
  }
  return "tid " + std::to_string(tid) + " " + kTidDidNotComeRound + " again";
}

std::string in_child(const std::function<std::string()>& fn) {
  int out[2];
  if (pipe(out) != 0) return std::string("pipe: ") + std::strerror(errno);
  pid_t child = fork();
  if (child < 0) return std::string("fork: ") + std::strerror(errno);
  if (child == 0) {
    close(out[0]);
    std::string s = fn();
    _exit(write(out[1], s.data(), s.size()) == static_cast<ssize_t>(s.size()) ? 0 : 2);
  }
  close(out[1]);
  std::string s;
  char buf[4096];
  for (ssize_t n; (n = read(out[0], buf, sizeof buf)) > 0;) s.append(buf, static_cast<size_t>(n));
  close(out[0]);
  int st = 0;
  waitpid(child, &st, 0);
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
    s += (s.empty() ? "" : "; ") + std::string("the child ended with status ") + std::to_string(st);
  return s;
}

HeldChild::HeldChild(const std::function<nlohmann::json()>& fn) {
  // Close-on-exec: a syrupd the test starts later must not keep the child waiting. The
  // report ends with a newline, not with EOF, which another child forked meanwhile would
  // put off by holding the write end.
  int out[2], quit[2];
  if (pipe2(out, O_CLOEXEC) || pipe2(quit, O_CLOEXEC)) {
    result_ = {{"error", std::string("pipe: ") + strerror(errno)}};
    return;
  }
  pid_ = fork();
  if (pid_ == 0) {
    close(out[0]);
    close(quit[1]);
    std::string s = fn().dump() + "\n";
    (void)!write(out[1], s.data(), s.size());
    char c;
    (void)!read(quit[0], &c, 1);  // until release() or the test's end
    _exit(0);
  }
  close(out[1]);
  close(quit[0]);
  quit_ = quit[1];
  std::string s;
  char buf[4096];
  for (ssize_t n; pid_ > 0 && (n = read(out[0], buf, sizeof buf)) > 0;) {
    s.append(buf, static_cast<size_t>(n));
    if (s.back() == '\n') break;
  }
  close(out[0]);
  result_ = nlohmann::json::parse(s, nullptr, false);
  if (result_.is_discarded()) result_ = {{"error", "the child reported nothing: " + s}};
}

void HeldChild::release() {
  if (quit_ >= 0) close(quit_);
  quit_ = -1;
  if (pid_ <= 0 || reaped_) return;
  if (wait_for([&] { return waitpid(pid_, nullptr, WNOHANG) == pid_; }, 5000) < 0) {
    ADD_FAILURE() << "the held child " << pid_ << " did not exit";
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  reaped_ = true;
}

ChildProcess::ChildProcess(int n_threads, void (*body)()) {
  int ready[2];
  if (pipe(ready) != 0) return;
  pid_ = fork();
  if (pid_ == 0) {
    for (int i = 0; i < n_threads; i++) std::thread(body).detach();
    char c = 'x';
    (void)!write(ready[1], &c, 1);
    for (;;) pause();
  }
  char c;
  if (pid_ > 0 && read(ready[0], &c, 1) != 1) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  close(ready[0]);
  close(ready[1]);
}

ChildProcess::~ChildProcess() {
  if (pid_ <= 0) return;
  kill(pid_, SIGKILL);
  waitpid(pid_, nullptr, 0);
}

std::vector<pid_t> ChildProcess::tids() const {
  std::vector<pid_t> v;
  std::error_code ec;
  for (auto& e : std::filesystem::directory_iterator("/proc/" + std::to_string(pid_) + "/task", ec))
    v.push_back(std::stoi(e.path().filename()));
  return v;
}

std::string http_get(uint16_t port, const std::string& path) {
  return http_exchange(port, "GET " + path + " HTTP/1.0\r\nHost: localhost\r\n\r\n");
}

int run_cmd(const std::string& cmd, std::string& out) {
  out.clear();
  FILE* f = popen((cmd + " 2>&1").c_str(), "r");
  if (!f) return -1;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
  int st = pclose(f);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

}  // namespace syrup::test

namespace syrup::test {

TestNet::TestNet(int n, bool keep_offloads) {
  std::string tag = std::to_string(getpid() % 100000) + "x" + std::to_string(n);
  host_if = "syh" + tag;
  peer_if = "syp" + tag;
  ns = "syrup-test-" + tag;
  // The second octet follows the pid, so test programs running side by side (several
  // build trees on one machine) do not put one subnet on two interfaces of this namespace.
  std::string net = "10." + std::to_string(20 + getpid() % 200) + "." + std::to_string(n);
  host_ip = net + ".1";
  peer_ip = net + ".2";
  // IPv6 is off on the pair before it comes up: neighbour discovery and MLD reports would
  // be traffic the tests did not send.
  std::string in_ns = "ip netns exec " + ns + " ";
  std::string cmd = "ip netns add " + ns + " && ip link add " + host_if + " type veth peer name " + peer_if +
                    " && ip link set " + peer_if + " netns " + ns +
                    " && sysctl -qw net.ipv6.conf." + host_if + ".disable_ipv6=1 && " + in_ns +
                    "sysctl -qw net.ipv6.conf." + peer_if + ".disable_ipv6=1" +
                    " && ip addr add " + host_ip + "/30 dev " + host_if + " && ip link set " + host_if +
                    " up && ip -n " + ns + " addr add " + peer_ip + "/30 dev " + peer_if + " && ip -n " + ns +
                    " link set " + peer_if + " up && ip -n " + ns + " link set lo up";
  if (!keep_offloads) cmd += " && " + in_ns + "ethtool -K " + peer_if + " tx off >/dev/null 2>&1";
  std::string out;
  ok_ = run_cmd(cmd, out) == 0;
  if (!ok_) ADD_FAILURE() << "cannot make the test network: " << out;
  // Neighbour entries up front, so no ARP exchange races the first datagrams.
  run_cmd("ping -c1 -W1 -I " + host_if + " " + peer_ip, out);
}

TestNet::~TestNet() {
  std::string out;
  run_cmd("ip link del " + host_if, out);
  run_cmd("ip netns del " + ns, out);
}

int TestNet::in_ns(int domain, int type, int proto) {
  int fd = -1;
  std::thread t([&] {
    int nsfd = open(("/var/run/netns/" + ns).c_str(), O_RDONLY | O_CLOEXEC);
    if (nsfd >= 0 && setns(nsfd, CLONE_NEWNET) == 0) fd = socket(domain, type | SOCK_CLOEXEC, proto);
    if (nsfd >= 0) close(nsfd);
  });
  t.join();
  return fd;
}

int TestNet::peer_udp(uint16_t src_port) {
  int fd = in_ns(AF_INET, SOCK_DGRAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  inet_pton(AF_INET, peer_ip.c_str(), &a.sin_addr);
  a.sin_port = htons(src_port);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) < 0)
    ADD_FAILURE() << "peer socket: " << strerror(errno);
  return fd;
}

int TestNet::peer_tcp(const std::string& ip, uint16_t port) {
  int fd = in_ns(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  inet_pton(AF_INET, ip.c_str(), &a.sin_addr);
  a.sin_port = htons(port);
  if (fd >= 0 && connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) < 0) {
    ADD_FAILURE() << "peer connect: " << strerror(errno);
    close(fd);
    fd = -1;
  }
  return fd;
}

int TestNet::peer_raw() {
  int fd = in_ns(AF_PACKET, SOCK_RAW, htons(ETH_P_ALL));
  if (fd < 0) ADD_FAILURE() << "raw socket: " << strerror(errno);
  return fd;
}

int udp_server(const std::string& ip, uint16_t port) {
  int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  int buf = 8 << 20;
  setsockopt(s, SOL_SOCKET, SO_RCVBUFFORCE, &buf, sizeof buf);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  inet_pton(AF_INET, ip.c_str(), &a.sin_addr);
  a.sin_port = htons(port);
  EXPECT_EQ(bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a), 0) << strerror(errno);
  return s;
}

uint32_t attached_xdp_prog(const std::string& ifname) {
  LIBBPF_OPTS(bpf_xdp_query_opts, q);
  int ifindex = static_cast<int>(if_nametoindex(ifname.c_str()));
  if (!ifindex || bpf_xdp_query(ifindex, 0, &q)) return 0;
  return q.prog_id;
}

}  // namespace syrup::test
