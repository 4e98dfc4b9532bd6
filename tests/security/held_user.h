// A child process that acts as an unprivileged user and stays alive, holding what it made
// (sockets, policies whose owner it is), until the test releases it: for the attacks of
// docs/security/input.md where the victim acts while the attacker's state is in place.
#pragma once

#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <functional>
#include <string>

#include <nlohmann/json.hpp>

#include "harness.h"

namespace syrup::test::security {

class HeldUser : public HeldChild {
 public:
  // Runs `fn` as `uid` in a child; the JSON it returns is result() once it has returned.
  HeldUser(uid_t uid, const std::function<nlohmann::json()>& fn)
      : HeldChild([&] {
          return setgroups(0, nullptr) || setgid(uid) || setuid(uid)
                     ? nlohmann::json{{"error", "cannot become uid " + std::to_string(uid)}}
                     : fn();
        }) {}
};

}  // namespace syrup::test::security
