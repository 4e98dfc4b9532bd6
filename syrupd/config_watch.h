// --config_watch: syrupd applies its --config file when the file changes, as on SIGHUP
// (docs/operations.md, "Watching the file").
//
// Design: inotify on the file's directory, not on the file: editors and the kubelet
// replace files rather than write them in place, and a Kubernetes ConfigMap mount is
//   DIR/syrup.yaml -> ..data/syrup.yaml,  DIR/..data -> ..2026_11_26_16_00_00.123
// updated by making a new timestamped directory, a symlink `..data_tmp` to it, and
// renaming that over `..data` (one IN_MOVED_TO "..data" in DIR). A watch on the file
// itself would follow the old inode and see none of that. The watch is on DIR, which
// the operator named; syrupd reads the file and its policies as --config always did.
// Invariants:
//  - an event that can change what the file says (the file's name, `..data`, or any
//    name not starting with '.', which policy files next to it may be) arms a timer of
//    kConfigWatchDebounceMs; events meanwhile join it, so a burst (the kubelet's swap
//    and the symlinks of new keys it makes after it) is applied once, and a directory
//    that never rests (a log file beside the config) cannot put the apply off forever;
//  - the owner reads the descriptor with on_event() and asks due() in its timer pass;
//    ConfigWatch changes nothing itself and has no thread.
#pragma once

#include <chrono>
#include <string>

#include "unique_fd.h"

namespace syrup {

inline constexpr int kConfigWatchDebounceMs = 100;

class ConfigWatch {
 public:
  using Clock = std::chrono::steady_clock;
  // Watches the directory of `config_path`. 0 or -errno with `err` saying why.
  int start(const std::string& config_path, std::string& err);
  int fd() const { return fd_.get(); }
  // Drains the events on fd(); arms the debounce if one concerns the file. False when
  // the directory itself went away (the watch is over; `err` says so).
  bool on_event(std::string& err);
  // The debounce is over: true once per burst of events, which it then forgets.
  bool due(Clock::time_point now);
  // When due() will be true; only meaningful while armed().
  Clock::time_point due_at() const { return due_at_; }
  bool armed() const { return armed_; }

 private:
  bool concerns(const std::string& name) const;
  UniqueFd fd_;
  std::string dir_, base_;
  bool armed_ = false;
  Clock::time_point due_at_{};
};

}  // namespace syrup
