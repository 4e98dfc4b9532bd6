// The process a policy on a server's sockets lives with (socket-select and socket-lookup,
// deployed by pid).
//
// A multi-process server (nginx, a pre-forking server of one's own) opens its sockets in
// a master process and forks workers that inherit them; a reload replaces the workers
// while the master, and the sockets, live on. A policy tied to the worker named on the
// deploy ended at the next reload although the group it schedules lived on.
// The rule: from the process given, go up the parent chain one step at a time while the
// parent
//  - holds one of the policy's sockets (the same open socket, by inode: inherited or
//    passed, never merely one on the same port),
//  - is a process the caller may name (check_target_process: the caller's own; any for
//    root and --admin_group, so nginx's root master over workers of another uid counts),
//  - and is neither the machine's init (pid 1) nor syrupd;
// the last process reached is the anchor: the policy ends when it exits. It is the same
// whichever of the server's pids was given. A parent that holds the sockets but that the
// caller may not name stops the walk, and the deploy says so (Anchor::note); so does a
// parent that runs the same program but holds none of them (HAProxy's master, which
// passes the listeners from the old worker to the new one at a reload): such a policy
// still ends with the process given.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "hook.h"

namespace syrup::socket_select {

struct Anchor {
  pid_t pid = 0;       // the process whose exit ends the policy
  pid_t given = 0;     // the process the deploy named
  std::string reason;  // how `pid` was reached from `given`; empty when they are one
  std::string note;    // why the walk stopped below a parent that looked like the owner; or empty
};

// The anchor of a policy on `sockets` (inodes) found in process `given`.
Anchor group_owner(const Caller& caller, pid_t given, const std::vector<uint64_t>& sockets);

// The anchor's fields for a deploy's answer and `list` (anchor_pid, pid_given,
// anchor_reason, anchor_note), and back from what save() kept.
void describe_anchor(const Anchor& a, nlohmann::json& out);
Anchor anchor_from(const nlohmann::json& saved, pid_t holder);

}  // namespace syrup::socket_select
