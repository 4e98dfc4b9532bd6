// The thread hook's typed request (hooks/hook_request.h): which process's threads a policy
// schedules (pid), or which cgroup's (cgroup). Without either, the calling process's.
#pragma once

#include <sys/types.h>

#include <nlohmann/json.hpp>

#include "hook_request.h"

namespace syrup::thread {

struct ThreadRequest {
  pid_t pid = 0;  // 0: the caller's own process (or the cgroup's)
  std::string cgroup;  // instead of pid: the threads of the cgroup's processes
};

extern const std::vector<std::string> kKeys;

bool parse(const nlohmann::json& fields, ThreadRequest& out, Bad& bad);

// The request's fields as syrupd takes them: the cgroup if any (pid left out: the caller's to add).
nlohmann::json to_json(const ThreadRequest& r);

}  // namespace syrup::thread
