// The clock of the RocksDB example: CLOCK_MONOTONIC in ns, the time base of the load
// generator's schedule and request stamps (echoed by the server), of its tests' fixed
// server, of the server's pacing and of the database's calibration; kv_clock_ns() reads
// any clock (the server's workers also read their own CPU time).
#pragma once

#include <stdint.h>
#include <time.h>

inline uint64_t kv_clock_ns(clockid_t clock) {
  timespec ts;
  clock_gettime(clock, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ULL + static_cast<uint64_t>(ts.tv_nsec);
}
inline uint64_t kv_now_ns() { return kv_clock_ns(CLOCK_MONOTONIC); }
