// syrupd on Kubernetes (deploy/kubernetes/): the ConfigMap's update, as the kubelet makes
// it on a real directory (configmap_dir.h), applied by a real syrupd with --config_watch
// -- a policy changes, appears, disappears; a broken version keeps the running one and
// says so in the metrics and the status file -- and syrupd started as the DaemonSet
// starts it (a mount namespace of its own with the host's bpffs and /run/syrup bound
// in) serving a pod: a process in network and mount namespaces of its own, with
// /run/syrup mounted read-only, as an unprivileged uid.
#include <gtest/gtest.h>
#include <grp.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "configmap_dir.h"
#include "harness.h"
#include "http_client.h"
#include "syrup/syrup.h"

namespace syrup::test {
namespace {

using nlohmann::json;

constexpr uid_t kPodUid = 62005;  // the tenant's pods run as this uid
constexpr uid_t kMallory = 62001;

const char* kRoundRobin =
    "#include <syrup/policy.h>\nstatic __u32 next;\n"
    "SYR_POLICY(struct syr_input *in) { return __sync_fetch_and_add(&next, 1) % syr_num_executors; }\n";
const char* kFirst = "#include <syrup/policy.h>\nSYR_POLICY(struct syr_input *in) { return 0; }\n";

// A socket-select entry of tenant `cfgapp` (uid 0) on this process's group at `port`.
std::string entry(const std::string& name, const std::string& policy, int port, pid_t pid = getpid()) {
  return "      - name: " + name + "\n        hook: socket-select\n        policy: " + policy +
         "\n        pid: " + std::to_string(pid) + "\n        port: " + std::to_string(port) + "\n";
}
std::string yaml(const std::string& entries) {
  return "version: 1\ntenants:\n  - name: cfgapp\n    uid: 0\n    policies:\n" + entries;
}

std::map<std::string, int> ids_by_name() {
  std::map<std::string, int> m;
  json l = list_policies();
  if (l.is_array())
    for (auto& p : l) m[p["name"].get<std::string>()] = p["id"].get<int>();
  return m;
}

json status(const std::string& path) { return json::parse(read_text(path), nullptr, false); }

// The value of the sample `series` (name and labels, as rendered) in `metrics`, or -1.
double sample(const std::string& metrics, const std::string& series) {
  size_t at = metrics.find("\n" + series + " ");
  return at == std::string::npos ? -1 : std::stod(metrics.substr(at + series.size() + 2));
}

// A pid no process has: a child's, reaped.
pid_t gone_pid() {
  pid_t p = fork();
  if (p == 0) _exit(0);
  waitpid(p, nullptr, 0);
  return p;
}

TEST(ConfigWatch, KubeletConfigMapUpdatesApplyAndABrokenOneKeepsTheRunningVersion) {
  SYRUP_REQUIRE_ROOT();
  TempDir cm_dir, status_dir;
  ConfigMapDir cm(cm_dir.path());
  UdpGroup g1(2), g2(2);
  std::string st = status_dir.path() + "/status.json";
  ASSERT_NE(cm.publish({{"syrup.yaml", yaml(entry("rr", "rr.c", g1.port()))}, {"rr.c", kRoundRobin}}),
            std::chrono::steady_clock::time_point{});
  uint16_t mport = static_cast<uint16_t>(21000 + getpid() % 20000);
  Daemon d;
  d.start("", {"--config=" + cm.path("syrup.yaml"), "--config_watch", "--status_file=" + st,
               "--metrics_port=" + std::to_string(mport)});
  auto ids = ids_by_name();
  ASSERT_EQ(ids.size(), 1u) << d.log();
  UdpClient c1(g1.port());
  for (int i = 0; i < 20; i++) c1.send_request(1, i);
  EXPECT_EQ(g1.drain(), (std::vector<int>{10, 10}));

  // Only a policy file changes (the YAML is the same bytes): the swap of ..data applies
  // it, the entry's policy is replaced.
  cm.publish({{"syrup.yaml", yaml(entry("rr", "rr.c", g1.port()))}, {"rr.c", kFirst}});
  int rr = ids["rr"];
  ASSERT_GE(wait_for([&] { auto m = ids_by_name(); return m.count("rr") && m["rr"] != rr; }, 10000), 0) << d.log();
  for (int i = 0; i < 20; i++) c1.send_request(1, i);
  EXPECT_EQ(g1.drain(), (std::vector<int>{20, 0}));
  EXPECT_TRUE(log_says(d, cm.path("syrup.yaml") + " changed: applying it", 1, 1000)) << d.log();
  rr = ids_by_name()["rr"];

  // A new entry appears.
  cm.publish({{"syrup.yaml", yaml(entry("rr", "rr.c", g1.port()) + entry("second", "rr2.c", g2.port()))},
              {"rr.c", kFirst},
              {"rr2.c", kRoundRobin}});
  ASSERT_GE(wait_for([&] { return ids_by_name().size() == 2; }, 10000), 0) << d.log();
  EXPECT_EQ(ids_by_name()["rr"], rr) << "an unchanged entry must not be redeployed";
  json s = status(st);
  ASSERT_FALSE(s.is_discarded()) << read_text(st);
  // Each version is read once or, when the kubelet's steps straddle the debounce, twice.
  EXPECT_GE(s["generation"].get<int>(), 3);
  EXPECT_EQ(s["file"], "applied");
  EXPECT_EQ(s["applied"], 2);

  // A broken version: refused, the running one stays; the metrics and the status say so.
  cm.publish({{"syrup.yaml", yaml(entry("rr", "rr.c", g1.port()) + entry("second", "rr2.c", 70000))},
              {"rr.c", kFirst},
              {"rr2.c", kRoundRobin}});
  ASSERT_TRUE(log_says(d, "file change: " + cm.path("syrup.yaml") + " has errors; the running configuration stays",
                       1, 10000))
      << d.log();
  auto after = ids_by_name();
  EXPECT_EQ(after.size(), 2u);
  EXPECT_EQ(after["rr"], rr);
  std::string m = http_get(mport, "/metrics");
  EXPECT_GE(sample(m, "syrup_config_generation"), 4) << m;
  EXPECT_GE(sample(m, "syrup_config_file_errors"), 1) << m;
  EXPECT_EQ(sample(m, "syrup_config_applied_policies"), 2) << m;
  EXPECT_GE(sample(m, "syrup_config_reloads_total{result=\"failure\"}"), 1) << m;
  s = status(st);
  EXPECT_EQ(s["file"], "refused") << s.dump();
  ASSERT_FALSE(s["file_errors"].empty()) << s.dump();
  EXPECT_NE(s["file_errors"][0].get<std::string>().find("port"), std::string::npos) << s.dump();
  EXPECT_EQ(s["applied"], 2) << s.dump();

  // The first entry disappears; one naming a process that does not exist fails, waiting
  // for it: named in the status, counted by errno in the metrics (no tenant labels
  // without --metrics_per_tenant).
  cm.publish({{"syrup.yaml", yaml(entry("second", "rr2.c", g2.port()) + entry("ghost", "rr2.c", 9, gone_pid()))},
              {"rr2.c", kRoundRobin}});
  ASSERT_GE(wait_for([&] { auto v = ids_by_name(); return v.size() == 1 && v.count("second"); }, 10000), 0)
      << d.log();
  for (int i = 0; i < 20; i++) c1.send_request(1, i);
  auto counts = g1.drain();
  EXPECT_TRUE(counts == std::vector<int>({20, 0}) || counts == std::vector<int>({0, 20}))
      << "the kernel's hash sends one client to one socket";
  ASSERT_GE(wait_for([&] { return status(st).value("not_applied", 0) == 1; }, 5000), 0) << read_text(st);
  s = status(st);
  EXPECT_EQ(s["file"], "applied");
  EXPECT_EQ(s["applied"], 1);
  EXPECT_EQ(s["not_applied"], 1);
  json ghost;
  for (auto& p : s["policies"])
    if (p["name"] == "ghost") ghost = p;
  EXPECT_EQ(ghost.value("state", ""), "failed") << s.dump();
  EXPECT_EQ(ghost.value("kind", ""), "ESRCH") << s.dump();
  EXPECT_EQ(ghost.value("retried", false), true) << s.dump();
  m = http_get(mport, "/metrics");
  EXPECT_EQ(sample(m, "syrup_config_file_errors"), 0) << m;
  EXPECT_EQ(sample(m, "syrup_config_failed_policies{kind=\"ESRCH\"}"), 1) << m;
  EXPECT_EQ(m.find("syrup_config_policy_failed"), std::string::npos) << "tenant data without --metrics_per_tenant";
  EXPECT_GT(sample(m, "syrup_config_last_apply_timestamp_seconds"), 0) << m;

  // The status file is root's alone, written whole.
  struct stat sb;
  ASSERT_EQ(stat(st.c_str(), &sb), 0);
  EXPECT_EQ(sb.st_uid, 0u);
  EXPECT_EQ(sb.st_mode & 0777, 0600u);
  EXPECT_EQ(d.stop(), 0);
}

// The status file goes only into a directory that root alone may write: in a world-
// writable one (a tenant there could replace its name with a link) it is not written,
// and a link a tenant left there is not followed. /readyz and the metrics answer a
// tenant under a loopback name only.
TEST(ConfigWatch, ATenantCannotRedirectTheStatusFileOrReachTheEndpointByName) {
  SYRUP_REQUIRE_ROOT();
  TempDir cm_dir, open_dir, victim_dir;
  chmod(open_dir.path().c_str(), 01777);
  std::string victim = victim_dir.path() + "/victim";
  std::ofstream(victim) << "root's\n";
  chmod(victim_dir.path().c_str(), 0755);
  std::string st = open_dir.path() + "/status.json";
  json planted = as_user(kMallory, [&] {
    int a = symlink(victim.c_str(), st.c_str()), b = symlink(victim.c_str(), (st + ".tmp").c_str());
    return json{{"ok", a == 0 && b == 0}};
  });
  ASSERT_EQ(planted.value("ok", false), true) << planted.dump();
  ConfigMapDir cm(cm_dir.path());
  cm.publish({{"syrup.yaml", "version: 1\n"}});
  uint16_t mport = static_cast<uint16_t>(21000 + (getpid() + 7) % 20000);
  Daemon d;
  d.start("", {"--config=" + cm.path("syrup.yaml"), "--config_watch", "--status_file=" + st,
               "--metrics_port=" + std::to_string(mport)});
  EXPECT_TRUE(log_says(d, "its directory must be root's and writable by root alone", 1, 3000)) << d.log();
  EXPECT_EQ(read_text(victim), "root's\n");
  json got = as_user(kMallory, [&] {
    std::string ok = http_exchange(mport, "GET /readyz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
    std::string rebound = http_exchange(mport, "GET /readyz HTTP/1.1\r\nHost: evil.example\r\n\r\n");
    std::string ip = http_exchange(mport, "GET /metrics HTTP/1.1\r\nHost: 10.1.2.3\r\n\r\n");
    return json{{"ok", ok.substr(0, 15)}, {"rebound", rebound.substr(0, 15)}, {"ip", ip.substr(0, 15)}};
  });
  EXPECT_EQ(got.value("ok", ""), "HTTP/1.1 200 OK") << got.dump();
  EXPECT_EQ(got.value("rebound", ""), "HTTP/1.1 403 Fo") << got.dump();
  EXPECT_EQ(got.value("ip", ""), "HTTP/1.1 403 Fo") << "on loopback only loopback names" << got.dump();
  EXPECT_EQ(d.stop(), 0);
}

// syrupd as the DaemonSet runs it: in a mount namespace of its own (unshare, as a
// container runtime makes one), the host's bpffs and /run/syrup bound in (hostPath), the
// ConfigMap's directory bound in and watched; the host's pid and network namespaces
// (hostPID, hostNetwork). A pod -- its own network and mount namespaces, the host's
// /run/syrup mounted read-only, uid kPodUid, a tenant of the ConfigMap -- deploys on its
// sockets through the mounted socket, and cannot act for another tenant's application.
TEST(ConfigWatch, DaemonSetStyleSyrupdServesAPodThroughTheMountedSocket) {
  SYRUP_REQUIRE_ROOT();
  TempDir cm_dir;
  ConfigMapDir cm(cm_dir.path());
  UdpGroup host_group(2);
  auto config = [&](bool infra_policy) {
    return "version: 1\ntenants:\n  - name: infra\n    uid: 0\n    policies:\n" +
           (infra_policy ? entry("rr", "rr.c", host_group.port()) : std::string("      []\n")) +
           "  - name: web\n    uid: " + std::to_string(kPodUid) + "\n";
  };
  cm.publish({{"syrup.yaml", config(true)}, {"rr.c", kRoundRobin}});
  // The container: its own /run (a tmpfs) with the host's /run/syrup (the harness's
  // directory, where it puts the socket) and the ConfigMap bound in; the host's bpffs
  // bound over itself, as a hostPath mount of /sys/fs/bpf is.
  const std::string script =
      "set -e\n"
      "for a; do case \"$a\" in --socket=*) s=\"${a#--socket=}\";; esac; done\n"
      "host_run=$(dirname \"$s\")\n"
      "mount --bind /sys/fs/bpf /sys/fs/bpf\n"
      "mount -t tmpfs -o mode=0755 syrup-pod-run /run\n"
      "mkdir /run/syrup /run/config\n"
      "mount --bind \"$host_run\" /run/syrup\n"
      "mount --bind " + cm.dir() + " /run/config\n"
      "exec \"$@\" --socket=/run/syrup/syrupd.sock --config=/run/config/syrup.yaml --config_watch "
      "--status_file=/run/syrup/status.json --metrics_port=$SYRUP_POD_METRICS_PORT\n";
  uint16_t mport = static_cast<uint16_t>(21000 + (getpid() + 13) % 20000);
  setenv("SYRUP_POD_METRICS_PORT", std::to_string(mport).c_str(), 1);
  Daemon d;
  d.launcher = {"/usr/bin/unshare", "--mount", "--propagation", "private", "/bin/sh", "-c", script, "syrupd-pod"};
  d.start();
  unsetenv("SYRUP_POD_METRICS_PORT");
  std::string host_run = std::filesystem::path(d.socket()).parent_path().string();

  // Applied from the ConfigMap, ready, pinned in the host's bpffs, status in the host's
  // /run/syrup; syrupd's /run is not the host's.
  auto ids = ids_by_name();
  ASSERT_EQ(ids.size(), 1u) << d.log();
  EXPECT_NE(http_get(mport, "/readyz").find("200 OK"), std::string::npos);
  EXPECT_TRUE(std::filesystem::exists(d.bpffs_root() + "/apps/infra")) << "pins are not in the host's bpffs";
  json st = status(host_run + "/status.json");
  EXPECT_EQ(st.value("applied", 0), 1) << st.dump() << d.log();
  std::string mnt_syrupd = std::filesystem::read_symlink("/proc/" + std::to_string(d.pid()) + "/ns/mnt").string();
  EXPECT_NE(mnt_syrupd, std::filesystem::read_symlink("/proc/self/ns/mnt").string());

  std::string pod = in_child([&] {
    if (unshare(CLONE_NEWNS | CLONE_NEWNET) || mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) ||
        mount("syrup-app-run", "/run", "tmpfs", 0, "mode=0755") || mkdir("/run/syrup", 0755) ||
        mount(host_run.c_str(), "/run/syrup", nullptr, MS_BIND, nullptr) ||
        mount(nullptr, "/run/syrup", nullptr, MS_BIND | MS_REMOUNT | MS_RDONLY, nullptr) ||
        system("ip link set lo up") != 0)
      return json{{"error", std::string("cannot make the pod: ") + strerror(errno)}}.dump();
    setenv("SYRUP_SOCKET", "/run/syrup/syrupd.sock", 1);
    if (setgroups(0, nullptr) || setgid(kPodUid) || setuid(kPodUid)) return json{{"error", "setuid"}}.dump();
    json r;
    UdpGroup g(2);
    int id = deploy_socket_select("policies/round_robin.c", g.fds(), "web");
    r["deploy"] = id > 0 ? "ok" : syr_last_error();
    UdpClient c(g.port());
    for (int i = 0; i < 20; i++) c.send_request(1, i);
    r["counts"] = g.drain();
    int other = deploy_socket_select("policies/round_robin.c", g.fds(), "infra");
    r["other_app"] = other < 0 ? syr_last_error() : "deployed";
    int map = syr_map_open_app("infra", "syr_stats");
    r["other_map"] = map < 0 ? syr_last_error() : "opened";
    return r.dump();
  });
  json r = json::parse(pod, nullptr, false);
  ASSERT_FALSE(r.is_discarded()) << pod;
  EXPECT_EQ(r.value("deploy", ""), "ok") << pod << d.log();
  EXPECT_EQ(r["counts"], json({10, 10})) << pod;
  EXPECT_NE(r.value("other_app", ""), "deployed") << pod;
  EXPECT_NE(r.value("other_app", "").find("infra"), std::string::npos) << pod;
  EXPECT_NE(r.value("other_map", ""), "opened") << pod;

  // A ConfigMap update reaches syrupd through the bound directory.
  cm.publish({{"syrup.yaml", config(false)}, {"rr.c", kRoundRobin}});
  ASSERT_GE(wait_for([&] { return ids_by_name().empty(); }, 10000), 0) << d.log();
  EXPECT_EQ(d.stop(), 0);
}

}  // namespace
}  // namespace syrup::test
