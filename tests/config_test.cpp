// syrupd --config end to end: a YAML file of tenants applied at start, SIGHUP applying
// only what changed (and keeping the running configuration when the file is bad), a
// restart adopting without redeploying, and the Prometheus endpoint showing it all.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "harness.h"

namespace syrup::test {
namespace {

using nlohmann::json;

json list_policies() {
  std::string out;
  run_cmd(build_bin("syrupctl") + " --json list", out);
  return json::parse(out, nullptr, false);
}

std::string http_get(uint16_t port, const std::string& path) {
  UniqueFd s(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port);
  if (connect(s.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) < 0) return "";
  std::string req = "GET " + path + " HTTP/1.0\r\nHost: localhost\r\n\r\n";
  (void)!write(s.get(), req.data(), req.size());
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = read(s.get(), buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  return out;
}

// Waits until syrupd's log has `count` lines containing `what`.
bool wait_log(const Daemon& d, const std::string& what, int count) {
  for (int i = 0; i < 300; i++) {
    std::string log = d.log();
    int n = 0;
    for (size_t p = log.find(what); p != std::string::npos; p = log.find(what, p + 1)) n++;
    if (n >= count) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
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
  d.start("", {"--config=" + yaml, "--metrics_port=" + std::to_string(mport)});

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
  ASSERT_TRUE(wait_log(d, "applied " + yaml, 2)) << d.log();
  l = list_policies();
  ASSERT_EQ(l.size(), 2u) << l.dump();
  EXPECT_EQ(l[0]["id"], rr_id) << "an unchanged entry must not be redeployed";
  EXPECT_EQ(l[1]["name"], "hash");

  // A broken file: the error names file, line and key; nothing changes.
  write_yaml(true, true, "      - name: broken\n        hook: socket-select\n        port: 70000\n");
  kill(d.pid(), SIGHUP);
  ASSERT_TRUE(wait_log(d, "the running configuration stays", 1)) << d.log();
  EXPECT_NE(d.log().find(yaml + ":"), std::string::npos) << d.log();
  EXPECT_EQ(list_policies().size(), 2u);

  // Metrics show the tenant, its policies' decisions and the reloads.
  std::string m = http_get(mport, "/metrics");
  EXPECT_NE(m.find("200 OK"), std::string::npos) << m;
  EXPECT_NE(m.find("syrup_policy_decisions_total{"), std::string::npos) << m;
  EXPECT_NE(m.find("tenant=\"cfgapp\""), std::string::npos) << m;
  EXPECT_NE(m.find("syrup_config_reloads_total"), std::string::npos) << m;
  EXPECT_NE(m.find("syrup_tenant_policies{tenant=\"cfgapp\"} 2"), std::string::npos) << m;

  // Removing an entry removes its policy; the kernel's hash is back on that group.
  write_yaml(true, false);
  kill(d.pid(), SIGHUP);
  ASSERT_TRUE(wait_log(d, "applied " + yaml, 3)) << d.log();
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

}  // namespace
}  // namespace syrup::test
