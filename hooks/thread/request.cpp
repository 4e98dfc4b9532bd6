// The thread hook's parse() (request.h).
#include "thread/request.h"

namespace syrup::thread {

const std::vector<std::string> kKeys = {"pid"};

bool parse(const nlohmann::json& f, ThreadRequest& out, Bad& bad) {
  out = {};
  return request::only_keys(f, "thread", kKeys, bad) && request::pid(f, out.pid, bad);
}

nlohmann::json to_json(const ThreadRequest&) { return nlohmann::json::object(); }

}  // namespace syrup::thread
