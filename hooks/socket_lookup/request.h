// The socket-lookup hook's typed request (hooks/hook_request.h): which ports of which
// protocol (and local address) a policy steers, and whose sockets are its executors: a
// process's (pid), a cgroup's processes' (cgroup) or those passed with the request.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "hook_request.h"

namespace syrup::socket_lookup {

struct SocketLookupRequest {
  pid_t pid = 0;           // 0: the sockets are passed with the request (or the cgroup's)
  std::string cgroup;      // instead of pid: the sockets of the cgroup's processes
  int protocol = 0;        // IPPROTO_TCP or IPPROTO_UDP (required)
  uint16_t port = 0;       // the first port steered, 1..65535 (required)
  uint16_t port_end = 0;   // the last, port..65535 (port when absent)
  std::string address;     // the local address steered, as inet_ntop() writes it; empty: any
};

extern const std::vector<std::string> kKeys;

bool parse(const nlohmann::json& fields, SocketLookupRequest& out, Bad& bad);

// The request's fields as syrupd takes them (pid left out: the caller's to add).
nlohmann::json to_json(const SocketLookupRequest& r);

}  // namespace syrup::socket_lookup
