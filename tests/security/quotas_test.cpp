// Class 6 of the security suite (docs/security/input.md): quotas per uid, over all of its
// applications. The audit made 20 applications of 32 MiB of maps each in 2 s as one user:
// each within the per-application quotas (64 MiB), together 640 MiB of kernel memory.
// With syrupd's default flags Mallory is stopped by --quota_uid_map_bytes (256 MiB) with
// an error naming it, while Alice, another user, still deploys.
#include <fcntl.h>
#include <sys/socket.h>

#include "security/held_user.h"
#include "security/security.h"

namespace syrup::test::security {
namespace {

using nlohmann::json;

// A socket-select policy declaring one map of (4 + 8) x 2796202 bytes: 32 MiB as quotas
// count it.
const std::string k32MiB =
    "#include <syrup/policy.h>\n"
    "SYR_ARRAY(big, __u64, 2796202);\n"
    "SYR_POLICY(struct syr_input *in) {\n"
    "  __u32 k = 0;\n"
    "  __u64 *v = syr_map_lookup(&big, &k);\n"
    "  return v && *v ? 0 : SYR_PASS;\n"
    "}\n";

// Deploys k32MiB as application `app` on the sockets of `g`: id or -errno, and the error.
json deploy_32mib(const UdpGroup& g, const std::string& app) {
  int r = deploy_socket_select_source(k32MiB, "big32.c", g.fds(), app.c_str());
  return {{"r", r}, {"err", syr_last_error()}};
}

class UidQuotas : public ::testing::Test {
 protected:
  void SetUp() override {
    SYRUP_REQUIRE_ROOT();
    d_.start();  // syrupd's defaults
  }
  void TearDown() override {
    if (d_.pid() > 0) EXPECT_EQ(d_.stop(), 0);
  }
  Daemon d_;
};

TEST_F(UidQuotas, OneUserMakingManyApplicationsIsStoppedByItsUidQuotaWhileAnotherStillDeploys) {
  // Mallory's process holds her groups: her policies stay while Alice deploys.
  std::vector<std::unique_ptr<UdpGroup>> groups;
  HeldUser mallory(kMallory, [&] {
    json out = json::array();
    for (int i = 0; i < 20; i++) {
      groups.push_back(std::make_unique<UdpGroup>(1));
      json r = deploy_32mib(*groups.back(), "mallory" + std::to_string(i));
      out.push_back(r);
      if (r["r"].get<int>() < 0) break;
    }
    return json{{"mallory", out}};
  });
  json alice = as_user(kAlice, [&] {
    UdpGroup g(1);
    json r = deploy_32mib(g, "alice");
    if (r["r"].get<int>() > 0) syr_remove_policy(r["r"].get<int>());
    return r;
  });
  mallory.release();
  json m = mallory.result();
  m["alice"] = alice;
  ASSERT_TRUE(m.contains("mallory")) << m.dump();
  auto& tries = m["mallory"];
  // 8 x 32 MiB fit 256 MiB; the 9th is refused, naming the uid's limit and its flag.
  ASSERT_EQ(tries.size(), 9u) << tries.dump();
  for (size_t i = 0; i < 8; i++) EXPECT_GT(tries[i]["r"].get<int>(), 0) << i << ": " << tries[i].dump();
  EXPECT_EQ(tries[8]["r"], -EDQUOT) << tries[8].dump();
  EXPECT_NE(tries[8]["err"].get<std::string>().find(
                "uid 62001 would have 301989816 bytes of maps over all its applications; its quota is 268435456 "
                "(syrupd --quota_uid_map_bytes)"),
            std::string::npos)
      << tries[8].dump();
  EXPECT_GT(m["alice"]["r"].get<int>(), 0) << m["alice"].dump();
}

}  // namespace
}  // namespace syrup::test::security
