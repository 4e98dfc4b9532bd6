// The control plane with many policies: list and stats answer in bounded pages that join
// to the whole (and whose cursor names nothing the caller may not see), and a restart
// adopts many policies of one holder process, each still deciding.
#include <gtest/gtest.h>
#include <unistd.h>

#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "client.h"
#include "harness.h"
#include "harness_socket_select.h"
#include "syrup/syrup.h"

namespace syrup::test {
namespace {

using nlohmann::json;

constexpr uid_t kMallory = 62001;

// One request on a connection of its own: the answer's body ({"transport": r} if none).
json request(const json& req) {
  Client c;
  Message resp;
  if (int r = c.connect(syr_socket_path())) return {{"transport", r}};
  if (int r = c.call(req, resp)) return {{"transport", r}};
  return resp.body;
}

// Every page of `op` with `limit` per page: the ids in order, and how many pages it took.
std::vector<int> page_through(const char* op, const char* field, int limit, int& pages) {
  std::vector<int> ids;
  json req = {{"op", op}, {"limit", limit}};
  for (pages = 0; pages < 100; pages++) {
    json r = request(req);
    EXPECT_TRUE(r.value("ok", false)) << r.dump();
    if (!r.value("ok", false)) break;
    EXPECT_LE(r[field].size(), static_cast<size_t>(limit)) << r.dump();
    for (auto& e : r[field]) ids.push_back(e["id"].get<int>());
    if (!r.contains("next")) {
      pages++;
      break;
    }
    EXPECT_EQ(r["next"], r[field].back()["id"]) << "the cursor is the page's last id";
    req["after"] = r["next"];
  }
  return ids;
}

class ControlPlane : public SocketSelectTest {};

TEST_F(ControlPlane, ListAndStatsComeInPagesThatJoinToTheWhole) {
  std::vector<UdpGroup> groups;
  for (int i = 0; i < 5; i++) groups.emplace_back(1);
  std::vector<int> deployed;
  for (int i = 0; i < 5; i++) {
    int id = deploy("policies/round_robin.c", groups[i], {}, i < 3 ? "pages-a" : "pages-b");
    ASSERT_GT(id, 0) << syr_last_error();
    deployed.push_back(id);
  }
  for (auto [op, field] : {std::pair{"list", "policies"}, std::pair{"stats", "stats"}}) {
    int pages = 0;
    std::vector<int> ids = page_through(op, field, 2, pages);
    EXPECT_EQ(ids, deployed) << op << ": every policy once, in ascending id";
    EXPECT_EQ(pages, 3) << op << ": 5 policies in pages of 2";
  }
  // Without a limit: one page of everything (fewer than 1000), no cursor.
  json all = request({{"op", "list"}});
  ASSERT_TRUE(all.value("ok", false)) << all.dump();
  EXPECT_EQ(all["policies"].size(), 5u);
  EXPECT_FALSE(all.contains("next")) << all.dump();
  // syrupctl joins the pages it gets.
  EXPECT_EQ(list_policies().size(), 5u);
}

TEST_F(ControlPlane, APageOfBadBoundsIsRefusedNamingTheField) {
  struct Case {
    json req;
    const char* says;
  } cases[] = {{{{"op", "list"}, {"limit", 0}}, "limit must be an integer in 1..1000"},
               {{{"op", "list"}, {"limit", 1001}}, "limit must be an integer in 1..1000"},
               {{{"op", "stats"}, {"limit", "ten"}}, "limit must be an integer in 1..1000"},
               {{{"op", "list"}, {"after", -1}}, "after must be an integer in 0..2147483647"},
               {{{"op", "stats"}, {"after", 4294967296}}, "after must be an integer in 0..2147483647"}};
  for (auto& c : cases) {
    json r = request(c.req);
    EXPECT_FALSE(r.value("ok", true)) << c.req.dump();
    EXPECT_EQ(r.value("errno", 0), EINVAL) << r.dump();
    EXPECT_NE(r.value("error", std::string()).find(c.says), std::string::npos) << r.dump();
  }
}

// An unprivileged user paging with the smallest page through a syrupd full of root's
// policies sees none of them, and no cursor that would give their ids away.
TEST_F(ControlPlane, AnotherUsersPagesShowNothingOfRootsPoliciesNotEvenTheirIds) {
  std::vector<UdpGroup> groups;
  for (int i = 0; i < 3; i++) groups.emplace_back(1);
  for (auto& g : groups) ASSERT_GT(deploy("policies/round_robin.c", g, {}, "roots"), 0) << syr_last_error();
  json seen = as_user(kMallory, [] {
    json out = json::object();
    for (const char* op : {"list", "stats"})
      for (int after : {0, 1, 2})
        out[std::string(op) + std::to_string(after)] = request({{"op", op}, {"limit", 1}, {"after", after}});
    return out;
  });
  ASSERT_FALSE(seen.contains("error")) << seen.dump();
  for (auto& [k, r] : seen.items()) {
    EXPECT_TRUE(r.value("ok", false)) << k << ": " << r.dump();
    const char* field = k.rfind("list", 0) == 0 ? "policies" : "stats";
    EXPECT_TRUE(r[field].empty()) << k << ": " << r.dump();
    EXPECT_FALSE(r.contains("next")) << k << ": " << r.dump();
  }
}

// 40 policies whose sockets one process holds: all adopted after SIGKILL, each still
// attached (drop_all.c drops what its group would get) and listed once.
TEST(ControlPlaneRestart, ManyPoliciesOfOneHolderAreAllAdoptedAndStillDecide) {
  SYRUP_REQUIRE_ROOT();
  constexpr int kPolicies = 40;
  Daemon d;
  d.start();
  std::vector<UdpGroup> groups;
  for (int i = 0; i < kPolicies; i++) groups.emplace_back(1);
  std::vector<UdpClient> clients;
  for (auto& g : groups) {
    ASSERT_GT(deploy_on(g, "tests/policies/drop_all.c", "many"), 0) << syr_last_error();
    clients.emplace_back(g.port());
  }
  d.crash();
  d.start(d.bpffs_root());
  EXPECT_NE(d.log().find("adopted " + std::to_string(kPolicies) + " policies"), std::string::npos) << d.log();
  EXPECT_EQ(list_policies().size(), static_cast<size_t>(kPolicies));
  for (int i : {0, kPolicies / 2, kPolicies - 1})
    EXPECT_EQ(delivered(groups[i], clients[i]), 0) << "group " << i << " lost its policy in the restart";
  EXPECT_EQ(d.stop(), 0);
}

}  // namespace
}  // namespace syrup::test
