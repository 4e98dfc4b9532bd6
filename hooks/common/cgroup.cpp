// Targets by cgroup (cgroup.h).
#include "cgroup.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <linux/openat2.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "hook.h"

namespace syrup::cgroup {
namespace {

// A mountinfo field with its octal escapes (\040 for a space) decoded.
std::string unescape(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); i++) {
    if (s[i] == '\\' && i + 3 < s.size() && std::isdigit(static_cast<unsigned char>(s[i + 1]))) {
      out += static_cast<char>(std::stoi(s.substr(i + 1, 3), nullptr, 8));
      i += 3;
    } else {
      out += s[i];
    }
  }
  return out;
}

int open_beneath(int dir, const char* path, uint64_t flags, UniqueFd& out) {
  open_how how{};
  how.flags = flags | O_CLOEXEC | O_NOFOLLOW;
  how.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV;
  out.reset(static_cast<int>(syscall(SYS_openat2, dir, path, &how, sizeof how)));
  return out ? 0 : -errno;
}

}  // namespace

int v2_root(std::string& out, std::string& err) {
  std::ifstream in("/proc/self/mountinfo");
  for (std::string line; std::getline(in, line);) {
    // id parent major:minor root mount-point options [optional...] - fstype source super-options
    std::istringstream ls(line);
    std::vector<std::string> f;
    for (std::string w; ls >> w;) f.push_back(w);
    auto dash = std::find(f.begin(), f.end(), "-");
    if (f.size() < 5 || dash == f.end() || dash + 1 == f.end() || dash[1] != "cgroup2" || f[3] != "/") continue;
    out = unescape(f[4]);
    return 0;
  }
  err = "no cgroup v2 hierarchy is mounted where syrupd runs (no cgroup2 in /proc/self/mountinfo)";
  return -ENOENT;
}

int open_dir(const std::string& path, UniqueFd& out) {
  std::string root, ignored;
  if (int r = v2_root(root, ignored)) return r;
  UniqueFd rfd(open(root.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  struct statfs fs;
  if (!rfd || fstatfs(rfd.get(), &fs) < 0) return -errno;
  if (fs.f_type != CGROUP2_SUPER_MAGIC) return -ENOENT;
  // Relative to the root; "..", symlinks and other mounts are the kernel's to refuse.
  size_t from = path.find_first_not_of('/');
  if (from == std::string::npos) return -ENOENT;
  return open_beneath(rfd.get(), path.c_str() + from, O_PATH | O_DIRECTORY, out);
}

int read_ids(int dir, const char* file, size_t max, std::vector<pid_t>& out) {
  out.clear();
  UniqueFd fd;
  if (int r = open_beneath(dir, file, O_RDONLY, fd)) return r;
  // In chunks, stopping after max + 1 ids: a cgroup of a million processes is not read whole.
  std::string part;
  char buf[4096];
  for (ssize_t n; (n = read(fd.get(), buf, sizeof buf)) != 0;) {
    if (n < 0) {
      if (errno == EINTR) continue;
      return -errno;
    }
    for (ssize_t i = 0; i < n; i++) {
      if (buf[i] != '\n') {
        if (part.size() > 10) return -EINVAL;
        part += buf[i];
        continue;
      }
      out.push_back(static_cast<pid_t>(std::atoi(part.c_str())));
      part.clear();
      if (out.size() > max) return -E2BIG;
    }
  }
  std::sort(out.begin(), out.end());
  return 0;
}

int processes(const std::string& path, uid_t uid, bool admin, std::vector<pid_t>& pids, std::string& err,
              UniqueFd* dir) {
  // One message for every cgroup the caller may not name, whatever the reason.
  const std::string refusal = "cgroup " + path +
                              ": no cgroup by that path holds processes that are all the caller's (it does not "
                              "exist, is not a cgroup, is empty, or holds a process of another user)";
  UniqueFd d;
  std::vector<pid_t> ids;
  int r = open_dir(path, d);
  if (r == 0) r = read_ids(d.get(), "cgroup.procs", kMaxProcesses, ids);
  if (r && r != -E2BIG) {
    err = refusal;
    return -ESRCH;
  }
  pids.clear();
  for (pid_t p : ids) {
    uid_t owner = process_uid(p);
    if (owner == static_cast<uid_t>(-1)) continue;  // exited since it was listed
    if (!admin && owner != uid) {
      err = refusal;
      return -ESRCH;
    }
    pids.push_back(p);
  }
  if (r == -E2BIG) {
    err = "cgroup " + path + " holds more than " + std::to_string(kMaxProcesses) +
          " processes; a deploy by cgroup looks at most that many: name a cgroup below it";
    return -E2BIG;
  }
  if (pids.empty()) {
    err = refusal;
    return -ESRCH;
  }
  if (dir) *dir = std::move(d);
  return 0;
}

bool removed(int dir) {
  std::vector<pid_t> ignored;
  int r = read_ids(dir, "cgroup.procs", 0, ignored);
  return r == -ENOENT || r == -ENODEV;
}

}  // namespace syrup::cgroup
