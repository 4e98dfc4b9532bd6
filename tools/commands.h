// The syrupctl commands kept in files of their own (cmd_test.cpp, cmd_top.cpp,
// cmd_replay.cpp), and what they take from syrupctl.cpp: how it asks syrupd and reports
// usage errors, so every command answers in the same words and exit codes.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace syrup::ctl {

constexpr int kExitFailed = 1, kExitUsage = 2, kExitUnreachable = 3;

struct Env {
  // Sends a request: 0 with the answer, or the exit code after printing why (syrupctl's
  // call()). `rate_waits`: how often to wait and ask again while over the request rate.
  std::function<int(const nlohmann::json& req, nlohmann::json& out, int rate_waits)> call;
  std::function<int(const std::string& why)> usage;  // prints, returns kExitUsage
};

int cmd_test(const std::vector<std::string>& args, const Env& env);
int cmd_top(const std::vector<std::string>& args, const Env& env);
int cmd_replay(const std::vector<std::string>& args, const Env& env);

}  // namespace syrup::ctl
