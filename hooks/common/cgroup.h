// Targets by cgroup: a deploy's `cgroup` field (hooks/hook_request.h) resolved to the
// processes it schedules, for every hook.
//
// Design: the path is the tenant's text, so syrupd (root) never hands it to a path-walking
// call. It opens the cgroup v2 root it finds in its own /proc/self/mountinfo (this host is
// hybrid: /sys/fs/cgroup/unified) and walks the path beneath that descriptor with openat2
// RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV, so no
// '..', symlink or other mount leads out; the text itself is allowlisted by parse().
// Ownership is checked as for a pid: a caller who is not an admin may name a cgroup only if
// it owns every process in it. A missing cgroup, an empty one, a file that is not a cgroup
// and one with another user's process are refused in the same words, so a tenant learns
// nothing of cgroups that are not its own. A request reads at most kMaxProcesses of a
// cgroup's processes (the rest is refused, not scanned): each one costs syrupd a look at
// its sockets.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <string>
#include <vector>

#include "unique_fd.h"

namespace syrup::cgroup {

inline constexpr size_t kMaxProcesses = 1024;

// The cgroup v2 hierarchy's mount point in syrupd's mount namespace. 0, or -ENOENT with
// `err` when no cgroup2 file system is mounted.
int v2_root(std::string& out, std::string& err);

// `path` (as request::cgroup accepted it: "/a/b") opened O_PATH beneath the v2 root, never
// through a symlink, "..", or into another file system. 0 or -errno.
int open_dir(const std::string& path, UniqueFd& out);

// The ids listed in `file` ("cgroup.procs" or "cgroup.threads") of the cgroup `dir`,
// ascending, at most `max`: -E2BIG when there are more. 0 or -errno.
int read_ids(int dir, const char* file, size_t max, std::vector<pid_t>& out);

// The processes of cgroup `path` that a caller of `uid` (an admin: `admin`) may target:
// every process in it must be the caller's. 0 with `pids` ascending, or -ESRCH (missing,
// empty, not a cgroup, or another user's process: one message), -E2BIG (more than
// kMaxProcesses) with `err`. With `dir`, the cgroup's descriptor too (to watch it).
int processes(const std::string& path, uid_t uid, bool admin, std::vector<pid_t>& pids, std::string& err,
              UniqueFd* dir = nullptr);

// Whether cgroup `dir` has been removed (rmdir): its cgroup.procs cannot be read any more.
bool removed(int dir);

}  // namespace syrup::cgroup
