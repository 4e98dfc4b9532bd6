#include "compiler.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>
#include <string_view>
#include <vector>

#include "digest.h"
#include "log.h"
#include "pins.h"
#include "unique_fd.h"

namespace syrup {
namespace fs = std::filesystem;
namespace {

// `include` and `hooks` name <kernel_dir>/include and <kernel_dir>/hooks: by path in the
// compiler's identity, as the sandbox passes them to the compiler (Sandbox::fd_dir_arg).
std::vector<std::string> clang_flags(const CompilerConfig& c, const std::string& hook_define,
                                     const std::string& include, const std::string& hooks) {
  return {"-g", "-O2", "-target", "bpf", "-mcpu=v3", "-D__TARGET_ARCH_x86",
          hook_define.empty() ? "-D__SYRUP_BPF__" : "-D" + hook_define, "-I" + include, "-I" + hooks,
          "-I" + c.multiarch_include, "-Wall", "-Wno-unused-function",
          "-fno-color-diagnostics", "-fno-crash-diagnostics"};
}

// The hook's part of <syrup/policy.h>: policy_input.h beside its wrapper
// (kernel/hooks/<hook>/).
std::string policy_input(const std::string& wrapper) {
  return fs::path(wrapper).parent_path() / "policy_input.h";
}

// The whole file; "" (and *ok false) when it cannot be opened.
std::string read_file(const fs::path& p, bool* ok = nullptr) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  if (ok) *ok = static_cast<bool>(in);
  return ss.str();
}

// What changes when a file is written or replaced: its device, inode, size, mtime and
// ctime; "" if it cannot be stat'ed.
std::string file_stamp(const fs::path& p) {
  struct stat st {};
  if (stat(p.c_str(), &st) != 0) return "";
  std::ostringstream ss;
  ss << "dev=" << st.st_dev << " ino=" << st.st_ino << " size=" << st.st_size
     << " mtime=" << st.st_mtim.tv_sec << '.' << st.st_mtim.tv_nsec << " ctime=" << st.st_ctim.tv_sec
     << '.' << st.st_ctim.tv_nsec;
  return ss.str();
}

}  // namespace

// `clang --version`, run once per clang binary: its output is kept in
// <cache_dir>/compiler-version under a stamp of the binary (its real path, device, inode,
// size, mtime and ctime), and a start whose clang has the same stamp reads it from there.
// Starting clang costs 3 s in an emulated guest, which a restarted syrupd spent before
// adopting anything. A package upgrade replaces the binary and so changes the stamp. A
// script (a wrapper that picks the compiler when run) is run every time: its stamp says
// nothing about the compiler it starts.
int Compiler::compiler_version(std::string& version) {
  version_from_cache_ = false;
  std::string stamp;
  std::error_code ec;
  fs::path real = fs::canonical(cfg_.clang, ec);
  char magic[2] = {};
  std::ifstream(real, std::ios::binary).read(magic, 2);
  std::string binary = ec ? "" : file_stamp(real);
  if (!binary.empty() && !(magic[0] == '#' && magic[1] == '!'))
    stamp = "syrup compiler stamp 1 " + real.string() + " " + binary + '\n';
  std::string path = cfg_.cache_dir + "/compiler-version";
  if (!stamp.empty()) {
    std::string kept = read_file(path);
    if (kept.size() > stamp.size() && kept.compare(0, stamp.size(), stamp) == 0) {
      version = kept.substr(stamp.size());
      version_from_cache_ = true;
      return 0;
    }
  }
  // As long as a compile may take: on a loaded machine (or an emulated one) starting
  // clang alone can take seconds.
  SandboxRun sr;
  int r = sandbox_.run({"--version"}, "", cfg_.timeout_ms, nullptr, sr);
  version = sr.out + sr.err;
  if (r == 0 && sr.status != 0) r = sr.status;
  if (r != 0 || stamp.empty() || version.empty()) return r;
  // Written to a name of this process's and renamed: another syrupd sharing the cache
  // reads either the old record or the new one. Not keeping it only costs the next start.
  std::string tmp = path + ".tmp." + std::to_string(getpid());
  std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
  out << stamp << version;
  out.close();
  if (!out || rename(tmp.c_str(), path.c_str()) != 0) unlink(tmp.c_str());
  return 0;
}

int Compiler::init(const CompilerConfig& cfg, std::string& error) {
  cfg_ = cfg;
  if (access(cfg_.clang.c_str(), X_OK) != 0) {
    error = "policy compiler '" + cfg_.clang + "' is not an executable (install clang-19 or set --clang)";
    return -ENOENT;
  }
  if (access((cfg_.kernel_dir + "/include/syrup/policy.h").c_str(), R_OK) != 0) {
    error = "policy header not found under '" + cfg_.kernel_dir + "/include' (set --kernel_dir)";
    return -ENOENT;
  }
  std::string inc = cfg_.kernel_dir + "/include", hooks = cfg_.kernel_dir + "/hooks";
  SandboxConfig sc{cfg_.clang, {inc, hooks}, {"/usr/include", cfg_.multiarch_include}, cfg_.uid,
                   cfg_.memory_bytes, cfg_.cpu_seconds, cfg_.allow_unconfined};
  if (int r = sandbox_.init(sc, error)) return r;
  for (auto* sub : {"/obj"}) {
    std::error_code ec;
    fs::create_directories(cfg_.cache_dir + sub, ec);
    if (ec) {
      error = "cannot create cache directory " + cfg_.cache_dir + sub + ": " + ec.message();
      return -ec.value();
    }
  }
  std::string version;
  int r = compiler_version(version);
  if (r != 0) {
    error = "'" + cfg_.clang + " --version' failed: " + version;
    return -ENOEXEC;
  }
  // Identity: compiler version, flags and every header a policy can pull in from us.
  toolchain_ = version;
  for (auto& f : clang_flags(cfg_, "", inc, hooks)) toolchain_ += f + '\n';
  watch_fd_.reset(inotify_init1(IN_NONBLOCK | IN_CLOEXEC));
  identity();
  trim_cache(cfg_.cache_max_bytes ? cfg_.cache_max_bytes : UINT64_MAX);
  log(sandbox_.confined() ? LogLevel::kInfo : LogLevel::kWarn, "policy compiler: %s (%s%s), headers from %s; sandbox: %s",
      cfg_.clang.c_str(), version.substr(0, version.find('\n')).c_str(),
      version_from_cache_ ? "; version from the cache, the binary is unchanged" : "", cfg_.kernel_dir.c_str(),
      sandbox_.description().c_str());
  return 0;
}

int Compiler::compile_own(const std::string& file, const std::string& what, std::string& object_path,
                          std::string& err) {
  std::string path = cfg_.kernel_dir + "/hooks/" + file;
  bool ok = false;
  std::string source = read_file(path, &ok);
  if (!ok) {
    err = "cannot read " + what + " " + path;
    return -ENOENT;
  }
  CompileResult cr = compile({source, path, "", ""});
  if (cr.err) {
    err = what + " does not compile:\n" + cr.diagnostics;
    return cr.err;
  }
  object_path = cr.object_path;
  return 0;
}

std::vector<fs::path> Compiler::headers() const {
  std::vector<fs::path> headers;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(cfg_.kernel_dir, ec), end; !ec && it != end; it.increment(ec))
    if (it->is_regular_file(ec) && it->path().extension() == ".h") headers.push_back(it->path());
  std::sort(headers.begin(), headers.end());
  // The system headers <syrup/policy.h> pulls in are part of what a policy compiles to.
  for (const char* sys : {"linux/bpf.h", "bpf/bpf_helpers.h", "bpf/bpf_helper_defs.h", "bpf/bpf_endian.h"})
    headers.push_back(fs::path("/usr/include") / sys);
  return headers;
}

// The headers are hashed again only when one of them changed, found by their stamps, so
// objects cached before a header under --kernel_dir was edited are not served while
// syrupd runs. Stat'ing every header at every deploy cost 0.3 ms of a 1.6 ms warm deploy
// here; an inotify watch on the headers' directories tells instead whether anything there
// changed since the last look, for one read(). Without inotify (out of instances or
// watches) every call compares the stamps.
std::string Compiler::identity() const {
  std::lock_guard lock(identity_mu_);
  if (!identity_.empty() && watch_fd_) {
    bool changed = false;
    char buf[4096];
    while (read(watch_fd_.get(), buf, sizeof buf) > 0) changed = true;  // drains the events
    if (!changed) return identity_;
  }
  std::vector<fs::path> hs = headers();
  std::string stamps;
  for (auto& h : hs) stamps += h.string() + ' ' + file_stamp(h) + '\n';
  if (watch_fd_) {
    std::set<fs::path> dirs;  // a new subdirectory gets its watch here, at the rescan
    for (auto& h : hs) dirs.insert(h.parent_path());
    constexpr uint32_t kChanges = IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_CREATE | IN_DELETE |
                                  IN_MOVED_FROM | IN_MOVED_TO | IN_DELETE_SELF | IN_MOVE_SELF;
    for (auto& d : dirs)
      if (inotify_add_watch(watch_fd_.get(), d.c_str(), kChanges) < 0) watch_fd_.reset();
  }
  if (stamps != header_stamps_) {
    std::string id = toolchain_;
    for (auto& h : hs) id += h.string() + '\n' + read_file(h);
    if (!header_stamps_.empty())
      log(LogLevel::kInfo, "policy headers under %s changed: compiles use them from now on",
          cfg_.kernel_dir.c_str());
    identity_ = sha256_hex(id);
    header_stamps_ = std::move(stamps);
  }
  return identity_;
}

std::string Compiler::object_path(const CompileJob& job, const std::string& id, std::string* tu_out) const {
  // The display name is used verbatim in a #line directive: keep it a plain string on one
  // line (clang ends a line at \r too, and what followed would be a directive of its own).
  std::string shown;
  for (char c : job.display_name) {
    auto u = static_cast<unsigned char>(c);
    shown += (c == '"' || c == '\\' || u < 0x20 || u == 0x7f) ? '_' : c;
  }
  if (shown.empty()) shown = "policy.c";
  std::string tu = job.wrapper.empty()
                       ? "#line 1 \"" + shown + "\"\n" + job.source
                       : "#define SYR_HOOK_POLICY_INPUT \"" + policy_input(job.wrapper) +
                             "\"\n#include <syrup/policy.h>\n#line 1 \"" + shown + "\"\n" + job.source +
                             "\n#include \"" + job.wrapper + "\"\n";
  std::string key = sha256_hex(id + '\0' + job.hook_define + '\0' + tu);
  if (tu_out) *tu_out = std::move(tu);
  return cfg_.cache_dir + "/obj/" + key + ".o";
}

bool Compiler::cached(const CompileJob& job) const {
  return access(key(job).c_str(), R_OK) == 0;
}

// A header edited while clang runs leaves an object that may reflect either version (or
// both), and the key computed before the compile names the old one: such an object is
// not stored, and the compile runs again against the headers as they are now.
CompileResult Compiler::compile(const CompileJob& job) {
  constexpr int kAttempts = 3;
  for (int attempt = 1;; ++attempt) {
    std::string id = identity(), tu, obj = object_path(job, id, &tu);
    CompileResult res;
    // A hit renews the object's mtime: the cache is trimmed least recently used first (a
    // read-only cache still serves its objects).
    if (utimensat(AT_FDCWD, obj.c_str(), nullptr, 0) == 0 || access(obj.c_str(), R_OK) == 0) {
      res.object_path = obj;
      res.cached = true;
      return res;
    }
    std::string tmp;
    res.err = run_clang(job, tu, obj, tmp, res.diagnostics);
    // A header that changed under clang: its object, or its diagnostics (-EINVAL), may be
    // of a half-written header, neither the policy's nor the headers' as they now are. A
    // timeout or a cancelled compile is not retried.
    if ((!res.err || res.err == -EINVAL) && identity() != id) {
      if (!res.err) unlink(tmp.c_str());
      if (attempt == kAttempts) {
        res.err = -EAGAIN;
        res.diagnostics = "syrupd: the policy headers under " + cfg_.kernel_dir + " changed during each of " +
                          std::to_string(kAttempts) + " compiles; deploy again once they are written";
        return res;
      }
      log(LogLevel::kInfo, "policy headers under %s changed during a compile of %s: compiling it again",
          cfg_.kernel_dir.c_str(), job.display_name.c_str());
      continue;
    }
    if (res.err) return res;
    struct stat st{};
    stat(tmp.c_str(), &st);
    if (rename(tmp.c_str(), obj.c_str()) < 0) {
      res.err = -errno;
      unlink(tmp.c_str());
      res.diagnostics = "syrupd: cannot store compiled object: " + std::string(std::strerror(errno));
      return res;
    }
    stored(static_cast<uint64_t>(st.st_size));
    res.object_path = obj;
    return res;
  }
}

void Compiler::stored(uint64_t bytes) {
  uint64_t now = cache_bytes_ += bytes;
  if (cfg_.cache_max_bytes && now > cfg_.cache_max_bytes) trim_cache(cfg_.cache_max_bytes / 10 * 9);
}

void Compiler::trim_cache(uint64_t target) {
  std::lock_guard<std::mutex> lock(cache_mu_);
  using Clock = fs::file_time_type::clock;
  const auto now = Clock::now();
  // Used (or stored) within the last minute: a deploy may be about to load it. A
  // temporary older than a whole compile is a killed syrupd's, not a running clang's.
  const auto in_use = now - std::chrono::minutes(1);
  const auto stale = now - std::chrono::milliseconds(cfg_.timeout_ms) - std::chrono::minutes(1);
  struct Entry {
    fs::file_time_type used;
    uint64_t bytes;
    fs::path path;
  };
  std::vector<Entry> objects;
  uint64_t total = 0, removed_bytes = 0;
  size_t removed = 0, temporaries = 0;
  std::error_code ec;
  for (const char* sub : {"/obj", "/src"})
    for (auto& e : fs::directory_iterator(cfg_.cache_dir + sub, ec)) {
      std::error_code fe;
      if (!e.is_regular_file(fe)) continue;
      auto used = e.last_write_time(fe);
      uint64_t bytes = e.file_size(fe);
      if (fe) continue;  // removed meanwhile by another syrupd sharing the cache
      bool object = std::string_view(sub) == "/obj" && e.path().extension() == ".o";
      if (!object) {
        if (used < stale && fs::remove(e.path(), fe)) temporaries++;
        continue;
      }
      total += bytes;
      if (used < in_use) objects.push_back({used, bytes, e.path()});
    }
  std::sort(objects.begin(), objects.end(), [](const Entry& a, const Entry& b) { return a.used < b.used; });
  for (auto& o : objects) {
    if (total <= target) break;
    std::error_code fe;
    if (!fs::remove(o.path, fe)) continue;
    total -= o.bytes;
    removed_bytes += o.bytes;
    removed++;
  }
  cache_bytes_ = total;
  cache_evictions_ += removed;
  if (removed)
    log(LogLevel::kInfo,
        "compile cache %s/obj over %llu bytes: removed the %zu objects used least recently (%llu bytes); it "
        "holds %llu bytes",
        cfg_.cache_dir.c_str(), static_cast<unsigned long long>(cfg_.cache_max_bytes), removed,
        static_cast<unsigned long long>(removed_bytes), static_cast<unsigned long long>(total));
  if (temporaries)
    log(LogLevel::kInfo, "compile cache %s: removed %zu temporary files of compiles that did not finish",
        cfg_.cache_dir.c_str(), temporaries);
}

int Compiler::run_clang(const CompileJob& job, const std::string& tu, const std::string& obj, std::string& tmp,
                        std::string& diagnostics) {
  auto args = clang_flags(cfg_, job.hook_define, sandbox_.fd_dir_arg(0), sandbox_.fd_dir_arg(1));
  args.insert(args.end(), {"-c", "-x", "c", "-", "-o", "-"});
  SandboxRun sr;
  if (int r = sandbox_.run(args, tu, cfg_.timeout_ms, &cancel_, sr)) {
    diagnostics = "syrupd: error: cannot run the policy compiler " + cfg_.clang + ": " + std::strerror(-r);
    return r;
  }
  diagnostics = sandbox_.readable(std::move(sr.err));
  if (sr.err_over)
    diagnostics += "\nsyrupd: the compiler's messages are cut at " + std::to_string(Sandbox::kMaxDiagnostics >> 10) +
                   " KiB\n";
  // Each limit is named: the error says which one stopped the compile and how to lift it.
  auto stopped = [&](int err, const std::string& why) {
    diagnostics += "\nsyrupd: error: the policy compiler " + why + "\n";
    return err;
  };
  if (sr.canceled) return stopped(-ECANCELED, "was stopped: syrupd is shutting down");
  if (sr.timed_out)
    return stopped(-ETIMEDOUT, "did not finish in " + std::to_string(cfg_.timeout_ms / 1000) + " s and was stopped");
  if (sr.cpu_limit)
    return stopped(-ETIMEDOUT, "used its CPU time limit of " + std::to_string(cfg_.cpu_seconds) +
                                   " s and was stopped (syrupd --compile_cpu_seconds)");
  if (sr.out_over)
    return stopped(-EFBIG, "wrote an object over the limit of " + std::to_string(Sandbox::kMaxOutput >> 20) +
                               " MiB and was stopped");
  bool oom = diagnostics.find("out of memory") != std::string::npos ||
             diagnostics.find("Allocation failed") != std::string::npos ||
             diagnostics.find("bad_alloc") != std::string::npos;
  if (sr.status != 0 && oom)
    return stopped(-ENOMEM, "ran out of its memory limit of " + std::to_string(cfg_.memory_bytes >> 20) +
                                " MiB and was stopped (syrupd --compile_memory_mb)");
  if (sr.status > 128)
    return stopped(-EINVAL, std::string("was killed by signal ") + strsignal(sr.status - 128) +
                                " (memory limit " + std::to_string(cfg_.memory_bytes >> 20) + " MiB)");
  if (sr.status != 0) {
    if (diagnostics.empty()) diagnostics = "syrupd: error: the policy compiler failed with status " + std::to_string(sr.status);
    return -EINVAL;
  }
  if (sr.out.empty()) return stopped(-EINVAL, "wrote no object");
  // A name of this compile's own: another thread may be compiling the same source.
  tmp = obj + ".tmp." + std::to_string(getpid()) + "." + std::to_string(seq_++);
  UniqueFd fd(open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
  bool ok = static_cast<bool>(fd);
  for (size_t off = 0; ok && off < sr.out.size();) {
    ssize_t n = write(fd.get(), sr.out.data() + off, sr.out.size() - off);
    if (n < 0 && errno == EINTR) continue;
    ok = n > 0;
    off += ok ? static_cast<size_t>(n) : 0;
  }
  if (!ok || close(fd.release()) != 0) {
    int e = errno ? errno : EIO;
    unlink(tmp.c_str());
    diagnostics = "syrupd: cannot write " + tmp + ": " + std::strerror(e);
    return -EIO;
  }
  return 0;
}

}  // namespace syrup
