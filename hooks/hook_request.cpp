// The field readers the hooks' parse() functions share (hook_request.h).
#include "hook_request.h"

#include <netinet/in.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <string_view>

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

bool cgroup(const json& fields, pid_t pid, std::string& out, Bad& bad) {
  out.clear();
  if (!fields.contains("cgroup")) return true;
  const json& v = fields["cgroup"];
  auto refuse = [&](const std::string& why) {
    bad = {"cgroup", why + ", got " + quote(v)};
    return false;
  };
  const std::string accepts = "must be a cgroup v2 path as /proc/PID/cgroup's 0:: line prints it "
                              "(e.g. /system.slice/nginx.service): '/' then names of letters, digits and . _ @ : + = , -";
  if (!v.is_string()) return refuse(accepts);
  const std::string& s = v.get_ref<const std::string&>();
  if (s.size() > kMaxCgroupPath) return refuse("is longer than " + std::to_string(kMaxCgroupPath) + " bytes");
  if (s.size() < 2 || s[0] != '/') return refuse(accepts + ", below the root");
  for (size_t b = 1; b <= s.size();) {
    size_t e = std::min(s.find('/', b), s.size());
    std::string_view name(s.data() + b, e - b);
    if (name.empty() || name == "." || name == "..") return refuse(accepts + " (no empty, '.' or '..' name)");
    for (char c : name)
      if (!std::isalnum(static_cast<unsigned char>(c)) && (c == '\0' || !std::strchr("._@:+=,-", c))) return refuse(accepts);
    b = e + 1;
  }
  if (pid) {
    bad = {"cgroup", "give either a process (pid) or a cgroup, not both"};
    return false;
  }
  out = s;
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
