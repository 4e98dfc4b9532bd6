// The XDP hook's typed request (hooks/hook_request.h): which packets of which interface a
// policy schedules (protocol and ports), onto which executors (cores, or the AF_XDP
// sockets the request passes), and optionally for which process (pid: the policy ends
// with it unless it persists).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "hook_request.h"

namespace syrup::xdp {

// A CPU number is below this (the config's and syrupctl's bound; syrupd also bounds it by
// the machine's possible CPUs), and a policy has at most kMaxCpus of them.
inline constexpr int64_t kCpuLimit = 4096;
inline constexpr size_t kMaxCpus = 256;  // SYR_MAX_EXECUTORS

struct XdpRequest {
  std::string ifname;
  int protocol = 0;               // IPPROTO_UDP (the default) or IPPROTO_TCP
  std::set<uint16_t> ports;       // port and ports together: at least one, unless a cgroup gives them
  std::vector<uint32_t> cpus;     // in the order given; empty: every core, or the passed sockets
  pid_t pid = 0;                  // 0: the caller's process
  std::string cgroup;             // instead of pid: its processes' ports, when none are named
};

extern const std::vector<std::string> kKeys;

// cpus takes numbers and ranges "A-B" (what YAML's "0-3" becomes).
bool parse(const nlohmann::json& fields, XdpRequest& out, Bad& bad);

// The request's fields as syrupd takes them, defaults spelled out (pid left out).
nlohmann::json to_json(const XdpRequest& r);

}  // namespace syrup::xdp
