// The control plane with many policies: list and stats answer in bounded pages that join
// to the whole (and whose cursor names nothing the caller may not see), a policy at rest
// holds about one descriptor of syrupd's (its program and maps reopened by id when a
// request needs them), and a restart adopts many policies of one holder process, each
// still deciding.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

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

// How many descriptors process `pid` has open.
size_t open_fds(pid_t pid) {
  size_t n = 0;
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec))
    n++;
  return n;
}

// Decisions `stats` counts for policy `id`, or -1 if it does not show it.
int64_t decisions(int id) {
  json r = request({{"op", "stats"}});
  for (auto& e : r.value("stats", json::array()))
    if (e["id"] == id) return e["decisions"].get<int64_t>();
  return -1;
}

// Waits (up to 2 s) until syrupd holds at most `n` descriptors and a few more (a compile
// worker's first compile may keep its own): what a request reopened is closed once its
// event is handled, which may be just after the answer arrives. Stats of every policy
// reopen two per policy, so a leak shows as many more.
bool holds(pid_t pid, size_t n) {
  return wait_for([&] { return open_fds(pid) <= n + 3; }, 2000) >= 0;
}

class ControlPlane : public SocketSelectTest {};

// syrupd keeps no descriptor of a deployed policy's program and maps (they are pinned;
// the socket-select target keeps its executor map, to see which sockets are open), and
// one pidfd per owner process: a request that needs them reopens them by id, and they are
// closed again after it.
TEST_F(ControlPlane, APolicyAtRestHoldsOneDescriptorAndStillAnswersStatsReplaceAndRemove) {
  constexpr size_t kPolicies = 20;
  pid_t d = daemon_->pid();
  std::vector<UdpGroup> groups;
  for (size_t i = 0; i < kPolicies; i++) groups.emplace_back(2);
  size_t before = open_fds(d);
  std::vector<int> ids;
  for (auto& g : groups) {
    ids.push_back(deploy("policies/round_robin.c", g, {}, "atrest"));
    ASSERT_GT(ids.back(), 0) << syr_last_error();
  }
  // One per policy (and the few a compile worker may keep, as holds() allows): 7.7 each
  // before policies at rest closed theirs.
  EXPECT_TRUE(holds(d, before + kPolicies))
      << "descriptors per policy: " << (open_fds(d) - before) / double(kPolicies);
  size_t after = open_fds(d);

  UdpClient c(groups[0].port());
  EXPECT_EQ(delivered(groups[0], c, 10), 10);
  EXPECT_EQ(decisions(ids[0]), 10) << "stats read from the reopened map";
  EXPECT_EQ(decisions(ids[1]), 0);
  EXPECT_TRUE(holds(d, after)) << "stats left " << open_fds(d) << " descriptors open, not " << after;

  // Replacing a policy at rest: the new program shares its executor map (reopened), and
  // the old program goes back if the replacement fails (its undo asks for it).
  int drop = deploy("tests/policies/drop_all.c", groups[0], {}, "atrest");
  ASSERT_GT(drop, 0) << syr_last_error();
  EXPECT_EQ(delivered(groups[0], c, 10), 0) << "the replacement decides";
  EXPECT_EQ(decisions(ids[0]), -1) << "the replaced policy is gone";
  EXPECT_TRUE(holds(d, after)) << open_fds(d) << " descriptors, not " << after;

  // Removing one at rest detaches it: the kernel's hash decides again.
  ASSERT_EQ(syr_remove_policy(drop), 0) << syr_last_error();
  EXPECT_EQ(delivered(groups[0], c, 10), 10);
  for (size_t i = 1; i < kPolicies; i++) ASSERT_EQ(syr_remove_policy(ids[i]), 0) << syr_last_error();
  EXPECT_TRUE(holds(d, before)) << "after removing everything: " << open_fds(d) << ", not " << before;
}

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

// A few hundred policies adopted after SIGKILL: all listed, syrupd holding about one
// descriptor each, each still deciding and counted by stats, and removable.
TEST(ControlPlaneRestart, HundredsOfPoliciesAreAdoptedAtOneDescriptorEach) {
  SYRUP_REQUIRE_ROOT();
  constexpr size_t kPolicies = 200;
  Daemon d;
  d.start();
  size_t base = open_fds(d.pid());
  std::vector<UdpGroup> groups;
  for (size_t i = 0; i < kPolicies; i++) groups.emplace_back(1);
  std::vector<int> ids;
  for (auto& g : groups) {
    ids.push_back(deploy_on(g, "tests/policies/drop_all.c", "hundreds"));
    ASSERT_GT(ids.back(), 0) << syr_last_error();
  }
  d.crash();
  d.start(d.bpffs_root());
  EXPECT_NE(d.log().find("adopted " + std::to_string(kPolicies) + " policies"), std::string::npos) << d.log();
  EXPECT_EQ(list_policies().size(), kPolicies);
  size_t held = open_fds(d.pid());
  EXPECT_LE(held, base + kPolicies + 2) << "descriptors per adopted policy: " << (held - base) / double(kPolicies);
  for (size_t i : {size_t{0}, kPolicies / 2, kPolicies - 1}) {
    UdpClient c(groups[i].port());
    EXPECT_EQ(delivered(groups[i], c, 5), 0) << "group " << i << " lost its policy in the restart";
    EXPECT_EQ(decisions(ids[i]), 5) << "policy " << ids[i];
  }
  ASSERT_EQ(syr_remove_policy(ids[0]), 0) << syr_last_error();
  UdpClient c(groups[0].port());
  EXPECT_EQ(delivered(groups[0], c, 5), 5) << "removed: the kernel's hash decides again";
  EXPECT_EQ(d.stop(), 0);
}

}  // namespace
}  // namespace syrup::test
