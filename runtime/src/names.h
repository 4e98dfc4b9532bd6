// How the protocol (docs/protocol.md) spells names and addresses, in one place for syrupd,
// its --config parser, libsyrup and syrupctl.
//
// Application names (a --config tenant is an application) and map names become bpffs path
// components under syrupd's pin root: 1..64 of [A-Za-z0-9_-]. bpffs refuses any name
// holding a '.' (the kernel reserves dots for its own files, kernel/bpf/inode.c), so a
// dotted application could never be pinned; the rule says so up front. Policy names are
// labels, never paths: they may also hold '.' (a file name such as round_robin.c), just
// not first.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>

#include <cerrno>
#include <cctype>
#include <string>
#include <string_view>

namespace syrup::names {

enum class Kind { kPinned, kLabel };

inline bool allowed(char c, Kind k) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || (k == Kind::kLabel && c == '.');
}

// Why `name` is not a valid `what` name ("application", "map", "tenant", "policy"), or empty.
inline std::string check(std::string_view what, std::string_view name, Kind k = Kind::kPinned) {
  std::string w(what);
  if (name.empty()) return w + " name is empty";
  if (name.size() > 64) return w + " name is longer than 64 characters";
  if (k == Kind::kLabel && name[0] == '.') return w + " name may not start with '.'";
  for (char c : name)
    if (!allowed(c, k))
      return w + " name '" + std::string(name) + "' has a character outside " +
             (k == Kind::kLabel ? "[A-Za-z0-9_.-]" : "[A-Za-z0-9_-] (bpffs refuses '.' in pin names)");
  return {};
}

// A valid application name made from a program's name: other characters become '_', cut to
// 64; "app" if nothing is left.
inline std::string application_from(std::string_view program) {
  std::string n;
  for (char c : program.substr(0, 64)) n += allowed(c, Kind::kPinned) ? c : '_';
  return n.empty() ? "app" : n;
}

// An IPv4 or IPv6 address as inet_ntop() writes it, which is how syrupd names a socket
// group's address ("127.0.0.1", "::1"; "0:0::1" becomes "::1"). 0 or -EINVAL.
inline int canonical_address(const std::string& text, std::string& out) {
  unsigned char buf[sizeof(in6_addr)];
  char s[INET6_ADDRSTRLEN];
  int family = inet_pton(AF_INET, text.c_str(), buf) == 1    ? AF_INET
               : inet_pton(AF_INET6, text.c_str(), buf) == 1 ? AF_INET6
                                                              : 0;
  if (!family || !inet_ntop(family, buf, s, sizeof s)) return -EINVAL;
  out = s;
  return 0;
}

}  // namespace syrup::names
