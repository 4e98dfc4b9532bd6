// socket-select's parse() (request.h).
#include "socket_select/request.h"

#include "names.h"

namespace syrup::socket_select {

using nlohmann::json;

const std::vector<std::string> kKeys = {"pid", "cgroup", "port", "protocol", "address"};

bool parse(const json& f, SocketSelectRequest& out, Bad& bad) {
  out = {};
  if (!request::only_keys(f, "socket-select", kKeys, bad) || !request::pid(f, out.pid, bad) ||
      !request::cgroup(f, out.pid, out.cgroup, bad) || !request::protocol(f, 0, out.protocol, bad))
    return false;
  if (f.contains("port")) {
    int64_t v;
    if (!request::integer(f, "port", 1, names::kMaxPort, v, bad)) return false;
    out.port = static_cast<uint16_t>(v);
  } else if (out.pid || !out.cgroup.empty()) {
    bad = {"port", "required key is missing"};
    return false;
  }
  if (f.contains("address")) {
    const json& a = f["address"];
    if (!a.is_string() || names::canonical_address(a.get<std::string>(), out.address)) {
      bad = {"address", "must be an IPv4 or IPv6 address as the sockets are bound (e.g. 127.0.0.1, ::, 0.0.0.0), got " +
                            request::quote(a)};
      return false;
    }
    if (!out.pid && out.cgroup.empty()) {
      bad = {"address", "chooses among the sockets of a process (with pid); passed sockets are their group already"};
      return false;
    }
  }
  return true;
}

json to_json(const SocketSelectRequest& r) {
  json j = json::object();
  if (!r.cgroup.empty()) j["cgroup"] = r.cgroup;
  if (r.port) j["port"] = r.port;
  if (r.protocol) j["protocol"] = request::protocol_name(r.protocol);
  if (!r.address.empty()) j["address"] = r.address;
  return j;
}

}  // namespace syrup::socket_select
