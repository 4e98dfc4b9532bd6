// Small helpers and constants the daemon's files share (daemon.cpp, control_server.cpp,
// policy_registry.cpp, state_store.cpp, config_reconciler.cpp, handlers.cpp, deploy.cpp).
#pragma once

#include <bpf/bpf.h>
#include <poll.h>

#include <cstring>
#include <map>
#include <optional>
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
                                              "record",   "record_stop", "test_run"};

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

// A request's "params" (deploy, test_run) into `params`; why not, or nothing (deploy.cpp).
std::optional<std::string> check_params(const nlohmann::json& b, std::map<std::string, uint64_t>& params);

// Map bytes as syrupd answers them (map_dump, test_run): hex, and integers where they fit.
inline std::string hex(const unsigned char* p, size_t n) {
  static const char* h = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; i++) {
    if (i) s += ' ';
    s += h[p[i] >> 4];
    s += h[p[i] & 15];
  }
  return s;
}

inline nlohmann::json as_number(const unsigned char* p, size_t n) {
  switch (n) {
    case 1: return p[0];
    case 2: { uint16_t v; std::memcpy(&v, p, 2); return v; }
    case 4: { uint32_t v; std::memcpy(&v, p, 4); return v; }
    case 8: { uint64_t v; std::memcpy(&v, p, 8); return v; }
  }
  return nullptr;
}

// One entry of a map_dump page: its key and value in hex, and as integers where they are
// 1, 2, 4 or 8 bytes; a per-CPU map's `ncpu` values each (0: not per-CPU).
inline nlohmann::json dump_entry(const std::vector<unsigned char>& key, const std::vector<unsigned char>& val, size_t ncpu,
                size_t vstride, uint32_t value_size) {
  nlohmann::json e = {{"key", hex(key.data(), key.size())}};
  if (auto k = as_number(key.data(), key.size()); !k.is_null()) e["key_int"] = k;
  if (ncpu) {
    nlohmann::json per = nlohmann::json::array();
    for (size_t c = 0; c < ncpu; c++) per.push_back(hex(&val[c * vstride], value_size));
    e["values"] = per;
  } else {
    e["value"] = hex(val.data(), val.size());
    if (auto v = as_number(val.data(), val.size()); !v.is_null()) e["value_int"] = v;
  }
  return e;
}

}  // namespace syrup
