// syrupd's own suite, on the socket-select hook (its decisions are the easiest to see
// from a test): replace under traffic, maps shared by name and mmapped, remove and what
// became of a removed policy, syrupctl's dump, stats and tables, a group's owner, a
// policy's end with its process, an unprivileged application through libsyrup. A real
// syrupd and real BPF; each test asserts what the user sees.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "harness.h"
#include "harness_socket_select.h"
#include "syrup/syrup.h"

namespace syrup::test {
namespace {

class SocketSelect : public SocketSelectTest {};

TEST_F(SocketSelect, LiveSwapUnderSteadyTrafficLosesAndMisroutesNothing) {
  constexpr int kSockets = 4, kDatagrams = 20000;
  UdpGroup g(kSockets);
  ASSERT_GT(deploy("tests/policies/by_key.c", g), 0) << syr_last_error();

  ByKeyTraffic traffic(g, kDatagrams, std::chrono::microseconds(50));
  // Swap back and forth between two different programs with the same mapping.
  int swaps = 0;
  for (int i = 0; i < 8; i++) {
    int id = deploy(i % 2 ? "tests/policies/by_key.c" : "tests/policies/by_key_v2.c", g);
    EXPECT_GT(id, 0) << syr_last_error();
    if (id <= 0) break;
    swaps++;
  }
  ByKeyTraffic::Result r = traffic.finish();
  EXPECT_EQ(swaps, 8);
  EXPECT_EQ(r.total, kDatagrams) << "datagrams lost during live swaps";
  EXPECT_EQ(r.misrouted, 0);
  std::string out;
  run_cmd(build_bin("syrupctl") + " --json list", out);
  EXPECT_EQ(nlohmann::json::parse(out).size(), 1u) << "replaced policies must be retired: " << out;
}

TEST_F(SocketSelect, PoliciesOfOneAppShareMapsByName) {
  UdpGroup a(2), b(2);
  int ida = deploy("policies/scan_avoid.c", a, {}, "shareapp");
  int idb = deploy("tests/policies/shares_scan_map.c", b, {}, "shareapp");
  ASSERT_GT(ida, 0) << syr_last_error();
  ASSERT_GT(idb, 0) << syr_last_error();
  syr_mapped_array m{};
  ASSERT_EQ(mmap_app_map("scan_map", &m, "shareapp"), "");
  syr_hint_set(&m, 0, 1);  // one store steers both policies away from executor 0
  UdpClient ca(a.port()), cb(b.port());
  for (int i = 0; i < 20; i++) {
    ca.send_request(1, i);
    cb.send_request(1, i);
  }
  EXPECT_EQ(a.drain(), (std::vector<int>{0, 20}));
  EXPECT_EQ(b.drain(), (std::vector<int>{0, 20}));
  // Another application's map of the same name is a different map.
  UdpGroup c(2);
  ASSERT_GT(deploy("policies/scan_avoid.c", c, {}, "otherapp"), 0) << syr_last_error();
  UdpClient cc(c.port());
  for (int i = 0; i < 20; i++) cc.send_request(1, i);
  EXPECT_EQ(c.drain(), (std::vector<int>{10, 10}));
  syr_map_munmap(&m);
}

// syr_map_mmap() of syr_map_open(name)'s unchecked result, the README's form, with a name the application
// does not have: the open's reason reaches the caller, and `a` is zeroed, so nothing
// stores through a stale pointer.
TEST_F(SocketSelect, MmapOfAMapTheApplicationLacksSaysWhyAndZeroesTheArray) {
  UdpGroup g(2);
  ASSERT_GT(deploy("policies/scan_avoid.c", g), 0) << syr_last_error();
  syr_mapped_array a;
  std::memset(&a, 0xab, sizeof a);
  EXPECT_EQ(syr_map_mmap(syr_map_open_app("socktest", "scan_mpa"), &a), -ENOENT);
  EXPECT_EQ(a.base, nullptr);
  EXPECT_EQ(a.mapped_len, 0u);
  EXPECT_EQ(std::string(syr_last_error()),
            "application 'socktest' has no map 'scan_mpa' (it has scan_map; maps exist while a deployed policy "
            "declares them)");
}

// Removing an id that is gone says what became of it: replaced, or removed by whom.
TEST_F(SocketSelect, RemovingAGonePolicySaysWhatBecameOfIt) {
  UdpGroup g(2);
  int first = deploy("policies/round_robin.c", g);
  ASSERT_GT(first, 0) << syr_last_error();
  int second = deploy("policies/pass.c", g);
  ASSERT_GT(second, 0) << syr_last_error();
  EXPECT_EQ(syr_remove_policy(first), -ENOENT);
  EXPECT_EQ(std::string(syr_last_error()), "no policy " + std::to_string(first) +
                                               " (round_robin.c of app 'socktest' was removed: replaced by policy " +
                                               std::to_string(second) + ")");
  ASSERT_EQ(syr_remove_policy(second), 0) << syr_last_error();
  std::string out;
  EXPECT_EQ(run_cmd(build_bin("syrupctl") + " remove " + std::to_string(second), out), 1);
  EXPECT_EQ(out, "syrupctl: no policy " + std::to_string(second) + " (pass.c of app 'socktest' was removed: removed by pid " +
                     std::to_string(getpid()) + ")\n");
  EXPECT_EQ(syr_remove_policy(999999), -ENOENT);
  EXPECT_EQ(std::string(syr_last_error()), "no policy 999999");
}

TEST_F(SocketSelect, SyrupctlDumpsMapsAndSumsStatsPerTenantAndHook) {
  UdpGroup g(2), h(2);
  ASSERT_GT(deploy("policies/least_loaded.c", g, {}, "dumper"), 0) << syr_last_error();
  ASSERT_GT(deploy("policies/round_robin.c", h, {}, "dumper"), 0) << syr_last_error();
  int fd = syr_map_open_app("dumper", "queue_len");
  ASSERT_GE(fd, 0) << syr_last_error();
  uint32_t k = 1;
  uint64_t v = 42;
  ASSERT_EQ(syr_map_update_elem(fd, &k, &v, 0), 0);
  close(fd);
  std::string out;
  ASSERT_EQ(run_cmd(build_bin("syrupctl") + " --json map dump --app dumper queue_len", out), 0) << out;
  auto j = nlohmann::json::parse(out);
  EXPECT_EQ(j["type"], "array");
  EXPECT_EQ(j["entries"][1]["key_int"], 1);
  EXPECT_EQ(j["entries"][1]["value_int"], 42);
  ASSERT_EQ(run_cmd(build_bin("syrupctl") + " map dump --app dumper queue_len", out), 0) << out;
  EXPECT_NE(out.find("map queue_len of app dumper (array)"), std::string::npos) << out;
  EXPECT_EQ(run_cmd(build_bin("syrupctl") + " map dump --app dumper no_such_map", out), 1);
  EXPECT_NE(out.find("has no map 'no_such_map'"), std::string::npos) << out;
  // It names the maps the application has (least_loaded declares one, round_robin none).
  EXPECT_NE(out.find("(it has queue_len; "), std::string::npos) << out;

  UdpClient cg(g.port()), ch(h.port());
  for (int i = 0; i < 10; i++) cg.send_request(1, i), ch.send_request(1, i);
  g.drain();
  h.drain();
  ASSERT_EQ(run_cmd(build_bin("syrupctl") + " --json stats --by tenant", out), 0) << out;
  auto t = nlohmann::json::parse(out);
  ASSERT_EQ(t.size(), 1u) << out;
  EXPECT_EQ(t[0]["tenant"], "dumper");
  EXPECT_EQ(t[0]["policies"], 2);
  EXPECT_EQ(t[0]["decisions"], 20);
  ASSERT_EQ(run_cmd(build_bin("syrupctl") + " --json stats --by hook", out), 0) << out;
  EXPECT_EQ(nlohmann::json::parse(out)[0]["hook"], "socket-select");
}

// `syrupctl list` and `stats --by` size their columns to what they hold: a long
// application name, a long policy name and an IPv6 group keep every cell of a row under
// its heading. Before, fixed widths (16 for APP, 18 for POLICY, 24 for TARGET) pushed the
// rest of such a row out of line.
TEST_F(SocketSelect, SyrupctlTablesKeepEveryCellUnderItsHeading) {
  sockaddr_in6 a{};
  a.sin6_family = AF_INET6;
  a.sin6_addr = in6addr_loopback;
  std::vector<int> fds(2);
  if (syr_open_reuseport_group(SOCK_DGRAM | SOCK_CLOEXEC, reinterpret_cast<sockaddr*>(&a), sizeof a, fds.data(),
                               fds.size()) != 0)
    GTEST_SKIP() << "no IPv6 loopback (::1) here: " << syr_last_error();
  std::vector<UniqueFd> held;
  for (int fd : fds) held.emplace_back(fd);
  const std::string app = "a-tenant-whose-name-is-longer-than-the-old-column";
  syr_deploy_opts o{.sz = sizeof o, .app = app.c_str(), .fds = fds.data(), .n_fds = fds.size(),
                    .name = "a_policy_with_a_long_name.c"};
  int id = syr_deploy_policy(source_path("policies/round_robin.c").c_str(), SYR_HOOK_SOCKET_SELECT, &o);
  ASSERT_GT(id, 0) << syr_last_error();
  ids_.push_back(id);
  UdpGroup g(2);
  ASSERT_GT(deploy("policies/pass.c", g), 0) << syr_last_error();

  // The header and the row naming `app`; each heading must start where its cell starts
  // (left-aligned) or end where it ends (right-aligned, ID and EXEC).
  auto lines_of = [&app](const std::string& cmd) {
    std::string out;
    EXPECT_EQ(run_cmd(build_bin("syrupctl") + " " + cmd, out), 0) << out;
    std::istringstream in(out);
    std::string header, line, row;
    std::getline(in, header);
    while (std::getline(in, line))
      if (line.find(app) != std::string::npos) row = line;
    EXPECT_FALSE(row.empty()) << out;
    return std::make_pair(header, row);
  };
  auto [header, row] = lines_of("list");
  ASSERT_FALSE(row.empty());
  EXPECT_EQ(row.find(std::to_string(id) + "  "), header.find("ID") + 2 - std::to_string(id).size())
      << header << "\n" << row;
  uint16_t port = ntohs(a.sin6_port);
  EXPECT_EQ(row.find(app), header.find("APP")) << header << "\n" << row;
  EXPECT_EQ(row.find("a_policy_with_a_long_name.c"), header.find("POLICY")) << header << "\n" << row;
  EXPECT_EQ(row.find("udp/::1:" + std::to_string(port)), header.find("TARGET")) << header << "\n" << row;
  EXPECT_EQ(row.find(" 2 ") + 2, header.find("EXEC") + 4) << header << "\n" << row;
  EXPECT_EQ(row.find(std::to_string(getpid())), header.find("OWNER")) << header << "\n" << row;

  auto [sheader, srow] = lines_of("stats --by tenant");
  ASSERT_FALSE(srow.empty());
  EXPECT_EQ(srow.find(" 1 ") + 2, sheader.find("POLICIES") + 8) << sheader << "\n" << srow;
}

TEST_F(SocketSelect, AnotherAppCannotTakeOverAGroup) {
  UdpGroup g(2);
  ASSERT_GT(deploy("policies/round_robin.c", g, {}, "owner-app"), 0) << syr_last_error();
  EXPECT_EQ(deploy("policies/pass.c", g, {}, "intruder-app"), -EBUSY);
  EXPECT_NE(std::string(syr_last_error()).find("is scheduled by application 'owner-app'"), std::string::npos)
      << syr_last_error();
}

TEST_F(SocketSelect, PolicyIsRemovedWhenTheDeployingProcessExits) {
  UdpGroup g(2);
  OwnerProcess owner([&] { return deploy_on(g, "policies/round_robin.c", "shortlived"); });
  ASSERT_GT(owner.id(), 0) << owner.error();
  owner.release();
  std::string out;
  bool gone = false;
  for (int i = 0; i < 100 && !gone; i++) {
    run_cmd(build_bin("syrupctl") + " --json list", out);
    gone = nlohmann::json::parse(out).empty();
    if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE(gone) << out;
  EXPECT_FALSE(std::filesystem::exists(daemon_->bpffs_root() + "/apps/shortlived"));
  EXPECT_NE(daemon_->log().find("owner process " + std::to_string(owner.pid()) + " exited"), std::string::npos);
}

TEST_F(SocketSelect, AnUnprivilegedApplicationDeploysAndWritesHintsWithoutCapabilities) {
  UdpGroup g(2);
  EXPECT_EQ(in_child([&]() -> std::string {
    // Drop to nobody: no capabilities at all.
    if (setgid(65534) || setuid(65534)) return std::string("setuid nobody: ") + strerror(errno);
    int id = deploy_socket_select("policies/scan_avoid.c", g.fds(), "nobody-app");
    if (id <= 0) return std::string("deploy as nobody: ") + syr_last_error();
    // By name of its application: a forked child would inherit the parent's syr_set_app().
    int fd = syr_map_open_app("nobody-app", "scan_map");
    syr_mapped_array m{};
    if (fd < 0 || syr_map_mmap(fd, &m)) return std::string("map as nobody: ") + syr_last_error();
    syr_hint_set(&m, 1, 1);
    UdpClient c(g.port());
    for (int i = 0; i < 10; i++) c.send_request(1, i);
    auto counts = g.drain();
    if (counts != std::vector<int>{10, 0})
      return "routing: " + std::to_string(counts[0]) + " and " + std::to_string(counts[1]) +
             " datagrams, want all 10 on socket 0";
    if (syr_remove_policy(id) != 0) return std::string("remove as nobody: ") + syr_last_error();
    return "";
  }), "");
}

}  // namespace
}  // namespace syrup::test
