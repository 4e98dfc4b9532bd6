// group_owner.h: the walk up a server's parent chain.
#include "socket_select/group_owner.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <set>

#include "proc.h"

namespace syrup::socket_select {
namespace {

// /proc/PID/status's PPid; 0 if unknown (the process is gone, or is the init of syrupd's
// pid namespace).
pid_t parent_of(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("PPid:", 0) == 0) return static_cast<pid_t>(std::atoi(line.c_str() + 5));
  return 0;
}

// "31729 (nginx)": a pid and its command name, for messages.
std::string named(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/comm");
  std::string comm;
  std::getline(in, comm);
  return std::to_string(pid) + (comm.empty() ? "" : " (" + comm + ")");
}

// What /proc/PID/exe names (read as a link, never followed); "" if unreadable.
std::string program_of(pid_t pid) {
  char buf[4096];
  ssize_t n = readlink(("/proc/" + std::to_string(pid) + "/exe").c_str(), buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

bool holds_one(pid_t pid, const std::set<uint64_t>& sockets) {
  std::vector<std::pair<int, uint64_t>> fds;
  if (socket_descriptors(pid, fds)) return false;
  return std::any_of(fds.begin(), fds.end(), [&](const auto& f) { return sockets.count(f.second) > 0; });
}

}  // namespace

Anchor group_owner(const Caller& caller, pid_t given, const std::vector<uint64_t>& sockets) {
  Anchor a{given, given, {}, {}};
  const std::set<uint64_t> ours(sockets.begin(), sockets.end());
  const std::string program = program_of(given);
  for (int depth = 0; depth < 64; depth++) {  // bounded: a chain of such parents is short
    pid_t up = parent_of(a.pid);
    if (up <= 1 || up == getpid()) break;
    if (!holds_one(up, ours)) {
      if (!program.empty() && program_of(up) == program)
        a.note = "process " + named(up) + ", the parent of " + std::to_string(a.pid) +
                 ", runs the same program but holds none of its sockets (a server that hands its sockets from "
                 "an old worker to a new one, as HAProxy's master does): the policy ends when process " +
                 std::to_string(a.pid) + " exits, at the server's next reload; deploy again after it";
      break;
    }
    if (std::string ignored; check_target_process(caller, up, ignored)) {
      a.note = "process " + named(up) + ", the parent of " + std::to_string(a.pid) +
               ", holds the same sockets but belongs to uid " + std::to_string(process_uid(up)) +
               ", not to the caller: the policy ends when process " + std::to_string(a.pid) +
               " exits (a worker's exit at a reload ends it); deploy as that user or root to tie it to the parent";
      break;
    }
    a.pid = up;
  }
  if (a.pid != given)
    a.reason = "process " + named(a.pid) + " is the oldest ancestor of process " + std::to_string(given) +
               " that holds its sockets: the policy lives as long as it does, across reloads of its workers";
  return a;
}

void describe_anchor(const Anchor& a, nlohmann::json& out) {
  if (!a.pid) return;
  out["anchor_pid"] = a.pid;
  if (a.given && a.given != a.pid) out["pid_given"] = a.given;
  if (!a.reason.empty()) out["anchor_reason"] = a.reason;
  if (!a.note.empty()) out["anchor_note"] = a.note;
}

Anchor anchor_from(const nlohmann::json& saved, pid_t holder) {
  Anchor a;
  a.pid = holder;
  a.given = saved.value("pid_given", holder);
  a.reason = saved.value("anchor_reason", std::string());
  a.note = saved.value("anchor_note", std::string());
  return a;
}

}  // namespace syrup::socket_select
