// A connection to syrupd: one request, one response. Shared by libsyrup and syrupctl.
#pragma once

#include <span>
#include <string>

#include "protocol.h"

namespace syrup {

using proto::Message;

class Client {
 public:
  // 0 or -errno; on failure `error()` says what was tried.
  int connect(const std::string& path);
  // Sends `req` with `fds` and waits for the response. 0 or -errno (transport only:
  // a response with "ok": false still returns 0).
  int call(const nlohmann::json& req, Message& resp, std::span<const int> fds = {});
  const std::string& error() const { return error_; }
  // The connected socket, handed over (the client is unconnected after): for callers that
  // speak the protocol themselves, byte by byte (the security tests' trickling clients).
  UniqueFd take_socket() { return std::move(sock_); }

 private:
  UniqueFd sock_;
  std::string error_;
};

// Turns a response into 0 or -errno, filling `error` with its message (and log).
int response_status(const Message& resp, std::string& error);

}  // namespace syrup
