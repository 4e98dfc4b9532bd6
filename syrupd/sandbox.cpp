#include "sandbox.h"

#include <elf.h>
#include <fcntl.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

namespace syrup {
namespace fs = std::filesystem;
namespace {

// Landlock's ABI, as this kernel's uapi has it (the build machine's headers may be older).
constexpr uint64_t kFsExecute = 1ull << 0, kFsReadFile = 1ull << 2, kFsReadDir = 1ull << 3;
constexpr uint64_t kNetBindTcp = 1ull << 0, kNetConnectTcp = 1ull << 1;
constexpr uint64_t kScopeAbstractUnix = 1ull << 0, kScopeSignal = 1ull << 1;
constexpr uint32_t kCreateRulesetVersion = 1u << 0;
constexpr int kRulePathBeneath = 1;
struct RulesetAttr {
  uint64_t handled_access_fs, handled_access_net, scoped;
};
struct __attribute__((packed)) PathBeneathAttr {
  uint64_t allowed_access;
  int32_t parent_fd;
};

// Every filesystem right the ABI knows: the ones not granted by a rule are denied.
uint64_t handled_fs(int abi) {
  int bits = abi >= 5 ? 16 : abi >= 3 ? 15 : abi >= 2 ? 14 : 13;
  return (1ull << bits) - 1;
}

// The child's descriptors: 0 the translation unit, 1 the object, 2 diagnostics, then the
// header directories, then the compiler, then (until the Landlock domain is entered) the
// ruleset.
constexpr int kFirstDirFd = 3;

// Runs argv as syrupd (for the dynamic loader's --list at start): its stdout, or "" if
// it did not exit 0.
std::string capture(const std::vector<std::string>& argv) {
  int p[2];
  if (pipe2(p, O_CLOEXEC) < 0) return "";
  UniqueFd rd(p[0]), wr(p[1]);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, wr.get(), 1);
  posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
  std::vector<char*> args;
  for (auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  char* envp[] = {nullptr};
  pid_t pid;
  int r = posix_spawn(&pid, args[0], &fa, nullptr, args.data(), envp);
  posix_spawn_file_actions_destroy(&fa);
  if (r) return "";
  wr.reset();
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = read(rd.get(), buf, sizeof buf)) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 || out.size() > (1u << 20)) break;
    out.append(buf, static_cast<size_t>(n));
  }
  rd.reset();
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? out : "";
}

// The ELF program interpreter of `path` ("" for a static binary), or why it is no ELF
// executable.
int elf_interpreter(const std::string& path, std::string& interp, std::string& why) {
  std::ifstream f(path, std::ios::binary);
  Elf64_Ehdr eh{};
  if (!f.read(reinterpret_cast<char*>(&eh), sizeof eh) || std::memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0 ||
      eh.e_ident[EI_CLASS] != ELFCLASS64) {
    why = "is not a 64-bit ELF executable (a script cannot be confined: name the compiler binary)";
    return -ENOEXEC;
  }
  for (unsigned i = 0; i < eh.e_phnum; i++) {
    Elf64_Phdr ph{};
    f.seekg(static_cast<std::streamoff>(eh.e_phoff + uint64_t{i} * eh.e_phentsize));
    if (!f.read(reinterpret_cast<char*>(&ph), sizeof ph)) break;
    if (ph.p_type != PT_INTERP || ph.p_filesz == 0 || ph.p_filesz > 4096) continue;
    interp.resize(ph.p_filesz);
    f.seekg(static_cast<std::streamoff>(ph.p_offset));
    if (!f.read(interp.data(), static_cast<std::streamsize>(ph.p_filesz))) break;
    interp.resize(std::strlen(interp.c_str()));
    return 0;
  }
  interp.clear();
  return 0;
}

// The shared libraries the dynamic loader `interp` maps for `binary` (ld.so --list).
std::vector<std::string> shared_libraries(const std::string& interp, const std::string& binary) {
  std::vector<std::string> libs;
  std::istringstream in(capture({interp, "--list", binary}));
  for (std::string line; std::getline(in, line);) {
    // "\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)", "\t/lib64/ld-linux-x86-64.so.2 (0x...)"
    size_t at = line.find("=> /");
    at = at != std::string::npos ? at + 3 : line.find_first_not_of(" \t");
    if (at == std::string::npos || line[at] != '/') continue;
    std::string path = line.substr(at);
    path = path.substr(0, path.find(" ("));
    libs.push_back(path);
  }
  return libs;
}

std::vector<sock_filter> seccomp_program() {
  // Refused with EACCES: making sockets (no network, no local services), io_uring (which
  // can make sockets past this filter), and reaching into other processes or the kernel.
  const int denied[] = {SYS_socket, SYS_socketpair, SYS_io_uring_setup, SYS_io_uring_enter,
                        SYS_io_uring_register, SYS_ptrace, SYS_process_vm_readv, SYS_process_vm_writev,
                        SYS_bpf, SYS_perf_event_open, SYS_userfaultfd, SYS_unshare, SYS_setns,
                        SYS_mount, SYS_keyctl, SYS_add_key, SYS_request_key};
  constexpr size_t n = std::size(denied);
  std::vector<sock_filter> p;
#if defined(__x86_64__)
  constexpr uint32_t arch = AUDIT_ARCH_X86_64;
#elif defined(__aarch64__)
  constexpr uint32_t arch = AUDIT_ARCH_AARCH64;
#else
#error "the compiler sandbox's seccomp filter knows x86_64 and aarch64"
#endif
  p.push_back(BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, arch)));
  p.push_back(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, arch, 1, 0));
  p.push_back(BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS));
  p.push_back(BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)));
  // Each check jumps to the refusal after the allow: n checks (and x32's) stand between.
#if defined(__x86_64__)
  p.push_back(BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, 0x40000000u /* __X32_SYSCALL_BIT */, static_cast<uint8_t>(n + 1), 0));
#endif
  for (size_t i = 0; i < n; i++)
    p.push_back(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, static_cast<uint32_t>(denied[i]), static_cast<uint8_t>(n - i), 0));
  p.push_back(BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW));
  p.push_back(BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EACCES & SECCOMP_RET_DATA)));
  return p;
}

// The child's side of run(): raw system calls only (the parent is multi-threaded).
struct ChildPlan {
  int moves[16];  // source descriptors, in target order 0, 1, 2, ...
  int n_moves;
  int clang_slot, ruleset_slot;  // -1: none
  bool switch_uid;
  uid_t uid;
  pid_t parent;
  const rlimit* limits;
  const int* limit_ids;
  int n_limits;
  const sock_fprog* filter;
  char* const* argv;
  char* const* envp;
};

[[noreturn]] void child_fail(const char* what, int err) {
  char msg[160];
  size_t n = 0;
  auto put = [&](const char* s) {
    while (*s && n < sizeof msg - 2) msg[n++] = *s++;
  };
  put("syrupd: error: cannot start the policy compiler in its sandbox: ");
  put(what);
  put(" failed (errno ");
  char num[12];
  int k = 0;
  do num[k++] = static_cast<char>('0' + err % 10); while ((err /= 10) && k < 11);
  while (k) msg[n < sizeof msg - 2 ? n++ : n] = num[--k];
  put(")");
  msg[n++] = '\n';
  syscall(SYS_write, 2, msg, n);
  syscall(SYS_exit_group, 127);
  __builtin_unreachable();
}

[[noreturn]] void child(const ChildPlan& p) {
  syscall(SYS_setpgid, 0, 0);
  // Every descriptor the compiler gets is first copied out of the way of the targets.
  int high[16];
  for (int i = 0; i < p.n_moves; i++)
    if ((high[i] = static_cast<int>(syscall(SYS_fcntl, p.moves[i], F_DUPFD, 64))) < 0) child_fail("fcntl", errno);
  for (int i = 0; i < p.n_moves; i++)
    if (syscall(SYS_dup2, high[i], i) < 0) child_fail("dup2", errno);
  syscall(SYS_close_range, p.n_moves, ~0u, 0);
  for (int i = 0; i < p.n_limits; i++)
    if (syscall(SYS_prlimit64, 0, p.limit_ids[i], &p.limits[i], nullptr) < 0) child_fail("setrlimit", errno);
  if (p.switch_uid) {
    for (int cap = 0; cap < 64; cap++) syscall(SYS_prctl, PR_CAPBSET_DROP, cap, 0, 0, 0);
    if (syscall(SYS_setgroups, 0, nullptr) < 0) child_fail("setgroups", errno);
    if (syscall(SYS_setresgid, p.uid, p.uid, p.uid) < 0) child_fail("setresgid", errno);
    if (syscall(SYS_setresuid, p.uid, p.uid, p.uid) < 0) child_fail("setresuid", errno);
  }
  // After the uid change, which clears it. syrupd may have died before this call: then
  // this process was handed to another parent and must not go on.
  if (syscall(SYS_prctl, PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) < 0) child_fail("PR_SET_PDEATHSIG", errno);
  if (syscall(SYS_getppid) != p.parent) syscall(SYS_exit_group, 127);
  if (syscall(SYS_prctl, PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) child_fail("PR_SET_NO_NEW_PRIVS", errno);
  if (syscall(SYS_chdir, "/") < 0) child_fail("chdir", errno);
  if (p.ruleset_slot >= 0) {
    if (syscall(SYS_landlock_restrict_self, p.ruleset_slot, 0) < 0) child_fail("landlock_restrict_self", errno);
    syscall(SYS_close, p.ruleset_slot);
  }
  if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, p.filter) < 0) child_fail("seccomp", errno);
  syscall(SYS_execveat, p.clang_slot, "", p.argv, p.envp, AT_EMPTY_PATH);
  child_fail("execveat", errno);
}

void kill_group(pid_t pid) {
  kill(-pid, SIGKILL);
  kill(pid, SIGKILL);
}

}  // namespace

int Sandbox::init(const SandboxConfig& cfg, std::string& error) {
  cfg_ = cfg;
  description_.clear();
  ruleset_fd_.reset();
  dir_fds_.clear();
  switch_uid_ = geteuid() == 0 && cfg_.uid != 0;
  clang_fd_.reset(open(cfg_.clang.c_str(), O_PATH | O_CLOEXEC));
  if (!clang_fd_) {
    int e = errno;
    error = "policy compiler '" + cfg_.clang + "': " + std::strerror(e);
    return -e;
  }
  for (auto& d : cfg_.fd_dirs) {
    dir_fds_.emplace_back(open(d.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    if (!dir_fds_.back()) {
      int e = errno;
      error = "policy headers '" + d + "': " + std::strerror(e);
      return -e;
    }
  }
  filter_ = seccomp_program();

  // Why compiles cannot be confined by Landlock here ("": they can).
  std::string why;
  std::error_code ec;
  std::string real = fs::canonical(cfg_.clang, ec).string();
  std::string interp;
  if (ec) why = "cannot resolve '" + cfg_.clang + "': " + ec.message();
  else if (elf_interpreter(real, interp, why) == 0) why.clear();
  else why = "'" + real + "' " + why;
  long abi = syscall(SYS_landlock_create_ruleset, nullptr, 0, kCreateRulesetVersion);
  if (why.empty() && abi < 1)
    why = std::string("Landlock is not available (") + std::strerror(errno) +
          "; it needs Linux 5.13 with CONFIG_SECURITY_LANDLOCK and landlock in the lsm= list)";

  if (why.empty()) {
    RulesetAttr attr{handled_fs(static_cast<int>(abi)), abi >= 4 ? kNetBindTcp | kNetConnectTcp : 0,
                     abi >= 6 ? kScopeAbstractUnix | kScopeSignal : 0};
    size_t size = abi >= 6 ? sizeof attr : abi >= 4 ? 2 * sizeof(uint64_t) : sizeof(uint64_t);
    ruleset_fd_.reset(static_cast<int>(syscall(SYS_landlock_create_ruleset, &attr, size, 0)));
    if (!ruleset_fd_) why = std::string("cannot create a Landlock ruleset: ") + std::strerror(errno);
  }
  // Read-only trees, the compiler binary and its loader (executable), its libraries.
  auto allow = [&](int fd, uint64_t access, const std::string& what) {
    PathBeneathAttr pb{access, fd};
    if (syscall(SYS_landlock_add_rule, ruleset_fd_.get(), kRulePathBeneath, &pb, 0) == 0) return true;
    why = "cannot add a Landlock rule for " + what + ": " + std::strerror(errno);
    ruleset_fd_.reset();
    return false;
  };
  auto allow_path = [&](const std::string& path, uint64_t access, bool dir) {
    UniqueFd fd(open(path.c_str(), O_PATH | O_CLOEXEC | (dir ? O_DIRECTORY : 0)));
    if (!fd) return true;  // nothing there to allow (e.g. no multiarch directory)
    return allow(fd.get(), access, path);
  };
  if (ruleset_fd_) {
    constexpr uint64_t kTree = kFsReadFile | kFsReadDir;
    // The compiler's own tree (/usr/lib/llvm-19 for .../bin/clang: its libraries and its
    // resource directory of builtin headers); a compiler straight in /usr/bin (or
    // /usr/local/bin) gets only <prefix>/lib/clang, where such an install keeps its
    // resource directories, not the whole prefix.
    fs::path bin = fs::path(real).parent_path(), tree = bin.parent_path();
    if (bin.filename() != "bin" || tree == "/" || tree == "/usr" || tree == "/usr/local") tree = tree / "lib/clang";
    std::vector<std::pair<std::string, uint64_t>> files = {{real, kFsExecute | kFsReadFile},
                                                           {"/etc/ld.so.cache", kFsReadFile}};
    if (!interp.empty()) {
      files.push_back({interp, kFsExecute | kFsReadFile});
      auto libs = shared_libraries(interp, real);
      if (libs.empty()) why = "'" + interp + " --list " + real + "' named no libraries";
      for (auto& l : libs) files.push_back({l, kFsReadFile});
    }
    bool ok = why.empty();
    for (size_t i = 0; ok && i < dir_fds_.size(); i++) ok = allow(dir_fds_[i].get(), kTree, cfg_.fd_dirs[i]);
    for (auto& d : cfg_.read_dirs)
      if (ok) ok = allow_path(d, kTree, true);
    if (ok) ok = allow_path(tree.string(), kTree, true);
    for (auto& [f, access] : files)
      if (ok) ok = allow_path(f, access, false);
    if (!ok) ruleset_fd_.reset();
  }

  std::string who = switch_uid_ ? "uid " + std::to_string(cfg_.uid) : "syrupd's own uid";
  std::string limits = std::to_string(cfg_.cpu_seconds) + " s CPU, " + std::to_string(cfg_.memory_bytes >> 20) +
                       " MiB address space";
  if (!why.empty()) {
    if (!cfg_.allow_unconfined) {
      error = "the policy compiler cannot be confined: " + why +
              ". syrupd will not compile tenants' sources with access to every file its compiler uid can "
              "read; fix that, or start syrupd with --allow_unconfined_compiler to accept it";
      return -EPERM;
    }
    description_ = "UNCONFINED (--allow_unconfined_compiler: " + why + "); as " + who + ", " + limits +
                   ", no sockets";
    return 0;
  }
  description_ = "Landlock ABI " + std::to_string(abi) + " (headers, the compiler and its libraries read-only; " +
                 (abi >= 4 ? "no TCP" : "no TCP rules before ABI 4") + "), as " + who + ", " + limits +
                 ", no sockets";
  return 0;
}

std::string Sandbox::fd_dir_arg(size_t i) const { return "/proc/self/fd/" + std::to_string(kFirstDirFd + i); }

std::string Sandbox::readable(std::string text) const {
  for (size_t i = 0; i < cfg_.fd_dirs.size(); i++) {
    const std::string from = fd_dir_arg(i), to = cfg_.fd_dirs[i];
    for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at)) {
      // /proc/self/fd/3 is not /proc/self/fd/31.
      if (at + from.size() < text.size() && std::isdigit(static_cast<unsigned char>(text[at + from.size()]))) {
        at += from.size();
        continue;
      }
      text.replace(at, from.size(), to);
      at += to.size();
    }
  }
  return text;
}

int Sandbox::run(const std::vector<std::string>& args, const std::string& input, int timeout_ms,
                 const std::atomic<bool>* cancel, SandboxRun& r) const {
  r = SandboxRun{};
  UniqueFd in(static_cast<int>(syscall(SYS_memfd_create, "syrup-compile-input", MFD_CLOEXEC)));
  if (!in) return -errno;
  for (size_t off = 0; off < input.size();) {
    ssize_t n = write(in.get(), input.data() + off, input.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return -errno;
    off += static_cast<size_t>(n);
  }
  if (lseek(in.get(), 0, SEEK_SET) < 0) return -errno;
  int po[2], pe[2];
  if (pipe2(po, O_CLOEXEC | O_NONBLOCK) < 0) return -errno;
  UniqueFd out_r(po[0]), out_w(po[1]);
  if (pipe2(pe, O_CLOEXEC | O_NONBLOCK) < 0) return -errno;
  UniqueFd err_r(pe[0]), err_w(pe[1]);
  // The child's ends block: the compiler writes as much as it likes, the parent bounds it.
  fcntl(out_w.get(), F_SETFL, 0);
  fcntl(err_w.get(), F_SETFL, 0);

  // Everything the child uses is made here, before fork.
  std::vector<std::string> strs = {cfg_.clang};
  strs.insert(strs.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& s : strs) argv.push_back(const_cast<char*>(s.c_str()));
  argv.push_back(nullptr);
  // Not syrupd's environment: nothing of it reaches the compiler (nor, through
  // /proc/self/environ, its diagnostics).
  char env_path[] = "PATH=/usr/bin:/bin", env_lc[] = "LC_ALL=C";
  char* envp[] = {env_path, env_lc, nullptr};
  const rlim_t cpu = cfg_.cpu_seconds;
  const rlimit limits[] = {{cpu, cpu + 1},  // SIGXCPU, then SIGKILL a second later
                           {cfg_.memory_bytes, cfg_.memory_bytes},
                           {64, 64},                    // descriptors
                           {kMaxOutput, kMaxOutput},    // file size (it has no writable file)
                           {0, 0},                      // core dumps
                           {0, 0}};                     // locked memory
  const int limit_ids[] = {RLIMIT_CPU, RLIMIT_AS, RLIMIT_NOFILE, RLIMIT_FSIZE, RLIMIT_CORE, RLIMIT_MEMLOCK};
  sock_fprog prog{static_cast<unsigned short>(filter_.size()), const_cast<sock_filter*>(filter_.data())};
  ChildPlan plan{};
  plan.n_moves = 0;
  plan.moves[plan.n_moves++] = in.get();
  plan.moves[plan.n_moves++] = out_w.get();
  plan.moves[plan.n_moves++] = err_w.get();
  for (auto& d : dir_fds_) plan.moves[plan.n_moves++] = d.get();
  plan.clang_slot = plan.n_moves;
  plan.moves[plan.n_moves++] = clang_fd_.get();
  plan.ruleset_slot = -1;
  if (ruleset_fd_) {
    plan.ruleset_slot = plan.n_moves;
    plan.moves[plan.n_moves++] = ruleset_fd_.get();
  }
  plan.switch_uid = switch_uid_;
  plan.uid = cfg_.uid;
  plan.parent = getpid();
  plan.limits = limits;
  plan.limit_ids = limit_ids;
  plan.n_limits = static_cast<int>(std::size(limits));
  plan.filter = &prog;
  plan.argv = argv.data();
  plan.envp = envp;

  pid_t pid = fork();
  if (pid < 0) return -errno;
  if (pid == 0) child(plan);
  out_w.reset();
  err_w.reset();
  in.reset();
  UniqueFd pidfd(static_cast<int>(syscall(SYS_pidfd_open, pid, 0)));

  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  char buf[65536];
  UniqueFd* pipes[2] = {&out_r, &err_r};
  // Reads what pipe i holds now: false once it is at its end (closed) or the object passed
  // its bound.
  auto pump = [&](int i) {
    for (;;) {
      ssize_t n = read(pipes[i]->get(), buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno == EAGAIN) return true;
      if (n <= 0) {
        pipes[i]->reset();
        return false;
      }
      std::string& to = i == 0 ? r.out : r.err;
      size_t cap = i == 0 ? kMaxOutput : kMaxDiagnostics;
      size_t take = std::min(static_cast<size_t>(n), cap - std::min(cap, to.size()));
      to.append(buf, take);
      if (take < static_cast<size_t>(n)) (i == 0 ? r.out_over : r.err_over) = true;
      if (r.out_over) return false;
    }
  };
  for (;;) {
    int left = static_cast<int>(
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count());
    r.canceled = cancel && cancel->load();
    if (left <= 0 || r.canceled) {
      r.timed_out = !r.canceled;
      kill_group(pid);
      break;
    }
    pollfd p[3] = {{out_r.get(), POLLIN, 0}, {err_r.get(), POLLIN, 0}, {pidfd.get(), POLLIN, 0}};
    int pr = poll(p, 3, cancel ? std::min(left, 100) : left);
    if (pr < 0 && errno != EINTR) {
      kill_group(pid);
      break;
    }
    if (pr <= 0) continue;
    for (int i = 0; i < 2; i++)
      if (p[i].revents && *pipes[i]) pump(i);
    if (r.out_over) {
      kill_group(pid);
      break;
    }
    // Exited (or, without a pidfd on an old kernel, both pipes at their end): what is
    // left in the pipes is read; a pipe still open then is held by something the
    // compiler started, which goes with it.
    if (p[2].revents || (!pidfd && !out_r && !err_r)) {
      for (int i = 0; i < 2; i++)
        if (*pipes[i]) pump(i);
      if (r.out_over || out_r || err_r) kill_group(pid);
      break;
    }
  }
  // Whatever the compiler started in its process group goes with it (the group is still
  // its own: the compiler is not reaped yet).
  kill(-pid, SIGKILL);
  int status = 0;
  rusage ru{};
  while (wait4(pid, &status, 0, &ru) < 0 && errno == EINTR) {
  }
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  double cpu_used = static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
                    static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
  r.cpu_limit = WIFSIGNALED(status) && !r.timed_out && !r.canceled &&
                (WTERMSIG(status) == SIGXCPU || (WTERMSIG(status) == SIGKILL && cpu_used >= cfg_.cpu_seconds));
  return 0;
}

}  // namespace syrup
