// syrupctl record and syrupctl trace (cmd_record.cpp).
#pragma once

#include <string>
#include <vector>

namespace syrupctl {

// `socket`: syrupd's control socket; `json`: --json. Return syrupctl's exit code.
int cmd_record(const std::vector<std::string>& args, const std::string& socket, bool json);
int cmd_trace(const std::vector<std::string>& args, const std::string& socket, bool json);

// The usage lines of both, for syrupctl --help.
extern const char* const kRecordUsage;

}  // namespace syrupctl
