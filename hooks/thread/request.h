// The thread hook's typed request (hooks/hook_request.h): which process's threads a policy
// schedules. Without a pid, the calling process's.
#pragma once

#include <sys/types.h>

#include <nlohmann/json.hpp>

#include "hook_request.h"

namespace syrup::thread {

struct ThreadRequest {
  pid_t pid = 0;  // 0: the caller's own process
};

extern const std::vector<std::string> kKeys;

bool parse(const nlohmann::json& fields, ThreadRequest& out, Bad& bad);

// The request's fields as syrupd takes them: none (pid left out: the caller's to add).
nlohmann::json to_json(const ThreadRequest& r);

}  // namespace syrup::thread
