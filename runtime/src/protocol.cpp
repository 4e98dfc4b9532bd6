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

int write_all(int sock, const char* p, size_t n) {
  while (n > 0) {
    ssize_t w = ::send(sock, p, n, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR) continue;
      return -errno;
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return 0;
}

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

int read_all(int sock, char* p, size_t n, Clock::time_point deadline) {
  while (n > 0) {
    if (int w = wait_readable(sock, deadline)) return w;
    ssize_t r = ::recv(sock, p, n, 0);
    if (r == 0) return -EPROTO;  // the peer closed in the middle of a frame
    if (r < 0) {
      if (errno == EINTR) continue;
      return -errno;
    }
    p += r;
    n -= static_cast<size_t>(r);
  }
  return 0;
}

}  // namespace

int send_message(int sock, const nlohmann::json& body, std::span<const int> fds) {
  if (fds.size() > kMaxFds) return -E2BIG;
  std::string payload = body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (payload.size() > kMaxPayload) return -EMSGSIZE;
  Header h{htole32(kMagic), htole32(static_cast<uint32_t>(payload.size()))};

  iovec iov[2] = {{&h, sizeof h}, {payload.data(), payload.size()}};
  msghdr msg{};
  msg.msg_iov = iov;
  msg.msg_iovlen = 2;
  std::vector<char> control;
  if (!fds.empty()) {
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
  if (w < 0) return -errno;
  // The descriptors went with the first byte; finish whatever the kernel did not take.
  size_t total = sizeof h + payload.size();
  size_t sent = static_cast<size_t>(w);
  if (sent < sizeof h) {
    int r = write_all(sock, reinterpret_cast<const char*>(&h) + sent, sizeof h - sent);
    if (r) return r;
    sent = sizeof h;
  }
  return write_all(sock, payload.data() + (sent - sizeof h), total - sent);
}

int recv_message(int sock, Message& out, std::string* err, int timeout_ms) {
  // One deadline for the whole frame: a per-recv timeout alone lets a peer that sends a
  // byte now and then hold the reader for as long as it likes.
  Clock::time_point deadline =
      timeout_ms < 0 ? Clock::time_point::max() : Clock::now() + std::chrono::milliseconds(timeout_ms);
  auto fail = [&](const char* why) {
    if (err) *err = why;
    return -EPROTO;
  };
  out.body = nullptr;
  out.fds.clear();

  Header h{};
  std::vector<char> control(CMSG_SPACE(sizeof(int) * kMaxFds));
  iovec iov{&h, sizeof h};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control.data();
  msg.msg_controllen = control.size();
  if (int w = wait_readable(sock, deadline)) return w;
  ssize_t r;
  do {
    r = ::recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
  } while (r < 0 && errno == EINTR);
  if (r < 0) return -errno;
  if (r == 0) return -ENODATA;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < n; i++) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
      out.fds.emplace_back(fd);
    }
  }
  if (msg.msg_flags & MSG_CTRUNC) return fail("too many file descriptors in one message");
  if (static_cast<size_t>(r) < sizeof h) {
    int rr = read_all(sock, reinterpret_cast<char*>(&h) + r, sizeof h - r, deadline);
    if (rr) return rr == -EPROTO ? fail("connection closed inside a frame header") : rr;
  }
  h.magic = le32toh(h.magic);
  h.length = le32toh(h.length);
  if (h.magic != kMagic) return fail("bad frame magic (not a Syrup control message)");
  if (h.length > kMaxPayload) {
    if (err)
      *err = "frame of " + std::to_string(h.length) + " bytes is larger than the limit of " +
             std::to_string(kMaxPayload) + " bytes (4 MiB) a request may have";
    return -EPROTO;
  }
  std::string payload(h.length, '\0');
  int rr = read_all(sock, payload.data(), payload.size(), deadline);
  if (rr) return rr == -EPROTO ? fail("connection closed inside a frame") : rr;
  out.body = nlohmann::json::parse(payload, nullptr, false);
  if (out.body.is_discarded() || !out.body.is_object())
    return fail("frame payload is not a JSON object");
  return 0;
}

nlohmann::json error_response(int err, const std::string& message, const std::string& log) {
  nlohmann::json j = {{"ok", false}, {"errno", err < 0 ? -err : err}, {"error", message}};
  if (!log.empty()) j["log"] = log;
  return j;
}

}  // namespace syrup::proto
