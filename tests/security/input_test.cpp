// Class 8 of the security suite (docs/security/input.md): values are refused, never cut.
// An unprivileged user sends numbers out of range, names with control characters and
// oversize sources through the protocol client, libsyrup and syrupctl, and must get an
// error naming the field (syrupd, libsyrup) or the flag and its range (syrupctl, exit 2).
// Before the change port 4294967296+9100 was taken as 9100, a newline went into the log
// and `list`, and a 50 MB source ended in "Message too long" (exit 3, "unreachable").
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "client.h"
#include "security/security.h"

namespace syrup::test::security {
namespace {

using nlohmann::json;

constexpr uint64_t kBigPort = 4294967296ull + 9100;

class Input : public ::testing::Test {
 protected:
  void SetUp() override {
    SYRUP_REQUIRE_ROOT();
    d_.start();
  }
  void TearDown() override {
    if (d_.pid() > 0) EXPECT_EQ(d_.stop(), 0);
  }
  // One raw request to syrupd as the calling user: the response body, or {"transport": why}.
  static json raw(const json& req) {
    Client c;
    Message resp;
    if (c.connect(std::getenv("SYRUP_SOCKET")) || c.call(req, resp)) return {{"transport", c.error()}};
    return resp.body;
  }
  static json deploy_req(json extra) {
    json r = {{"op", "deploy"},
              {"hook", "socket-select"},
              {"app", "mallory"},
              {"source", "#include <syrup/policy.h>\nSYR_POLICY(struct syr_input *in) { return SYR_PASS; }\n"}};
    for (auto& [k, v] : extra.items()) r[k] = v;
    return r;
  }
  Daemon d_;
};

// The number 4294967296 + 9100 is port 9100 to a 32-bit cut: syrupd names the field and
// its range instead, for socket-select's port, xdp's ports and cpus, and every id.
TEST_F(Input, NumbersOutOfRangeAreRefusedNamingTheFieldNotCut) {
  json j = as_user(kMallory, [&] {
    json out;
    out["port"] = raw(deploy_req({{"pid", getpid()}, {"port", kBigPort}}));
    out["xdp_ports"] = raw(deploy_req({{"hook", "xdp"}, {"ifname", "lo"}, {"ports", {kBigPort}}}));
    out["xdp_cpus"] = raw(deploy_req({{"hook", "xdp"}, {"ifname", "lo"}, {"port", 9100}, {"cpus", {4294967296ull}}}));
    out["pid"] = raw(deploy_req({{"hook", "thread"}, {"pid", 4294967296ull + getpid()}}));
    out["remove"] = raw({{"op", "remove"}, {"id", 4294967296ull + 1}});
    out["stats"] = raw({{"op", "stats"}, {"id", -1}});
    out["limit"] = raw({{"op", "map_dump"}, {"app", "mallory"}, {"map", "m"}, {"limit", -1}});
    out["param"] = raw(deploy_req({{"params", {{"k", -1}}}}));
    return out;
  });
  auto refused = [&](const char* k, const std::string& text) {
    EXPECT_EQ(j[k].value("errno", 0), EINVAL) << k << ": " << j[k].dump();
    EXPECT_NE(j[k].value("error", std::string()).find(text), std::string::npos) << k << ": " << j[k].dump();
  };
  refused("port", "port: must be an integer in 1..65535, got 4294976396");
  refused("xdp_ports", "ports: must be a list of ports, each an integer in 1..65535, got 4294976396");
  refused("xdp_cpus", "got 4294967296");
  refused("pid", "pid: must be an integer in 1..4194304, got 42949");
  refused("remove", "id must be an integer in 1..2147483647, got 4294967297");
  refused("stats", "id must be an integer in 1..2147483647, got -1");
  refused("limit", "limit must be an integer in 0..2147483647, got -1");
  refused("param", "parameter 'k' must be an integer in 0..18446744073709551615, got -1");
}

// A newline in a name would split syrupd's log lines and `syrupctl list`'s rows: every
// name is refused with the same checker, naming which name, quoting it escaped.
TEST_F(Input, NamesWithControlCharactersAreRefused) {
  json j = as_user(kMallory, [&] {
    json out;
    out["app"] = raw(deploy_req({{"app", "evil\nroot"}}));
    out["name"] = raw(deploy_req({{"name", "pass.c\ndeployed policy 1 (x) for app 'alice'"}}));
    out["source_name"] = raw(deploy_req({{"source_name", "a\x1b[2Jb.c"}}));
    out["param"] = raw(deploy_req({{"params", {{"k\n", 1}}}}));
    out["ifname"] = raw(deploy_req({{"hook", "xdp"}, {"ifname", "lo\n"}, {"port", 9100}}));
    out["map"] = raw({{"op", "map_open"}, {"app", "mallory"}, {"map", "m\n"}});
    std::string src = "#include <syrup/policy.h>\nSYR_POLICY(struct syr_input *in) { return SYR_PASS; }\n";
    syr_deploy_opts o{.sz = sizeof o, .app = "mallory"};
    int r = syr_deploy_policy_source(src.data(), src.size(), "x\ny.c", SYR_HOOK_SOCKET_SELECT, &o);
    out["lib"] = {{"r", r}, {"err", syr_last_error()}};
    // run_cmd runs sh: the name is given with a real newline.
    std::string log;
    int rc = run_cmd(build_bin("syrupctl") + " deploy --pid 1 --port 9100 --app 'a\nb' /dev/null", log);
    out["ctl"] = {{"rc", rc}, {"out", log}};
    return out;
  });
  for (const char* k : {"app", "name", "source_name", "param", "ifname", "map"}) {
    EXPECT_EQ(j[k].value("errno", 0), EINVAL) << k << ": " << j[k].dump();
    // An interface name is the XDP hook's field: its parse() says what one may hold.
    const char* says = std::string(k) == "ifname" ? "ifname: must be an interface name (1..15 characters, no '/', "
                                                    "':', spaces or control characters), got \"lo\\n\""
                                                  : "has a control character";
    EXPECT_NE(j[k].value("error", std::string()).find(says), std::string::npos) << k << ": " << j[k].dump();
    EXPECT_EQ(j[k].value("error", std::string()).find('\n'), std::string::npos) << k << ": " << j[k].dump();
  }
  EXPECT_EQ(j["lib"]["r"], -EINVAL) << j["lib"].dump();
  EXPECT_NE(j["lib"]["err"].get<std::string>().find("policy name 'x\\x0ay.c' has a control character"),
            std::string::npos)
      << j["lib"].dump();
  EXPECT_EQ(j["ctl"]["rc"], 2) << j["ctl"].dump();
  EXPECT_NE(j["ctl"]["out"].get<std::string>().find("--app: application name 'a\\x0ab' has a control character"),
            std::string::npos)
      << j["ctl"].dump();
  // Nothing of it reached syrupd's log as a line of its own.
  EXPECT_EQ(d_.log().find("\nroot"), std::string::npos);
}

// syrupctl says which flag and which range, exit 2, before anything is sent.
TEST_F(Input, SyrupctlRefusesNumbersOutOfRangeNamingTheFlagAndRange) {
  std::string ctl = build_bin("syrupctl") + " --socket /nonexistent/syrupd.sock ";
  struct Case {
    std::string args, says;
  } cases[] = {
      {"deploy --hook xdp --ifname lo --port " + std::to_string(kBigPort) + " /dev/null",
       "--port: must be an integer in 1..65535, got 4294976396"},
      {"deploy --pid -5 --port 9100 /dev/null", "--pid: must be an integer in 1..4194304, got -5"},
      {"deploy --hook xdp --ifname lo --port 9100 --cpus 0,4294967296 /dev/null",
       "--cpus: must be a list of CPU numbers (0..4095) or ranges such as 0-3, got 4294967296"},
      {"deploy --pid 1 --port 9100 --params k=-1 /dev/null", "the value of 'k' must be an integer in 0.."},
      {"map dump --app a --limit -1 m", "--limit takes an integer in 0..2147483647, got '-1'"},
      {"remove 4294967297", "an integer in 1..2147483647"},
  };
  for (auto& c : cases) {
    json r = as_user(kMallory, [&] {
      std::string o;
      int rc = run_cmd(ctl + c.args, o);
      return json{{"rc", rc}, {"out", o}};
    });
    EXPECT_EQ(r.value("rc", -1), 2) << c.args << ": " << r.dump();
    EXPECT_NE(r.value("out", std::string()).find(c.says), std::string::npos) << c.args << ": " << r.dump();
  }
}

// A 50 MB source gets the size error from libsyrup and syrupctl without syrupd being
// reached (the socket they are given does not exist: reaching for it would say so), and a
// raw frame announcing 50 MB gets syrupd's own size error.
TEST_F(Input, AnOversizeSourceGetsASizeErrorBeforeSendingAndSyrupdNamesTheFrameSize) {
  TempDir t;
  std::string big(50u << 20, ' ');
  big.replace(0, 25, "#include <syrup/policy.h>");
  std::string path = t.path() + "/big.c";
  std::ofstream(path) << big;
  chmod(t.path().c_str(), 0755);
  chmod(path.c_str(), 0644);
  json j = as_user(kMallory, [&] {
    json out;
    setenv("SYRUP_SOCKET", "/nonexistent/syrupd.sock", 1);
    syr_deploy_opts o{.sz = sizeof o, .app = "mallory"};
    int r = syr_deploy_policy_source(big.data(), big.size(), "big.c", SYR_HOOK_SOCKET_SELECT, &o);
    out["lib"] = {{"r", r}, {"err", syr_last_error()}};
    std::string log;
    int rc = run_cmd(build_bin("syrupctl") + " deploy --pid " + std::to_string(getpid()) + " --port 9100 " + path,
                     log);
    out["ctl"] = {{"rc", rc}, {"out", log}};
    return out;
  });
  EXPECT_EQ(j["lib"]["r"], -EFBIG) << j.dump();
  EXPECT_NE(j["lib"]["err"].get<std::string>().find("policy source is 52428800 bytes; the limit is 4194304"),
            std::string::npos)
      << j.dump();
  EXPECT_EQ(j["ctl"]["rc"], 1) << j.dump();
  EXPECT_NE(j["ctl"]["out"].get<std::string>().find("policy source is 52428800 bytes; the limit is 1048576"),
            std::string::npos)
      << j.dump();
  EXPECT_EQ(j["ctl"]["out"].get<std::string>().find("cannot reach"), std::string::npos) << j.dump();

  json f = as_user(kMallory, [&] {
    UniqueFd s(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::snprintf(a.sun_path, sizeof a.sun_path, "%s", std::getenv("SYRUP_SOCKET"));
    if (connect(s.get(), reinterpret_cast<sockaddr*>(&a), sizeof a)) return json{{"error", "connect"}};
    uint32_t h[2] = {htole32(proto::kMagic), htole32(50u << 20)};
    if (send(s.get(), h, sizeof h, MSG_NOSIGNAL) != sizeof h) return json{{"error", "send"}};
    Message m;
    std::string why;
    if (int r = proto::recv_message(s.get(), m, &why, 5000)) return json{{"error", "recv " + std::to_string(r)}};
    return m.body;
  });
  EXPECT_EQ(f.value("errno", 0), EPROTO) << f.dump();
  EXPECT_NE(f.value("error", std::string()).find("frame of 52428800 bytes is larger than the limit of 4194304 bytes"),
            std::string::npos)
      << f.dump();
}

// A hook's fields are parsed by one function (hooks/<id>/request.h) wherever they come
// from: the protocol, a --config file and syrupctl's flags refuse the same bad value in
// the same words, each naming the key its own way (field, YAML path, flag).
TEST_F(Input, HookFieldsAreRefusedInTheSameWordsByEveryEntryPoint) {
  char tmpl[] = "/tmp/syrup-fields-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  std::string dir = tmpl;
  std::ofstream(dir + "/p.c") << "#include <syrup/policy.h>\nSYR_POLICY(struct syr_input *in) { return SYR_PASS; }\n";
  // The attacker reads the files (validate runs as it).
  ASSERT_EQ(chmod(tmpl, 0755), 0);
  std::string pid = std::to_string(getpid()), ctl = build_bin("syrupctl") + " ";
  struct Case {
    json fields;             // the protocol's hook fields, beside hook
    std::string flags;       // syrupctl deploy's
    std::string yaml;        // the policy entry's keys in a --config file
    std::string key, words;  // what every entry point says
  } cases[] = {
      {{{"hook", "socket-select"}, {"pid", getpid()}, {"port", 9100}, {"protocol", "sctp"}},
       "--pid " + pid + " --port 9100 --protocol sctp", "hook: socket-select\n    pid: 1\n    port: 9100\n    protocol: sctp\n",
       "protocol", "must be udp or tcp, got \"sctp\""},
      {{{"hook", "socket-select"}, {"pid", getpid()}, {"port", 9100}, {"address", "localhost"}},
       "--pid " + pid + " --port 9100 --address localhost",
       "hook: socket-select\n    pid: 1\n    port: 9100\n    address: localhost\n", "address",
       "must be an IPv4 or IPv6 address as the sockets are bound (e.g. 127.0.0.1, ::, 0.0.0.0), got \"localhost\""},
      {{{"hook", "xdp"}, {"ifname", "lo"}, {"port", 9100}, {"cpus", {4096}}}, "--hook xdp --ifname lo --port 9100 --cpus 4096",
       "hook: xdp\n    ifname: lo\n    port: 9100\n    cpus: [4096]\n", "cpus",
       "must be a list of CPU numbers (0..4095) or ranges such as 0-3, got 4096"},
      {{{"hook", "thread"}, {"pid", getpid()}, {"port", 9100}}, "--hook thread --pid " + pid + " --port 9100",
       "hook: thread\n    pid: 1\n    port: 9100\n", "port", ""},
  };
  for (auto& c : cases) {
    std::string entry = c.yaml;
    for (size_t at = 0; (at = entry.find("\n    ", at)) != std::string::npos; at += 9) entry.insert(at + 1, "    ");
    std::ofstream(dir + "/syrup.yaml") << "tenants:\n  - name: mallory\n    uid: " << kMallory
                                       << "\n    policies:\n      - policy: p.c\n        " << entry;
    json r = as_user(kMallory, [&] {
      json req = deploy_req(c.fields);
      std::string ctl_out, yaml_out;
      int ctl_rc = run_cmd(ctl + "deploy " + c.flags + " " + dir + "/p.c", ctl_out);
      int yaml_rc = run_cmd(ctl + "validate " + dir + "/syrup.yaml", yaml_out);
      return json{{"proto", raw(req)}, {"ctl_rc", ctl_rc}, {"ctl", ctl_out}, {"yaml_rc", yaml_rc}, {"yaml", yaml_out}};
    });
    std::string words = c.words;
    if (words.empty()) {  // the thread hook's own list of keys
      words = "is not a key of the thread hook (its keys: pid, cgroup)";
      // In a --config file a key of another hook is the loader's to name, with the file's keys.
      EXPECT_NE(r["yaml"].get<std::string>().find("port: not used by the thread hook"), std::string::npos) << r.dump();
    } else {
      EXPECT_NE(r["yaml"].get<std::string>().find("tenants[0].policies[0]." + c.key + ": " + words), std::string::npos)
          << r.dump();
    }
    EXPECT_EQ(r["yaml_rc"], 1) << r.dump();
    EXPECT_EQ(r["proto"].value("errno", 0), EINVAL) << r.dump();
    EXPECT_EQ(r["proto"].value("error", std::string()), c.key + ": " + words) << r.dump();
    EXPECT_EQ(r["ctl_rc"], 2) << r.dump();
    EXPECT_NE(r["ctl"].get<std::string>().find("--" + c.key + ": " + words), std::string::npos) << r.dump();
  }
  std::filesystem::remove_all(dir);
}

// Fields of any shape from an unprivileged caller: wrong types, numbers past 64 bits,
// nested objects, a list of 100000 ports. Each is one clear error; syrupd keeps serving.
TEST_F(Input, MalformedHookFieldsGetAClearErrorAndSyrupdKeepsServing) {
  json nested = json::array({1});
  for (int i = 0; i < 100; i++) nested = json::array({nested});
  json many = json::array();
  for (int i = 0; i < 100000; i++) many.push_back(1 + i % 60000);
  json object = json::object();
  object["a"]["b"] = nested;
  struct Case {
    json fields;
    std::string says;
  } cases[] = {
      {{{"hook", "xdp"}, {"ifname", "lo"}, {"port", 9100}, {"cpus", nested}},
       "cpus: must be a list of CPU numbers (0..4095) or ranges such as 0-3, got [[[[[[[[[[[[[["},
      {{{"hook", "xdp"}, {"ifname", "lo"}, {"ports", many}}, "ports: port 1 is listed twice"},
      {{{"hook", "xdp"}, {"ifname", "lo"}, {"ports", json::array({object})}},
       "ports: must be a list of ports, each an integer in 1..65535, got {\"a\":{\"b\":" + std::string(30, '[') + "..."},
      {{{"hook", "xdp"}, {"ifname", "lo"}, {"ports", {1e300}}},
       "ports: must be a list of ports, each an integer in 1..65535, got 1e+300"},
      {{{"hook", "xdp"}, {"ifname", "lo"}, {"port", 9100}, {"protocol", "udp"}, {"cpus", {"0-99999999999999999999"}}},
       "cpus: must be a list of CPU numbers (0..4095) or ranges such as 0-3, got \"0-99999999999999999999\""},
      {{{"hook", "socket-select"}, {"pid", getpid()}}, "port: required key is missing"},
      {{{"hook", "thread"}, {"pid", getpid()}, {"sched", {{"policy", nested}}}},
       "sched: is not a key of the thread hook (its keys: pid, cgroup)"},
  };
  for (auto& c : cases) {
    json r = as_user(kMallory, [&] { return json{{"deploy", raw(deploy_req(c.fields))}, {"ping", raw({{"op", "ping"}})}}; });
    EXPECT_EQ(r["deploy"].value("errno", 0), EINVAL) << r.dump().substr(0, 2000);
    EXPECT_EQ(r["deploy"].value("error", std::string()).substr(0, c.says.size()), c.says) << r.dump().substr(0, 2000);
    EXPECT_EQ(r["ping"].value("ok", false), true) << r.dump().substr(0, 2000);
  }
  EXPECT_GT(d_.pid(), 0);
  EXPECT_EQ(kill(d_.pid(), 0), 0) << "syrupd is gone";
}

}  // namespace
}  // namespace syrup::test::security
