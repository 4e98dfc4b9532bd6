// The compiler sandbox: how syrupd runs clang on a tenant's source so that the compile
// can read nothing but that source and the headers Syrup and the toolchain ship
// (docs/security/compiler.md).
//
// Design: everything is prepared once, as root, at start (init): descriptors of the
// compiler binary and of the header directories (opened by root, so they work under a
// directory the compiler's uid cannot traverse, e.g. a source tree under /root), a Landlock
// ruleset and a seccomp program. Each compile (run) forks a child that, with raw
// system calls only (syrupd is multi-threaded), moves its descriptors into place, sets its
// resource limits, drops every group, capability and root's uid, asks to die with the
// thread that forked it, enters the Landlock domain and the seccomp filter, and execs the
// compiler from its descriptor. The translation unit comes on stdin (a memfd), the object
// leaves on stdout and diagnostics on stderr (pipes the parent reads with bounds): the
// compiler has no writable file at all.
// Invariants: after init no path is resolved for a compile (the child opens nothing by
// name before exec); a compiler process never outlives syrupd (PR_SET_PDEATHSIG, its own
// process group, killed on timeout or cancel); if Landlock is missing, or --clang is a
// script it cannot confine, init fails unless the operator accepted an unconfined
// compiler (allow_unconfined), and then the uid, limits, seccomp filter and death
// signal still apply.
#pragma once

#include <linux/filter.h>
#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "unique_fd.h"

namespace syrup {

struct SandboxConfig {
  std::string clang;                      // the compiler binary (--clang)
  std::vector<std::string> fd_dirs;       // header trees passed as /proc/self/fd/N
  std::vector<std::string> read_dirs;     // other header trees, read by path
  uid_t uid = 65534;                      // the compiler's uid and gid when syrupd is root
                                          // (0: syrupd's own, for tests; syrupd refuses it)
  uint64_t memory_bytes = 1ull << 30;     // RLIMIT_AS
  unsigned cpu_seconds = 30;              // RLIMIT_CPU
  bool allow_unconfined = false;          // start without Landlock rather than refuse
};

struct SandboxRun {
  int status = -1;        // exit status, or 128 + signal
  std::string out, err;   // stdout (the object), stderr (diagnostics), both bounded
  bool out_over = false;  // stdout passed its bound: the compiler was stopped
  bool err_over = false;  // stderr passed its bound: the rest was dropped
  bool timed_out = false, canceled = false, cpu_limit = false;
};

class Sandbox {
 public:
  // Most a compile may write: the object, and its diagnostics.
  static constexpr size_t kMaxOutput = 32u << 20, kMaxDiagnostics = 64u << 10;

  // Opens the compiler and the header directories and builds the Landlock ruleset and
  // seccomp program. 0 or -errno with `error` saying what is missing and what to do.
  int init(const SandboxConfig& cfg, std::string& error);
  // The -I argument for fd_dirs[i] (/proc/self/fd/N in the compiler).
  std::string fd_dir_arg(size_t i) const;
  // Replaces the compiler's names of the fd_dirs in `text` with their paths.
  std::string readable(std::string text) const;
  // Runs the compiler with `args` (without argv[0]) and `input` on stdin, for at most
  // `timeout_ms` of wall time; a set `*cancel` stops it. 0 with `r` filled, or -errno when
  // it could not be started.
  int run(const std::vector<std::string>& args, const std::string& input, int timeout_ms,
          const std::atomic<bool>* cancel, SandboxRun& r) const;
  // Whether compiles run in a Landlock domain, and in words what confines them (logged).
  bool confined() const { return ruleset_fd_.get() >= 0; }
  const std::string& description() const { return description_; }
  const SandboxConfig& config() const { return cfg_; }

 private:
  SandboxConfig cfg_;
  UniqueFd clang_fd_;                 // O_PATH: exec'd with execveat
  std::vector<UniqueFd> dir_fds_;     // O_PATH directories, one per fd_dirs
  UniqueFd ruleset_fd_;               // Landlock (empty: unconfined)
  std::vector<sock_filter> filter_;   // the seccomp program
  bool switch_uid_ = false;           // syrupd is root: the compiler gets cfg_.uid
  std::string description_;
};

}  // namespace syrup
