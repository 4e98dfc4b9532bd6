// struct sched_attr as sched_getattr(2)/sched_setattr(2) take it, and the two calls.
//
// One definition for every part that sets scheduling attributes directly: the thread
// hook's user-space agent (SCHED_OTHER/SCHED_IDLE, nice, EEVDF slice), the RocksDB
// example's workers (a slice, a SCHED_DEADLINE core share) and the tests that check
// them. Linux's own definition (linux/sched/types.h) clashes with glibc's <sched.h>, and
// glibc has no wrapper before 2.41.
// Layout: SCHED_ATTR_SIZE_VER1 (56 bytes, utilization clamps included). For SCHED_OTHER,
// sched_runtime is the EEVDF slice (Linux 6.12+; sched_getattr reports the custom slice
// or the kernel's base slice); for SCHED_DEADLINE, the reservation.
#pragma once

#include <sched.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>

namespace syrup {

struct SchedAttr {
  uint32_t size = sizeof(SchedAttr);
  uint32_t sched_policy = SCHED_OTHER;
  uint64_t sched_flags = 0;
  int32_t sched_nice = 0;
  uint32_t sched_priority = 0;
  uint64_t sched_runtime = 0, sched_deadline = 0, sched_period = 0;
  uint32_t sched_util_min = 0, sched_util_max = 0;
};
static_assert(sizeof(SchedAttr) == 56, "SCHED_ATTR_SIZE_VER1");

constexpr uint32_t kSchedDeadline = 6;         // SCHED_DEADLINE
constexpr uint32_t kSchedExt = 7;              // SCHED_EXT
constexpr uint64_t kSchedFlagResetOnFork = 1;  // SCHED_FLAG_RESET_ON_FORK

// Thread `tid`'s attributes (0: the caller) into `out`: 0 or -errno.
inline int sched_attr_get(pid_t tid, SchedAttr& out) {
  out = {};
  return syscall(SYS_sched_getattr, tid, &out, sizeof out, 0) < 0 ? -errno : 0;
}

// Sets thread `tid`'s (0: the caller's): 0 or -errno.
inline int sched_attr_set(pid_t tid, SchedAttr a) {
  a.size = sizeof a;
  return syscall(SYS_sched_setattr, tid, &a, 0) < 0 ? -errno : 0;
}

}  // namespace syrup
