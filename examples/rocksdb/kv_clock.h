// The clock of the RocksDB example: CLOCK_MONOTONIC in ns, the time base of the load
// generator's schedule and request stamps (echoed by the server), of its tests' fixed
// server, and of the database's calibration.
#pragma once

#include <stdint.h>
#include <time.h>

inline uint64_t kv_now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ULL + static_cast<uint64_t>(ts.tv_nsec);
}
