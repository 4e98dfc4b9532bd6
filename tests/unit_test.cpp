// Unit tests of pure logic: the control protocol's framing, name validation, the pin
// layout and the helpers the loader and compiler use (the compiler's with a real clang).
// No kernel involved.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "client.h"
#include "compiler.h"
#include "digest.h"
#include "harness.h"
#include "loader.h"
#include "names.h"
#include "pins.h"
#include "protocol.h"
#include "registry.h"
#include "syrup/syrup.h"
#include "thread_agent.h"

namespace syrup {
namespace {

struct Pair {
  Pair() {
    int sv[2];
    EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    a.reset(sv[0]);
    b.reset(sv[1]);
  }
  UniqueFd a, b;
};

// The hook registry (hooks/hooks.def) is the only list of hooks: names, folder ids and
// libsyrup enum values are unique, and the enum values libsyrup's header declares are the
// registry's.
TEST(HookRegistry, NamesIdsAndEnumValuesAreUniqueAndMatchTheCHeader) {
  std::set<std::string> names, ids;
  std::set<int> abi;
  for (const syrup::HookSpec* s : syrup::hook_specs()) {
    EXPECT_TRUE(names.insert(s->name).second) << s->name;
    EXPECT_TRUE(ids.insert(s->id).second) << s->id;
    EXPECT_TRUE(abi.insert(s->abi_id).second) << s->name;
    EXPECT_EQ(syrup::find_hook(s->name), s);
    EXPECT_EQ(syrup::find_hook(s->abi_id), s);
    EXPECT_FALSE(std::string(s->usage).empty()) << s->name;
    EXPECT_FALSE(s->keys.empty()) << s->name;
  }
  EXPECT_EQ(syrup::find_hook(SYR_HOOK_SOCKET_SELECT)->name, std::string("socket-select"));
  EXPECT_EQ(syrup::find_hook(SYR_HOOK_XDP)->name, std::string("xdp"));
  EXPECT_EQ(syrup::find_hook(SYR_HOOK_THREAD)->name, std::string("thread"));
  EXPECT_EQ(syrup::find_hook("sched"), nullptr);
  EXPECT_EQ(syrup::find_hook(42), nullptr);
  EXPECT_EQ(syrup::hook_names().substr(0, 20), "socket-select, xdp, ");
}

// Every hook's kernel folder has the two files the compiler names from its wrapper: the
// wrapper and the policy header's part for that hook.
TEST(HookRegistry, EveryHookHasItsKernelFolder) {
  for (const syrup::HookSpec* s : syrup::hook_specs()) {
    std::string dir = std::string(SYRUP_SOURCE_DIR) + "/kernel/hooks/" + s->id;
    EXPECT_TRUE(std::filesystem::exists(dir + "/policy_input.h")) << dir;
    EXPECT_TRUE(std::filesystem::exists(std::string(SYRUP_SOURCE_DIR) + "/hooks/" + s->id + "/spec.cpp")) << s->id;
  }
}

TEST(Protocol, RoundTripsJsonAndFileDescriptors) {
  Pair p;
  int fds[2] = {STDIN_FILENO, STDOUT_FILENO};
  ASSERT_EQ(proto::send_message(p.a.get(), {{"op", "deploy"}, {"n", 3}}, fds), 0);
  proto::Message m;
  ASSERT_EQ(proto::recv_message(p.b.get(), m), 0);
  EXPECT_EQ(m.body["op"], "deploy");
  EXPECT_EQ(m.body["n"], 3);
  ASSERT_EQ(m.fds.size(), 2u);
  struct stat s1, s2;
  fstat(m.fds[1].get(), &s1);
  fstat(STDOUT_FILENO, &s2);
  EXPECT_EQ(s1.st_ino, s2.st_ino) << "the received fd must be the same file";
}

TEST(Protocol, CleanEndOfStreamIsENODATA) {
  Pair p;
  p.a.reset();
  proto::Message m;
  EXPECT_EQ(proto::recv_message(p.b.get(), m), -ENODATA);
}

TEST(Protocol, RejectsBadMagicOversizeTruncationAndNonObjects) {
  auto send_raw = [](int fd, uint32_t magic, uint32_t len, const std::string& payload) {
    uint32_t h[2] = {magic, len};
    ASSERT_EQ(write(fd, h, 8), 8);
    if (!payload.empty()) {
      ASSERT_EQ(write(fd, payload.data(), payload.size()), (ssize_t)payload.size());
    }
  };
  std::string why;
  proto::Message m;
  {
    Pair p;
    send_raw(p.a.get(), 0xdeadbeef, 2, "{}");
    EXPECT_EQ(proto::recv_message(p.b.get(), m, &why), -EPROTO);
    EXPECT_NE(why.find("bad frame magic"), std::string::npos);
  }
  {
    Pair p;
    send_raw(p.a.get(), proto::kMagic, proto::kMaxPayload + 1, "");
    EXPECT_EQ(proto::recv_message(p.b.get(), m, &why), -EPROTO);
    EXPECT_NE(why.find("4 MiB"), std::string::npos);
  }
  {
    Pair p;
    send_raw(p.a.get(), proto::kMagic, 100, "{\"op\":");
    p.a.reset();
    EXPECT_EQ(proto::recv_message(p.b.get(), m, &why), -EPROTO);
    EXPECT_NE(why.find("closed inside a frame"), std::string::npos);
  }
  {
    Pair p;
    send_raw(p.a.get(), proto::kMagic, 7, "[1,2,3]");
    EXPECT_EQ(proto::recv_message(p.b.get(), m, &why), -EPROTO);
    EXPECT_NE(why.find("not a JSON object"), std::string::npos);
  }
  {
    Pair p;
    send_raw(p.a.get(), proto::kMagic, 4, std::string("\xff\xfe\x00\x01", 4));
    EXPECT_EQ(proto::recv_message(p.b.get(), m, &why), -EPROTO);
  }
}

TEST(Protocol, ErrorResponseShape) {
  auto j = proto::error_response(-EPERM, "no", "log text");
  EXPECT_EQ(j["ok"], false);
  EXPECT_EQ(j["errno"], EPERM);
  EXPECT_EQ(j["error"], "no");
  EXPECT_EQ(j["log"], "log text");
}

// What syr_last_error() and syrupctl show: the message, then the log without the line
// the message already quotes (a compile error's first diagnostic) and without trailing
// newlines.
TEST(Protocol, ResponseStatusJoinsMessageAndLogOnce) {
  auto text = [](const std::string& err, const std::string& log, int* code = nullptr) {
    Message m;
    m.body = proto::error_response(EINVAL, err, log);
    std::string out;
    int r = response_status(m, out);
    if (code) *code = r;
    return out;
  };
  int code = 0;
  EXPECT_EQ(text("policy p.c does not compile: p.c:2:4: error: x", "p.c:2:4: error: x\n", &code),
            "policy p.c does not compile: p.c:2:4: error: x");
  EXPECT_EQ(code, -EINVAL);
  EXPECT_EQ(text("policy p.c does not compile: p.c:2:4: error: x", "p.c:2:4: error: x\np.c:3:1: error: y\n"),
            "policy p.c does not compile: p.c:2:4: error: x\np.c:3:1: error: y");
  EXPECT_EQ(text("the verifier rejected policy v.c: R2 bad", "0: R1=ctx()\nR2 bad\n"),
            "the verifier rejected policy v.c: R2 bad\n0: R1=ctx()\nR2 bad");
  EXPECT_EQ(text("no policy 9", ""), "no policy 9");
  Message ok;
  ok.body = {{"ok", true}};
  std::string out = "untouched";
  EXPECT_EQ(response_status(ok, out), 0);
}

// One checker for every name a request carries: a control character is refused in each
// kind, and quoted escaped, so no refusal splits a log line.
TEST(Names, EveryKindRefusesControlCharactersAndQuotesThemEscaped) {
  using names::Kind;
  for (Kind k : {Kind::kPinned, Kind::kLabel, Kind::kParam, Kind::kInterface, Kind::kDisplay}) {
    for (std::string bad : {std::string("a\nb"), std::string("a\x1b"), std::string("a\x7f"), std::string("a\xc2\x85")}) {
      std::string why = names::check("x", bad, k);
      EXPECT_NE(why.find("has a control character"), std::string::npos) << why;
      EXPECT_EQ(why.find('\n'), std::string::npos) << why;
    }
  }
  EXPECT_EQ(names::check("source", "/home/alice/my policy (v2).c", Kind::kDisplay), "");
  EXPECT_EQ(names::check("source", "caf\xc3\xa9.c", Kind::kDisplay), "");  // UTF-8 text
  EXPECT_EQ(names::check("parameter", "n_short", Kind::kParam), "");
  EXPECT_NE(names::check("parameter", "2x", Kind::kParam), "");
  EXPECT_NE(names::check("parameter", "a-b", Kind::kParam), "");
  EXPECT_EQ(names::check("interface", "eth0.100", Kind::kInterface), "");
  EXPECT_NE(names::check("interface", "a/b", Kind::kInterface), "");
  EXPECT_NE(names::check("interface", "..", Kind::kInterface), "");
  EXPECT_NE(names::check("interface", std::string(16, 'e'), Kind::kInterface), "");
  EXPECT_EQ(names::printable("a\nb"), "a\\x0ab");
}

// Integers are compared as 64-bit numbers: nothing is cut to fit.
TEST(Names, IntegersOutOfRangeAreRefusedNotCut) {
  int64_t v = 0;
  EXPECT_EQ(names::integer("port", nlohmann::json(9100), 1, 65535, v), "");
  EXPECT_EQ(v, 9100);
  EXPECT_EQ(names::integer("port", nlohmann::json(4294967296ull + 9100), 1, 65535, v),
            "port must be an integer in 1..65535, got 4294976396");
  EXPECT_EQ(names::integer("port", nlohmann::json(-1), 1, 65535, v), "port must be an integer in 1..65535, got -1");
  EXPECT_EQ(names::integer("port", nlohmann::json(9100.0), 1, 65535, v),
            "port must be an integer in 1..65535, got 9100.0");
  EXPECT_EQ(names::integer("port", nlohmann::json("9100"), 1, 65535, v),
            "port must be an integer in 1..65535, got \"9100\"");
  EXPECT_EQ(names::integer("id", nlohmann::json(UINT64_MAX), 1, INT32_MAX, v),
            "id must be an integer in 1..2147483647, got 18446744073709551615");
}

TEST(Names, PinnedNamesRefuseTraversalDotsAndOverlongNamesAndDefaultsAreValid) {
  EXPECT_EQ(names::check("map", "scan_map"), "");
  EXPECT_EQ(names::check("application", "rocksdb-server_v2"), "");
  // bpffs refuses '.' in a name: a dotted application could never be pinned.
  EXPECT_NE(names::check("application", "rocksdb-server.v2").find("bpffs refuses '.'"), std::string::npos);
  EXPECT_NE(names::check("application", "../etc"), "");
  EXPECT_NE(names::check("application", "a/b"), "");
  EXPECT_NE(names::check("application", ".hidden"), "");
  EXPECT_NE(names::check("application", ""), "");
  EXPECT_NE(names::check("application", std::string(65, 'a')), "");
  EXPECT_EQ(names::check("application", std::string(64, 'a')), "");
  // Policy names are labels (file names), never paths.
  EXPECT_EQ(names::check("policy", "round_robin.c", names::Kind::kLabel), "");
  EXPECT_NE(names::check("policy", ".hidden", names::Kind::kLabel), "");
  EXPECT_NE(names::check("policy", "a/b", names::Kind::kLabel), "");
  // Default application names from program names.
  EXPECT_EQ(names::application_from("python3.11"), "python3_11");
  EXPECT_EQ(names::application_from(""), "app");
  EXPECT_EQ(names::application_from(std::string(80, 'x')), std::string(64, 'x'));
  // Interface names in the XDP pin tree: bpffs refuses the dots of VLAN names.
  EXPECT_EQ(pins::xdp_pin_name("eth0.100"), "eth0:100");
  EXPECT_EQ(pins::xdp_ifname("eth0:100"), "eth0.100");
}

TEST(Pins, LayoutIsRootedAndPerApplication) {
  pins::set_root("/sys/fs/bpf/syrup");
  EXPECT_EQ(pins::app_map("kv", "scan_map"), "/sys/fs/bpf/syrup/apps/kv/maps/scan_map");
  EXPECT_EQ(pins::policy_prog("kv", 7), "/sys/fs/bpf/syrup/apps/kv/policies/7/prog");
  EXPECT_EQ(pins::policy_map("kv", 7, "syr_stats"), "/sys/fs/bpf/syrup/apps/kv/policies/7/syr_stats");
}

TEST(Loader, TailLines) {
  EXPECT_EQ(tail_lines("a\nb\nc\nd\n", 2), "c\nd\n");
  EXPECT_EQ(tail_lines("a\nb", 5), "a\nb");
  EXPECT_EQ(tail_lines("", 3), "");
}

// Kernel addresses in text a tenant gets back (verifier logs): every form the kernel
// prints, and nothing else touched.
TEST(Loader, ScrubsKernelAddresses) {
  EXPECT_EQ(scrub_kernel_addresses("0: (18) r1 = 0xffff8881234abcde\n"), "0: (18) r1 = <kernel address>\n");
  EXPECT_EQ(scrub_kernel_addresses("R1=ffffffffc0a1b2c3 fp-8=0XFFFF888100000000"),
            "R1=<kernel address> fp-8=<kernel address>");
  EXPECT_EQ(scrub_kernel_addresses("at ffffffff81000000:"), "at <kernel address>:");
  // Not addresses: shorter or longer runs, runs inside words, other prefixes.
  for (const char* keep : {"r1 = 0xffff", "imm=0xffffffff", "0xffff88812345678901", "xffff888123456789",
                           "ffff888123456789z", "0x7fff888123456789", "R0 invalid mem access 'map_value_or_null'"})
    EXPECT_EQ(scrub_kernel_addresses(keep), keep);
}

TEST(Compiler, Sha256KnownVector) {
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

// `clang --version` runs once per clang binary: a start with the same binary reads the
// version from the cache and compiles to the same cache keys; a changed binary (a new
// mtime, as a package upgrade gives), an unreadable record or a script runs clang again.
// The clang is a copy of the real one, so that the test can change its mtime.
TEST(Compiler, ClangVersionIsRunOncePerBinary) {
  test::TempDir tmp;
  ASSERT_FALSE(tmp.path().empty()) << strerror(errno);
  const std::string& dir = tmp.path();
  std::error_code ec;
  std::filesystem::copy_file(std::filesystem::canonical("/usr/bin/clang-19", ec), dir + "/clang", ec);
  ASSERT_FALSE(ec) << "copying clang-19: " << ec.message();
  std::ofstream(dir + "/wrapper") << "#!/bin/sh\nexec " << dir << "/clang \"$@\"\n";
  ASSERT_EQ(chmod((dir + "/wrapper").c_str(), 0755), 0);

  CompilerConfig cfg;
  cfg.clang = dir + "/clang";
  cfg.kernel_dir = std::string(SYRUP_SOURCE_DIR) + "/kernel";
  cfg.cache_dir = dir + "/cache";
  CompileJob job{"int x;", "p.c", "SYR_HOOK_SOCKET_SELECT", "socket_select/wrapper.bpf.h"};
  std::string first_key;
  // Starts a compiler as syrupd does; true when it took the version from the cache.
  auto start = [&](std::string* key = nullptr) {
    Compiler c;
    std::string error;
    EXPECT_EQ(c.init(cfg, error), 0) << error;
    if (key) *key = c.key(job);
    return c.version_from_cache();
  };

  EXPECT_FALSE(start(&first_key)) << "an empty cache has no version";
  std::string key;
  EXPECT_TRUE(start(&key)) << "the same binary: the version comes from the cache";
  EXPECT_EQ(key, first_key) << "a cached version must give the same cache keys";

  timespec old[2] = {{1000000000, 0}, {1000000000, 0}};  // 2001: any other mtime
  ASSERT_EQ(utimensat(AT_FDCWD, cfg.clang.c_str(), old, 0), 0) << strerror(errno);
  EXPECT_FALSE(start(&key)) << "a changed binary must be run again";
  EXPECT_EQ(key, first_key) << "same version, same keys";
  EXPECT_TRUE(start());

  std::ofstream(cfg.cache_dir + "/compiler-version", std::ios::trunc) << "garbage";
  EXPECT_FALSE(start(&key)) << "an unreadable record is a miss";
  EXPECT_EQ(key, first_key);
  EXPECT_TRUE(start());

  cfg.clang = dir + "/wrapper";
  // A script cannot be confined by the compiler sandbox; this one runs the copy in this
  // test's directory, which only root may enter.
  cfg.allow_unconfined = true;
  cfg.uid = 0;
  EXPECT_FALSE(start()) << "a script is run every time";
  EXPECT_FALSE(start()) << "a script is run every time";
}

// A compiler configuration over a copy of kernel/ (headers a test may edit) and a cache,
// both in a temporary directory; `error` says why the copy failed.
struct KernelCopy {
  test::TempDir tmp;
  CompilerConfig cfg;
  std::string header, error;  // the copy's policy.h
  KernelCopy() {
    std::error_code ec;
    std::filesystem::copy(std::string(SYRUP_SOURCE_DIR) + "/kernel", tmp.path() + "/kernel",
                          std::filesystem::copy_options::recursive, ec);
    if (tmp.path().empty() || ec) error = "copying kernel/: " + (ec ? ec.message() : strerror(errno));
    cfg.kernel_dir = tmp.path() + "/kernel";
    cfg.cache_dir = tmp.path() + "/cache";
    header = cfg.kernel_dir + "/include/syrup/policy.h";
  }
};
// A socket-select policy that returns `n`: one source, and so one cache object, per `n`.
CompileJob returning(int n) {
  return {"SYR_POLICY(struct syr_input *in) { return " + std::to_string(n) + "; }", "p.c", "SYR_HOOK_SOCKET_SELECT",
          "socket_select/wrapper.bpf.h"};
}
const CompileJob kReturnsZero = returning(0);

// A header under --kernel_dir edited while syrupd runs is compiled against at the next
// deploy: its stamp changed, so the cache identity is computed again and the object
// cached before is not served. Restoring the header's content brings the old key back.
TEST(Compiler, EditedHeaderIsCompiledAgainstNotHiddenByTheCache) {
  KernelCopy k;
  ASSERT_EQ(k.error, "");
  const CompilerConfig& cfg = k.cfg;
  Compiler c;
  std::string error;
  ASSERT_EQ(c.init(cfg, error), 0) << error;
  const CompileJob& job = kReturnsZero;
  CompileResult r = c.compile(job);
  ASSERT_EQ(r.err, 0) << r.diagnostics;
  EXPECT_FALSE(r.cached);
  EXPECT_TRUE(c.compile(job).cached);
  const std::string key = c.key(job), header = k.header;
  std::string original = test::read_text(header);

  std::ofstream(header, std::ios::app) << "\n#error \"this header was edited\"\n";
  EXPECT_NE(c.key(job), key);
  r = c.compile(job);
  EXPECT_NE(r.err, 0) << "the object cached before the edit was served";
  EXPECT_NE(r.diagnostics.find("this header was edited"), std::string::npos) << r.diagnostics;

  std::ofstream(header, std::ios::trunc | std::ios::binary) << original;
  EXPECT_EQ(c.key(job), key) << "the same headers give the same key";
  EXPECT_TRUE(c.compile(job).cached);
}

// A wrapper around clang that appends to the copy's policy.h on its first compile (and
// then, if `fail`, fails as clang would on a half-written header); the config uses it.
void edit_header_on_first_compile(KernelCopy& k, bool fail) {
  const std::string& dir = k.tmp.path();
  std::ofstream(dir + "/clang") << "#!/bin/sh\n"
                                << "case \" $* \" in *\" -c \"*)\n"
                                << "  if [ ! -e " << dir << "/edited ]; then\n"
                                << "    : > " << dir << "/edited; echo '/* edited */' >> " << k.header << "\n"
                                << (fail ? "    echo \"" + k.header + ":1:1: error: half-written\" >&2; exit 1\n" : "")
                                << "  fi;;\n"
                                << "esac\n"
                                << "exec /usr/bin/clang-19 \"$@\"\n";
  chmod((dir + "/clang").c_str(), 0755);
  k.cfg.clang = dir + "/clang";
  // The wrapper writes the header: it runs unconfined, as root (uid 0: syrupd's own).
  k.cfg.allow_unconfined = true;
  k.cfg.uid = 0;
}

// A header edited while clang runs: the object may reflect either version, and the key
// computed before the compile names the old headers. It is not stored under that key
// (restoring the header's content would serve it); the compile runs again against the
// headers as they are.
TEST(Compiler, HeaderEditedDuringTheCompileIsNotCachedUnderTheOldKey) {
  KernelCopy k;
  ASSERT_EQ(k.error, "");
  const std::string &dir = k.tmp.path(), &header = k.header;
  const std::string original = test::read_text(header);
  edit_header_on_first_compile(k, false);
  Compiler c;
  std::string error;
  ASSERT_EQ(c.init(k.cfg, error), 0) << error;
  const CompileJob& job = kReturnsZero;
  const std::string before = c.key(job);

  CompileResult r = c.compile(job);
  ASSERT_EQ(r.err, 0) << r.diagnostics;
  ASSERT_TRUE(std::filesystem::exists(dir + "/edited")) << "the wrapper did not edit the header";
  EXPECT_FALSE(std::filesystem::exists(before)) << "an object compiled during the edit was stored under the key "
                                                   "of the headers before it";
  EXPECT_EQ(r.object_path, c.key(job)) << "the object is stored under the key of the headers it was compiled against";
  EXPECT_TRUE(c.compile(job).cached);

  std::ofstream(header, std::ios::trunc | std::ios::binary) << original;
  EXPECT_EQ(c.key(job), before);
  EXPECT_FALSE(c.compile(job).cached) << "the original headers must be compiled against, not served an object "
                                         "compiled while they were being edited";
}

// A compile that fails while a header is being edited failed on a header that is neither
// version: its diagnostics are not the policy's. It runs again against the headers as
// they are, and the deploy succeeds.
TEST(Compiler, CompileThatFailedDuringAHeaderEditRunsAgain) {
  KernelCopy k;
  ASSERT_EQ(k.error, "");
  edit_header_on_first_compile(k, true);
  Compiler c;
  std::string error;
  ASSERT_EQ(c.init(k.cfg, error), 0) << error;
  CompileResult r = c.compile(kReturnsZero);
  ASSERT_TRUE(std::filesystem::exists(k.tmp.path() + "/edited")) << "the wrapper did not edit the header";
  EXPECT_EQ(r.err, 0) << r.diagnostics;
  EXPECT_EQ(r.diagnostics.find("half-written"), std::string::npos) << r.diagnostics;
  EXPECT_EQ(r.object_path, c.key(kReturnsZero));
}

// The cache keeps to --cache_max_bytes: a stored object that takes it over the bound
// removes the objects used least recently (a hit counts as a use) down to 90% of it, and
// temporaries a killed syrupd left are swept; a temporary of a running compile stays.
TEST(Compiler, CacheOverItsBoundLosesTheObjectsUsedLeastRecently) {
  namespace fs = std::filesystem;
  using namespace std::chrono_literals;
  KernelCopy k;
  ASSERT_EQ(k.error, "");
  std::string error, a, b;
  uintmax_t size = 0;
  {
    Compiler unbounded;
    k.cfg.cache_max_bytes = 0;
    ASSERT_EQ(unbounded.init(k.cfg, error), 0) << error;
    CompileResult r = unbounded.compile(returning(0));
    ASSERT_EQ(r.err, 0) << r.diagnostics;
    a = r.object_path;
    size = fs::file_size(a);
  }
  // A killed syrupd's temporaries, and a running compile's.
  const std::string cache = k.cfg.cache_dir, stale_obj = cache + "/obj/x.o.tmp.1.1", stale_src = cache + "/src/x.1.1.c",
                    running = cache + "/obj/y.o.tmp.2.2";
  fs::create_directories(cache + "/src");  // where an older syrupd kept its sources
  for (auto& f : {stale_obj, stale_src, running}) std::ofstream(f) << "partial";
  fs::last_write_time(stale_obj, fs::file_time_type::clock::now() - 3h);
  fs::last_write_time(stale_src, fs::file_time_type::clock::now() - 3h);

  k.cfg.cache_max_bytes = size * 5 / 2;  // room for two objects of this size, not three
  Compiler c;
  ASSERT_EQ(c.init(k.cfg, error), 0) << error;
  EXPECT_FALSE(fs::exists(stale_obj));
  EXPECT_FALSE(fs::exists(stale_src));
  EXPECT_TRUE(fs::exists(running));
  CompileResult rb = c.compile(returning(1));
  ASSERT_EQ(rb.err, 0) << rb.diagnostics;
  b = rb.object_path;
  ASSERT_EQ(fs::file_size(b), size) << "the test assumes the objects are the same size";
  EXPECT_TRUE(fs::exists(a)) << "two objects are within the bound";
  // a stored before b; a hit on a makes it the more recently used.
  fs::last_write_time(a, fs::file_time_type::clock::now() - 2h);
  fs::last_write_time(b, fs::file_time_type::clock::now() - 1h);
  EXPECT_TRUE(c.compile(returning(0)).cached);
  // Both out of the minute in which an object is never removed, in the order of their use.
  auto used_a = fs::last_write_time(a), used_b = fs::last_write_time(b);
  EXPECT_GT(used_a, used_b) << "a hit renews the object's time of use";
  fs::last_write_time(a, used_a - 3h);
  fs::last_write_time(b, used_b - 3h);

  CompileResult rc = c.compile(returning(2));
  ASSERT_EQ(rc.err, 0) << rc.diagnostics;
  EXPECT_TRUE(fs::exists(rc.object_path));
  EXPECT_TRUE(fs::exists(a)) << "the object used most recently stays";
  EXPECT_FALSE(fs::exists(b)) << "the object used least recently goes";
  EXPECT_FALSE(c.compile(returning(1)).cached) << "a removed object is compiled again";
}

// The CPU lists of syrupd --agent_cpus and the agent's baseline (cpuset(7) list format).
TEST(CpuList, ParsesSinglesRangesAndRejectsTheRest) {
  std::vector<int> v;
  ASSERT_EQ(thread::cpus_from_string("0", v), 0);
  EXPECT_EQ(v, (std::vector<int>{0}));
  ASSERT_EQ(thread::cpus_from_string("3,0-1,1", v), 0);
  EXPECT_EQ(v, (std::vector<int>{0, 1, 3})) << "sorted, without repeats";
  EXPECT_EQ(thread::cpus_to_string(v), "0,1,3");
  for (const char* bad : {"", ",", "1,", "a", "1-", "-1", "2-1", "1-x", "0 ", "99999", "1024"}) {
    std::vector<int> keep{7};
    EXPECT_EQ(thread::cpus_from_string(bad, keep), -EINVAL) << "'" << bad << "'";
    EXPECT_EQ(keep, (std::vector<int>{7})) << "left untouched on error: '" << bad << "'";
  }
}

}  // namespace
}  // namespace syrup
