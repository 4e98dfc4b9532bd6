// Multi-process servers (docs/servers.md): a policy deployed by the pid of one of a
// server's workers lives with the process that holds the server's sockets
// (hooks/socket_select/group_owner.h), so a reload that replaces the workers keeps it.
// A real nginx from Debian through `nginx -s reload`, a pre-forking server made here, and
// a tenant whose worker's parent is not its own. Each asserts which worker got which
// connection or datagram, what the deploy answered and what `syrupctl list` shows.
#include <fcntl.h>
#include <grp.h>
#include <sys/stat.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "harness.h"
#include "harness_socket_select.h"
#include "security/security.h"
#include "syrup/syrup.h"

namespace syrup::test {
namespace {

using nlohmann::json;

class Servers : public SocketSelectTest {};

// The processes whose parent is `parent`, from /proc.
std::set<pid_t> children_of(pid_t parent) {
  std::set<pid_t> out;
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    pid_t pid = std::atoi(e.path().filename().c_str());
    if (pid <= 0) continue;
    std::ifstream in(e.path() / "status");
    for (std::string line; std::getline(in, line);)
      if (line.rfind("PPid:", 0) == 0) {
        if (std::atoi(line.c_str() + 5) == parent) out.insert(pid);
        break;
      }
  }
  return out;
}

// A TCP port of 127.0.0.1 that no socket holds right now.
uint16_t free_tcp_port() {
  UniqueFd s(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{.sin_family = AF_INET, .sin_port = 0, .sin_addr = {htonl(INADDR_LOOPBACK)}, .sin_zero = {}};
  socklen_t len = sizeof a;
  if (bind(s.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) ||
      getsockname(s.get(), reinterpret_cast<sockaddr*>(&a), &len))
    return 0;
  return ntohs(a.sin_port);
}

// nginx from Debian, run as its package runs it (a root master, workers as nobody), with
// `workers` workers and one `listen ... reuseport` on 127.0.0.1:`port`, answering every
// request with the pid of the worker that accepted the connection. Its master is a child
// of this process, stopped (SIGTERM) and reaped by the destructor.
class Nginx {
 public:
  static constexpr const char* kBinary = "/usr/sbin/nginx";
  Nginx(const std::string& dir, uint16_t port, int workers) : dir_(dir), port_(port) {
    std::ofstream(dir + "/nginx.conf")
        << "pid " << dir << "/nginx.pid;\nerror_log " << dir << "/error.log;\nworker_processes " << workers
        << ";\nevents { worker_connections 64; }\nhttp {\n  access_log off;\n"
        << "  client_body_temp_path " << dir << "/body;\n  proxy_temp_path " << dir << "/proxy;\n"
        << "  fastcgi_temp_path " << dir << "/fastcgi;\n  uwsgi_temp_path " << dir << "/uwsgi;\n"
        << "  scgi_temp_path " << dir << "/scgi;\n"
        << "  server { listen 127.0.0.1:" << port << " reuseport; location / { return 200 \"$pid\\n\"; } }\n}\n";
    master_ = fork();
    if (master_ == 0) {
      std::string conf = dir + "/nginx.conf", err = dir + "/error.log";
      execl(kBinary, kBinary, "-c", conf.c_str(), "-p", dir.c_str(), "-e", err.c_str(), "-g", "daemon off;",
            static_cast<char*>(nullptr));
      _exit(127);
    }
  }
  ~Nginx() { stop(); }
  // Waits until `n` workers serve the port: "" or why not (nginx's error log).
  std::string ready(size_t n) {
    bool up = wait_for([&] { return workers().size() == n && worker_of(http_get(port_, "/")) > 0; }, 10000) >= 0;
    return up ? "" : "nginx did not come up with " + std::to_string(n) + " workers: " + read_text(dir_ + "/error.log");
  }
  pid_t master() const { return master_; }
  std::set<pid_t> workers() const { return children_of(master_); }
  // `nginx -s reload`, then waits until none of the workers before it is left and `n` new
  // ones serve: "" or why not.
  std::string reload(size_t n) {
    std::set<pid_t> before = workers();
    std::string out;
    if (run_cmd(std::string(kBinary) + " -c " + dir_ + "/nginx.conf -p " + dir_ + " -e " + dir_ + "/error.log -s reload",
                out) != 0)
      return "nginx -s reload failed: " + out;
    bool done = wait_for(
                    [&] {
                      std::set<pid_t> now = workers();
                      return now.size() == n && std::none_of(now.begin(), now.end(),
                                                             [&](pid_t p) { return before.count(p) > 0; });
                    },
                    10000) >= 0;
    return done ? ready(n) : "the workers were not replaced: " + read_text(dir_ + "/error.log");
  }
  void stop() {
    if (master_ <= 0) return;
    kill(master_, SIGTERM);
    waitpid(master_, nullptr, 0);
    master_ = -1;
  }
  // The worker pid a response names; 0 if it names none.
  static pid_t worker_of(const std::string& response) {
    size_t body = response.find("\r\n\r\n");
    return body == std::string::npos ? 0 : std::atoi(response.c_str() + body + 4);
  }
  // The workers that accepted `n` connections, one connection each, in order.
  std::vector<pid_t> serve(int n) const {
    std::vector<pid_t> by;
    for (int i = 0; i < n; i++) by.push_back(worker_of(http_get(port_, "/")));
    return by;
  }

 private:
  std::string dir_;
  uint16_t port_;
  pid_t master_ = -1;
};

// Round robin over the group's two listeners: connection i goes to listener i % 2, and so
// to one worker each (nginx's worker k accepts on the k-th reuseport socket only). The
// kernel's hash of 40 connections from ephemeral ports alternates by chance with
// probability 2^-39.
std::string alternates(const std::vector<pid_t>& by, const std::set<pid_t>& workers) {
  std::map<pid_t, int> count;
  for (size_t i = 0; i < by.size(); i++) {
    if (!workers.count(by[i])) return "connection " + std::to_string(i) + " was served by " + std::to_string(by[i]) + ", not a worker";
    if (i > 0 && by[i] == by[i - 1]) return "connections " + std::to_string(i - 1) + " and " + std::to_string(i) + " went to one worker";
    count[by[i]]++;
  }
  return count.size() == 2 ? "" : "not both workers served";
}

json policy_listed(int id) {
  for (auto& p : list_policies())
    if (p.value("id", 0) == id) return p;
  return nullptr;
}

TEST_F(Servers, NginxReloadKeepsThePolicyDeployedByAWorkersPid) {
  if (access(Nginx::kBinary, X_OK) != 0) GTEST_SKIP() << Nginx::kBinary << " is not installed (scripts/setup-deps.sh)";
  TempDir dir;
  uint16_t port = free_tcp_port();
  ASSERT_NE(port, 0);
  Nginx nginx(dir.path(), port, 2);
  ASSERT_EQ(nginx.ready(2), "");
  pid_t worker = *nginx.workers().begin();

  // By the worker's pid: anchored to the master, and syrupctl says so.
  std::string out;
  ASSERT_EQ(run_cmd(build_bin("syrupctl") + " deploy --hook socket-select --protocol tcp --app nginxtest --pid " +
                        std::to_string(worker) + " --port " + std::to_string(port) + " " +
                        source_path("policies/round_robin.c"),
                    out),
            0)
      << out;
  int id = 0;  // (the note goes to stderr, unbuffered: it may come first)
  size_t at = out.find("deployed policy ");
  ASSERT_TRUE(at != std::string::npos && std::sscanf(out.c_str() + at, "deployed policy %d", &id) == 1) << out;
  ids_.push_back(id);
  EXPECT_NE(out.find("with 2 executors"), std::string::npos) << out;
  EXPECT_NE(out.find("note: anchored to process " + std::to_string(nginx.master()) + ", not " + std::to_string(worker)),
            std::string::npos)
      << out;
  json p = policy_listed(id);
  ASSERT_TRUE(p.is_object()) << list_policies().dump();
  EXPECT_EQ(p.value("owner_pid", 0), nginx.master()) << p.dump();
  EXPECT_EQ(p.value("pid_given", 0), worker) << p.dump();
  EXPECT_EQ(alternates(nginx.serve(40), nginx.workers()), "");

  // The reload replaces both workers; the policy stays and schedules the new ones.
  ASSERT_EQ(nginx.reload(2), "");
  p = policy_listed(id);
  ASSERT_TRUE(p.is_object()) << "the reload ended the policy: " << list_policies().dump();
  EXPECT_EQ(p.value("open_executors", 0), 2) << p.dump();
  EXPECT_EQ(alternates(nginx.serve(40), nginx.workers()), "");

  // The master's exit ends it, and `list` says why.
  pid_t master = nginx.master();
  nginx.stop();
  ASSERT_GE(wait_for([&] { return policy_listed(id).is_null(); }, 10000), 0) << list_policies().dump();
  ASSERT_EQ(run_cmd(build_bin("syrupctl") + " list", out), 0) << out;
  EXPECT_NE(out.find("owner process " + std::to_string(master) + " exited"), std::string::npos) << out;
  EXPECT_NE(run_cmd(build_bin("syrupctl") + " stats " + std::to_string(id), out), 0);
  EXPECT_NE(out.find("was removed: owner process " + std::to_string(master) + " exited"), std::string::npos) << out;
}

// A forked worker that keeps only socket `keep` of the group this process holds (a server
// may close the others' after the fork), until the object dies (SIGKILL, reaped).
class Worker {
 public:
  Worker(const UdpGroup& g, int keep) {
    int ready[2];
    if (pipe2(ready, O_CLOEXEC)) return;
    pid_ = fork();
    if (pid_ == 0) {
      auto fds = g.fds();
      for (size_t i = 0; i < fds.size(); i++)
        if (static_cast<int>(i) != keep) close(fds[i]);
      (void)!write(ready[1], "x", 1);
      for (;;) pause();
    }
    close(ready[1]);
    char c;
    (void)!read(ready[0], &c, 1);  // its descriptors are what the deploy reads
    close(ready[0]);
  }
  ~Worker() { end(); }
  void end() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
};

// The owner of /proc/PID; -1 if there is no such process.
uid_t owner_of(pid_t pid) {
  struct stat st;
  return stat(("/proc/" + std::to_string(pid)).c_str(), &st) == 0 ? st.st_uid : static_cast<uid_t>(-1);
}

json deploy_json(pid_t pid, uint16_t port, const std::string& app, const std::string& policy) {
  std::string out;
  run_cmd(build_bin("syrupctl") + " --json deploy --hook socket-select --app " + app + " --pid " + std::to_string(pid) +
              " --port " + std::to_string(port) + " " + source_path(policy),
          out);
  json j = json::parse(out, nullptr, false);
  return j.is_discarded() ? json{{"error", out}} : j;
}

// The process holding the whole group is the anchor, and its sockets are the executors,
// though the worker named holds one: the same policy whichever pid was given. The worker's
// exit (a reload) leaves it running.
TEST_F(Servers, AWorkersPidAnchorsToTheProcessThatHoldsTheWholeGroup) {
  UdpGroup g(2);
  Worker w(g, 0);
  json d = deploy_json(w.pid(), g.port(), "prefork", "tests/policies/by_key.c");
  ASSERT_GT(d.value("id", 0), 0) << d.dump();
  ids_.push_back(d["id"].get<int>());
  EXPECT_EQ(d.value("anchor_pid", 0), getpid()) << d.dump();
  EXPECT_EQ(d.value("pid_given", 0), w.pid()) << d.dump();
  EXPECT_EQ(d.value("executors", 0), 2) << "the executors are the worker's, not the whole group's: " << d.dump();
  w.end();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ASSERT_TRUE(policy_listed(d["id"].get<int>()).is_object()) << "the worker's exit ended it: " << list_policies().dump();
  UdpClient c(g.port());
  for (uint32_t k = 0; k < 40; k++) c.send_request(1, k);
  EXPECT_EQ(g.drain(), (std::vector<int>{20, 20}));
}

// A parent that runs the same program but holds none of the sockets is not the owner (a
// server of this program's own, or HAProxy's master, which passes its listeners from the
// old worker to the new one): the policy stays with the process given, and the deploy says
// why it will end with it.
TEST_F(Servers, AParentWithoutTheSocketsIsNoAnchorAndTheDeploySaysWhy) {
  HeldChild server([] {
    static UdpGroup* own = new UdpGroup(2);  // the child's own, held until it exits
    return json{{"port", own->port()}};
  });
  ASSERT_GT(server.result().value("port", 0), 0) << server.result().dump();
  json d = deploy_json(server.pid(), server.result()["port"].get<uint16_t>(), "ownsrv", "policies/round_robin.c");
  ASSERT_GT(d.value("id", 0), 0) << d.dump();
  ids_.push_back(d["id"].get<int>());
  EXPECT_EQ(d.value("anchor_pid", 0), server.pid()) << d.dump();
  EXPECT_FALSE(d.contains("pid_given")) << d.dump();
  EXPECT_NE(d.value("anchor_note", "").find("runs the same program but holds none of its sockets"), std::string::npos)
      << d.dump();
}

// A tenant's worker whose parent, holding the same sockets, is root's: the policy is not
// tied to a process the tenant may not name; it ends with the worker, the deploy said so,
// and the tenant's `list` shows why it ended.
TEST_F(Servers, ATenantsPolicyIsNotAnchoredToAParentItMayNotName) {
  using security::kMallory;
  UdpGroup g(2);
  int go[2];
  ASSERT_EQ(pipe2(go, O_CLOEXEC), 0);
  pid_t worker = fork();
  if (worker == 0) {
    close(go[1]);
    if (setgroups(0, nullptr) || setresgid(kMallory, kMallory, kMallory) || setresuid(kMallory, kMallory, kMallory))
      _exit(1);
    prctl(PR_SET_DUMPABLE, 1);  // as nginx's workers do: /proc/PID is then the tenant's
    char c;
    (void)!read(go[0], &c, 1);
    _exit(0);
  }
  close(go[0]);
  ASSERT_GE(wait_for([&] { return owner_of(worker) == kMallory; }, 2000), 0);
  json d = as_user(kMallory, [&] { return deploy_json(worker, g.port(), "mallory", "policies/round_robin.c"); });
  close(go[1]);  // the worker exits once it reads EOF
  ASSERT_GT(d.value("id", 0), 0) << d.dump();
  int id = d["id"].get<int>();
  EXPECT_EQ(d.value("anchor_pid", 0), worker) << d.dump();
  EXPECT_NE(d.value("anchor_note", "").find("holds the same sockets but belongs to uid 0, not to the caller"),
            std::string::npos)
      << d.dump();
  waitpid(worker, nullptr, 0);
  ASSERT_GE(wait_for([&] { return policy_listed(id).is_null(); }, 5000), 0) << list_policies().dump();
  json seen = as_user(kMallory, [] {
    std::string out;
    run_cmd(build_bin("syrupctl") + " list", out);
    return json{{"out", out}};
  });
  EXPECT_NE(seen.value("out", "").find("owner process " + std::to_string(worker) + " exited"), std::string::npos)
      << seen.dump();
  // The group is the kernel's to hash again (one flow, one socket).
  UdpClient c(g.port());
  for (uint32_t k = 0; k < 20; k++) c.send_request(1, k);
  std::vector<int> counts = g.drain();
  std::sort(counts.begin(), counts.end());
  EXPECT_EQ(counts, (std::vector<int>{0, 20}));
}

}  // namespace
}  // namespace syrup::test
