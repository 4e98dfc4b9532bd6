// The policy compiler driver: wraps a policy's source into a hook's program and runs
// clang on it, caching objects by content.
//
// Design: the translation unit syrupd compiles is
//     #include <syrup/policy.h>
//     #line 1 "<the user's file name>"
//     <the policy source>
//     #include "<hook wrapper>.bpf.h"
// so diagnostics name the user's file and line. clang runs in the compiler sandbox
// (sandbox.h): as an unprivileged uid that can open nothing but the headers, with the
// translation unit on its stdin and the object on its stdout. Objects are cached under
// <cache_dir>/obj/<sha256>.o where the key covers the compiler's identity, its flags,
// the contents of every header a policy can include, the hook and the source: a warm
// deploy of the same source skips clang entirely. The headers are hashed at start and
// again whenever one of them changed (an inotify event, then its stat stamp), so an
// edited header is compiled against, not hidden behind objects cached before.
// The cache is bounded (cache_max_bytes): when a stored object takes it over the bound,
// the objects used least recently (a hit renews an object's mtime) are removed until it
// is at 90% of it, and so are temporaries a killed syrupd left.
// Invariants: a cache entry is written to a temporary name and renamed, so a reader never
// sees a partial object; an object is stored only under the key of the headers it was
// compiled against (a header edited during the compile: compiled again); an object used
// in the last minute is never removed, so a deploy that was just given its path can load
// it (the cache may exceed its bound by what was used in that minute).
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <mutex>
#include <string>
#include <vector>

#include "sandbox.h"
#include "unique_fd.h"

namespace syrup {

struct CompilerConfig {
  std::string clang = "/usr/bin/clang-19";
  std::string kernel_dir;  // holds include/syrup/*.h and hooks/*.bpf.h
  std::string cache_dir = "/var/cache/syrup";
  std::string multiarch_include = "/usr/include/x86_64-linux-gnu";
  int timeout_ms = 60000;              // --compile_timeout_s
  uint64_t cache_max_bytes = 256ull << 20;  // of objects under <cache_dir>/obj; 0: no bound
  // The compiler sandbox (sandbox.h, docs/security/compiler.md).
  uid_t uid = 65534;                   // --compiler_uid: the compiler's uid and gid
  uint64_t memory_bytes = 1ull << 30;  // --compile_memory_mb
  unsigned cpu_seconds = 30;           // --compile_cpu_seconds
  bool allow_unconfined = false;       // --allow_unconfined_compiler
};

struct CompileJob {
  std::string source;
  std::string display_name;  // shown in diagnostics
  std::string hook_define;   // e.g. SYR_HOOK_SOCKET_SELECT
  std::string wrapper;       // e.g. socket_select.bpf.h; empty: `source` is a whole
                             // BPF program of syrupd's own (an XDP root program)
};

struct CompileResult {
  int err = 0;               // 0 or -errno
  std::string object_path;   // on success
  std::string diagnostics;   // clang's stderr (errors, or warnings on success)
  bool cached = false;
};

class Compiler {
 public:
  // Checks the compiler and headers exist and computes their identity. 0 or -errno,
  // with `error` saying what is missing.
  int init(const CompilerConfig& cfg, std::string& error);
  // Safe to call from several threads at once (syrupd's compile workers and its main
  // thread): every compile writes its source and object under names of its own.
  CompileResult compile(const CompileJob& job);
  // Compiles a BPF program of syrupd's own, <kernel_dir>/hooks/<file> (the XDP root
  // program, the sched_ext root scheduler), with the same compiler and cache as policies:
  // 0 with its object's path, or -errno with `err` naming it by `what`.
  int compile_own(const std::string& file, const std::string& what, std::string& object_path, std::string& err);
  // Whether `job`'s object is in the cache: compile() would return it without clang.
  bool cached(const CompileJob& job) const;
  // What names `job`'s compile: equal for jobs whose compile is the same (its cache path).
  std::string key(const CompileJob& job) const { return object_path(job, identity(), nullptr); }
  // While on, running compiles are killed and new ones fail, with -ECANCELED (shutdown).
  void cancel(bool on) { cancel_ = on; }
  const CompilerConfig& config() const { return cfg_; }
  // The objects in the cache (counted at start and at each trim, plus those stored since),
  // and how many objects trims removed to keep it within cache_max_bytes.
  uint64_t cache_bytes() const { return cache_bytes_; }
  uint64_t cache_evictions() const { return cache_evictions_; }
  // Whether init() took clang's version from the cache instead of running clang.
  bool version_from_cache() const { return version_from_cache_; }

 private:
  // The translation unit of `job` and its object's path in the cache, under the headers'
  // identity `id` (identity()).
  std::string object_path(const CompileJob& job, const std::string& id, std::string* tu) const;
  // Runs clang in the sandbox on `tu` and writes its object to a temporary `tmp` beside
  // `obj`: 0, or -errno with clang's (or syrupd's) message in `diagnostics`.
  int run_clang(const CompileJob& job, const std::string& tu, const std::string& obj, std::string& tmp,
                std::string& diagnostics);
  // `clang --version`'s output, from the cache while the binary is unchanged.
  int compiler_version(std::string& version);
  // Counts a stored object of `bytes` and trims the cache if that takes it over its bound.
  void stored(uint64_t bytes);
  // Removes the least recently used objects (and stale temporaries) until the cache holds
  // at most `target` bytes, then recounts it.
  void trim_cache(uint64_t target);

  // Every header a policy can pull in: *.h under kernel_dir, then the system's.
  std::vector<std::filesystem::path> headers() const;
  // The digest of the compiler version, flags and headers that every cache key starts
  // with; recomputed when a header's stamp changed since the last call.
  std::string identity() const;

  CompilerConfig cfg_;
  Sandbox sandbox_;
  std::string toolchain_;  // compiler version and flags
  mutable std::mutex identity_mu_;
  mutable std::string header_stamps_, identity_;  // under identity_mu_
  mutable UniqueFd watch_fd_;  // inotify on the headers' directories (empty: none)
  bool version_from_cache_ = false;
  std::atomic<bool> cancel_{false};
  std::atomic<uint64_t> seq_{0};  // makes temporary names unique per compile
  std::mutex cache_mu_;            // one trim at a time
  std::atomic<uint64_t> cache_bytes_{0};  // objects in the cache, counted at start and each trim
  std::atomic<uint64_t> cache_evictions_{0};
};

}  // namespace syrup
