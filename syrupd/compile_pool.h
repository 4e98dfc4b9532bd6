// Compile workers: clang runs for parked deploys off syrupd's main thread, so one
// caller's compile does not hold up every other connection (docs/protocol.md,
// "Connection model").
//
// Design: the main thread submits a job with the caller's uid and a ticket; worker
// threads take jobs from the uids in turn (the uids with queued jobs in ascending order,
// starting after the last one served; each uid's jobs in submission order), skipping a
// uid other than root that already has per_uid compiles running (--quota_compiles_per_uid:
// one user's compile bombs cannot occupy every worker while another user waits), run
// Compiler::compile and put the result on the done list, then write the eventfd the main
// loop polls. Invariants: a worker touches nothing but the Compiler (whose cache files
// get names of their own per compile) and this object's queues under its mutex; the
// main thread alone submits and takes results; stop() kills running compilers, drops
// what is queued and joins the workers before it returns.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "compiler.h"
#include "metrics.h"
#include "unique_fd.h"

namespace syrup {

class CompilePool {
 public:
  struct Done {
    uint64_t ticket;
    CompileResult result;
  };
  CompilePool() = default;
  CompilePool(const CompilePool&) = delete;
  CompilePool& operator=(const CompilePool&) = delete;
  ~CompilePool() { stop(); }

  // Starts `workers` threads compiling with `compiler`, at most `per_uid` at once for one
  // uid other than root (0: no limit). 0 or -errno.
  int start(Compiler& compiler, unsigned workers, unsigned per_uid = 0);
  // Readable (an eventfd) when take_done() has results.
  int event_fd() const { return event_fd_.get(); }
  void submit(uint64_t ticket, uid_t uid, CompileJob job);
  std::vector<Done> take_done();
  // What the workers hold now and have done (for the metrics).
  metrics::CompileSample stats();
  void stop();

 private:
  struct Job {
    uint64_t ticket;
    uid_t uid;
    CompileJob job;
    std::chrono::steady_clock::time_point submitted;
  };
  void work();
  // Whether `uid` may start another compile now. Caller holds mu_.
  bool may_run_locked(uid_t uid) const;
  // The next job in turn from a uid that may run one: false if there is none. Caller holds
  // mu_.
  bool next_locked(Job& out);

  Compiler* compiler_ = nullptr;
  unsigned per_uid_ = 0;
  UniqueFd event_fd_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::map<uid_t, std::deque<Job>> queued_;
  uid_t last_uid_ = 0;
  bool served_any_ = false;
  std::vector<Done> done_;
  metrics::CompileSample stats_;  // all but the queued counts, which are counted from queued_
};

}  // namespace syrup
