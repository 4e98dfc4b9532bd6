// Shared set-up of the tests that deploy at the socket-select hook, the hook's own
// (hooks/socket_select/tests) and the daemon's (syrupd/tests): the fixture on one syrupd
// per suite, owners that exit on cue, steady keyed traffic, sockets with a net_cls class
// id, groups in a network namespace no task is in. Each object tears down what it made in
// its destructor, so a failed assertion still cleans up.
#pragma once

#include <fcntl.h>
#include <net/if.h>
#include <sched.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <functional>
#include <future>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness.h"
#include "inet_diag.h"
#include "syrup/syrup.h"

namespace syrup::test {

// Socket-select tests on one syrupd per suite. deploy() and its kin remember the ids they
// got, removed at the end of each test.
class SocketSelectTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { daemon_ = start_suite_daemon(); }
  static void TearDownTestSuite() { stop_suite_daemon(daemon_); }
  void SetUp() override { SYRUP_REQUIRE_ROOT(); }
  void TearDown() override {
    for (int id : ids_) syr_remove_policy(id);
  }

  // Deploys policies/<name> (or tests/policies/<name>) on `g`.
  int deploy(const std::string& rel, const UdpGroup& g, std::vector<syr_param> params = {},
             const char* app = "socktest") {
    return deploy_fds(rel, g.fds(), std::move(params), app);
  }
  int deploy_fds(const std::string& rel, std::vector<int> fds, std::vector<syr_param> params = {},
                 const char* app = "socktest") {
    int id = deploy_socket_select(rel, fds, app, params);
    if (id > 0) ids_.push_back(id);
    return id;
  }

  // Deploys tests/policies/<name> on this process's sockets on `port` with syrupctl
  // --pid: "" or syrupctl's output.
  std::string deploy_pid(uint16_t port, const std::string& name) {
    std::string out;
    if (run_cmd(build_bin("syrupctl") + " --json deploy --hook socket-select --app pidtest --pid " +
                    std::to_string(getpid()) + " --port " + std::to_string(port) + " " +
                    source_path("tests/policies/" + name),
                out) != 0)
      return out.empty() ? "syrupctl failed" : out;
    ids_.push_back(nlohmann::json::parse(out)["id"].get<int>());
    return "";
  }

  static inline Daemon* daemon_ = nullptr;
  std::vector<int> ids_;
};

// Steady traffic for tests/policies/by_key.c (and its twin by_key_v2.c), which send key k
// to socket k % sockets: requests with keys 0..n-1 from one client, a pause every 64,
// while a receiver drains every socket and the test changes what serves the group.
class ByKeyTraffic {
 public:
  struct Result {
    int total = 0;      // datagrams received
    int misrouted = 0;  // of those, on another socket than key % sockets
  };
  ByKeyTraffic(UdpGroup& g, uint32_t n, std::chrono::microseconds pause)
      : g_(g), got_(g.size()), receiver_([this] {
          while (!done_.load()) {
            collect(0);
            std::this_thread::sleep_for(std::chrono::microseconds(200));
          }
        }),
        sender_([this, n, pause] {
          UdpClient c(g_.port());
          for (uint32_t k = 0; k < n; k++) {
            c.send_request(1, k);
            if (k % 64 == 0) std::this_thread::sleep_for(pause);
          }
        }) {}
  ~ByKeyTraffic() { stop(); }
  // Waits for the last send, collects what is still queued and says where it all went.
  Result finish() {
    stop();
    collect(100);
    Result r;
    for (size_t i = 0; i < got_.size(); i++)
      for (auto& p : got_[i]) {
        uint32_t key;
        memcpy(&key, p.data() + 4, 4);
        r.total++;
        r.misrouted += key % got_.size() != i;
      }
    return r;
  }

 private:
  void stop() {
    if (sender_.joinable()) sender_.join();
    if (!receiver_.joinable()) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the last datagrams in flight
    done_ = true;
    receiver_.join();
  }
  void collect(int wait_ms) {
    std::vector<std::vector<std::string>> p;
    g_.drain(&p, wait_ms);
    for (size_t i = 0; i < got_.size(); i++)
      for (auto& s : p[i]) got_[i].push_back(std::move(s));
  }
  UdpGroup& g_;
  std::vector<std::vector<std::string>> got_;  // payloads per socket
  std::atomic<bool> done_{false};
  std::thread receiver_, sender_;
};

// A forked process that deploys (`deploy` returns the policy id, or -errno) and then
// lives until release(): an owner the test can let exit while the test process keeps the
// sockets they share, as a worker forked by the application would.
class OwnerProcess {
 public:
  explicit OwnerProcess(const std::function<int()>& deploy)
      : child_([&] {
          int id = deploy();
          return nlohmann::json{{"id", id}, {"err", id > 0 ? "" : syr_last_error()}};
        }) {}
  int id() const { return child_.result().value("id", 0); }  // the deploy's answer
  // Its syr_last_error() if it failed, or why the owner did not report.
  std::string error() const { return child_.result().value("err", child_.result().dump()); }
  pid_t pid() const { return child_.pid(); }
  void release() { child_.release(); }

 private:
  HeldChild child_;
};

// Sends `n` requests on the one flow of `c` to `g`: how many its sockets received.
inline int delivered(UdpGroup& g, UdpClient& c, int n = 10) {
  for (int i = 0; i < n; i++) c.send_request(1, static_cast<uint32_t>(i));
  auto counts = g.drain();
  return std::accumulate(counts.begin(), counts.end(), 0);
}

// Waits up to 3 s for syrupctl to list no policy.
inline bool none_listed() {
  return wait_for([] { return list_policies() == nlohmann::json::array(); }, 3000) >= 0;
}

// Sockets of this process with a net_cls class id of their own: a thread of the test's
// joins a cgroup-v1 net_cls group (on a hierarchy mounted for the test) with class id
// `id`, makes them -- by default one UDP socket bound to 127.0.0.1 (fd()); else `make`,
// which says whether it succeeded -- and stays there until the end. A socket keeps that
// class id until a process takes it (pidfd_getfd re-tags it with the taker's: syrupd's
// is 0). Moving a task between net_cls groups re-tags every socket of its descriptor
// table, so the thread never moves back; it ends in the group. `skip` says why there is
// none (no cgroup-v1 net_cls on this kernel).
class ClassedSocket {
 public:
  explicit ClassedSocket(uint32_t id)
      : ClassedSocket(id, [this] {
          fd_.reset(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
          sockaddr_in a{};
          a.sin_family = AF_INET;
          a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
          if (bind(fd_.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) fd_.reset();
          return static_cast<bool>(fd_);
        }) {}
  ClassedSocket(uint32_t id, const std::function<bool()>& make) : group_(mnt_.path() + "/syrup-test") {
    if (mount("none", mnt_.path().c_str(), "cgroup", 0, "net_cls") != 0) {
      skip = std::string("cannot mount a cgroup-v1 net_cls hierarchy: ") + strerror(errno);
      return;
    }
    mounted_ = true;
    if (mkdir(group_.c_str(), 0755) != 0 || !write(group_ + "/net_cls.classid", std::to_string(id))) {
      skip = std::string("cannot make a net_cls group: ") + strerror(errno);
      return;
    }
    std::promise<void> made;
    bool ok = false;
    thread_ = std::thread([&] {
      ok = write(group_ + "/tasks", std::to_string(gettid())) && make();
      made.set_value();
      end_.get_future().wait();
    });
    made.get_future().wait();
    if (!ok) skip = "cannot make the sockets in the net_cls group";
  }
  ~ClassedSocket() {
    if (thread_.joinable()) {
      end_.set_value();
      thread_.join();
    }
    if (!mounted_) return;
    // The ended thread leaves the group a moment after join().
    wait_for([&] { return rmdir(group_.c_str()) == 0 || errno != EBUSY; }, 2000);
    umount(mnt_.path().c_str());
  }
  int fd() const { return fd_.get(); }
  std::string skip;

 private:
  static bool write(const std::string& path, const std::string& v) {
    std::ofstream f(path);
    f << v << "\n";
    f.close();
    return static_cast<bool>(f);
  }
  TempDir mnt_;
  std::string group_;
  bool mounted_ = false;
  UniqueFd fd_;
  std::promise<void> end_;
  std::thread thread_;
};

// The class id sock_diag reports for socket `fd` (0 when it finds none).
inline uint32_t class_id(int fd) {
  uint64_t cookie = 0;
  socklen_t len = sizeof cookie;
  std::vector<inet_diag::InetSock> all;
  std::string err;
  if (getsockopt(fd, SOL_SOCKET, SO_COOKIE, &cookie, &len) || inet_diag::all_sockets(all, err)) return 0;
  for (const auto& s : all)
    if (s.cookie == cookie) return s.class_id;
  return 0;
}


// A net_cls class id no other socket of the machine is expected to have.
inline constexpr uint32_t kTestClassId = 0x100001;

// A group of two sockets and a client of it, in a new network namespace with loopback up
// made by a thread that has left it again: no task is in that namespace; only its sockets
// and, if `name` is given, /run/netns/<name> (removed at the end) hold it. The group is
// on 127.0.0.1:`port` (0: any). `failed` says what went wrong, if anything.
struct NamespaceGroup {
  explicit NamespaceGroup(const std::string& name = "", uint16_t port = 0) : name_(name) {
    std::string out;
    if (!name.empty() && run_cmd("ip netns add " + name, out) != 0) {
      failed = "ip netns add " + name + ": " + out;
      return;
    }
    std::thread([&] {
      UniqueFd home(open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC));
      UniqueFd named(name.empty() ? -1 : open(("/run/netns/" + name).c_str(), O_RDONLY | O_CLOEXEC));
      if (name.empty() ? unshare(CLONE_NEWNET) != 0 : (!named || setns(named.get(), CLONE_NEWNET) != 0))
        return void(failed = std::string("into a new namespace: ") + strerror(errno));
      UniqueFd ctl(socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
      ifreq ifr{};
      std::snprintf(ifr.ifr_name, sizeof ifr.ifr_name, "lo");
      ifr.ifr_flags = IFF_UP;
      if (ioctl(ctl.get(), SIOCSIFFLAGS, &ifr) != 0) return void(failed = std::string("lo up: ") + strerror(errno));
      group = std::make_unique<UdpGroup>(2, port);
      client = std::make_unique<UdpClient>(group->port());
      if (!home || setns(home.get(), CLONE_NEWNET) != 0) failed = std::string("back home: ") + strerror(errno);
    }).join();
  }
  ~NamespaceGroup() {
    client.reset();
    group.reset();
    std::string out;
    if (!name_.empty()) run_cmd("ip netns del " + name_, out);
  }
  std::unique_ptr<UdpGroup> group;
  std::unique_ptr<UdpClient> client;
  std::string failed;

 private:
  std::string name_;
};

}  // namespace syrup::test
