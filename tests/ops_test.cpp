// Unit tests of the operations modules (no kernel, no syrupd): the YAML config parser
// and its diagnostics, the planner, the process resolver, the Prometheus renderer and
// the metrics HTTP endpoint on 127.0.0.1 with an ephemeral port.
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "config.h"
#include "http_client.h"
#include "http_endpoint.h"
#include "metrics.h"
#include "registry.h"

namespace syrup {
namespace {

namespace fs = std::filesystem;
using config::Config;
using config::Diagnostic;
using nlohmann::json;
using test::http_exchange;
using test::read_all;
using test::tcp_connect;

// Policy files by path; any other path does not exist.
struct FakeFiles {
  std::map<std::string, std::string> files = {
      {"/etc/syrup/a.c", "int a;\n"},
      {"/etc/syrup/b.c", "int b;\n"},
      {"/etc/syrup/policies/xdp_classify.c", "int x;\n"},
      {"/etc/syrup/big.c", std::string(2000, 'x')},
      {"/etc/syrup/empty.c", ""},
      {"/etc/syrup/nul.c", std::string("a\0b", 3)},
  };
  config::LoadOptions opts() {
    config::LoadOptions o;
    o.read_file = [this](const std::string& p, size_t limit, std::string& out, std::string& why) {
      auto it = files.find(p);
      if (it == files.end()) {
        why = "No such file or directory";
        return -ENOENT;
      }
      out = it->second.substr(0, limit + 1);
      return 0;
    };
    return o;
  }
};

struct Loaded {
  int r = 0;
  Config cfg;
  std::vector<std::string> errs;
};

Loaded load(const std::string& yaml, FakeFiles files = {}, size_t max_source = 1 << 20) {
  Loaded l;
  std::vector<Diagnostic> d;
  auto o = files.opts();
  o.max_source_bytes = max_source;
  l.r = config::load_string(yaml, "syrup.yaml", "/etc/syrup", l.cfg, d, o);
  for (auto& x : d) l.errs.push_back(x.str());
  return l;
}

// The one diagnostic a file gives.
std::string only_error(const std::string& yaml, FakeFiles files = {}, size_t max_source = 1 << 20) {
  Loaded l = load(yaml, files, max_source);
  EXPECT_EQ(l.r, -EINVAL) << yaml;
  EXPECT_EQ(l.errs.size(), 1u) << testing::PrintToString(l.errs);
  return l.errs.empty() ? "" : l.errs[0];
}

const char* kValid = R"(version: 1
admin_group: syrup-admin
defaults:
  quotas: {policies: 4, map_bytes: 4MiB, source_bytes: 64KiB, requests_per_second: 20}
tenants:
  - name: kv
    uid: 1000
    quotas: {policies: 8, maps: 32, map_bytes: 16MiB, insns: 100000, requests_per_second: unlimited}
    policies:
      - hook: xdp
        policy: policies/xdp_classify.c
        ifname: eth0
        ports: [9001, 9000]
        cpus: [0, 1, 4-5]
        params: {long_cost: 70, mask: 0x10}
      - hook: socket-select
        policy: a.c
        process: rocksdb_server
        port: 9000
        protocol: tcp
  - name: batch
    uid: 1001
    policies:
      - name: fifo
        hook: thread
        policy: /etc/syrup/b.c
        pidfile: ../../run/batch.pid
        persist: false
  - name: idle
    uid: 1002
)";

TEST(Config, ParsesAValidFile) {
  Loaded l = load(kValid);
  ASSERT_EQ(l.r, 0) << testing::PrintToString(l.errs);
  const Config& c = l.cfg;
  EXPECT_EQ(c.path, "syrup.yaml");
  EXPECT_EQ(c.admin_group, "syrup-admin");
  EXPECT_EQ(c.defaults.policies, 4u);
  EXPECT_EQ(c.defaults.map_bytes, 4u << 20);
  ASSERT_EQ(c.tenants.size(), 3u);
  EXPECT_EQ(c.num_policies(), 3u);

  const auto& kv = c.tenants[0];
  EXPECT_EQ(kv.name, "kv");
  EXPECT_EQ(kv.uid, 1000u);
  EXPECT_EQ(kv.line, 6);
  EXPECT_EQ(kv.quotas.map_bytes, 16u << 20);
  EXPECT_EQ(kv.quotas.requests_per_second, config::kUnlimited);
  EXPECT_FALSE(kv.quotas.source_bytes.has_value());
  // Effective: the tenant's own over the defaults.
  EXPECT_EQ(kv.effective.policies, 8u);
  EXPECT_EQ(kv.effective.source_bytes, 64u << 10);
  EXPECT_EQ(kv.effective.requests_per_second, config::kUnlimited);
  EXPECT_EQ(config::Quotas::limit(kv.effective.requests_per_second), config::kUnlimited);
  EXPECT_EQ(c.tenants[1].effective.policies, 4u);
  EXPECT_EQ(kv.effective.limits(), (std::map<std::string, uint64_t>{{"policies", 8}, {"maps", 32}, {"map_bytes", 16 << 20},
                                                                    {"insns", 100000}, {"source_bytes", 64 << 10}}));
  EXPECT_EQ(kv.effective.to_json(),
            json::parse(R"({"policies":8,"maps":32,"map_bytes":16777216,"insns":100000,"source_bytes":65536,
                            "requests_per_second":"unlimited"})"));

  const auto& x = kv.policies[0];
  EXPECT_EQ(x.identity, "kv/xdp_classify.c");
  EXPECT_EQ(x.where, "tenants[0].policies[0]");
  EXPECT_EQ(x.line, 10);
  EXPECT_EQ(x.uid, 1000u);
  EXPECT_EQ(x.path, "/etc/syrup/policies/xdp_classify.c");
  EXPECT_EQ(x.target.kind, config::ProcessSelector::Kind::kNone);
  EXPECT_EQ(x.request, json::parse(R"({"op":"deploy","hook":"xdp","app":"kv","name":"xdp_classify.c",
      "source_name":"/etc/syrup/policies/xdp_classify.c","source":"int x;\n",
      "params":{"long_cost":70,"mask":16},"persist":true,"ifname":"eth0","ports":[9000,9001],
      "protocol":"udp","cpus":[0,1,4,5]})"));
  EXPECT_EQ(x.hash.size(), 64u);

  const auto& s = kv.policies[1];
  EXPECT_EQ(s.identity, "kv/a.c");
  EXPECT_EQ(s.target.kind, config::ProcessSelector::Kind::kProcess);
  EXPECT_EQ(s.target.process, "rocksdb_server");
  EXPECT_EQ(s.request, json::parse(R"({"op":"deploy","hook":"socket-select","app":"kv","name":"a.c",
      "source_name":"/etc/syrup/a.c","source":"int a;\n","params":{},"persist":false,"port":9000,
      "protocol":"tcp"})"));

  const auto& t = c.tenants[1].policies[0];
  EXPECT_EQ(t.identity, "batch/fifo");
  EXPECT_EQ(t.target.kind, config::ProcessSelector::Kind::kPidfile);
  EXPECT_EQ(t.target.pidfile, "/run/batch.pid");
  EXPECT_EQ(t.target.str(), "pidfile /run/batch.pid");
  EXPECT_EQ(t.request, json::parse(R"({"op":"deploy","hook":"thread","app":"batch","name":"fifo",
      "source_name":"/etc/syrup/b.c","source":"int b;\n","params":{},"persist":false})"));
  EXPECT_TRUE(c.tenants[2].policies.empty());
  ASSERT_NE(c.tenant("batch"), nullptr);
  EXPECT_EQ(c.tenant("nope"), nullptr);
  EXPECT_EQ(c.entries().size(), 3u);
}

TEST(Config, EmptyFileIsValidWithNoTenants) {
  for (const char* y : {"", "# nothing\n", "tenants:\n", "tenants: []\n"}) {
    Loaded l = load(y);
    EXPECT_EQ(l.r, 0) << y;
    EXPECT_TRUE(l.cfg.tenants.empty());
  }
}

TEST(Config, HashFollowsContentNotOrder) {
  const char* a = "tenants:\n- {name: t, uid: 1, policies: [{hook: thread, policy: a.c, pid: 5}, {hook: thread, policy: b.c, pid: 6}]}\n";
  const char* b = "tenants:\n- {name: t, uid: 1, policies: [{hook: thread, policy: b.c, pid: 6}, {hook: thread, policy: a.c, pid: 5}]}\n";
  Loaded la = load(a), lb = load(b);
  ASSERT_EQ(la.r, 0);
  ASSERT_EQ(lb.r, 0);
  EXPECT_EQ(la.cfg.tenants[0].policies[0].hash, lb.cfg.tenants[0].policies[1].hash);
  EXPECT_EQ(la.cfg.tenants[0].policies[0].identity, "t/a.c");

  auto hash_of = [](const std::string& y, FakeFiles f = {}) {
    Loaded l = load(y, f);
    EXPECT_EQ(l.r, 0) << testing::PrintToString(l.errs);
    return l.r ? std::string() : l.cfg.tenants[0].policies[0].hash;
  };
  std::string base = hash_of("tenants:\n- {name: t, uid: 1, policies: [{hook: thread, policy: a.c, pid: 5}]}\n");
  EXPECT_EQ(base, hash_of("tenants:\n- {name: t, uid: 1, policies: [{hook: thread, policy: a.c, pid: 5}]}\n"));
  EXPECT_NE(base, hash_of("tenants:\n- {name: t, uid: 2, policies: [{hook: thread, policy: a.c, pid: 5}]}\n"));
  EXPECT_NE(base, hash_of("tenants:\n- {name: t, uid: 1, policies: [{hook: thread, policy: a.c, pid: 6}]}\n"));
  EXPECT_NE(base, hash_of("tenants:\n- {name: t, uid: 1, policies: [{hook: thread, policy: a.c, process: a}]}\n"));
  EXPECT_NE(base, hash_of("tenants:\n- {name: t, uid: 1, policies: [{hook: thread, policy: a.c, pid: 5, params: {x: 1}}]}\n"));
  FakeFiles latin1;
  latin1.files["/etc/syrup/a.c"] = "/* caf\xe9 */ int a;\n";  // not UTF-8: still hashed, not thrown
  EXPECT_NE(base, hash_of("tenants:\n- {name: t, uid: 1, policies: [{hook: thread, policy: a.c, pid: 5}]}\n", latin1));
  FakeFiles changed;
  changed.files["/etc/syrup/a.c"] = "int a2;\n";
  EXPECT_NE(base, hash_of("tenants:\n- {name: t, uid: 1, policies: [{hook: thread, policy: a.c, pid: 5}]}\n", changed));
}

// Every kind of error, with its exact text: file, line, key, message.
// A tenant of --config may have its own per-uid quotas, written like the others and named
// by key and line when they refuse.
TEST(Config, TenantsSetTheirOwnPerUidQuotas) {
  Config c;
  std::vector<Diagnostic> errs;
  std::string text =
      "version: 1\n"
      "defaults:\n"
      "  quotas: {uid_policies: 10}\n"
      "tenants:\n"
      "- name: web\n"
      "  uid: 62001\n"
      "  quotas: {uid_map_bytes: 128MiB, uid_maps: unlimited}\n";
  ASSERT_EQ(config::load_string(text, "syrup.yaml", "/tmp", c, errs), 0) << (errs.empty() ? "" : errs[0].str());
  const config::Tenant* t = c.tenant("web");
  ASSERT_TRUE(t);
  EXPECT_EQ(t->effective.uid_policies, 10u);
  EXPECT_EQ(t->effective.uid_map_bytes, 128ull << 20);
  EXPECT_EQ(t->effective.uid_maps, config::kUnlimited);
  EXPECT_EQ(t->quota_sources.at("uid_map_bytes").key, "tenants[0].quotas.uid_map_bytes");
  EXPECT_EQ(t->quota_sources.at("uid_map_bytes").line, 7);
  EXPECT_EQ(t->quota_sources.at("uid_policies").key, "defaults.quotas.uid_policies");
  errs.clear();
  EXPECT_NE(config::load_string("version: 1\ntenants:\n- {name: w, uid: 1, quotas: {uid_maps: -1}}\n", "s.yaml",
                                "/tmp", c, errs),
            0);
}

TEST(ConfigErrors, Syntax) {
  EXPECT_EQ(only_error("tenants: [1, 2\n"), "syrup.yaml:2: syntax error: end of sequence flow not found");
  EXPECT_EQ(only_error("a: 1\n---\nb: 2\n"), "syrup.yaml:2: a config file holds one YAML document; another one starts here");
  // Text yaml-cpp 0.7 cannot tokenize (its LoadAll loops forever on it).
  EXPECT_EQ(only_error(",1 :a1 \n"), "syrup.yaml:1: syntax error: cannot parse the text at column 1");
  EXPECT_EQ(only_error("tenants: []\n,:a\n"), "syrup.yaml:2: syntax error: end of map not found");
  EXPECT_EQ(load("%YAML 1.2\n---\n# nothing\n").r, 0);
  EXPECT_EQ(only_error("tenants:\n  - name: k\x9dv\n"), "syrup.yaml:2: the file is not UTF-8 text (byte 20)");
  EXPECT_EQ(only_error("a: \xed\xa0\x80\n"), "syrup.yaml:1: the file is not UTF-8 text (byte 3)");  // a surrogate
  EXPECT_EQ(load("tenants:\n  - name: kv\n    uid: 1  # \xc3\xa9t\xc3\xa9 \xf0\x9f\x98\x80\n").r, 0);
  EXPECT_EQ(only_error("- 1\n"), "syrup.yaml:1: expected a mapping with the keys version, admin_group, defaults, tenants");
}

TEST(ConfigErrors, UnknownAndDuplicateKeys) {
  EXPECT_EQ(only_error("tenant: []\n"),
            "syrup.yaml:1: tenant: unknown key (allowed: version, admin_group, defaults, tenants); did you mean 'tenants'?");
  EXPECT_EQ(only_error("tenants:\n  - name: kv\n    uid: 1\n    colour: red\n"),
            "syrup.yaml:4: tenants[0].colour: unknown key (allowed: name, uid, quotas, policies)");
  EXPECT_EQ(only_error("tenants:\n  - name: kv\n    uid: 1\n    name: kv2\n"),
            "syrup.yaml:4: tenants[0].name: duplicate key (first at line 2)");
  EXPECT_EQ(only_error("defaults:\n  quotas: {policy: 3}\n"),
            "syrup.yaml:2: defaults.quotas.policy: unknown key (allowed: policies, maps, map_bytes, insns, "
            "source_bytes, requests_per_second, uid_policies, uid_maps, uid_map_bytes, uid_insns); did you mean "
            "'policies'?");
  EXPECT_EQ(only_error("tenants:\n- name: kv\n  uid: 1\n  policies:\n  - hook: thread\n    policy: a.c\n    pid: 3\n    port: 9\n"),
            "syrup.yaml:8: tenants[0].policies[0].port: not used by the thread hook (its keys: name, hook, policy, "
            "params, persist, process, pid, pidfile)");
  EXPECT_EQ(only_error("tenants:\n- name: kv\n  uid: 1\n  policies:\n  - hook: thread\n    policy: a.c\n    pid: 3\n    prio: 9\n"),
            "syrup.yaml:8: tenants[0].policies[0].prio: unknown key (allowed: name, hook, policy, params, persist, "
            "process, pid, pidfile)");
}

TEST(ConfigErrors, TenantNamesAndUids) {
  EXPECT_EQ(only_error("tenants:\n  - name: kv\n    uid: 1\n  - name: kv\n    uid: 2\n"),
            "syrup.yaml:4: tenants[1].name: duplicate tenant name 'kv' (first at line 2)");
  EXPECT_EQ(only_error("tenants:\n  - name: a/b\n    uid: 1\n"),
            "syrup.yaml:2: tenants[0].name: tenant name 'a/b' has a character outside [A-Za-z0-9_-] (bpffs "
            "refuses '.' in pin names)");
  // A tenant is an application, whose pins bpffs would refuse with a dot in the name.
  EXPECT_EQ(only_error("tenants:\n  - name: kv.v2\n    uid: 1\n"),
            "syrup.yaml:2: tenants[0].name: tenant name 'kv.v2' has a character outside [A-Za-z0-9_-] (bpffs "
            "refuses '.' in pin names)");
  EXPECT_EQ(only_error("tenants:\n  - name: " + std::string(65, 'a') + "\n    uid: 1\n"),
            "syrup.yaml:2: tenants[0].name: tenant name is longer than 64 characters");
  EXPECT_EQ(only_error("tenants:\n  - name: kv\n"), "syrup.yaml:2: tenants[0].uid: required key is missing");
  EXPECT_EQ(only_error("tenants:\n  - uid: 3\n"), "syrup.yaml:2: tenants[0].name: required key is missing");
  EXPECT_EQ(only_error("tenants:\n  - name: kv\n    uid: -1\n"),
            "syrup.yaml:3: tenants[0].uid: expected a uid (a non-negative integer below 4294967295)");
  EXPECT_EQ(only_error("tenants:\n  - name: kv\n    uid: \"1000\"\n"),
            "syrup.yaml:3: tenants[0].uid: expected a uid (a non-negative integer below 4294967295)");
  EXPECT_EQ(only_error("tenants: {kv: 1}\n"), "syrup.yaml:1: tenants: expected a list of tenants");
  EXPECT_EQ(only_error("tenants:\n  - kv\n"),
            "syrup.yaml:2: tenants[0]: expected a tenant: a mapping with the keys name, uid, quotas, policies");
}

TEST(ConfigErrors, TopLevelValues) {
  EXPECT_EQ(only_error("version: 2\n"), "syrup.yaml:1: version: unsupported version 2 (this syrupd reads version 1)");
  EXPECT_EQ(only_error("admin_group: \"two words\"\n"), "syrup.yaml:1: admin_group: expected a group name or a numeric gid");
  EXPECT_EQ(load("admin_group: 0\n").cfg.admin_group, "0");
  EXPECT_EQ(only_error("defaults: 3\n"), "syrup.yaml:1: defaults: expected a mapping with the key quotas");
}

TEST(ConfigErrors, QuotasAndSizes) {
  EXPECT_EQ(only_error("defaults:\n  quotas:\n    map_bytes: 16MB\n"),
            "syrup.yaml:3: defaults.quotas.map_bytes: expected a size such as 65536, 64KiB or 16MiB (units B, KiB, "
            "MiB, GiB, TiB), or 'unlimited'");
  EXPECT_EQ(only_error("defaults:\n  quotas:\n    policies: 1.5\n"),
            "syrup.yaml:3: defaults.quotas.policies: expected a non-negative integer or 'unlimited'");
  EXPECT_EQ(only_error("defaults:\n  quotas:\n    insns:\n"),
            "syrup.yaml:3: defaults.quotas.insns: expected a non-negative integer or 'unlimited'");
  EXPECT_EQ(only_error("tenants:\n- name: kv\n  uid: 1\n  quotas: [1]\n"),
            "syrup.yaml:4: tenants[0].quotas: expected a mapping of quotas (policies, maps, map_bytes, insns, "
            "source_bytes, requests_per_second, uid_policies, uid_maps, uid_map_bytes, uid_insns)");
  // Declared policies beyond the quota; policy files beyond the source quota.
  EXPECT_EQ(only_error("defaults: {quotas: {policies: 1}}\ntenants:\n- name: kv\n  uid: 1\n  policies:\n"
                       "  - {hook: thread, policy: a.c, pid: 1}\n  - {hook: thread, policy: b.c, pid: 2}\n"),
            "syrup.yaml:6: tenants[0].policies: 2 policies declared; the tenant's policies quota is 1");
  EXPECT_EQ(only_error("tenants:\n- name: kv\n  uid: 1\n  quotas: {source_bytes: 1KiB}\n  policies:\n"
                       "  - {hook: thread, policy: big.c, pid: 1}\n"),
            "syrup.yaml:6: tenants[0].policies[0].policy: /etc/syrup/big.c is 2000 bytes; the tenant's "
            "source_bytes quota is 1024");
}

TEST(ConfigErrors, SizeUnits) {
  uint64_t v;
  ASSERT_TRUE(config::parse_size("16MiB", v));
  EXPECT_EQ(v, 16u << 20);
  ASSERT_TRUE(config::parse_size("64 KiB", v));
  EXPECT_EQ(v, 64u << 10);
  ASSERT_TRUE(config::parse_size("512", v));
  EXPECT_EQ(v, 512u);
  ASSERT_TRUE(config::parse_size("3B", v));
  EXPECT_EQ(v, 3u);
  ASSERT_TRUE(config::parse_size("1TiB", v));
  EXPECT_EQ(v, 1ull << 40);
  for (const char* bad : {"", "MiB", "16MB", "16 mib", "-1", "1.5MiB", "99999999999999999999", "16777216TiB", "0x10"})
    EXPECT_FALSE(config::parse_size(bad, v)) << bad;
}

const std::string kPolicyHead = "tenants:\n- name: kv\n  uid: 1\n  policies:\n";  // entries from line 5

TEST(ConfigErrors, Hooks) {
  EXPECT_EQ(only_error(kPolicyHead + "  - policy: a.c\n    pid: 1\n"),
            "syrup.yaml:5: tenants[0].policies[0].hook: required key is missing");
  EXPECT_EQ(only_error(kPolicyHead + "  - hook: sched\n    policy: a.c\n"),
            "syrup.yaml:5: tenants[0].policies[0].hook: unknown hook 'sched' (known: " + syrup::hook_names() + ")");
  EXPECT_EQ(only_error(kPolicyHead + "  - hook: thread\n    pid: 1\n"),
            "syrup.yaml:5: tenants[0].policies[0].policy: required key is missing");
  EXPECT_EQ(only_error(kPolicyHead + "  - 3\n"),
            "syrup.yaml:5: tenants[0].policies[0]: expected a policy: a mapping with hook, policy and the hook's keys");
}

TEST(ConfigErrors, PolicyFiles) {
  EXPECT_EQ(only_error(kPolicyHead + "  - hook: thread\n    policy: missing.c\n    pid: 1\n"),
            "syrup.yaml:6: tenants[0].policies[0].policy: cannot read /etc/syrup/missing.c: No such file or directory");
  EXPECT_EQ(only_error(kPolicyHead + "  - hook: thread\n    policy: empty.c\n    pid: 1\n"),
            "syrup.yaml:6: tenants[0].policies[0].policy: /etc/syrup/empty.c is empty");
  EXPECT_EQ(only_error(kPolicyHead + "  - hook: thread\n    policy: nul.c\n    pid: 1\n"),
            "syrup.yaml:6: tenants[0].policies[0].policy: /etc/syrup/nul.c contains NUL bytes: not C source text");
  EXPECT_EQ(only_error(kPolicyHead + "  - hook: thread\n    policy: big.c\n    pid: 1\n", {}, 1000),
            "syrup.yaml:6: tenants[0].policies[0].policy: /etc/syrup/big.c is larger than 1000 bytes (syrupd's "
            "--max_source_bytes)");
}

TEST(ConfigErrors, PortsAndTargets) {
  const std::string xdp = kPolicyHead + "  - hook: xdp\n    policy: a.c\n    ifname: eth0\n";  // keys from line 8
  EXPECT_EQ(only_error(xdp + "    ports: [9000, 70000]\n"),
            "syrup.yaml:8: tenants[0].policies[0].ports: expected a list of ports in 1..65535");
  EXPECT_EQ(only_error(xdp + "    ports: 9000\n"),
            "syrup.yaml:8: tenants[0].policies[0].ports: expected a list of ports in 1..65535");
  EXPECT_EQ(only_error(xdp + "    ports: [9000, 9000]\n"),
            "syrup.yaml:8: tenants[0].policies[0].ports: port 9000 is listed twice");
  EXPECT_EQ(only_error(xdp), "syrup.yaml:5: tenants[0].policies[0].ports: the xdp hook needs the ports it schedules: port or ports");
  EXPECT_EQ(only_error(xdp + "    port: 0\n"), "syrup.yaml:8: tenants[0].policies[0].port: expected a port in 1..65535");
  EXPECT_EQ(only_error(xdp + "    port: 1\n    protocol: sctp\n"),
            "syrup.yaml:9: tenants[0].policies[0].protocol: expected udp or tcp");
  EXPECT_EQ(only_error(xdp + "    port: 1\n    cpus: [0, 1-0]\n"),
            "syrup.yaml:9: tenants[0].policies[0].cpus: expected a list of CPU numbers (0..4095) or ranges such as 0-3");
  EXPECT_EQ(only_error(xdp + "    port: 1\n    cpus: [0-2, 2]\n"),
            "syrup.yaml:9: tenants[0].policies[0].cpus: CPU 2 is listed twice");
  EXPECT_EQ(only_error(kPolicyHead + "  - hook: xdp\n    policy: a.c\n    ifname: a/b\n    port: 1\n"),
            "syrup.yaml:7: tenants[0].policies[0].ifname: expected an interface name (1..15 characters, no '/', ':' or spaces)");
  EXPECT_EQ(only_error(kPolicyHead + "  - hook: xdp\n    policy: a.c\n    port: 1\n"),
            "syrup.yaml:5: tenants[0].policies[0].ifname: required key is missing");

  const std::string ss = kPolicyHead + "  - hook: socket-select\n    policy: a.c\n";  // keys from line 7
  EXPECT_EQ(only_error(ss + "    pid: 1\n"), "syrup.yaml:5: tenants[0].policies[0].port: required key is missing");
  EXPECT_EQ(only_error(ss + "    port: 9000\n"),
            "syrup.yaml:5: tenants[0].policies[0].process: the socket-select hook needs the process it schedules: "
            "process, pid or pidfile");
  EXPECT_EQ(only_error(ss + "    port: 9000\n    pid: 3\n    process: x\n"),
            "syrup.yaml:9: tenants[0].policies[0].process: pid, process: give only one of process, pid and pidfile");
  EXPECT_EQ(only_error(ss + "    port: 9000\n    pid: 0\n"), "syrup.yaml:8: tenants[0].policies[0].pid: expected a pid (a positive integer)");
  EXPECT_EQ(only_error(ss + "    port: 9000\n    process: a_very_long_process_name\n"),
            "syrup.yaml:8: tenants[0].policies[0].process: expected a process name as in /proc/PID/comm (1..15 "
            "characters, no '/')");
  EXPECT_EQ(only_error(ss + "    port: 9000\n    pid: 3\n    ports: [1]\n"),
            "syrup.yaml:9: tenants[0].policies[0].ports: not used by the socket-select hook (its keys: name, hook, "
            "policy, params, persist, process, pid, pidfile, port, protocol, address)");
}

TEST(ConfigErrors, ParamsAndPersist) {
  const std::string t = kPolicyHead + "  - hook: thread\n    policy: a.c\n    pid: 1\n";  // keys from line 8
  EXPECT_EQ(only_error(t + "    params: {x: -1}\n"), "syrup.yaml:8: tenants[0].policies[0].params.x: expected a non-negative integer");
  EXPECT_EQ(only_error(t + "    params: {x: \"1\"}\n"), "syrup.yaml:8: tenants[0].policies[0].params.x: expected a non-negative integer");
  EXPECT_EQ(only_error(t + "    params: {syr_x: 1}\n"),
            "syrup.yaml:8: tenants[0].policies[0].params.syr_x: parameter names starting with syr_ are reserved");
  EXPECT_EQ(only_error(t + "    params: {a-b: 1}\n"), "syrup.yaml:8: tenants[0].policies[0].params.a-b: parameter names are C identifiers");
  EXPECT_EQ(only_error(t + "    params: [1]\n"),
            "syrup.yaml:8: tenants[0].policies[0].params: expected a mapping of parameter names to non-negative integers");
  EXPECT_EQ(only_error(t + "    persist: maybe\n"), "syrup.yaml:8: tenants[0].policies[0].persist: expected true or false");
  // A policy that needs a process follows it; persisting past it is refused.
  EXPECT_EQ(only_error(t + "    persist: true\n"),
            "syrup.yaml:8: tenants[0].policies[0].persist: persist: true is not allowed for the thread hook: its "
            "policy follows the process (removed when it exits, deployed again on the new process by the next "
            "reload); a persisting thread policy would hold on to the exited process's threads");
  const std::string ss = kPolicyHead + "  - hook: socket-select\n    policy: a.c\n    pid: 1\n    port: 9\n";
  EXPECT_NE(only_error(ss + "    persist: yes\n").find("syrup.yaml:9: tenants[0].policies[0].persist: persist: true is "
                                                        "not allowed for the socket-select hook"),
            std::string::npos);
  EXPECT_EQ(load(ss + "    persist: false\n").r, 0);
  const std::string x = kPolicyHead + "  - hook: xdp\n    policy: a.c\n    ifname: eth0\n    port: 9\n";
  Loaded xp = load(x);
  ASSERT_EQ(xp.r, 0) << testing::PrintToString(xp.errs);
  EXPECT_EQ(xp.cfg.tenants[0].policies[0].request["persist"], true) << "xdp persists by default";
  EXPECT_EQ(load(x + "    persist: false\n").cfg.tenants[0].policies[0].request["persist"], false);
  Loaded big = load(t + "    params: {x: 18446744073709551615}\n");
  ASSERT_EQ(big.r, 0);
  EXPECT_EQ(big.cfg.tenants[0].policies[0].request["params"]["x"].get<uint64_t>(), UINT64_MAX);
  EXPECT_EQ(only_error(t + "    params: {x: 18446744073709551616}\n"),
            "syrup.yaml:8: tenants[0].policies[0].params.x: expected a non-negative integer");
}

TEST(ConfigErrors, PolicyNamesAndIdentities) {
  EXPECT_EQ(only_error(kPolicyHead + "  - {hook: thread, policy: a.c, pid: 1}\n  - {hook: thread, policy: a.c, pid: 2}\n"),
            "syrup.yaml:6: tenants[0].policies[1].name: duplicate policy name 'a.c' in tenant 'kv' (first at line 5); "
            "set name: to tell them apart");
  Loaded ok = load(kPolicyHead + "  - {hook: thread, policy: a.c, pid: 1}\n  - {name: a2, hook: thread, policy: a.c, pid: 2}\n");
  ASSERT_EQ(ok.r, 0) << testing::PrintToString(ok.errs);
  EXPECT_EQ(ok.cfg.tenants[0].policies[1].identity, "kv/a2");
  EXPECT_EQ(only_error(kPolicyHead + "  - {name: 'x y', hook: thread, policy: a.c, pid: 1}\n"),
            "syrup.yaml:5: tenants[0].policies[0].name: policy name 'x y' has a character outside [A-Za-z0-9_.-]");
  FakeFiles f;
  f.files["/etc/syrup/my policy.c"] = "int p;\n";
  EXPECT_EQ(only_error(kPolicyHead + "  - {hook: thread, policy: my policy.c, pid: 1}\n", f),
            "syrup.yaml:5: tenants[0].policies[0].policy: policy name 'my policy.c' has a character outside "
            "[A-Za-z0-9_.-] (the file's name is the default; set name:)");
}

TEST(ConfigErrors, SameTargetTwice) {
  EXPECT_EQ(only_error("tenants:\n"
                       "- name: a\n  uid: 1\n  policies: [{hook: xdp, policy: a.c, ifname: eth0, ports: [1, 2]}]\n"
                       "- name: b\n  uid: 2\n  policies: [{hook: xdp, policy: b.c, ifname: eth0, port: 2}]\n"),
            "syrup.yaml:7: tenants[1].policies[0]: same target as tenants[0].policies[0] (line 4): xdp udp port 2 on "
            "eth0; a target has at most one policy");
  // Other interface, protocol or ports: no conflict.
  EXPECT_EQ(load("tenants:\n"
                 "- name: a\n  uid: 1\n  policies: [{hook: xdp, policy: a.c, ifname: eth0, ports: [1, 2]}]\n"
                 "- name: b\n  uid: 2\n  policies: [{hook: xdp, policy: b.c, ifname: eth1, port: 2},\n"
                 "    {hook: xdp, policy: a.c, ifname: eth0, port: 2, protocol: tcp},\n"
                 "    {name: c, hook: xdp, policy: a.c, ifname: eth0, port: 3}]\n").r,
            0);
  EXPECT_EQ(only_error(kPolicyHead + "  - {hook: socket-select, policy: a.c, process: srv, port: 9}\n"
                                     "  - {hook: socket-select, policy: b.c, process: srv, port: 9, protocol: udp}\n"),
            "syrup.yaml:6: tenants[0].policies[1]: same target as tenants[0].policies[0] (line 5): the socket group "
            "of process srv on port 9; a target has at most one policy");
  EXPECT_EQ(load(kPolicyHead + "  - {hook: socket-select, policy: a.c, process: srv, port: 9, protocol: tcp}\n"
                               "  - {hook: socket-select, policy: b.c, process: srv, port: 9, protocol: udp}\n").r,
            0);
  // The groups of other addresses are other targets; the same address, spelled otherwise,
  // is the same one.
  Loaded two = load(kPolicyHead + "  - {hook: socket-select, policy: a.c, process: srv, port: 9, address: 127.0.0.1}\n"
                                  "  - {hook: socket-select, policy: b.c, process: srv, port: 9, address: '::1'}\n");
  ASSERT_EQ(two.r, 0) << testing::PrintToString(two.errs);
  EXPECT_EQ(two.cfg.tenants[0].policies[1].request["address"], "::1");
  EXPECT_EQ(only_error(kPolicyHead + "  - {hook: socket-select, policy: a.c, process: srv, port: 9, address: '::1'}\n"
                                     "  - {hook: socket-select, policy: b.c, process: srv, port: 9, address: '0:0::1'}\n"),
            "syrup.yaml:6: tenants[0].policies[1]: same target as tenants[0].policies[0] (line 5): the socket group "
            "of process srv on port 9; a target has at most one policy");
  EXPECT_EQ(only_error(kPolicyHead + "  - {hook: socket-select, policy: a.c, process: srv, port: 9, address: localhost}\n"),
            "syrup.yaml:5: tenants[0].policies[0].address: expected an IPv4 or IPv6 address (e.g. 127.0.0.1, ::)");
  EXPECT_EQ(only_error(kPolicyHead + "  - {hook: thread, policy: a.c, pidfile: /run/x.pid}\n"
                                     "  - {hook: thread, policy: b.c, pidfile: /run/x.pid}\n"),
            "syrup.yaml:6: tenants[0].policies[1]: same target as tenants[0].policies[0] (line 5): the threads of "
            "pidfile /run/x.pid; a target has at most one policy");
}

TEST(ConfigErrors, ManyErrorsComeInFileOrder) {
  Loaded l = load("version: 3\ntenants:\n  - name: kv\n    uid: x\n  - name: kv\n    uid: 2\n    bogus: 1\n");
  EXPECT_EQ(l.r, -EINVAL);
  EXPECT_EQ(l.errs, (std::vector<std::string>{
                        "syrup.yaml:1: version: unsupported version 3 (this syrupd reads version 1)",
                        "syrup.yaml:4: tenants[0].uid: expected a uid (a non-negative integer below 4294967295)",
                        "syrup.yaml:5: tenants[1].name: duplicate tenant name 'kv' (first at line 3)",
                        "syrup.yaml:7: tenants[1].bogus: unknown key (allowed: name, uid, quotas, policies)",
                    }));
}

struct TempDir {
  TempDir() {
    char t[] = "/tmp/syrup-ops-test-XXXXXX";
    path = mkdtemp(t);
  }
  ~TempDir() { fs::remove_all(path); }
  void write(const std::string& rel, const std::string& text) {
    fs::create_directories(fs::path(path + "/" + rel).parent_path());
    std::ofstream(path + "/" + rel) << text;
  }
  std::string path;
};

TEST(Config, LoadsFromDiskRelativeToTheFile) {
  TempDir d;
  d.write("policies/rr.c", "int rr;\n");
  d.write("syrup.yaml", "tenants:\n- name: kv\n  uid: 7\n  policies:\n  - {hook: thread, policy: policies/rr.c, pid: 1}\n"
                        "  - {hook: thread, policy: policies/gone.c, pid: 2}\n");
  Config c;
  std::vector<Diagnostic> errs;
  EXPECT_EQ(config::load(d.path + "/syrup.yaml", c, errs), -EINVAL);
  ASSERT_EQ(errs.size(), 1u);
  EXPECT_EQ(errs[0].str(), d.path + "/syrup.yaml:6: tenants[0].policies[1].policy: cannot read " + d.path +
                               "/policies/gone.c: No such file or directory");
  EXPECT_EQ(errs[0].file, d.path + "/syrup.yaml");
  EXPECT_EQ(errs[0].line, 6);
  EXPECT_EQ(errs[0].key, "tenants[0].policies[1].policy");

  d.write("syrup.yaml", "tenants:\n- name: kv\n  uid: 7\n  policies:\n  - {hook: thread, policy: policies/rr.c, pid: 1}\n");
  errs.clear();
  ASSERT_EQ(config::load(d.path + "/syrup.yaml", c, errs), 0);
  EXPECT_EQ(c.tenants[0].policies[0].request["source"], "int rr;\n");
  EXPECT_EQ(c.tenants[0].policies[0].path, d.path + "/policies/rr.c");

  // A directory or a missing config file.
  d.write("dir/x", "");
  d.write("syrup.yaml", "tenants:\n- name: kv\n  uid: 7\n  policies:\n  - {hook: thread, policy: dir, pid: 1}\n");
  errs.clear();
  EXPECT_EQ(config::load(d.path + "/syrup.yaml", c, errs), -EINVAL);
  ASSERT_EQ(errs.size(), 1u);
  EXPECT_EQ(errs[0].message, "cannot read " + d.path + "/dir: not a regular file");
  errs.clear();
  EXPECT_EQ(config::load(d.path + "/nope.yaml", c, errs), -ENOENT);
  ASSERT_EQ(errs.size(), 1u);
  EXPECT_EQ(errs[0].str(), d.path + "/nope.yaml: cannot read the config file: No such file or directory");
}

// The planner.
Config config_of(const std::string& yaml) {
  Loaded l = load(yaml);
  EXPECT_EQ(l.r, 0) << testing::PrintToString(l.errs);
  return l.cfg;
}

TEST(Planner, FirstApplyDeploysEverything) {
  Config c = config_of(kValid);
  config::Plan p = config::plan(c, {});
  ASSERT_EQ(p.to_deploy.size(), 3u);
  EXPECT_EQ(p.to_deploy[0].entry.identity, "kv/xdp_classify.c");
  EXPECT_EQ(p.to_deploy[0].replaces, 0);
  EXPECT_EQ(p.to_deploy[2].entry.identity, "batch/fifo");
  EXPECT_TRUE(p.to_remove.empty());
  EXPECT_TRUE(p.unchanged.empty());
  EXPECT_FALSE(p.empty());
}

TEST(Planner, OnlyWhatChanged) {
  Config c = config_of(kValid);
  std::vector<config::Applied> cur;
  int id = 10;
  for (auto* e : c.entries()) cur.push_back({e->identity, e->hash, id++});
  config::Plan same = config::plan(c, cur);
  EXPECT_TRUE(same.empty());
  EXPECT_EQ(same.unchanged.size(), 3u);

  // kv/a.c changes port, batch/fifo goes away, kv/new.c comes.
  std::string y = kValid;
  y.replace(y.find("port: 9000\n"), 11, "port: 9001\n");
  y.replace(y.find("  - name: batch"), std::string::npos, "  - name: idle\n    uid: 1002\n");
  y += "    policies: [{name: new.c, hook: thread, policy: b.c, pid: 4}]\n";
  Config c2 = config_of(y);
  config::Plan p = config::plan(c2, cur);
  ASSERT_EQ(p.to_deploy.size(), 2u);
  EXPECT_EQ(p.to_deploy[0].entry.identity, "kv/a.c");
  EXPECT_EQ(p.to_deploy[0].replaces, 11);
  EXPECT_EQ(p.to_deploy[0].entry.request["port"], 9001);
  EXPECT_EQ(p.to_deploy[1].entry.identity, "idle/new.c");
  EXPECT_EQ(p.to_deploy[1].replaces, 0);
  ASSERT_EQ(p.to_remove.size(), 1u);
  EXPECT_EQ(p.to_remove[0], (config::Applied{"batch/fifo", cur[2].hash, 12}));
  ASSERT_EQ(p.unchanged.size(), 1u);
  EXPECT_EQ(p.unchanged[0].identity, "kv/xdp_classify.c");
}

TEST(Planner, DeadPoliciesComeBackAndDuplicatesGo) {
  Config c = config_of(kValid);
  auto e = c.entries();
  // kv/a.c died (not in current); xdp is applied twice.
  std::vector<config::Applied> cur = {{e[0]->identity, e[0]->hash, 1}, {e[0]->identity, e[0]->hash, 2},
                                      {e[2]->identity, e[2]->hash, 3}};
  config::Plan p = config::plan(c, cur);
  ASSERT_EQ(p.to_deploy.size(), 1u);
  EXPECT_EQ(p.to_deploy[0].entry.identity, "kv/a.c");
  ASSERT_EQ(p.to_remove.size(), 1u);
  EXPECT_EQ(p.to_remove[0].policy_id, 2);
  EXPECT_EQ(p.unchanged.size(), 2u);
  // An empty config removes everything.
  config::Plan none = config::plan(Config{}, cur);
  EXPECT_EQ(none.to_remove.size(), 3u);
  EXPECT_TRUE(none.to_deploy.empty());
}

// The resolver, over a fake /proc.
struct FakeProc : TempDir {
  void process(pid_t pid, const std::string& comm, char state = 'S', uid_t uid = getuid()) {
    std::string d = std::to_string(pid);
    write(d + "/comm", comm + "\n");
    write(d + "/stat", d + " (" + comm + ") " + state + " 1 1 1\n");
    if (uid != getuid()) {
      EXPECT_EQ(chown((path + "/" + d).c_str(), uid, static_cast<gid_t>(-1)), 0);
    }
  }
};

TEST(Resolve, ByNamePidAndPidfile) {
  FakeProc p;
  uid_t me = getuid();
  p.process(100, "rocksdb_server");
  p.process(101, "nginx");
  p.process(102, "nginx");
  p.process(103, "zombie", 'Z');
  p.write("self/comm", "rocksdb_server\n");  // not a pid: ignored
  p.write("run/kv.pid", "100\n");
  p.write("run/bad.pid", "abc\n");
  config::ProcessSelector s;
  pid_t pid = 0;
  std::string err;

  s.kind = config::ProcessSelector::Kind::kProcess;
  s.process = "rocksdb_server";
  ASSERT_EQ(config::resolve_pid(s, me, pid, err, p.path), 0) << err;
  EXPECT_EQ(pid, 100);
  s.process = "nginx";
  EXPECT_EQ(config::resolve_pid(s, me, pid, err, p.path), -EEXIST);
  EXPECT_EQ(err, "2 processes are named 'nginx' (pids 101 102); name one with pid or pidfile");
  s.process = "zombie";
  EXPECT_EQ(config::resolve_pid(s, me, pid, err, p.path), -ESRCH);
  EXPECT_EQ(err, "no process named 'zombie' of uid " + std::to_string(me));

  s = {};
  s.kind = config::ProcessSelector::Kind::kPid;
  s.pid = 101;
  ASSERT_EQ(config::resolve_pid(s, me, pid, err, p.path), 0);
  EXPECT_EQ(pid, 101);
  s.pid = 999;
  EXPECT_EQ(config::resolve_pid(s, me, pid, err, p.path), -ESRCH);
  EXPECT_EQ(err, "no process 999");

  s = {};
  s.kind = config::ProcessSelector::Kind::kPidfile;
  s.pidfile = p.path + "/run/kv.pid";
  ASSERT_EQ(config::resolve_pid(s, me, pid, err, p.path), 0);
  EXPECT_EQ(pid, 100);
  s.pidfile = p.path + "/run/bad.pid";
  EXPECT_EQ(config::resolve_pid(s, me, pid, err, p.path), -EINVAL);
  EXPECT_EQ(err, "pid file " + s.pidfile + " does not start with a pid");
  s.pidfile = p.path + "/run/none.pid";
  EXPECT_EQ(config::resolve_pid(s, me, pid, err, p.path), -ENOENT);

  // make_request adds the pid; uid 0 tenants match any process.
  config::PolicyEntry e;
  e.uid = 0;
  e.request = {{"op", "deploy"}};
  e.target.kind = config::ProcessSelector::Kind::kProcess;
  e.target.process = "rocksdb_server";
  json req;
  ASSERT_EQ(config::make_request(e, req, err, p.path), 0) << err;
  EXPECT_EQ(req, json::parse(R"({"op":"deploy","pid":100})"));
  e.target = {};
  ASSERT_EQ(config::make_request(e, req, err, p.path), 0);
  EXPECT_EQ(req, json::parse(R"({"op":"deploy"})"));
}

TEST(Resolve, OnlyTheTenantsProcesses) {
  if (getuid() != 0) GTEST_SKIP() << "needs root to chown the fake /proc entries";
  FakeProc p;
  p.process(200, "srv", 'S', 4242);
  p.process(201, "srv", 'S', 4243);
  config::ProcessSelector s;
  s.kind = config::ProcessSelector::Kind::kProcess;
  s.process = "srv";
  pid_t pid = 0;
  std::string err;
  ASSERT_EQ(config::resolve_pid(s, 4243, pid, err, p.path), 0) << err;
  EXPECT_EQ(pid, 201);
  EXPECT_EQ(config::resolve_pid(s, 4244, pid, err, p.path), -ESRCH);
  EXPECT_EQ(err, "no process named 'srv' of uid 4244 (2 of other users)");
  s = {};
  s.kind = config::ProcessSelector::Kind::kPid;
  s.pid = 200;
  EXPECT_EQ(config::resolve_pid(s, 4243, pid, err, p.path), -EPERM);
  EXPECT_EQ(err, "process 200 belongs to uid 4242, not 4243");
}

TEST(Resolve, Groups) {
  gid_t g = 1;
  std::string err;
  ASSERT_EQ(config::resolve_group("0", g, err), 0);
  EXPECT_EQ(g, 0u);
  ASSERT_EQ(config::resolve_group("root", g, err), 0);
  EXPECT_EQ(g, 0u);
  EXPECT_EQ(config::resolve_group("no-such-group-xyz", g, err), -ENOENT);
  EXPECT_EQ(err, "no group 'no-such-group-xyz'");
}

// Metrics.
metrics::Snapshot sample_snapshot() {
  metrics::Snapshot s;
  s.per_tenant = true;  // syrupd --metrics_per_tenant
  s.time_unix = 1700000000.5;
  s.start_time_unix = 1699999000;
  metrics::PolicySample p;
  p.id = 3;
  p.tenant = "kv";
  p.hook = "socket-select";
  p.policy = "rr.c";
  p.target = "udp/127.0.0.1:9000";
  p.executors = {5, 7};
  p.open_executors = 1;
  p.pass = 1;
  p.drop = 2;
  p.fallback = 3;
  p.run_cnt = 18;
  p.run_time_ns = 990;
  s.policies.push_back(p);
  metrics::TenantSample t;
  t.tenant = "kv";
  t.policies = 1;
  t.maps = 2;
  t.map_bytes = 4096;
  t.quotas = {{"policies", 8}, {"map_bytes", 16777216}};
  s.tenants.push_back(t);
  s.totals.deploys = 4;
  s.totals.removals = 3;
  s.totals.error("deploy", -EACCES);
  s.totals.error("deploy", EACCES);
  s.totals.error("deploy", "quota");
  s.totals.config_reloads = 3;
  s.totals.config_reload_failures = 1;
  s.totals.config_last_success_unix = 1700000000;
  s.compiles = {.queued_by_uid = {{1000, 2}},
                .running_by_uid = {{0, 1}},
                .ok = 5,
                .failed = 1,
                .wait_seconds = 1.5,
                .compile_seconds = 9.25,
                .cache_bytes = 123456,
                .cache_max_bytes = 268435456,
                .cache_evictions = 7};
  s.connections = {.by_uid = {{0, 1}, {1000, 3}, {1001, 2}, {1002, 2}},
                   .max_others = 128,
                   .max_per_user = 32};
  return s;
}

const char* kRendered = R"(# HELP syrupd_start_time_seconds Unix time syrupd started.
# TYPE syrupd_start_time_seconds gauge
syrupd_start_time_seconds 1699999000
# HELP syrup_metrics_snapshot_timestamp_seconds Unix time syrupd took the snapshot these metrics come from.
# TYPE syrup_metrics_snapshot_timestamp_seconds gauge
syrup_metrics_snapshot_timestamp_seconds 1700000000.5
# HELP syrup_policy_info A deployed policy (always 1), with its target.
# TYPE syrup_policy_info gauge
syrup_policy_info{tenant="kv",hook="socket-select",policy="rr.c",id="3",target="udp/127.0.0.1:9000"} 1
# HELP syrup_policy_executors Executors of a deployed policy.
# TYPE syrup_policy_executors gauge
syrup_policy_executors{tenant="kv",hook="socket-select",policy="rr.c",id="3"} 2
# HELP syrup_policy_open_executors Executors of a socket-select policy whose socket is still open (the kernel empties a closed one's slot).
# TYPE syrup_policy_open_executors gauge
syrup_policy_open_executors{tenant="kv",hook="socket-select",policy="rr.c",id="3"} 1
# HELP syrup_policy_decisions_total Decisions of a policy that sent an input to an executor, per executor.
# TYPE syrup_policy_decisions_total counter
syrup_policy_decisions_total{tenant="kv",hook="socket-select",policy="rr.c",id="3",executor="0"} 5
syrup_policy_decisions_total{tenant="kv",hook="socket-select",policy="rr.c",id="3",executor="1"} 7
# HELP syrup_policy_pass_total Decisions of a policy that left the input to the kernel (SYR_PASS).
# TYPE syrup_policy_pass_total counter
syrup_policy_pass_total{tenant="kv",hook="socket-select",policy="rr.c",id="3"} 1
# HELP syrup_policy_drop_total Decisions of a policy that dropped the input (SYR_DROP).
# TYPE syrup_policy_drop_total counter
syrup_policy_drop_total{tenant="kv",hook="socket-select",policy="rr.c",id="3"} 2
# HELP syrup_policy_fallback_total Decisions of a policy that named a missing executor; the kernel chose instead.
# TYPE syrup_policy_fallback_total counter
syrup_policy_fallback_total{tenant="kv",hook="socket-select",policy="rr.c",id="3"} 3
# HELP syrup_policy_runs_total Runs of the policy's program (kernel bpf_stats; 0 unless enabled).
# TYPE syrup_policy_runs_total counter
syrup_policy_runs_total{tenant="kv",hook="socket-select",policy="rr.c",id="3"} 18
# HELP syrup_policy_run_time_ns_total Nanoseconds spent in the policy's program (kernel bpf_stats; 0 unless enabled).
# TYPE syrup_policy_run_time_ns_total counter
syrup_policy_run_time_ns_total{tenant="kv",hook="socket-select",policy="rr.c",id="3"} 990
# HELP syrup_tenant_policies Policies deployed for a tenant (application).
# TYPE syrup_tenant_policies gauge
syrup_tenant_policies{tenant="kv"} 1
# HELP syrup_tenant_maps Application maps of a tenant.
# TYPE syrup_tenant_maps gauge
syrup_tenant_maps{tenant="kv"} 2
# HELP syrup_tenant_map_bytes Bytes of BPF map memory a tenant's policies use.
# TYPE syrup_tenant_map_bytes gauge
syrup_tenant_map_bytes{tenant="kv"} 4096
# HELP syrup_tenant_quota A tenant's limit on a resource (resources without a limit are left out).
# TYPE syrup_tenant_quota gauge
syrup_tenant_quota{tenant="kv",resource="map_bytes"} 16777216
syrup_tenant_quota{tenant="kv",resource="policies"} 8
# HELP syrup_deploys_total Policies deployed since syrupd started (replacements included).
# TYPE syrup_deploys_total counter
syrup_deploys_total 4
# HELP syrup_removals_total Policies removed since syrupd started (replacements included).
# TYPE syrup_removals_total counter
syrup_removals_total 3
# HELP syrup_errors_total Failed requests by operation and kind (an errno name, or quota).
# TYPE syrup_errors_total counter
syrup_errors_total{op="deploy",kind="EACCES"} 2
syrup_errors_total{op="deploy",kind="quota"} 1
# HELP syrup_config_reloads_total Loads of the --config file, by result.
# TYPE syrup_config_reloads_total counter
syrup_config_reloads_total{result="success"} 2
syrup_config_reloads_total{result="failure"} 1
# HELP syrup_config_last_reload_success_timestamp_seconds Unix time the --config file was last applied successfully (0: never).
# TYPE syrup_config_last_reload_success_timestamp_seconds gauge
syrup_config_last_reload_success_timestamp_seconds 1700000000
# HELP syrup_compiles_queued Policy compiles waiting for a compile worker.
# TYPE syrup_compiles_queued gauge
syrup_compiles_queued 2
# HELP syrup_compiles_running Policy compiles running on the compile workers.
# TYPE syrup_compiles_running gauge
syrup_compiles_running 1
# HELP syrup_user_compiles Policy compiles of one user (the caller's uid) queued for or running on the compile workers.
# TYPE syrup_user_compiles gauge
syrup_user_compiles{uid="1000",state="queued"} 2
syrup_user_compiles{uid="0",state="running"} 1
# HELP syrup_compiles_total Compiles the compile workers finished, by result.
# TYPE syrup_compiles_total counter
syrup_compiles_total{result="ok"} 5
syrup_compiles_total{result="error"} 1
# HELP syrup_compile_wait_seconds Time finished compiles waited for a compile worker.
# TYPE syrup_compile_wait_seconds summary
syrup_compile_wait_seconds_sum 1.5
syrup_compile_wait_seconds_count 6
# HELP syrup_compile_duration_seconds Time the compile workers spent on finished compiles.
# TYPE syrup_compile_duration_seconds summary
syrup_compile_duration_seconds_sum 9.25
syrup_compile_duration_seconds_count 6
# HELP syrup_compile_cache_bytes Bytes of the compiled policy objects in the compile cache.
# TYPE syrup_compile_cache_bytes gauge
syrup_compile_cache_bytes 123456
# HELP syrup_compile_cache_limit_bytes The compile cache's bound (--cache_max_bytes); over it the objects used least recently are removed.
# TYPE syrup_compile_cache_limit_bytes gauge
syrup_compile_cache_limit_bytes 268435456
# HELP syrup_compile_cache_evictions_total Objects removed from the compile cache to keep it within its bound.
# TYPE syrup_compile_cache_evictions_total counter
syrup_compile_cache_evictions_total 7
# HELP syrup_control_connections Open control connections, of root and of other users.
# TYPE syrup_control_connections gauge
syrup_control_connections{user="root"} 1
syrup_control_connections{user="other"} 7
# HELP syrup_control_connections_busiest_user The most open control connections one user other than root holds.
# TYPE syrup_control_connections_busiest_user gauge
syrup_control_connections_busiest_user 3
# HELP syrup_user_control_connections Open control connections of one user (by uid).
# TYPE syrup_user_control_connections gauge
syrup_user_control_connections{uid="0"} 1
syrup_user_control_connections{uid="1000"} 3
syrup_user_control_connections{uid="1001"} 2
syrup_user_control_connections{uid="1002"} 2
# HELP syrup_control_connections_limit Caps on the control connections of users other than root: all of them (--max_clients) and one user's (--max_clients_per_uid).
# TYPE syrup_control_connections_limit gauge
syrup_control_connections_limit{scope="all"} 128
syrup_control_connections_limit{scope="per_user"} 32
)";

TEST(Metrics, RendersThePrometheusTextFormat) { EXPECT_EQ(metrics::render(sample_snapshot()), kRendered); }

// Any local user can scrape the endpoint: without --metrics_per_tenant no series names an
// application, policy, target or uid.
TEST(Metrics, PerTenantSeriesOnlyWithTheFlag) {
  metrics::Snapshot s = sample_snapshot();
  s.per_tenant = false;
  std::string out = metrics::render(s);
  for (const char* secret : {"tenant=", "uid=", "policy=", "target=", "\"kv\"", "rr.c"})
    EXPECT_EQ(out.find(secret), std::string::npos) << secret << " in:\n" << out;
  EXPECT_NE(out.find("syrup_deploys_total"), std::string::npos) << out;
}

TEST(Metrics, EscapesLabelValues) {
  metrics::Snapshot s;
  s.per_tenant = true;
  metrics::PolicySample p;
  p.tenant = "a\"b\\c\nd";
  p.executors = {1};
  s.policies.push_back(p);
  std::string out = metrics::render(s);
  EXPECT_NE(out.find(R"(syrup_policy_executors{tenant="a\"b\\c\nd",hook="",policy="",id="0"} 1)"), std::string::npos) << out;
  // Every line is a comment or a sample; every family has HELP and TYPE before its samples
  // (a summary's are its name with _sum and _count).
  std::istringstream in(out);
  std::set<std::string> typed;
  for (std::string line; std::getline(in, line);) {
    if (line.starts_with("# TYPE ")) {
      size_t end = line.find(' ', 7);
      std::string name = line.substr(7, end - 7);
      if (line.substr(end + 1) == "summary") {
        typed.insert(name + "_sum");
        typed.insert(name + "_count");
      } else {
        typed.insert(name);
      }
      continue;
    }
    if (line.starts_with("# HELP ")) continue;
    std::string name = line.substr(0, line.find_first_of("{ "));
    EXPECT_TRUE(typed.count(name)) << line;
  }
}

TEST(Metrics, ErrnoNamesAndSamplesFromStats) {
  EXPECT_EQ(metrics::errno_name(EPERM), "EPERM");
  EXPECT_EQ(metrics::errno_name(-ENOENT), "ENOENT");
  EXPECT_EQ(metrics::errno_name(4000), "E4000");
  json stats = json::parse(R"({"id":7,"app":"kv","name":"sita.c","executors":[1,2,3],"pass":4,"drop":5,
                               "fallback":6,"decisions":21,"run_cnt":8,"run_time_ns":900,"open_executors":2})");
  metrics::PolicySample p = metrics::policy_sample(stats, "xdp", "eth0");
  EXPECT_EQ(p.id, 7);
  EXPECT_EQ(p.tenant, "kv");
  EXPECT_EQ(p.policy, "sita.c");
  EXPECT_EQ(p.hook, "xdp");
  EXPECT_EQ(p.target, "eth0");
  EXPECT_EQ(p.executors, (std::vector<uint64_t>{1, 2, 3}));
  EXPECT_EQ(p.pass, 4u);
  EXPECT_EQ(p.drop, 5u);
  EXPECT_EQ(p.fallback, 6u);
  EXPECT_EQ(p.run_cnt, 8u);
  EXPECT_EQ(p.run_time_ns, 900u);
  EXPECT_EQ(p.open_executors, 2);
  EXPECT_EQ(metrics::policy_sample(json::object(), "", "").executors.size(), 0u);
  EXPECT_EQ(metrics::policy_sample(json::object(), "", "").open_executors, -1) << "not a socket-select policy";
}

TEST(Metrics, PublishHandsOverSnapshots) {
  metrics::Metrics m;
  EXPECT_EQ(m.latest(), nullptr);
  EXPECT_NE(m.scrape().find("syrup_deploys_total 0\n"), std::string::npos);
  m.publish(sample_snapshot());
  EXPECT_EQ(m.scrape(), kRendered);
  metrics::Snapshot s;
  m.publish(s);
  EXPECT_GT(m.latest()->time_unix, 1.6e9) << "publish stamps the time";
}

std::set<int> blocked_signals_of_other_threads() {
  // SIGTERM blocked in every thread but this one?
  std::set<int> unblocked_tids;
  for (auto& t : fs::directory_iterator("/proc/self/task")) {
    int tid = std::stoi(t.path().filename());
    if (tid == gettid()) continue;
    std::ifstream in(t.path() / "status");
    for (std::string line; std::getline(in, line);)
      if (line.starts_with("SigBlk:")) {
        uint64_t mask = std::stoull(line.substr(7), nullptr, 16);
        if (!(mask & (1ull << (SIGTERM - 1))) || !(mask & (1ull << (SIGHUP - 1)))) unblocked_tids.insert(tid);
      }
  }
  return unblocked_tids;
}

TEST(MetricsHttp, ServesMetricsOnLoopbackWithAnEphemeralPort) {
  metrics::Metrics m;
  std::string err;
  ASSERT_EQ(m.start(0, err), 0) << err;
  ASSERT_GT(m.port(), 0);
  ASSERT_FALSE(m.addresses().empty());
  EXPECT_EQ(m.addresses()[0], "127.0.0.1:" + std::to_string(m.port()));
  EXPECT_TRUE(blocked_signals_of_other_threads().empty()) << "metrics threads must block the daemon's signals";
  m.publish(sample_snapshot());

  httplib::Client c("127.0.0.1", m.port());
  auto r = c.Get("/metrics");
  ASSERT_TRUE(r) << httplib::to_string(r.error());
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->get_header_value("Content-Type"), metrics::kContentType);
  EXPECT_EQ(r->body, kRendered);
  auto nf = c.Get("/nothing-here");
  ASSERT_TRUE(nf);
  EXPECT_EQ(nf->status, 404);

  // Only under a loopback name (no DNS rebinding from a browser).
  for (const char* host : {"localhost:1", "127.0.0.1", "[::1]:9464", "LOCALHOST"}) {
    auto ok = c.Get("/metrics", {{"Host", host}});
    ASSERT_TRUE(ok);
    EXPECT_EQ(ok->status, 200) << host;
  }
  for (const char* host : {"evil.example:9464", "127.0.0.1.evil.example", "[::2]:1"}) {
    auto no = c.Get("/metrics", {{"Host", host}});
    ASSERT_TRUE(no);
    EXPECT_EQ(no->status, 403) << host;
  }

  // A new snapshot shows in the next scrape.
  metrics::Snapshot s = sample_snapshot();
  s.totals.deploys = 99;
  m.publish(s);
  r = c.Get("/metrics");
  ASSERT_TRUE(r);
  EXPECT_NE(r->body.find("syrup_deploys_total 99\n"), std::string::npos);

  // ::1 too, when the host has IPv6.
  if (m.addresses().size() > 1) {
    EXPECT_EQ(m.addresses()[1], "[::1]:" + std::to_string(m.port()));
    httplib::Client c6("::1", m.port());
    auto r6 = c6.Get("/metrics");
    ASSERT_TRUE(r6) << httplib::to_string(r6.error());
    EXPECT_EQ(r6->status, 200);
  }

  // The same port twice: refused, and the first server keeps serving.
  metrics::Metrics other;
  EXPECT_LT(other.start(m.port(), err), 0);
  EXPECT_NE(err.find("cannot listen on 127.0.0.1:" + std::to_string(m.port())), std::string::npos) << err;
  int port = m.port();
  m.stop();
  httplib::Client after("127.0.0.1", port);
  after.set_connection_timeout(1);
  EXPECT_FALSE(after.Get("/metrics")) << "stopped";
}

size_t open_fds() {
  size_t n = 0;
  for ([[maybe_unused]] auto& e : fs::directory_iterator("/proc/self/fd")) n++;
  return n;
}

// Whether the server has closed `c` (reads 0 within `ms`), as opposed to keeping it open.
bool closed_by_server(int c, int ms) {
  pollfd p{c, POLLIN, 0};
  if (poll(&p, 1, ms) != 1) return false;
  char b;
  return recv(c, &b, 1, MSG_DONTWAIT) == 0;
}

// Clients that connect and say nothing hold at most the endpoint's 64 connections of
// syrupd's descriptors, not one each, and a scrape is served at once while they are
// there (before the epoll endpoint, 2 threads took them one at a time, each waiting out
// its 5 s read timeout, and the scrape waited in the listen backlog behind them).
TEST(MetricsHttp, IdleClientsNeitherTakeTheDaemonsDescriptorsNorDelayAScrape) {
  metrics::Metrics m;
  std::string err;
  ASSERT_EQ(m.start(0, err), 0) << err;
  m.publish(sample_snapshot());
  size_t before = open_fds();
  constexpr size_t kClients = 200;
  std::vector<int> clients;
  for (size_t i = 0; i < kClients; i++) {
    int c = tcp_connect(m.port(), true);  // EINPROGRESS: the kernel goes on
    ASSERT_GE(c, 0);
    clients.push_back(c);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // the endpoint accepts what it may
  size_t held = open_fds() - before - kClients;
  EXPECT_LE(held, 64u) << "the endpoint accepted a connection per idle client";
  auto t0 = std::chrono::steady_clock::now();
  std::string r = http_exchange(m.port(), "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(r.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << r;
  EXPECT_NE(r.find(kRendered), std::string::npos);
  EXPECT_LT(s, 1.0) << "the scrape waited behind the idle clients";
  for (int c : clients) close(c);
}

// The HTTP endpoint itself (http_endpoint.h), with a handler that echoes what it got.
struct EchoEndpoint {
  std::vector<http::Request> seen;
  http::Endpoint ep;
  uint16_t port = 0;
  explicit EchoEndpoint(http::Limits limits = {})
      : ep([this](const http::Request& r) {
          seen.push_back(r);
          return http::Response{r.path == "/missing" ? 404 : 200, "text/plain", r.method + " " + r.path + " " + r.host};
        }, limits) {
    int p = ep.add_listener("127.0.0.1", 0);
    EXPECT_GT(p, 0);
    port = static_cast<uint16_t>(p);
    EXPECT_EQ(ep.start(), 0);
  }
};

TEST(HttpEndpoint, AnswersEachRequestAndClosesTheConnection) {
  EchoEndpoint e;
  EXPECT_EQ(http_exchange(e.port, "GET /metrics?x=1 HTTP/1.1\r\nhOsT:  localhost:9 \r\nAccept: */*\r\n\r\n"),
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 24\r\nConnection: close\r\n\r\n"
            "GET /metrics localhost:9");
  // HEAD: the same head, no body.
  EXPECT_EQ(http_exchange(e.port, "HEAD / HTTP/1.0\r\n\r\n"),
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 7\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(http_exchange(e.port, "GET /missing HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 404 Not Found\r\n", 0), 0u);
  // Refused before the handler: other methods, a malformed line, too long a head.
  std::string post = http_exchange(e.port, "POST /metrics HTTP/1.1\r\nContent-Length: 2\r\n\r\nhi");
  EXPECT_EQ(post.rfind("HTTP/1.1 405 Method Not Allowed\r\n", 0), 0u) << post;
  EXPECT_NE(post.find("\r\nAllow: GET, HEAD\r\n"), std::string::npos) << post;
  EXPECT_EQ(http_exchange(e.port, "hello\r\n\r\n").rfind("HTTP/1.1 400 Bad Request\r\n", 0), 0u);
  EXPECT_EQ(http_exchange(e.port, "GET / SPDY/3\r\n\r\n").rfind("HTTP/1.1 400 Bad Request\r\n", 0), 0u);
  EXPECT_EQ(http_exchange(e.port, "GET http://x/ HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 400 Bad Request\r\n", 0), 0u);
  EXPECT_EQ(http_exchange(e.port, "GET ?a HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 400 Bad Request\r\n", 0), 0u);
  EXPECT_EQ(http_exchange(e.port, "GET / HTTP/1.1\r\nHost: a\rb\r\n\r\n").rfind("HTTP/1.1 400 Bad Request\r\n", 0), 0u);
  std::string big = http_exchange(e.port, "GET / HTTP/1.1\r\nX-Pad: " + std::string(10000, 'a') + "\r\n\r\n");
  EXPECT_EQ(big.rfind("HTTP/1.1 431 Request Header Fields Too Large\r\n", 0), 0u) << big.substr(0, 100);
  // Bare line ends, as typed into nc.
  EXPECT_NE(http_exchange(e.port, "GET /typed HTTP/1.0\n\n").find("\r\n\r\nGET /typed "), std::string::npos);
  // A request that arrives a few bytes at a time is answered when it is whole.
  int c = tcp_connect(e.port);
  ASSERT_GE(c, 0);
  for (const char* part : {"GE", "T /slow HT", "TP/1.1\r\n", "\r\n"}) {
    send(c, part, strlen(part), MSG_NOSIGNAL);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_NE(read_all(c).find("\r\n\r\nGET /slow "), std::string::npos);
  close(c);
  // Only the well-formed GET and HEAD requests reached the handler.
  e.ep.stop();  // its thread wrote `seen`
  ASSERT_EQ(e.seen.size(), 5u);
  EXPECT_EQ(e.seen[0].path, "/metrics");
  EXPECT_EQ(e.seen[1].method, "HEAD");
  EXPECT_EQ(e.seen[3].path, "/typed");
  EXPECT_EQ(e.seen[4].path, "/slow");
}

// A handler without an answer yet returns Later: it is asked again on wake(), or once
// more when the wait is over (then a second Later is answered 503), and the other
// connections are served meanwhile.
TEST(HttpEndpoint, ALaterAnswerIsAskedForAgainOnWakeOrWhenItsWaitIsOver) {
  std::atomic<bool> ready{false};
  std::atomic<int> calls{0};
  http::Endpoint ep([&](const http::Request& r) -> http::Reply {
    calls++;
    if (r.path == "/now") return http::Response{.body = "now"};
    if (r.path == "/never" || (!ready && !r.last_call)) return http::Later{std::chrono::milliseconds(300)};
    return http::Response{.body = r.last_call ? "late" : "woken"};
  });
  int port = ep.add_listener("127.0.0.1", 0);
  ASSERT_GT(port, 0);
  ASSERT_EQ(ep.start(), 0);
  auto get = [&](const std::string& path, const std::string& method = "GET") {
    return http_exchange(static_cast<uint16_t>(port), method + " " + path + " HTTP/1.1\r\nHost: x\r\n\r\n");
  };
  auto body = [](const std::string& r) { return r.substr(r.find("\r\n\r\n") + 4); };

  // Woken: answered by the call after wake(), not at the end of its wait.
  std::string woken;
  std::thread t([&] { woken = get("/wait"); });
  for (int i = 0; i < 300 && calls < 1; i++) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(calls.load(), 1);  // not ASSERT: `t` is joined below in any case
  EXPECT_EQ(body(get("/now")), "now") << "the parked request held up another";
  ready = true;
  ep.wake();
  t.join();
  EXPECT_EQ(woken.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << woken;
  EXPECT_EQ(body(woken), "woken");
  ready = false;

  // Nobody wakes it: asked once more when the wait is over.
  auto t0 = std::chrono::steady_clock::now();
  std::string late = get("/wait", "HEAD");
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(300));
  EXPECT_EQ(late.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << late;
  EXPECT_NE(late.find("Content-Length: 4\r\n"), std::string::npos) << late;
  EXPECT_EQ(body(late), "") << "a body for HEAD";

  // Still no answer then: 503.
  std::string never = get("/never");
  EXPECT_EQ(never.rfind("HTTP/1.1 503 Service Unavailable\r\n", 0), 0u) << never;
}

TEST(HttpEndpoint, ClosesAConnectionAtItsDeadlineWhateverTheClientDoes) {
  EchoEndpoint e(http::Limits{.deadline = std::chrono::milliseconds(300)});
  int silent = tcp_connect(e.port), partial = tcp_connect(e.port);
  ASSERT_GE(silent, 0);
  ASSERT_GE(partial, 0);
  send(partial, "GET / HTTP/1.1\r\n", 16, MSG_NOSIGNAL);
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(closed_by_server(silent, 100)) << "closed before its deadline";
  EXPECT_TRUE(closed_by_server(silent, 2000));
  EXPECT_TRUE(closed_by_server(partial, 2000));
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(s, 1.5);
  close(silent);
  close(partial);
  e.ep.stop();
  EXPECT_TRUE(e.seen.empty());
}

TEST(HttpEndpoint, TheOldestSilentConnectionMakesRoomForANewOne) {
  EchoEndpoint e(http::Limits{.max_connections = 4});
  std::vector<int> silent;
  for (int i = 0; i < 4; i++) {
    silent.push_back(tcp_connect(e.port));
    ASSERT_GE(silent.back(), 0);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // accepted in this order
  }
  // The fifth is served, in place of the first silent one; the other three stay.
  EXPECT_EQ(http_exchange(e.port, "GET /fifth HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 200 OK\r\n", 0), 0u);
  EXPECT_TRUE(closed_by_server(silent[0], 1000));
  for (int i = 1; i < 4; i++) EXPECT_FALSE(closed_by_server(silent[i], 100)) << "silent connection " << i;
  for (int c : silent) close(c);
}

TEST(MetricsHttp, ListensOnLoopbackOnly) {
  metrics::Metrics m;
  std::string err;
  ASSERT_EQ(m.start(0, err), 0) << err;
  // Every listening socket on the port is bound to a loopback address.
  int found = 0;
  for (const char* file : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(file);
    std::string line;
    std::getline(in, line);
    while (std::getline(in, line)) {
      std::istringstream ls(line);
      std::string sl, local, remote, st;
      ls >> sl >> local >> remote >> st;
      if (st != "0A") continue;  // LISTEN
      auto colon = local.rfind(':');
      if (std::stoul(local.substr(colon + 1), nullptr, 16) != m.port()) continue;
      std::string addr = local.substr(0, colon);
      found++;
      EXPECT_TRUE(addr == "0100007F" || addr == "00000000000000000000000001000000") << file << ": " << addr;
    }
  }
  EXPECT_GE(found, 1);
}

TEST(MetricsHttp, ScrapeAsksTheDaemonForAFreshSnapshot) {
  metrics::Metrics m;
  int efd = m.refresh_fd(std::chrono::milliseconds(0), std::chrono::milliseconds(2000));
  ASSERT_GE(efd, 0);
  std::string err;
  ASSERT_EQ(m.start(0, err), 0) << err;
  // The "daemon": waits for the request on the eventfd, then publishes.
  std::atomic<bool> stop{false};
  std::thread daemon([&] {
    uint64_t n = 0;
    while (!stop) {
      if (read(efd, &n, sizeof n) == sizeof n) {
        metrics::Snapshot s;
        s.totals.deploys = 42;
        m.publish(s);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  });
  httplib::Client c("127.0.0.1", m.port());
  auto r = c.Get("/metrics");
  stop = true;
  daemon.join();
  ASSERT_TRUE(r);
  EXPECT_NE(r->body.find("syrup_deploys_total 42\n"), std::string::npos) << r->body;

  // Nobody answers: the scrape gives what it has after the wait.
  metrics::Metrics m2;
  ASSERT_GE(m2.refresh_fd(std::chrono::milliseconds(0), std::chrono::milliseconds(50)), 0);
  ASSERT_EQ(m2.start(0, err), 0) << err;
  metrics::Snapshot s;
  s.totals.deploys = 7;
  m2.publish(s);
  auto t0 = std::chrono::steady_clock::now();
  std::string r2 = http_exchange(m2.port(), "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(50)) << "it did not wait";
  EXPECT_NE(r2.find("syrup_deploys_total 7\n"), std::string::npos) << r2;
}

// A scrape waiting for a fresh snapshot is parked: the endpoint answers other requests
// meanwhile, and one publish answers every waiting scrape. (Before, the scrape blocked
// the endpoint's one thread for up to its wait.)
TEST(MetricsHttp, AScrapeWaitingForAFreshSnapshotHoldsUpNoOtherRequest) {
  metrics::Metrics m;
  int efd = m.refresh_fd(std::chrono::milliseconds(0), std::chrono::milliseconds(4000));
  ASSERT_GE(efd, 0);
  std::string err;
  ASSERT_EQ(m.start(0, err), 0) << err;
  m.publish(sample_snapshot());
  const std::string get_metrics = "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
  auto asked = [&] {  // the scrape asked the daemon: the eventfd is readable
    pollfd p{efd, POLLIN, 0};
    uint64_t n;
    return poll(&p, 1, 3000) == 1 && read(efd, &n, sizeof n) == sizeof n;
  };
  std::atomic<int> done{0};
  std::string ra, rc;
  // No ASSERT while the client threads run: they are joined below in any case.
  std::thread a([&] { ra = http_exchange(m.port(), get_metrics); done++; });
  bool a_asked = asked();
  std::thread c([&] { rc = http_exchange(m.port(), get_metrics); done++; });
  bool c_asked = asked();

  std::string rb = http_exchange(m.port(), "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
  EXPECT_EQ(rb.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << rb;
  EXPECT_EQ(done.load(), 0) << "a request was answered only after the waiting scrapes";

  metrics::Snapshot s;
  s.totals.deploys = 42;
  m.publish(s);
  a.join();
  c.join();
  EXPECT_TRUE(a_asked) << "the first scrape did not ask for a fresh snapshot";
  EXPECT_TRUE(c_asked) << "the second scrape did not ask for a fresh snapshot";
  EXPECT_NE(ra.find("syrup_deploys_total 42\n"), std::string::npos) << ra;
  EXPECT_NE(rc.find("syrup_deploys_total 42\n"), std::string::npos) << rc;
}

}  // namespace
}  // namespace syrup
