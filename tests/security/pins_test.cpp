// Security suite, pins and what other tenants see (docs/security/pins.md): a tenant gets
// nothing through syrupd's pin tree that is not its own, and learns nothing of another
// tenant's policies, applications or files.
//
// Mallory (the attacker) and Alice (the victim) each run a long-lived process holding a
// socket group with a policy of theirs (scan_avoid.c, one application map scan_map), as
// applications do. Every assertion is on what Mallory observed: errno and text of her
// calls, what she could create, read or dump.
#include <bpf/bpf.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <regex>

#include "client.h"
#include "held_user.h"
#include "security.h"

namespace syrup::test::security {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

json result(int r) { return {{"r", r}, {"err", syr_last_error()}}; }

// A tenant's application process: as `uid`, holds a group of 2 UDP sockets with a
// scan_avoid policy of application `app` deployed on it, until destroyed.
class Tenant {
 public:
  Tenant(uid_t uid, const std::string& app)
      : held_(uid, [&] {
          group_ = std::make_unique<UdpGroup>(2);  // the child's: it lives while the child is held
          int id = deploy_on(*group_, "policies/scan_avoid.c", app.c_str());
          return json{{"id", id}, {"err", syr_last_error()}};
        }) {}
  int id() const { return held_.result().value("id", -1); }
  std::string err() const {
    const json& r = held_.result();
    return r.contains("err") ? r["err"].get<std::string>() : r.value("error", std::string());
  }

 private:
  std::unique_ptr<UdpGroup> group_;  // set in the child only
  HeldUser held_;
};

// `syrupctl map dump --app APP MAP` as the current user: exit status and output.
json dump(const std::string& app, const std::string& map) {
  std::string out;
  int r = run_cmd(build_bin("syrupctl") + " map dump --app " + app + " " + map, out);
  return {{"r", r}, {"err", out}};
}

// `text` with every `what` replaced by "X": the same words for two names.
std::string masked(std::string text, const std::string& what) {
  for (size_t at = text.find(what); !what.empty() && at != std::string::npos; at = text.find(what, at))
    text.replace(at, what.size(), "X");
  return text;
}

// The first element's bytes of a pinned array map, read as root (-1: unreadable).
int64_t first_value(const std::string& pin) {
  int fd = bpf_obj_get(pin.c_str());
  if (fd < 0) return -1;
  uint32_t k = 0;
  uint64_t v = 0;
  int r = bpf_map_lookup_elem(fd, &k, &v);
  close(fd);
  return r ? -1 : static_cast<int64_t>(v);
}

// Claimed ports in an XDP root's syr_xdp_ports (an array: (protocol, port) -> slot + 1,
// 0 unclaimed), read as root (-1: unreadable).
int claims(const std::string& pin) {
  int fd = bpf_obj_get(pin.c_str());
  if (fd < 0) return -1;
  bpf_map_info info{};
  uint32_t len = sizeof info;
  int n = 0;
  if (bpf_map_get_info_by_fd(fd, &info, &len) == 0)
    for (uint32_t k = 0; k < info.max_entries; k++) {
      uint32_t v = 0;
      if (bpf_map_lookup_elem(fd, &k, &v) == 0 && v) n++;
    }
  close(fd);
  return n;
}

class Pins : public ::testing::Test {
 protected:
  void SetUp() override {
    SYRUP_REQUIRE_ROOT();
    d_.start();
  }
  void TearDown() override {
    if (d_.pid() > 0) {
      EXPECT_EQ(d_.stop(), 0);
    }
  }
  std::string app_path(const std::string& app, const std::string& rest = "") const {
    return d_.bpffs_root() + "/apps/" + app + (rest.empty() ? "" : "/" + rest);
  }
  Daemon d_;
};

// The pin tree is root's: a tenant cannot make a link (or anything) in its own
// application's directory, so it cannot point syrupd at another tenant's map.
TEST_F(Pins, ATenantCannotCreateAnythingInItsPinDirectory) {
  Tenant alice(kAlice, "alice-app"), mallory(kMallory, "mallory-app");
  ASSERT_GT(alice.id(), 0) << alice.err();
  ASSERT_GT(mallory.id(), 0) << mallory.err();
  // Even with every directory above it open to her (as an older syrupd left <root>),
  // nothing of hers is writable.
  ASSERT_EQ(chmod(d_.bpffs_root().c_str(), 0755), 0);
  ASSERT_EQ(chmod((d_.bpffs_root() + "/apps").c_str(), 0755), 0);
  std::string victim = app_path("alice-app", "maps/scan_map");
  json j = as_user(kMallory, [&] {
    json out;
    for (std::string dir : {app_path("mallory-app"), app_path("mallory-app", "maps"),
                            app_path("mallory-app", "policies")}) {
      out[dir]["symlink"] = symlink(victim.c_str(), (dir + "/x").c_str()) == 0 ? 0 : errno;
      out[dir]["mkdir"] = mkdir((dir + "/y").c_str(), 0700) == 0 ? 0 : errno;
    }
    return out;
  });
  ASSERT_FALSE(j.contains("error")) << j.dump();
  for (auto& [dir, r] : j.items()) {
    EXPECT_EQ(r["symlink"], EACCES) << dir << ": " << j.dump();
    EXPECT_EQ(r["mkdir"], EACCES) << dir << ": " << j.dump();
  }
  struct stat st;
  ASSERT_EQ(lstat(app_path("mallory-app").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 0u);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
}

// A tree an older syrupd left (the application's directories the tenant's, links of the
// tenant's in them: to another tenant's map, to an XDP claims map, to a root-owned
// directory) is made root's at the next start without following any of the links: the
// links go, what they pointed to is as it was, and both tenants' policies are adopted.
TEST_F(Pins, ARestartRepairsAnOldTreeWithoutFollowingItsLinks) {
  Tenant alice(kAlice, "alice-app"), mallory(kMallory, "mallory-app");
  ASSERT_GT(alice.id(), 0) << alice.err();
  ASSERT_GT(mallory.id(), 0) << mallory.err();

  // Targets: Alice's map (a value written into it), the port claims of an XDP root
  // (syr_xdp_ports of an admin's XDP policy, which the restart adopts), and a root-owned
  // directory of mode 0755.
  std::string alice_map = app_path("alice-app", "maps/scan_map");
  {
    int fd = bpf_obj_get(alice_map.c_str());
    ASSERT_GE(fd, 0) << strerror(errno);
    uint32_t k = 0;
    uint64_t v = 4242;
    ASSERT_EQ(bpf_map_update_elem(fd, &k, &v, BPF_ANY), 0);
    close(fd);
  }
  TestNet net(240 + getpid() % 10);
  ASSERT_TRUE(net.ok());
  uint16_t port = 9391;
  syr_deploy_opts xo{.sz = sizeof xo, .app = "root-xdp", .ifname = net.host_if.c_str(), .ports = &port, .n_ports = 1};
  int xdp_id = syr_deploy_policy(source_path("tests/policies/xdp_count.c").c_str(), SYR_HOOK_XDP, &xo);
  ASSERT_GT(xdp_id, 0) << syr_last_error();
  struct Remove {
    int id;
    ~Remove() { syr_remove_policy(id); }
  } remove_xdp{xdp_id};
  std::string ports = d_.bpffs_root() + "/xdp/" + net.host_if + "/syr_xdp_ports";
  ASSERT_EQ(claims(ports), 1) << "the admin's claim of port 9391";
  TempDir rootdir;
  ASSERT_EQ(chmod(rootdir.path().c_str(), 0755), 0);

  // The old code's hand-over: <root> and apps/ open to all, Mallory's application
  // directory tree hers, mode 0700 (Daemon::secure_app_dir before this change).
  ASSERT_EQ(chmod(d_.bpffs_root().c_str(), 0755), 0);
  ASSERT_EQ(chmod((d_.bpffs_root() + "/apps").c_str(), 0755), 0);
  for (std::string p : {app_path("mallory-app"), app_path("mallory-app", "maps"), app_path("mallory-app", "policies"),
                        app_path("mallory-app", "policies/" + std::to_string(mallory.id()))}) {
    ASSERT_EQ(chown(p.c_str(), kMallory, kMallory), 0) << p;
    ASSERT_EQ(chmod(p.c_str(), 0700), 0) << p;
  }
  ASSERT_EQ(lchown(app_path("mallory-app", "maps/scan_map").c_str(), kMallory, kMallory), 0);
  // Mallory's links, made as Mallory.
  json made = as_user(kMallory, [&] {
    json out;
    out["map"] = symlink(alice_map.c_str(), app_path("mallory-app", "maps/x").c_str()) == 0 ? 0 : errno;
    out["ports"] = symlink(ports.c_str(), app_path("mallory-app", "maps/ports").c_str()) == 0 ? 0 : errno;
    out["dir"] = symlink(rootdir.path().c_str(), app_path("mallory-app", "policies/etc").c_str()) == 0 ? 0 : errno;
    out["junk"] = mkdir(app_path("mallory-app", "junk").c_str(), 0777) == 0 ? 0 : errno;
    return out;
  });
  ASSERT_EQ(made, (json{{"map", 0}, {"ports", 0}, {"dir", 0}, {"junk", 0}})) << made.dump();

  d_.crash();
  d_.start(d_.bpffs_root());

  struct stat st;
  for (std::string link : {"maps/x", "maps/ports", "policies/etc", "junk"})
    EXPECT_NE(lstat(app_path("mallory-app", link).c_str(), &st), 0) << link << " is still there";
  ASSERT_EQ(lstat(app_path("mallory-app").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 0u);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  ASSERT_EQ(lstat(app_path("mallory-app", "maps").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 0u);
  ASSERT_EQ(stat(rootdir.path().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0755u) << "syrupd changed the mode of a directory a link pointed to";
  EXPECT_EQ(st.st_uid, 0u);
  EXPECT_EQ(first_value(alice_map), 4242) << "Alice's map was touched";
  EXPECT_EQ(claims(ports), 1) << "the XDP root's port claims were touched";
  std::string log = d_.log();
  EXPECT_NE(log.find("removed " + app_path("mallory-app", "maps/x") + ": link"), std::string::npos) << log;
  EXPECT_NE(log.find("made " + app_path("mallory-app") + " root's (was uid " + std::to_string(kMallory)),
            std::string::npos)
      << log;

  // Both policies were adopted and Mallory's own map is still hers through syrupd.
  json j = as_user(kMallory, [&] {
    json out;
    out["own"] = result(syr_map_open_app("mallory-app", "scan_map"));
    out["x"] = result(syr_map_open_app("mallory-app", "x"));
    return out;
  });
  EXPECT_GE(j["own"]["r"].get<int>(), 0) << j.dump();
  EXPECT_EQ(j["x"]["r"], -ENOENT) << j.dump();
  json all = list_policies();
  ASSERT_TRUE(all.is_array()) << all.dump();
  EXPECT_EQ(all.size(), 3u) << "Alice's, Mallory's and the XDP policy: " << all.dump();
}

// A link or a second name (hard link) left in a tenant's maps directory is no map:
// map_open and map dump answer as for a missing map and hand out nothing.
TEST_F(Pins, MapOpenAndDumpOfALinkGiveNoMap) {
  Tenant alice(kAlice, "alice-app"), mallory(kMallory, "mallory-app");
  ASSERT_GT(alice.id(), 0) << alice.err();
  ASSERT_GT(mallory.id(), 0) << mallory.err();
  std::string alice_map = app_path("alice-app", "maps/scan_map");
  ASSERT_EQ(symlink(alice_map.c_str(), app_path("mallory-app", "maps/linked").c_str()), 0) << strerror(errno);
  ASSERT_EQ(link(alice_map.c_str(), app_path("mallory-app", "maps/second").c_str()), 0) << strerror(errno);
  json j = as_user(kMallory, [&] {
    json out;
    out["own"] = result(syr_map_open_app("mallory-app", "scan_map"));
    out["missing"] = result(syr_map_open_app("mallory-app", "nosuch"));
    out["link"] = result(syr_map_open_app("mallory-app", "linked"));
    out["hardlink"] = result(syr_map_open_app("mallory-app", "second"));
    out["dump_missing"] = dump("mallory-app", "nosuch");
    out["dump_link"] = dump("mallory-app", "linked");
    out["dump_hardlink"] = dump("mallory-app", "second");
    return out;
  });
  unlink(app_path("mallory-app", "maps/linked").c_str());
  unlink(app_path("mallory-app", "maps/second").c_str());
  ASSERT_FALSE(j.contains("error")) << j.dump();
  EXPECT_GE(j["own"]["r"].get<int>(), 0) << j.dump();
  EXPECT_EQ(j["missing"]["r"], -ENOENT) << j.dump();
  // The name asked for is quoted in the answer; the rest must be the same words.
  for (auto [name, what] : {std::pair{"'linked'", "link"}, std::pair{"'second'", "hardlink"}}) {
    EXPECT_EQ(j[what]["r"], -ENOENT) << j.dump();
    EXPECT_EQ(masked(j[what]["err"].get<std::string>(), name),
              masked(j["missing"]["err"].get<std::string>(), "'nosuch'"))
        << j.dump();
    EXPECT_EQ(j["dump_" + std::string(what)]["r"], j["dump_missing"]["r"]) << j.dump();
    EXPECT_EQ(masked(j["dump_" + std::string(what)]["err"].get<std::string>(), name),
              masked(j["dump_missing"]["err"].get<std::string>(), "'nosuch'"))
        << j.dump();
  }
}

// Everything syrupd writes is its own: the state file (every tenant's policies and
// parameters) 0600, nothing else it wrote readable by group or others.
TEST_F(Pins, TheStateFileAndSyrupdsOtherFilesAreNotReadableByOthers) {
  // Temporaries an older syrupd left world-readable are not reused: the next start, which
  // writes the state file and its journal whole, makes them anew.
  for (const std::string& tmp : {d_.state_file() + ".tmp", d_.state_file() + ".journal.tmp"}) {
    int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ASSERT_GE(fd, 0);
    fchmod(fd, 0644);
    close(fd);
  }
  d_.crash();
  d_.start(d_.bpffs_root());
  Tenant alice(kAlice, "alice-app");
  ASSERT_GT(alice.id(), 0) << alice.err();
  struct stat st;
  ASSERT_EQ(stat(d_.state_file().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  json j = as_user(kMallory, [&] {
    int fd = open(d_.state_file().c_str(), O_RDONLY);
    json out = {{"open", fd >= 0 ? 0 : errno}};
    if (fd >= 0) close(fd);
    return out;
  });
  EXPECT_EQ(j["open"], EACCES) << j.dump();
  // Every other file and directory syrupd made beside it and in its cache. The log is
  // the test harness's (syrupd's stderr); the socket is meant for everyone.
  fs::path dir = fs::path(d_.state_file()).parent_path();
  int seen = 0;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    std::string name = it->path().filename().string();
    if (name.starts_with("syrupd.log") || it->path() == d_.socket()) continue;
    if (lstat(it->path().c_str(), &st) != 0) continue;
    seen++;
    EXPECT_EQ(st.st_mode & 077, 0u) << it->path() << " has mode " << std::oct << (st.st_mode & 0777);
  }
  EXPECT_GE(seen, 3) << "the state file, the lock and the cache at least";
}

// Another user's policy and application are answered in the same words (and errno) as
// ones that do not exist: remove, stats, map_open, map dump; deploying to her
// application's name says nothing of her.
TEST_F(Pins, AnotherUsersPolicyAndApplicationLookLikeNoneAtAll) {
  Tenant alice(kAlice, "alice-app");
  ASSERT_GT(alice.id(), 0) << alice.err();
  int id = alice.id();
  const int none = 999999;
  json j = as_user(kMallory, [&] {
    json out;
    out["remove"] = result(syr_remove_policy(id));
    out["remove_none"] = result(syr_remove_policy(none));
    std::string o;
    out["stats"] = {{"r", run_cmd(build_bin("syrupctl") + " stats " + std::to_string(id), o)}, {"err", o}};
    out["stats_none"] = {{"r", run_cmd(build_bin("syrupctl") + " stats " + std::to_string(none), o)}, {"err", o}};
    out["map_open"] = result(syr_map_open_app("alice-app", "scan_map"));
    out["map_open_none"] = result(syr_map_open_app("nobody-app", "scan_map"));
    out["dump"] = dump("alice-app", "scan_map");
    out["dump_none"] = dump("nobody-app", "scan_map");
    UdpGroup g(2);
    out["deploy"] = result(deploy_on(g, "policies/pass.c", "alice-app"));
    return out;
  });
  ASSERT_FALSE(j.contains("error")) << j.dump();
  auto same = [&](const char* what, const std::string& mine, const std::string& theirs) {
    EXPECT_EQ(j[what]["r"], j[std::string(what) + "_none"]["r"]) << what << ": " << j.dump();
    EXPECT_EQ(masked(j[what]["err"].get<std::string>(), mine),
              masked(j[std::string(what) + "_none"]["err"].get<std::string>(), theirs))
        << what << ": " << j.dump();
  };
  same("remove", std::to_string(id), std::to_string(none));
  same("stats", std::to_string(id), std::to_string(none));
  same("map_open", "'alice-app'", "'nobody-app'");
  same("dump", "'alice-app'", "'nobody-app'");
  EXPECT_EQ(j["remove"]["r"], -ENOENT) << j.dump();
  EXPECT_LT(j["deploy"]["r"].get<int>(), 0) << j.dump();
  std::string deploy_err = j["deploy"]["err"];
  EXPECT_EQ(deploy_err.find(std::to_string(kAlice)), std::string::npos) << deploy_err;
  EXPECT_EQ(deploy_err.find("uid"), std::string::npos) << deploy_err;
  // And her policy is still there.
  json all = list_policies();
  ASSERT_TRUE(all.is_array());
  EXPECT_EQ(all.size(), 1u) << all.dump();
}

// The metrics endpoint (any local user can scrape it) names no tenant's application,
// policy, target or uid unless syrupd runs with --metrics_per_tenant.
TEST_F(Pins, MetricsNameNoTenantWithoutTheFlag) {
  const uint16_t port = static_cast<uint16_t>(20000 + (getpid() + 4111) % 20000);
  for (bool flag : {false, true}) {
    SCOPED_TRACE(flag ? "--metrics_per_tenant" : "default");
    EXPECT_EQ(d_.stop(), 0);
    std::vector<std::string> args = {"--metrics_port=" + std::to_string(port)};
    if (flag) args.push_back("--metrics_per_tenant");
    d_.start("", args);
    Tenant alice(kAlice, "alice-app");
    ASSERT_GT(alice.id(), 0) << alice.err();
    // Mallory holds a control connection while she scrapes.
    json j = as_user(kMallory, [&] {
      Client c;
      c.connect(d_.socket());
      return json{{"metrics", http_get(port, "/metrics")}};
    });
    std::string m = j.value("metrics", "");
    ASSERT_NE(m.find("syrup_deploys_total 1"), std::string::npos) << m;
    if (flag) {
      EXPECT_NE(m.find("tenant=\"alice-app\""), std::string::npos) << m;
      continue;
    }
    for (std::string secret : {std::string("alice-app"), std::string("scan_avoid"), std::string("tenant=\""),
                               std::string("uid=\""), "id=\"" + std::to_string(alice.id()) + "\"",
                               "uid=\"" + std::to_string(kMallory) + "\""})
      EXPECT_EQ(m.find(secret), std::string::npos) << secret << " in:\n" << m;
  }
}

}  // namespace
}  // namespace syrup::test::security
