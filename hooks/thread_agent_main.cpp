// syrup-agent: the thread hook's per-process user-space agent (hooks/thread_agent.h).
// Started by syrupd; not meant to be run by hand:
//   syrup-agent --tgid PID --policy-dir DIR --maps-dir DIR [--all] [--period-us N]
//               [--heartbeat-fd FD] [--ready-fd FD] --nice N --cpus 0,1,...
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "thread_agent.h"

int main(int argc, char** argv) {
  // If syrupd dies, the agent restores the threads and exits (SIGTERM path).
  prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (getppid() == 1) return 1;
  syrup::thread::AgentOptions o;
  bool have_cpus = false;
  for (int i = 1; i < argc; i++) {
    std::string a = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "syrup-agent: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--tgid") o.tgid = std::atoi(val().c_str());
    else if (a == "--policy-dir") o.policy_dir = val();
    else if (a == "--maps-dir") o.maps_dir = val();
    else if (a == "--all") o.all_threads = true;
    else if (a == "--period-us") o.period_us = std::atoi(val().c_str());
    else if (a == "--heartbeat-fd") o.heartbeat_fd = std::atoi(val().c_str());
    else if (a == "--ready-fd") o.ready_fd = std::atoi(val().c_str());
    else if (a == "--nice") o.baseline.nice = std::atoi(val().c_str());
    else if (a == "--cpus") o.baseline.cpus = syrup::thread::cpus_from_string(val()), have_cpus = true;
    else {
      std::fprintf(stderr, "syrup-agent: unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  if (o.tgid <= 0 || o.policy_dir.empty() || o.maps_dir.empty() || !have_cpus) {
    std::fprintf(stderr, "syrup-agent: started by syrupd only (--tgid, --policy-dir, --maps-dir, --cpus)\n");
    return 2;
  }
  if (o.period_us < 100) o.period_us = 100;
  return syrup::thread::run_agent(o);
}
