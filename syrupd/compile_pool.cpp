#include "compile_pool.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <string>
#include <utility>

#include "log.h"

namespace syrup {

int CompilePool::start(Compiler& compiler, unsigned workers, unsigned per_uid) {
  compiler_ = &compiler;
  per_uid_ = per_uid;
  event_fd_.reset(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!event_fd_) return -errno;
  stopping_ = false;
  for (unsigned i = 0; i < workers; i++) workers_.emplace_back([this] { work(); });
  return 0;
}

void CompilePool::submit(uint64_t ticket, uid_t uid, CompileJob job) {
  bool held;
  std::string name = job.display_name;
  {
    std::lock_guard lk(mu_);
    held = !may_run_locked(uid);
    queued_[uid].push_back({ticket, uid, std::move(job), std::chrono::steady_clock::now()});
  }
  if (held)
    log(LogLevel::kInfo, "uid %u has %u compiles running, its limit (--quota_compiles_per_uid): %s waits for one of them",
        uid, per_uid_, name.c_str());
  cv_.notify_all();
}

std::vector<CompilePool::Done> CompilePool::take_done() {
  uint64_t n;
  while (read(event_fd_.get(), &n, sizeof n) == sizeof n) {
  }
  std::lock_guard lk(mu_);
  return std::exchange(done_, {});
}

metrics::CompileSample CompilePool::stats() {
  std::lock_guard lk(mu_);
  metrics::CompileSample s = stats_;
  for (auto& [uid, q] : queued_) s.queued_by_uid[uid] = q.size();  // never empty (next_locked erases those)
  return s;
}

bool CompilePool::may_run_locked(uid_t uid) const {
  if (per_uid_ == 0 || uid == 0) return true;
  auto r = stats_.running_by_uid.find(uid);
  return r == stats_.running_by_uid.end() || r->second < per_uid_;
}

bool CompilePool::next_locked(Job& out) {
  auto start = served_any_ ? queued_.upper_bound(last_uid_) : queued_.begin();
  if (start == queued_.end()) start = queued_.begin();
  auto it = start;
  while (!may_run_locked(it->first)) {
    if (++it == queued_.end()) it = queued_.begin();
    if (it == start) return false;
  }
  out = std::move(it->second.front());
  it->second.pop_front();
  last_uid_ = it->first;
  served_any_ = true;
  if (it->second.empty()) queued_.erase(it);
  return true;
}

void CompilePool::work() {
  for (;;) {
    Job j;
    {
      std::unique_lock lk(mu_);
      cv_.wait(lk, [&] { return stopping_ || (!queued_.empty() && next_locked(j)); });
      if (stopping_) return;
      stats_.running_by_uid[j.uid]++;
    }
    auto started = std::chrono::steady_clock::now();
    CompileResult r = compiler_->compile(j.job);
    auto ended = std::chrono::steady_clock::now();
    {
      std::lock_guard lk(mu_);
      if (--stats_.running_by_uid[j.uid] == 0) stats_.running_by_uid.erase(j.uid);
      (r.err ? stats_.failed : stats_.ok)++;
      stats_.wait_seconds += std::chrono::duration<double>(started - j.submitted).count();
      stats_.compile_seconds += std::chrono::duration<double>(ended - started).count();
      done_.push_back({j.ticket, std::move(r)});
    }
    cv_.notify_all();  // a job its uid's limit held back may run now
    uint64_t one = 1;
    (void)!write(event_fd_.get(), &one, sizeof one);
  }
}

void CompilePool::stop() {
  if (workers_.empty()) return;
  {
    std::lock_guard lk(mu_);
    stopping_ = true;
    queued_.clear();
  }
  cv_.notify_all();
  if (compiler_) compiler_->cancel(true);
  for (auto& t : workers_) t.join();
  workers_.clear();
  if (compiler_) compiler_->cancel(false);
}

}  // namespace syrup
