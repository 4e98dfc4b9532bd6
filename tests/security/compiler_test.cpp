// Class 1 and the compiler's part of classes 5 and 6 (docs/security/compiler.md): a
// tenant's policy source is compiled by a clang that can open nothing but that source and
// the shipped headers, that stops at its CPU and memory limits, that one user cannot run
// on every compile worker at once, and that dies with syrupd.
//
// Each test deploys as kMallory (and kAlice) against a real syrupd and asserts what that
// user got back: the error text, never a line of a file it reached for.
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <arpa/inet.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "security.h"

namespace syrup::test::security {
namespace {
using json = nlohmann::json;
namespace fs = std::filesystem;

// Deploys `source` (named `name`) at the socket-select hook on a group of the caller's own:
// {"r": id or -errno, "err": what libsyrup said, "ms": how long it took}.
json deploy(const std::string& source, const std::string& name = "evil.c") {
  UdpGroup g(2);
  std::string app = "sec" + std::to_string(getpid());
  auto t0 = std::chrono::steady_clock::now();
  int r = deploy_socket_select_source(source, name, g.fds(), app.c_str());
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  json j = {{"r", r}, {"err", syr_last_error()}, {"ms", ms}};
  if (r > 0) syr_remove_policy(r);
  return j;
}

json deploy_as(uid_t uid, const std::string& source, const std::string& name = "evil.c") {
  return as_user(uid, [&] { return deploy(source, name); });
}

std::string pass_policy() { return read_text(source_path("policies/pass.c")); }

std::string random_secret() {
  std::random_device rd;
  return "SYRUP_SECRET_" + std::to_string(rd()) + std::to_string(rd()) + " this line must never be shown";
}

// Files a hostile policy reaches for: one only root may read, one anyone may read in a
// directory anyone may enter (so only the sandbox's allowlist, not the uid, refuses it),
// and a link to the latter. Each holds a line that is no C, which clang would quote.
class Secrets {
 public:
  Secrets() : secret_(random_secret()) {
    chmod(dir_.path().c_str(), 0755);
    for (auto [name, mode] : {std::pair{"root_only.h", 0600}, std::pair{"public.h", 0644}}) {
      std::ofstream(dir_.path() + "/" + name) << secret_ << "\n";
      chmod((dir_.path() + "/" + name).c_str(), static_cast<mode_t>(mode));
    }
    symlink((dir_.path() + "/public.h").c_str(), (dir_.path() + "/link.h").c_str());
  }
  std::string path(const char* name) const { return dir_.path() + "/" + name; }
  const std::string& secret() const { return secret_; }

 private:
  TempDir dir_;
  std::string secret_;
};

class CompilerSecurity : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (geteuid() != 0) return;
    daemon_ = new Daemon();
    daemon_->start("", {"--compile_workers=2"});
  }
  static void TearDownTestSuite() { stop_suite_daemon(daemon_); }
  void SetUp() override {
    SYRUP_REQUIRE_ROOT();
    ASSERT_NE(daemon_, nullptr);
    ASSERT_EQ(daemon_->answers(), "");
  }
  // The deploy failed, said why in a way that names the user's file, and quoted nothing of
  // what the policy reached for.
  static void expect_refused_quietly(const json& j, const std::string& secret, const std::string& why = "") {
    std::string err = j.value("err", "");
    EXPECT_LT(j.value("r", 0), 0) << j.dump();
    EXPECT_NE(err.find("policy evil.c does not compile"), std::string::npos) << err;
    EXPECT_EQ(err.find(secret), std::string::npos) << "the error quotes the file:\n" << err;
    EXPECT_EQ(err.find("SYRUP_SECRET"), std::string::npos) << err;
    if (!why.empty()) EXPECT_NE(err.find(why), std::string::npos) << err;
  }
  static Daemon* daemon_;
};
Daemon* CompilerSecurity::daemon_ = nullptr;

// syrupd says at start how its compiler is confined (and refuses to start otherwise:
// CompilerStart.AnUnconfinableCompilerIsRefusedUnlessAccepted).
TEST_F(CompilerSecurity, SyrupdConfinesItsCompiler) {
  EXPECT_NE(daemon_->log().find("sandbox: Landlock ABI"), std::string::npos) << daemon_->log();
}

// The audit's example: #include of a root-only file quoted its first line.
TEST_F(CompilerSecurity, IncludeOfARootOnlyFileShowsNothingOfIt) {
  Secrets s;
  for (const char* form : {"#include \"%s\"\n", "#include <%s>\n"}) {
    char line[512];
    std::snprintf(line, sizeof line, form, s.path("root_only.h").c_str());
    expect_refused_quietly(deploy_as(kMallory, line + pass_policy()), s.secret(), "evil.c:1");
  }
}

// A world-readable file outside the headers: the uid could read it, the sandbox's
// allowlist refuses it. The same through a link, through a relative path from a header's
// directory, and as the directory of an include path.
TEST_F(CompilerSecurity, IncludeOfAWorldReadableFileOutsideTheHeadersIsRefused) {
  Secrets s;
  std::string rel = "../../../../../../../../../../.." + s.path("public.h");
  for (const std::string& p : {s.path("public.h"), s.path("link.h"), rel})
    expect_refused_quietly(deploy_as(kMallory, "#include \"" + p + "\"\n" + pass_policy()), s.secret());
  // Root's own compile of the same source would have read it: the check is not the uid.
  EXPECT_EQ(access(s.path("public.h").c_str(), R_OK), 0);
}

// /proc: syrupd's environment, init's, another process's memory map.
TEST_F(CompilerSecurity, ProcFilesAreRefused) {
  std::vector<std::string> paths = {"/proc/self/environ", "/proc/1/environ",
                                    "/proc/" + std::to_string(daemon_->pid()) + "/environ", "/proc/self/maps",
                                    "/etc/passwd", "/etc/hostname"};
  for (auto& p : paths) {
    json j = deploy_as(kMallory, "#include \"" + p + "\"\n" + pass_policy());
    std::string err = j.value("err", "");
    EXPECT_LT(j.value("r", 0), 0) << p << ": " << j.dump();
    EXPECT_NE(err.find("evil.c:1"), std::string::npos) << p << ": " << err;
    for (const char* leak : {"PATH=", "HOME=", "SYRUP_SOCKET=", "root:x:0", "r-xp"})
      EXPECT_EQ(err.find(leak), std::string::npos) << p << " leaked '" << leak << "':\n" << err;
  }
}

// Ways around #include: the assembler's .incbin and C23's #embed (clang 19) put a file's
// bytes into the object (and so into a map the user can read), quoting nothing: they must
// fail to open it.
TEST_F(CompilerSecurity, IncbinAndEmbedCannotReadFiles) {
  Secrets s;
  std::string incbin = "asm(\".section .rodata.leak,\\\"a\\\"\\n.incbin \\\"" + s.path("public.h") + "\\\"\\n.previous\");\n";
  json j = deploy_as(kMallory, incbin + pass_policy());
  expect_refused_quietly(j, s.secret());
  EXPECT_NE(j.value("err", "").find("incbin"), std::string::npos) << j.dump();

  std::string embed = "static const unsigned char leak[] = {\n#embed \"" + s.path("public.h") +
                      "\"\n};\n_Static_assert(sizeof(leak) > 1, \"embedded\");\n";
  j = deploy_as(kMallory, embed + pass_policy());
  expect_refused_quietly(j, s.secret());
  std::string err = j.value("err", "");
  EXPECT_TRUE(err.find("not found") != std::string::npos || err.find("ermission denied") != std::string::npos)
      << "#embed must fail to open the file:\n" << err;
}

// Every shipped packet policy still compiles in the sandbox (a user's deploy, not root's;
// the thread policies are deployed by syrup_thread_tests, through the same compiler).
TEST_F(CompilerSecurity, ShippedPoliciesCompileInTheSandbox) {
  for (auto& e : fs::directory_iterator(source_path("policies"))) {
    if (e.path().extension() != ".c") continue;
    std::string src = read_text(e.path()) + "\n// " + std::to_string(getpid()) + "\n";  // not cached
    if (src.find("SYR_POLICY(struct syr_thread") != std::string::npos) continue;
    json j = deploy_as(kAlice, src, e.path().filename().string());
    EXPECT_GT(j.value("r", 0), 0) << e.path() << ": " << j.dump();
  }
}

// A compile bomb (exponential macro expansion: 2^34 tokens) is stopped by the sandbox's
// limits with an error naming the limit, while another user's cold deploy of a small
// policy goes through meanwhile. The attacker sends two, to take both workers.
TEST_F(CompilerSecurity, ACompileBombIsStoppedByItsLimitWhileAnotherUserDeploys) {
  std::string bomb = "#define A0 ;\n";
  for (int i = 1; i <= 34; i++) bomb += "#define A" + std::to_string(i) + " A" + std::to_string(i - 1) + " A" + std::to_string(i - 1) + "\n";
  bomb += "A34\n" + pass_policy();
  auto t0 = std::chrono::steady_clock::now();
  json bombs;
  std::thread attacker([&] {
    bombs = as_user(kMallory, [&] {
      json a, b;
      std::thread t([&] { a = deploy(bomb + "// 1\n"); });
      b = deploy(bomb + "// 2\n");
      t.join();
      return json{a, b};
    });
  });
  ASSERT_TRUE(log_says(*daemon_, "deploy parked while evil.c compiles", 2, 20000)) << daemon_->log();
  json alice = deploy_as(kAlice, uncached_source("policies/round_robin.c"), "small.c");
  double alice_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  attacker.join();
  double bombs_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GT(alice.value("r", 0), 0) << alice.dump();
  EXPECT_LT(alice.value("ms", 1e9), 15000) << "the other user's cold deploy waited for the bombs: " << alice.dump();
  ASSERT_TRUE(bombs.is_array()) << bombs.dump();
  for (auto& b : bombs) {
    std::string err = b.value("err", "");
    EXPECT_LT(b.value("r", 0), 0) << b.dump();
    EXPECT_TRUE(err.find("memory limit of 1024 MiB") != std::string::npos ||
                err.find("CPU time limit of 30 s") != std::string::npos)
        << "the error must name the limit that stopped the compile:\n" << err.substr(0, 2000);
  }
  EXPECT_LT(bombs_s, 55) << "the bombs ran to the wall-clock timeout";
  (void)alice_s;
}

// A huge initialiser (256 MiB of .data) is stopped by the object's bound or the memory
// limit, with an error naming it.
TEST_F(CompilerSecurity, AHugeInitializerIsStoppedByALimit) {
  json j = deploy_as(kMallory, "volatile char big[1 << 28] = {1};\n" + pass_policy());
  std::string err = j.value("err", "");
  EXPECT_LT(j.value("r", 0), 0) << j.dump();
  EXPECT_TRUE(err.find("wrote an object over the limit of 32 MiB") != std::string::npos ||
              err.find("memory limit of 1024 MiB") != std::string::npos)
      << err.substr(0, 2000);
}

// What a compile can do, seen from inside: a "compiler" of the test's own (a static C
// program, so the sandbox confines it as it does clang) that tries the network, files and
// its privileges and prints what it got as its diagnostics, which the deploying user reads.
const char* kProbeSource = R"(#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>
extern char **environ;
static const char *e(int r) { return r >= 0 ? "ok" : strerrorname_np(errno); }
int main(int argc, char **argv) {
  for (int i = 1; i < argc; i++)
    if (!strcmp(argv[i], "--version")) { puts("probe version 1"); return 0; }
  int s = socket(AF_INET, SOCK_STREAM, 0);
  fprintf(stderr, "probe: socket_inet=%s\n", e(s));
  if (s >= 0) {
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(PORT), .sin_addr.s_addr = htonl(0x7f000001)};
    fprintf(stderr, "probe: connect=%s\n", e(connect(s, (struct sockaddr *)&a, sizeof a)));
  }
  fprintf(stderr, "probe: socket_unix=%s\n", e(socket(AF_UNIX, SOCK_STREAM, 0)));
  fprintf(stderr, "probe: open_passwd=%s\n", e(open("/etc/passwd", O_RDONLY)));
  fprintf(stderr, "probe: open_secret=%s\n", e(open(SECRET, O_RDONLY)));
  fprintf(stderr, "probe: create_tmp=%s\n", e(open("/tmp/syrup-probe-was-here", O_WRONLY | O_CREAT, 0644)));
  fprintf(stderr, "probe: uid=%d gid=%d groups=%d\n", (int)getuid(), (int)getgid(), getgroups(0, 0));
  int sig = -1;
  prctl(PR_GET_PDEATHSIG, &sig);
  fprintf(stderr, "probe: no_new_privs=%d pdeathsig=%d\n", prctl(PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0), sig);
  struct __user_cap_header_struct h = {_LINUX_CAPABILITY_VERSION_3, 0};
  struct __user_cap_data_struct d[2] = {0};
  syscall(SYS_capget, &h, d);
  fprintf(stderr, "probe: cap_eff=%x%x cap_prm=%x%x\n", d[1].effective, d[0].effective, d[1].permitted, d[0].permitted);
  int n = 0;
  for (char **v = environ; *v; v++) n++;
  fprintf(stderr, "probe: env=%d\n", n);
  struct rlimit as, cpu;
  getrlimit(RLIMIT_AS, &as);
  getrlimit(RLIMIT_CPU, &cpu);
  fprintf(stderr, "probe: as_mb=%llu cpu_s=%llu\n", (unsigned long long)as.rlim_cur >> 20, (unsigned long long)cpu.rlim_cur);
  return 1;
}
)";

TEST(CompilerInside, ACompileHasNoNetworkNoFilesAndNoPrivilege) {
  SYRUP_REQUIRE_ROOT();
  TempDir dir;
  Secrets s;
  UniqueFd listener(socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  ASSERT_EQ(bind(listener.get(), reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(listen(listener.get(), 4), 0);
  ASSERT_EQ(getsockname(listener.get(), reinterpret_cast<sockaddr*>(&a), &len), 0);
  fs::create_directories(dir.path() + "/bin");
  std::ofstream(dir.path() + "/probe.c") << kProbeSource;
  std::string probe = dir.path() + "/bin/probe", out;
  ASSERT_EQ(run_cmd("/usr/bin/clang-19 -static -O1 -DPORT=" + std::to_string(ntohs(a.sin_port)) + " -DSECRET='\"" +
                        s.path("public.h") + "\"' -o " + probe + " " + dir.path() + "/probe.c 2>&1",
                    out),
            0)
      << out;
  Daemon d;
  d.start("", {"--clang=" + probe});
  ASSERT_EQ(d.answers(), "");
  ASSERT_NE(d.log().find("sandbox: Landlock"), std::string::npos) << d.log();
  std::string err = deploy_as(kMallory, pass_policy()).value("err", "");
  for (const char* want :
       {"probe: socket_inet=EACCES", "probe: socket_unix=EACCES", "probe: open_passwd=EACCES",
        "probe: open_secret=EACCES", "probe: create_tmp=EACCES", "probe: uid=65534 gid=65534 groups=0",
        "probe: no_new_privs=1 pdeathsig=9", "probe: cap_eff=00 cap_prm=00", "probe: env=2",
        "probe: as_mb=1024 cpu_s=30"})
    EXPECT_NE(err.find(want), std::string::npos) << "expected '" << want << "' from inside the compile:\n" << err;
  EXPECT_EQ(err.find("connect="), std::string::npos) << err;
  EXPECT_LT(accept(listener.get(), nullptr, nullptr), 0) << "the compile reached a TCP listener";
  EXPECT_NE(access("/tmp/syrup-probe-was-here", F_OK), 0);
  unlink("/tmp/syrup-probe-was-here");
}

// One user cannot occupy every compile worker: with two workers, a user's second compile
// waits for its first (naming the limit in syrupd's log) and another user's compile runs
// beside the first, finishing before the second. (A compiler that takes 3 s per compile,
// as tests/harness.h's slow_clang.)
TEST(CompilerQuota, OneUserCannotOccupyEveryCompileWorker) {
  SYRUP_REQUIRE_ROOT();
  TempDir dir;
  Daemon d;
  d.start("", {"--clang=" + slow_clang(dir.path(), 3), "--compile_workers=2"});
  ASSERT_EQ(d.answers(), "");
  using Clock = std::chrono::steady_clock;
  auto now_ms = [] { return std::chrono::duration<double, std::milli>(Clock::now().time_since_epoch()).count(); };
  json mallory;
  std::thread attacker([&] {
    mallory = as_user(kMallory, [&] {
      json a, b;
      std::thread t([&] {
        a = deploy(uncached_source("policies/pass.c"), "m1.c");
        a["done"] = now_ms();
      });
      b = deploy(uncached_source("policies/pass.c"), "m2.c");
      b["done"] = now_ms();
      t.join();
      return json{a, b};
    });
  });
  bool both = log_says(d, "deploy parked while m", 2, 20000);
  json alice;
  if (both) {
    alice = deploy_as(kAlice, uncached_source("policies/pass.c"), "alice.c");
    alice["done"] = now_ms();
  }
  attacker.join();
  ASSERT_TRUE(both) << d.log();
  ASSERT_TRUE(mallory.is_array()) << mallory.dump();
  EXPECT_GT(alice.value("r", 0), 0) << alice.dump();
  double last_mallory = 0;
  for (auto& m : mallory) {
    EXPECT_GT(m.value("r", 0), 0) << m.dump();
    last_mallory = std::max(last_mallory, m.value("done", 0.0));
  }
  EXPECT_LT(alice.value("done", 1e18), last_mallory)
      << "the other user's compile waited for both of the first user's: " << alice.dump() << " " << mallory.dump();
  EXPECT_NE(d.log().find("uid 62001 has 1 compiles running, its limit (--quota_compiles_per_uid)"), std::string::npos)
      << d.log();
}

// A compile's wall-clock bound is --compile_timeout_s: a compiler that sleeps past it is
// stopped and the user told the bound; a bound
// of 0 stops syrupd at start with the range.
TEST(CompilerTimeout, ACompileOverItsWallClockBoundIsStoppedNamingIt) {
  SYRUP_REQUIRE_ROOT();
  TempDir dir;
  std::string out;
  EXPECT_EQ(run_cmd(build_bin("syrupd") + " --compile_timeout_s=0 2>&1", out), 2) << out;
  EXPECT_NE(out.find("--compile_timeout_s must be 1 to 3600"), std::string::npos) << out;
  Daemon d;
  d.start("", {"--clang=" + slow_clang(dir.path(), 6), "--compile_timeout_s=2"});
  ASSERT_EQ(d.answers(), "");
  auto t0 = std::chrono::steady_clock::now();
  json r = deploy_as(kMallory, uncached_source("policies/pass.c"), "slow.c");
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(r.value("r", 0), 0) << r.dump();
  EXPECT_NE(r.dump().find("did not finish in 2 s and was stopped"), std::string::npos) << r.dump();
  EXPECT_LT(secs, 5.5) << "the compile was not stopped at its 2 s bound";
}

// Fail closed: a compiler the sandbox cannot confine (here a script, which runs an
// interpreter) stops syrupd at start with the reason, unless the operator accepts it
// with --allow_unconfined_compiler; and the compiler never runs as root.
TEST(CompilerStart, AnUnconfinableCompilerIsRefusedUnlessAccepted) {
  SYRUP_REQUIRE_ROOT();
  TempDir dir;
  std::string clang = slow_clang(dir.path(), 0);
  std::string bpffs = "/sys/fs/bpf/syrup-test-start-" + std::to_string(getpid());
  std::string base = build_bin("syrupd") + " --socket=" + dir.path() + "/s.sock --bpffs_root=" + bpffs +
                     " --cache_dir=" + dir.path() + "/cache --state_file=" + dir.path() + "/state.json";
  std::string out;
  EXPECT_EQ(run_cmd(base + " --clang=" + clang + " 2>&1", out), 1) << out;
  EXPECT_NE(out.find("the policy compiler cannot be confined: '" + clang + "' is not a 64-bit ELF executable"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("--allow_unconfined_compiler"), std::string::npos) << out;
  EXPECT_EQ(run_cmd(base + " --compiler_uid=0 2>&1", out), 2) << out;
  EXPECT_NE(out.find("--compiler_uid must not be 0"), std::string::npos) << out;
  std::error_code ec;
  fs::remove_all(bpffs, ec);
}

// A syrupd killed mid-compile leaves no compiler running: the compiler is syrupd's child
// while it runs, and gone a moment after syrupd is.
TEST(CompilerLifetime, AKilledSyrupdLeavesNoCompilerRunning) {
  SYRUP_REQUIRE_ROOT();
  TempDir dir;
  Daemon d;
  d.start("", {"--clang=" + slow_clang(dir.path(), 30)});
  ASSERT_EQ(d.answers(), "");
  std::thread attacker([&] { deploy_as(kMallory, uncached_source("policies/pass.c"), "slow.c"); });
  bool parked = log_says(d, "deploy parked while slow.c compiles", 1, 20000);
  // syrupd's children (every thread's), after the compile has started.
  std::vector<pid_t> children;
  wait_for(
      [&] {
        children.clear();
        for (auto& t : fs::directory_iterator("/proc/" + std::to_string(d.pid()) + "/task")) {
          std::istringstream in(read_text(t.path().string() + "/children"));
          for (pid_t c; in >> c;) children.push_back(c);
        }
        return !children.empty();
      },
      10000);
  d.crash();
  attacker.join();
  ASSERT_TRUE(parked) << d.log();
  ASSERT_EQ(children.size(), 1u) << "syrupd's children while it compiled";
  pid_t compiler = children[0];
  int gone = wait_for(
      [&] {
        std::string stat = read_text("/proc/" + std::to_string(compiler) + "/stat");
        return stat.empty() || stat.find(") Z") != std::string::npos;
      },
      3000);
  if (gone < 0) kill(compiler, SIGKILL);
  EXPECT_GE(gone, 0) << "the compiler (pid " << compiler << ") outlived syrupd";
}

}  // namespace
}  // namespace syrup::test::security
