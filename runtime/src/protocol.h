// The control protocol between libsyrup/syrupctl and syrupd (docs/protocol.md).
//
// A message is one frame on a SOCK_STREAM Unix socket: an 8-byte header (magic "SYR1",
// payload length, both little-endian u32) followed by a UTF-8 JSON object. File
// descriptors travel as SCM_RIGHTS on the header's first byte. Every request gets exactly
// one response, in order. Invariants: a frame is never larger than kMaxPayload and never
// carries more than kMaxFds descriptors; a receiver that sees either closes the
// connection rather than guess where the next frame starts.
#pragma once

#include <sys/types.h>

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

// The frame of `body` (header and payload) into `out`. 0 or -EMSGSIZE.
int encode_frame(const nlohmann::json& body, std::string& out);
// The frame of a payload serialised already (one JSON object). 0 or -EMSGSIZE.
int encode_payload(std::string_view payload, std::string& out);

// Sends what the socket takes now of frame bytes `frame` from `off` on, the descriptors
// `fds` with the frame's first byte (off 0). The bytes sent, or -errno (-EAGAIN: none
// now, on a non-blocking socket).
ssize_t send_some(int sock, const std::string& frame, size_t off, std::span<const int> fds = {});

// Assembles frames from a socket as their bytes arrive, so that a server never waits
// for a peer: read() takes what the socket has and returns; the caller bounds how long a
// frame may take (in_frame() says one has begun). Descriptors may come with any byte of
// a frame; more than kMaxFds in one frame, or a header beyond kMaxPayload, end the
// stream. It holds what arrived of the frame, no more. It reads no byte past the frame it assembles, so a frame sent behind it stays
// in the socket until asked for.
class FrameReader {
 public:
  // 0: a whole frame is in `out`; -EAGAIN: not whole yet (call again when readable);
  // -ENODATA: a clean end of stream before a frame began; -EPROTO with `err` saying why
  // (the stream cannot be resynchronised); another -errno.
  int read(int sock, Message& out, std::string* err = nullptr);
  bool in_frame() const { return got_ > 0; }

 private:
  char header_[8] = {};
  size_t got_ = 0;  // bytes of the current frame so far, header included
  uint32_t length_ = 0;  // the payload's, from the header
  // Grows with the bytes that came, not to the header's length at once: a header alone
  // (on each of many connections) makes the reader hold nothing more.
  std::string payload_;
  std::vector<UniqueFd> fds_;
};

// 0, -ENODATA on a clean end of stream before a frame starts, -EPROTO on a malformed
// frame (with `err` saying why), -ETIMEDOUT when the whole frame has not arrived within
// `timeout_ms` of the call (-1: no limit beyond the socket's own), or another -errno.
int recv_message(int sock, Message& out, std::string* err = nullptr, int timeout_ms = -1);

// Builds the standard error response.
nlohmann::json error_response(int err, const std::string& message, const std::string& log = {});

}  // namespace syrup::proto
