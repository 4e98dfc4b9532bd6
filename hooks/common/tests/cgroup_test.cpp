// Targets by cgroup end to end (hooks/common/cgroup.h): a container made here -- its own
// cgroup v2 under a parent this test makes, its own pid namespace, and the network
// namespace of a veth peer (TestNet) -- is scheduled by `syrupctl deploy --cgroup`:
//  - a UDP server of SO_REUSEPORT worker processes (each binds its own socket, so the
//    group spans the cgroup's processes): by_key.c sends each datagram sent over the veth
//    to worker key % 3 (executors in ascending pid order);
//  - a server of spinning threads: thread_prio.c pins them to one core, one runs and the
//    rest wait as SCHED_IDLE, a thread started after the deploy included.
#include <arpa/inet.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <functional>
#include <new>
#include <sstream>
#include <thread>

#include "harness.h"
#include "test_cgroup.h"

namespace syrup::test {
namespace {

// What the container's processes and the test share (a MAP_SHARED page made before fork).
struct Shared {
  std::atomic<int> ready{0};       // workers (or threads) up
  std::atomic<int> got[4]{};       // datagrams per worker
  std::atomic<int> misrouted[4]{};  // of those, keys another worker should have had
  std::atomic<int> start_more{0};  // thread server: start one more thread
};

constexpr int kWorkers = 3;
constexpr uint16_t kPort = 7707;

// A container: a process in a new pid namespace (its pid 1), in network namespace
// `netns` (an `ip netns` name), moved into child "ctr" of `cg` before it runs `main`. Killed (with its
// whole pid namespace) when this goes.
class Container {
 public:
  Container(const TestCgroup& cg, const std::string& netns, const std::function<void()>& main) {
    std::string cgroup = "ctr";
    int go[2], report[2];
    if (pipe2(go, O_CLOEXEC) || pipe2(report, O_CLOEXEC)) return;
    shim_ = fork();
    if (shim_ == 0) {
      int nsfd = open(("/var/run/netns/" + netns).c_str(), O_RDONLY | O_CLOEXEC);
      if (nsfd < 0 || setns(nsfd, CLONE_NEWNET) || unshare(CLONE_NEWPID)) _exit(1);
      pid_t init = fork();
      if (init == 0) {
        char c;
        if (read(go[0], &c, 1) != 1) _exit(1);
        main();
        _exit(0);
      }
      (void)!write(report[1], &init, sizeof init);
      waitpid(init, nullptr, 0);
      _exit(0);
    }
    close(go[0]);
    close(report[1]);
    if (read(report[0], &pid_, sizeof pid_) != sizeof pid_) pid_ = -1;
    close(report[0]);
    if (pid_ > 0 && !cg.join(cgroup, pid_)) pid_ = -1;
    if (pid_ > 0) (void)!write(go[1], "g", 1);
    close(go[1]);
  }
  ~Container() {
    if (pid_ > 0) kill(pid_, SIGKILL);
    if (shim_ > 0) waitpid(shim_, nullptr, 0);
  }
  pid_t pid() const { return pid_; }  // its pid 1, as this test's pid namespace numbers it

 private:
  pid_t shim_ = -1, pid_ = -1;
};

Shared* shared_page() {
  void* p = mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? nullptr : new (p) Shared();
}

// The UDP server: kWorkers processes, each with its own SO_REUSEPORT socket on kPort,
// counting what it receives and which keys were not its own (key % kWorkers).
void udp_server(Shared* s) {
  for (int i = 0; i < kWorkers; i++) {
    if (fork() != 0) continue;
    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    int on = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &on, sizeof on);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(kPort);
    if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a)) _exit(1);
    s->ready++;
    for (;;) {
      uint32_t msg[4];
      if (recv(fd, msg, sizeof msg, 0) < 8) continue;
      s->got[i]++;
      if (msg[1] % kWorkers != static_cast<uint32_t>(i)) s->misrouted[i]++;
    }
  }
  for (;;) pause();
}

// The thread server: two spinning threads, and a third once the test asks.
void thread_server(Shared* s) {
  auto spin = [] { for (;;) {} };
  std::thread(spin).detach();
  std::thread(spin).detach();
  s->ready = 2;
  while (!s->start_more) usleep(1000);
  std::thread(spin).detach();
  s->ready = 3;
  for (;;) pause();
}

std::vector<pid_t> threads_of(pid_t pid) {
  std::vector<pid_t> out;
  std::string out_text;
  run_cmd("ls /proc/" + std::to_string(pid) + "/task", out_text);
  std::istringstream ss(out_text);
  for (pid_t t; ss >> t;)
    if (t != pid) out.push_back(t);
  return out;
}

std::vector<int> cpus_of(pid_t tid) {
  cpu_set_t s;
  std::vector<int> out;
  if (sched_getaffinity(tid, sizeof s, &s)) return out;
  for (int c = 0; c < CPU_SETSIZE; c++)
    if (CPU_ISSET(c, &s)) out.push_back(c);
  return out;
}

class CgroupTarget : public ::testing::Test {
 protected:
  void SetUp() override {
    SYRUP_REQUIRE_ROOT();
    if (!cg_.why.empty()) GTEST_SKIP() << "cannot make a test cgroup v2: " << cg_.why;
    daemon_.start();
  }
  std::string syrupctl(const std::string& args, int& rc) {
    std::string out;
    rc = run_cmd(build_bin("syrupctl") + " --socket " + daemon_.socket() + " " + args, out);
    return out;
  }
  TestCgroup cg_{std::vector<std::string>{"ctr"}};
  Daemon daemon_;
};

TEST_F(CgroupTarget, ASocketSelectPolicyByCgroupSchedulesAContainersWorkerProcesses) {
  TestNet net(200 + getpid() % 10);
  ASSERT_TRUE(net.ok());
  Shared* s = shared_page();
  ASSERT_NE(s, nullptr);
  Container c(cg_, net.ns, [s] { udp_server(s); });
  ASSERT_GT(c.pid(), 0);
  ASSERT_GE(wait_for([&] { return s->ready == kWorkers; }, 5000), 0);
  int rc;
  std::string out = syrupctl("deploy --hook socket-select --cgroup " + cg_.path("ctr") + " --port " + std::to_string(kPort) +
                                 " --app container " + source_path("tests/policies/by_key.c"),
                             rc);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("with 3 executors"), std::string::npos) << out;
  // One client socket on the host (one 5-tuple: the kernel's hash alone would give one
  // worker all 90), sending over the veth into the container's namespace.
  UniqueFd client(socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(kPort);
  inet_pton(AF_INET, net.peer_ip.c_str(), &to.sin_addr);
  for (uint32_t k = 0; k < 90; k++) {
    uint32_t msg[4] = {1, k, 0, 0};
    ASSERT_EQ(sendto(client.get(), msg, sizeof msg, 0, reinterpret_cast<sockaddr*>(&to), sizeof to), 16);
  }
  wait_for([&] { return s->got[0] + s->got[1] + s->got[2] == 90; }, 3000);
  for (int i = 0; i < kWorkers; i++) {
    EXPECT_EQ(s->got[i].load(), 30) << "worker " << i;
    EXPECT_EQ(s->misrouted[i].load(), 0) << "worker " << i;
  }
  munmap(s, sizeof *s);
}

TEST_F(CgroupTarget, AThreadPolicyByCgroupRunsAContainersThreadsAlsoOneStartedLater) {
  int ncpu = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  if (ncpu < 2) GTEST_SKIP() << "needs 2 cores (one for the scheduled threads, one for the rest)";
  int core = ncpu - 1;
  TestNet net(210 + getpid() % 10);
  ASSERT_TRUE(net.ok());
  Shared* s = shared_page();
  ASSERT_NE(s, nullptr);
  Container c(cg_, net.ns, [s] { thread_server(s); });
  ASSERT_GT(c.pid(), 0);
  ASSERT_GE(wait_for([&] { return s->ready == 2; }, 5000), 0);
  int rc;
  std::string out = syrupctl("deploy --hook thread --cgroup " + cg_.path("ctr") + " --app ctrthreads --params core=" +
                                 std::to_string(core) + " " + source_path("tests/policies/thread_prio.c"),
                             rc);
  ASSERT_EQ(rc, 0) << out;
  // Every spinner pinned to the core, exactly one of them chosen, the rest SCHED_IDLE.
  auto scheduled = [&](size_t n) {
    std::vector<pid_t> tids = threads_of(c.pid());
    if (tids.size() != n) return false;
    int chosen = 0, idle = 0;
    for (pid_t t : tids) {
      if (cpus_of(t) != std::vector<int>{core}) return false;
      chosen += sched_getscheduler(t) == SCHED_OTHER;
      idle += sched_getscheduler(t) == SCHED_IDLE;
    }
    return chosen == 1 && idle == static_cast<int>(n) - 1;
  };
  EXPECT_GE(wait_for([&] { return scheduled(2); }, 3000), 0) << "the container's two threads";
  s->start_more = 1;
  EXPECT_GE(wait_for([&] { return scheduled(3); }, 3000), 0) << "a thread started after the deploy";
  munmap(s, sizeof *s);
}

}  // namespace
}  // namespace syrup::test
