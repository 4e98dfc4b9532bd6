#include "loader.h"

#include <bpf/bpf.h>
#include <fcntl.h>
#include <gelf.h>
#include <libelf.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdarg>
#include <cstring>

#include "bpf_rodata.h"
#include "log.h"
#include "names.h"
#include "pins.h"
#include "syrup/abi.h"

namespace syrup {
namespace {

thread_local std::string* g_capture = nullptr;  // loads run on the main thread and on workers
thread_local int g_quiet = 0;      // LibbpfQuiet scopes open on this thread

int libbpf_print(enum libbpf_print_level level, const char* fmt, va_list ap) {
  char buf[8192];
  vsnprintf(buf, sizeof buf, fmt, ap);
  if (g_capture && level != LIBBPF_DEBUG) g_capture->append(buf);
  if (level == LIBBPF_DEBUG) return 0;
  // Without a capture (start-up, shutdown) libbpf's warnings still reach the log.
  if (!g_capture) {
    std::string line(buf);
    while (!line.empty() && line.back() == '\n') line.pop_back();
    log(g_quiet ? LogLevel::kDebug : LogLevel::kWarn, "%s", line.c_str());
  }
  return 0;
}

struct CaptureScope {
  explicit CaptureScope(std::string* s) { g_capture = s; }
  ~CaptureScope() { g_capture = nullptr; }
};

bool is_system_map(const char* name) {
  return std::strncmp(name, SYR_SYSTEM_PREFIX, std::strlen(SYR_SYSTEM_PREFIX)) == 0;
}

// The verifier's log, as libbpf printed it between its BEGIN/END markers.
std::string verifier_log(const std::string& captured) {
  const std::string begin = "-- BEGIN PROG LOAD LOG --", end = "-- END PROG LOAD LOG --";
  size_t b = captured.rfind(begin);
  if (b == std::string::npos) return {};
  b = captured.find('\n', b);
  size_t e = captured.find(end, b);
  if (b == std::string::npos) return {};
  return captured.substr(b + 1, e == std::string::npos ? std::string::npos : e - b - 1);
}

// The verifier's reason: the last line that is not statistics or a register dump.
std::string verifier_reason(const std::string& vlog) {
  std::string reason;
  size_t pos = 0;
  while (pos < vlog.size()) {
    size_t nl = vlog.find('\n', pos);
    std::string line = vlog.substr(pos, nl == std::string::npos ? std::string::npos : nl - pos);
    pos = nl == std::string::npos ? vlog.size() : nl + 1;
    static constexpr std::string_view kNoise[] = {
        "processed ", "verification time", "stack depth", "mark_precise", "old state", "cur state",
        "from ", "last_idx", "frame", "func#", "regs=", "parent ", "live regs", "Func#"};
    bool noise = line.empty() || std::isdigit(static_cast<unsigned char>(line[0])) ||
                 line[0] == ';' || line[0] == ' ';
    for (auto n : kNoise) noise = noise || line.starts_with(n);
    if (noise) continue;
    reason = line;
  }
  return reason;
}

// The instructions of every executable section of the ELF object at `path`.
int object_insns(const std::string& path, std::vector<bpf_insn>& out) {
  if (elf_version(EV_CURRENT) == EV_NONE) return -ENOTSUP;
  UniqueFd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return -errno;
  Elf* e = elf_begin(fd.get(), ELF_C_READ, nullptr);
  if (!e) return -EINVAL;
  for (Elf_Scn* scn = elf_nextscn(e, nullptr); scn; scn = elf_nextscn(e, scn)) {
    GElf_Shdr sh;
    if (!gelf_getshdr(scn, &sh) || sh.sh_type != SHT_PROGBITS || !(sh.sh_flags & SHF_EXECINSTR)) continue;
    for (Elf_Data* d = elf_getdata(scn, nullptr); d; d = elf_getdata(scn, d)) {
      auto* p = static_cast<const bpf_insn*>(d->d_buf);
      out.insert(out.end(), p, p + d->d_size / sizeof(bpf_insn));
    }
  }
  elf_end(e);
  return 0;
}

// A helper's name, from the UAPI header's list (for messages).
std::string helper_name(int id) {
#define SYR_HELPER_NAME(x) {BPF_FUNC_##x, "bpf_" #x}
  static const std::map<int, const char*> names = {__BPF_FUNC_MAPPER(SYR_HELPER_NAME)};
#undef SYR_HELPER_NAME
  auto it = names.find(id);
  return it == names.end() ? "BPF helper #" + std::to_string(id) : it->second;
}

}  // namespace

std::string tail_lines(const std::string& text, size_t max_lines) {
  size_t pos = text.size();
  if (pos && text[pos - 1] == '\n') pos--;
  size_t n = 0;
  while (pos > 0) {
    size_t nl = text.rfind('\n', pos - 1);
    if (nl == std::string::npos) return text;
    if (++n >= max_lines) return text.substr(nl + 1);
    pos = nl;
  }
  return text;
}

void loader_init() { libbpf_set_print(libbpf_print); }

LibbpfQuiet::LibbpfQuiet() { g_quiet++; }
LibbpfQuiet::~LibbpfQuiet() { g_quiet--; }

LoadedPolicy::~LoadedPolicy() {
  if (obj) bpf_object__close(obj);
}

int LoadedPolicy::map_fd(const char* name) const {
  if (!obj) {
    auto it = adopted_maps.find(name);
    return it == adopted_maps.end() ? -ENOENT : it->second.get();
  }
  bpf_map* m = bpf_object__find_map_by_name(obj, name);
  return m ? bpf_map__fd(m) : -ENOENT;
}

int adopt_policy(const std::string& app, int id, const std::vector<std::string>& user_maps,
                 const std::vector<std::string>& system_maps, std::unique_ptr<LoadedPolicy>& out,
                 std::string& err) {
  auto p = std::make_unique<LoadedPolicy>();
  p->app = app;
  p->policy_id = id;
  p->user_maps = user_maps;
  p->system_maps = system_maps;
  p->adopted_prog.reset(bpf_obj_get(pins::policy_prog(app, id).c_str()));
  if (!p->adopted_prog) {
    int e = errno;
    err = "its program is not pinned at " + pins::policy_prog(app, id) + ": " + std::strerror(e);
    return -e;
  }
  auto open_pin = [&](const std::string& name, const std::string& path) {
    UniqueFd fd(bpf_obj_get(path.c_str()));
    if (!fd) {
      int e = errno;
      err = "map " + name + " is not pinned at " + path + ": " + std::strerror(e);
      return -e;
    }
    p->adopted_maps[name] = std::move(fd);
    return 0;
  };
  for (auto& m : system_maps)
    if (int r = open_pin(m, pins::policy_map(app, id, m))) return r;
  for (auto& m : user_maps)
    if (int r = open_pin(m, pins::app_map(app, m))) return r;
  out = std::move(p);
  return 0;
}

void LoadedPolicy::unpin() {
  unlink(pins::policy_prog(app, policy_id).c_str());
  for (auto& m : system_maps) unlink(pins::policy_map(app, policy_id, m).c_str());
  rmdir(pins::policy_dir(app, policy_id).c_str());
}

int load_policy(const LoadSpec& spec, std::unique_ptr<LoadedPolicy>& out, LoadFailure& fail) {
  std::string captured;
  CaptureScope capture(&captured);
  auto p = std::make_unique<LoadedPolicy>();
  p->app = spec.app;
  p->policy_id = spec.policy_id;

  std::string objname = "syr_" + std::to_string(spec.policy_id);
  LIBBPF_OPTS(bpf_object_open_opts, oopts, .object_name = objname.c_str());
  p->obj = bpf_object__open_file(spec.object_path.c_str(), &oopts);
  if (!p->obj) {
    int e = -errno;
    p->obj = nullptr;
    fail.message = "cannot open the compiled policy: " + std::string(std::strerror(-e));
    fail.log = captured;
    return e;
  }

  int nprogs = 0;
  bpf_program* prog;
  bpf_object__for_each_program(prog, p->obj) {
    nprogs++;
    p->prog = prog;
  }
  if (!spec.programs.empty()) {
    p->prog = bpf_object__find_program_by_name(p->obj, spec.programs[0].c_str());
    for (auto& n : spec.programs)
      if (!bpf_object__find_program_by_name(p->obj, n.c_str())) p->prog = nullptr;
    if (p->prog && nprogs == static_cast<int>(spec.programs.size())) nprogs = 1;
  }
  if (nprogs != 1 || !p->prog) {
    fail.message = "policy " + spec.policy_name +
                   " defines BPF programs of its own (a policy is one SYR_POLICY function)";
    return -EINVAL;
  }

  // Read-only parameters.
  if (int r = set_rodata(p->obj, SYR_NUM_EXECUTORS_VAR, spec.num_executors); r) {
    fail.message = "compiled policy has no syr_num_executors (was it built with <syrup/policy.h>?)";
    return r;
  }
  for (auto& [name, value] : spec.params) {
    int r = set_rodata(p->obj, name, value);
    if (r == -ENOENT) {
      fail.message = "policy " + spec.policy_name + " has no parameter '" + name +
                     "' (declare it with SYR_PARAM)";
      return r;
    }
    if (r == -ERANGE) {
      fail.message = "value " + std::to_string(value) + " of parameter '" + name + "' does not fit its type";
      return r;
    }
    if (r) {
      fail.message = "parameter '" + name + "' is not an integer of 1, 2, 4 or 8 bytes";
      return r;
    }
  }

  // Application maps: shared by name through the application's pin directory.
  bpf_map* m;
  bpf_object__for_each_map(m, p->obj) {
    // A copy: bpf_map__reuse_fd() replaces the map's name string.
    std::string name_s = bpf_map__name(m);
    const char* name = name_s.c_str();
    if (bpf_map__is_internal(m)) continue;
    if (is_system_map(name)) {
      if (std::find(spec.system_maps.begin(), spec.system_maps.end(), name) == spec.system_maps.end()) {
        fail.message = std::string("map name '") + name + "' is reserved (names starting with syr_ belong to Syrup)";
        return -EINVAL;
      }
      if (auto it = spec.reuse_maps.find(name); it != spec.reuse_maps.end()) {
        if (int r = bpf_map__reuse_fd(m, it->second)) {
          fail.message = std::string("cannot share system map ") + name + ": " + std::strerror(-r);
          return r;
        }
      }
      p->system_maps.emplace_back(name);
      continue;
    }
    if (std::string why = names::check("map", name); !why.empty()) {
      fail.message = why;
      return -EINVAL;
    }
    if (int r = pins::make_dirs(pins::app_maps_dir(spec.app)); r) {
      fail.message = "cannot create " + pins::app_maps_dir(spec.app) + ": " + std::strerror(-r);
      return r;
    }
    bpf_map__set_pin_path(m, pins::app_map(spec.app, name).c_str());
    p->user_maps.emplace_back(name);
  }

  // What the policy may call and declare, checked before the verifier sees it.
  static const std::set<bpf_map_type> kUserMapTypes = {
      BPF_MAP_TYPE_ARRAY,       BPF_MAP_TYPE_HASH,     BPF_MAP_TYPE_PERCPU_ARRAY,
      BPF_MAP_TYPE_PERCPU_HASH, BPF_MAP_TYPE_LRU_HASH, BPF_MAP_TYPE_LRU_PERCPU_HASH,
      BPF_MAP_TYPE_QUEUE,       BPF_MAP_TYPE_STACK,    BPF_MAP_TYPE_RINGBUF};
  LoadFootprint fp;
  bpf_object__for_each_map(m, p->obj) {
    if (bpf_map__is_internal(m)) continue;
    std::string name = bpf_map__name(m);
    if (std::find(p->user_maps.begin(), p->user_maps.end(), name) == p->user_maps.end()) continue;
    if (!kUserMapTypes.count(bpf_map__type(m))) {
      fail.message = "map '" + name + "' is a " + libbpf_bpf_map_type_str(bpf_map__type(m)) +
                     " map; policies may declare array, hash, per-CPU, LRU, queue, stack and ring buffer maps";
      return -EPERM;
    }
    if (access(pins::app_map(spec.app, name).c_str(), F_OK) == 0) continue;  // shared, exists
    fp.new_maps.push_back(name);
    fp.new_map_bytes += uint64_t{bpf_map__key_size(m) + bpf_map__value_size(m)} * bpf_map__max_entries(m);
  }
  // Every executable section of the object, not only the programs libbpf exposes: a
  // policy's non-inlined functions (.text subprograms) are checked as well.
  std::vector<bpf_insn> insns;
  if (int r = object_insns(spec.object_path, insns)) {
    fail.message = "cannot read the compiled policy's instructions: " + std::string(std::strerror(-r));
    return r;
  }
  fp.insns = insns.size();
  {
    size_t n = insns.size();
    for (size_t i = 0; i < n; i++) {
      if (insns[i].code != (BPF_JMP | BPF_CALL)) continue;
      if (insns[i].src_reg == BPF_PSEUDO_KFUNC_CALL && !spec.allow_kfuncs) {
        fail.message = "policy " + spec.policy_name + " calls a kernel function; this hook allows none";
        return -EPERM;
      }
      if (insns[i].src_reg == 0 && !spec.allowed_helpers.empty() && !spec.allowed_helpers.count(insns[i].imm)) {
        fail.message = "policy " + spec.policy_name + " calls " + helper_name(insns[i].imm) +
                       ", which the " + spec.hook + " hook does not allow (no tracing, probe or "
                       "packet-changing helpers; see docs/policy-abi.md)";
        return -EPERM;
      }
    }
  }
  if (spec.check_quota) {
    std::string why = spec.check_quota(fp);
    if (!why.empty()) {
      fail.message = why;
      return -EDQUOT;
    }
  }

  int r = bpf_object__load(p->obj);
  if (r) {
    std::string vlog = verifier_log(captured);
    if (!vlog.empty()) {
      std::string reason = verifier_reason(vlog);
      fail.message = "the verifier rejected policy " + spec.policy_name +
                     (reason.empty() ? std::string() : ": " + reason);
      fail.log = tail_lines(vlog, 30);
    } else {
      fail.message = "loading policy " + spec.policy_name + " failed: " + std::strerror(-r);
      fail.log = tail_lines(captured, 30);
    }
    return r;
  }

  // Pin what a later syrupd (or bpftool) needs to find this policy.
  std::string dir = pins::policy_dir(spec.app, spec.policy_id);
  if ((r = pins::make_dirs(dir)) ||
      (r = bpf_program__pin(p->prog, pins::policy_prog(spec.app, spec.policy_id).c_str()))) {
    fail.message = "cannot pin policy under " + dir + ": " + std::strerror(-r);
    p->unpin();
    return r;
  }
  for (auto& sys : p->system_maps) {
    bpf_map* sm = bpf_object__find_map_by_name(p->obj, sys.c_str());
    if ((r = bpf_map__pin(sm, pins::policy_map(spec.app, spec.policy_id, sys).c_str()))) {
      fail.message = "cannot pin " + sys + " under " + dir + ": " + std::strerror(-r);
      p->unpin();
      return r;
    }
  }
  out = std::move(p);
  return 0;
}

}  // namespace syrup
