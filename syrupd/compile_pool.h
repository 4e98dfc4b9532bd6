// Compile workers: clang runs for parked deploys off syrupd's main thread, so one
// caller's compile does not hold up every other connection (docs/protocol.md,
// "Connection model").
//
// Design: the main thread submits a job with the caller's uid and a ticket; worker
// threads take jobs from the uids in turn (the uids with queued jobs in ascending order,
// starting after the last one served; each uid's jobs in submission order), skipping a
// uid other than root that already has its share running, run
// Compiler::compile and put the result on the done list, then write the eventfd the main
// loop polls. Invariants: a worker touches nothing but the Compiler (whose cache files
// get names of their own per compile) and this object's queues under its mutex; the
// main thread alone submits and takes results; stop() kills running compilers, drops
// what is queued and joins the workers before it returns.
//
// A pool started without a compiler runs tasks instead (submit() with a task): syrupd's
// load workers, which have the kernel verify and load parked deploys (bpf_object__load
// can take seconds), uids in turn as well. While another uid waits, one uid runs on at
// most workers - 1 of a pool's workers (one, with one worker), so a user's compile bomb
// or heavy verify leaves a worker to everyone else. A compile pool's share is also at
// most --quota_compiles_per_uid. Root (the operator's --config) has no share: it is
// never held back.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
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
  // uid other than root (0: only the pool's own bound). 0 or -errno.
  int start(Compiler& compiler, unsigned workers, unsigned per_uid = 0);
  // Starts `workers` threads running submitted tasks only. 0 or -errno.
  int start(unsigned workers);
  // Readable (an eventfd) when take_done() has results.
  int event_fd() const { return event_fd_.get(); }
  void submit(uint64_t ticket, uid_t uid, CompileJob job);
  // Runs `task` on a worker in `uid`'s turn; done (with an empty result) when it returns.
  // The task touches only what it was given and what is safe across threads.
  void submit(uint64_t ticket, uid_t uid, std::function<void()> task);
  std::vector<Done> take_done();
  // What the workers hold now and have done (for the metrics).
  metrics::CompileSample stats();
  void stop();

 private:
  struct Job {
    uint64_t ticket;
    uid_t uid;
    CompileJob job;
    std::function<void()> task;  // set: run it instead of compiling `job`
    std::chrono::steady_clock::time_point submitted;
  };
  void work();
  // Whether `uid` may have another job started now. Caller holds mu_.
  bool may_run_locked(uid_t uid) const;
  // Whether some queued uid may have a job started now. Caller holds mu_.
  bool runnable_locked() const;
  // The next job in turn, when runnable_locked(). Caller holds mu_.
  Job next_locked();

  Compiler* compiler_ = nullptr;
  UniqueFd event_fd_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::map<uid_t, std::deque<Job>> queued_;
  size_t per_uid_ = 1;  // most jobs of one uid running at once
  std::map<uid_t, size_t> running_;
  uid_t last_uid_ = 0;
  bool served_any_ = false;
  std::vector<Done> done_;
  metrics::CompileSample stats_;  // all but the queued counts, which are counted from queued_
};

}  // namespace syrup
