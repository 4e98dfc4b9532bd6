// Shared set-up of the security suite (docs/security.md): a real syrupd, and callers
// that are unprivileged users. Every test here plays a hostile local user against a
// root syrupd and asserts what that user saw (error text, data, timing), never what
// syrupd believes about itself.
#pragma once

#include <grp.h>
#include <sys/types.h>
#include <unistd.h>

#include <functional>
#include <string>

#include <nlohmann/json.hpp>

#include "harness.h"

namespace syrup::test::security {

// Two unprivileged users (no account needed: syrupd identifies callers by SO_PEERCRED).
// 62001 is the attacker, 62002 the victim.
constexpr uid_t kMallory = 62001, kAlice = 62002;

// Runs `fn` in a forked child as `uid` (gid the same, no supplementary groups, no
// capabilities) and returns the JSON it returned; {"error": ...} when it could not.
inline nlohmann::json as_user(uid_t uid, const std::function<nlohmann::json()>& fn) {
  std::string s = in_child([&] {
    if (setgroups(0, nullptr) || setgid(uid) || setuid(uid))
      return nlohmann::json{{"error", "cannot become uid " + std::to_string(uid)}}.dump();
    return fn().dump();
  });
  nlohmann::json j = nlohmann::json::parse(s, nullptr, false);
  return j.is_discarded() ? nlohmann::json{{"error", "child reported nothing: " + s}} : j;
}

}  // namespace syrup::test::security
