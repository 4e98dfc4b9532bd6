#include "protocol.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <endian.h>

#include <cerrno>
#include <chrono>
#include <cstring>

namespace syrup::proto {
namespace {

struct Header {
  uint32_t magic;
  uint32_t length;
};
static_assert(sizeof(Header) == 8);

using Clock = std::chrono::steady_clock;

// Waits until `sock` is readable or `deadline` (none: Clock::time_point::max()) passes.
// 0 or -ETIMEDOUT.
int wait_readable(int sock, Clock::time_point deadline) {
  if (deadline == Clock::time_point::max()) return 0;
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return -ETIMEDOUT;
    pollfd pf{sock, POLLIN, 0};
    int r = ::poll(&pf, 1, static_cast<int>(std::min<long long>(left, 60000)));
    if (r > 0) return 0;  // readable, closed or in error: recv() tells which
    if (r < 0 && errno != EINTR) return -errno;
  }
}

}  // namespace

int encode_frame(const nlohmann::json& body, std::string& out) {
  return encode_payload(body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), out);
}

int encode_payload(std::string_view payload, std::string& out) {
  if (payload.size() > kMaxPayload) return -EMSGSIZE;
  Header h{htole32(kMagic), htole32(static_cast<uint32_t>(payload.size()))};
  out.assign(reinterpret_cast<const char*>(&h), sizeof h);
  out += payload;
  return 0;
}

ssize_t send_some(int sock, const std::string& frame, size_t off, std::span<const int> fds) {
  if (off >= frame.size()) return 0;
  iovec iov{const_cast<char*>(frame.data()) + off, frame.size() - off};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  std::vector<char> control;
  if (off == 0 && !fds.empty()) {
    control.resize(CMSG_SPACE(sizeof(int) * fds.size()));
    msg.msg_control = control.data();
    msg.msg_controllen = control.size();
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  ssize_t w;
  do {
    w = ::sendmsg(sock, &msg, MSG_NOSIGNAL);
  } while (w < 0 && errno == EINTR);
  if (w < 0) return errno == EWOULDBLOCK ? -EAGAIN : -errno;
  return w;
}

int send_message(int sock, const nlohmann::json& body, std::span<const int> fds) {
  if (fds.size() > kMaxFds) return -E2BIG;
  std::string frame;
  if (int r = encode_frame(body, frame)) return r;
  for (size_t off = 0; off < frame.size();) {
    ssize_t w = send_some(sock, frame, off, off == 0 ? fds : std::span<const int>{});
    if (w < 0) return static_cast<int>(w);
    off += static_cast<size_t>(w);
  }
  return 0;
}

int FrameReader::read(int sock, Message& out, std::string* err) {
  auto fail = [&](const std::string& why) {
    if (err) *err = why;
    got_ = 0;
    payload_.clear();
    fds_.clear();
    return -EPROTO;
  };
  std::vector<char> control(CMSG_SPACE(sizeof(int) * kMaxFds));
  for (;;) {
    // The header first, then exactly the payload it announces.
    size_t want;
    char* into;
    if (got_ < sizeof(Header)) {
      want = sizeof(Header) - got_;
      into = header_ + got_;
    } else {
      size_t have = got_ - sizeof(Header);
      want = std::min<size_t>(length_ - have, 64 << 10);
      payload_.resize(have + want);
      into = payload_.data() + have;
    }
    if (want > 0) {
      iovec iov{into, want};
      msghdr msg{};
      msg.msg_iov = &iov;
      msg.msg_iovlen = 1;
      msg.msg_control = control.data();
      msg.msg_controllen = control.size();
      ssize_t r;
      do {
        r = ::recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
      } while (r < 0 && errno == EINTR);
      if (r < 0) return errno == EWOULDBLOCK ? -EAGAIN : -errno;
      for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
        size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < n; i++) {
          int fd;
          std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
          fds_.emplace_back(fd);
        }
      }
      if ((msg.msg_flags & MSG_CTRUNC) || fds_.size() > kMaxFds)
        return fail("too many file descriptors in one message");
      if (r == 0) {
        if (got_ == 0) return -ENODATA;
        return fail(got_ < sizeof(Header) ? "connection closed inside a frame header" : "connection closed inside a frame");
      }
      bool had_header = got_ >= sizeof(Header);
      if (had_header) payload_.resize(got_ - sizeof(Header) + static_cast<size_t>(r));
      got_ += static_cast<size_t>(r);
      if (!had_header && got_ == sizeof(Header)) {
        Header h;
        std::memcpy(&h, header_, sizeof h);
        if (le32toh(h.magic) != kMagic) return fail("bad frame magic (not a Syrup control message)");
        if (le32toh(h.length) > kMaxPayload)
          return fail("frame of " + std::to_string(le32toh(h.length)) + " bytes is larger than the limit of " +
                      std::to_string(kMaxPayload) + " bytes (4 MiB) a request may have");
        length_ = le32toh(h.length);
        payload_.clear();
      }
      if (got_ < sizeof(Header) || got_ - sizeof(Header) < length_) continue;
    }
    // Whole.
    got_ = 0;
    out.fds = std::move(fds_);
    fds_.clear();
    out.body = nlohmann::json::parse(payload_, nullptr, false);
    payload_.clear();
    payload_.shrink_to_fit();
    if (out.body.is_discarded() || !out.body.is_object()) {
      out.fds.clear();
      return fail("frame payload is not a JSON object");
    }
    return 0;
  }
}

int recv_message(int sock, Message& out, std::string* err, int timeout_ms) {
  // One deadline for the whole frame: a per-recv timeout alone lets a peer that sends a
  // byte now and then hold the reader for as long as it likes.
  Clock::time_point deadline =
      timeout_ms < 0 ? Clock::time_point::max() : Clock::now() + std::chrono::milliseconds(timeout_ms);
  out.body = nullptr;
  out.fds.clear();
  FrameReader reader;
  for (;;) {
    if (int w = wait_readable(sock, deadline)) return w;
    int r = reader.read(sock, out, err);
    if (r != -EAGAIN) return r;
  }
}

nlohmann::json error_response(int err, const std::string& message, const std::string& log) {
  nlohmann::json j = {{"ok", false}, {"errno", err < 0 ? -err : err}, {"error", message}};
  if (!log.empty()) j["log"] = log;
  return j;
}

}  // namespace syrup::proto
