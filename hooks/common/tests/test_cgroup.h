// A cgroup v2 subtree owned by one test: a parent "/syrup-test-PID" (under the v2 root
// syrupd finds, cgroup::v2_root) with the children a test names. Removed when it goes,
// its processes killed first, so a failing test leaves no cgroup behind.
#pragma once

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "cgroup.h"

namespace syrup::test {

class TestCgroup {
 public:
  explicit TestCgroup(std::vector<std::string> children) : children_(std::move(children)) {
    if (cgroup::v2_root(root_, why)) return;
    parent = "/syrup-test-" + std::to_string(getpid());
    if (mkdir(dir("").c_str(), 0755)) why = "mkdir " + dir("") + ": " + strerror(errno);
    for (auto& c : children_)
      if (why.empty() && mkdir(dir(c).c_str(), 0755)) why = "mkdir " + dir(c) + ": " + strerror(errno);
  }
  ~TestCgroup() {
    if (parent.empty()) return;
    for (auto& c : children_)
      for (int i = 0; i < 300 && rmdir(dir(c).c_str()) && errno == EBUSY; i++) {
        std::ifstream procs(dir(c) + "/cgroup.procs");
        for (pid_t p; procs >> p;) kill(p, SIGKILL);
        usleep(10000);
      }
    rmdir(dir("").c_str());
  }
  TestCgroup(const TestCgroup&) = delete;
  TestCgroup& operator=(const TestCgroup&) = delete;

  // Child `c` as /proc/PID/cgroup's 0:: line prints it ("" : the parent).
  std::string path(const std::string& c) const { return c.empty() ? parent : parent + "/" + c; }
  // Its directory.
  std::string dir(const std::string& c) const { return root_ + path(c); }
  // Moves process `pid` into child `c`.
  bool join(const std::string& c, pid_t pid) const {
    std::ofstream f(dir(c) + "/cgroup.procs");
    f << pid << std::flush;
    return f.good();
  }
  std::string parent, why;  // why: what failed, "" when it is made

 private:
  std::string root_;
  std::vector<std::string> children_;
};

}  // namespace syrup::test
