// Tenancy of recordings, shared by the per-hook recording tests: what `record` and
// `record_stop` answer uid `uid` for policy `id` and for an id that does not exist (the
// ids in their texts replaced by N), and the check that the two read alike.
#pragma once

#include <gtest/gtest.h>

#include <cerrno>
#include <string>

#include "harness.h"

namespace syrup::test {

inline nlohmann::json record_refusals_as(uid_t uid, const std::string& sock, int id) {
  return as_user(uid, [&] {
    nlohmann::json res = nlohmann::json::object();
    for (const char* op : {"record", "record_stop"})
      for (int target : {id, 999999}) {
        syrup::Client c;
        syrup::Message resp;
        if (c.connect(sock) || c.call({{"op", op}, {"id", target}, {"seconds", 1}}, resp))
          return nlohmann::json{{"error", c.error()}};
        std::string err = resp.body.value("error", std::string());
        if (size_t at = err.find(std::to_string(target)); at != std::string::npos)
          err.replace(at, std::to_string(target).size(), "N");
        res[std::string(op) + (target == id ? "_victim" : "_missing")] = {
            {"errno", resp.body.value("errno", 0)}, {"error", err}, {"fds", resp.fds.size()}};
      }
    return res;
  });
}

// Another's policy reads as a missing one (ENOENT, the same words) and hands over no pipe.
inline void expect_refused_as_missing(const nlohmann::json& got) {
  ASSERT_FALSE(got.contains("error")) << got.dump();
  for (const char* op : {"record", "record_stop"}) {
    nlohmann::json v = got[std::string(op) + "_victim"], m = got[std::string(op) + "_missing"];
    EXPECT_EQ(v["errno"], ENOENT) << v.dump();
    EXPECT_EQ(v, m) << "another's policy must read as a missing one";
    EXPECT_EQ(v["fds"], 0);
  }
}

}  // namespace syrup::test
