// The control protocol between libsyrup/syrupctl and syrupd (docs/protocol.md).
//
// A message is one frame on a SOCK_STREAM Unix socket: an 8-byte header (magic "SYR1",
// payload length, both little-endian u32) followed by a UTF-8 JSON object. File
// descriptors travel as SCM_RIGHTS on the header's first byte. Every request gets exactly
// one response, in order. Invariants: a frame is never larger than kMaxPayload and never
// carries more than kMaxFds descriptors; a receiver that sees either closes the
// connection rather than guess where the next frame starts.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "unique_fd.h"

namespace syrup::proto {

inline constexpr uint32_t kMagic = 0x31525953;  // "SYR1" in little-endian byte order
inline constexpr uint32_t kMaxPayload = 4u << 20;
inline constexpr size_t kMaxFds = 253;  // SCM_MAX_FD: the kernel's limit per message
inline constexpr int kVersion = 1;

inline constexpr const char* kDefaultSocket = "/run/syrup/syrupd.sock";

struct Message {
  nlohmann::json body;
  std::vector<UniqueFd> fds;
};

// 0 or -errno. Sends the whole frame (retrying short writes).
int send_message(int sock, const nlohmann::json& body, std::span<const int> fds = {});

// 0, -ENODATA on a clean end of stream before a frame starts, -EPROTO on a malformed
// frame (with `err` saying why), -ETIMEDOUT when the whole frame has not arrived within
// `timeout_ms` of the call (-1: no limit beyond the socket's own), or another -errno.
int recv_message(int sock, Message& out, std::string* err = nullptr, int timeout_ms = -1);

// Builds the standard error response.
nlohmann::json error_response(int err, const std::string& message, const std::string& log = {});

}  // namespace syrup::proto
