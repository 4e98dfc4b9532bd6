#include "compile_pool.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <string>
#include <utility>

#include "log.h"

namespace syrup {

int CompilePool::start(Compiler& compiler, unsigned workers, unsigned per_uid) {
  compiler_ = &compiler;
  int r = start(workers);
  if (per_uid) per_uid_ = std::min<size_t>(per_uid_, per_uid);
  return r;
}

int CompilePool::start(unsigned workers) {
  event_fd_.reset(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!event_fd_) return -errno;
  stopping_ = false;
  per_uid_ = workers > 1 ? workers - 1 : 1;
  for (unsigned i = 0; i < workers; i++) workers_.emplace_back([this] { work(); });
  return 0;
}

void CompilePool::submit(uint64_t ticket, uid_t uid, CompileJob job) {
  bool held;
  std::string name = job.display_name;
  {
    std::lock_guard lk(mu_);
    // Held if as many of the uid's compiles are ahead of it as it may run, queued ones
    // included: one not yet taken by a worker is not counted as running.
    auto r = running_.find(uid);
    auto q = queued_.find(uid);
    size_t ahead = (r == running_.end() ? 0 : r->second) + (q == queued_.end() ? 0 : q->second.size());
    held = uid != 0 && ahead >= per_uid_;
    queued_[uid].push_back({ticket, uid, std::move(job), {}, std::chrono::steady_clock::now()});
  }
  if (held)
    log(LogLevel::kInfo, "uid %u has %zu compiles running, its limit (--quota_compiles_per_uid): %s waits for one of them",
        uid, per_uid_, name.c_str());
  cv_.notify_one();
}

void CompilePool::submit(uint64_t ticket, uid_t uid, std::function<void()> task) {
  {
    std::lock_guard lk(mu_);
    queued_[uid].push_back({ticket, uid, CompileJob{}, std::move(task), std::chrono::steady_clock::now()});
  }
  cv_.notify_one();
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
  if (uid == 0) return true;
  auto r = running_.find(uid);
  return r == running_.end() || r->second < per_uid_;
}

bool CompilePool::runnable_locked() const {
  for (auto& [uid, q] : queued_)
    if (may_run_locked(uid)) return true;
  return false;
}

CompilePool::Job CompilePool::next_locked() {
  auto may_run = [&](auto it) { return may_run_locked(it->first); };
  auto it = served_any_ ? queued_.upper_bound(last_uid_) : queued_.begin();
  if (it == queued_.end()) it = queued_.begin();
  for (size_t n = 0; !may_run(it) && n < queued_.size(); n++)
    if (++it == queued_.end()) it = queued_.begin();
  running_[it->first]++;
  Job out = std::move(it->second.front());
  it->second.pop_front();
  last_uid_ = it->first;
  served_any_ = true;
  if (it->second.empty()) queued_.erase(it);
  return out;
}

void CompilePool::work() {
  for (;;) {
    Job j;
    {
      std::unique_lock lk(mu_);
      cv_.wait(lk, [&] { return stopping_ || runnable_locked(); });
      if (stopping_) return;
      j = next_locked();
      if (!j.task) stats_.running_by_uid[j.uid]++;
    }
    auto started = std::chrono::steady_clock::now();
    CompileResult r;
    if (j.task) j.task();
    else r = compiler_->compile(j.job);
    auto ended = std::chrono::steady_clock::now();
    {
      std::lock_guard lk(mu_);
      if (--running_[j.uid] == 0) running_.erase(j.uid);
      if (!j.task) {
        if (--stats_.running_by_uid[j.uid] == 0) stats_.running_by_uid.erase(j.uid);
        (r.err ? stats_.failed : stats_.ok)++;
        stats_.wait_seconds += std::chrono::duration<double>(started - j.submitted).count();
        stats_.compile_seconds += std::chrono::duration<double>(ended - started).count();
      }
      done_.push_back({j.ticket, std::move(r)});
    }
    cv_.notify_all();  // a uid at its share may have a queued job to start now
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
