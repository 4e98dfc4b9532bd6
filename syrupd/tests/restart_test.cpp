// syrupd stopped, killed and restarted: the policies it had are adopted from the state
// file and the pins, leftovers without a record are detached from their groups, and what
// the traffic saw across the restart is asserted (nothing lost, nothing misrouted).
#include <bpf/bpf.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "harness.h"
#include "harness_socket_select.h"
#include "syrup/syrup.h"

namespace syrup::test {
namespace {

// The state journal beside a syrupd's state file (syrupd/state_store.cpp).
std::string journal_file(const Daemon& d) { return d.state_file() + ".journal"; }

// What a syrupd left in its state files: the snapshot, and the journal's records after
// its first line (which names the snapshot's generation), each line parsed.
struct StateFiles {
  nlohmann::json snapshot;
  nlohmann::json head;
  std::vector<nlohmann::json> records;
};
StateFiles read_state_files(const Daemon& d) {
  StateFiles f;
  f.snapshot = nlohmann::json::parse(read_text(d.state_file()), nullptr, false);
  std::istringstream journal(read_text(journal_file(d)));
  std::string line;
  if (std::getline(journal, line)) f.head = nlohmann::json::parse(line, nullptr, false);
  while (std::getline(journal, line)) f.records.push_back(nlohmann::json::parse(line, nullptr, false));
  return f;
}

// The journal's lines, each with its newline.
std::vector<std::string> journal_lines(const Daemon& d) {
  std::vector<std::string> lines;
  std::istringstream journal(read_text(journal_file(d)));
  for (std::string line; std::getline(journal, line);) lines.push_back(line + "\n");
  return lines;
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc | std::ios::binary);
  out << text;
}

// Deploys drop_all.c on `g` through a syrupd that then dies and loses its state file,
// so that the syrupd started next finds the policy as a leftover: it must detach it, and
// `c`'s datagrams reach the group again.
void expect_leftover_detached(UdpGroup& g, UdpClient& c) {
  Daemon d;
  d.start();
  ASSERT_GT(deploy_on(g, "tests/policies/drop_all.c", "leftover"), 0) << syr_last_error();
  EXPECT_EQ(delivered(g, c), 0);
  d.crash();
  ASSERT_EQ(unlink(d.state_file().c_str()), 0) << strerror(errno);
  d.start(d.bpffs_root());
  EXPECT_NE(d.log().find("found 1 policies of a previous syrupd"), std::string::npos) << d.log();
  EXPECT_EQ(delivered(g, c), 10) << "the leftover program still drops";
  EXPECT_EQ(d.stop(), 0);
}

// syrupd killed with SIGKILL under steady traffic and restarted: the program stays
// attached throughout, the new syrupd adopts it, and `list` shows the same state.
TEST(SocketSelectRestart, SigkillUnderTrafficLosesNothingAndTheRestartAdopts) {
  SYRUP_REQUIRE_ROOT();
  Daemon d;
  d.start();
  constexpr int kSockets = 3, kDatagrams = 15000;
  UdpGroup g(kSockets);
  int id = deploy_on(g, "tests/policies/by_key.c", "restart");
  ASSERT_GT(id, 0) << syr_last_error();
  std::string before;
  ASSERT_EQ(run_cmd(build_bin("syrupctl") + " --json list", before), 0);

  ByKeyTraffic traffic(g, kDatagrams, std::chrono::microseconds(100));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  d.crash();
  d.start(d.bpffs_root());
  ByKeyTraffic::Result r = traffic.finish();
  EXPECT_EQ(r.total, kDatagrams) << "datagrams lost across the restart";
  EXPECT_EQ(r.misrouted, 0);
  EXPECT_NE(d.log().find("adopted 1 policies"), std::string::npos) << d.log();
  std::string after;
  ASSERT_EQ(run_cmd(build_bin("syrupctl") + " --json list", after), 0);
  auto jb = nlohmann::json::parse(before), ja = nlohmann::json::parse(after);
  ASSERT_EQ(ja.size(), 1u) << after;
  for (const char* k : {"id", "app", "name", "hook", "target", "executors", "owner_pid", "prog_id"})
    EXPECT_EQ(ja[0][k], jb[0][k]) << k;
  // The adopted policy is fully managed: removing it restores the kernel's hash.
  ASSERT_EQ(syr_remove_policy(id), 0) << syr_last_error();
  UdpClient c(g.port());
  for (int i = 0; i < 30; i++) c.send_request(1, i);
  auto counts = g.drain();
  EXPECT_EQ(std::count(counts.begin(), counts.end(), 30), 1);
  EXPECT_EQ(d.stop(), 0);
}

// A socket the application closes leaves its group at once, also across a restart of
// syrupd: what the policy sends to it falls back to the kernel's hash over the sockets
// still open (before, syrupd's duplicate kept it bound and chosen, a black hole until the
// application exited, and a restarted syrupd refused to adopt the policy). Removing the
// policy detaches its program through a socket the application still holds, even one it
// bound after the deploy.
TEST(SocketSelectRestart, ASocketTheApplicationClosesLeavesItsGroupAtOnce) {
  SYRUP_REQUIRE_ROOT();
  Daemon d;
  d.start();
  UdpGroup g(3);
  int id = deploy_on(g, "tests/policies/by_key.c", "closetest");  // key k to socket k % 3
  ASSERT_GT(id, 0) << syr_last_error();
  auto keys_received = [&g] {
    UdpClient c(g.port());
    for (uint32_t k = 0; k < 30; k++) c.send_request(1, k);
    return g.drain();
  };

  g.close(0);
  auto got = keys_received();
  EXPECT_EQ(got[1] + got[2], 30) << "keys 0, 3, ... (for the closed socket 0) must reach the open ones";
  std::string out;
  ASSERT_EQ(run_cmd(build_bin("syrupctl") + " --json stats " + std::to_string(id), out), 0) << out;
  EXPECT_EQ(nlohmann::json::parse(out)[0]["fallback"], 10) << out;

  d.crash();
  d.start(d.bpffs_root());
  EXPECT_NE(d.log().find("adopted 1 policies"), std::string::npos) << d.log();
  got = keys_received();
  EXPECT_EQ(got[1] + got[2], 30);

  g.add();  // socket 3 joins the group: not an executor, reached by the hash
  g.close(1);
  g.close(2);
  got = keys_received();
  EXPECT_EQ(got[3], 30) << "the only open socket of the group must get everything";

  auto j = list_policies();
  ASSERT_EQ(j.size(), 1u) << j.dump();
  uint32_t prog_id = j[0]["prog_id"].get<uint32_t>();
  ASSERT_EQ(syr_remove_policy(id), 0) << syr_last_error();
  EXPECT_GE(wait_for(
                [&] {
                  int fd = bpf_prog_get_fd_by_id(prog_id);
                  if (fd >= 0) close(fd);
                  return fd < 0;
                },
                2000),
            0)
      << "the removed policy's program is still attached to the group";
  EXPECT_EQ(d.stop(), 0);
}

// A group whose owner closed its copies of the sockets, while another process (a forked
// worker; here the test process) keeps them, is adopted by a restarted syrupd: it takes a
// socket from that process. Before, it asked the owner only and did not adopt the policy,
// whose program stayed attached with an empty map and kept dropping after the owner exited.
TEST(SocketSelectRestart, AGroupOnlyAnotherProcessHoldsIsAdoptedAndDetachedWhenItsOwnerExits) {
  SYRUP_REQUIRE_ROOT();
  Daemon d;
  d.start();
  UdpGroup g(2);
  OwnerProcess owner([&] {
    int id = deploy_on(g, "tests/policies/drop_all.c", "handedover");
    for (int fd : g.fds()) close(fd);  // the owner's copies; the test process keeps its own
    return id;
  });
  ASSERT_GT(owner.id(), 0) << owner.error();
  UdpClient c(g.port());
  EXPECT_EQ(delivered(g, c), 0);

  d.crash();
  d.start(d.bpffs_root());
  EXPECT_NE(d.log().find("adopted 1 policies"), std::string::npos) << d.log();
  auto j = list_policies();
  ASSERT_EQ(j.size(), 1u) << j.dump();
  EXPECT_EQ(j[0]["open_executors"], 2) << j.dump();
  EXPECT_EQ(delivered(g, c), 0) << "the adopted policy must still drop";

  owner.release();
  EXPECT_TRUE(none_listed()) << list_policies().dump();
  EXPECT_EQ(delivered(g, c), 10) << "the policy of the exited owner still drops";
  EXPECT_EQ(d.stop(), 0);
}

// A restarted syrupd without the state file cannot adopt a policy: its pins are leftovers,
// and no record names the group its program is attached to. The executor map still holds
// the group's sockets, and their cookies find a process's socket of the group: the program
// is detached through it, as the start's warning says ("their hooks use the kernel's
// default"). Before, only the map was emptied, and the program kept dropping what its
// policy dropped, with no policy listed.
TEST(SocketSelectRestart, ALeftoverPolicyIsDetachedFromItsGroup) {
  SYRUP_REQUIRE_ROOT();
  UdpGroup g(2);
  UdpClient c(g.port());
  expect_leftover_detached(g, c);
}

// The search for a leftover's group finds the socket of a cookie from the kernel's socket
// records and takes only that one. Taking every socket to read its cookie would re-tag
// each with syrupd's net_cls class id, changing how tc and netfilter treat the traffic of
// sockets that have nothing to do with the policy (here: a socket of the same process,
// made before the group, so the search meets it first).
TEST(SocketSelectRestart, TheLeftoverSearchTakesNoOtherSocket) {
  SYRUP_REQUIRE_ROOT();
  ClassedSocket bystander(kTestClassId);
  if (!bystander.skip.empty()) GTEST_SKIP() << bystander.skip;
  ASSERT_EQ(class_id(bystander.fd()), kTestClassId) << "the socket did not get the group's class id";
  UdpGroup g(2);
  UdpClient c(g.port());
  expect_leftover_detached(g, c);
  EXPECT_EQ(class_id(bystander.fd()), kTestClassId) << "syrupd took a socket outside the group";
}

// A group whose sockets are in a network namespace no task is in and no name holds (made
// by a thread that has ended) is missing from every socket record syrupd can read; the
// search then takes the sockets no record showed, and still detaches the leftover.
TEST(SocketSelectRestart, ALeftoverInANamespaceNoTaskIsInIsStillDetached) {
  SYRUP_REQUIRE_ROOT();
  NamespaceGroup n;
  ASSERT_EQ(n.failed, "");
  expect_leftover_detached(*n.group, *n.client);
}

// A restarted syrupd reads a group's network namespace from the sockets it adopts: it
// still tells the two groups of one port apart and adopts both policies.
TEST(SocketSelectRestart, GroupsOfOnePortInTwoNamespacesStayTwoTargetsAcrossARestart) {
  SYRUP_REQUIRE_ROOT();
  Daemon d;
  d.start();
  NamespaceGroup one;
  ASSERT_EQ(one.failed, "");
  NamespaceGroup two("", one.group->port());
  ASSERT_EQ(two.failed, "");
  ASSERT_GT(deploy_on(*one.group, "tests/policies/drop_all.c", "tenant-a"), 0) << syr_last_error();
  ASSERT_GT(deploy_on(*two.group, "tests/policies/drop_all.c", "tenant-b"), 0) << syr_last_error();
  auto before = list_policies();
  d.crash();
  d.start(d.bpffs_root());
  EXPECT_NE(d.log().find("adopted 2 policies"), std::string::npos) << d.log();
  auto after = list_policies();
  ASSERT_EQ(after.size(), 2u) << after.dump();
  for (int i = 0; i < 2; i++) EXPECT_EQ(after[i]["target"], before[i]["target"]) << before.dump() << after.dump();
  EXPECT_NE(after[0]["target"], after[1]["target"]) << after.dump();
  EXPECT_EQ(delivered(*one.group, *one.client), 0);
  EXPECT_EQ(delivered(*two.group, *two.client), 0);
  EXPECT_EQ(d.stop(), 0);
}

// A leftover that shares its executor map with an adopted policy (a replacement the
// previous syrupd pinned but had not recorded when it died; made here by pinning the
// adopted policy's program and map a second time under another id) is that policy's
// group: it is neither emptied nor detached.
TEST(SocketSelectRestart, ALeftoverSharingAnAdoptedPolicysMapLeavesItsGroupAlone) {
  SYRUP_REQUIRE_ROOT();
  Daemon d;
  d.start();
  UdpGroup g(2);
  int id = deploy_on(g, "tests/policies/drop_all.c", "shared");
  ASSERT_GT(id, 0) << syr_last_error();
  UdpClient c(g.port());
  EXPECT_EQ(delivered(g, c), 0);
  d.crash();
  std::string policies = d.bpffs_root() + "/apps/shared/policies/";
  std::string twin = policies + std::to_string(id + 100);
  ASSERT_EQ(mkdir(twin.c_str(), 0700), 0) << strerror(errno);
  for (const char* pin : {"prog", "syr_executors"}) {
    UniqueFd fd(bpf_obj_get((policies + std::to_string(id) + "/" + pin).c_str()));
    ASSERT_TRUE(fd) << pin << ": " << strerror(errno);
    ASSERT_EQ(bpf_obj_pin(fd.get(), (twin + "/" + pin).c_str()), 0) << strerror(errno);
  }
  d.start(d.bpffs_root());
  EXPECT_NE(d.log().find("adopted 1 policies"), std::string::npos) << d.log();
  EXPECT_NE(d.log().find("found 1 policies of a previous syrupd"), std::string::npos) << d.log();
  EXPECT_EQ(delivered(g, c), 0) << "the adopted policy's group lost its program";
  auto j = list_policies();
  ASSERT_EQ(j.size(), 1u) << j.dump();
  EXPECT_EQ(j[0]["open_executors"], 2) << "the adopted policy's executor map was emptied";
  EXPECT_EQ(d.stop(), 0);
}

// What became of a removed policy outlives syrupd, even one killed: a restart reads it
// from the state file. A policy the restarted syrupd cannot adopt (its sockets closed while syrupd was
// down) counts as removed, with the reason.
TEST(SocketSelectRestart, WhatBecameOfARemovedPolicyIsKeptAcrossARestart) {
  SYRUP_REQUIRE_ROOT();
  Daemon d;
  d.start();
  UdpGroup g(2);
  auto h = std::make_unique<UdpGroup>(2);
  int removed = deploy_on(g, "policies/pass.c", "gonetest");
  ASSERT_GT(removed, 0) << syr_last_error();
  ASSERT_EQ(syr_remove_policy(removed), 0) << syr_last_error();
  int orphaned = deploy_on(*h, "policies/round_robin.c", "gonetest");
  ASSERT_GT(orphaned, 0) << syr_last_error();
  d.crash();  // what the state file holds is what each change wrote
  h.reset();  // the group's last sockets: nothing left for the next syrupd to take over
  d.start(d.bpffs_root());
  ASSERT_EQ(d.answers(), "");
  EXPECT_NE(d.log().find("cannot adopt policy " + std::to_string(orphaned)), std::string::npos) << d.log();

  EXPECT_EQ(syr_remove_policy(removed), -ENOENT);
  EXPECT_EQ(std::string(syr_last_error()), "no policy " + std::to_string(removed) +
                                               " (pass.c of app 'gonetest' was removed: removed by pid " +
                                               std::to_string(getpid()) + ")");
  std::string out;
  EXPECT_EQ(run_cmd(build_bin("syrupctl") + " remove " + std::to_string(orphaned), out), 1);
  EXPECT_EQ(out.rfind("syrupctl: no policy " + std::to_string(orphaned) +
                          " (round_robin.c of app 'gonetest' was removed: not adopted when syrupd restarted: ",
                      0),
            0u)
      << out;
  EXPECT_EQ(d.stop(), 0);
}

// A state file with an entry of the wrong shape (edited by hand, or written by another
// version): syrupd still starts and adopts the rest; the entry's policy is released, its
// group back on the kernel's hash, and "no policy N" says which field was wrong.
TEST(SocketSelectRestart, AMalformedStateFileEntryCostsThatPolicyNotTheStart) {
  SYRUP_REQUIRE_ROOT();
  Daemon d;
  d.start();
  const char* by_key = "tests/policies/by_key.c";
  UdpGroup kept(2), spoiled(2);
  int kept_id = deploy_on(kept, by_key, "statefile"), spoiled_id = deploy_on(spoiled, by_key, "statefile");
  ASSERT_GT(kept_id, 0) << syr_last_error();
  ASSERT_GT(spoiled_id, 0) << syr_last_error();
  d.crash();
  // The snapshot was written at start, before the deploys: they are in the journal, one
  // record each. Edited as one file, the two merged (as a compaction would) and the
  // journal removed: its records would otherwise be applied over the edits.
  StateFiles files = read_state_files(d);
  ASSERT_EQ(files.snapshot["policies"].size(), 0u) << files.snapshot.dump();
  ASSERT_EQ(files.records.size(), 2u) << read_text(journal_file(d));
  nlohmann::json state = files.snapshot;
  for (auto& r : files.records)
    for (auto& p : r["put"]) state["policies"].push_back(p);
  ASSERT_EQ(unlink(journal_file(d).c_str()), 0) << strerror(errno);
  ASSERT_EQ(state["policies"].size(), 2u) << state.dump();
  for (auto& p : state["policies"])
    if (p["id"] == spoiled_id) p["uid"] = "root";
  state["policies"].push_back(42);  // not an entry at all
  for (auto& p : state["policies"])
    if (p.is_object() && p["id"] == kept_id) {
      state["policies"].push_back(p);  // twice
      break;
    }
  state["apps"] = nlohmann::json::array();
  {
    std::ofstream out(d.state_file(), std::ios::trunc);
    out << state.dump();
  }
  d.start(d.bpffs_root());
  ASSERT_EQ(d.answers(), "");
  EXPECT_NE(d.log().find("cannot adopt policy " + std::to_string(spoiled_id) +
                              " (by_key.c) of app 'statefile': its entry in the state file is malformed "
                              "(uid: type must be number, but is string)"),
            std::string::npos)
      << d.log();
  EXPECT_NE(d.log().find("cannot adopt entry 3 of the state file's policies: it is malformed (not a JSON object)"),
            std::string::npos)
      << d.log();
  EXPECT_NE(d.log().find("cannot adopt policy " + std::to_string(kept_id) +
                         " (by_key.c) of app 'statefile': an earlier entry of the state file has its id"),
            std::string::npos)
      << d.log();
  EXPECT_NE(d.log().find("adopted 1 policies"), std::string::npos) << d.log();

  std::string out;
  ASSERT_EQ(run_cmd(build_bin("syrupctl") + " --json list", out), 0) << out;
  auto listed = nlohmann::json::parse(out);
  ASSERT_EQ(listed.size(), 1u) << out;
  EXPECT_EQ(listed[0]["id"], kept_id);
  EXPECT_FALSE(std::filesystem::exists(d.bpffs_root() + "/apps/statefile/policies/" + std::to_string(spoiled_id)));
  // by_key.c sends key k to executor k % 2: the adopted policy still does, the released
  // one's group is on the kernel's hash (one flow, one socket).
  UdpClient to_kept(kept.port()), to_spoiled(spoiled.port());
  for (int k = 0; k < 20; k++) to_kept.send_request(1, k), to_spoiled.send_request(1, k);
  EXPECT_EQ(kept.drain(), (std::vector<int>{10, 10}));
  auto hashed = spoiled.drain();
  EXPECT_EQ(std::count(hashed.begin(), hashed.end(), 20), 1) << hashed[0] << " and " << hashed[1];

  EXPECT_EQ(syr_remove_policy(spoiled_id), -ENOENT);
  EXPECT_EQ(std::string(syr_last_error()),
            "no policy " + std::to_string(spoiled_id) +
                " (by_key.c of app 'statefile' was removed: not adopted when syrupd restarted: its entry in the "
                "state file is malformed (uid: type must be number, but is string))");
  EXPECT_EQ(syr_remove_policy(kept_id), 0) << syr_last_error();
  // Ids are never handed out twice, whatever the file said.
  EXPECT_GT(deploy_on(spoiled, by_key, "statefile"), spoiled_id) << syr_last_error();
  EXPECT_EQ(d.stop(), 0);
}

// syrupd killed with SIGKILL after deploys, a replacement and a removal, all since the
// state was last compacted (at start): the journal alone records them, and the next
// syrupd adopts exactly what was running -- the replacement, not the policy it replaced,
// not the removed one -- and still says what became of those two.
TEST(SocketSelectRestart, ARestartAfterSigkillAdoptsWhatTheJournalRecorded) {
  SYRUP_REQUIRE_ROOT();
  Daemon d;
  d.start();
  UdpGroup a(2), b(2), c(2);
  UdpClient to_a(a.port()), to_b(b.port()), to_c(c.port());
  int ia = deploy_on(a, "tests/policies/drop_all.c", "journal");
  int ib = deploy_on(b, "policies/pass.c", "journal");
  int ic = deploy_on(c, "tests/policies/drop_all.c", "journal");
  ASSERT_GT(ia, 0) << syr_last_error();
  ASSERT_GT(ib, 0) << syr_last_error();
  ASSERT_GT(ic, 0) << syr_last_error();
  int ib2 = deploy_on(b, "tests/policies/drop_all.c", "journal");  // replaces ib
  ASSERT_GT(ib2, 0) << syr_last_error();
  ASSERT_EQ(syr_remove_policy(ic), 0) << syr_last_error();
  d.crash();
  StateFiles files = read_state_files(d);
  ASSERT_EQ(files.snapshot["policies"].size(), 0u) << "compacted since the start: " << files.snapshot.dump();
  EXPECT_EQ(files.head["generation"], files.snapshot["generation"]) << files.head.dump();
  ASSERT_EQ(files.records.size(), 5u) << read_text(journal_file(d));  // 4 deploys, 1 removal

  d.start(d.bpffs_root());
  ASSERT_EQ(d.answers(), "");
  EXPECT_NE(d.log().find("applied 5 records of the state journal"), std::string::npos) << d.log();
  EXPECT_NE(d.log().find("adopted 2 policies"), std::string::npos) << d.log();
  EXPECT_EQ(d.log().find("found 1 policies of a previous syrupd"), std::string::npos) << d.log();
  auto listed = list_policies();
  ASSERT_EQ(listed.size(), 2u) << listed.dump();
  EXPECT_EQ(listed[0]["id"], ia);
  EXPECT_EQ(listed[1]["id"], ib2);
  EXPECT_EQ(delivered(a, to_a), 0) << "the adopted policy must still drop";
  EXPECT_EQ(delivered(b, to_b), 0) << "the replacement (drop_all) must run, not pass.c";
  EXPECT_EQ(delivered(c, to_c), 10) << "the removed policy must stay removed";
  EXPECT_EQ(syr_remove_policy(ib), -ENOENT);
  EXPECT_NE(std::string(syr_last_error()).find("replaced by policy " + std::to_string(ib2)), std::string::npos)
      << syr_last_error();
  EXPECT_EQ(syr_remove_policy(ic), -ENOENT);
  EXPECT_NE(std::string(syr_last_error()).find("removed by pid " + std::to_string(getpid())), std::string::npos)
      << syr_last_error();
  // The start compacted: the snapshot has both, the journal only its first line.
  files = read_state_files(d);
  EXPECT_EQ(files.snapshot["policies"].size(), 2u) << files.snapshot.dump();
  EXPECT_EQ(files.records.size(), 0u) << read_text(journal_file(d));
  EXPECT_GT(deploy_on(c, "tests/policies/drop_all.c", "journal"), ib2) << syr_last_error();
  EXPECT_EQ(d.stop(), 0);
}

// A journal whose last record is torn (a crash in its write) and with a record of garbage
// before it: each costs its own policy, whose pins are then released as leftovers (its
// group back on the kernel's hash); the other records are applied, syrupd starts, and the
// lost policies' ids are not handed out again.
TEST(SocketSelectRestart, ATornOrGarbageJournalRecordCostsOnlyThatRecord) {
  SYRUP_REQUIRE_ROOT();
  Daemon d;
  d.start();
  UdpGroup a(2), b(2), c(2);
  UdpClient to_a(a.port()), to_b(b.port()), to_c(c.port());
  int ia = deploy_on(a, "tests/policies/drop_all.c", "torn");
  int ib = deploy_on(b, "tests/policies/drop_all.c", "torn");
  int ic = deploy_on(c, "tests/policies/drop_all.c", "torn");
  ASSERT_GT(ia, 0) << syr_last_error();
  ASSERT_GT(ib, 0) << syr_last_error();
  ASSERT_GT(ic, 0) << syr_last_error();
  d.crash();
  std::vector<std::string> lines = journal_lines(d);
  ASSERT_EQ(lines.size(), 4u) << read_text(journal_file(d));  // its head, then a record per deploy
  lines[2] = "{\"put\":[{\"id\":" + std::to_string(ib) + ",garbage\n";  // b's record
  lines[3] = lines[3].substr(0, lines[3].size() / 2);             // c's, torn: no newline
  write_text(journal_file(d), lines[0] + lines[1] + lines[2] + lines[3]);

  d.start(d.bpffs_root());
  ASSERT_EQ(d.answers(), "");
  EXPECT_NE(d.log().find("ignoring record 3 of the state journal"), std::string::npos) << d.log();
  EXPECT_NE(d.log().find("ignoring the last record of the state journal"), std::string::npos) << d.log();
  EXPECT_NE(d.log().find("applied 1 records of the state journal"), std::string::npos) << d.log();
  EXPECT_NE(d.log().find("adopted 1 policies"), std::string::npos) << d.log();
  EXPECT_NE(d.log().find("found 2 policies of a previous syrupd"), std::string::npos) << d.log();
  auto listed = list_policies();
  ASSERT_EQ(listed.size(), 1u) << listed.dump();
  EXPECT_EQ(listed[0]["id"], ia);
  EXPECT_EQ(delivered(a, to_a), 0) << "the adopted policy must still drop";
  EXPECT_EQ(delivered(b, to_b), 10) << "the policy of the garbage record must be released";
  EXPECT_EQ(delivered(c, to_c), 10) << "the policy of the torn record must be released";
  EXPECT_GT(deploy_on(b, "tests/policies/drop_all.c", "torn"), ic) << syr_last_error();
  EXPECT_EQ(d.stop(), 0);
}

// A state file or journal another user could have written is never read: it would make
// syrupd (root) take sockets from whichever processes and inodes it names. The policies
// it records are then not adopted (released as leftovers), and syrupd starts.
TEST(SocketSelectRestart, AStateFileAnotherUserCouldWriteIsNotRead) {
  SYRUP_REQUIRE_ROOT();
  Daemon d;
  d.start();
  UdpGroup g(2);
  UdpClient to_g(g.port());
  ASSERT_GT(deploy_on(g, "tests/policies/drop_all.c", "foreign"), 0) << syr_last_error();
  d.crash();
  ASSERT_EQ(chmod(journal_file(d).c_str(), 0622), 0) << strerror(errno);
  d.start(d.bpffs_root());
  ASSERT_EQ(d.answers(), "");
  EXPECT_NE(d.log().find("ignoring the state journal " + journal_file(d) + ": writable by its group or by others"),
            std::string::npos)
      << d.log();
  EXPECT_NE(d.log().find("adopted 0 policies"), std::string::npos) << d.log();
  EXPECT_EQ(delivered(g, to_g), 10) << "the policy only the ignored journal recorded must be released";

  ASSERT_GT(deploy_on(g, "tests/policies/drop_all.c", "foreign"), 0) << syr_last_error();
  d.crash();
  // Another user's file: the journal that records the deploy, and the snapshot (whose
  // generation it names) made that user's.
  for (const std::string& f : {d.state_file(), journal_file(d)})
    ASSERT_EQ(chown(f.c_str(), 65534, 65534), 0) << f << ": " << strerror(errno);
  d.start(d.bpffs_root());
  ASSERT_EQ(d.answers(), "");
  EXPECT_NE(d.log().find("ignoring the state file " + d.state_file() + ": owned by uid 65534, not syrupd's"),
            std::string::npos)
      << d.log();
  EXPECT_NE(d.log().find("found 1 policies of a previous syrupd"), std::string::npos) << d.log();
  EXPECT_EQ(delivered(g, to_g), 10);
  EXPECT_TRUE(none_listed()) << list_policies().dump();
  // syrupd's own files again, 0600, replacing the foreign ones.
  struct stat st;
  for (const std::string& f : {d.state_file(), journal_file(d)}) {
    ASSERT_EQ(stat(f.c_str(), &st), 0) << f;
    EXPECT_EQ(st.st_uid, 0u) << f;
    EXPECT_EQ(st.st_mode & 07777, 0600u) << f;
  }
  EXPECT_EQ(d.stop(), 0);
}

}  // namespace
}  // namespace syrup::test
