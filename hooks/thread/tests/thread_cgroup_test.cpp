// A thread policy deployed by cgroup (docs/protocol.md "cgroup", hooks/thread/thread_hook.h),
// agent backend, end to end: a cgroup v2 made by the test (TestCgroup) holds spinning
// processes; thread_prio.c pins every thread it schedules to one core, where exactly one
// runs (SCHED_OTHER) and the rest wait as SCHED_IDLE. So a thread's affinity and class
// say whether the policy took it. Checked: the cgroup's process, a thread it starts after
// the deploy, a child it forks, a process moved in after the deploy; not a process of
// another user moved in (the policy schedules its owner's uid only); a process moved out
// is restored; removing the cgroup ends the policy, listed with why. As Mallory: her policy
// by her own cgroup leaves Alice's process alone when root moves it in, and Alice's cgroup
// is refused in the words of a missing one.
#include <sched.h>
#include <sys/wait.h>

#include <fstream>

#include "cgroup_spinners.h"
#include "harness.h"
#include "security/security.h"
#include "test_cgroup.h"

namespace syrup::test {
namespace {

using nlohmann::json;
using security::kAlice;
using security::kMallory;

std::vector<int> cpus_of(pid_t tid) {
  cpu_set_t set;
  std::vector<int> out;
  if (sched_getaffinity(tid, sizeof set, &set)) return out;
  for (int c = 0; c < CPU_SETSIZE; c++)
    if (CPU_ISSET(c, &set)) out.push_back(c);
  return out;
}

// `tids` are scheduled by thread_prio.c on `core`: all pinned there, one running
// (SCHED_OTHER), the rest SCHED_IDLE.
bool scheduled(const std::vector<pid_t>& tids, int core) {
  int chosen = 0, idle = 0;
  for (pid_t t : tids) {
    if (cpus_of(t) != std::vector<int>{core}) return false;
    chosen += sched_getscheduler(t) == SCHED_OTHER;
    idle += sched_getscheduler(t) == SCHED_IDLE;
  }
  return chosen == 1 && idle == static_cast<int>(tids.size()) - 1;
}

// `tids` run as the kernel runs them: SCHED_OTHER on the cores this test may use.
bool untouched(const std::vector<pid_t>& tids) {
  for (pid_t t : tids)
    if (sched_getscheduler(t) != SCHED_OTHER || cpus_of(t) != cpus_of(getpid())) return false;
  return !tids.empty();
}

class ThreadCgroup : public ::testing::Test {
 protected:
  void SetUp() override {
    SYRUP_REQUIRE_ROOT();
    ncpu_ = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
    if (ncpu_ < 2) GTEST_SKIP() << "needs 2 cores (one for the scheduled threads, one for the rest)";
    if (!cg_.why.empty()) GTEST_SKIP() << "cannot make a test cgroup v2: " << cg_.why;
    s_ = shared_page();
    ASSERT_NE(s_, nullptr);
    daemon_.start();
  }
  void TearDown() override {
    for (pid_t p : procs_) kill(p, SIGKILL);
    for (pid_t p : procs_) waitpid(p, nullptr, 0);
    if (s_) munmap(s_, sizeof *s_);
  }
  pid_t start(uid_t uid, int n, bool first = false) {
    pid_t p = spinner(s_, uid, n, first);
    procs_.push_back(p);
    return p;
  }
  // Waits until `n` spinning threads have reported.
  bool spinning(int n, int timeout_ms = 5000) {
    return wait_for([&] { return s_->ntids >= n; }, timeout_ms) >= 0;
  }
  std::string deploy_args() const {
    return "deploy --hook thread --cgroup " + cg_.path("ctr") + " --params core=" + std::to_string(ncpu_ - 1) + " " +
           source_path("tests/policies/thread_prio.c");
  }
  std::string syrupctl(const std::string& args, int& rc) {
    std::string out;
    rc = run_cmd(build_bin("syrupctl") + " --socket " + daemon_.socket() + " " + args, out);
    return out;
  }
  json syrupctl_as(uid_t uid, const std::string& args) {
    return as_user(uid, [&] {
      std::string out;
      int rc = run_cmd(build_bin("syrupctl") + " --socket " + daemon_.socket() + " " + args, out);
      return json{{"rc", rc}, {"out", out}};
    });
  }
  TestCgroup cg_{std::vector<std::string>{"ctr", "out", "alice"}};
  Daemon daemon_;
  Shared* s_ = nullptr;
  std::vector<pid_t> procs_;
  int ncpu_ = 0;
};

TEST_F(ThreadCgroup, SchedulesEveryProcessOfItsUserInTheCgroupThoseThatJoinLaterIncludedUntilItGoes) {
  int core = ncpu_ - 1;
  pid_t a = start(0, 2, /*first=*/true);
  ASSERT_TRUE(cg_.join("ctr", a));
  ASSERT_TRUE(spinning(2));
  int rc;
  std::string out = syrupctl(deploy_args() + " --app cgthreads", rc);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_GE(wait_for([&] { return scheduled(spinners(s_), core); }, 3000), 0) << "the first process's two threads";

  // After the deploy: a thread and a child process of the first, a process moved in.
  // The first process's main thread, which starts them, is under the policy too: SCHED_IDLE
  // behind the chosen spinner on the one core, about 0.3% of it (less with other work
  // there), and the thread and child it starts begin the same way: seconds, not ms.
  s_->more = 1;
  pid_t b = start(0, 1);
  ASSERT_TRUE(spinning(5, 30000));
  ASSERT_TRUE(cg_.join("ctr", b));
  EXPECT_GE(wait_for([&] { return scheduled(spinners(s_), core) && spinners(s_).size() == 5; }, 3000), 0)
      << "the new thread, the forked child's and the moved-in process's: 5 threads on core " << core;

  // Another user's process moved in (by root) is not taken: it is not the owner's uid.
  pid_t m = start(kMallory, 1);
  ASSERT_TRUE(spinning(6));
  std::vector<pid_t> theirs = spinners(s_, {m});
  ASSERT_EQ(theirs.size(), 1u);
  ASSERT_GE(wait_for([&] { return owner_of(m) == kMallory; }, 2000), 0);
  ASSERT_TRUE(cg_.join("ctr", m));
  usleep(300 * 1000);  // 15 of the agent's scans of the cgroup
  EXPECT_TRUE(untouched(theirs)) << "uid " << kMallory << "'s thread " << theirs[0] << " was taken";
  std::vector<pid_t> ours = spinners(s_);
  ours.erase(std::find(ours.begin(), ours.end(), theirs[0]));
  EXPECT_TRUE(scheduled(ours, core));

  // Moved out, a process is the kernel's again; removed, the cgroup ends the policy.
  std::ifstream procs(cg_.dir("ctr") + "/cgroup.procs");
  for (pid_t p; procs >> p;) ASSERT_TRUE(cg_.join("out", p));
  EXPECT_GE(wait_for([&] { return untouched(spinners(s_)); }, 3000), 0) << "threads moved out are restored";
  ASSERT_EQ(rmdir(cg_.dir("ctr").c_str()), 0) << strerror(errno);
  std::string why = "cgroup " + cg_.path("ctr") + " was removed";
  EXPECT_GE(wait_for([&] { return syrupctl("list", rc).find(why) != std::string::npos; }, 3000), 0)
      << syrupctl("list", rc);
}

// Mallory deploys by her own cgroup; root then moves Alice's process into it. Alice's
// threads stay as the kernel runs them while Mallory's are scheduled. Alice's cgroup is
// refused to Mallory in the words of a cgroup that does not exist.
TEST_F(ThreadCgroup, ATenantsPolicyNeverTakesAnotherUsersProcessMovedIntoItsCgroup) {
  int core = ncpu_ - 1;
  pid_t mine = start(kMallory, 2);
  ASSERT_TRUE(spinning(2));
  ASSERT_GE(wait_for([&] { return owner_of(mine) == kMallory; }, 2000), 0);
  ASSERT_TRUE(cg_.join("ctr", mine));
  json d = syrupctl_as(kMallory, deploy_args() + " --app mallorycg");
  ASSERT_EQ(d.value("rc", -1), 0) << d.dump();
  EXPECT_GE(wait_for([&] { return scheduled(spinners(s_, {mine}), core); }, 3000), 0) << "Mallory's own threads";

  pid_t hers = start(kAlice, 1);
  ASSERT_TRUE(spinning(3));
  ASSERT_GE(wait_for([&] { return owner_of(hers) == kAlice; }, 2000), 0);
  ASSERT_TRUE(cg_.join("ctr", hers));
  usleep(300 * 1000);
  EXPECT_TRUE(untouched(spinners(s_, {hers}))) << "Alice's thread was scheduled by Mallory's policy";
  EXPECT_TRUE(scheduled(spinners(s_, {mine}), core));

  // Alice's own cgroup, named by Mallory: refused as one that does not exist.
  pid_t alone = start(kAlice, 0);
  ASSERT_GE(wait_for([&] { return owner_of(alone) == kAlice; }, 2000), 0);
  ASSERT_TRUE(cg_.join("alice", alone));
  std::string args = "deploy --hook thread --app mallory2 " + source_path("tests/policies/thread_prio.c");
  json theirs = syrupctl_as(kMallory, args + " --cgroup " + cg_.path("alice"));
  json none = syrupctl_as(kMallory, args + " --cgroup " + cg_.path("nothing"));
  EXPECT_NE(theirs.value("rc", 0), 0) << theirs.dump();
  std::string t = theirs.value("out", ""), n = none.value("out", "");
  for (auto* s : {&t, &n})
    for (const std::string& p : {cg_.path("alice"), cg_.path("nothing")})
      if (size_t at = s->find(p); at != std::string::npos) s->replace(at, p.size(), "X");
  EXPECT_EQ(t, n);
  EXPECT_NE(t.find("no cgroup by that path holds processes that are all the caller's"), std::string::npos) << t;
}

}  // namespace
}  // namespace syrup::test
