// Unit tests of the --config file's modules (no kernel, no syrupd): the YAML parser and
// its diagnostics, the planner (what a reload deploys, keeps and removes) and the process
// resolver (name, pid, pid file, groups), on fake files and a fake /proc. syrupd applying
// a file end to end is tests/config_test.cpp.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "config.h"
#include "registry.h"

namespace syrup {
namespace {

namespace fs = std::filesystem;
using config::Config;
using config::Diagnostic;
using nlohmann::json;

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
            "params, persist, process, pid, pidfile, cgroup)");
  EXPECT_EQ(only_error("tenants:\n- name: kv\n  uid: 1\n  policies:\n  - hook: thread\n    policy: a.c\n    pid: 3\n    prio: 9\n"),
            "syrup.yaml:8: tenants[0].policies[0].prio: unknown key (allowed: name, hook, policy, params, persist, "
            "process, pid, pidfile, cgroup)");
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
  // The hook's parse() words (hooks/xdp/request.h), as syrupd and syrupctl say them.
  EXPECT_EQ(only_error(xdp + "    ports: [9000, 70000]\n"),
            "syrup.yaml:8: tenants[0].policies[0].ports: must be a list of ports, each an integer in 1..65535, got 70000");
  EXPECT_EQ(only_error(xdp + "    ports: 9000\n"),
            "syrup.yaml:8: tenants[0].policies[0].ports: must be a list of ports, each an integer in 1..65535, got 9000");
  EXPECT_EQ(only_error(xdp + "    ports: [9000, '9001']\n"),
            "syrup.yaml:8: tenants[0].policies[0].ports: must be a list of ports, each an integer in 1..65535, got \"9001\"");
  EXPECT_EQ(only_error(xdp + "    ports: [9000, 9000]\n"),
            "syrup.yaml:8: tenants[0].policies[0].ports: port 9000 is listed twice");
  EXPECT_EQ(only_error(xdp), "syrup.yaml:5: tenants[0].policies[0].ports: the xdp hook needs the ports it schedules: port or ports (or a cgroup: its processes' ports)");
  EXPECT_EQ(only_error(xdp + "    port: 0\n"), "syrup.yaml:8: tenants[0].policies[0].port: must be an integer in 1..65535, got 0");
  EXPECT_EQ(only_error(xdp + "    port: 1\n    protocol: sctp\n"),
            "syrup.yaml:9: tenants[0].policies[0].protocol: must be udp or tcp, got \"sctp\"");
  EXPECT_EQ(only_error(xdp + "    port: 1\n    cpus: [0, 1-0]\n"),
            "syrup.yaml:9: tenants[0].policies[0].cpus: must be a list of CPU numbers (0..4095) or ranges such as 0-3, got \"1-0\"");
  EXPECT_EQ(only_error(xdp + "    port: 1\n    cpus: [0-2, 2]\n"),
            "syrup.yaml:9: tenants[0].policies[0].cpus: CPU 2 is listed twice");
  EXPECT_EQ(only_error(kPolicyHead + "  - hook: xdp\n    policy: a.c\n    ifname: a/b\n    port: 1\n"),
            "syrup.yaml:7: tenants[0].policies[0].ifname: must be an interface name (1..15 characters, no '/', ':', spaces or "
            "control characters), got \"a/b\"");
  EXPECT_EQ(only_error(kPolicyHead + "  - hook: xdp\n    policy: a.c\n    port: 1\n"),
            "syrup.yaml:5: tenants[0].policies[0].ifname: required key is missing");

  const std::string ss = kPolicyHead + "  - hook: socket-select\n    policy: a.c\n";  // keys from line 7
  EXPECT_EQ(only_error(ss + "    pid: 1\n"), "syrup.yaml:5: tenants[0].policies[0].port: required key is missing");
  EXPECT_EQ(only_error(ss + "    port: 9000\n"),
            "syrup.yaml:5: tenants[0].policies[0].process: the socket-select hook needs the process it schedules: "
            "process, pid or pidfile (or a cgroup)");
  EXPECT_EQ(only_error(ss + "    port: 9000\n    pid: 3\n    process: x\n"),
            "syrup.yaml:9: tenants[0].policies[0].process: pid, process: give only one of process, pid and pidfile");
  EXPECT_EQ(only_error(ss + "    port: 9000\n    pid: 0\n"), "syrup.yaml:8: tenants[0].policies[0].pid: expected a pid (a positive integer)");
  EXPECT_EQ(only_error(ss + "    port: 9000\n    process: a_very_long_process_name\n"),
            "syrup.yaml:8: tenants[0].policies[0].process: expected a process name as in /proc/PID/comm (1..15 "
            "characters, no '/')");
  EXPECT_EQ(only_error(ss + "    port: 9000\n    pid: 3\n    ports: [1]\n"),
            "syrup.yaml:9: tenants[0].policies[0].ports: not used by the socket-select hook (its keys: name, hook, "
            "policy, params, persist, process, pid, pidfile, cgroup, port, protocol, address)");
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
            "syrup.yaml:5: tenants[0].policies[0].address: must be an IPv4 or IPv6 address as the sockets are bound (e.g. "
            "127.0.0.1, ::, 0.0.0.0), got \"localhost\"");
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

// `cgroup` names the target instead of a process (docs/operations.md): sent as the
// request's field, checked by the hook's parse(); entries of one cgroup meet.
TEST(Config, CgroupNamesTheTargetInsteadOfAProcess) {
  Loaded ok = load(kPolicyHead + "  - {hook: thread, policy: a.c, cgroup: /ctr.scope}\n"
                                 "  - {name: s, hook: socket-select, policy: a.c, cgroup: /ctr.scope, port: 53}\n"
                                 "  - {name: x, hook: xdp, policy: a.c, cgroup: /ctr.scope, ifname: eth0}\n");
  ASSERT_EQ(ok.r, 0) << testing::PrintToString(ok.errs);
  ASSERT_EQ(ok.cfg.tenants[0].policies.size(), 3u);
  for (auto& e : ok.cfg.tenants[0].policies) {
    EXPECT_EQ(e.request["cgroup"], "/ctr.scope") << e.request.dump();
    EXPECT_FALSE(e.request.contains("pid")) << e.request.dump();
  }
  EXPECT_EQ(only_error(kPolicyHead + "  - {hook: thread, policy: a.c, cgroup: /a/../b}\n"),
            "syrup.yaml:5: tenants[0].policies[0].cgroup: must be a cgroup v2 path as /proc/PID/cgroup's 0:: line "
            "prints it (e.g. /system.slice/nginx.service): '/' then names of letters, digits and . _ @ : + = , - "
            "(no empty, '.' or '..' name), got \"/a/../b\"");
  EXPECT_EQ(only_error(kPolicyHead + "  - {hook: thread, policy: a.c, cgroup: /a, pid: 3}\n"),
            "syrup.yaml:5: tenants[0].policies[0].cgroup: give either a process (pid) or a cgroup, not both");
  EXPECT_EQ(only_error(kPolicyHead + "  - {hook: thread, policy: a.c, cgroup: /a}\n"
                                     "  - {name: t2, hook: thread, policy: a.c, cgroup: /a}\n"),
            "syrup.yaml:6: tenants[0].policies[1]: same target as tenants[0].policies[0] (line 5): the threads of "
            "cgroup /a; a target has at most one policy");
}

}  // namespace
}  // namespace syrup
