// Multi-tenant tests: unprivileged tenants (real uids, no capabilities) against a real
// syrupd. Each tenant runs in a child process that drops to its uid and reports what it
// saw through a pipe; the parent asserts on the error texts the tenant got.
#include <bpf/bpf.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "client.h"
#include "harness.h"
#include "protocol.h"
#include "syrup/syrup.h"

namespace syrup::test {
namespace {

using nlohmann::json;

constexpr uid_t kUidA = 61001, kUidB = 61002, kUidC = 61003;

json result(int r) { return {{"r", r}, {"err", syr_last_error()}}; }

class Tenants : public ::testing::Test {
 protected:
  void SetUp() override {
    SYRUP_REQUIRE_ROOT();
    d_.start("", {"--quota_policies=2", "--quota_map_bytes=65536", "--max_source_bytes=4096",
                  "--quota_rps=40"});
  }
  void TearDown() override {
    if (d_.pid() > 0) {
      EXPECT_EQ(d_.stop(), 0);
    }
  }
  Daemon d_;
};

// What became of a removed policy is told to its own user, not to another one: to user B
// root's replaced policy is only "no policy N"; to root (and to B about B's own) the
// reason comes with it.
TEST_F(Tenants, WhatBecameOfARemovedPolicyIsToldOnlyToItsUser) {
  UdpGroup g(2);
  int first = deploy_on(g, "policies/round_robin.c", "tenant-root");
  ASSERT_GT(first, 0) << syr_last_error();
  int second = deploy_on(g, "policies/pass.c", "tenant-root");
  ASSERT_GT(second, 0) << syr_last_error();
  json jb = as_user(kUidB, [&] {
    json out;
    out["other"] = result(syr_remove_policy(first));
    UdpGroup h(2);
    int own = deploy_on(h, "policies/round_robin.c", "tenant-b");
    out["own_deploy"] = result(own);
    syr_remove_policy(own);
    out["own"] = result(syr_remove_policy(own));
    out["own_id"] = own;
    return out;
  });
  EXPECT_EQ(jb["other"]["r"], -ENOENT) << jb.dump();
  EXPECT_EQ(jb["other"]["err"], "no policy " + std::to_string(first)) << jb.dump();
  ASSERT_GT(jb["own_deploy"]["r"].get<int>(), 0) << jb.dump();
  EXPECT_NE(jb["own"]["err"].get<std::string>().find("(round_robin.c of app 'tenant-b' was removed: removed by pid"),
            std::string::npos)
      << jb.dump();
  EXPECT_EQ(syr_remove_policy(first), -ENOENT);
  EXPECT_NE(std::string(syr_last_error()).find("was removed: replaced by policy " + std::to_string(second)),
            std::string::npos)
      << syr_last_error();
  EXPECT_NE(std::string(syr_last_error()).find("tenant-root"), std::string::npos) << syr_last_error();
  syr_remove_policy(second);
}

TEST_F(Tenants, EachUserOwnsItsPoliciesMapsAndProcessesAndNothingElse) {
  // Tenant A: a long-lived process with its group, policy and mapped hint.
  int ready[2], quit[2];
  ASSERT_EQ(pipe(ready), 0);
  ASSERT_EQ(pipe(quit), 0);
  pid_t a = fork();
  if (a == 0) {
    close(ready[0]);
    close(quit[1]);
    if (setgid(kUidA) || setuid(kUidA)) _exit(1);
    UdpGroup g(2);
    int id = deploy_on(g, "policies/scan_avoid.c", "tenant-a");
    // By name of its application: a forked child inherits the default application of the
    // process it was forked from (libsyrup's first deploy's), another test's when the
    // tests run in one process.
    int fd = syr_map_open_app("tenant-a", "scan_map");
    syr_mapped_array m{};
    int mr = fd >= 0 ? syr_map_mmap(fd, &m) : fd;
    if (mr == 0) syr_hint_set(&m, 0, 1);
    json j = {{"id", id}, {"port", g.port()}, {"map", mr}, {"err", syr_last_error()}};
    std::string s = j.dump() + "\n";
    (void)!write(ready[1], s.data(), s.size());
    char c;
    (void)!read(quit[0], &c, 1);
    _exit(0);
  }
  close(ready[1]);
  close(quit[0]);
  char buf[4096];
  ssize_t n = read(ready[0], buf, sizeof buf);
  ASSERT_GT(n, 0);
  json ja = json::parse(std::string(buf, static_cast<size_t>(n)));
  ASSERT_GT(ja["id"].get<int>(), 0) << ja.dump();
  ASSERT_EQ(ja["map"], 0) << ja.dump();
  int a_id = ja["id"];
  uint16_t a_port = ja["port"];

  json jb = as_user(kUidB, [&] {
    json out;
    UdpGroup g(2);
    out["own_deploy"] = result(deploy_on(g, "policies/round_robin.c", "tenant-b"));
    out["own_map"] = result(syr_map_open_app("tenant-b", "no_such_map"));
    out["other_map"] = result(syr_map_open_app("tenant-a", "scan_map"));
    out["other_app_name"] = result(deploy_on(g, "policies/pass.c", "tenant-a"));
    out["other_remove"] = result(syr_remove_policy(a_id));
    std::string o;
    out["other_pid"] = {{"r", run_cmd(build_bin("syrupctl") + " deploy --hook socket-select --pid " +
                                          std::to_string(a) + " --port " + std::to_string(a_port) + " " +
                                          source_path("policies/pass.c"), o)},
                        {"err", o}};
    out["other_threads"] = {{"r", run_cmd(build_bin("syrupctl") + " deploy --hook thread --pid " +
                                              std::to_string(a) + " " + source_path("policies/fifo.c"), o)},
                            {"err", o}};
    int pin = bpf_obj_get((d_.bpffs_root() + "/apps/tenant-a/maps/scan_map").c_str());
    out["other_pin"] = {{"r", pin < 0 ? -errno : 0}};
    run_cmd(build_bin("syrupctl") + " --json list", o);
    out["list"] = json::parse(o, nullptr, false);
    return out;
  });

  EXPECT_GT(jb["own_deploy"]["r"].get<int>(), 0) << jb.dump();
  EXPECT_EQ(jb["own_map"]["r"], -ENOENT);
  // Another user's application and policy are answered as ones that do not exist
  // (tests/security/pins_test.cpp); a deploy learns only that the name is taken.
  EXPECT_EQ(jb["other_map"]["r"], -ENOENT);
  EXPECT_EQ(jb["other_map"]["err"], "no application 'tenant-a' (it has no deployed policy)");
  EXPECT_EQ(jb["other_app_name"]["r"], -EPERM);
  EXPECT_EQ(jb["other_app_name"]["err"], "application name 'tenant-a' is taken by another user; choose another name");
  EXPECT_EQ(jb["other_remove"]["r"], -ENOENT);
  EXPECT_EQ(jb["other_remove"]["err"], "no policy " + std::to_string(a_id));
  EXPECT_EQ(jb["other_pid"]["r"], 1);
  EXPECT_NE(jb["other_pid"]["err"].get<std::string>().find("belongs to uid 61001, not to the caller"),
            std::string::npos)
      << jb["other_pid"]["err"];
  EXPECT_EQ(jb["other_threads"]["r"], 1);
  EXPECT_NE(jb["other_threads"]["err"].get<std::string>().find("61001"), std::string::npos)
      << jb["other_threads"]["err"];
  EXPECT_EQ(jb["other_pin"]["r"], -EACCES) << "another uid opened a tenant's pin directly";
  ASSERT_TRUE(jb["list"].is_array());
  ASSERT_EQ(jb["list"].size(), 1u) << "a tenant sees only its own policies: " << jb["list"].dump();
  EXPECT_EQ(jb["list"][0]["app"], "tenant-b");

  // The pin tree is root's (docs/pin-layout.md): A reaches its maps through syrupd.
  struct stat st;
  ASSERT_EQ(stat((d_.bpffs_root() + "/apps/tenant-a").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 0u);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  (void)!write(quit[1], "x", 1);
  waitpid(a, nullptr, 0);
  close(ready[0]);
  close(quit[1]);
}

TEST_F(Tenants, QuotasAndTheRequestRateGiveClearErrorsNamingTheLimit) {
  json j = as_user(kUidC, [&] {
    json out;
    UdpGroup g1(2), g2(2), g3(2);
    out["first"] = result(deploy_on(g1, "policies/round_robin.c", "quota"));
    out["second"] = result(deploy_on(g2, "policies/round_robin.c", "quota"));
    out["third"] = result(deploy_on(g3, "policies/round_robin.c", "quota"));
    out["replace"] = result(deploy_on(g1, "policies/pass.c", "quota"));  // a replacement is not one more
    out["big_map"] = result(deploy_on(g3, "tests/policies/big_map.c", "quota2"));
    std::string big = "#include <syrup/policy.h>\n/*" + std::string(5000, 'x') + "*/\n"
                      "SYR_POLICY(struct syr_input *in) { return SYR_PASS; }\n";
    out["big_source"] = result(deploy_socket_select_source(big, "big.c", g3.fds(), "quota3"));
    int limited = 0;
    std::string msg;
    for (int i = 0; i < 100; i++) {
      int r = syr_remove_policy(999999);
      if (r == -EAGAIN) {
        limited++;
        msg = syr_last_error();
      }
    }
    out["rate"] = {{"limited", limited}, {"err", msg}};
    return out;
  });
  EXPECT_GT(j["first"]["r"].get<int>(), 0) << j.dump();
  EXPECT_GT(j["second"]["r"].get<int>(), 0) << j.dump();
  EXPECT_EQ(j["third"]["r"], -EDQUOT);
  EXPECT_NE(j["third"]["err"].get<std::string>().find("would have 3 policies; its quota is 2"), std::string::npos)
      << j["third"]["err"];
  EXPECT_GT(j["replace"]["r"].get<int>(), 0) << j.dump();
  EXPECT_EQ(j["big_map"]["r"], -EDQUOT);
  EXPECT_NE(j["big_map"]["err"].get<std::string>().find("bytes of maps; its quota is 65536"), std::string::npos)
      << j["big_map"]["err"];
  EXPECT_EQ(j["big_source"]["r"], -EFBIG);
  EXPECT_NE(j["big_source"]["err"].get<std::string>().find("the limit is 4096"), std::string::npos);
  EXPECT_GT(j["rate"]["limited"].get<int>(), 0);
  EXPECT_NE(j["rate"]["err"].get<std::string>().find("over its limit of requests per second (40)"), std::string::npos);
}

TEST_F(Tenants, PolicyIsCheckedForHelpersAndMapTypesBeforeLoad) {
  UdpGroup g(2);
  EXPECT_EQ(deploy_on(g, "tests/policies/trace_printk.c", "checked"), -EPERM);
  EXPECT_NE(std::string(syr_last_error()).find("calls bpf_trace_printk, which the socket-select hook does not allow"),
            std::string::npos)
      << syr_last_error();
  EXPECT_EQ(deploy_on(g, "tests/policies/noinline_printk.c", "checked"), -EPERM);
  EXPECT_NE(std::string(syr_last_error()).find("calls bpf_trace_printk"), std::string::npos)
      << "a helper in a non-inlined function must be found too: " << syr_last_error();
  EXPECT_EQ(deploy_on(g, "tests/policies/prog_array_map.c", "checked"), -EPERM);
  EXPECT_NE(std::string(syr_last_error()).find("map 'jumps' is a prog_array map"), std::string::npos)
      << syr_last_error();
}

// Raw bytes on the control socket: every bad message gets an error or a closed
// connection, the daemon keeps serving, and a deployed policy keeps working.
TEST_F(Tenants, MalformedControlMessagesAndGarbageSourcesLeaveTheDaemonServing) {
  UdpGroup g(2);
  int id = deploy_on(g, "policies/round_robin.c", "survivor");
  ASSERT_GT(id, 0) << syr_last_error();
  auto raw = [&](const std::string& bytes, bool close_early = false) {
    UniqueFd s(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    strcpy(a.sun_path, d_.socket().c_str());
    EXPECT_EQ(connect(s.get(), reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    (void)!write(s.get(), bytes.data(), bytes.size());
    if (close_early) return json();
    proto::Message m;
    std::string why;
    timeval tv{7, 0};
    setsockopt(s.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return proto::recv_message(s.get(), m) == 0 ? m.body : json{{"closed", true}};
  };
  auto frame = [](const std::string& payload, uint32_t len = UINT32_MAX) {
    uint32_t h[2] = {proto::kMagic, len == UINT32_MAX ? static_cast<uint32_t>(payload.size()) : len};
    return std::string(reinterpret_cast<char*>(h), 8) + payload;
  };
  json r;
  r = raw("GET / HTTP/1.0\r\n\r\n");
  EXPECT_EQ(r.value("errno", 0), EPROTO) << r.dump();
  EXPECT_NE(r.value("error", std::string()).find("bad frame magic"), std::string::npos);
  r = raw(frame("", proto::kMaxPayload + 1));
  EXPECT_EQ(r.value("errno", 0), EPROTO) << r.dump();
  raw(frame("{\"op\":\"li", 100), true);  // truncated, then gone
  r = raw(frame("[1,2,3]"));
  EXPECT_NE(r.value("error", std::string()).find("not a JSON object"), std::string::npos) << r.dump();
  r = raw(frame(R"({"op":"remove","id":"seven"})"));
  EXPECT_EQ(r.value("errno", 0), EINVAL) << r.dump();
  r = raw(frame(R"({"op":"deploy","hook":"socket-select","app":"x","source":"y","params":[1]})"));
  EXPECT_NE(r.value("error", std::string()).find("params must be an object"), std::string::npos) << r.dump();
  r = raw(frame(R"({"op":"deploy","hook":"socket-select","app":"tenant/../etc","source":"y"})"));
  EXPECT_NE(r.value("error", std::string()).find("character outside"), std::string::npos) << r.dump();
  // Before, a dotted name passed and the deploy failed later, pinning: "cannot pin policy
  // under .../apps/my.app/policies/1: Operation not permitted".
  r = raw(frame(R"({"op":"deploy","hook":"socket-select","app":"my.app","source":"y"})"));
  EXPECT_EQ(r.value("errno", 0), EINVAL) << r.dump();
  EXPECT_NE(r.value("error", std::string()).find("application name 'my.app' has a character outside [A-Za-z0-9_-] "
                                                 "(bpffs refuses '.' in pin names)"),
            std::string::npos)
      << r.dump();
  r = raw(frame(R"({"op":"map_open","app":"survivor","map":"x/../../apps"})"));
  EXPECT_NE(r.value("error", std::string()).find("character outside"), std::string::npos) << r.dump();
  r = raw(frame(R"({"op":"launch_missiles"})"));
  EXPECT_NE(r.value("error", std::string()).find("unknown request 'launch_missiles'"), std::string::npos);
  EXPECT_NE(r.value("error", std::string()).find("map_dump, thread_tid, record, record_stop, test_run)"), std::string::npos) << r.dump();
  // thread_tid: the caller's own threads only, by a positive number.
  r = raw(frame(R"({"op":"thread_tid","tid":"7"})"));
  EXPECT_EQ(r.value("errno", 0), EINVAL) << r.dump();
  r = raw(frame(R"({"op":"thread_tid","tid":-3})"));
  EXPECT_EQ(r.value("errno", 0), EINVAL) << r.dump();
  r = raw(frame(R"({"op":"thread_tid","tid":1})"));
  EXPECT_EQ(r.value("errno", 0), ESRCH) << r.dump();
  EXPECT_NE(r.value("error", std::string()).find("thread 1 is not a thread of process " + std::to_string(getpid())),
            std::string::npos) << r.dump();
  pid_t me = static_cast<pid_t>(syscall(SYS_gettid));
  r = raw(frame(R"({"op":"thread_tid","tid":)" + std::to_string(me) + "}"));
  EXPECT_EQ(r.value("tid", 0), me) << r.dump();
  EXPECT_EQ(r.value("same_pid_namespace", false), true) << r.dump();

  // Garbage as policy source: binary with NUL bytes, and bytes that are no C.
  std::string bin(1000, '\0');
  for (size_t i = 0; i < bin.size(); i++) bin[i] = static_cast<char>((i * 7919) & 0xff);
  auto fds = g.fds();
  syr_deploy_opts o{.sz = sizeof o, .app = "survivor", .fds = fds.data(), .n_fds = fds.size()};
  EXPECT_EQ(syr_deploy_policy_source(bin.data(), bin.size(), "garbage.bin", SYR_HOOK_SOCKET_SELECT, &o), -EINVAL);
  EXPECT_NE(std::string(syr_last_error()).find("NUL bytes"), std::string::npos);
  std::string text = "\x7f" "ELF this is not C at all {{{";
  // A request whose fields have the wrong JSON types never ends the daemon.
  r = raw(frame(R"({"op":5})"));
  EXPECT_NE(r.value("error", std::string()).find("unknown request"), std::string::npos) << r.dump();
  r = raw(frame(R"({"op":"deploy","hook":7,"app":[],"source":{}})"));
  EXPECT_EQ(r.value("errno", 0), EINVAL) << r.dump();
  EXPECT_EQ(syr_deploy_policy_source(text.data(), text.size(), "garbage.c", SYR_HOOK_SOCKET_SELECT, &o), -EINVAL);
  EXPECT_NE(std::string(syr_last_error()).find("garbage.c:1"), std::string::npos) << syr_last_error();

  // Still serving, and the policy still splits one flow exactly.
  std::string out;
  EXPECT_EQ(run_cmd(build_bin("syrupctl") + " ping", out), 0) << out;
  UdpClient c(g.port());
  for (int i = 0; i < 40; i++) c.send_request(1, i);
  EXPECT_EQ(g.drain(), (std::vector<int>{20, 20}));
}

size_t fd_count(pid_t pid) {
  size_t n = 0;
  std::error_code ec;
  for (auto& e : std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec)) (void)e, n++;
  return n;
}

TEST_F(Tenants, DeployAndExitCyclesLeakNothing) {
  constexpr int kCycles = 1000;
  UdpGroup warm(2);
  ASSERT_GT(deploy_on(warm, "policies/round_robin.c", "cycle"), 0) << syr_last_error();  // compile once
  size_t fds_before = 0;
  for (int i = 0; i < kCycles; i++) {
    pid_t c = fork();
    if (c == 0) {
      UdpGroup g(2);
      if (deploy_on(g, "policies/round_robin.c", ("cycle-" + std::to_string(i % 7)).c_str()) > 0) _exit(0);
      fprintf(stderr, "cycle %d: %s\n", i, syr_last_error());
      _exit(1);
    }
    int st = 0;
    waitpid(c, &st, 0);
    ASSERT_EQ(WEXITSTATUS(st), 0) << "cycle " << i;
    if (i == 10) fds_before = fd_count(d_.pid());
  }
  std::string out;
  json list;
  for (int t = 0; t < 200; t++) {
    run_cmd(build_bin("syrupctl") + " --json list", out);
    list = json::parse(out);
    if (list.size() == 1) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(list.size(), 1u) << "policies of exited processes must be removed";
  size_t fds_after = fd_count(d_.pid());
  EXPECT_LE(fds_after, fds_before + 2) << "syrupd leaks file descriptors";
  int apps = 0;
  for (auto& e : std::filesystem::directory_iterator(d_.bpffs_root() + "/apps")) (void)e, apps++;
  EXPECT_EQ(apps, 1) << "pins of exited applications must be gone";
}

int connect_unix(const std::string& path) {
  int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::snprintf(a.sun_path, sizeof a.sun_path, "%s", path.c_str());
  if (connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) < 0) {
    close(s);
    return -errno;
  }
  return s;
}

json ping(const std::string& path) {
  Client c;
  Message resp;
  if (int r = c.connect(path)) return {{"transport", r}};
  if (int r = c.call({{"op", "ping"}}, resp)) return {{"transport", r}};
  return resp.body;
}

// Whether syrupd closed `fd` within `ms` (a read returns end of stream).
bool closed_within(int fd, int ms) {
  timeval tv{0, 100000};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  char b[64];
  while (std::chrono::steady_clock::now() < end)
    if (recv(fd, b, sizeof b, 0) == 0) return true;
  return false;
}

// Connections of users other than root are capped with a clear error, root is never
// refused, idle connections are closed, and a request must arrive whole within 5 s even
// when its bytes trickle in faster than the per-read timeout.
TEST_F(Tenants, ControlConnectionsAreCappedIdleOnesClosedAndSlowFramesDropped) {
  EXPECT_EQ(d_.stop(), 0);
  d_.start("", {"--max_clients=3", "--client_idle_timeout_s=1"});
  std::string sock = d_.socket();
  json j = as_user(kUidA, [&] {
    json out;
    std::vector<UniqueFd> held;
    for (int i = 0; i < 3; i++) held.emplace_back(connect_unix(sock));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // all three accepted
    out["over"] = ping(sock);
    // Idle for longer than --client_idle_timeout_s: closed, and the slots are free again.
    out["idle_closed"] = closed_within(held[0].get(), 3000);
    out["after"] = ping(sock);
    return out;
  });
  ASSERT_TRUE(j["over"].is_object()) << j.dump();
  EXPECT_EQ(j["over"].value("ok", true), false) << j.dump();
  EXPECT_EQ(j["over"].value("errno", 0), EBUSY) << j.dump();
  EXPECT_NE(j["over"].value("error", std::string()).find(
                "syrupd serves at most 3 connections of users other than root at a time (syrupd --max_clients)"),
            std::string::npos)
      << j.dump();
  EXPECT_TRUE(j["idle_closed"].get<bool>()) << d_.log();
  EXPECT_EQ(j["after"].value("ok", false), true) << j.dump();

  // Root is never refused, however many connections it holds.
  std::vector<UniqueFd> mine;
  for (int i = 0; i < 5; i++) mine.emplace_back(connect_unix(sock));
  EXPECT_EQ(ping(sock).value("ok", false), true);

  // A frame trickling in one byte a second (each read well within the old per-read
  // timeout) is cut off 5 s after it started; the daemon then serves again.
  UniqueFd slow(connect_unix(sock));
  ASSERT_TRUE(slow);
  uint32_t hdr[2] = {htole32(proto::kMagic), htole32(100)};
  ASSERT_EQ(send(slow.get(), hdr, sizeof hdr, MSG_NOSIGNAL), static_cast<ssize_t>(sizeof hdr));
  auto t0 = std::chrono::steady_clock::now();
  std::thread trickle([fd = slow.get()] {
    for (int i = 0; i < 9; i++) {
      std::this_thread::sleep_for(std::chrono::seconds(1));
      if (send(fd, "{", 1, MSG_NOSIGNAL) != 1) return;
    }
  });
  bool closed = closed_within(slow.get(), 9000);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  trickle.join();
  EXPECT_TRUE(closed) << d_.log();
  EXPECT_LT(secs, 7.0) << "the whole frame must arrive within 5 s";
  EXPECT_NE(d_.log().find("the frame did not arrive whole within 5 s"), std::string::npos) << d_.log();
  EXPECT_EQ(ping(sock).value("ok", false), true);
}

// syrupd's metrics on 127.0.0.1:port: a series' value (its name and labels as written),
// -1 when it is absent; the last scrape's whole text in `text`.
struct Scraper {
  // A port for this test process's syrupd.
  const uint16_t port = static_cast<uint16_t>(20000 + (getpid() + 7919) % 20000);
  std::string text;
  double operator()(const std::string& series) {
    text = http_get(port, "/metrics");
    size_t at = text.find("\n" + series + " ");
    return at == std::string::npos ? -1.0 : std::stod(text.substr(at + series.size() + 2));
  }
};

// One user reaching --max_clients_per_uid is refused with an error naming that flag and
// its own count, while another user still gets in; closing one of its connections lets
// the first user in again. The metrics show the open connections and the caps.
TEST_F(Tenants, OneUserCannotTakeEveryConnection) {
  EXPECT_EQ(d_.stop(), 0);
  std::string bad;
  EXPECT_EQ(run_cmd(build_bin("syrupd") + " --max_clients_per_uid=0", bad), 2) << bad;
  EXPECT_NE(bad.find("syrupd: --max_clients_per_uid must be at least 1"), std::string::npos) << bad;
  Scraper metric;
  d_.start("", {"--max_clients=4", "--max_clients_per_uid=2", "--metrics_port=" + std::to_string(metric.port),
                "--metrics_per_tenant"});
  std::string sock = d_.socket();
  int ready[2], go[2];
  ASSERT_EQ(pipe(ready), 0);
  ASSERT_EQ(pipe(go), 0);
  json ja;
  std::thread a([&] {
    ja = as_user(kUidA, [&] {
      json out;
      std::vector<UniqueFd> held;
      for (int i = 0; i < 2; i++) held.emplace_back(connect_unix(sock));
      std::this_thread::sleep_for(std::chrono::milliseconds(100));  // both accepted
      out["over"] = ping(sock);
      (void)!write(ready[1], "r", 1);
      char c;
      (void)!read(go[0], &c, 1);
      held.pop_back();
      std::this_thread::sleep_for(std::chrono::milliseconds(100));  // syrupd saw it close
      out["after"] = ping(sock);
      return out;
    });
  });
  pollfd pfd{ready[0], POLLIN, 0};
  bool held = poll(&pfd, 1, 10000) == 1;
  // A scrape refreshes a snapshot older than a second.
  int seen = held ? wait_for([&] { return metric("syrup_control_connections{user=\"other\"}") == 2 &&
                                          metric("syrup_control_connections_busiest_user") == 2; },
                             3000)
                  : -1;
  std::string while_held = metric.text;
  json jb = held ? as_user(kUidB, [&] { return json{{"ping", ping(sock)}}; }) : json();
  (void)!write(go[1], "g", 1);
  a.join();
  for (int fd : {ready[0], ready[1], go[0], go[1]}) close(fd);
  ASSERT_TRUE(held) << "uid A's child never held its connections: " << ja.dump();
  EXPECT_GE(seen, 0) << "no scrape showed uid A's 2 connections:\n" << while_held;
  EXPECT_NE(while_held.find("\nsyrup_control_connections_limit{scope=\"all\"} 4\n"), std::string::npos) << while_held;
  EXPECT_NE(while_held.find("\nsyrup_user_control_connections{uid=\"" + std::to_string(kUidA) + "\"} 2\n"),
            std::string::npos)
      << while_held;
  EXPECT_NE(while_held.find("\nsyrup_control_connections_limit{scope=\"per_user\"} 2\n"), std::string::npos)
      << while_held;
  EXPECT_NE(while_held.find("\nsyrup_errors_total{op=\"connect\",kind=\"EBUSY\"} 1\n"), std::string::npos)
      << while_held;

  EXPECT_EQ(ja["over"].value("ok", true), false) << ja.dump();
  EXPECT_EQ(ja["over"].value("errno", 0), EBUSY) << ja.dump();
  EXPECT_NE(ja["over"].value("error", std::string())
                .find("syrupd serves at most 2 connections per user other than root at a time "
                      "(syrupd --max_clients_per_uid); uid " +
                      std::to_string(kUidA) + " has 2 open; retry later"),
            std::string::npos)
      << ja.dump();
  EXPECT_EQ(jb["ping"].value("ok", false), true) << "another user must still get in: " << jb.dump();
  EXPECT_EQ(ja["after"].value("ok", false), true) << ja.dump();
  EXPECT_NE(d_.log().find("refused a connection of uid " + std::to_string(kUidA) +
                          ": it has 2 open (--max_clients_per_uid)"),
            std::string::npos)
      << d_.log();
}

// Map pins that no policy of the state file declares (a syrupd that died between pinning a
// new policy's maps and recording it) are removed at the next start; the adopted policy
// keeps its own map, and an application nothing is recorded for goes whole.
TEST_F(Tenants, LeftoverMapPinsOfACrashedDaemonAreRemovedAtStart) {
  namespace fs = std::filesystem;
  UdpGroup g(2);
  int id = deploy_on(g, "tests/policies/mark_long.c", "stray");
  ASSERT_GT(id, 0) << syr_last_error();
  std::string maps = d_.bpffs_root() + "/apps/stray/maps";
  ASSERT_TRUE(fs::exists(maps + "/scan_map"));
  d_.crash();

  auto pin_map = [](const std::string& dir, const std::string& name) {
    fs::create_directories(dir);
    UniqueFd m(bpf_map_create(BPF_MAP_TYPE_ARRAY, name.c_str(), 4, 8, 1, nullptr));
    ASSERT_TRUE(m) << strerror(errno);
    ASSERT_EQ(bpf_obj_pin(m.get(), (dir + "/" + name).c_str()), 0) << strerror(errno);
  };
  pin_map(maps, "orphan");
  pin_map(d_.bpffs_root() + "/apps/ghost/maps", "ghostmap");

  d_.start(d_.bpffs_root(), {"--quota_policies=2", "--quota_map_bytes=65536", "--max_source_bytes=4096",
                             "--quota_rps=40"});
  EXPECT_FALSE(fs::exists(maps + "/orphan")) << d_.log();
  EXPECT_TRUE(fs::exists(maps + "/scan_map")) << "the adopted policy's map must stay";
  EXPECT_FALSE(fs::exists(d_.bpffs_root() + "/apps/ghost")) << d_.log();
  EXPECT_NE(d_.log().find("removed 1 map pins of application 'stray' that no adopted policy declares"),
            std::string::npos)
      << d_.log();
  std::string out;
  run_cmd(build_bin("syrupctl") + " --json list", out);
  json list = json::parse(out, nullptr, false);
  ASSERT_TRUE(list.is_array() && list.size() == 1u) << out;
  EXPECT_EQ(list[0]["id"], id);
  EXPECT_EQ(syr_remove_policy(id), 0) << syr_last_error();
  EXPECT_FALSE(fs::exists(d_.bpffs_root() + "/apps/stray"));
}

// ---- Compiles off the main thread (docs/protocol.md, "Connection model") -------------

// A deploy waiting for clang holds up nobody: another user's ping and cached deploy are
// answered meanwhile, root takes the very group the parked deploy is for, and when the
// compile ends the parked deploy is checked again and refused with EBUSY; the group keeps
// the policy that took it.
TEST_F(Tenants, AParkedCompileHoldsUpNoOtherRequestAndIsCheckedAgainAfterIt) {
  EXPECT_EQ(d_.stop(), 0);
  TempDir dir;
  d_.start("", {"--clang=" + slow_clang(dir.path(), 3), "--compile_workers=1"});
  UdpGroup g(2);
  int warm = deploy_on(g, "policies/round_robin.c", "fastapp");  // cached from here on
  ASSERT_GT(warm, 0) << syr_last_error();
  ASSERT_EQ(syr_remove_policy(warm), 0) << syr_last_error();

  std::atomic<bool> slow_done{false};
  int slow_r = 0;
  std::string slow_err;
  std::thread slow([&] {
    slow_r = deploy_socket_select_source(uncached_source("tests/policies/by_key.c"), "slow.c", g.fds(), "slowapp");
    slow_err = syr_last_error();
    slow_done = true;
  });
  bool parked = log_says(d_, kParkedLog, 1, 5000);
  auto parked_at = std::chrono::steady_clock::now();
  json b;
  int fast = 0;
  bool slow_done_meanwhile = false;
  if (parked) {
    b = as_user(kUidB, [&] {
      UdpGroup mine(2);
      int id = deploy_on(mine, "policies/round_robin.c", "bapp");
      return json{{"ping", ping(d_.socket())}, {"deploy", result(id)}};
    });
    fast = deploy_on(g, "policies/round_robin.c", "fastapp");
    slow_done_meanwhile = slow_done.load();
  }
  double meanwhile_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - parked_at).count();
  slow.join();
  ASSERT_TRUE(parked) << d_.log();

  EXPECT_EQ(b["ping"].value("ok", false), true) << b.dump();
  EXPECT_GT(b["deploy"]["r"].get<int>(), 0) << b.dump();
  EXPECT_GT(fast, 0) << syr_last_error();
  EXPECT_FALSE(slow_done_meanwhile) << "the other requests took " << meanwhile_s
                                    << " s: they waited for the 3 s compile";
  EXPECT_EQ(slow_r, -EBUSY) << slow_err;
  EXPECT_NE(slow_err.find("is scheduled by application 'fastapp'"), std::string::npos) << slow_err;
  UdpClient c(g.port());
  for (int i = 0; i < 20; i++) c.send_request(1, i);
  EXPECT_EQ(g.drain(), (std::vector<int>{10, 10})) << "the group must keep round_robin";
}

// With one worker, a user with three compiles queued delays another user's by one
// compile, not three: workers take the users' compiles in turn.
TEST_F(Tenants, CompilesAreTakenFromTheUsersInTurn) {
  EXPECT_EQ(d_.stop(), 0);
  for (const char* bad : {"0", "65"}) {
    std::string out;
    EXPECT_EQ(run_cmd(build_bin("syrupd") + " --compile_workers=" + bad, out), 2) << out;
    EXPECT_NE(out.find("syrupd: --compile_workers must be 1 to 64"), std::string::npos) << out;
  }
  TempDir dir;
  d_.start("", {"--clang=" + slow_clang(dir.path(), 1), "--compile_workers=1"});
  auto now_ns = [] { return std::chrono::steady_clock::now().time_since_epoch().count(); };
  json a;
  std::thread ta([&] {
    a = as_user(kUidA, [&] {
      json out = json::array();
      std::vector<std::thread> ts;
      std::mutex mu;
      for (int i = 0; i < 3; i++)
        ts.emplace_back([&, i] {
          UdpGroup g(2);
          std::string app = "qa" + std::to_string(i);
          int r = deploy_socket_select_source(uncached_source("policies/round_robin.c"), "slow.c", g.fds(),
                                              app.c_str());
          std::lock_guard lk(mu);
          out.push_back({{"r", r}, {"err", syr_last_error()}, {"t", now_ns()}});
        });
      for (auto& t : ts) t.join();
      return out;
    });
  });
  bool queued = log_says(d_, kParkedLog, 3, 5000);
  json b;
  if (queued)
    b = as_user(kUidB, [&] {
      UdpGroup g(2);
      int r = deploy_socket_select_source(uncached_source("policies/round_robin.c"), "slow.c", g.fds(), "qb");
      return json{{"r", r}, {"err", syr_last_error()}, {"t", now_ns()}};
    });
  ta.join();
  ASSERT_TRUE(queued) << d_.log();
  ASSERT_TRUE(a.is_array() && a.size() == 3u) << a.dump();
  ASSERT_GT(b.value("r", 0), 0) << b.dump();
  int after_b = 0;
  for (auto& x : a) {
    EXPECT_GT(x.value("r", 0), 0) << x.dump();
    after_b += x.value("t", int64_t{0}) > b.value("t", int64_t{0});
  }
  EXPECT_EQ(after_b, 2) << "user B's compile must come right after the one of A's that was running: "
                        << a.dump() << " " << b.dump();
}

// The metrics show the compile workers at work: with one worker and two deploys waiting
// for 2 s compiles, one compile runs while the other is queued; when both are done, two
// finished compiles, of at least 2 s each, the second having waited for the first.
TEST_F(Tenants, MetricsShowTheCompileWorkers) {
  EXPECT_EQ(d_.stop(), 0);
  TempDir dir;
  Scraper metric;
  d_.start("", {"--clang=" + slow_clang(dir.path(), 2), "--compile_workers=1",
                "--metrics_port=" + std::to_string(metric.port), "--metrics_per_tenant"});
  const std::string& scraped = metric.text;
  EXPECT_EQ(metric("syrup_compiles_queued"), 0.0) << scraped;
  int r[2] = {0, 0};
  std::vector<std::thread> ts;
  for (int i = 0; i < 2; i++)
    ts.emplace_back([&, i] {
      UdpGroup g(2);
      std::string app = "mapp" + std::to_string(i);
      r[i] = deploy_socket_select_source(uncached_source("policies/round_robin.c"), "slow.c", g.fds(), app.c_str());
    });
  bool parked = log_says(d_, kParkedLog, 2, 5000);
  // A scrape refreshes a snapshot older than a second, so this sees the pair within ~1 s.
  int seen = parked ? wait_for([&] {
                        return metric("syrup_compiles_queued") == 1 && metric("syrup_compiles_running") == 1 &&
                               metric("syrup_user_compiles{uid=\"0\",state=\"queued\"}") == 1 &&
                               metric("syrup_user_compiles{uid=\"0\",state=\"running\"}") == 1;
                      }, 1800)
                    : -1;
  std::string during = scraped;
  for (auto& t : ts) t.join();
  ASSERT_TRUE(parked) << d_.log();
  EXPECT_GE(seen, 0) << "no scrape showed 1 compile queued and 1 running:\n" << during;
  EXPECT_GT(r[0], 0) << d_.log();
  EXPECT_GT(r[1], 0) << d_.log();
  // The second deploy published a snapshot with both compiles finished.
  EXPECT_EQ(metric("syrup_compiles_total{result=\"ok\"}"), 2.0) << scraped;
  EXPECT_EQ(metric("syrup_compiles_total{result=\"error\"}"), 0.0) << scraped;
  EXPECT_EQ(metric("syrup_compiles_queued"), 0.0) << scraped;
  EXPECT_EQ(metric("syrup_compiles_running"), 0.0) << scraped;
  EXPECT_EQ(scraped.find("syrup_user_compiles{"), std::string::npos) << "a user with no compiles has no series: " << scraped;
  EXPECT_EQ(metric("syrup_compile_duration_seconds_count"), 2.0) << scraped;
  EXPECT_GE(metric("syrup_compile_duration_seconds_sum"), 4.0) << scraped;
  EXPECT_GE(metric("syrup_compile_wait_seconds_sum"), 1.5) << "the second compile waited for the first: " << scraped;
  // The cache holds the two objects (it started empty), within its default bound.
  double objects = 0;
  std::error_code ec;
  for (auto& e : std::filesystem::directory_iterator(std::filesystem::path(d_.socket()).parent_path() / "cache/obj", ec))
    if (e.path().extension() == ".o") objects += static_cast<double>(e.file_size());
  EXPECT_GT(objects, 0.0);
  EXPECT_EQ(metric("syrup_compile_cache_bytes"), objects) << scraped;
  EXPECT_EQ(metric("syrup_compile_cache_limit_bytes"), 268435456.0) << scraped;
  EXPECT_EQ(metric("syrup_compile_cache_evictions_total"), 0.0) << scraped;
}

// SIGTERM while a deploy is parked: the compile is stopped, the caller is answered
// ECANCELED with the reason, and syrupd exits cleanly at once, leaving no compiler behind.
TEST_F(Tenants, AParkedDeployIsAnsweredWhenSyrupdStops) {
  EXPECT_EQ(d_.stop(), 0);
  TempDir dir;
  std::string clang = slow_clang(dir.path(), 20);
  d_.start("", {"--clang=" + clang});
  UdpGroup g(2);
  int r = 0;
  std::string err;
  std::thread t([&] {
    r = deploy_socket_select_source(uncached_source("tests/policies/by_key.c"), "slow.c", g.fds(), "stopapp");
    err = syr_last_error();
  });
  bool parked = log_says(d_, kParkedLog, 1, 5000);
  auto t0 = std::chrono::steady_clock::now();
  int status = d_.terminate();
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  t.join();
  ASSERT_TRUE(parked) << d_.log();
  EXPECT_EQ(status, 0) << d_.log();
  EXPECT_LT(secs, 5.0) << "syrupd waited for the compiler";
  EXPECT_EQ(r, -ECANCELED) << err;
  EXPECT_NE(err.find("syrupd is shutting down; the policy was not deployed"), std::string::npos) << err;
  // Its compilers are the ones that name its cache, in the directory of its socket.
  std::string dir_of_daemon = std::filesystem::path(d_.socket()).parent_path().string();
  for (auto& e : std::filesystem::directory_iterator("/proc")) {
    std::string cmd = read_text(e.path() / "cmdline");
    EXPECT_EQ(cmd.find(dir_of_daemon), std::string::npos) << "a compiler outlived syrupd: " << e.path();
  }
}

}  // namespace
}  // namespace syrup::test
