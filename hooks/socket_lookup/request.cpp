// socket-lookup's parse() (request.h).
#include "socket_lookup/request.h"

#include "names.h"

namespace syrup::socket_lookup {

using nlohmann::json;

const std::vector<std::string> kKeys = {"pid", "cgroup", "protocol", "port", "port_end", "address"};

bool parse(const json& f, SocketLookupRequest& out, Bad& bad) {
  out = {};
  if (!request::only_keys(f, "socket-lookup", kKeys, bad) || !request::pid(f, out.pid, bad) ||
      !request::cgroup(f, out.pid, out.cgroup, bad) || !request::protocol(f, 0, out.protocol, bad))
    return false;
  if (!out.protocol) {
    bad = {"protocol", "required key is missing (tcp or udp)"};
    return false;
  }
  int64_t lo, hi;
  if (!f.contains("port")) {
    bad = {"port", "required key is missing (the first port steered)"};
    return false;
  }
  if (!request::integer(f, "port", 1, names::kMaxPort, lo, bad)) return false;
  hi = lo;
  if (f.contains("port_end") && !request::integer(f, "port_end", lo, names::kMaxPort, hi, bad)) return false;
  out.port = static_cast<uint16_t>(lo);
  out.port_end = static_cast<uint16_t>(hi);
  if (f.contains("address")) {
    const json& a = f["address"];
    if (!a.is_string() || names::canonical_address(a.get<std::string>(), out.address)) {
      bad = {"address", "must be an IPv4 or IPv6 address: the local address steered (e.g. 127.0.0.1, ::1), got " +
                            request::quote(a)};
      return false;
    }
  }
  return true;
}

json to_json(const SocketLookupRequest& r) {
  json j = {{"protocol", request::protocol_name(r.protocol)}, {"port", r.port}};
  if (!r.cgroup.empty()) j["cgroup"] = r.cgroup;
  if (r.port_end != r.port) j["port_end"] = r.port_end;
  if (!r.address.empty()) j["address"] = r.address;
  return j;
}

}  // namespace syrup::socket_lookup
