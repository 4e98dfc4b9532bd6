// How the protocol (docs/protocol.md) spells names, numbers and addresses, in one place for
// syrupd, its --config parser, libsyrup and syrupctl: every name and every integer field of
// a request is checked here, so a value is either taken exactly or refused, never cut.
//
// Application names (a --config tenant is an application) and map names become bpffs path
// components under syrupd's pin root: 1..64 of [A-Za-z0-9_-]. bpffs refuses any name
// holding a '.' (the kernel reserves dots for its own files, kernel/bpf/inode.c), so a
// dotted application could never be pinned; the rule says so up front. Policy names are
// labels, never paths: they may also hold '.' (a file name such as round_robin.c), just
// not first. Parameter names are C identifiers (they name a policy's variables), interface
// names follow the kernel's dev_valid_name(), and display names (the file name a policy's
// diagnostics show, the name `list` shows) may be any text but control characters: a
// newline in a name would split syrupd's log lines and `syrupctl list`'s rows.
// Invariant: no name that passes check() holds a byte below 0x20, 0x7f or a C1 control
// character, and no message here quotes such a byte (printable() escapes them).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>

#include <cerrno>
#include <cctype>
#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace syrup::names {

enum class Kind {
  kPinned,     // application, map, tenant: 1..64 of [A-Za-z0-9_-]
  kLabel,      // policy names of --config: 1..64 of [A-Za-z0-9_.-], not starting with '.'
  kParam,      // parameter names: a C identifier of 1..64 characters
  kInterface,  // 1..15 bytes, no '/', ':' or whitespace, not "." or ".."
  kDisplay,    // 1..4096 bytes of text without control characters
};

inline bool allowed(char c, Kind k) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || (k == Kind::kLabel && c == '.');
}

// Whether byte i of `s` starts a control character: C0, DEL, or C1 (U+0080..U+009F,
// 0xC2 0x80..0x9F in UTF-8).
inline bool control_at(std::string_view s, size_t i) {
  unsigned char c = static_cast<unsigned char>(s[i]);
  if (c < 0x20 || c == 0x7f) return true;
  return c == 0xc2 && i + 1 < s.size() && static_cast<unsigned char>(s[i + 1]) >= 0x80 &&
         static_cast<unsigned char>(s[i + 1]) <= 0x9f;
}

// `s` as a message may quote it: control characters as \xNN, cut at 80 bytes ("...").
inline std::string printable(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size() && i < 80; i++) {
    if (control_at(s, i)) {
      static const char h[] = "0123456789abcdef";
      unsigned char c = static_cast<unsigned char>(s[i]);
      out += "\\x";
      out += h[c >> 4];
      out += h[c & 15];
    } else {
      out += s[i];
    }
  }
  if (s.size() > 80) out += "...";
  return out;
}

// Why `name` is not a valid `what` name ("application", "map", "tenant", "policy",
// "parameter", "interface", "source"), or empty.
inline std::string check(std::string_view what, std::string_view name, Kind k = Kind::kPinned) {
  std::string w(what);
  size_t max = k == Kind::kInterface ? 15 : k == Kind::kDisplay ? 4096 : 64;
  if (name.empty()) return w + " name is empty";
  for (size_t i = 0; i < name.size(); i++)
    if (control_at(name, i))
      return w + " name '" + printable(name) + "' has a control character (byte " + std::to_string(i) + ")";
  if (name.size() > max) return w + " name is longer than " + std::to_string(max) + " characters";
  switch (k) {
    case Kind::kDisplay:
      return {};
    case Kind::kInterface:
      if (name == "." || name == "..") return w + " name may not be '.' or '..'";
      for (char c : name)
        if (c == '/' || c == ':' || c == ' ')
          return w + " name '" + std::string(name) + "' has a character the kernel refuses in interface names ('/', ':' or a space)";
      return {};
    case Kind::kParam:
      if (std::isdigit(static_cast<unsigned char>(name[0])))
        return w + " name '" + std::string(name) + "' is not a C identifier ([A-Za-z_][A-Za-z0-9_]*)";
      for (char c : name)
        if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_')
          return w + " name '" + std::string(name) + "' is not a C identifier ([A-Za-z_][A-Za-z0-9_]*)";
      return {};
    case Kind::kLabel:
      if (name[0] == '.') return w + " name may not start with '.'";
      [[fallthrough]];
    case Kind::kPinned:
      for (char c : name)
        if (!allowed(c, k))
          return w + " name '" + std::string(name) + "' has a character outside " +
                 (k == Kind::kLabel ? "[A-Za-z0-9_.-]" : "[A-Za-z0-9_-] (bpffs refuses '.' in pin names)");
      return {};
  }
  return {};
}

// The limits of integer fields that are the same wherever they appear.
inline constexpr int64_t kMaxPort = 65535;
inline constexpr int64_t kMaxPid = 4194304;  // PID_MAX_LIMIT: no pid or tid is larger

// Why `v`, the value of field `what`, is not an integer in lo..hi (a JSON number without
// a fraction: 9100.0 is not one), or empty with the value in `out`. Compared as 64-bit
// numbers, so 4294976396 is out of 1..65535 rather than 9100.
inline std::string integer(std::string_view what, const nlohmann::json& v, int64_t lo, int64_t hi, int64_t& out) {
  std::string range = std::to_string(lo) + ".." + std::to_string(hi);
  std::string got = v.dump(-1, ' ', true, nlohmann::json::error_handler_t::replace);
  if (got.size() > 40) got = got.substr(0, 40) + "...";
  bool in = false;
  if (v.is_number_unsigned()) {
    uint64_t u = v.get<uint64_t>();
    in = hi >= 0 && u <= static_cast<uint64_t>(hi) && (lo <= 0 || u >= static_cast<uint64_t>(lo));
    if (in) out = static_cast<int64_t>(u);
  } else if (v.is_number_integer()) {
    int64_t s = v.get<int64_t>();
    in = s >= lo && s <= hi;
    if (in) out = s;
  }
  if (in) return {};
  return std::string(what) + " must be an integer in " + range + ", got " + got;
}

// syrupd's --max_source_bytes unless set. No limit can be larger than what a request
// frame carries (protocol.h: 4 MiB with the rest of the request, the source escaped as a
// JSON string).
inline constexpr uint64_t kDefaultMaxSourceBytes = 1 << 20;

// Why a policy source of `bytes` is refused under `limit` (`where` names the limit's flag),
// or empty. The same words from syrupd, libsyrup and syrupctl.
inline std::string source_size(uint64_t bytes, uint64_t limit, std::string_view where) {
  if (bytes <= limit) return {};
  return "policy source is " + std::to_string(bytes) + " bytes; the limit is " + std::to_string(limit) + " (" +
         std::string(where) + ")";
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
