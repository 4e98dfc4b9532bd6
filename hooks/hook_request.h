// Typed requests: what a deploy asks of its hook, checked in one place for every entry
// point. A deploy's body (docs/protocol.md) holds keys every deploy takes (kDeployKeys:
// op, hook, app, name, source, params, persist) and its hook's *fields* (port, ifname,
// pid, ...). Each hook has a typed request (hooks/<id>/request.h) and one parse() from
// those fields that checks every key: its type, its range, whether it is required, and
// keys the hook does not take. syrupd's make_target(), the --config loader (YAML values
// converted to JSON) and syrupctl (its flags) all call it, so a bad value is refused in
// the same words wherever it is given.
//
// Invariants: parse() makes no system call (it is linked by syrupctl and the config
// loader, and runs on values a tenant chose); it returns true with every field of the
// typed request in range, or false with `bad` naming one key and saying what that key
// accepts; it never throws on any JSON value, however nested or large (values are
// quoted cut to 40 bytes, escaped).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace syrup {

// Why a request was refused: the key (as the protocol and YAML spell it) and what it
// accepts ("must be an integer in 1..65535, got 70000"). An entry point prefixes the key
// its own way: "port: ...", "tenants[0].policies[0].port: ...", "--port: ...".
struct Bad {
  std::string key, why;
  std::string str() const { return key + ": " + why; }
};

// The keys of a deploy that are not its hook's (docs/protocol.md, "deploy").
extern const std::vector<std::string> kDeployKeys;

// `body` without kDeployKeys: the fields its hook's parse() takes.
nlohmann::json hook_fields(const nlohmann::json& body);

namespace request {

// `v` as a message quotes it: JSON text, cut to 40 bytes, control characters escaped.
std::string quote(const nlohmann::json& v);

// Whether `fields` is an object of only `keys` (the hook's, listed in refusals).
bool only_keys(const nlohmann::json& fields, const char* hook, const std::vector<std::string>& keys, Bad& bad);
// fields[key], an integer in lo..hi (a JSON number without a fraction).
bool integer(const nlohmann::json& fields, const char* key, int64_t lo, int64_t hi, int64_t& out, Bad& bad);
// "pid", optional: 0 when absent, else 1..names::kMaxPid.
bool pid(const nlohmann::json& fields, pid_t& out, Bad& bad);
// "cgroup", optional: a cgroup v2 path as the "0::" line of /proc/PID/cgroup prints it,
// relative to the v2 root ("/system.slice/nginx.service"): at most kMaxCgroupPath bytes of
// letters, digits and . _ @ : + = , - in '/'-separated names, none "." or "..". Empty
// when absent. Refused beside a `pid` (one target, named one way).
inline constexpr size_t kMaxCgroupPath = 1024;
bool cgroup(const nlohmann::json& fields, pid_t pid, std::string& out, Bad& bad);
// "protocol", optional: "udp" (IPPROTO_UDP) or "tcp" (IPPROTO_TCP); `fallback` when absent.
bool protocol(const nlohmann::json& fields, int fallback, int& out, Bad& bad);
// The protocol's name in requests: "udp", "tcp", or "" for 0.
const char* protocol_name(int protocol);

// A hook spec's `check` (hooks/registry.h) for typed request `Req`: its parse(), and the
// fields in canonical spelling from its to_json(). One for every hook.
template <class Req, bool (*Parse)(const nlohmann::json&, Req&, Bad&), nlohmann::json (*ToJson)(const Req&)>
bool check(const nlohmann::json& fields, Bad& bad, nlohmann::json* canonical) {
  Req r;
  if (!Parse(fields, r, bad)) return false;
  if (canonical) *canonical = ToJson(r);
  return true;
}

}  // namespace request
}  // namespace syrup
