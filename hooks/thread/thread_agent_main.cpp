// syrup-agent: the thread hook's per-process user-space agent (hooks/thread/thread_agent.h).
// Started by syrupd; not meant to be run by hand:
//   syrup-agent --tgid PID --policy-dir DIR --maps-dir DIR [--all] [--period-us N]
//               [--heartbeat-fd FD] [--ready-fd FD] --nice N --cpus 0,1,... [--agent-cpus LIST]
//               [--cgroup-fd FD --cgroup-id ID --uid UID]
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "thread_agent.h"

int main(int argc, char** argv) {
  // The agent outlives a syrupd that crashes or exits keeping its policies: it runs in its
  // own session (syrupd starts it with setsid), has no parent-death signal, and ignores
  // SIGPIPE (syrupd's stderr may be a pipe nobody reads any more). A restarted syrupd
  // adopts it (hooks/thread/agent_hook.cpp: its pid, and the heartbeat pipe's read end the agent
  // keeps open as fd 5, taken with pidfd_getfd) or, if it is gone, restores the threads.
  signal(SIGPIPE, SIG_IGN);
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
    else if (a == "--cgroup-fd") o.cgroup_fd = std::atoi(val().c_str());
    else if (a == "--cgroup-id") o.cgroup_id = std::strtoull(val().c_str(), nullptr, 10);
    else if (a == "--uid") o.uid = static_cast<uid_t>(std::strtoul(val().c_str(), nullptr, 10));
    else if (a == "--cpus" || a == "--agent-cpus") {
      std::string v = val();
      if (syrup::thread::cpus_from_string(v, a == "--cpus" ? o.baseline.cpus : o.agent_cpus)) {
        std::fprintf(stderr, "syrup-agent: %s: '%s' is not a CPU list\n", a.c_str(), v.c_str());
        return 2;
      }
      have_cpus |= a == "--cpus";
    }
    else {
      std::fprintf(stderr, "syrup-agent: unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  if (o.tgid <= 0 || o.policy_dir.empty() || o.maps_dir.empty() || !have_cpus) {
    std::fprintf(stderr, "syrup-agent: started by syrupd only (--tgid, --policy-dir, --maps-dir, --cpus)\n");
    return 2;
  }
  if (o.cgroup_fd >= 0 && o.cgroup_id == 0) {
    std::fprintf(stderr, "syrup-agent: --cgroup-fd needs --cgroup-id\n");
    return 2;
  }
  if (o.period_us < 100) o.period_us = 100;
  return syrup::thread::run_agent(o);
}
