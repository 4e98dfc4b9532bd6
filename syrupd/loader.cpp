#include "loader.h"

#include <bpf/bpf.h>
#include <bpf/btf.h>
#include <fcntl.h>
#include <gelf.h>
#include <libelf.h>
#include <strings.h>
#include <linux/capability.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdarg>
#include <cstring>
#include <mutex>

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
  // The verifier log comes in one message: sized to fit, so its last line (the
  // verifier's reason) is not cut off.
  va_list ap2;
  va_copy(ap2, ap);
  int n = vsnprintf(nullptr, 0, fmt, ap2);
  va_end(ap2);
  std::string text(n > 0 ? static_cast<size_t>(n) : 0, '\0');
  vsnprintf(text.data(), text.size() + 1, fmt, ap);
  const char* buf = text.c_str();
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

// Scopes nest (load_checked's verification build opens one inside the load's): the
// outer capture is restored, so the load's own verifier log after a passed verification
// still reaches the caller's message, not syrupd's log.
struct CaptureScope {
  explicit CaptureScope(std::string* s) : prev(g_capture) { g_capture = s; }
  ~CaptureScope() { g_capture = prev; }
  std::string* prev;
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

// What the loader checks of a compiled object, read from its ELF before libbpf changes
// anything: the instructions of every executable section (the programs and their
// non-inlined subprograms), which relocation names which instruction, and the symbols
// the object leaves to be resolved (externs: kernel functions and kernel variables).
struct ObjectCode {
  struct Section {
    std::string name;
    std::vector<bpf_insn> insns;
    std::map<size_t, std::string> relocs;  // instruction index -> symbol
    std::set<size_t> extern_relocs;        // those whose symbol is an extern
  };
  std::vector<Section> sections;
  std::vector<std::string> externs;
};

int read_object_code(const std::string& path, ObjectCode& out) {
  if (elf_version(EV_CURRENT) == EV_NONE) return -ENOTSUP;
  UniqueFd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return -errno;
  Elf* e = elf_begin(fd.get(), ELF_C_READ, nullptr);
  if (!e) return -EINVAL;
  size_t shstrndx = 0;
  if (elf_getshdrstrndx(e, &shstrndx)) {
    elf_end(e);
    return -EINVAL;
  }
  std::map<size_t, size_t> by_index;  // ELF section index -> out.sections index
  Elf_Scn* symtab = nullptr;
  GElf_Shdr symtab_sh{};
  for (Elf_Scn* scn = elf_nextscn(e, nullptr); scn; scn = elf_nextscn(e, scn)) {
    GElf_Shdr sh;
    if (!gelf_getshdr(scn, &sh)) continue;
    if (sh.sh_type == SHT_SYMTAB) symtab = scn, symtab_sh = sh;
    if (sh.sh_type != SHT_PROGBITS || !(sh.sh_flags & SHF_EXECINSTR)) continue;
    ObjectCode::Section sec;
    const char* n = elf_strptr(e, shstrndx, sh.sh_name);
    sec.name = n ? n : "?";
    for (Elf_Data* d = elf_getdata(scn, nullptr); d; d = elf_getdata(scn, d)) {
      auto* p = static_cast<const bpf_insn*>(d->d_buf);
      sec.insns.insert(sec.insns.end(), p, p + d->d_size / sizeof(bpf_insn));
    }
    by_index[elf_ndxscn(scn)] = out.sections.size();
    out.sections.push_back(std::move(sec));
  }
  Elf_Data* syms = symtab ? elf_getdata(symtab, nullptr) : nullptr;
  auto sym_name = [&](size_t i, GElf_Sym& sym) -> std::string {
    if (!syms || !gelf_getsym(syms, static_cast<int>(i), &sym)) return {};
    const char* n = elf_strptr(e, symtab_sh.sh_link, sym.st_name);
    return n ? n : "";
  };
  if (syms && symtab_sh.sh_entsize) {
    for (size_t i = 1; i < symtab_sh.sh_size / symtab_sh.sh_entsize; i++) {
      GElf_Sym sym;
      std::string n = sym_name(i, sym);
      if (sym.st_shndx == SHN_UNDEF && !n.empty()) out.externs.push_back(n);
    }
  }
  for (Elf_Scn* scn = elf_nextscn(e, nullptr); scn; scn = elf_nextscn(e, scn)) {
    GElf_Shdr sh;
    if (!gelf_getshdr(scn, &sh) || (sh.sh_type != SHT_REL && sh.sh_type != SHT_RELA)) continue;
    auto it = by_index.find(sh.sh_info);
    if (it == by_index.end() || !sh.sh_entsize) continue;
    auto& sec = out.sections[it->second];
    Elf_Data* d = elf_getdata(scn, nullptr);
    for (size_t i = 0; d && i < sh.sh_size / sh.sh_entsize; i++) {
      GElf_Rel rel;
      GElf_Rela rela;
      uint64_t off, info;
      if (sh.sh_type == SHT_REL) {
        if (!gelf_getrel(d, static_cast<int>(i), &rel)) continue;
        off = rel.r_offset, info = rel.r_info;
      } else {
        if (!gelf_getrela(d, static_cast<int>(i), &rela)) continue;
        off = rela.r_offset, info = rela.r_info;
      }
      GElf_Sym sym{};
      sec.relocs[off / sizeof(bpf_insn)] = sym_name(GELF_R_SYM(info), sym);
      if (sym.st_shndx == SHN_UNDEF) sec.extern_relocs.insert(off / sizeof(bpf_insn));
    }
  }
  elf_end(e);
  return 0;
}

// A kernel symbol's name as libbpf resolves it: without a "___flavour" suffix.
std::string essential_name(const std::string& name) {
  size_t at = name.find("___");
  return at == std::string::npos ? name : name.substr(0, at);
}

// A helper's name, from the UAPI header's list (for messages).
std::string helper_name(int id) {
#define SYR_HELPER_NAME(x) {BPF_FUNC_##x, "bpf_" #x}
  static const std::map<int, const char*> names = {__BPF_FUNC_MAPPER(SYR_HELPER_NAME)};
#undef SYR_HELPER_NAME
  auto it = names.find(id);
  return it == names.end() ? "BPF helper #" + std::to_string(id) : it->second;
}

// "" if every call and kernel symbol of the object is in `spec.allowed`, else why not,
// naming the first that is not and the hook. Fails closed on every instruction form
// that reaches outside the object: helper calls by id, kernel-function calls (which must
// name an allowed kernel function through a relocation libbpf resolves by BTF name), and
// 64-bit loads that already carry a kernel meaning (a map fd, a BTF id: compiled C never
// emits them, libbpf sets them from relocations, and passed through they would name
// syrupd's own descriptors). bpf-to-bpf calls stay inside the object, which is checked
// whole.
std::string check_calls(const LoadSpec& spec, const ObjectCode& code, bpf_object* obj) {
  const std::string who = "policy " + spec.policy_name;
  const std::string hook = "the " + spec.hook + " hook";
  auto kfunc_allowed = [&](const std::string& name) {
    return spec.allowed.kfuncs.count(essential_name(name)) > 0;
  };
  for (auto& sec : code.sections) {
    for (size_t i = 0; i < sec.insns.size(); i++) {
      const bpf_insn& in = sec.insns[i];
      if (in.code == (BPF_LD | BPF_IMM | BPF_DW)) {
        if (in.src_reg != 0)
          return who + " has a 64-bit load of kind " + std::to_string(in.src_reg) + " in section " +
                 sec.name + " that no compiler emits (map and kernel references come from relocations)";
        i++;  // the second half of the load
        continue;
      }
      if (in.code != (BPF_JMP | BPF_CALL)) continue;
      switch (in.src_reg) {
        case 0:
          if (!spec.allowed.helpers.count(in.imm))
            return who + " calls " + helper_name(in.imm) + ", which " + hook +
                   " does not allow (no tracing, probe, kernel-memory or packet-changing helpers; "
                   "see docs/policy-abi.md)";
          break;
        case BPF_PSEUDO_CALL:
          // clang emits a call of an extern (a kernel function) as a bpf-to-bpf call
          // relocated against the extern; libbpf turns it into a kernel-function call.
          if (!sec.extern_relocs.count(i)) break;
          [[fallthrough]];
        case BPF_PSEUDO_KFUNC_CALL: {
          auto it = sec.relocs.find(i);
          if (it == sec.relocs.end() || it->second.empty() || !sec.extern_relocs.count(i))
            return who + " calls a kernel function it does not name (section " + sec.name + ")";
          if (!kfunc_allowed(it->second))
            return who + " calls kernel function " + essential_name(it->second) + ", which " + hook +
                   (spec.allowed.kfuncs.empty() ? " does not allow (it allows none)"
                                                : " does not allow (see docs/policy-abi.md)");
          break;
        }
        default:
          return who + " has a call of kind " + std::to_string(in.src_reg) + " (section " + sec.name +
                 ") that the loader does not know";
      }
    }
  }
  // Every extern must be a kernel function the hook allows: a kernel variable (__ksym)
  // would hand the policy a kernel address, a __kconfig value the kernel's configuration.
  const btf* b = bpf_object__btf(obj);
  for (auto& name : code.externs) {
    // (libbpf has already rewritten the linkage of extern functions at open: the kind
    // is what tells a kernel function from a variable.)
    bool func = b && btf__find_by_name_kind(b, name.c_str(), BTF_KIND_FUNC) > 0;
    if (!func)
      return who + " declares the kernel symbol " + essential_name(name) + "; policies may refer to no kernel " +
             "variables or configuration";
    if (!kfunc_allowed(name))
      return who + " declares kernel function " + essential_name(name) + ", which " + hook +
             (spec.allowed.kfuncs.empty() ? " does not allow (it allows none)" : " does not allow (see docs/policy-abi.md)");
  }
  return {};
}

// The capabilities a program type needs to load (the kernel's bpf_prog_load():
// CAP_BPF for all; is_net_admin_prog_type(); is_perfmon_prog_type()) as a bit mask, or
// 0 for a type no hook wrapper makes.
uint64_t caps_for(bpf_prog_type type) {
  auto bit = [](int cap) { return uint64_t{1} << cap; };
  switch (type) {
    case BPF_PROG_TYPE_SK_REUSEPORT:
    case BPF_PROG_TYPE_SK_LOOKUP:
      return bit(CAP_BPF) | bit(CAP_NET_ADMIN);
    case BPF_PROG_TYPE_XDP:
      // Without CAP_PERFMON the verifier refuses packet-pointer arithmetic with a
      // variable offset, so the XDP wrapper reads inputs through bpf_xdp_load_bytes()
      // and syr_ptr() copies (kernel/hooks/xdp/wrapper.bpf.h, <syrup/policy.h>).
      return bit(CAP_BPF) | bit(CAP_NET_ADMIN);
    case BPF_PROG_TYPE_SYSCALL:
      return bit(CAP_BPF);
    case BPF_PROG_TYPE_STRUCT_OPS:
      return bit(CAP_BPF) | bit(CAP_PERFMON);
    default:
      return 0;
  }
}

int capget_thread(__user_cap_data_struct (&data)[2]) {
  __user_cap_header_struct h{_LINUX_CAPABILITY_VERSION_3, 0};  // pid 0: this thread
  return syscall(SYS_capget, &h, data) ? -errno : 0;
}

int capset_thread(const __user_cap_data_struct (&data)[2]) {
  __user_cap_header_struct h{_LINUX_CAPABILITY_VERSION_3, 0};
  return syscall(SYS_capset, &h, data) ? -errno : 0;
}

// While one lives, the calling thread's effective capabilities are those of `keep` it
// had (capabilities are per thread: other threads of syrupd keep theirs); the
// destructor restores them. The permitted set is untouched, so the restore cannot fail
// for lack of rights.
class LoweredCaps {
 public:
  explicit LoweredCaps(uint64_t keep) {
    if ((err_ = capget_thread(saved_))) return;
    __user_cap_data_struct low[2] = {saved_[0], saved_[1]};
    low[0].effective &= static_cast<uint32_t>(keep);
    low[1].effective &= static_cast<uint32_t>(keep >> 32);
    if ((err_ = capset_thread(low))) return;
    lowered_ = true;
  }
  ~LoweredCaps() {
    if (!lowered_) return;
    if (int r = capset_thread(saved_))
      log(LogLevel::kError, "cannot restore this thread's capabilities after a policy load: %s", std::strerror(-r));
  }
  LoweredCaps(const LoweredCaps&) = delete;
  LoweredCaps& operator=(const LoweredCaps&) = delete;
  int error() const { return err_; }

 private:
  __user_cap_data_struct saved_[2]{};
  bool lowered_ = false;
  int err_ = 0;
};

// libbpf probes kernel features on first use and caches the answers process-wide. One
// of the probes that every program load asks (expected attach types, probed with a
// cgroup program that needs CAP_NET_ADMIN) would fail under a tenant's lowered
// capabilities and be cached as missing, breaking syrupd's own programs afterwards. So
// before the first lowered load, a minimal socket filter object (built here with libelf)
// is loaded with full rights: that answers, and caches, every probe a program load asks.
void prime_libbpf_probes() {
  static std::once_flag once;
  std::call_once(once, [] {
    UniqueFd mfd(static_cast<int>(syscall(SYS_memfd_create, "syr_prime", MFD_CLOEXEC)));
    if (!mfd || elf_version(EV_CURRENT) == EV_NONE) return;
    Elf* e = elf_begin(mfd.get(), ELF_C_WRITE, nullptr);
    if (!e) return;
    Elf64_Ehdr* eh = elf64_newehdr(e);
    eh->e_ident[EI_DATA] = ELFDATA2LSB;
    eh->e_type = ET_REL;
    eh->e_machine = EM_BPF;
    eh->e_version = EV_CURRENT;
    static const bpf_insn prog[] = {{BPF_ALU64 | BPF_MOV | BPF_K, 0, 0, 0, 0}, {BPF_JMP | BPF_EXIT, 0, 0, 0, 0}};
    static const char license[] = "GPL";
    static const char shstr[] = "\0socket\0license\0.symtab\0.strtab\0.shstrtab";
    static const char str[] = "\0syr_prime";
    Elf64_Sym syms[2] = {};
    syms[1].st_name = 1;
    syms[1].st_info = ELF64_ST_INFO(STB_GLOBAL, STT_FUNC);
    syms[1].st_shndx = 1;
    syms[1].st_size = sizeof prog;
    auto add = [&](uint32_t name, uint32_t type, uint64_t flags, const void* buf, size_t size, Elf_Type t) {
      Elf_Scn* scn = elf_newscn(e);
      Elf_Data* d = elf_newdata(scn);
      d->d_buf = const_cast<void*>(buf);
      d->d_size = size;
      d->d_type = t;
      d->d_align = 8;
      Elf64_Shdr* sh = elf64_getshdr(scn);
      sh->sh_name = name;
      sh->sh_type = type;
      sh->sh_flags = flags;
      return sh;
    };
    add(1, SHT_PROGBITS, SHF_ALLOC | SHF_EXECINSTR, prog, sizeof prog, ELF_T_BYTE);  // 1: socket
    add(8, SHT_PROGBITS, SHF_ALLOC | SHF_WRITE, license, sizeof license, ELF_T_BYTE);  // 2: license
    Elf64_Shdr* st = add(16, SHT_SYMTAB, 0, syms, sizeof syms, ELF_T_SYM);            // 3: .symtab
    st->sh_link = 4;
    st->sh_info = 1;
    st->sh_entsize = sizeof(Elf64_Sym);
    add(24, SHT_STRTAB, 0, str, sizeof str, ELF_T_BYTE);       // 4: .strtab
    add(32, SHT_STRTAB, 0, shstr, sizeof shstr, ELF_T_BYTE);   // 5: .shstrtab
    eh->e_shstrndx = 5;
    bool written = elf_update(e, ELF_C_WRITE) > 0;
    elf_end(e);
    if (!written) return;
    std::string path = "/proc/self/fd/" + std::to_string(mfd.get());
    LibbpfQuiet quiet;
    bpf_object* obj = bpf_object__open_file(path.c_str(), nullptr);
    if (!obj) return;
    if (bpf_object__load(obj)) log(LogLevel::kWarn, "could not prime libbpf's feature probes");
    bpf_object__close(obj);
  });
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

std::string scrub_kernel_addresses(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  auto hex = [](char c) { return std::isxdigit(static_cast<unsigned char>(c)) != 0; };
  size_t i = 0;
  while (i < text.size()) {
    // A run of hex digits standing alone (not inside a word), after an optional 0x.
    size_t start = i, digits = i;
    bool prefixed = text.compare(i, 2, "0x") == 0 || text.compare(i, 2, "0X") == 0;
    if (prefixed) digits = i + 2;
    bool alone = start == 0 || !std::isalnum(static_cast<unsigned char>(text[start - 1]));
    size_t end = digits;
    while (end < text.size() && hex(text[end])) end++;
    bool word_end = end == text.size() || !std::isalnum(static_cast<unsigned char>(text[end]));
    if (alone && word_end && end - digits == 16 && strncasecmp(text.c_str() + digits, "ffff", 4) == 0) {
      out += "<kernel address>";
      i = end;
      continue;
    }
    // Not an address: copy up to the end of this word.
    if (end == start) end = start + 1;
    if (std::isalnum(static_cast<unsigned char>(text[start])))
      while (end < text.size() && std::isalnum(static_cast<unsigned char>(text[end]))) end++;
    out.append(text, start, end - start);
    i = end;
  }
  return out;
}

void loader_init() { libbpf_set_print(libbpf_print); }

LibbpfQuiet::LibbpfQuiet() { g_quiet++; }
LibbpfQuiet::~LibbpfQuiet() { g_quiet--; }

namespace {
// The released policies with descriptors reopened since the last release_reopened().
// Main thread only: released policies are the registry's.
std::vector<const LoadedPolicy*> g_reopened;

// Is `now` the program recorded as `was`? Its id, tag and name: an id names another
// program only once the recorded one is freed, and then the tag (a hash of its code) tells.
bool same_prog(const bpf_prog_info& was, const bpf_prog_info& now) {
  return now.id == was.id && std::memcmp(now.tag, was.tag, sizeof now.tag) == 0 &&
         std::strncmp(now.name, was.name, sizeof now.name) == 0;
}

bool same_map(const bpf_map_info& was, const bpf_map_info& now) {
  return now.id == was.id && now.type == was.type && now.key_size == was.key_size &&
         now.value_size == was.value_size && now.max_entries == was.max_entries &&
         now.map_flags == was.map_flags && std::strncmp(now.name, was.name, sizeof now.name) == 0;
}
}  // namespace

LoadedPolicy::~LoadedPolicy() {
  if (obj) bpf_object__close(obj);
  std::erase(g_reopened, this);
}

int LoadedPolicy::reopen_prog(UniqueFd& fd, bpf_prog_info& now) const {
  fd.reset(bpf_prog_get_fd_by_id(prog_info_.id));
  now = {};
  uint32_t len = sizeof now;
  if (!fd || bpf_prog_get_info_by_fd(fd.get(), &now, &len) != 0 || !same_prog(prog_info_, now)) {
    log(LogLevel::kWarn, "policy %d: its program (id %u) is gone", policy_id, prog_info_.id);
    fd.reset();
    return -ENOENT;
  }
  return 0;
}

int LoadedPolicy::prog_fd() const {
  if (obj) return bpf_program__fd(prog);
  if (adopted_prog || !released_) return adopted_prog.get();
  UniqueFd fd;
  bpf_prog_info now;
  if (int r = reopen_prog(fd, now)) return r;
  if (adopted_maps.empty()) g_reopened.push_back(this);
  adopted_prog = std::move(fd);
  return adopted_prog.get();
}

int LoadedPolicy::prog_info(bpf_prog_info& info) const {
  if (obj || adopted_prog || !released_) {
    uint32_t len = sizeof info;
    return bpf_prog_get_info_by_fd(prog_fd(), &info, &len) == 0 ? 0 : -errno;
  }
  UniqueFd fd;  // closed at once
  return reopen_prog(fd, info);
}

void LoadedPolicy::close_reopened() const {
  if (!released_) return;
  adopted_prog.reset();
  adopted_maps.clear();  // its entry in g_reopened, if any, is harmless until then
}

int LoadedPolicy::map_fd(const char* name) const {
  if (obj) {
    bpf_map* m = bpf_object__find_map_by_name(obj, name);
    return m ? bpf_map__fd(m) : -ENOENT;
  }
  if (auto it = adopted_maps.find(name); it != adopted_maps.end()) return it->second.get();
  auto was = map_info_.find(name);
  if (was == map_info_.end()) return reopen_pin(name);
  UniqueFd fd(bpf_map_get_fd_by_id(was->second.id));
  bpf_map_info now{};
  uint32_t len = sizeof now;
  if (!fd || bpf_map_get_info_by_fd(fd.get(), &now, &len) != 0 || !same_map(was->second, now)) {
    log(LogLevel::kWarn, "policy %d: its map %s (id %u) is gone", policy_id, name, was->second.id);
    return -ENOENT;
  }
  if (adopted_maps.empty() && !adopted_prog) g_reopened.push_back(this);
  return (adopted_maps[name] = std::move(fd)).get();
}

// An adopted policy's map that no one has asked for yet: opened by its pin under
// syrupd's own tree (pins::obj_get follows no link; only root writes there), checked to
// carry the map's name, as adopt_policy() checks what it opens.
int LoadedPolicy::reopen_pin(const char* name) const {
  std::string path;
  if (std::find(system_maps.begin(), system_maps.end(), name) != system_maps.end())
    path = pins::policy_map(app, policy_id, name);
  else if (std::find(user_maps.begin(), user_maps.end(), name) != user_maps.end())
    path = pins::app_map(app, name);
  else
    return -ENOENT;
  UniqueFd fd(pins::obj_get(path));
  bpf_map_info info{};
  uint32_t len = sizeof info;
  if (!fd || bpf_map_get_info_by_fd(fd.get(), &info, &len) != 0 ||
      std::string_view(name).substr(0, BPF_OBJ_NAME_LEN - 1) != info.name) {
    log(LogLevel::kWarn, "policy %d: its map %s is not pinned at %s", policy_id, name, path.c_str());
    return -ENOENT;
  }
  if (adopted_maps.empty() && !adopted_prog) g_reopened.push_back(this);
  return (adopted_maps[name] = std::move(fd)).get();
}

void LoadedPolicy::release() {
  if (released_) return;
  uint32_t len = sizeof prog_info_;
  if (bpf_prog_get_info_by_fd(prog_fd(), &prog_info_, &len) != 0) return;  // kept open
  // The maps open now (all of a loaded object's; those an adoption opened) are reopened
  // by id later; the others by their pins (reopen_pin()).
  std::vector<std::string> names = system_maps;
  names.insert(names.end(), user_maps.begin(), user_maps.end());
  for (const auto& n : names) {
    bpf_map_info info{};
    len = sizeof info;
    // A map libbpf took over from its pin carries the kernel's name, its first 15 characters.
    auto open_now = [&](const std::string& as) {
      auto it = adopted_maps.find(as);
      return obj ? map_fd(as.c_str()) : it == adopted_maps.end() ? -ENOENT : it->second.get();
    };
    int fd = open_now(n);
    if (fd < 0) fd = open_now(n.substr(0, BPF_OBJ_NAME_LEN - 1));
    if (fd >= 0 && bpf_map_get_info_by_fd(fd, &info, &len) == 0) map_info_[n] = info;
  }
  if (obj) bpf_object__close(obj);
  obj = nullptr;
  prog = nullptr;
  adopted_prog.reset();
  adopted_maps.clear();
  released_ = true;
}

void LoadedPolicy::release_reopened() {
  for (const LoadedPolicy* p : g_reopened) {
    p->adopted_prog.reset();
    p->adopted_maps.clear();
  }
  g_reopened.clear();
}

int adopt_policy(const std::string& app, int id, const std::vector<std::string>& user_maps,
                 const std::vector<std::string>& system_maps, std::unique_ptr<LoadedPolicy>& out,
                 std::string& err) {
  auto p = std::make_unique<LoadedPolicy>();
  p->app = app;
  p->policy_id = id;
  p->user_maps = user_maps;
  p->system_maps = system_maps;
  p->adopted_prog.reset(pins::obj_get(pins::policy_prog(app, id)));
  if (!p->adopted_prog) {
    int e = -p->adopted_prog.get();
    err = "its program is not pinned at " + pins::policy_prog(app, id) + ": " + std::strerror(e);
    return -e;
  }
  // Its maps are opened when asked for (map_fd(), by their pins, each checked to carry
  // its own name), not all at once: most are never asked for.
  out = std::move(p);
  return 0;
}

void LoadedPolicy::unpin() {
  unlink(pins::policy_prog(app, policy_id).c_str());
  for (auto& m : system_maps) unlink(pins::policy_map(app, policy_id, m).c_str());
  rmdir(pins::policy_dir(app, policy_id).c_str());
}

namespace {
int load_checked(const LoadSpec& spec, std::unique_ptr<LoadedPolicy>& out, LoadFailure& fail);

bool private_load(const LoadSpec& spec) { return spec.private_run; }
}  // namespace

int load_policy(const LoadSpec& spec, std::unique_ptr<LoadedPolicy>& out, LoadFailure& fail) {
  if (spec.private_run != spec.app.empty()) {  // a private load has no application, every other one has
    fail.message = "internal error: a load must name an application exactly when it is not a test run's";
    return -EINVAL;
  }
  int r = load_checked(spec, out, fail);
  if (r) {
    fail.message = scrub_kernel_addresses(fail.message);
    fail.log = scrub_kernel_addresses(fail.log);
  }
  return r;
}

namespace {

// The policy built with the hook's verify_wrapper() (LoadSpec::verify_object_path),
// loaded with the capabilities its program type needs (CAP_BPF for the agent's syscall
// program) into maps of its own, which are never pinned, then closed. 0, or the
// verifier's refusal in `fail`.
int verify_unprivileged(const LoadSpec& spec, LoadFailure& fail) {
  std::string captured;
  CaptureScope capture(&captured);
  LIBBPF_OPTS(bpf_object_open_opts, oopts, .object_name = "syr_verify");
  bpf_object* obj = bpf_object__open_file(spec.verify_object_path.c_str(), &oopts);
  if (!obj) {
    int e = -errno;
    fail.message = "cannot open the verification build of policy " + spec.policy_name + ": " + std::strerror(-e);
    return e;
  }
  uint64_t caps = 0;
  bpf_program* prog;
  bpf_object__for_each_program(prog, obj) caps |= caps_for(bpf_program__type(prog));
  if (!caps || caps & (uint64_t{1} << CAP_PERFMON)) {
    bpf_object__close(obj);
    fail.message = "the verification build of policy " + spec.policy_name + " is not of a type verified as "
                   "unprivileged code";
    return -EINVAL;
  }
  int r;
  {
    LoweredCaps lowered(caps);
    r = lowered.error() ? lowered.error() : bpf_object__load(obj);
  }
  bpf_object__close(obj);
  if (!r) return 0;
  std::string vlog = verifier_log(captured);
  std::string reason = vlog.empty() ? std::string(std::strerror(-r)) : verifier_reason(vlog);
  fail.message = "the verifier rejected policy " + spec.policy_name + " as unprivileged code (the " + spec.hook +
                 " hook's programs are verified with CAP_PERFMON, so its policies are first verified without it)" +
                 (reason.empty() ? std::string() : ": " + reason);
  fail.log = tail_lines(vlog.empty() ? captured : vlog, 30);
  return r;
}

// A policy's load, in phases. Each phase returns 0 or a negative errno with its reason
// in `fail`, and says what it needs of the phases before it. The unwind order is one:
// until pin_policy() succeeds, every kernel object the load made belongs to the
// LoadedPolicy's bpf_object, which its destructor closes; pin_policy() removes the pins
// it made itself when it fails. Nothing else is made, so no phase undoes anything.

// Opens the compiled object. After it: p.obj is open.
int open_object(const LoadSpec& spec, LoadedPolicy& p, const std::string& captured, LoadFailure& fail) {
  std::string objname = "syr_" + std::to_string(spec.policy_id);
  LIBBPF_OPTS(bpf_object_open_opts, oopts, .object_name = objname.c_str());
  p.obj = bpf_object__open_file(spec.object_path.c_str(), &oopts);
  if (!p.obj) {
    int e = -errno;
    p.obj = nullptr;
    fail.message = "cannot open the compiled policy: " + std::string(std::strerror(-e));
    fail.log = captured;
    return e;
  }
  return 0;
}

// Needs p.obj. A policy is one program (or exactly the programs its hook names, the first
// of which is the policy's): p.prog is that program.
int select_program(const LoadSpec& spec, LoadedPolicy& p, LoadFailure& fail) {
  int nprogs = 0;
  bpf_program* prog;
  bpf_object__for_each_program(prog, p.obj) {
    nprogs++;
    p.prog = prog;
  }
  if (!spec.programs.empty()) {
    p.prog = bpf_object__find_program_by_name(p.obj, spec.programs[0].c_str());
    for (auto& n : spec.programs)
      if (!bpf_object__find_program_by_name(p.obj, n.c_str())) p.prog = nullptr;
    if (p.prog && nprogs == static_cast<int>(spec.programs.size())) nprogs = 1;
  }
  if (nprogs != 1 || !p.prog) {
    fail.message = "policy " + spec.policy_name +
                   " defines BPF programs of its own (a policy is one SYR_POLICY function)";
    return -EINVAL;
  }
  return 0;
}

// Needs an opened, not yet loaded object: sets its read-only parameters.
int set_parameters(const LoadSpec& spec, bpf_object* obj, LoadFailure& fail) {
  if (int r = set_rodata(obj, SYR_NUM_EXECUTORS_VAR, spec.num_executors); r) {
    fail.message = "compiled policy has no syr_num_executors (was it built with <syrup/policy.h>?)";
    return r;
  }
  for (auto& [name, value] : spec.params) {
    int r = set_rodata(obj, name, value);
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
  return 0;
}

// One of Syrup's own maps (syr_*): only those the hook declares, shared with the hook's
// programs where it hands one over.
int place_system_map(const LoadSpec& spec, bpf_map* m, const char* name, LoadedPolicy& p, LoadFailure& fail) {
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
  p.system_maps.emplace_back(name);
  return 0;
}

// Needs p.obj, not loaded. Application maps are shared by name through the application's
// pin directory; after it, p.system_maps and p.user_maps list the object's maps.
int place_maps(const LoadSpec& spec, LoadedPolicy& p, LoadFailure& fail) {
  bpf_map* m;
  bpf_object__for_each_map(m, p.obj) {
    // A copy: bpf_map__reuse_fd() replaces the map's name string.
    std::string name_s = bpf_map__name(m);
    const char* name = name_s.c_str();
    if (bpf_map__is_internal(m)) continue;
    if (is_system_map(name)) {
      if (int r = place_system_map(spec, m, name, p, fail)) return r;
      continue;
    }
    if (std::string why = names::check("map", name); !why.empty()) {
      fail.message = why;
      return -EINVAL;
    }
    p.user_maps.emplace_back(name);
    if (private_load(spec)) continue;
    if (int r = pins::make_dirs(pins::app_maps_dir(spec.app)); r) {
      fail.message = "cannot create " + pins::app_maps_dir(spec.app) + ": " + std::strerror(-r);
      return r;
    }
    bpf_map__set_pin_path(m, pins::app_map(spec.app, name).c_str());
  }
  return 0;
}

// An application map's type must be one the hook allows.
int check_map_type(const LoadSpec& spec, bpf_map* m, const std::string& name, LoadFailure& fail) {
  if (spec.allowed.map_types.count(bpf_map__type(m))) return 0;
  std::string allowed;
  for (auto t : spec.allowed.map_types)
    allowed += (allowed.empty() ? "" : ", ") + std::string(libbpf_bpf_map_type_str(t) ?: "?");
  const char* type = libbpf_bpf_map_type_str(bpf_map__type(m));
  fail.message = "map '" + name + "' is a " + (type ? type : "unknown type of") + " map, which the " +
                 spec.hook + " hook does not allow (it allows: " + (allowed.empty() ? "none" : allowed) + ")";
  return -EPERM;
}

// Needs place_maps(). What the policy may call and declare, checked before the verifier
// sees it; fills `fp` with what it would add to the application.
int check_footprint(const LoadSpec& spec, const LoadedPolicy& p, LoadFootprint& fp, LoadFailure& fail) {
  bpf_map* m;
  bpf_object__for_each_map(m, p.obj) {
    if (bpf_map__is_internal(m)) continue;
    std::string name = bpf_map__name(m);
    if (std::find(p.user_maps.begin(), p.user_maps.end(), name) == p.user_maps.end()) continue;
    if (int r = check_map_type(spec, m, name, fail)) return r;
    if (!private_load(spec) && access(pins::app_map(spec.app, name).c_str(), F_OK) == 0) continue;  // shared, exists
    fp.new_maps.push_back(name);
    fp.new_map_bytes += uint64_t{bpf_map__key_size(m) + bpf_map__value_size(m)} * bpf_map__max_entries(m);
  }
  // Every executable section of the object, not only the programs libbpf exposes: a
  // policy's non-inlined functions (.text subprograms) are checked as well.
  ObjectCode code;
  if (int r = read_object_code(spec.object_path, code)) {
    fail.message = "cannot read the compiled policy's instructions: " + std::string(std::strerror(-r));
    return r;
  }
  for (auto& sec : code.sections) fp.insns += sec.insns.size();
  if (std::string why = check_calls(spec, code, p.obj); !why.empty()) {
    fail.message = why;
    return -EPERM;
  }
  return 0;
}

// Needs p.obj. The capabilities the verifier sees: what the object's program types need.
int program_caps(const LoadSpec& spec, bpf_object* obj, uint64_t& caps, LoadFailure& fail) {
  caps = 0;
  bpf_program* prog;
  bpf_object__for_each_program(prog, obj) {
    uint64_t need = caps_for(bpf_program__type(prog));
    if (!need) {
      fail.message = "policy " + spec.policy_name + " has a program of type " +
                     (libbpf_bpf_prog_type_str(bpf_program__type(prog)) ?: "?") + ", which no hook loads";
      return -EPERM;
    }
    caps |= need;
  }
  return 0;
}

int check_quota(const LoadSpec& spec, const LoadFootprint& fp, LoadFailure& fail) {
  if (!spec.check_quota) return 0;
  std::string why = spec.check_quota(fp);
  if (why.empty()) return 0;
  fail.message = why;
  return -EDQUOT;
}

// Needs every check above passed. Loads p.obj with `caps` (the verifier's view of the
// caller) and reports the verifier's reason from `captured` when it refuses.
int load_lowered(const LoadSpec& spec, LoadedPolicy& p, uint64_t caps, const std::string& captured,
                 LoadFailure& fail) {
  // libbpf opens the application's pinned maps and pins new ones inside the load, in
  // the application's directory (not root's): CAP_DAC_OVERRIDE stays for that; it
  // changes nothing the verifier decides.
  int r;
  {
    LoweredCaps lowered(caps | uint64_t{1} << CAP_DAC_OVERRIDE);
    if (lowered.error()) {
      fail.message = "cannot lower this thread's capabilities for the load of policy " + spec.policy_name +
                     ": " + std::strerror(-lowered.error());
      return lowered.error();
    }
    r = bpf_object__load(p.obj);
  }
  if (!r) return 0;
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

// Needs a loaded p.obj. Pins what a later syrupd (or bpftool) needs to find this policy;
// on failure removes the pins it made.
int pin_policy(const LoadSpec& spec, LoadedPolicy& p, LoadFailure& fail) {
  std::string dir = pins::policy_dir(spec.app, spec.policy_id);
  int r;
  if ((r = pins::make_dirs(dir)) ||
      (r = bpf_program__pin(p.prog, pins::policy_prog(spec.app, spec.policy_id).c_str()))) {
    fail.message = "cannot pin policy under " + dir + ": " + std::strerror(-r);
    p.unpin();
    return r;
  }
  for (auto& sys : p.system_maps) {
    bpf_map* sm = bpf_object__find_map_by_name(p.obj, sys.c_str());
    if ((r = bpf_map__pin(sm, pins::policy_map(spec.app, spec.policy_id, sys).c_str()))) {
      fail.message = "cannot pin " + sys + " under " + dir + ": " + std::strerror(-r);
      p.unpin();
      return r;
    }
  }
  return 0;
}

int load_checked(const LoadSpec& spec, std::unique_ptr<LoadedPolicy>& out, LoadFailure& fail) {
  std::string captured;
  CaptureScope capture(&captured);
  auto p = std::make_unique<LoadedPolicy>();
  p->app = spec.app;
  p->policy_id = spec.policy_id;
  LoadFootprint fp;
  uint64_t caps = 0;
  int r;
  if ((r = open_object(spec, *p, captured, fail)) || (r = select_program(spec, *p, fail)) ||
      (r = set_parameters(spec, p->obj, fail)) || (r = place_maps(spec, *p, fail)) ||
      (r = check_footprint(spec, *p, fp, fail)) || (r = program_caps(spec, p->obj, caps, fail)) ||
      (r = check_quota(spec, fp, fail)))
    return r;
  prime_libbpf_probes();
  if (!spec.verify_object_path.empty())
    if ((r = verify_unprivileged(spec, fail))) return r;
  if ((r = load_lowered(spec, *p, caps, captured, fail)) || (!private_load(spec) && (r = pin_policy(spec, *p, fail))))
    return r;
  out = std::move(p);
  return 0;
}

}  // namespace

}  // namespace syrup
