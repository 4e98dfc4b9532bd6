// The socket-select hook's typed request (hooks/hook_request.h): which SO_REUSEPORT group of
// which process a policy schedules. With a pid the group is found among that process's
// sockets by port (and protocol, address), with a cgroup among its processes' sockets; without one the request passes the group's
// sockets themselves (SCM_RIGHTS) and port, protocol and address say nothing.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "hook_request.h"

namespace syrup::socket_select {

struct SocketSelectRequest {
  pid_t pid = 0;         // 0: the sockets are passed with the request (or the cgroup's)
  std::string cgroup;    // instead of pid: the group among the sockets of the cgroup's processes
  uint16_t port = 0;     // with pid: 1..65535
  int protocol = 0;      // IPPROTO_UDP or IPPROTO_TCP; 0: udp if the process has both
  std::string address;   // as inet_ntop() writes it; empty: the process's only group on the port
};

// The keys parse() takes.
extern const std::vector<std::string> kKeys;

bool parse(const nlohmann::json& fields, SocketSelectRequest& out, Bad& bad);

// The request's fields as syrupd takes them (pid left out: the caller's to add).
nlohmann::json to_json(const SocketSelectRequest& r);

}  // namespace syrup::socket_select
