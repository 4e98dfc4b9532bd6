// The --config file's watch (config_watch.h).
#include "config_watch.h"

#include <sys/inotify.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

namespace syrup {

int ConfigWatch::start(const std::string& config_path, std::string& err) {
  std::filesystem::path p = std::filesystem::absolute(config_path);
  dir_ = p.parent_path().string();
  base_ = p.filename().string();
  fd_.reset(inotify_init1(IN_NONBLOCK | IN_CLOEXEC));
  if (!fd_) {
    int e = errno;
    err = std::string("cannot watch ") + config_path + ": inotify: " + std::strerror(e);
    return -e;
  }
  // IN_CREATE for symlinks made in place (ln -sf), IN_MOVED_TO for replacements (the
  // kubelet's ..data swap, editors), IN_CLOSE_WRITE for writes in place, IN_DELETE and
  // IN_MOVED_FROM for a file taken away (the reload then reports it missing).
  uint32_t mask = IN_CLOSE_WRITE | IN_MOVED_TO | IN_MOVED_FROM | IN_CREATE | IN_DELETE | IN_DELETE_SELF |
                  IN_MOVE_SELF | IN_ONLYDIR;
  if (inotify_add_watch(fd_.get(), dir_.c_str(), mask) < 0) {
    int e = errno;
    err = "cannot watch " + dir_ + " (the --config file's directory): " + std::strerror(e);
    fd_.reset();
    return -e;
  }
  return 0;
}

bool ConfigWatch::concerns(const std::string& name) const {
  return name == base_ || name == "..data" || (!name.empty() && name[0] != '.');
}

bool ConfigWatch::on_event(std::string& err) {
  alignas(inotify_event) char buf[4096];
  bool relevant = false, gone = false;
  for (;;) {
    ssize_t n = read(fd_.get(), buf, sizeof buf);
    if (n <= 0) break;
    for (char* at = buf; at < buf + n;) {
      auto* ev = reinterpret_cast<inotify_event*>(at);
      at += sizeof(inotify_event) + ev->len;
      if (ev->mask & (IN_DELETE_SELF | IN_MOVE_SELF | IN_IGNORED)) gone = true;
      else if (ev->mask & IN_Q_OVERFLOW) relevant = true;  // lost events: look anyway
      else if (ev->len && concerns(ev->name)) relevant = true;
    }
  }
  if ((relevant || gone) && !armed_) {
    armed_ = true;
    due_at_ = Clock::now() + std::chrono::milliseconds(kConfigWatchDebounceMs);
  }
  if (gone) {
    err = dir_ + " (the --config file's directory) was removed or moved: the file is no longer watched; "
          "SIGHUP still reloads it";
    return false;
  }
  return true;
}

bool ConfigWatch::due(Clock::time_point now) {
  if (!armed_ || now < due_at_) return false;
  armed_ = false;
  return true;
}

}  // namespace syrup
