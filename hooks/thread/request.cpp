// The thread hook's parse() (request.h).
#include "thread/request.h"

namespace syrup::thread {

const std::vector<std::string> kKeys = {"pid", "cgroup"};

bool parse(const nlohmann::json& f, ThreadRequest& out, Bad& bad) {
  out = {};
  return request::only_keys(f, "thread", kKeys, bad) && request::pid(f, out.pid, bad) &&
         request::cgroup(f, out.pid, out.cgroup, bad);
}

nlohmann::json to_json(const ThreadRequest& r) {
  nlohmann::json j = nlohmann::json::object();
  if (!r.cgroup.empty()) j["cgroup"] = r.cgroup;
  return j;
}

}  // namespace syrup::thread
