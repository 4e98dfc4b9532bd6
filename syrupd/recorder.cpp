// The Recorder (recorder.h): turns a policy's ring of capture events into a recording
// streamed through a pipe. Its design and invariants are in recorder.h.
#include "recorder.h"

#include <bpf/libbpf.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <vector>

#include "log.h"
#include "names.h"
#include "syrup/recording.h"

namespace syrup {
namespace {

using Clock = std::chrono::steady_clock;
// The wrappers wake no one (recording.bpf.h): the rings are drained this often.
constexpr unsigned kDrainMs = 5;

// struct syr_rec_ctl of kernel/hooks/recording.bpf.h.
struct RecCtl {
  uint32_t on, sample_every, snap, pad;
  uint64_t not_sampled, full;
};
// The wrapper's event: a struct syr_rec_record, then SYR_REC_SNAP_MAX payload bytes
// (struct syr_rec_event of recording.bpf.h, which asserts the same size).
constexpr size_t kEventBytes = sizeof(syr_rec_record) + SYR_REC_SNAP_MAX;
static_assert(sizeof(syr_rec_record) == 120 && offsetof(syr_rec_record, in.packet) == 40 &&
                  offsetof(syr_rec_record, in.cap_len) == 32,
              "the wrapper's event (recording.bpf.h) mirrors struct syr_rec_record");

void copy_name(char (&dst)[SYR_REC_NAME_MAX], const std::string& s) {
  std::memset(dst, 0, sizeof dst);
  std::memcpy(dst, s.data(), std::min(s.size(), sizeof dst - 1));
}

uint64_t clock_ns(clockid_t id) {
  timespec ts{};
  clock_gettime(id, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

}  // namespace

int parse_record_request(const nlohmann::json& req, const RecordLimits& lim, RecordRequest& out, std::string& err) {
  struct Field {
    const char* name;
    int64_t lo, hi;
    int64_t dflt;
  };
  const Field fields[] = {{"seconds", 0, lim.max_seconds, 0},
                          {"count", 0, INT64_MAX, 0},
                          {"sample", 1, 1000000, 1},
                          {"snap", 0, SYR_REC_SNAP_MAX, 64},
                          {"max_bytes", 0, static_cast<int64_t>(lim.max_bytes), 0}};
  int64_t v[5];
  for (size_t i = 0; i < 5; i++) {
    v[i] = fields[i].dflt;
    if (!req.contains(fields[i].name) || req[fields[i].name].is_null()) continue;
    if (std::string why = names::integer(fields[i].name, req[fields[i].name], fields[i].lo, fields[i].hi, v[i]);
        !why.empty()) {
      err = why;
      if (i == 0) err += " (syrupd's --record_max_seconds)";
      if (i == 4) err += " (syrupd's --record_max_bytes)";
      return -EINVAL;
    }
  }
  out.seconds = static_cast<uint32_t>(v[0] ? v[0] : lim.max_seconds);
  out.count = static_cast<uint64_t>(v[1]);
  out.sample_every = static_cast<uint32_t>(v[2]);
  out.snap = static_cast<uint32_t>(v[3]);
  out.max_bytes = static_cast<uint64_t>(v[4] ? v[4] : static_cast<int64_t>(lim.max_bytes));
  return 0;
}

struct Recorder::Recording {
  int policy_id = 0;
  RecordRequest req;
  UniqueFd ctl_fd, ring_fd, out;
  ring_buffer* rb = nullptr;
  RecCtl* ctl = nullptr;
  size_t ctl_len = 0;
  Clock::time_point deadline, tail_by;
  std::string buf;  // whole records, at most PIPE_BUF bytes: one write
  uint64_t buf_records = 0;
  uint64_t recorded = 0, lagged = 0, bytes = 0;
  unsigned turn = 0;
  unsigned turn_limit = kTurnEvents;
  bool backlog = false, discard = false, ended = false, gone = false;
  uint32_t limit_reason = 0;  // why it ends (SYR_REC_END_*), once it is known
  // The count or the quota was reached: later events are not this recording's (past the
  // count: not counted; past the quota: counted as not recorded).
  uint32_t over = 0;
  std::string tail;           // the trailer, while the pipe has no room for it

  ~Recording() {
    if (ctl) {
      __atomic_store_n(&ctl->on, 0, __ATOMIC_RELEASE);
      munmap(ctl, ctl_len);
    }
    if (rb) ring_buffer__free(rb);
  }
  int ring_epoll() const { return ring_buffer__epoll_fd(rb); }

  // Writes the batch: all of it or, when the reader lags (or left), none, counted.
  void flush() {
    if (buf.empty()) return;
    ssize_t w = gone ? -1 : write(out.get(), buf.data(), buf.size());
    if (w == static_cast<ssize_t>(buf.size())) {
      recorded += buf_records;
    } else {
      if (w < 0 && errno == EPIPE) gone = true;
      lagged += buf_records;
    }
    buf.clear();
    buf_records = 0;
  }

  // Stops the wrapper's capture: what it has queued is drained after.
  void switch_off(uint32_t reason) {
    if (!limit_reason) limit_reason = reason;
    __atomic_store_n(&ctl->on, 0, __ATOMIC_RELEASE);
  }

  void add(const uint8_t* ev) {
    if (over) {  // queued before the flag went off
      if (over == SYR_REC_END_QUOTA) lagged++;
      return;
    }
    syr_rec_record rec;
    std::memcpy(&rec, ev, sizeof rec);
    if (rec.type == SYR_REC_INPUT || rec.type == SYR_REC_THREAD) {
      rec.in.cap_len = std::min({rec.in.cap_len, req.snap, uint32_t{SYR_REC_SNAP_MAX}});
      if (rec.type == SYR_REC_THREAD) rec.in.cap_len = 0;
    }
    rec.size = SYR_REC_RECORD_SIZE(rec.in.cap_len);
    if (bytes + rec.size > req.max_bytes) {
      lagged++;
      over = SYR_REC_END_QUOTA;
      switch_off(over);
      return;
    }
    if (buf.size() + rec.size > PIPE_BUF) flush();
    buf.append(reinterpret_cast<const char*>(&rec), sizeof rec);
    buf.append(reinterpret_cast<const char*>(ev) + sizeof rec, rec.in.cap_len);
    buf.append(rec.size - sizeof rec - rec.in.cap_len, '\0');
    buf_records++;
    bytes += rec.size;
    if (req.count && recorded + buf_records >= req.count) {
      over = SYR_REC_END_DONE;
      switch_off(over);
    }
  }
};

Recorder::Recorder() = default;
Recorder::~Recorder() = default;

int Recorder::sample(void* ctx, void* data, size_t size) {
  auto& r = *static_cast<Recording*>(ctx);
  if (r.discard || size < kEventBytes) return 0;
  r.add(static_cast<const uint8_t*>(data));
  // A negative answer makes libbpf stop after this event: the turn's bound.
  if (++r.turn >= r.turn_limit) {
    r.backlog = true;
    return -EAGAIN;
  }
  return 0;
}

int Recorder::start(const RecordSource& src, const RecordRequest& req, UniqueFd& read_end, std::string& err) {
  std::string pid = std::to_string(src.policy_id);
  if (recs_.count(src.policy_id)) {
    err = "policy " + pid + " is already being recorded (one recording per policy at a time)";
    return -EBUSY;
  }
  if (recs_.size() >= lim_.max_recordings) {
    err = "syrupd already runs " + std::to_string(recs_.size()) +
          " recordings, its limit (--max_recordings); try again when one ends";
    return -EBUSY;
  }
  if (src.ctl_fd < 0 || src.ring_fd < 0) {
    err = "policy " + pid + " cannot be recorded: its program has no recording maps (a policy adopted "
          "from an older syrupd must be deployed again)";
    return -EOPNOTSUPP;
  }
  auto r = std::make_unique<Recording>();
  r->policy_id = src.policy_id;
  r->req = req;
  r->ctl_fd.reset(fcntl(src.ctl_fd, F_DUPFD_CLOEXEC, 0));
  r->ring_fd.reset(fcntl(src.ring_fd, F_DUPFD_CLOEXEC, 0));
  r->ctl_len = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  void* m = r->ctl_fd ? mmap(nullptr, r->ctl_len, PROT_READ | PROT_WRITE, MAP_SHARED, r->ctl_fd.get(), 0) : MAP_FAILED;
  if (m == MAP_FAILED || !r->ring_fd) {
    err = std::string("cannot open policy ") + pid + "'s recording maps: " + std::strerror(errno);
    return -errno;
  }
  r->ctl = static_cast<RecCtl*>(m);
  __atomic_store_n(&r->ctl->on, 0, __ATOMIC_RELEASE);  // a recording cut by a restart
  r->rb = ring_buffer__new(r->ring_fd.get(), &Recorder::sample, r.get(), nullptr);
  int p[2];
  if (!r->rb || pipe2(p, O_CLOEXEC | O_NONBLOCK) < 0) {
    err = std::string("cannot start the recording: ") + std::strerror(errno);
    return -errno;
  }
  read_end.reset(p[0]);
  r->out.reset(p[1]);
  fcntl(p[0], F_SETFL, 0);  // the client's end blocks
  fcntl(p[1], F_SETPIPE_SZ, 1 << 20);  // room for bursts; the default 64 KiB if refused
  // What a recording cut short left in the ring is not this one's.
  r->discard = true;
  r->turn_limit = UINT_MAX;
  ring_buffer__consume(r->rb);
  r->discard = false;
  r->turn_limit = kTurnEvents;

  syr_rec_header h{};
  std::memcpy(h.magic, SYR_REC_MAGIC, sizeof h.magic);
  h.version = SYR_REC_VERSION;
  h.header_size = sizeof h;
  h.hook = static_cast<uint32_t>(src.hook_abi);
  h.n_executors = src.n_executors;
  h.snap_len = req.snap;
  h.sample_every = req.sample_every;
  h.clock_mono_ns = clock_ns(CLOCK_MONOTONIC);
  h.clock_real_ns = clock_ns(CLOCK_REALTIME);
  h.policy_id = static_cast<uint64_t>(src.policy_id);
  copy_name(h.policy_name, src.name);
  copy_name(h.app, src.app);
  h.nr_cpus = static_cast<uint32_t>(std::max(1, libbpf_num_possible_cpus()));
  if (write(r->out.get(), &h, sizeof h) != static_cast<ssize_t>(sizeof h)) {
    err = std::string("cannot start the recording: ") + std::strerror(errno);
    return -EIO;
  }
  r->bytes = sizeof h;
  r->ctl->not_sampled = 0;
  r->ctl->full = 0;
  r->ctl->sample_every = req.sample_every;
  r->ctl->snap = req.snap;
  __atomic_store_n(&r->ctl->on, 1, __ATOMIC_RELEASE);
  r->deadline = Clock::now() + std::chrono::seconds(req.seconds);

  epoll_event ring_ev{EPOLLIN, {.fd = r->ring_epoll()}};
  epoll_event out_ev{0, {.fd = r->out.get()}};  // EPOLLERR: the reader left
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, r->ring_epoll(), &ring_ev);
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, r->out.get(), &out_ev);
  fds_[r->ring_epoll()] = src.policy_id;
  fds_[r->out.get()] = src.policy_id;
  log(LogLevel::kInfo, "recording policy %d (%s): %u s, %llu inputs, 1/%u, %u bytes each", src.policy_id,
      src.name.c_str(), req.seconds, static_cast<unsigned long long>(req.count), req.sample_every, req.snap);
  recs_[src.policy_id] = std::move(r);
  return 0;
}

void Recorder::drain(Recording& r, bool all) {
  do {
    r.turn = 0;
    r.backlog = false;
    ring_buffer__consume(r.rb);
  } while (all && r.backlog);
  r.flush();
  if (r.gone) r.switch_off(SYR_REC_END_STOPPED);
}

void Recorder::finish(Recording& r, uint32_t reason) {
  if (r.ended) return;
  r.ended = true;
  r.switch_off(reason);
  drain(r, true);
  int id = r.policy_id;
  if (r.gone) return close(id);
  syr_rec_record t{};
  t.size = SYR_REC_RECORD_SIZE(0);
  t.type = SYR_REC_TRAILER;
  t.ts_ns = clock_ns(CLOCK_MONOTONIC);
  t.trailer.recorded = r.recorded;
  t.trailer.not_sampled = __atomic_load_n(&r.ctl->not_sampled, __ATOMIC_ACQUIRE);
  t.trailer.not_recorded_full = __atomic_load_n(&r.ctl->full, __ATOMIC_ACQUIRE);
  t.trailer.not_recorded_quota = r.lagged;
  t.trailer.end_reason = r.limit_reason;
  log(LogLevel::kInfo, "recording of policy %d ended (%u): %llu recorded, %llu sampled out, %llu lost", id,
      r.limit_reason, static_cast<unsigned long long>(r.recorded),
      static_cast<unsigned long long>(t.trailer.not_sampled),
      static_cast<unsigned long long>(t.trailer.not_recorded_full + r.lagged));
  if (write(r.out.get(), &t, sizeof t) == static_cast<ssize_t>(sizeof t)) return close(id);
  if (errno != EAGAIN) return close(id);
  // The reader is behind: the trailer waits for room, a bounded time.
  r.tail.assign(reinterpret_cast<const char*>(&t), sizeof t);
  r.tail_by = Clock::now() + std::chrono::seconds(kTrailerWaitSec);
  epoll_event ev{EPOLLOUT, {.fd = r.out.get()}};
  epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, r.out.get(), &ev);
}

void Recorder::close(int policy_id) {
  auto it = recs_.find(policy_id);
  if (it == recs_.end()) return;
  for (int fd : {it->second->ring_epoll(), it->second->out.get()}) {
    epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
    fds_.erase(fd);
  }
  recs_.erase(it);
}

bool Recorder::stop(int policy_id, uint32_t reason) {
  auto it = recs_.find(policy_id);
  if (it == recs_.end()) return false;
  finish(*it->second, reason);
  return true;
}

void Recorder::stop_all(uint32_t reason) {
  std::vector<int> ids;
  for (auto& [id, r] : recs_) ids.push_back(id);
  for (int id : ids) stop(id, reason);
  // Trailers the readers had no room for are not waited for.
  for (int id : ids) close(id);
}

void Recorder::on_event(int fd) {
  auto f = fds_.find(fd);
  if (f == fds_.end()) return;
  int id = f->second;
  Recording& r = *recs_.at(id);
  if (fd == r.ring_epoll()) {
    drain(r, false);
    if (r.limit_reason) finish(r, r.limit_reason);
    return;
  }
  pollfd p{r.out.get(), POLLOUT, 0};
  if (poll(&p, 1, 0) < 0) return;
  if (p.revents & (POLLERR | POLLHUP)) {  // the reader left: no one reads a trailer
    r.gone = true;
    if (!r.ended) finish(r, SYR_REC_END_STOPPED);
    return close(id);
  }
  if (!r.tail.empty() && (p.revents & POLLOUT)) {
    (void)!write(r.out.get(), r.tail.data(), r.tail.size());
    close(id);
  }
}

int Recorder::run_due() {
  auto now = Clock::now();
  int timeout = -1;
  auto wake_at = [&](Clock::time_point t) {
    int ms = t <= now ? 0 : static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(t - now).count() + 1);
    timeout = timeout < 0 ? ms : std::min(timeout, ms);
  };
  std::vector<int> ids;
  for (auto& [id, r] : recs_) ids.push_back(id);
  for (int id : ids) {
    Recording& r = *recs_.at(id);
    if (!r.ended) drain(r, false);
    if (!r.ended && (now >= r.deadline || r.limit_reason)) finish(r, r.limit_reason ? r.limit_reason : SYR_REC_END_DONE);
    auto it = recs_.find(id);
    if (it == recs_.end()) continue;
    if (it->second->ended) {
      if (now >= it->second->tail_by) close(id);
      else wake_at(it->second->tail_by);
    } else {
      wake_at(it->second->backlog ? now : std::min(it->second->deadline, now + std::chrono::milliseconds(kDrainMs)));
    }
  }
  return timeout;
}

}  // namespace syrup
