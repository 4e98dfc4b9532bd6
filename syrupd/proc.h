// Process identity from /proc, shared by the daemon (a policy's owner) and the thread hook
// (scheduled processes and their agents): a pid alone can be reused, pid + start time
// names one process. Also a process's socket descriptors, for the socket-select and XDP
// hooks.
#pragma once

#include <dirent.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace syrup {

// Field 22 of /proc/PID/stat (start time in clock ticks, read after the parenthesised
// command name, which may hold spaces). 0 if there is no such process.
inline uint64_t process_start_time(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  size_t close = s.rfind(')');
  if (close == std::string::npos || close + 2 > s.size()) return 0;
  std::istringstream rest(s.substr(close + 2));
  std::string field;
  for (int i = 3; i <= 22 && rest >> field; i++)
    if (i == 22) return std::strtoull(field.c_str(), nullptr, 10);
  return 0;
}

// The pid namespace process `pid` is in (the inode of /proc/PID/ns/pid); 0 if unknown.
inline uint64_t pid_namespace(pid_t pid) {
  struct stat st;
  std::string path = "/proc/" + (pid > 0 ? std::to_string(pid) : std::string("self")) + "/ns/pid";
  return stat(path.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_ino) : 0;
}

// The machine's first pid namespace: its /proc/PID/ns/pid inode is fixed
// (PROC_PID_INIT_INO, include/linux/proc_ns.h, since Linux 3.8). BPF programs see
// threads by their numbers there.
inline constexpr uint64_t kInitialPidNamespace = 0xEFFFFFFCU;

// A process's or thread's number in its own pid namespace (what its getpid() or gettid()
// returns): the last field of the NSpid line of its status (`status_path`), which lists
// its number in each namespace from /proc's down to its own. 0 if unreadable.
inline pid_t own_number(const std::string& status_path) {
  std::ifstream in(status_path);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("NSpid:", 0) != 0) continue;
    std::istringstream fields(line.substr(6));
    pid_t last = 0;
    for (pid_t v; fields >> v;) last = v;
    return last;
  }
  return 0;
}

// The entry of /proc directory `dir` (processes, or a process's tasks) whose own number
// is `n` and, if `ns` is not 0, whose pid namespace is `ns`; 0 if none.
inline pid_t entry_by_own_number(const std::string& dir, pid_t n, uint64_t ns = 0) {
  DIR* d = opendir(dir.c_str());
  if (!d) return 0;
  pid_t found = 0;
  while (dirent* de = readdir(d)) {
    if (de->d_name[0] < '1' || de->d_name[0] > '9') continue;
    // The namespace first: a stat is cheaper than reading the status of every process.
    struct stat st;
    if (ns && (stat((dir + "/" + de->d_name + "/ns/pid").c_str(), &st) != 0 || st.st_ino != ns)) continue;
    if (own_number(dir + "/" + de->d_name + "/status") != n) continue;
    found = static_cast<pid_t>(std::atoi(de->d_name));
    break;
  }
  closedir(d);
  return found;
}

// The thread of process `pid` (both numbered as syrupd's /proc numbers them) that the
// process's own pid namespace calls `tid`; 0 if it has none.
inline pid_t thread_by_own_number(pid_t pid, pid_t tid) {
  return entry_by_own_number("/proc/" + std::to_string(pid) + "/task", tid);
}

// The process that pid namespace `ns` calls `pid`, as syrupd numbers it; 0 if none.
inline pid_t process_by_own_number(uint64_t ns, pid_t pid) { return entry_by_own_number("/proc", pid, ns); }

// The socket descriptors of process `pid`, as (fd number, socket inode) in ascending fd
// order. 0, or -errno when its descriptor directory cannot be read.
inline int socket_descriptors(pid_t pid, std::vector<std::pair<int, uint64_t>>& out) {
  DIR* d = opendir(("/proc/" + std::to_string(pid) + "/fd").c_str());
  if (!d) return -errno;
  while (dirent* de = readdir(d)) {
    char link[64];
    ssize_t l = de->d_name[0] == '.' ? -1 : readlinkat(dirfd(d), de->d_name, link, sizeof link - 1);
    unsigned long long ino = 0;
    if (l <= 0) continue;
    link[l] = 0;
    if (std::sscanf(link, "socket:[%llu]", &ino) == 1) out.emplace_back(std::atoi(de->d_name), ino);
  }
  closedir(d);
  std::sort(out.begin(), out.end());
  return 0;
}

}  // namespace syrup
