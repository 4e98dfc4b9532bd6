// A minimal HTTP client over loopback TCP for the tests of syrupd's metrics endpoint:
// the endpoint's own tests (syrupd/tests/metrics_test.cpp, no syrupd) send exact requests, byte for byte,
// and the integration tests scrape a real syrupd (harness.h's http_get). Every call is
// bounded: 3 s send and receive timeouts.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>

namespace syrup::test {

// A TCP connection to 127.0.0.1:port (3 s timeouts; `nonblock`: the connect may still be
// in progress), or -1 with errno.
inline int tcp_connect(uint16_t port, bool nonblock = false) {
  int c = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | (nonblock ? SOCK_NONBLOCK : 0), 0);
  if (c < 0) return -1;
  timeval tv{3, 0};
  setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(c, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(c, reinterpret_cast<sockaddr*>(&a), sizeof a) < 0 && errno != EINPROGRESS) {
    int e = errno;
    close(c);
    errno = e;
    return -1;
  }
  return c;
}

// Everything the server sends on `c` until it closes the connection (or 3 s pass).
inline std::string read_all(int c) {
  std::string out;
  char buf[4096];
  for (;;) {
    ssize_t n = recv(c, buf, sizeof buf, 0);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

// Sends `request` on a new connection; the whole response, or "connect: <reason>".
inline std::string http_exchange(uint16_t port, const std::string& request) {
  int c = tcp_connect(port);
  if (c < 0) return "connect: " + std::string(std::strerror(errno));
  send(c, request.data(), request.size(), MSG_NOSIGNAL);
  std::string r = read_all(c);
  close(c);
  return r;
}

}  // namespace syrup::test
