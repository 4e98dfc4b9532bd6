// Shared set-up of the security suite (docs/security.md): a real syrupd, and callers
// that are unprivileged users. Every test here plays a hostile local user against a
// root syrupd and asserts what that user saw (error text, data, timing), never what
// syrupd believes about itself.
#pragma once

#include <grp.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#include <cstdint>
#include <functional>
#include <string>

#include <nlohmann/json.hpp>

#include "harness.h"
#include "unique_fd.h"

namespace syrup::test::security {

// Two unprivileged users (no account needed: syrupd identifies callers by SO_PEERCRED).
// 62001 is the attacker, 62002 the victim.
constexpr uid_t kMallory = 62001, kAlice = 62002;

// as_user(uid, fn): harness.h.

// A UDP socket of `family` bound to `addr`:0 (v6only for AF_INET6); its port, 0 on failure.
inline uint16_t bound_udp(UniqueFd& fd, int family, const char* addr, bool v6only = false) {
  fd.reset(socket(family, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  sockaddr_storage ss{};
  socklen_t len;
  if (family == AF_INET6) {
    int on = v6only;
    setsockopt(fd.get(), IPPROTO_IPV6, IPV6_V6ONLY, &on, sizeof on);
    auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
    a->sin6_family = AF_INET6;
    inet_pton(AF_INET6, addr, &a->sin6_addr);
    len = sizeof *a;
  } else {
    auto* a = reinterpret_cast<sockaddr_in*>(&ss);
    a->sin_family = AF_INET;
    inet_pton(AF_INET, addr, &a->sin_addr);
    len = sizeof *a;
  }
  if (!fd || bind(fd.get(), reinterpret_cast<sockaddr*>(&ss), len) ||
      getsockname(fd.get(), reinterpret_cast<sockaddr*>(&ss), &len))
    return 0;
  return ntohs(family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port
                                  : reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
}

}  // namespace syrup::test::security
