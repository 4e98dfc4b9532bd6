// libFuzzer target: the policy source path, from a tenant's bytes to a cached object,
// through syrupd's real Compiler and its sandbox (syrupd/compiler.cpp, sandbox.cpp), with
// the real clang and the source tree's headers. Input: one flags byte (bit 0: a policy
// wrapped for the socket-select hook, else a whole program of syrupd's own kind), the
// display name up to the first newline (at most 64 bytes), then the source: directives,
// includes, #embed, .incbin, sizes up to libFuzzer's -max_len.
// Files the sandbox must keep out (made at start): /tmp/syrup-fuzz-source/secret.h (0600)
// and public.h (0644), a link to it, and this process's environment, each holding the
// canary. Invariants checked on every input:
//  - compile() returns 0 with an object in the cache no bigger than the sandbox's bound,
//    or -errno with diagnostics;
//  - the diagnostics never hold the canary, and stay within their bound;
//  - no temporary is left in the cache.
// Each input runs clang (tens of milliseconds); a compile bomb meets the limits set here
// (5 s of CPU, 1 GiB, 8 s of wall time), below libFuzzer's -timeout.
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "compiler.h"
#include "log.h"

#define SYRUP_FUZZ_TARGET "fuzz_source"
#include "fuzz_check.h"

namespace {

// The canary: fresh per run (getrandom), so no corpus entry holds it, and looked for by
// hash (holds_canary), so libFuzzer's comparison tracing never hands it to the mutator.
// An input cannot name it: in a diagnostic it can only come from a file or the
// environment the sandbox must keep out. (A fixed canary compared with find() was learnt
// by the mutator and echoed back through the input's own file name: a false alarm.)
std::string g_canary;
uint64_t g_canary_hash = 0;

uint64_t fnv1a(const char* p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) h = (h ^ static_cast<unsigned char>(p[i])) * 1099511628211ull;
  return h;
}

bool holds_canary(const std::string& s) {
  size_t n = g_canary.size();
  for (size_t i = 0; i + n <= s.size(); i++)
    if (fnv1a(s.data() + i, n) == g_canary_hash) return true;
  return false;
}

constexpr const char* kDir = "/tmp/syrup-fuzz-source";
syrup::Compiler* g_compiler = nullptr;
std::string g_cache;

void cleanup() {
  std::error_code ec;
  if (!g_cache.empty()) std::filesystem::remove_all(g_cache, ec);
  std::filesystem::remove_all(kDir, ec);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  namespace fs = std::filesystem;
  syrup::set_log_level(syrup::LogLevel::kWarn);
  unsigned char rnd[16];
  if (getrandom(rnd, sizeof rnd, 0) != sizeof rnd) std::abort();
  g_canary = "SYRUP_FUZZ_";
  for (unsigned char b : rnd) g_canary += "0123456789abcdef"[b >> 4], g_canary += "0123456789abcdef"[b & 15];
  g_canary_hash = fnv1a(g_canary.data(), g_canary.size());
  setenv("SYRUP_FUZZ_ENV", g_canary.c_str(), 1);
  mkdir(kDir, 0755);
  chmod(kDir, 0755);
  for (auto [name, mode] : {std::pair{"secret.h", 0600}, std::pair{"public.h", 0644}}) {
    std::string p = std::string(kDir) + "/" + name;
    std::ofstream(p) << g_canary << " a line no compile may show\n";
    chmod(p.c_str(), static_cast<mode_t>(mode));
  }
  symlink((std::string(kDir) + "/public.h").c_str(), (std::string(kDir) + "/link.h").c_str());
  char tmpl[] = "/tmp/syrup-fuzz-cache-XXXXXX";
  if (!mkdtemp(tmpl)) std::abort();
  g_cache = tmpl;
  std::atexit(cleanup);
  syrup::CompilerConfig cfg;
  cfg.kernel_dir = SYRUP_KERNEL_DIR;
  cfg.cache_dir = g_cache;
  cfg.multiarch_include = SYRUP_MULTIARCH_INCLUDE;
  cfg.timeout_ms = 8000;
  cfg.cpu_seconds = 5;
  cfg.cache_max_bytes = 8u << 20;
  g_compiler = new syrup::Compiler();
  std::string err;
  if (g_compiler->init(cfg, err)) {
    std::fprintf(stderr, "fuzz_source: the compiler does not start: %s\n", err.c_str());
    std::abort();
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  std::string rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  size_t nl = rest.find('\n');
  if (nl == std::string::npos || nl > 64) return 0;
  syrup::CompileJob job;
  job.display_name = rest.substr(0, nl);
  job.source = rest.substr(nl + 1);
  if (data[0] & 1) {
    job.hook_define = "SYR_HOOK_SOCKET_SELECT";
    job.wrapper = "socket_select/wrapper.bpf.h";
  }
  syrup::CompileResult r = g_compiler->compile(job);
  check(!holds_canary(r.diagnostics), "no diagnostic shows a file outside the headers");
  check(r.diagnostics.size() <= syrup::Sandbox::kMaxDiagnostics + 1024, "diagnostics stay within their bound");
  if (r.err) {
    check(r.err < 0, "an error is a negative errno");
    check(!r.diagnostics.empty(), "a failed compile says why");
  } else {
    struct stat st {};
    check(stat(r.object_path.c_str(), &st) == 0 && S_ISREG(st.st_mode), "a compile's object is in the cache");
    check(static_cast<size_t>(st.st_size) <= syrup::Sandbox::kMaxOutput, "an object stays within its bound");
    check(r.object_path.starts_with(g_cache + "/obj/"), "the object is under the cache");
  }
  std::error_code ec;
  for (auto& e : std::filesystem::directory_iterator(g_cache + "/obj", ec))
    check(e.path().extension() == ".o", "no temporary is left in the cache");
  return 0;
}
