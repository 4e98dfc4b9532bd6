// Integration tests of the thread hook: a real syrupd, real threads, real scheduling.
// On a kernel without sched_ext (this project's CI hosts) the policies run in the
// user-space agent; the sched_ext backend is tested inside a VM (tests/vm/). Each test
// asserts which thread ran, from per-thread CPU time (CLOCK_THREAD_CPUTIME_ID), and puts
// every thread it made back to normal scheduling even when an assertion fails.
#include <bpf/bpf.h>
#include <gtest/gtest.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/mount.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <fstream>
#include <iterator>
#include <sstream>
#include <memory>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness.h"
#include "security/security.h"
#include "syrup/syrup.h"

namespace syrup::test {
namespace {

using Clock = std::chrono::steady_clock;

int ncpus() { return static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN)); }

int sched_policy_of(pid_t tid) { return sched_getscheduler(tid); }

std::vector<int> cpus_of(pid_t tid) {
  cpu_set_t s;
  std::vector<int> v;
  if (sched_getaffinity(tid, sizeof s, &s) == 0)
    for (int c = 0; c < CPU_SETSIZE; c++)
      if (CPU_ISSET(c, &s)) v.push_back(c);
  return v;
}

std::string cpus_to(pid_t tid) {
  std::string s;
  for (int c : cpus_of(tid)) s += (s.empty() ? "" : ",") + std::to_string(c);
  return "{" + s + "}";
}

void restore_normal(pid_t tid) {
  sched_param sp{};
  sched_setscheduler(tid, SCHED_OTHER, &sp);
  cpu_set_t s;
  CPU_ZERO(&s);
  for (int c = 0; c < ncpus(); c++) CPU_SET(c, &s);
  sched_setaffinity(tid, sizeof s, &s);
}

// A SCHED_OTHER thread's EEVDF slice as sched_getattr reports it (the custom slice, or
// the kernel's base slice), or -1.
int64_t slice_of(pid_t tid) {
  SchedAttr a;
  return sched_attr_get(tid, a) == 0 ? static_cast<int64_t>(a.sched_runtime) : -1;
}

// Whether this kernel keeps a custom slice for a SCHED_OTHER thread (Linux 6.12+).
bool kernel_has_custom_slices() {
  bool ok = false;
  std::thread t([&] {
    SchedAttr a;
    a.sched_runtime = 200000;
    ok = sched_attr_set(0, a) == 0 && slice_of(static_cast<pid_t>(syscall(SYS_gettid))) == 200000;
  });
  t.join();
  return ok;
}

// A registered thread that blocks on an eventfd and counts its wakeups.
class Sleeper {
 public:
  explicit Sleeper(uint32_t exec) : efd_(eventfd(0, EFD_CLOEXEC)) {
    thread_ = std::thread([this, exec] {
      tid_ = static_cast<pid_t>(syscall(SYS_gettid));
      reg_ = syr_thread_register(exec);
      ready_ = true;
      uint64_t v;
      while (read(efd_, &v, sizeof v) == sizeof v && !stop_) wakeups_++;
    });
    while (!ready_) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ~Sleeper() {
    stop_ = true;
    uint64_t one = 1;
    if (write(efd_, &one, sizeof one) < 0) std::perror("eventfd");
    thread_.join();
    close(efd_);
    restore_normal(tid_);
  }
  pid_t tid() const { return tid_; }
  int reg_result() const { return reg_; }
  int wakeups() const { return wakeups_; }
  void wake() {
    uint64_t one = 1;
    if (write(efd_, &one, sizeof one) < 0) std::perror("eventfd");
  }
  bool blocked() const {
    std::ifstream in("/proc/self/task/" + std::to_string(tid_) + "/stat");
    std::string s;
    std::getline(in, s);
    auto rp = s.rfind(')');
    return rp != std::string::npos && rp + 2 < s.size() && s[rp + 2] == 'S';
  }

 private:
  int efd_;
  std::thread thread_;
  std::atomic<pid_t> tid_{0};
  std::atomic<int> reg_{-1}, wakeups_{0};
  std::atomic<bool> ready_{false}, stop_{false};
};

// Busy threads, optionally registered as executors 0..n-1. Joined (and put back to
// normal scheduling) by the destructor.
class Spinners {
 public:
  // stagger_ms > 0: thread i sleeps (i + 1) * stagger_ms after registering, so the
  // threads become runnable in index order (distinct FIFO keys).
  Spinners(int n, bool do_register, int first_exec = 0, int stagger_ms = 0) : tids_(n), clocks_(n), ok_(n) {
    for (int i = 0; i < n; i++)
      threads_.emplace_back([this, i, do_register, first_exec, stagger_ms] {
        tids_[i] = static_cast<pid_t>(syscall(SYS_gettid));
        pthread_getcpuclockid(pthread_self(), &clocks_[i]);
        ok_[i] = do_register ? syr_thread_register(static_cast<uint32_t>(first_exec + i)) : 0;
        ready_++;
        if (stagger_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds((i + 1) * stagger_ms));
        while (!stop_.load(std::memory_order_relaxed)) {
        }
      });
    while (ready_.load() < n) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ~Spinners() {
    stop_ = true;
    for (auto& t : threads_) t.join();
    for (pid_t t : tids_) restore_normal(t);
  }
  int size() const { return static_cast<int>(tids_.size()); }
  pid_t tid(int i) const { return tids_[i]; }
  int reg_result(int i) const { return ok_[i]; }
  clockid_t clock(int i) const { return clocks_[i]; }
  uint64_t cpu_ns(int i) const {
    timespec ts;
    clock_gettime(clocks_[i], &ts);
    return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
  }
  // CPU time each thread got during `ms` of wall time.
  std::vector<double> shares(int ms) const {
    std::vector<uint64_t> a(tids_.size()), b(tids_.size());
    for (size_t i = 0; i < a.size(); i++) a[i] = cpu_ns(static_cast<int>(i));
    auto t0 = Clock::now();
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    double wall = double(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count());
    std::vector<double> s(a.size());
    for (size_t i = 0; i < a.size(); i++) s[i] = double(cpu_ns(static_cast<int>(i)) - a[i]) / wall;
    return s;
  }

 private:
  std::vector<pid_t> tids_;
  std::vector<clockid_t> clocks_;
  std::vector<int> ok_;
  std::vector<std::thread> threads_;
  std::atomic<int> ready_{0};
  std::atomic<bool> stop_{false};
};

uint64_t clock_ns(clockid_t c) {
  timespec ts;
  clock_gettime(c, &ts);
  return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

// CPU time each thread (by its CPU-time clock) got, as a share of wall time, over ONE
// window for all of them: at least `min_ms`, extended (up to `max_ms`) until together
// they ran `cpu_ms` of CPU. Comparing threads measured in the same window, with enough
// samples, holds whatever else the machine runs; absolute shares do not (a CI machine
// busy with other jobs gives every thread on the core less).
std::vector<double> measure(const std::vector<clockid_t>& clocks, int min_ms = 500, int cpu_ms = 300,
                            int max_ms = 4000) {
  std::vector<uint64_t> a(clocks.size());
  for (size_t i = 0; i < a.size(); i++) a[i] = clock_ns(clocks[i]);
  auto t0 = Clock::now();
  std::vector<double> s(clocks.size());
  for (;;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    auto el = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
    uint64_t cpu = 0;
    for (size_t i = 0; i < a.size(); i++) cpu += clock_ns(clocks[i]) - a[i];
    if (el >= max_ms || (el >= min_ms && cpu >= uint64_t(cpu_ms) * 1000000ull)) {
      double wall = double(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count());
      for (size_t i = 0; i < a.size(); i++) s[i] = double(clock_ns(clocks[i]) - a[i]) / wall;
      return s;
    }
  }
}

std::string fmt(const std::vector<double>& v) {
  std::string s;
  for (double x : v) s += std::to_string(int(x * 1000) / 10.0).substr(0, 5) + "% ";
  return s;
}

// The process exists and has not exited (a zombie waiting for its new parent to reap it
// counts as exited: an orphaned agent is reparented, not to this test).
bool alive(pid_t pid) {
  std::string s = read_text("/proc/" + std::to_string(pid) + "/stat");
  auto rp = s.rfind(')');
  return rp != std::string::npos && rp + 2 < s.size() && s[rp + 2] != 'Z' && s[rp + 2] != 'X';
}

class ThreadHook : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { daemon_ = start_suite_daemon(); }
  static void TearDownTestSuite() { stop_suite_daemon(daemon_); }
  void SetUp() override {
    SYRUP_REQUIRE_ROOT();
    if (ncpus() < 2) GTEST_SKIP() << "needs 2 cores (one for the scheduled threads, one for the rest)";
    core_ = ncpus() - 1;
  }
  void TearDown() override {
    for (int id : ids_) syr_remove_policy(id);
    ids_.clear();
  }
  int deploy(const std::string& rel, std::vector<syr_param> params, const char* app = "thrtest",
             enum syr_hook hook = SYR_HOOK_THREAD, const std::vector<int>& fds = {}) {
    syr_deploy_opts o{.sz = sizeof o, .app = app, .fds = fds.empty() ? nullptr : fds.data(),
                      .n_fds = fds.size(), .params = params.data(), .n_params = params.size()};
    int id = syr_deploy_policy(source_path(rel).c_str(), hook, &o);
    if (id > 0) ids_.push_back(id);
    return id;
  }
  // Waits until policy `id` is no longer listed (syrupd removed it on its own) and
  // returns what a remove of it now tells its user: "no policy N (... was removed: WHY)".
  std::string removal_reason(int id, int ms = 3000) {
    if (wait_for([&] { return listed(id).is_null(); }, ms) < 0) return "still listed: " + listed(id).dump();
    ids_.erase(std::remove(ids_.begin(), ids_.end(), id), ids_.end());
    if (int r = syr_remove_policy(id); r != -ENOENT) return "remove returned " + std::to_string(r);
    return syr_last_error();
  }
  nlohmann::json listed(int id) {
    std::string out;
    run_cmd(build_bin("syrupctl") + " --socket " + daemon_->socket() + " list --json", out);
    for (auto& p : nlohmann::json::parse(out))
      if (p["id"] == id) return p;
    return {};
  }
  static Daemon* daemon_;
  std::vector<int> ids_;
  int core_ = 1;
};
Daemon* ThreadHook::daemon_ = nullptr;

TEST_F(ThreadHook, DaemonSaysWhichBackendAndWhy) {
  std::string log = daemon_->log();
  if (access("/sys/kernel/sched_ext/state", R_OK) != 0) {
    EXPECT_NE(log.find("sched_ext is absent"), std::string::npos) << log;
  }
  EXPECT_NE(log.find("user-space agent"), std::string::npos) << log;
}

TEST_F(ThreadHook, RegisterBeforeAnyPolicyExplainsWhatIsMissing) {
  syr_set_app("thrtest-none");
  int r = syr_thread_register(0);
  EXPECT_LT(r, 0);
  EXPECT_NE(std::string(syr_last_error()).find("deploy a thread policy"), std::string::npos) << syr_last_error();
}

// Three busy threads on one core: the marked one runs >= 95% of the three's time; moving
// the mark moves the core within a bounded time; an unregistered thread of the
// application on the same core keeps its fair share.
//
// Robust under load: all four threads are measured in the same window (measure()), and
// the fairness checks compare the two normal-class threads on the core (the chosen one
// and the unregistered one) with each other instead of with fixed shares of wall time,
// which other jobs on a CI machine take from (this test used to fail, rarely, when the
// machine was busy: 19.8% < 20% "fair share" with load average 8 on 2 cores).
TEST_F(ThreadHook, MarkedThreadGetsTheCoreAndTheMarkMoves) {
  syr_set_app("thrtest");
  ASSERT_GT(deploy("tests/policies/thread_prio.c", {{"core", uint64_t(core_)}}), 0) << syr_last_error();
  syr_mapped_array high{};
  ASSERT_EQ(mmap_app_map("high", &high), "");
  for (uint32_t i = 0; i < 8; i++) syr_hint_set(&high, i, 0);

  Spinners reg(3, true);
  for (int i = 0; i < 3; i++) ASSERT_EQ(reg.reg_result(i), 0) << syr_last_error();
  Spinners other(1, false);  // unregistered thread of the same application, also on that core
  cpu_set_t s;
  CPU_ZERO(&s);
  CPU_SET(core_, &s);
  ASSERT_EQ(sched_setaffinity(other.tid(0), sizeof s, &s), 0);
  std::vector<clockid_t> clocks = {reg.clock(0), reg.clock(1), reg.clock(2), other.clock(0)};

  syr_hint_set(&high, 0, 1);
  ASSERT_GE(wait_for([&] { return sched_policy_of(reg.tid(0)) == SCHED_OTHER &&
                                  sched_policy_of(reg.tid(1)) == SCHED_IDLE &&
                                  sched_policy_of(reg.tid(2)) == SCHED_IDLE; }, 2000), 0)
      << "the agent did not apply the decision";
  for (int i = 0; i < 3; i++) EXPECT_EQ(cpus_of(reg.tid(i)), std::vector<int>{core_});
  auto m = measure(clocks);
  double sum = m[0] + m[1] + m[2];
  std::printf("  [mark on 0] registered %s unregistered %s\n", fmt({m[0], m[1], m[2]}).c_str(), fmt({m[3]}).c_str());
  ASSERT_GT(sum, 0.0) << "the registered threads did not run at all";
  EXPECT_GE(m[0] / sum, 0.95) << fmt(m);
  // Both normal-class threads on the core get a fair share: neither less than half the other's.
  EXPECT_GE(m[0], 0.5 * m[3]) << "the chosen thread must run as a normal thread: " << fmt(m);
  EXPECT_GE(m[3], 0.5 * m[0]) << "an unregistered thread must keep its fair share: " << fmt(m);

  // Move the mark: thread 2 must have the core within a bounded time (a re-decision period
  // of 5 ms plus the agent's wakeup; 100 ms allows for a busy CI machine).
  syr_hint_set(&high, 0, 0);
  syr_hint_set(&high, 2, 1);
  int ms = wait_for([&] { return sched_policy_of(reg.tid(2)) == SCHED_OTHER &&
                                 sched_policy_of(reg.tid(0)) == SCHED_IDLE; }, 2000);
  std::printf("  mark moved to thread 2: applied after %d ms\n", ms);
  ASSERT_GE(ms, 0);
  EXPECT_LE(ms, 100);
  m = measure(clocks);
  sum = m[0] + m[1] + m[2];
  std::printf("  [mark on 2] registered %s unregistered %s\n", fmt({m[0], m[1], m[2]}).c_str(), fmt({m[3]}).c_str());
  ASSERT_GT(sum, 0.0);
  EXPECT_GE(m[2] / sum, 0.95) << fmt(m);
  EXPECT_GE(m[3], 0.5 * m[2]) << "an unregistered thread must keep its fair share: " << fmt(m);
  syr_map_munmap(&high);
}

// A main thread registers its workers by tid once they have started (a thread that
// registers itself may be kept waiting by the policy before it can say it is ready): the
// marked worker gets the core; a thread registered by another counts its critical
// sections at its executor's syrup_cs element from its next syr_cs_enter() on, even
// though it had looked for its counter before, and no longer once unregistered by tid; a
// thread of another process is refused with the reason.
TEST_F(ThreadHook, MainThreadRegistersItsWorkersByTid) {
  syr_set_app("thrtid");
  ASSERT_GT(deploy("tests/policies/thread_prio.c", {{"core", uint64_t(core_)}}, "thrtid"), 0) << syr_last_error();
  syr_mapped_array high{}, cs{};
  ASSERT_EQ(mmap_app_map("high", &high), "");
  ASSERT_EQ(mmap_app_map("syrup_cs", &cs), "");
  for (uint32_t i = 0; i < 8; i++) syr_hint_set(&high, i, 0);
  syr_hint_set(&high, 1, 1);
  {
    Spinners workers(3, false);
    for (int i = 0; i < 3; i++)
      ASSERT_EQ(syr_thread_register_tid(workers.tid(i), static_cast<uint32_t>(i)), 0) << syr_last_error();
    ASSERT_GE(wait_for([&] { return sched_policy_of(workers.tid(1)) == SCHED_OTHER &&
                                    sched_policy_of(workers.tid(0)) == SCHED_IDLE &&
                                    sched_policy_of(workers.tid(2)) == SCHED_IDLE; }, 2000), 0)
        << "the workers registered by tid were not scheduled by the policy";
    auto m = measure({workers.clock(0), workers.clock(1), workers.clock(2)});
    double sum = m[0] + m[1] + m[2];
    std::printf("  workers registered by the main thread, mark on 1: %s\n", fmt(m).c_str());
    ASSERT_GT(sum, 0.0);
    EXPECT_GE(m[1] / sum, 0.95) << fmt(m);
    for (int i = 0; i < 3; i++) EXPECT_EQ(syr_thread_unregister_tid(workers.tid(i)), 0) << syr_last_error();
  }

  // A thread that takes a step each time `step` moves on: odd steps enter a critical
  // section, even ones leave it.
  std::atomic<int> step{0}, done{0};
  std::atomic<pid_t> tid{0};
  std::thread marker([&] {
    tid = static_cast<pid_t>(syscall(SYS_gettid));
    for (int k = 1; k <= 6; k++) {
      while (step.load() < k) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      if (k % 2) syr_cs_enter(); else syr_cs_exit();
      done = k;
    }
  });
  auto take = [&](int k) {
    step = k;
    return wait_for([&] { return done.load() == k; }, 2000) >= 0;
  };
  struct Join {
    std::thread& t;
    std::atomic<int>& step;
    ~Join() { step = 6; t.join(); }
  } join{marker, step};
  while (tid.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const uint32_t exec = 5;
  ASSERT_TRUE(take(1));
  EXPECT_EQ(syr_hint_get(&cs, exec), 0u) << "an unregistered thread's syr_cs_enter() counted";
  ASSERT_TRUE(take(2));
  ASSERT_EQ(syr_thread_register_tid(tid, exec), 0) << syr_last_error();
  ASSERT_TRUE(take(3));
  EXPECT_EQ(syr_hint_get(&cs, exec), 1u) << "the critical section of a thread registered by tid was not counted";
  ASSERT_TRUE(take(4));
  EXPECT_EQ(syr_hint_get(&cs, exec), 0u);
  ASSERT_EQ(syr_thread_unregister_tid(tid), 0) << syr_last_error();
  ASSERT_TRUE(take(5));
  EXPECT_EQ(syr_hint_get(&cs, exec), 0u) << "a thread unregistered by tid still counts its critical sections";
  std::string out;
  run_cmd(build_bin("syrupctl") + " --socket " + daemon_->socket() + " map dump --app thrtid syrup_threads", out);
  EXPECT_NE(out.find(", 0 entries"), std::string::npos) << "the workers and the marker are still registered: " << out;

  ChildProcess other(1, [] { for (;;) std::this_thread::sleep_for(std::chrono::milliseconds(5)); });
  ASSERT_GT(other.pid(), 0);
  EXPECT_EQ(syr_thread_register_tid(other.pid(), 0), -ESRCH);
  EXPECT_NE(std::string(syr_last_error()).find("not a thread of this process"), std::string::npos) << syr_last_error();
  EXPECT_EQ(syr_thread_unregister_tid(other.pid()), -ESRCH);
  syr_map_munmap(&cs);
  syr_map_munmap(&high);
}

// A registered thread that exits without unregistering leaves syrup_threads within a
// registration scan (the map, 4096 entries, would fill with dead threads, and a new
// thread given a dead one's tid would inherit its registration); an entry naming a live
// thread of another process is not the application's to lose and stays.
TEST_F(ThreadHook, ThreadsThatExitRegisteredLeaveTheRegistrationMap) {
  syr_set_app("threxit");
  ASSERT_GT(deploy("tests/policies/thread_prio.c", {{"core", uint64_t(core_)}}, "threxit"), 0) << syr_last_error();
  // Two threads exit registered: one at once, before a scan sees it, one once the
  // agent schedules it (on core_, where the policy puts it).
  pid_t quick = register_and_exit(3);
  ASSERT_GT(quick, 0) << syr_last_error();
  pid_t scheduled = 0;
  {
    Sleeper s(5);
    ASSERT_EQ(s.reg_result(), 0) << syr_last_error();
    scheduled = s.tid();
    ASSERT_GE(wait_for([&] { return cpus_of(scheduled) == std::vector<int>{core_}; }, 2000), 0)
        << "the agent did not take the registered thread on";
  }
  EXPECT_EQ(exited_registrations_dropped({quick, scheduled}, 2000, 100), "");
}

// A thread that exits registered, and a new thread of the process given its tid before the
// agent has read the exit (tids come round: pid_max is 32768 on small machines). The new
// thread's registration is its own: the old one went at the exit, not when the agent got
// to it. The agent is held (SIGSTOP, for less than its hang limit) over the exit and the
// new registration, so it reads the exit only afterwards; the tid is handed out again
// through /proc/sys/kernel/ns_last_pid, as checkpoint/restore tools do.
TEST_F(ThreadHook, ANewThreadGivenAnExitedThreadsTidKeepsItsRegistration) {
  syr_set_app("threuse");
  int id = deploy("tests/policies/thread_prio.c", {{"core", uint64_t(core_)}}, "threuse");
  ASSERT_GT(id, 0) << syr_last_error();
  pid_t agent = listed(id).value("agent_pid", 0);
  ASSERT_GT(agent, 0) << listed(id).dump();
  struct Held {  // the exited thread's tid, and the thread given it again
    std::atomic<pid_t> tid{0};
    std::atomic<int> reg{1};
    std::atomic<bool> stop{false};
    std::string error;  // syr_last_error() of the registering thread
  } first, second;
  std::thread a([&] {
    first.tid = static_cast<pid_t>(syscall(SYS_gettid));
    int r = syr_thread_register(3);
    first.error = syr_last_error();
    first.reg = r;
    while (!first.stop) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  ASSERT_GE(wait_for([&] { return first.reg != 1; }, 2000), 0);
  pid_t tid = first.tid;
  if (first.reg != 0 || wait_for([&] { return cpus_of(tid) == std::vector<int>{core_}; }, 2000) < 0) {
    first.stop = true;
    a.join();
    FAIL() << "the agent did not take the first thread on: " << first.error;
  }
  std::thread b;
  auto reuse = [&]() -> std::string {
    if (kill(agent, SIGSTOP) != 0) return "cannot stop the agent";
    first.stop = true;
    a.join();
    return thread_with_tid(tid, [&] {
      second.tid = tid;
      int r = syr_thread_register(5);
      second.error = syr_last_error();
      second.reg = r;
      while (!second.stop) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }, b);
  };
  std::string why = reuse();
  if (b.joinable()) wait_for([&] { return second.reg != 1; }, 300);
  kill(agent, SIGCONT);
  auto done = [&] {
    second.stop = true;
    if (b.joinable()) b.join();
    restore_normal(tid);
  };
  if (!why.empty()) {
    done();
    if (why.find(kTidDidNotComeRound) != std::string::npos) GTEST_SKIP() << why;
    FAIL() << why;
  }
  EXPECT_EQ(second.reg, 0) << second.error;
  // Held over both: the agent stays on the job and takes the new thread on.
  int ms = wait_for([&] { return cpus_of(tid) == std::vector<int>{core_}; }, 2000);
  int threads = syr_map_open("syrup_threads");
  uint32_t key = static_cast<uint32_t>(tid), exec = 0;
  bool registered = threads >= 0 && syr_map_lookup_elem(threads, &key, &exec) == 0;
  if (threads >= 0) close(threads);
  std::string status = listed(id).value("status", ""), cpus = cpus_to(tid);
  done();
  EXPECT_TRUE(registered) << "the new thread " << tid << " lost its registration";
  EXPECT_EQ(exec, 5u);
  EXPECT_GE(ms, 0) << "the agent did not take the new thread on (cpus " << cpus << ")";
  EXPECT_EQ(status.find("hung"), std::string::npos) << status;
}

// What an application in a container does, in a pid namespace of its own (with its own
// /proc, as a container mounts it), where its numbers are not the kernel's: it registers a
// thread by its gettid(), and the agent takes that thread on (unregistering gives it
// back); it deploys on its sockets by its own pid, 1, which there is itself, not the
// machine's init. Run in a grandchild that is pid 1 of a new pid namespace; "" or what
// failed.
std::string schedule_in_own_pid_namespace(int core) {
  if (syscall(SYS_gettid) != 1) return "not pid 1 of a new pid namespace";
  if (mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
      mount("proc", "/proc", "proc", 0, nullptr) != 0)
    return std::string("cannot mount the namespace's /proc: ") + std::strerror(errno);
  syr_set_app("thrpidns");  // not the default this process inherited from the test's
  syr_param p{"core", uint64_t(core)};
  syr_deploy_opts o{.sz = sizeof o, .app = "thrpidns", .params = &p, .n_params = 1};
  if (syr_deploy_policy(source_path("tests/policies/thread_prio.c").c_str(), SYR_HOOK_THREAD, &o) <= 0)
    return std::string("deploy: ") + syr_last_error();
  std::atomic<pid_t> tid{0};
  std::atomic<int> reg{1};
  std::atomic<bool> stop{false};
  std::string reg_error;
  std::thread t([&] {
    tid = static_cast<pid_t>(syscall(SYS_gettid));
    int r = syr_thread_register(3);
    reg_error = syr_last_error();
    reg = r;
    while (!stop) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  std::string why;
  wait_for([&] { return reg != 1; }, 2000);
  auto on = [&](std::vector<int> want) { return wait_for([&] { return cpus_of(tid) == want; }, 2000) >= 0; };
  std::vector<int> all;
  for (int c = 0; c < ncpus(); c++) all.push_back(c);
  if (reg != 0)
    why = "register thread " + std::to_string(tid) + ": " + reg_error;
  else if (!on({core}))
    why = "the agent did not take thread " + std::to_string(tid) + " (in the namespace) on: cpus " + cpus_to(tid);
  else if (syr_thread_unregister_tid(tid) != 0)
    why = std::string("unregister: ") + syr_last_error();
  else if (!on(all))
    why = "unregistered, thread " + std::to_string(tid) + " was not given back: cpus " + cpus_to(tid);
  stop = true;
  t.join();
  if (!why.empty()) return why;
  UdpGroup g(2);
  syr_deploy_opts so{.sz = sizeof so, .app = "thrpidns", .pid = getpid(), .port = g.port()};
  if (syr_deploy_policy(source_path("policies/round_robin.c").c_str(), SYR_HOOK_SOCKET_SELECT, &so) <= 0)
    return "deploy with pid " + std::to_string(getpid()) + ": " + syr_last_error();
  UdpClient c(g.port());
  for (int i = 0; i < 40; i++) c.send_request(1, i);
  if (auto got = g.drain(); got != std::vector<int>{20, 20})
    return "round robin over its own sockets split 40 datagrams " + std::to_string(got[0]) + "/" +
           std::to_string(got[1]);
  return "";
}

TEST_F(ThreadHook, AProcessInItsOwnPidNamespaceSchedulesByItsOwnNumbers) {
  // The child enters the namespaces; its child, pid 1 there, is the application.
  std::string why = in_child([&] {
    if (unshare(CLONE_NEWPID | CLONE_NEWNS) != 0) return std::string("SKIP unshare: ") + std::strerror(errno);
    return in_child([&] { return schedule_in_own_pid_namespace(core_); });
  });
  if (why.rfind("SKIP ", 0) == 0) GTEST_SKIP() << why.substr(5);
  EXPECT_EQ(why, "");
}

// syrupd in a pid namespace of its own (a container without the host's pid namespace)
// numbers threads otherwise than the kernel's scheduler hooks: it says so when it starts
// and refuses thread policies with that reason; and a caller outside its namespace, whose
// pid it cannot see (SO_PEERCRED: 0), is told so instead of being served as "pid 0". Run
// in a child that starts syrupd as pid 1 of a new pid namespace; "" or what failed.
std::string syrupd_in_own_pid_namespace() {
  Daemon d;
  d.start();
  if (std::string why = d.answers(); !why.empty()) return "syrupd did not start: " + why;
  syr_set_app("thrownns");  // not the default this process inherited from the test's
  syr_deploy_opts o{.sz = sizeof o, .app = "thrownns"};
  std::string policy = source_path("policies/fifo.c");
  std::string why;
  if (syr_deploy_policy(policy.c_str(), SYR_HOOK_THREAD, &o) > 0)
    why = "a caller syrupd cannot see deployed a policy";
  else if (std::string e = syr_last_error(); e.find("syrupd cannot see the calling process") == std::string::npos)
    why = "a caller outside syrupd's pid namespace was told: " + e;
  // A caller in syrupd's namespace (a child of this process, forked into it).
  if (why.empty())
    why = in_child([&] {
      if (syr_deploy_policy(policy.c_str(), SYR_HOOK_THREAD, &o) > 0)
        return std::string("a thread policy was deployed by a syrupd in a pid namespace of its own");
      std::string e = syr_last_error();
      return e.find("syrupd runs in a pid namespace of its own") == std::string::npos
                 ? "the thread deploy was refused without the reason: " + e
                 : std::string();
    });
  if (why.empty() && d.log().find("thread hook: off: syrupd runs in a pid namespace of its own") == std::string::npos)
    why = "syrupd did not say at start that the thread hook is off: " + d.log();
  if (d.stop() != 0 && why.empty()) why = "syrupd did not exit cleanly: " + d.log();
  return why;
}

TEST_F(ThreadHook, SyrupdInItsOwnPidNamespaceRefusesThreadPoliciesAndSaysWhy) {
  std::string why = in_child([] {
    if (unshare(CLONE_NEWPID) != 0) return std::string("SKIP unshare: ") + std::strerror(errno);
    return syrupd_in_own_pid_namespace();
  });
  if (why.rfind("SKIP ", 0) == 0) GTEST_SKIP() << why.substr(5);
  EXPECT_EQ(why, "");
}

// Cross-layer: the socket-select policy records which executor just got a long request in
// scan_map; the thread policy (get_first) reads the same map and runs the others first.
TEST_F(ThreadHook, CrossLayerLongRequestRunsLast) {
  syr_set_app("thrxl");
  ASSERT_GT(deploy("policies/get_first.c", {{"core", uint64_t(core_)}}, "thrxl"), 0) << syr_last_error();
  UdpGroup g(3);
  ASSERT_GT(deploy("tests/policies/mark_long.c", {}, "thrxl", SYR_HOOK_SOCKET_SELECT, g.fds()), 0)
      << syr_last_error();
  Spinners reg(3, true);
  for (int i = 0; i < 3; i++) ASSERT_EQ(reg.reg_result(i), 0) << syr_last_error();
  UdpClient c(g.port());
  // Executor 0 (the first in FIFO order) gets a long request: 1 and 2 must run first.
  c.send_request(2, 0);
  c.send_request(1, 1);
  c.send_request(1, 2);
  EXPECT_EQ(g.drain(), (std::vector<int>{1, 1, 1}));
  ASSERT_GE(wait_for([&] { return sched_policy_of(reg.tid(0)) == SCHED_IDLE; }, 2000), 0);
  auto sh = reg.shares(1000);
  double sum = sh[0] + sh[1] + sh[2];
  std::printf("  [long on 0] %s\n", fmt(sh).c_str());
  EXPECT_LE(sh[0] / sum, 0.05) << "the thread with the long request must wait: " << fmt(sh);
  // It finishes; executor 1 is handed a long one: now 1 waits.
  c.send_request(1, 0);
  c.send_request(2, 1);
  g.drain();
  ASSERT_GE(wait_for([&] { return sched_policy_of(reg.tid(1)) == SCHED_IDLE; }, 2000), 0);
  sh = reg.shares(1000);
  sum = sh[0] + sh[1] + sh[2];
  std::printf("  [long on 1] %s\n", fmt(sh).c_str());
  EXPECT_LE(sh[1] / sum, 0.05) << fmt(sh);
}

// Wake-ahead (agent backend): a blocked thread that would win its core if it woke now is
// readied before it wakes -- SCHED_OTHER, pinned to that core, with the slice its policy
// gave it as its EEVDF slice -- so its wakeup preempts the running thread without waiting
// for the agent, as the sched_ext backend's preemption kick does. get_first gives threads
// on short requests a 100 us slice; a thread on a long one keeps the kernel's default.
TEST_F(ThreadHook, BlockedShortThreadIsReadiedToPreemptBeforeItWakes) {
  if (!kernel_has_custom_slices())
    GTEST_SKIP() << "this kernel keeps no custom slice for SCHED_OTHER threads (sched_attr.sched_runtime, Linux 6.12+)";
  syr_set_app("thrwake");
  ASSERT_GT(deploy("policies/get_first.c", {{"core", uint64_t(core_)}}, "thrwake"), 0) << syr_last_error();
  syr_mapped_array scan_map{};
  ASSERT_EQ(mmap_app_map("scan_map", &scan_map), "");
  syr_hint_set(&scan_map, 0, 1);  // the spinner is on a long request
  syr_hint_set(&scan_map, 1, 1);  // and so, at first, is the sleeper
  Spinners spin(1, true, 0);
  Sleeper sleeper(1);
  ASSERT_EQ(spin.reg_result(0), 0) << syr_last_error();
  ASSERT_EQ(sleeper.reg_result(), 0) << syr_last_error();
  ASSERT_GE(wait_for([&] { return sched_policy_of(spin.tid(0)) == SCHED_OTHER &&
                                  cpus_of(spin.tid(0)) == std::vector<int>{core_}; }, 2000), 0)
      << "the agent did not give the core to the only runnable thread";
  const int64_t base = slice_of(spin.tid(0));
  EXPECT_GT(base, 100000) << "a thread on a long request keeps the kernel's (longer) slice";
  // Long, blocked: it would lose to the spinner (FIFO within the class), so it is not
  // readied.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_NE(slice_of(sleeper.tid()), 100000);

  // Its long request is done: it would now win, and is readied while still blocked.
  syr_hint_set(&scan_map, 1, 0);
  int ms = wait_for([&] { return slice_of(sleeper.tid()) == 100000 && sched_policy_of(sleeper.tid()) == SCHED_OTHER &&
                                 cpus_of(sleeper.tid()) == std::vector<int>{core_}; }, 2000);
  ASSERT_GE(ms, 0) << "the blocked short thread was not readied: policy " << sched_policy_of(sleeper.tid())
                   << ", slice " << slice_of(sleeper.tid()) << " ns, cores " << cpus_to(sleeper.tid());
  EXPECT_TRUE(sleeper.blocked());
  EXPECT_EQ(sleeper.wakeups(), 0) << "it must have been readied while blocked";
  std::printf("  readied after %d ms, still blocked\n", ms);

  // It wakes (and goes back to sleep): it ran, and the spinner kept its core as it was.
  sleeper.wake();
  ASSERT_GE(wait_for([&] { return sleeper.wakeups() == 1; }, 2000), 0) << "the readied thread did not run";
  EXPECT_EQ(slice_of(spin.tid(0)), base);
  syr_map_munmap(&scan_map);
}

// An agent killed with SIGKILL: the threads are back to normal scheduling within a
// bounded time, syrupd removes the policy and says why (to its user only; another user
// can neither kill the agent nor learn the reason), and a new deploy works afterwards.
TEST_F(ThreadHook, KilledAgentThreadsReturnToNormalScheduling) {
  syr_set_app("thrkill");
  int id = deploy("tests/policies/thread_prio.c", {{"core", uint64_t(core_)}}, "thrkill");
  ASSERT_GT(id, 0) << syr_last_error();
  Spinners reg(3, true);
  ASSERT_GE(wait_for([&] { return sched_policy_of(reg.tid(1)) == SCHED_IDLE; }, 2000), 0);
  auto p = listed(id);
  ASSERT_TRUE(p.contains("agent_pid")) << p.dump();
  pid_t agent = p["agent_pid"].get<pid_t>();
  ASSERT_GT(agent, 0);
  auto attempt = [&] {
    return security::as_user(security::kMallory, [&] {
      int k = kill(agent, SIGKILL) == 0 ? 0 : errno;
      int r = syr_remove_policy(id);
      return nlohmann::json{{"kill", k}, {"remove", r}, {"err", syr_last_error()}};
    });
  };
  auto m = attempt();
  EXPECT_EQ(m.value("kill", -1), EPERM) << m.dump();
  EXPECT_EQ(m.value("remove", 0), -ENOENT) << m.dump();
  EXPECT_EQ(m.value("err", ""), "no policy " + std::to_string(id)) << m.dump();
  ASSERT_TRUE(alive(agent)) << m.dump();
  auto t0 = Clock::now();
  ASSERT_EQ(kill(agent, SIGKILL), 0);
  auto all_normal = [&] {
    for (int i = 0; i < 3; i++)
      if (sched_policy_of(reg.tid(i)) != SCHED_OTHER || int(cpus_of(reg.tid(i)).size()) != ncpus()) return false;
    return true;
  };
  int ms = wait_for(all_normal, 3000);
  std::printf("  agent SIGKILLed: threads normal again after %d ms\n", ms);
  ASSERT_GE(ms, 0) << "threads were not restored";
  EXPECT_LE(ms, 1000);
  (void)t0;
  std::string why = removal_reason(id);
  EXPECT_NE(why.find("no policy " + std::to_string(id) + " (thread_prio.c of app 'thrkill' was removed: thread agent (pid " +
                     std::to_string(agent) + ") killed by signal 9 (Killed); "),
            std::string::npos)
      << why << "\n" << daemon_->log();
  EXPECT_NE(why.find("threads restored to normal scheduling"), std::string::npos) << why;
  EXPECT_NE(daemon_->log().find("removed policy " + std::to_string(id) + " (thread_prio.c) of app 'thrkill': thread agent"),
            std::string::npos)
      << daemon_->log();
  m = attempt();
  EXPECT_EQ(m.value("err", ""), "no policy " + std::to_string(id)) << "the reason is its user's: " << m.dump();
  auto sh = reg.shares(500);
  for (double x : sh) EXPECT_GT(x, 0.1) << "all threads run under the normal scheduler again: " << fmt(sh);

  // The hook is whole again: a new deploy for the same process gets a new agent that
  // schedules the same threads.
  int again = deploy("tests/policies/thread_prio.c", {{"core", uint64_t(core_)}}, "thrkill");
  ASSERT_GT(again, 0) << syr_last_error();
  pid_t agent2 = listed(again).value("agent_pid", 0);
  EXPECT_GT(agent2, 0);
  EXPECT_NE(agent2, agent);
  Spinners reg2(3, true);  // the registrations went with the removed policy's maps
  EXPECT_GE(wait_for([&] { return sched_policy_of(reg2.tid(1)) == SCHED_IDLE || sched_policy_of(reg2.tid(2)) == SCHED_IDLE; }, 2000), 0)
      << "the new policy does not schedule: " << listed(again).dump();
}

// A hung agent (SIGSTOP): syrupd notices the missing heartbeat, kills it and restores.
TEST_F(ThreadHook, HungAgentIsKilledAndThreadsRestored) {
  syr_set_app("thrhang");
  int id = deploy("tests/policies/thread_prio.c", {{"core", uint64_t(core_)}}, "thrhang");
  ASSERT_GT(id, 0) << syr_last_error();
  Spinners reg(2, true);
  ASSERT_GE(wait_for([&] { return sched_policy_of(reg.tid(1)) == SCHED_IDLE; }, 2000), 0);
  pid_t agent = listed(id)["agent_pid"].get<pid_t>();
  ASSERT_EQ(kill(agent, SIGSTOP), 0);
  int ms = wait_for([&] { return sched_policy_of(reg.tid(1)) == SCHED_OTHER; }, 3000);
  std::printf("  agent stopped: threads normal again after %d ms\n", ms);
  ASSERT_GE(ms, 0);
  EXPECT_LE(ms, 1500);
  std::string why = removal_reason(id);
  EXPECT_NE(why.find("was removed: thread agent (pid " + std::to_string(agent) + ") hung (no heartbeat for 500 ms): killed; "),
            std::string::npos)
      << why;
  EXPECT_FALSE(alive(agent)) << "the hung agent was left running";
}

// A packet policy deployed at the thread hook fails with one error, the first line the
// user sees, naming the hooks it is for (the reverse: syrupd/tests/bad_input_test.cpp).
TEST_F(ThreadHook, PacketPolicyIsRefusedNamingTheHooksItIsFor) {
  EXPECT_EQ(deploy("policies/round_robin.c", {}, "thrwrong"), -EINVAL);
  std::string err = syr_last_error(), first = err.substr(0, err.find('\n'));
  EXPECT_NE(first.find("policy round_robin.c does not compile: "), std::string::npos) << err;
  EXPECT_NE(first.find("round_robin.c:6:1: error: static assertion failed"), std::string::npos) << err;
  EXPECT_NE(first.find("deploy it with --hook socket-select or --hook xdp"), std::string::npos) << err;
  EXPECT_EQ(occurrences(err, ": error: "), 1u) << err;
  EXPECT_EQ(occurrences(err, "warning:"), 0u) << err;  // only the assertion
}

// Removing the policy restores the threads at once.
TEST_F(ThreadHook, RemoveRestoresThreads) {
  syr_set_app("thrrm");
  int id = deploy("tests/policies/thread_prio.c", {{"core", uint64_t(core_)}}, "thrrm");
  ASSERT_GT(id, 0) << syr_last_error();
  Spinners reg(2, true);
  ASSERT_GE(wait_for([&] { return sched_policy_of(reg.tid(1)) == SCHED_IDLE; }, 2000), 0);
  ASSERT_EQ(syr_remove_policy(id), 0) << syr_last_error();
  ids_.clear();
  for (int i = 0; i < 2; i++) {
    EXPECT_EQ(sched_policy_of(reg.tid(i)), SCHED_OTHER);
    EXPECT_EQ(int(cpus_of(reg.tid(i)).size()), ncpus());
  }
}

// syrupd --agent_cpus: the agent runs on those CPUs only (off the scheduled threads'
// core), `list` says so (also after a restarted syrupd adopted the agent), and a list
// that is not one, or names a CPU that is not online, stops syrupd at start with a
// message naming the flag.
TEST_F(ThreadHook, AgentRunsOnTheCpusSyrupdIsGiven) {
  std::string out;
  EXPECT_EQ(run_cmd(build_bin("syrupd") + " --agent_cpus=0-x", out), 2);
  EXPECT_NE(out.find("--agent_cpus: '0-x' is not a CPU list"), std::string::npos) << out;
  EXPECT_EQ(run_cmd(build_bin("syrupd") + " --agent_cpus=" + std::to_string(ncpus()), out), 2);
  EXPECT_NE(out.find("is not online"), std::string::npos) << out;

  const int agent_cpu = core_ == 0 ? 1 : 0;
  Daemon d;
  d.start("", {"--agent_cpus=" + std::to_string(agent_cpu)});
  struct Back {  // libsyrup back to the suite's daemon, however this test ends
    ~Back() { setenv("SYRUP_SOCKET", daemon_->socket().c_str(), 1); }
  } back;
  syr_set_app("thrcpus");
  syr_deploy_opts o{.sz = sizeof o, .app = "thrcpus"};
  int id = syr_deploy_policy(source_path("policies/fifo.c").c_str(), SYR_HOOK_THREAD, &o);
  ASSERT_GT(id, 0) << syr_last_error();
  run_cmd(build_bin("syrupctl") + " --socket " + d.socket() + " list --json", out);
  nlohmann::json p;
  for (auto& e : nlohmann::json::parse(out))
    if (e["id"] == id) p = e;
  if (p.value("backend", "") != "agent") {
    syr_remove_policy(id);
    GTEST_SKIP() << "the thread hook runs in sched_ext here: no agent to place";
  }
  EXPECT_EQ(p.value("agent_cpus", ""), std::to_string(agent_cpu)) << p.dump();
  pid_t agent = p.value("agent_pid", 0);
  ASSERT_GT(agent, 0) << p.dump();
  EXPECT_EQ(cpus_of(agent), std::vector<int>{agent_cpu});

  // A syrupd restarted without the flag adopts the agent where it runs, and says so.
  d.crash();
  d.start(d.bpffs_root());
  run_cmd(build_bin("syrupctl") + " --socket " + d.socket() + " list --json", out);
  nlohmann::json q;
  for (auto& e : nlohmann::json::parse(out))
    if (e["id"] == id) q = e;
  EXPECT_EQ(q.value("adopted", false), true) << q.dump() << "\n" << d.log();
  EXPECT_EQ(q.value("agent_pid", 0), agent) << q.dump();
  EXPECT_EQ(q.value("agent_cpus", ""), std::to_string(agent_cpu)) << q.dump();
  EXPECT_EQ(cpus_of(agent), std::vector<int>{agent_cpu});
  EXPECT_EQ(syr_remove_policy(id), 0) << syr_last_error();
  EXPECT_EQ(d.stop(), 0) << d.log();
}

// An unmodified process: syrupctl deploy --hook thread --pid PID schedules all its threads.
TEST_F(ThreadHook, SyrupctlDeploysForAnUnmodifiedProcess) {
  ChildProcess proc(3, [] { for (;;) {} });
  pid_t child = proc.pid();
  ASSERT_GT(child, 0);
  std::string out;
  int rc = run_cmd(build_bin("syrupctl") + " --socket " + daemon_->socket() + " deploy --hook thread --pid " +
                       std::to_string(child) + " --app thrpid --params core=" + std::to_string(core_) + " " +
                       source_path("tests/policies/thread_prio.c"),
                   out);
  ASSERT_EQ(rc, 0) << out;
  std::vector<pid_t> tids = proc.tids();
  ASSERT_EQ(tids.size(), 4u);
  // The three spinners: all pinned to the core, exactly one chosen.
  int chosen = 0, idle = 0;
  wait_for([&] {
    chosen = idle = 0;
    for (pid_t t : tids) {
      if (t == child) continue;
      if (cpus_of(t) != std::vector<int>{core_}) return false;
      int p = sched_policy_of(t);
      chosen += p == SCHED_OTHER;
      idle += p == SCHED_IDLE;
    }
    return chosen == 1 && idle == 2;
  }, 2000);
  EXPECT_EQ(chosen, 1);
  EXPECT_EQ(idle, 2);
  run_cmd(build_bin("syrupctl") + " --socket " + daemon_->socket() + " map dump --app thrpid syrup_threads", out);
  EXPECT_NE(out.find("4 entries"), std::string::npos) << out;
}

// The core a thread last ran on (field 39 of /proc/self/task/TID/stat).
int last_cpu(pid_t tid) {
  std::string st = read_text("/proc/self/task/" + std::to_string(tid) + "/stat");
  auto rp = st.rfind(')');
  if (rp == std::string::npos) return -1;
  std::istringstream ss(st.substr(rp + 2));
  std::string f;
  for (int i = 3; ss >> f; i++)
    if (i == 39) return std::stoi(f);
  return -1;
}

// locality.c: a thread runs on the core its executor's traffic is steered to
// (exec_core = core + 1), follows the steering when it changes, and without steering
// stays on the core it last ran on.
TEST_F(ThreadHook, LocalityKeepsThreadsOnTheirSteeredCore) {
  syr_set_app("thrloc");
  ASSERT_GT(deploy("policies/locality.c", {}, "thrloc"), 0) << syr_last_error();
  syr_mapped_array ec{};
  ASSERT_EQ(mmap_app_map("exec_core", &ec), "");
  syr_hint_set(&ec, 0, uint64_t(core_) + 1);  // executor 0's packets go to the last core
  syr_hint_set(&ec, 1, 0 + 1);                // executor 1's to core 0
  Spinners reg(2, true);
  for (int i = 0; i < 2; i++) ASSERT_EQ(reg.reg_result(i), 0) << syr_last_error();
  ASSERT_GE(wait_for([&] { return cpus_of(reg.tid(0)) == std::vector<int>{core_} &&
                                  cpus_of(reg.tid(1)) == std::vector<int>{0} &&
                                  sched_policy_of(reg.tid(0)) == SCHED_OTHER &&
                                  sched_policy_of(reg.tid(1)) == SCHED_OTHER; }, 2000), 0)
      << "threads not placed on their steered cores: " << cpus_to(reg.tid(0)) << " / " << cpus_to(reg.tid(1));
  auto m = measure({reg.clock(0), reg.clock(1)});
  std::printf("  steered to %d and 0: ran %s on cores %d and %d\n", core_, fmt(m).c_str(), last_cpu(reg.tid(0)),
              last_cpu(reg.tid(1)));
  EXPECT_EQ(last_cpu(reg.tid(0)), core_);
  EXPECT_EQ(last_cpu(reg.tid(1)), 0);
  EXPECT_GT(m[0], 0.0) << "each alone on its core, both run: " << fmt(m);
  EXPECT_GT(m[1], 0.0) << fmt(m);

  // The steering of executor 0 moves to core 0: its thread follows within a bounded time,
  // and the two now share core 0 in FIFO order (one runs, one waits).
  syr_hint_set(&ec, 0, 0 + 1);
  int ms = wait_for([&] { return cpus_of(reg.tid(0)) == std::vector<int>{0}; }, 2000);
  std::printf("  steering of executor 0 moved to core 0: followed after %d ms\n", ms);
  ASSERT_GE(ms, 0);
  EXPECT_LE(ms, 100);
  EXPECT_GE(wait_for([&] { return (sched_policy_of(reg.tid(0)) == SCHED_OTHER) !=
                                  (sched_policy_of(reg.tid(1)) == SCHED_OTHER); }, 2000), 0)
      << "two threads bound to one core: exactly one runs as a normal thread";

  // No steering: each stays on the core it last ran on (pinned there, not spread by the
  // kernel's balancing).
  syr_hint_set(&ec, 0, 0);
  syr_hint_set(&ec, 1, 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  for (int i = 0; i < 2; i++) {
    auto c = cpus_of(reg.tid(i));
    EXPECT_EQ(c.size(), 1u) << "thread " << i << " allowed on " << cpus_to(reg.tid(i));
    if (c.size() == 1) {
      EXPECT_EQ(c[0], last_cpu(reg.tid(i))) << "thread " << i;
    }
  }
  syr_map_munmap(&ec);
}

// cs_aware.c: fair among the application's threads, except that a thread inside a
// critical section is never the one kept waiting. Three busy threads on two cores take
// turns (the one that ran least goes first): each waits now and then. A thread inside a
// critical section (its syrup_cs word, as syr_cs_enter() writes it; max_extension_ns is
// large here) is never made to wait while the other two keep taking turns; the
// protection follows the critical section to another thread.
//
// Asserted on the agent's decisions (a waiting thread is SCHED_IDLE), sampled every
// 2 ms, not on CPU shares: shares of threads on different cores depend on what else
// runs on each core.
TEST_F(ThreadHook, CsAwareNeverMakesAThreadInACriticalSectionWait) {
  if (ncpus() != 2) GTEST_SKIP() << "written for 2 cores (3 threads, one waits at a time)";
  syr_set_app("thrcs");
  ASSERT_GT(deploy("policies/cs_aware.c", {{"max_extension_ns", uint64_t(100'000'000'000ull)}}, "thrcs"), 0)
      << syr_last_error();
  Spinners reg(3, true);
  for (int i = 0; i < 3; i++) ASSERT_EQ(reg.reg_result(i), 0) << syr_last_error();
  // For `ms`, sample who waits: waited[i] counts samples with thread i SCHED_IDLE.
  auto waits = [&](int ms) {
    std::vector<int> waited(3, 0);
    auto until = Clock::now() + std::chrono::milliseconds(ms);
    while (Clock::now() < until) {
      for (int i = 0; i < 3; i++) waited[i] += sched_policy_of(reg.tid(i)) == SCHED_IDLE;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return waited;
  };
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  auto w = waits(1000);
  std::printf("  outside critical sections, samples waiting: %d %d %d (of ~500)\n", w[0], w[1], w[2]);
  EXPECT_GT(w[0] + w[1] + w[2], 0) << "three busy threads on two cores: one waits at a time";

  syr_mapped_array cs{};
  ASSERT_EQ(mmap_app_map("syrup_cs", &cs), "");
  syr_hint_set(&cs, 2, 1);  // thread 2 enters a critical section
  int ms = wait_for([&] { return sched_policy_of(reg.tid(2)) == SCHED_OTHER; }, 2000);
  ASSERT_GE(ms, 0);
  EXPECT_LE(ms, 100) << "a waiting thread that is inside a critical section runs within a re-decision";
  w = waits(1000);
  std::printf("  thread 2 in a critical section (runs after %d ms), samples waiting: %d %d %d\n", ms, w[0], w[1], w[2]);
  EXPECT_EQ(w[2], 0) << "a thread inside a critical section was made to wait";
  EXPECT_GT(w[0] + w[1], 0) << "the two others take turns";

  // The critical section moves to thread 0: thread 0's mark first, then thread 2's
  // cleared, so no decision made after the move sees neither protected. The measurement
  // starts once the agent has acted on the move -- thread 2, which never waited while
  // protected, is made to wait -- not when thread 0 is seen running: it usually already
  // was, and a decision taken from the hints before the move could still be applied
  // (a CI run caught thread 0 waiting in 2 samples that way).
  syr_hint_set(&cs, 0, 1);
  syr_hint_set(&cs, 2, 0);
  ASSERT_GE(wait_for([&] { return sched_policy_of(reg.tid(2)) == SCHED_IDLE; }, 2000), 0)
      << "the two unprotected threads take turns: thread 2 must wait at some point";
  ASSERT_GE(wait_for([&] { return sched_policy_of(reg.tid(0)) == SCHED_OTHER; }, 2000), 0);
  w = waits(1000);
  std::printf("  thread 0 in a critical section instead, samples waiting: %d %d %d\n", w[0], w[1], w[2]);
  EXPECT_EQ(w[0], 0) << "a thread inside a critical section was made to wait";
  EXPECT_GT(w[1] + w[2], 0);
  syr_map_munmap(&cs);
}

// Restarts the suite's syrupd (on the same pins and state file) when a test that crashed
// it ends, even on a failed assertion, so the tests after it have a daemon.
struct Restart {
  Daemon* d;
  ~Restart() {
    if (d->pid() <= 0) d->start(d->bpffs_root());
  }
};

// Item 1 of issue #4: syrupd SIGKILLed and restarted. The agent is its own process (own
// session, no parent-death signal): it goes on enforcing the policy while no syrupd runs,
// the restarted syrupd adopts it (same policy id, same agent pid, `list` says adopted),
// the policy still enforces (the marked thread >= 95% of the three's time on the shared
// core), hints still move the core, and the adopted agent's watchdog and removal work as
// for one syrupd started itself.
TEST_F(ThreadHook, AgentOutlivesSyrupdCrashAndIsAdoptedAfterRestart) {
  syr_set_app("thrcrash");
  int id = deploy("tests/policies/thread_prio.c", {{"core", uint64_t(core_)}}, "thrcrash");
  ASSERT_GT(id, 0) << syr_last_error();
  syr_mapped_array high{};
  ASSERT_EQ(mmap_app_map("high", &high), "");
  for (uint32_t i = 0; i < 8; i++) syr_hint_set(&high, i, 0);
  Spinners reg(3, true);
  for (int i = 0; i < 3; i++) ASSERT_EQ(reg.reg_result(i), 0) << syr_last_error();
  std::vector<clockid_t> clocks = {reg.clock(0), reg.clock(1), reg.clock(2)};
  syr_hint_set(&high, 0, 1);
  ASSERT_GE(wait_for([&] { return sched_policy_of(reg.tid(0)) == SCHED_OTHER &&
                                  sched_policy_of(reg.tid(1)) == SCHED_IDLE &&
                                  sched_policy_of(reg.tid(2)) == SCHED_IDLE; }, 2000), 0);
  auto before = listed(id);
  pid_t agent = before.value("agent_pid", 0);
  ASSERT_GT(agent, 0) << before.dump();

  Restart restart{daemon_};
  daemon_->crash();
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  ASSERT_TRUE(alive(agent)) << "the agent ended with syrupd";
  auto m = measure(clocks);
  double sum = m[0] + m[1] + m[2];
  std::printf("  syrupd down: registered %s\n", fmt(m).c_str());
  ASSERT_GT(sum, 0.0);
  EXPECT_GE(m[0] / sum, 0.95) << "the policy stops while syrupd is down: " << fmt(m);

  daemon_->start(daemon_->bpffs_root());
  auto after = listed(id);
  ASSERT_FALSE(after.is_null()) << "the thread policy was not adopted:\n" << daemon_->log();
  EXPECT_EQ(after.value("hook", ""), "thread");
  EXPECT_EQ(after.value("agent_pid", 0), agent) << after.dump();
  EXPECT_EQ(after.value("adopted", false), true) << after.dump();
  EXPECT_EQ(after.value("status", ""), "running") << after.dump();
  EXPECT_EQ(after.value("target", ""), before.value("target", "x"));
  m = measure(clocks);
  sum = m[0] + m[1] + m[2];
  std::printf("  after the restart: registered %s\n", fmt(m).c_str());
  ASSERT_GT(sum, 0.0);
  EXPECT_GE(m[0] / sum, 0.95) << fmt(m);

  syr_hint_set(&high, 0, 0);
  syr_hint_set(&high, 2, 1);
  int ms = wait_for([&] { return sched_policy_of(reg.tid(2)) == SCHED_OTHER &&
                                 sched_policy_of(reg.tid(0)) == SCHED_IDLE; }, 2000);
  std::printf("  mark moved after the restart: applied after %d ms\n", ms);
  EXPECT_GE(ms, 0);

  // The adopted agent's watchdog: killed, the threads come back within a bounded time.
  ASSERT_EQ(kill(agent, SIGKILL), 0);
  auto all_normal = [&] {
    for (int i = 0; i < 3; i++)
      if (sched_policy_of(reg.tid(i)) != SCHED_OTHER || int(cpus_of(reg.tid(i)).size()) != ncpus()) return false;
    return true;
  };
  ms = wait_for(all_normal, 3000);
  std::printf("  adopted agent SIGKILLed: threads normal again after %d ms\n", ms);
  ASSERT_GE(ms, 0) << "threads were not restored";
  EXPECT_LE(ms, 1000);
  std::string why = removal_reason(id);
  EXPECT_NE(why.find("was removed: thread agent (pid " + std::to_string(agent) +
                     ") exited (exit status unknown: it was started by a previous syrupd)"),
            std::string::npos)
      << why;
  syr_map_munmap(&high);
}

// The agent dies while no syrupd watches it: the restarted syrupd restores the threads at
// once and reports it. A policy removed after an adoption stops its agent and restores.
TEST_F(ThreadHook, AgentGoneWhileSyrupdDownThreadsRestoredOnRestart) {
  syr_set_app("thrgone");
  int id = deploy("tests/policies/thread_prio.c", {{"core", uint64_t(core_)}}, "thrgone");
  ASSERT_GT(id, 0) << syr_last_error();
  Spinners reg(2, true);
  for (int i = 0; i < 2; i++) ASSERT_EQ(reg.reg_result(i), 0) << syr_last_error();
  ASSERT_GE(wait_for([&] { return sched_policy_of(reg.tid(0)) == SCHED_IDLE || sched_policy_of(reg.tid(1)) == SCHED_IDLE; }, 2000), 0)
      << listed(id).dump() << "\n" << daemon_->log();
  int waiting = sched_policy_of(reg.tid(0)) == SCHED_IDLE ? 0 : 1;
  pid_t agent = listed(id).value("agent_pid", 0);
  ASSERT_GT(agent, 0);
  {
    Restart restart{daemon_};
    daemon_->crash();
    ASSERT_TRUE(alive(agent));
    ASSERT_EQ(kill(agent, SIGKILL), 0);
    ASSERT_GE(wait_for([&] { return !alive(agent); }, 2000), 0);
    // Nobody restores while syrupd is down: the window lasts until it is back.
    EXPECT_EQ(sched_policy_of(reg.tid(waiting)), SCHED_IDLE);
    daemon_->start(daemon_->bpffs_root());
  }
  for (int i = 0; i < 2; i++) {
    EXPECT_EQ(sched_policy_of(reg.tid(i)), SCHED_OTHER) << "thread " << i;
    EXPECT_EQ(int(cpus_of(reg.tid(i)).size()), ncpus()) << "thread " << i;
  }
  std::string why = removal_reason(id);
  EXPECT_NE(why.find("was removed: thread agent (pid " + std::to_string(agent) +
                     ") ended while syrupd was down; 2 threads restored to normal scheduling when syrupd restarted"),
            std::string::npos)
      << why;

  // A fresh deploy after that (new threads: the registrations went with the app's maps),
  // crash, restart, remove: the adopted agent stops and the threads are restored.
  id = deploy("tests/policies/thread_prio.c", {{"core", uint64_t(core_)}}, "thrgone");
  ASSERT_GT(id, 0) << syr_last_error();
  Spinners reg2(2, true);
  ASSERT_GE(wait_for([&] { return sched_policy_of(reg2.tid(0)) == SCHED_IDLE || sched_policy_of(reg2.tid(1)) == SCHED_IDLE; }, 2000), 0);
  agent = listed(id).value("agent_pid", 0);
  {
    Restart restart{daemon_};
    daemon_->crash();
    daemon_->start(daemon_->bpffs_root());
  }
  ASSERT_EQ(listed(id).value("agent_pid", 0), agent) << daemon_->log();
  ASSERT_EQ(syr_remove_policy(id), 0) << syr_last_error();
  ids_.clear();
  for (int i = 0; i < 2; i++) EXPECT_EQ(sched_policy_of(reg2.tid(i)), SCHED_OTHER) << "thread " << i;
  EXPECT_GE(wait_for([&] { return !alive(agent); }, 2000), 0) << "the adopted agent was not stopped";
}

// The same policy source on the sched_ext backend needs a sched_ext kernel: the VM test
// (ctest -R vm) runs it; here it is skipped with the reason.
TEST_F(ThreadHook, SchedExtBackendRunsInTheVmTest) {
  if (access("/sys/kernel/sched_ext/state", R_OK) != 0)
    GTEST_SKIP() << "this kernel has no sched_ext (CONFIG_SCHED_CLASS_EXT unset): the sched_ext backend "
                    "is tested by the VM test (tests/vm), the agent backend by the tests above";
}

}  // namespace
}  // namespace syrup::test
