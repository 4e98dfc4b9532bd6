// Recordings of deployed policies: `syrupctl record` and `syrupctl trace`
// (docs/recording.md, docs/protocol.md "record").
//
// Design: every hook wrapper has two maps of its own (kernel/hooks/recording.bpf.h): the
// control element syr_rec_ctl, which the Recorder mmaps and switches on for the length
// of a recording, and the ring buffer syr_rec_ring the wrapper writes an event into per
// decision while it is on, waking syrupd once per quarter of the ring written. The
// Recorder drains the ring on syrupd's event loop when woken (its epoll watches the ring)
// and every few milliseconds (run_due), at most kTurnEvents events per turn, and writes them as
// records of the recording format into a pipe whose read end went to the client with the
// answer to its request: the file is written by the client, as the client. The pipe is
// non-blocking on syrupd's side: what a slow reader cannot take is dropped and counted.
//
// Invariants:
//  - at most one recording per policy, at most RecordLimits::max_recordings at once;
//  - a recording ends at its deadline, its count, its byte quota, when its policy goes,
//    when the client asks (record_stop) or closes the pipe; then the wrapper's flag is
//    off, the ring drained, and the trailer (counts of what was not recorded) is the
//    last record written (a reader that never reads loses it after kTrailerWaitSec);
//  - the stream is whole records: each write is at most PIPE_BUF bytes, which a pipe
//    takes whole or not at all.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "unique_fd.h"

namespace syrup {

// The hook wrappers' recording maps (kernel/hooks/recording.bpf.h).
inline constexpr const char* kRecCtlMap = "syr_rec_ctl";
inline constexpr const char* kRecRingMap = "syr_rec_ring";

struct RecordLimits {
  uint64_t max_bytes = 64ull << 20;  // --record_max_bytes: one recording's size quota
  unsigned max_seconds = 3600;       // --record_max_seconds: its longest duration
  size_t max_recordings = 16;        // --max_recordings: running at once, all users
};

// A record request's fields, checked against the limits.
struct RecordRequest {
  uint32_t seconds = 0;       // 0: the limit
  uint64_t count = 0;         // inputs; 0: no bound but the others
  uint32_t sample_every = 1;  // one in N
  uint32_t snap = 64;         // payload bytes per input
  uint64_t max_bytes = 0;     // 0: the limit
};
// 0, or -EINVAL with `err` naming the field and its range.
int parse_record_request(const nlohmann::json& req, const RecordLimits& lim, RecordRequest& out, std::string& err);

// What a recording needs of its policy.
struct RecordSource {
  int policy_id = 0;
  int hook_abi = 0;  // enum syr_hook
  uint32_t n_executors = 0;
  std::string name, app;
  int ctl_fd = -1, ring_fd = -1;  // borrowed: the recording keeps copies
};

class Recorder {
 public:
  Recorder();
  ~Recorder();
  void init(int epoll_fd, const RecordLimits& lim) {
    epoll_fd_ = epoll_fd;
    lim_ = lim;
  }
  const RecordLimits& limits() const { return lim_; }
  // Starts recording `src`; `read_end` is the pipe the records come out of. 0 or -errno
  // (EBUSY: already recorded, or too many recordings) with `err`.
  int start(const RecordSource& src, const RecordRequest& req, UniqueFd& read_end, std::string& err);
  // Ends policy `id`'s recording with `reason` (SYR_REC_END_*); false if it has none.
  bool stop(int policy_id, uint32_t reason);
  // Ends every recording (syrupd stops): each reader gets its trailer.
  void stop_all(uint32_t reason);
  bool recording(int policy_id) const { return recs_.count(policy_id) != 0; }
  // Whether `fd` is one of the recorder's (then on_event() takes it).
  bool owns(int fd) const { return fds_.count(fd) != 0; }
  void on_event(int fd);
  // Deadlines and backlogs: runs what is due, returns the epoll timeout (ms) until the
  // next is due, -1 when none is.
  int run_due();
  size_t active() const { return recs_.size(); }

  static constexpr unsigned kTurnEvents = 4096;
  static constexpr unsigned kTrailerWaitSec = 5;

 private:
  struct Recording;
  void drain(Recording& r, bool all);
  void finish(Recording& r, uint32_t reason);
  void close(int policy_id);
  static int sample(void* ctx, void* data, size_t size);

  int epoll_fd_ = -1;
  RecordLimits lim_;
  std::map<int, std::unique_ptr<Recording>> recs_;  // by policy id
  std::map<int, int> fds_;                           // watched fd -> policy id
};

}  // namespace syrup
