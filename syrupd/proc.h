// Process identity from /proc, shared by the daemon (a policy's owner) and the thread hook
// (scheduled processes and their agents): a pid alone can be reused, pid + start time
// names one process.
#pragma once

#include <dirent.h>
#include <sys/stat.h>
#include <sys/types.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>

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

// The thread of process `pid` (both numbered as syrupd's /proc numbers them) that the
// process's own pid namespace calls `tid` (its gettid()): the last field of the NSpid line
// of its status, which lists the thread's number in each namespace from /proc's down to
// its own. 0 if the process has no such thread.
inline pid_t thread_by_own_number(pid_t pid, pid_t tid) {
  std::string dir = "/proc/" + std::to_string(pid) + "/task";
  DIR* d = opendir(dir.c_str());
  if (!d) return 0;
  pid_t found = 0;
  while (dirent* de = readdir(d)) {
    if (de->d_name[0] == '.') continue;
    std::ifstream in(dir + "/" + de->d_name + "/status");
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("NSpid:", 0) != 0) continue;
      std::istringstream fields(line.substr(6));
      pid_t last = 0;
      for (pid_t v; fields >> v;) last = v;
      if (last == tid) found = static_cast<pid_t>(std::atoi(de->d_name));
      break;
    }
    if (found) break;
  }
  closedir(d);
  return found;
}

}  // namespace syrup
