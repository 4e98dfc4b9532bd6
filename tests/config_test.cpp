// syrupd --config end to end: a YAML file of tenants applied at start, SIGHUP applying
// only what changed (and keeping the running configuration when the file is bad), a
// restart adopting without redeploying, and the Prometheus endpoint showing it all.
#include <arpa/inet.h>
#include <bpf/libbpf.h>
#include <gtest/gtest.h>
#include <net/if.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "harness.h"
#include "syrup/syrup.h"

namespace syrup::test {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// A file removed however the test ends.
struct TempFile {
  std::string path;
  explicit TempFile(const std::string& name)
      : path("/tmp/syrup-config-test-" + std::to_string(getpid()) + "-" + name) {}
  ~TempFile() { unlink(path.c_str()); }
};

// Sends `n` datagrams from the peer of `net` to the host's `port` and checks that all
// arrive and that application `app`'s XDP policy (tests/policies/xdp_count.c) counted
// exactly them in its `seen` map.
void expect_xdp_policy_counts(TestNet& net, uint16_t port, const char* app, int n) {
  UniqueFd srv(udp_server(net.host_ip, port));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  inet_pton(AF_INET, net.host_ip.c_str(), &a.sin_addr);
  a.sin_port = htons(port);
  UniqueFd peer(net.peer_udp());
  uint32_t payload[4] = {1, 0, 0, 0};
  for (int i = 0; i < n; i++)
    ASSERT_EQ(sendto(peer.get(), payload, sizeof payload, 0, reinterpret_cast<sockaddr*>(&a), sizeof a),
              static_cast<ssize_t>(sizeof payload));
  int received = 0;
  char buf[256];
  for (int t = 0; t < 100 && received < n; t++) {
    while (recv(srv.get(), buf, sizeof buf, 0) >= 0) received++;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(received, n);
  int m = syr_map_open_app(app, "seen");
  ASSERT_GE(m, 0) << syr_last_error();
  uint32_t k = 0;
  uint64_t seen = 0;
  EXPECT_EQ(syr_map_lookup_elem(m, &k, &seen), 0);
  close(m);
  EXPECT_EQ(seen, static_cast<uint64_t>(n)) << "the XDP policy saw other traffic or none";
  EXPECT_NE(attached_xdp_prog(net.host_if), 0u);
}

// Names of the policies `syrupctl list` shows, as "app/name", sorted.
std::vector<std::string> listed_names() {
  std::vector<std::string> v;
  json l = list_policies();
  if (l.is_array())
    for (auto& p : l) v.push_back(p["app"].get<std::string>() + "/" + p["name"].get<std::string>());
  std::sort(v.begin(), v.end());
  return v;
}

TEST(Config, AppliedAtStartReloadedOnSighupOnlyWhatChangedAndExported) {
  SYRUP_REQUIRE_ROOT();
  UdpGroup g1(2), g2(2);
  std::string yaml = "/tmp/syrup-config-test-" + std::to_string(getpid()) + ".yaml";
  auto write_yaml = [&](bool second, bool first = true, const std::string& extra = "") {
    std::ofstream f(yaml, std::ios::trunc);
    f << "version: 1\ndefaults:\n  quotas: {policies: 4}\ntenants:\n  - name: cfgapp\n    uid: 0\n    policies:\n";
    if (first)
      f << "      - name: rr\n        hook: socket-select\n        policy: " << source_path("policies/round_robin.c")
        << "\n        pid: " << getpid() << "\n        port: " << g1.port() << "\n";
    if (second)
      f << "      - name: hash\n        hook: socket-select\n        policy: " << source_path("policies/pass.c")
        << "\n        pid: " << getpid() << "\n        port: " << g2.port() << "\n";
    f << extra;
  };
  write_yaml(false);
  uint16_t mport = static_cast<uint16_t>(20000 + getpid() % 20000);
  Daemon d;
  d.start("", {"--config=" + yaml, "--metrics_port=" + std::to_string(mport), "--metrics_per_tenant"});

  json l = list_policies();
  ASSERT_EQ(l.size(), 1u) << l.dump() << d.log();
  EXPECT_EQ(l[0]["app"], "cfgapp");
  EXPECT_EQ(l[0]["name"], "rr");
  int rr_id = l[0]["id"];
  UdpClient c1(g1.port());
  for (int i = 0; i < 20; i++) c1.send_request(1, i);
  EXPECT_EQ(g1.drain(), (std::vector<int>{10, 10}));

  // Add an entry: the first is left alone (same id), the second is deployed.
  write_yaml(true);
  kill(d.pid(), SIGHUP);
  ASSERT_TRUE(log_says(d, "applied " + yaml, 2, 6000)) << d.log();
  l = list_policies();
  ASSERT_EQ(l.size(), 2u) << l.dump();
  EXPECT_EQ(l[0]["id"], rr_id) << "an unchanged entry must not be redeployed";
  EXPECT_EQ(l[1]["name"], "hash");

  // A broken file: the error names file, line and key; nothing changes.
  write_yaml(true, true, "      - name: broken\n        hook: socket-select\n        port: 70000\n");
  kill(d.pid(), SIGHUP);
  ASSERT_TRUE(log_says(d, "the running configuration stays", 1, 6000)) << d.log();
  EXPECT_NE(d.log().find(yaml + ":"), std::string::npos) << d.log();
  EXPECT_EQ(list_policies().size(), 2u);

  // Metrics show the tenant, its policies' decisions and the reloads.
  std::string m = http_get(mport, "/metrics");
  EXPECT_NE(m.find("200 OK"), std::string::npos) << m;
  EXPECT_NE(m.find("syrup_policy_decisions_total{"), std::string::npos) << m;
  EXPECT_NE(m.find("tenant=\"cfgapp\""), std::string::npos) << m;
  EXPECT_NE(m.find("syrup_config_reloads_total"), std::string::npos) << m;
  EXPECT_NE(m.find("syrup_tenant_policies{tenant=\"cfgapp\"} 2"), std::string::npos) << m;
  EXPECT_NE(m.find("syrup_policy_open_executors{tenant=\"cfgapp\",hook=\"socket-select\",policy=\"rr\",id=\"" +
                   std::to_string(rr_id) + "\"} 2"),
            std::string::npos)
      << m;

  // Removing an entry removes its policy; the kernel's hash is back on that group.
  write_yaml(true, false);
  kill(d.pid(), SIGHUP);
  ASSERT_TRUE(log_says(d, "applied " + yaml, 3, 6000)) << d.log();
  l = list_policies();
  ASSERT_EQ(l.size(), 1u) << l.dump();
  EXPECT_EQ(l[0]["name"], "hash");
  for (int i = 0; i < 20; i++) c1.send_request(1, i);
  auto counts = g1.drain();
  EXPECT_TRUE(counts == std::vector<int>({20, 0}) || counts == std::vector<int>({0, 20}));

  // A restart adopts the deployed entries: the plan finds them unchanged.
  int hash_id = l[0]["id"];
  d.crash();
  d.start(d.bpffs_root(), {"--config=" + yaml});
  l = list_policies();
  ASSERT_EQ(l.size(), 1u) << l.dump() << d.log();
  EXPECT_EQ(l[0]["id"], hash_id);
  EXPECT_NE(d.log().find("0 deployed, 0 removed, 1 unchanged"), std::string::npos) << d.log();
  EXPECT_EQ(d.stop(), 0);
  unlink(yaml.c_str());
}

// The tenant's quotas bind the file's own entries: an entry over quota fails with an error
// naming the file, the entry's line and key, the limit and where the limit is written;
// the other entries (of that tenant and of others) are applied; raising the quota and
// reloading deploys it.
// SIGHUP with a policy not in the cache: it compiles on a worker while syrupd serves
// requests (a ping, a list that does not show it yet), and the file is applied once it
// has compiled.
TEST(Config, AReloadCompilesOffTheMainThreadAndAppliesWhenCompiled) {
  SYRUP_REQUIRE_ROOT();
  UdpGroup g(2);
  TempDir dir;
  std::string policy = dir.path() + "/rr_warm.c", yaml = dir.path() + "/syrup.yaml";
  std::ofstream(policy) << uncached_source("policies/round_robin.c");
  auto write_yaml = [&](bool entry) {
    std::ofstream f(yaml, std::ios::trunc);
    f << "version: 1\ntenants:\n  - name: cfgwarm\n    uid: 0\n    policies:" << (entry ? "\n" : " []\n");
    if (entry)
      f << "      - name: rr\n        hook: socket-select\n        policy: " << policy << "\n        pid: " << getpid()
        << "\n        port: " << g.port() << "\n";
  };
  write_yaml(false);
  Daemon d;
  d.start("", {"--config=" + yaml, "--clang=" + slow_clang(dir.path(), 3)});
  write_yaml(true);
  kill(d.pid(), SIGHUP);
  ASSERT_TRUE(log_says(d, "SIGHUP: compiling 1 policies of " + yaml + " before applying it", 1, 6000)) << d.log();
  std::string out;
  EXPECT_EQ(run_cmd(build_bin("syrupctl") + " ping", out), 0) << out;
  json during = list_policies();
  bool applied_during = d.log().find("applied " + yaml + ": 1 deployed") != std::string::npos;
  ASSERT_TRUE(log_says(d, "applied " + yaml + ": 1 deployed", 1, 6000)) << d.log();
  EXPECT_TRUE(during.is_array() && during.empty()) << "the file was applied before its compile ended: " << during.dump();
  EXPECT_FALSE(applied_during) << d.log();
  EXPECT_EQ(listed_names(), (std::vector<std::string>{"cfgwarm/rr"})) << d.log();
  UdpClient c(g.port());
  for (int i = 0; i < 20; i++) c.send_request(1, i);
  EXPECT_EQ(g.drain(), (std::vector<int>{10, 10}));
  EXPECT_EQ(d.stop(), 0);
}

// SIGHUP with a policy that does not compile: clang runs once, on a worker, and the
// apply reports that run's diagnostics (file and line) without running clang again on
// the main thread. The previous policies of the file keep running.
TEST(Config, AReloadCompilesABrokenPolicyOnceAndReportsItsDiagnostics) {
  SYRUP_REQUIRE_ROOT();
  UdpGroup g(2);
  TempDir dir;
  std::string policy = dir.path() + "/broken.c", yaml = dir.path() + "/syrup.yaml";
  std::string runs = dir.path() + "/clang-runs", clang = dir.path() + "/counting-clang";
  std::ofstream(clang) << "#!/bin/sh\ncase \" $* \" in *\" -c \"*) echo run >> " << runs
                       << ";; esac\nexec /usr/bin/clang-19 \"$@\"\n";
  chmod(clang.c_str(), 0755);
  // The compiler runs as syrupd's --compiler_uid (nobody), which must reach the count.
  chmod(dir.path().c_str(), 0755);
  std::ofstream(runs).flush();
  chmod(runs.c_str(), 0666);
  std::ofstream(policy) << "#include <syrup/policy.h>\n// " << getpid() << " "
                        << std::chrono::steady_clock::now().time_since_epoch().count()
                        << "\nuint32_t schedule(void *pkt_start, void *pkt_end) { return nope; }\n";
  auto write_yaml = [&](bool entry) {
    std::ofstream f(yaml, std::ios::trunc);
    f << "version: 1\ntenants:\n  - name: cfgbroken\n    uid: 0\n    policies:" << (entry ? "\n" : " []\n");
    if (entry)
      f << "      - name: bad\n        hook: socket-select\n        policy: " << policy << "\n        pid: "
        << getpid() << "\n        port: " << g.port() << "\n";
  };
  write_yaml(false);
  Daemon d;
  d.start("", {"--config=" + yaml, "--clang=" + clang});
  auto clang_runs = [&] {
    std::ifstream in(runs);
    std::string line;
    int n = 0;
    while (std::getline(in, line)) n++;
    return n;
  };
  int before = clang_runs();
  write_yaml(true);
  kill(d.pid(), SIGHUP);
  ASSERT_TRUE(log_says(d, "applied " + yaml + ": 0 deployed, 0 removed, 0 unchanged, 1 failed", 1, 20000)) << d.log();
  EXPECT_EQ(clang_runs() - before, 1) << "the broken policy must be compiled once per reload";
  std::string log = d.log();
  EXPECT_NE(log.find(yaml + ":6: tenants[0].policies[0]: policy bad does not compile: " + policy +
                     ":3:"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("use of undeclared identifier 'nope'"), std::string::npos) << log;
  EXPECT_TRUE(list_policies().empty()) << d.log();
  EXPECT_EQ(d.stop(), 0);
}

TEST(Config, TenantQuotasBindTheFilesEntriesAndTheRestStillApplies) {
  SYRUP_REQUIRE_ROOT();
  UdpGroup small(2), big(2), other(2);
  TempFile yaml("quota.yaml");
  auto write_yaml = [&](const std::string& map_bytes) {
    std::ofstream f(yaml.path, std::ios::trunc);
    auto entry = [&](const char* name, const char* rel, uint16_t port) {
      f << "      - name: " << name << "\n        hook: socket-select\n        policy: " << source_path(rel)
        << "\n        pid: " << getpid() << "\n        port: " << port << "\n";
    };
    f << "version: 1\ntenants:\n  - name: capped\n    uid: 0\n    quotas: {map_bytes: " << map_bytes
      << "}\n    policies:\n";                                // lines 1-6
    entry("small", "tests/policies/by_key.c", small.port());    // lines 7-11
    entry("big", "tests/policies/big_map.c", big.port());       // lines 12-16 (a 1.2 MB map)
    f << "  - name: other\n    uid: 0\n    policies:\n";
    entry("rr", "policies/round_robin.c", other.port());
  };
  write_yaml("64KiB");
  Daemon d;
  d.start("", {"--config=" + yaml.path});

  EXPECT_EQ(listed_names(), (std::vector<std::string>{"capped/small", "other/rr"})) << d.log();
  std::string want = yaml.path + ":12: tenants[0].policies[1]: application 'capped' would have ";
  std::string log = d.log();
  size_t at = log.find(want);
  ASSERT_NE(at, std::string::npos) << log;
  std::string line = log.substr(at, log.find('\n', at) - at);
  EXPECT_NE(line.find(" bytes of maps; its quota is 65536 (tenants[0].quotas.map_bytes at " + yaml.path + ":5)"),
            std::string::npos)
      << line;
  EXPECT_NE(log.find("1 failed"), std::string::npos) << log;

  // What was applied routes traffic; the refused entry's group keeps the kernel's hash.
  UdpClient c1(small.port()), c2(big.port()), c3(other.port());
  for (uint32_t k = 0; k < 20; k++) {
    c1.send_request(1, k);
    c2.send_request(1, k);
    c3.send_request(1, k);
  }
  std::vector<std::vector<std::string>> got;
  EXPECT_EQ(small.drain(&got), (std::vector<int>{10, 10}));
  for (size_t s = 0; s < got.size(); s++)
    for (auto& p : got[s]) {
      uint32_t key;
      std::memcpy(&key, p.data() + 4, 4);
      EXPECT_EQ(key % 2, s) << "by_key sent key " << key << " to socket " << s;
    }
  auto hashed = big.drain();
  EXPECT_TRUE(hashed == std::vector<int>({20, 0}) || hashed == std::vector<int>({0, 20})) << hashed[0];
  EXPECT_EQ(other.drain(), (std::vector<int>{10, 10}));

  // A larger quota: the next reload deploys the entry and leaves the others alone.
  json before = list_policies();
  write_yaml("2MiB");
  kill(d.pid(), SIGHUP);
  ASSERT_TRUE(log_says(d, "applied " + yaml.path, 2, 6000)) << d.log();
  EXPECT_EQ(listed_names(), (std::vector<std::string>{"capped/big", "capped/small", "other/rr"})) << d.log();
  EXPECT_NE(d.log().find("1 deployed, 0 removed, 2 unchanged, 0 failed"), std::string::npos) << d.log();
  for (auto& p : list_policies())
    for (auto& b : before)
      if (p["name"] == b["name"]) {
        EXPECT_EQ(p["id"], b["id"]) << "an unchanged entry was redeployed";
      }
  EXPECT_EQ(d.stop(), 0);
}

// A reboot: bpffs is empty, the state file and every socket and interface are gone. The
// next syrupd finds nothing to adopt and rebuilds every policy from --config, on the new
// sockets and the new interface: the same policies, routing the same way.
TEST(Config, RebootStyleCleanStartRebuildsFromTheFile) {
  SYRUP_REQUIRE_ROOT();
  constexpr int kNet = 241;
  constexpr uint16_t kXdpPort = 9411;
  auto net = std::make_unique<TestNet>(kNet);
  ASSERT_TRUE(net->ok());
  auto group = std::make_unique<UdpGroup>(2);
  uint16_t port = group->port();
  TempFile yaml("reboot.yaml");
  {
    std::ofstream f(yaml.path);
    f << "version: 1\ntenants:\n"
      << "  - name: kv\n    uid: 0\n    policies:\n"
      << "      - name: by-key\n        hook: socket-select\n        policy: " << source_path("tests/policies/by_key.c")
      << "\n        pid: " << getpid() << "\n        port: " << port << "\n"
      << "  - name: edge\n    uid: 0\n    policies:\n"
      << "      - name: count\n        hook: xdp\n        policy: " << source_path("tests/policies/xdp_count.c")
      << "\n        ifname: " << net->host_if << "\n        port: " << kXdpPort << "\n";
  }

  // Deployed from the file; datagrams go where the policies say.
  auto check_deployed = [&](const Daemon& d, const char* when) {
    SCOPED_TRACE(when);
    EXPECT_EQ(listed_names(), (std::vector<std::string>{"edge/count", "kv/by-key"})) << d.log();
    std::vector<std::unique_ptr<UdpClient>> clients;
    for (int i = 0; i < 4; i++) clients.push_back(std::make_unique<UdpClient>(port));
    for (uint32_t k = 0; k < 40; k++) clients[k % 4]->send_request(1, k);
    std::vector<std::vector<std::string>> got;
    EXPECT_EQ(group->drain(&got), (std::vector<int>{20, 20}));
    for (size_t s = 0; s < got.size(); s++)
      for (auto& p : got[s]) {
        uint32_t key;
        std::memcpy(&key, p.data() + 4, 4);
        EXPECT_EQ(key % 2, s) << "key " << key << " reached socket " << s;
      }
    // The XDP policy sees exactly the datagrams to its port, which still arrive.
    expect_xdp_policy_counts(*net, kXdpPort, "edge", 15);
  };

  Daemon d;
  d.start("", {"--config=" + yaml.path, "--on_exit=keep"});
  check_deployed(d, "first start");
  std::string root = d.bpffs_root(), state = d.state_file();
  ASSERT_EQ(d.terminate(), 0);
  EXPECT_TRUE(fs::exists(root + "/apps/kv")) << "a keep shutdown leaves the pins";
  EXPECT_TRUE(fs::exists(state));

  // The reboot: a fresh bpffs, no state file, new sockets on the same port, a new
  // interface of the same name.
  std::error_code ec;
  fs::remove_all(root, ec);
  ASSERT_FALSE(ec) << ec.message();
  ASSERT_EQ(unlink(state.c_str()), 0);
  group.reset();
  group = std::make_unique<UdpGroup>(2, port);
  ASSERT_EQ(group->port(), port);
  net.reset();
  net = std::make_unique<TestNet>(kNet);
  ASSERT_TRUE(net->ok());
  ASSERT_EQ(attached_xdp_prog(net->host_if), 0u);

  d.start(root, {"--config=" + yaml.path});  // --on_exit=remove again: stop() cleans up
  EXPECT_NE(d.log().find("2 deployed, 0 removed, 0 unchanged, 0 failed"), std::string::npos) << d.log();
  EXPECT_EQ(d.log().find("adopted 1"), std::string::npos) << d.log();
  check_deployed(d, "after the reboot");
  EXPECT_EQ(d.stop(), 0);
  EXPECT_EQ(attached_xdp_prog(net->host_if), 0u) << "syrupd left an XDP program attached";
}

// A socket-select entry follows its process: when the process exits its policy goes, and
// when a new process is there (found again through the pid file) syrupd deploys the entry
// on it within a few seconds, without a reload. So too when the process closes its
// sockets and binds the port again (a reload in place): the policy ends with the old
// group and comes back on the new one.
TEST(Config, SocketSelectEntryFollowsItsProcessAcrossARestartWithoutAReload) {
  SYRUP_REQUIRE_ROOT();
  uint16_t port;
  {
    UdpGroup probe(1);  // a free port, released at once
    port = probe.port();
  }
  TempFile pidfile("server.pid"), yaml("follow.yaml");
  // A "server": two SO_REUSEPORT sockets on the port; writes its pid file when bound. On
  // SIGUSR1 it reloads in place: closes them and binds two new ones.
  static volatile sig_atomic_t reload = 0;
  auto start_server = [&]() -> pid_t {
    pid_t c = fork();
    if (c == 0) {
      signal(SIGUSR1, [](int) { reload = 1; });
      auto g = std::make_unique<UdpGroup>(2, port);
      std::ofstream(pidfile.path + ".tmp") << getpid() << "\n";
      rename((pidfile.path + ".tmp").c_str(), pidfile.path.c_str());
      for (;;) {
        pause();
        if (!reload) continue;
        reload = 0;
        g.reset();
        g = std::make_unique<UdpGroup>(2, port);
      }
    }
    for (int i = 0; i < 200 && access(pidfile.path.c_str(), F_OK) != 0; i++)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    return c;
  };
  struct Reaper {
    pid_t pid = -1;
    void stop() {
      if (pid > 0) kill(pid, SIGKILL), waitpid(pid, nullptr, 0);
      pid = -1;
    }
    ~Reaper() { stop(); }
  } server;
  server.pid = start_server();
  ASSERT_GT(server.pid, 0);
  {
    std::ofstream f(yaml.path);
    f << "tenants:\n  - name: follow\n    uid: 0\n    policies:\n      - name: by-key\n        hook: socket-select\n"
      << "        policy: " << source_path("tests/policies/by_key.c") << "\n        pidfile: " << pidfile.path
      << "\n        port: " << port << "\n";
  }
  Daemon d;
  d.start("", {"--config=" + yaml.path});
  auto deployed_for = [&](pid_t pid, int ms) {
    for (int t = 0; t < ms / 50; t++) {
      json l = list_policies();
      if (pid == 0 && l.is_array() && l.empty()) return true;
      if (pid && l.is_array() && l.size() == 1 && l[0]["owner_pid"] == pid) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  };
  // Routes by key on the server's sockets: all even keys to executor 0.
  auto routes = [&](const char* when) {
    SCOPED_TRACE(when);
    json l = list_policies();
    ASSERT_EQ(l.size(), 1u);
    UdpClient c(port);
    for (uint32_t k = 0; k < 20; k++) c.send_request(1, 2 * k);
    std::string out;
    run_cmd(build_bin("syrupctl") + " --json stats " + std::to_string(l[0]["id"].get<int>()), out);
    json st = json::parse(out, nullptr, false);
    ASSERT_TRUE(st.is_array() && st.size() == 1u) << out;
    EXPECT_EQ(st[0]["executors"], json::parse("[20, 0]")) << out;
  };
  ASSERT_TRUE(deployed_for(server.pid, 2000)) << list_policies().dump() << d.log();
  EXPECT_EQ(list_policies()[0]["persist"], false) << "a socket-select entry follows its process";
  routes("first server");

  server.stop();
  ASSERT_TRUE(deployed_for(0, 3000)) << "the policy must end with its process: " << list_policies().dump();
  server.pid = start_server();
  ASSERT_TRUE(deployed_for(server.pid, 10000)) << list_policies().dump() << d.log();
  EXPECT_NE(d.log().find("entries waiting for their process or interface: 1 deployed"), std::string::npos) << d.log();
  routes("restarted server");

  // The old group ends with its sockets: the policy is removed, and the entry comes back
  // on the new group of the same process.
  int before = list_policies()[0]["id"];
  kill(server.pid, SIGUSR1);
  bool again = false;
  for (int t = 0; t < 200 && !again; t++) {
    json l = list_policies();
    again = l.is_array() && l.size() == 1 && l[0]["id"] != before && l[0]["owner_pid"] == server.pid;
    if (!again) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(again) << list_policies().dump() << d.log();
  EXPECT_NE(d.log().find("every socket of its group udp/127.0.0.1:" + std::to_string(port) + " was closed"),
            std::string::npos)
      << d.log();
  routes("server reloaded in place");
  EXPECT_EQ(d.stop(), 0);
}

// An xdp entry follows its interface as a socket-select entry follows its process. One
// whose interface is not there when the file is applied waits for it (retried every 5 s);
// when the interface is deleted the policy goes at once, saying why, and comes back on
// the interface made again under the same name, without a reload.
TEST(Config, XdpEntryWaitsForItsInterfaceAndFollowsItWhenItIsMadeAgain) {
  SYRUP_REQUIRE_ROOT();
  constexpr int kNet = 242;
  constexpr uint16_t kXdpPort = 9412;
  auto net = std::make_unique<TestNet>(kNet);
  ASSERT_TRUE(net->ok());
  std::string ifname = net->host_if;
  net.reset();  // the name, without the interface
  TempFile yaml("iface.yaml");
  std::ofstream(yaml.path) << "version: 1\ntenants:\n  - name: edge\n    uid: 0\n    policies:\n"
                           << "      - name: count\n        hook: xdp\n        policy: "
                           << source_path("tests/policies/xdp_count.c") << "\n        ifname: " << ifname
                           << "\n        port: " << kXdpPort << "\n";
  Daemon d;
  d.start("", {"--config=" + yaml.path});
  EXPECT_NE(d.log().find("no network interface '" + ifname + "' (retried every 5 s)"), std::string::npos) << d.log();
  EXPECT_TRUE(listed_names().empty());

  auto listed_within = [&](bool want, int ms) {
    std::vector<std::string> expected;
    if (want) expected.push_back("edge/count");
    for (int t = 0; t < ms / 50; t++) {
      if (listed_names() == expected) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return listed_names() == expected;
  };
  net = std::make_unique<TestNet>(kNet);
  ASSERT_TRUE(net->ok());
  ASSERT_TRUE(listed_within(true, 10000)) << d.log();
  expect_xdp_policy_counts(*net, kXdpPort, "edge", 10);

  net.reset();
  ASSERT_TRUE(listed_within(false, 3000)) << "the policy of a deleted interface must go: " << d.log();
  EXPECT_NE(d.log().find("of app 'edge': interface " + ifname + " is gone"), std::string::npos) << d.log();

  net = std::make_unique<TestNet>(kNet);
  ASSERT_TRUE(net->ok());
  ASSERT_TRUE(listed_within(true, 10000)) << d.log();
  EXPECT_NE(d.log().find("entries waiting for their process or interface: 1 deployed"), std::string::npos)
      << d.log();
  expect_xdp_policy_counts(*net, kXdpPort, "edge", 10);
  EXPECT_EQ(d.stop(), 0);
  EXPECT_EQ(attached_xdp_prog(net->host_if), 0u) << "syrupd left an XDP program attached";
}


// systemd's end of sd_notify: a Unix datagram socket at NOTIFY_SOCKET that, as systemd
// does, receives each message with its sender's credentials (NotifyAccess=main, the
// default, takes only the main process's).
class NotifySocket {
 public:
  explicit NotifySocket(const std::string& path) : path_(path) {
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strncpy(a.sun_path, path.c_str(), sizeof a.sun_path - 1);
    fd_.reset(socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    int one = 1;
    ok_ = fd_ && bind(fd_.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
          setsockopt(fd_.get(), SOL_SOCKET, SO_PASSCRED, &one, sizeof one) == 0;
  }
  ~NotifySocket() { unlink(path_.c_str()); }
  bool ok() const { return ok_; }
  // The next message within `ms` and its sender's pid; "" and -1 when none came.
  std::pair<std::string, pid_t> next(int ms) {
    pollfd p{fd_.get(), POLLIN, 0};
    if (poll(&p, 1, ms) != 1) return {"", -1};
    char buf[4096];
    alignas(cmsghdr) char ctl[CMSG_SPACE(sizeof(ucred))];
    iovec iov{buf, sizeof buf};
    msghdr m{};
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    m.msg_control = ctl;
    m.msg_controllen = sizeof ctl;
    ssize_t n = recvmsg(fd_.get(), &m, 0);
    if (n < 0) return {"", -1};
    pid_t pid = -1;
    for (cmsghdr* c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c))
      if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_CREDENTIALS)
        pid = reinterpret_cast<ucred*>(CMSG_DATA(c))->pid;
    return {std::string(buf, static_cast<size_t>(n)), pid};
  }

 private:
  std::string path_;
  UniqueFd fd_;
  bool ok_ = false;
};

// Type=notify (packaging/systemd): syrupd says READY=1 only once the previous syrupd's
// policies are adopted and the --config file is applied, from its own pid, and STOPPING=1
// when it shuts down. The config's new entry compiles at start (not in the cache), so a
// READY sent before adoption or the config would be read while the log still lacks them.
TEST(Config, TellsSystemdItIsReadyOnlyOnceAdoptedAndApplied) {
  SYRUP_REQUIRE_ROOT();
  UdpGroup g1(2), g2(2);
  TempFile yaml("notify.yaml");
  auto write_yaml = [&](bool second) {
    std::ofstream f(yaml.path, std::ios::trunc);
    f << "version: 1\ntenants:\n  - name: notifyapp\n    uid: 0\n    policies:\n";
    f << "      - name: rr\n        hook: socket-select\n        policy: " << source_path("policies/round_robin.c")
      << "\n        pid: " << getpid() << "\n        port: " << g1.port() << "\n";
    if (second)
      f << "      - name: pass\n        hook: socket-select\n        policy: " << source_path("policies/pass.c")
        << "\n        pid: " << getpid() << "\n        port: " << g2.port() << "\n";
  };
  write_yaml(false);
  Daemon d;
  d.start("", {"--config=" + yaml.path});
  ASSERT_EQ(listed_names(), std::vector<std::string>{"notifyapp/rr"}) << d.log();
  d.crash();  // rr stays deployed, in the state file, for the next syrupd to adopt

  write_yaml(true);
  std::string logf = (fs::path(d.socket()).parent_path() / "syrupd.log").string();
  std::string notify_path = "/tmp/syrup-config-test-" + std::to_string(getpid()) + ".notify";
  NotifySocket notify(notify_path);
  ASSERT_TRUE(notify.ok()) << strerror(errno);
  // The log as syrupd had written it when READY=1 arrived (read at once, on a thread of
  // its own: start() returns only once syrupd answers requests).
  std::pair<std::string, pid_t> ready;
  std::string log_at_ready;
  std::thread watcher([&] {
    ready = notify.next(30000);
    log_at_ready = read_text(logf);
  });
  const char* outer = getenv("NOTIFY_SOCKET");  // a test run under systemd has one
  std::string outer_socket = outer ? outer : "";
  setenv("NOTIFY_SOCKET", notify_path.c_str(), 1);
  d.start(d.bpffs_root(), {"--config=" + yaml.path});
  // The next syrupd of this process is not this test's.
  if (outer) setenv("NOTIFY_SOCKET", outer_socket.c_str(), 1);
  else unsetenv("NOTIFY_SOCKET");
  watcher.join();

  ASSERT_TRUE(ready.first.starts_with("READY=1\n")) << "first message: '" << ready.first << "'\n" << d.log();
  EXPECT_NE(ready.first.find("STATUS=serving; 2 policies at start"), std::string::npos) << ready.first;
  EXPECT_EQ(ready.second, d.pid()) << "READY=1 must come from syrupd itself (NotifyAccess=main)";
  EXPECT_NE(log_at_ready.find("adopted 1 policies of the previous syrupd"), std::string::npos)
      << "READY=1 before the state file's policy was adopted; log then:\n" << log_at_ready;
  EXPECT_NE(log_at_ready.find("applied " + yaml.path + ": 1 deployed, 0 removed, 1 unchanged, 0 failed"),
            std::string::npos)
      << "READY=1 before the config was applied; log then:\n" << log_at_ready;
  EXPECT_EQ(listed_names(), (std::vector<std::string>{"notifyapp/pass", "notifyapp/rr"})) << d.log();

  EXPECT_EQ(d.stop(), 0);
  auto stopping = notify.next(5000);
  EXPECT_TRUE(stopping.first.starts_with("STOPPING=1\n")) << "after SIGTERM: '" << stopping.first << "'";
  EXPECT_EQ(notify.next(0).first, "") << "nothing after STOPPING=1";
}

}  // namespace
}  // namespace syrup::test
