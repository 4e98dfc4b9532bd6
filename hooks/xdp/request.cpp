// The XDP hook's parse() (request.h).
#include "xdp/request.h"

#include <netinet/in.h>

#include "names.h"

namespace syrup::xdp {

using nlohmann::json;

const std::vector<std::string> kKeys = {"ifname", "port", "ports", "protocol", "cpus", "pid", "cgroup"};

namespace {

bool ifname(const json& f, std::string& out, Bad& bad) {
  if (!f.contains("ifname")) {
    bad = {"ifname", "required key is missing"};
    return false;
  }
  const json& v = f["ifname"];
  if (!v.is_string() || !names::check("interface", v.get<std::string>(), names::Kind::kInterface).empty()) {
    bad = {"ifname", "must be an interface name (1..15 characters, no '/', ':', spaces or control characters), got " +
                         request::quote(v)};
    return false;
  }
  out = v.get<std::string>();
  return true;
}

bool ports(const json& f, bool cgroup, std::set<uint16_t>& out, Bad& bad) {
  int64_t v;
  if (f.contains("port")) {
    if (!request::integer(f, "port", 1, names::kMaxPort, v, bad)) return false;
    out.insert(static_cast<uint16_t>(v));
  }
  if (f.contains("ports")) {
    const json& list = f["ports"];
    auto refuse = [&] {
      bad = {"ports", "must be a list of ports, each an integer in 1..65535, got " + request::quote(list)};
      return false;
    };
    if (!list.is_array() || list.empty()) return refuse();
    for (const json& p : list) {
      if (!names::integer("port", p, 1, names::kMaxPort, v).empty()) {
        bad = {"ports", "must be a list of ports, each an integer in 1..65535, got " + request::quote(p)};
        return false;
      }
      if (!out.insert(static_cast<uint16_t>(v)).second) {
        bad = {"ports", "port " + std::to_string(v) + " is listed twice"};
        return false;
      }
    }
  }
  if (out.empty() && !cgroup) {
    bad = {"ports", "the xdp hook needs the ports it schedules: port or ports (or a cgroup: its processes' ports)"};
    return false;
  }
  return true;
}

// One element of cpus: a CPU number, or a range "A-B" (A <= B); false if neither.
bool cpu_range(const json& c, int64_t& a, int64_t& b) {
  if (c.is_number()) return names::integer("cpu", c, 0, kCpuLimit - 1, a).empty() && (b = a, true);
  if (!c.is_string()) return false;
  const std::string& s = c.get_ref<const std::string&>();
  size_t dash = s.find('-');
  if (dash == std::string::npos || dash == 0 || dash + 1 == s.size() || s.size() > 11) return false;
  for (size_t i = 0; i < s.size(); i++)
    if (i != dash && (s[i] < '0' || s[i] > '9')) return false;
  a = std::stoll(s.substr(0, dash));
  b = std::stoll(s.substr(dash + 1));
  return a <= b && b < kCpuLimit;
}

bool cpus(const json& f, std::vector<uint32_t>& out, Bad& bad) {
  if (!f.contains("cpus")) return true;
  const json& list = f["cpus"];
  std::string accepted = "must be a list of CPU numbers (0.." + std::to_string(kCpuLimit - 1) +
                         ") or ranges such as 0-3, got ";
  if (!list.is_array() || list.empty()) {
    bad = {"cpus", accepted + request::quote(list)};
    return false;
  }
  std::set<int64_t> seen;
  for (const json& c : list) {
    int64_t a, b;
    if (!cpu_range(c, a, b)) {
      bad = {"cpus", accepted + request::quote(c)};
      return false;
    }
    for (int64_t n = a; n <= b; n++) {
      if (!seen.insert(n).second) {
        bad = {"cpus", "CPU " + std::to_string(n) + " is listed twice"};
        return false;
      }
      if (seen.size() > kMaxCpus) {
        bad = {"cpus", "at most " + std::to_string(kMaxCpus) + " executors per policy"};
        return false;
      }
      out.push_back(static_cast<uint32_t>(n));
    }
  }
  return true;
}

}  // namespace

bool parse(const json& f, XdpRequest& out, Bad& bad) {
  out = {};
  return request::only_keys(f, "xdp", kKeys, bad) && ifname(f, out.ifname, bad) &&
         request::protocol(f, IPPROTO_UDP, out.protocol, bad) && request::pid(f, out.pid, bad) &&
         request::cgroup(f, out.pid, out.cgroup, bad) && ports(f, !out.cgroup.empty(), out.ports, bad) &&
         cpus(f, out.cpus, bad);
}

json to_json(const XdpRequest& r) {
  json j = {{"ifname", r.ifname},
            {"protocol", request::protocol_name(r.protocol)},
            {"ports", std::vector<uint16_t>(r.ports.begin(), r.ports.end())}};
  if (r.ports.empty()) j.erase("ports");
  if (!r.cgroup.empty()) j["cgroup"] = r.cgroup;
  if (!r.cpus.empty()) j["cpus"] = r.cpus;
  return j;
}

}  // namespace syrup::xdp
