// The field readers the hooks' parse() functions share (hook_request.h).
#include "hook_request.h"

#include <netinet/in.h>

#include <algorithm>

#include "names.h"

namespace syrup {

using nlohmann::json;

const std::vector<std::string> kDeployKeys = {"op",     "hook",   "hook_id", "app",    "name",
                                              "source", "source_name", "params", "persist"};

json hook_fields(const json& body) {
  json out = json::object();
  if (!body.is_object()) return out;
  for (auto& [k, v] : body.items())
    if (std::find(kDeployKeys.begin(), kDeployKeys.end(), k) == kDeployKeys.end()) out[k] = v;
  return out;
}

namespace request {

std::string quote(const json& v) {
  std::string s = v.dump(-1, ' ', true, json::error_handler_t::replace);
  return names::printable(s.size() > 40 ? s.substr(0, 40) + "..." : s);
}

bool only_keys(const json& fields, const char* hook, const std::vector<std::string>& keys, Bad& bad) {
  if (!fields.is_object()) {
    bad = {"fields", "must be an object, got " + quote(fields)};
    return false;
  }
  for (auto& [k, v] : fields.items()) {
    if (std::find(keys.begin(), keys.end(), k) != keys.end()) continue;
    std::string list;
    for (auto& a : keys) list += (list.empty() ? "" : ", ") + a;
    bad = {names::printable(k), std::string("is not a key of the ") + hook + " hook (its keys: " + list + ")"};
    return false;
  }
  return true;
}

bool integer(const json& fields, const char* key, int64_t lo, int64_t hi, int64_t& out, Bad& bad) {
  // names::integer's words without its leading name: "must be an integer in lo..hi, got v".
  std::string why = names::integer("", fields.at(key), lo, hi, out);
  if (why.empty()) return true;
  bad = {key, why.substr(1)};
  return false;
}

bool pid(const json& fields, pid_t& out, Bad& bad) {
  out = 0;
  if (!fields.contains("pid")) return true;
  int64_t v;
  if (!integer(fields, "pid", 1, names::kMaxPid, v, bad)) return false;
  out = static_cast<pid_t>(v);
  return true;
}

bool protocol(const json& fields, int fallback, int& out, Bad& bad) {
  out = fallback;
  if (!fields.contains("protocol")) return true;
  const json& v = fields["protocol"];
  if (v == "udp" || v == "tcp") {
    out = v == "udp" ? IPPROTO_UDP : IPPROTO_TCP;
    return true;
  }
  bad = {"protocol", "must be udp or tcp, got " + quote(v)};
  return false;
}

const char* protocol_name(int protocol) {
  return protocol == IPPROTO_UDP ? "udp" : protocol == IPPROTO_TCP ? "tcp" : "";
}

}  // namespace request
}  // namespace syrup
