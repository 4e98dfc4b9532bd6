// Spinning processes for the thread hook's tests by cgroup (thread_cgroup_test.cpp on the
// agent backend, thread_scx_test.cpp in the sched_ext VM): forked processes of a chosen
// uid whose spinning threads report their tid and process in a page shared with the test.
#pragma once

#include <grp.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <new>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace syrup::test {

constexpr int kMaxTids = 32;

// What the spinning processes and the test share (a MAP_SHARED page made before fork).
struct Shared {
  std::atomic<int> ntids{0};
  std::atomic<pid_t> tids[kMaxTids]{};  // spinning threads, and the process they are in
  std::atomic<pid_t> tgids[kMaxTids]{};
  std::atomic<int> more{0};  // the first process: start one more thread and fork a child
};

inline Shared* shared_page() {
  void* p = mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? nullptr : new (p) Shared();
}

inline void spin(Shared* s) {
  int i = s->ntids++;
  if (i < kMaxTids) {
    s->tgids[i] = getpid();
    s->tids[i] = static_cast<pid_t>(syscall(SYS_gettid));
  }
  for (;;) {
  }
}

// A process (of `uid`, dumpable so that /proc/PID is that user's) spinning `n` threads; its
// main thread waits. With `first`, it starts one more thread and forks a child spinning one
// once s->more is set. Killed by the test.
// Each process dies with its parent (PR_SET_PDEATHSIG, set after the change of uid, which
// clears it, and checked against a parent that died first): a spinner the test did not
// reap (a ctest timeout) would otherwise take a core for the rest of the suite.
inline void die_with(pid_t parent) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(0);
}

inline pid_t spinner(Shared* s, uid_t uid, int n, bool first = false) {
  pid_t test = getpid();
  pid_t pid = fork();
  if (pid != 0) return pid;
  if (uid && (setgroups(0, nullptr) || setresgid(uid, uid, uid) || setresuid(uid, uid, uid))) _exit(1);
  die_with(test);
  prctl(PR_SET_DUMPABLE, 1);
  for (int i = 0; i < n; i++) std::thread(spin, s).detach();
  while (first && !s->more) usleep(1000);
  if (first) {
    std::thread(spin, s).detach();
    pid_t self = getpid();
    if (fork() == 0) {
      die_with(self);
      std::thread(spin, s).detach();
      for (;;) pause();
    }
  }
  for (;;) pause();
}

// The spinning threads of the processes in `of` (all, if empty).
inline std::vector<pid_t> spinners(const Shared* s, const std::set<pid_t>& of = {}) {
  std::vector<pid_t> out;
  for (int i = 0; i < std::min(s->ntids.load(), kMaxTids); i++)
    if (s->tids[i] && (of.empty() || of.count(s->tgids[i]))) out.push_back(s->tids[i]);
  return out;
}

// The uid owning /proc/PID (as syrupd reads it), or -1.
inline uid_t owner_of(pid_t pid) {
  struct stat st;
  return stat(("/proc/" + std::to_string(pid)).c_str(), &st) == 0 ? st.st_uid : static_cast<uid_t>(-1);
}

}  // namespace syrup::test
