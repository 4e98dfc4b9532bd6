// Test harness: a real syrupd per test suite (its own socket, bpffs root and cache, so
// tests never touch a production daemon), and real SO_REUSEPORT socket groups on
// loopback. Everything a test creates is torn down in destructors, so a failing
// assertion still cleans up.
#pragma once

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "sched_attr.h"
#include "syrup/syrup.h"
#include "unique_fd.h"

namespace syrup::test {

// Skips the current test unless we are root (the suite needs to load BPF programs).
#define SYRUP_REQUIRE_ROOT()                                                  \
  do {                                                                         \
    if (geteuid() != 0) GTEST_SKIP() << "needs root to load BPF programs";   \
  } while (0)

std::string build_bin(const std::string& name);  // path of build/bin/<name>
std::string source_path(const std::string& rel);  // path in the source tree

class Daemon {
 public:
  // Starts syrupd; SYRUP_SOCKET points libsyrup at it until stop(). `bpffs_root`
  // defaults to a directory of this test process.
  void start(const std::string& bpffs_root = "", const std::vector<std::string>& extra_args = {});
  // SIGTERM and wait; returns syrupd's exit status (or -1). Removes the directory and the
  // bpffs root.
  int stop();
  // SIGTERM and wait, keeping the directory (state file, log) and the bpffs root, as a
  // service stop does; start() again restarts on them. Returns the exit status (or -1).
  int terminate();
  // SIGKILL, as a crash: pins, attachments and the state file stay for the next syrupd;
  // start() again (same bpffs root) restarts on them.
  void crash();
  // Waits until syrupd answers a ping (within SYRUP_TEST_DAEMON_START_S, default 15 s):
  // "" then, else why not (it exited, with its log; it did not answer in time).
  std::string answers();
  ~Daemon() { stop(); }
  const std::string& socket() const { return socket_; }
  const std::string& bpffs_root() const { return bpffs_root_; }
  std::string state_file() const;  // the --state_file it runs with, beside the socket
  std::string log() const;  // what syrupd printed so far
  pid_t pid() const { return pid_; }
  // A command start() runs syrupd through (its argv; it must exec syrupd's command line,
  // appended to it, in its own process): e.g. unshare and a shell that mounts first, as
  // a container runtime would. Empty: syrupd is run directly.
  std::vector<std::string> launcher;

 private:
  static std::string cache_dir(const std::string& dir);
  pid_t pid_ = -1;
  std::string dir_, socket_, bpffs_root_;
};

// A directory under /tmp for one test, removed with everything in it by the destructor.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// For deploys that wait for their compile (docs/protocol.md, "Connection model"): a clang
// for `--clang` that takes `secs` longer to compile (not to print its version) -- the
// real compiler, run by a python3 process that sleeps first and then becomes it, so
// killing that one process stops the compile -- written into `dir`; the source of `rel`
// with a comment no other call adds, so the cache does not have its object; and the
// line syrupd logs (at debug level) when it parks a deploy.
std::string slow_clang(const std::string& dir, double secs);
std::string uncached_source(const std::string& rel);
inline const std::string kParkedLog = "deploy parked while";
// Waits up to `ms` for `d`'s log to say `what` `n` times.
bool log_says(const Daemon& d, const std::string& what, size_t n, int ms);

// The whole file at `path`; "" if it cannot be read.
std::string read_text(const std::string& path);

// How many times `what` occurs in `text`, overlaps counted (e.g. ": error: " in clang's
// diagnostics, a line in syrupd's log).
inline size_t occurrences(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) n++;
  return n;
}

// One syrupd for a whole test suite (from SetUpTestSuite): nullptr unless we are root,
// since the suite's tests skip then.
Daemon* start_suite_daemon();
// From TearDownTestSuite: stops it, expecting a clean exit (the end of its log if not),
// and deletes it.
void stop_suite_daemon(Daemon*& daemon);

// A veth pair made for one test: `host_if` in this network namespace with 10.P.N.1/30 (P from the pid),
// its peer in a new namespace `ns` with 10.P.N.2/30 (checksum offload off, so frames
// carry complete checksums after an XDP redirect). Removed in the destructor.
class TestNet {
 public:
  // keep_offloads: the peer keeps veth's default offloads (tx checksum offload on: its
  // frames arrive with partial checksums); otherwise its tx checksumming is off.
  explicit TestNet(int n, bool keep_offloads = false);
  ~TestNet();
  bool ok() const { return ok_; }
  std::string host_if, peer_if, ns, host_ip, peer_ip;
  // A UDP socket inside the namespace, bound to peer_ip:src_port (0: any port).
  int peer_udp(uint16_t src_port = 0);
  // A TCP socket inside the namespace, connected to `ip`:`port` (-1 on failure).
  int peer_tcp(const std::string& ip, uint16_t port);
  // An AF_PACKET socket on the peer interface, for hand-made frames.
  int peer_raw();

 private:
  int in_ns(int domain, int type, int proto);
  bool ok_ = false;
};

// A UDP socket bound to `ip`:`port` (non-blocking, a large receive buffer): the receiver
// the stack delivers to when an XDP policy passes a datagram. A failed bind fails the test.
int udp_server(const std::string& ip, uint16_t port);

// The id of the XDP program attached to interface `ifname` (0: none).
uint32_t attached_xdp_prog(const std::string& ifname);

// N SO_REUSEPORT sockets of one group on `address` (a loopback one: 127.0.0.0/8).
class UdpGroup {
 public:
  explicit UdpGroup(int n, uint16_t port = 0, const char* address = "127.0.0.1");
  uint16_t port() const { return port_; }
  std::vector<int> fds() const;
  int size() const { return static_cast<int>(socks_.size()); }
  // Closes socket i (drain() counts nothing for it from then on).
  void close(int i) { socks_.at(static_cast<size_t>(i)).reset(); }
  // Binds one more socket to the group's address and port, as socket size() - 1: it joins
  // the group while any socket of it is open.
  void add();
  // Reads everything queued; returns datagrams received per socket, and the payloads.
  std::vector<int> drain(std::vector<std::vector<std::string>>* payloads = nullptr, int wait_ms = 200);

 private:
  void open(int n);
  std::vector<UniqueFd> socks_;
  uint16_t port_ = 0;
  std::string address_;
};

// A connected client socket (one 5-tuple for its whole life).
class UdpClient {
 public:
  explicit UdpClient(uint16_t port, const char* address = "127.0.0.1");
  void send(const void* data, size_t len);
  // Payload: u32 type, u32 key, then `extra` zero bytes.
  void send_request(uint32_t type, uint32_t key, size_t extra = 8);

 private:
  UniqueFd fd_;
  sockaddr_in dst_{};
};

// A socket-select deploy on the sockets `fds` for application `app`: of the policy at
// source_path(rel) with `params`, or of the source text `source` (`name` in clang's and
// syrupd's messages). The policy's id, or -errno (syr_last_error() says why). Every test
// that deploys at the hook on sockets it made goes through one of these.
int deploy_socket_select(const std::string& rel, const std::vector<int>& fds, const char* app,
                         const std::vector<syr_param>& params = {});
int deploy_socket_select_source(const std::string& source, const std::string& name, const std::vector<int>& fds,
                                const char* app);
// deploy_socket_select() on the sockets of `g`.
int deploy_on(const UdpGroup& g, const char* rel, const char* app);

// `n` listening TCP sockets of one SO_REUSEPORT group on 127.0.0.1, whose address and
// port go to `a`; none (and a test failure) if the group cannot be made.
std::vector<UniqueFd> tcp_listeners(int n, sockaddr_in& a);
// The descriptor numbers of `v`, for a deploy.
std::vector<int> raw_fds(const std::vector<UniqueFd>& v);

// What `syrupctl --json list` shows: the policies, or a discarded value if it failed.
nlohmann::json list_policies();

// Runs a command, returns its exit status; stdout+stderr in `out`.
int run_cmd(const std::string& cmd, std::string& out);

// Waits up to `ms` for pred(), asking every millisecond; the milliseconds it took, or -1.
// pred() is asked at least once and once more after the time is up, so a test that was
// not scheduled for the whole wait (a loaded host, an emulated guest) still gets an answer.
template <class F>
int wait_for(F pred, int ms) {
  auto t0 = std::chrono::steady_clock::now();
  for (;;) {
    bool done = pred();
    int took = int(std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count());
    if (done) return took;
    if (took >= ms) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// GET `path` from 127.0.0.1:`port` over HTTP/1.0: the whole response, headers included;
// "connect: <reason>" if nobody listens (tests/http_client.h).
std::string http_get(uint16_t port, const std::string& path);

// struct sched_attr and sched_getattr/sched_setattr (hooks/sched_attr.h).
using syrup::SchedAttr;
using syrup::sched_attr_get;
using syrup::sched_attr_set;

// Opens map `name` of application `app` (syr_map_open_app; nullptr: the calling
// application's, syr_map_open) and mmaps it into `out`. Returns "" or what failed, with
// libsyrup's error: ASSERT_EQ(mmap_app_map(...), "").
std::string mmap_app_map(const char* name, syr_mapped_array* out, const char* app = nullptr);

// A thread of this process that registers as executor `exec` of the current application
// and exits at once, without unregistering: its tid, or -1 (syr_last_error() says why).
pid_t register_and_exit(uint32_t exec);

// The thread hook's cleanup of registrations, as each backend must do it: the `exited`
// threads (of this process, gone after registering) leave the application's
// syrup_threads within `within_ms`, while an entry naming a live thread of another
// process (a child made and written here) stays `settle_ms` longer. "" or what failed.
std::string exited_registrations_dropped(const std::vector<pid_t>& exited, int within_ms, int settle_ms);

// Runs `fn` in a forked child (which then exits) and returns what it returned, plus, if the
// child did not exit with 0 (a crash, a failed write), how it ended. For what must not
// touch the test process: another uid, new namespaces. Nests: a child may call it again.
std::string in_child(const std::function<std::string()>& fn);

// Runs `fn` in a forked child as `uid` (gid the same, no supplementary groups, no
// capabilities) and returns the JSON it returned; {"error": ...} when it could not. For the
// tenancy and security suites: syrupd knows its callers by SO_PEERCRED, no account needed.
nlohmann::json as_user(uid_t uid, const std::function<nlohmann::json()>& fn);

// A forked child that runs `fn`, reports the JSON it returned (result()) and then lives on,
// holding what it made (sockets, policies whose owner it is), until release(): an owner
// the test lets exit on cue, an attacker whose state stays in place while the victim acts.
class HeldChild {
 public:
  explicit HeldChild(const std::function<nlohmann::json()>& fn);
  ~HeldChild() { release(); }
  HeldChild(const HeldChild&) = delete;
  HeldChild& operator=(const HeldChild&) = delete;
  // What fn returned; {"error": ...} if the child reported nothing.
  const nlohmann::json& result() const { return result_; }
  pid_t pid() const { return pid_; }
  // Lets the child exit (what it held goes with it) and reaps it; one that has not exited
  // within 5 s fails the test and is killed.
  void release();

 private:
  pid_t pid_ = -1;
  int quit_ = -1;
  bool reaped_ = false;
  nlohmann::json result_;
};

// Starts a thread of this process with tid `tid` (an exited thread's: a joined thread's
// tid is free a moment later, which it waits for) running `body`, by moving the pid cursor
// (/proc/sys/kernel/ns_last_pid, as checkpoint/restore tools do) until no other process
// takes the tid first. "" with the thread in `out`, or why not; kTidDidNotComeRound
// starts the reason a test skips on.
inline constexpr const char* kTidDidNotComeRound = "did not come round";
std::string thread_with_tid(pid_t tid, const std::function<void()>& body, std::thread& out);

// An unmodified process (for `syrupctl deploy --pid`): a child of this one running
// `n_threads` threads of `body` (which never returns) beside its main thread, until this
// object dies (SIGKILL, reaped). Returns once those threads exist; pid() is -1 if the
// child could not start.
class ChildProcess {
 public:
  ChildProcess(int n_threads, void (*body)());
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;
  pid_t pid() const { return pid_; }
  std::vector<pid_t> tids() const;  // its threads, from /proc/PID/task

 private:
  pid_t pid_ = -1;
};

}  // namespace syrup::test
