// Small helpers the daemon's files share (daemon.cpp, deploy.cpp): answers, hook names,
// a deploy request's names.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace syrup {

inline nlohmann::json ok(nlohmann::json extra = nlohmann::json::object()) {
  extra["ok"] = true;
  return extra;
}

// Hooks this syrupd knows of; a name with no backend is reserved for one to come.
inline constexpr const char* kHookNames[] = {"socket-select", "xdp", "thread"};

// A deploy request's policy name (shown in list) and the file name its diagnostics show:
// "name" and "source_name", each standing in for the other, else "policy.c".
inline void policy_names(const nlohmann::json& b, std::string& name, std::string& source_name) {
  auto str = [&](const char* k) {
    return b.contains(k) && b[k].is_string() ? b[k].get<std::string>() : std::string();
  };
  name = str("name");
  source_name = str("source_name");
  if (name.empty()) name = source_name.empty() ? "policy.c" : source_name;
  if (source_name.empty()) source_name = name;
  if (auto slash = name.rfind('/'); slash != std::string::npos) name = name.substr(slash + 1);
}

}  // namespace syrup
