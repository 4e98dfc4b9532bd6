// Small helpers and constants the daemon's files share (daemon.cpp, control_server.cpp,
// policy_registry.cpp, state_store.cpp, config_reconciler.cpp, handlers.cpp, deploy.cpp).
#pragma once

#include <bpf/bpf.h>
#include <poll.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "pins.h"
#include "unique_fd.h"

namespace syrup {

// A begun request frame must be whole, and an answer read, within this: a peer that
// trickles bytes is closed then, and holds no one else meanwhile (reads never wait).
inline constexpr int kFrameDeadlineSec = 5;
// How often syrupd looks for policies whose attachment ended without news it could wait
// for (every socket of a socket-select group closed).
inline constexpr int kEndedCheckSec = 2;
inline constexpr int kConfigRetrySec = 5;  // how often --config entries waiting for their process or interface are retried

// The operations dispatch() serves (docs/protocol.md), in the order its error lists them.
// Only these become metric labels, so a client cannot grow the label set.
inline const std::vector<std::string> kOps = {"ping",     "deploy",   "remove",    "list",
                                              "stats",    "map_open", "map_dump", "thread_tid",
                                              "record",   "record_stop"};

// Has the process behind `pidfd` exited? A pidfd is readable from its process's exit on;
// false for -1 or a closed descriptor.
inline bool exited(int pidfd) {
  pollfd pf{pidfd, POLLIN, 0};
  return pidfd >= 0 && poll(&pf, 1, 0) == 1 && (pf.revents & POLLIN);
}

// The maps pinned under an application's directory, as its quotas count them: how many,
// and their memory (key + value bytes times entries). Quota checks and metrics agree.
struct MapUsage {
  size_t maps = 0;
  uint64_t bytes = 0;
};
inline MapUsage pinned_map_usage(const std::string& app) {
  MapUsage u;
  for (const auto& name : pins::app_map_names(app)) {
    UniqueFd m(pins::obj_get(pins::app_map(app, name)));
    bpf_map_info info{};
    uint32_t len = sizeof info;
    if (!m || bpf_map_get_info_by_fd(m.get(), &info, &len)) continue;
    u.maps++;
    u.bytes += uint64_t{info.key_size + info.value_size} * info.max_entries;
  }
  return u;
}

// A state-file entry as one line. Its strings may not be UTF-8 (a removal's reason quotes
// another process or the kernel; a --config policy's name is a file name): the dump
// replaces such bytes, so writing the state file can never make syrupd throw.
inline std::string state_entry(const nlohmann::json& entry) {
  return entry.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

inline nlohmann::json ok(nlohmann::json extra = nlohmann::json::object()) {
  extra["ok"] = true;
  return extra;
}

// A deploy request's policy name (shown in list) and the file name its diagnostics show:
// "name" and "source_name", each standing in for the other, else "policy.c".
inline void policy_names(const nlohmann::json& b, std::string& name, std::string& source_name) {
  auto str = [&](const char* k) {
    return b.contains(k) && b[k].is_string() ? b[k].get<std::string>() : std::string();
  };
  name = str("name");
  source_name = str("source_name");
  if (name.empty()) name = source_name.empty() ? "policy.c" : source_name;
  if (source_name.empty()) source_name = name;
  if (auto slash = name.rfind('/'); slash != std::string::npos) name = name.substr(slash + 1);
}

}  // namespace syrup
