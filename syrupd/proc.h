// Process identity from /proc, shared by the daemon (a policy's owner) and the thread hook
// (scheduled processes and their agents): a pid alone can be reused, pid + start time
// names one process.
#pragma once

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

}  // namespace syrup
