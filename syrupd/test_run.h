// The test_run request (docs/protocol.md, `syrupctl test`): a tenant's policy run over
// given inputs with BPF_PROG_TEST_RUN, through the real compiler, verifier and JIT, and
// never attached.
//
// Design: the policy is built with its hook's test wrapper
// (kernel/hooks/<hook>/test/wrapper.bpf.h and policy_input.h: an XDP program for the
// packet hooks, a syscall program for the thread and socket-lookup hooks, each building
// struct syr_input or syr_thread as the real wrapper does, so offsets the policy reads
// mean the same) and a seeded random generator. The request is checked and bounded on
// the main thread (parse_test_run); the compile runs on the compile workers, the load and
// the runs on the load workers (TestRunJob::run), uids in turn, like a deploy's.
// Inputs run in batches of up to 4096 (one BPF_PROG_TEST_RUN each, test_run.bpf.h),
// batches sized so that one takes a few ms: between two the worker checks the run's
// wall-clock bound (--test_run_max_ms), so a policy that loops long ends in ETIMEDOUT
// and frees its worker, and the main loop never waits on a run.
// Invariants: the run's maps are its own (LoadSpec::private_run): nothing is pinned,
// attached or shared with an application, and closing the object at the end of run()
// frees every map and the program; every resource a request can consume is bounded
// (inputs, bytes per input, map entries set and dumped, map memory, instructions).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "loader.h"

namespace syrup {

class Hook;

// Bounds of one test_run request.
struct TestRunLimits {
  // Inputs run per request: the answer (~70 bytes an input for the thread hook) fits a
  // 4 MiB frame; the batch loop itself has no limit but this.
  static constexpr size_t kInputs = 32768;
  static constexpr size_t kInputBytes = 1500;     // of one packet input (an Ethernet MTU)
  static constexpr size_t kMapEntries = 4096;     // entries set before the run, over all maps
  static constexpr size_t kDumpEntries = 4096;    // entries answered per dumped map
  static constexpr size_t kDumpMaps = 16;         // maps dumped
  static constexpr uint64_t kMapBytes = 16 << 20; // memory of the run's maps
};

// How a hook's test program takes an input.
enum class TestKind { kPacket, kThread, kLookup };

struct TestRunJob {
  // The request, checked.
  TestKind kind = TestKind::kPacket;
  LoadSpec spec;
  std::string wrapper;  // the hook's test build (its policy_input.h is beside it)
  // One context (thread, lookup) or frame (packet) per input, with its hash and protocol.
  struct Input {
    std::vector<uint8_t> bytes;
    uint32_t hash = 0, ip_protocol = 0;
  };
  std::vector<Input> inputs;
  nlohmann::json maps = nlohmann::json::object();  // name -> [[key, value], ...]
  std::vector<std::string> dump;
  uint64_t seed = 1;
  size_t max_batch = 4096;  // inputs per test run at most (SYR_TEST_BATCH; the request's `batch`)
  bool cached = false;  // the compile came from the cache
  uint32_t max_ms = 10000;  // --test_run_max_ms: the run's wall-clock bound, from when a worker starts it
  std::chrono::steady_clock::time_point deadline;
  // The outcome, written by run() on a worker, read by the main thread once it is done.
  int err = 0;
  LoadFailure fail;
  nlohmann::json result;

  // Loads the policy, sets its maps, runs every input and dumps the maps asked for.
  void run();
};

// Checks a test_run request's fields for `hook` and fills `job` (all but the compiled
// object). 0, or -errno with the refusal in `why`, naming the field and the limit.
int parse_test_run(const nlohmann::json& b, const Hook& hook, TestRunJob& job, std::string& why);

}  // namespace syrup
