#include "config.h"

#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "digest.h"
#include "names.h"
#include "registry.h"
#include "text.h"

namespace syrup::config {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr int kVersion = 1;

// Keys of each level of the file. A policy entry's keys depend on its hook.
const std::vector<std::string> kTopKeys = {"version", "admin_group", "defaults", "tenants"};
const std::vector<std::string> kDefaultsKeys = {"quotas"};
const std::vector<std::string> kTenantKeys = {"name", "uid", "quotas", "policies"};
const std::vector<std::string> kQuotaKeys = {"policies",     "maps",     "map_bytes",     "insns",
                                             "source_bytes", "requests_per_second",
                                             "uid_policies", "uid_maps", "uid_map_bytes", "uid_insns"};
const std::vector<std::string> kCommonPolicyKeys = {"name", "hook", "policy", "params", "persist"};
const std::vector<std::string> kSelectorKeys = {"process", "pid", "pidfile"};
// Each hook's keys, from the hook registry (hooks/registry.h).
const std::map<std::string, std::vector<std::string>>& keys_by_hook() {
  static const auto keys = [] {
    std::map<std::string, std::vector<std::string>> m;
    for (const HookSpec* s : hook_specs()) m[s->name] = s->keys;
    return m;
  }();
  return keys;
}

std::string sub(const std::string& path, const std::string& key) {
  return path.empty() ? key : path + "." + key;
}

std::string idx(const std::string& path, size_t i) { return path + "[" + std::to_string(i) + "]"; }

int line_of(const YAML::Node& n) {
  if (!n.IsDefined()) return 0;
  YAML::Mark m = n.Mark();
  return m.line >= 0 ? m.line + 1 : 0;
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); j++) prev[j] = j;
  for (size_t i = 1; i <= a.size(); i++) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); j++)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1])});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

// A likely misspelling of `want`: one edit away, two for longer words, or the same
// first five letters ("policy" for "policies").
bool looks_like(const std::string& got, const std::string& want) {
  size_t d = edit_distance(got, want), n = std::min(got.size(), want.size());
  size_t common = 0;
  while (common < n && got[common] == want[common]) common++;
  return d <= 1 || (d <= 2 && n >= 5) || common >= 5;
}

bool is_plain(const YAML::Node& n) { return n.IsScalar() && n.Tag() == "?"; }

// Decimal or 0x-hex digits, no sign, fitting in 64 bits.
bool parse_uint(const std::string& s, uint64_t& out) {
  int base = 10;
  size_t i = 0;
  if (s.size() > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
    base = 16;
    i = 2;
  }
  if (i >= s.size()) return false;
  uint64_t v = 0;
  for (; i < s.size(); i++) {
    int d;
    char c = s[i];
    if (c >= '0' && c <= '9') d = c - '0';
    else if (base == 16 && c >= 'a' && c <= 'f') d = c - 'a' + 10;
    else if (base == 16 && c >= 'A' && c <= 'F') d = c - 'A' + 10;
    else return false;
    if (v > (UINT64_MAX - static_cast<uint64_t>(d)) / static_cast<uint64_t>(base)) return false;
    v = v * static_cast<uint64_t>(base) + static_cast<uint64_t>(d);
  }
  out = v;
  return true;
}

int read_regular_file(const std::string& path, size_t limit, std::string& contents, std::string& why) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) {
    int e = errno;
    why = std::strerror(e);
    return -e;
  }
  struct stat st;
  if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    why = "not a regular file";
    return -EINVAL;
  }
  contents.clear();
  char buf[65536];
  for (;;) {
    size_t want = std::min(sizeof buf, limit + 1 - contents.size());
    if (want == 0) break;
    ssize_t r = read(fd, buf, want);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      int e = errno;
      close(fd);
      why = std::strerror(e);
      return -e;
    }
    if (r == 0) break;
    contents.append(buf, static_cast<size_t>(r));
  }
  close(fd);
  return 0;
}

std::string resolve_path(const std::string& base_dir, const std::string& p) {
  fs::path path(p);
  if (path.is_relative() && !base_dir.empty()) path = fs::path(base_dir) / path;
  return path.lexically_normal().string();
}

struct Field {
  YAML::Node key, value;
};

// One pass over the file: checks shapes and values, collecting diagnostics.
class Parser {
 public:
  Parser(const std::string& file, const std::string& base_dir, const LoadOptions& opts,
         std::vector<Diagnostic>& errs)
      : file_(file), base_dir_(base_dir), opts_(opts), errs_(errs) {}

  void run(const std::string& text, Config& out);

 private:
  void error(int line, const std::string& key, const std::string& msg) {
    errs_.push_back({file_, line, key, msg});
  }
  void error(const YAML::Node& at, const std::string& key, const std::string& msg) {
    error(line_of(at), key, msg);
  }
  // The line to report a problem with `f`'s value on: the value's own, unless it is null
  // (yaml-cpp then marks the next token) or unmarked.
  static int value_line(const Field& f) {
    return f.value.IsNull() || !line_of(f.value) ? line_of(f.key) : line_of(f.value);
  }
  void error(const Field& f, const std::string& key, const std::string& msg) {
    error(value_line(f), key, msg);
  }

  // The map's entries by key; reports non-map nodes, odd keys and duplicates. With
  // `allowed`, also keys outside it.
  bool fields(const YAML::Node& map, const std::string& path, const std::string& expected,
              std::map<std::string, Field>& out, const std::vector<std::string>* allowed, int line_hint);
  void unknown_keys(const std::map<std::string, Field>& f, const std::string& path,
                    const std::vector<std::string>& allowed);
  bool string_of(const Field& f, const std::string& key, std::string& out, const char* expected);
  bool uint_of(const Field& f, const std::string& key, uint64_t min, uint64_t max, uint64_t& out,
               const std::string& expected);
  bool bool_of(const Field& f, const std::string& key, bool& out);
  void quotas(const Field& f, const std::string& path, Quotas& out, std::map<std::string, QuotaSource>& where);
  void tenant(const YAML::Node& n, const std::string& path, const Config& cfg, Tenant& out);
  void policy(const YAML::Node& n, const std::string& path, const Tenant& t, std::vector<PolicyEntry>& out);
  const std::vector<std::string>* policy_hook(const std::map<std::string, Field>& f, const std::string& path,
                                              PolicyEntry& e);
  void policy_keys(const std::map<std::string, Field>& f, const std::string& path, const PolicyEntry& e,
                   const std::vector<std::string>* hook_keys);
  void policy_source(const std::map<std::string, Field>& f, const std::string& path, const Tenant& t,
                     PolicyEntry& e, std::string& source);
  void policy_name(const std::map<std::string, Field>& f, const std::string& path, PolicyEntry& e);
  json policy_params(const std::map<std::string, Field>& f, const std::string& path);
  bool policy_persist(const std::map<std::string, Field>& f, const std::string& path, const PolicyEntry& e);
  const Field* selector(const std::map<std::string, Field>& f, const std::string& path,
                        const std::vector<std::string>* hook_keys, std::string& sel_key);
  void policy_target(const std::map<std::string, Field>& f, const std::string& path, PolicyEntry& e,
                     const std::vector<std::string>* hook_keys);
  static void finish_policy(PolicyEntry& e, json req, std::vector<PolicyEntry>& out);
  // The entry's keys of its hook, checked by the hook's parse() (hooks/hook_request.h) and
  // added to its deploy request as the hook spells them.
  void hook_request(const std::map<std::string, Field>& f, const std::string& path, const PolicyEntry& e,
                    const HookSpec& spec, json& req);
  void cross_checks(Config& cfg);

  std::string file_, base_dir_;
  const LoadOptions& opts_;
  std::vector<Diagnostic>& errs_;
  // Line of the tenant name per name; policy names per tenant.
  std::map<std::string, int> tenant_lines_;
};

bool Parser::fields(const YAML::Node& map, const std::string& path, const std::string& expected,
                    std::map<std::string, Field>& out, const std::vector<std::string>* allowed,
                    int line_hint) {
  if (!map.IsMap()) {
    int line = line_of(map);
    error(map.IsNull() || !line ? line_hint : line, path, "expected " + expected);
    return false;
  }
  for (auto it = map.begin(); it != map.end(); ++it) {
    YAML::Node k = it->first;  // a copy: it-> yields a temporary
    if (!k.IsScalar()) {
      error(k, path, "keys must be plain names");
      continue;
    }
    const std::string& name = k.Scalar();
    auto [pos, inserted] = out.emplace(name, Field{k, YAML::Node(it->second)});
    if (!inserted)
      error(k, sub(path, name), "duplicate key (first at line " + std::to_string(line_of(pos->second.key)) + ")");
  }
  if (allowed) unknown_keys(out, path, *allowed);
  return true;
}

void Parser::unknown_keys(const std::map<std::string, Field>& f, const std::string& path,
                          const std::vector<std::string>& allowed) {
  // In file order, so diagnostics come out sorted by line.
  std::vector<std::pair<int, std::string>> bad;
  for (auto& [name, fld] : f)
    if (std::find(allowed.begin(), allowed.end(), name) == allowed.end()) bad.push_back({line_of(fld.key), name});
  std::sort(bad.begin(), bad.end());
  for (auto& [line, name] : bad) {
    std::string hint;
    for (auto& a : allowed)
      if (looks_like(name, a)) {
        hint = "; did you mean '" + a + "'?";
        break;
      }
    error(line, sub(path, name), "unknown key (allowed: " + join(allowed) + ")" + hint);
  }
}

bool Parser::string_of(const Field& f, const std::string& key, std::string& out, const char* expected) {
  if (!f.value.IsScalar() || f.value.Scalar().empty()) {
    error(f, key, std::string("expected ") + expected);
    return false;
  }
  out = f.value.Scalar();
  return true;
}

bool Parser::uint_of(const Field& f, const std::string& key, uint64_t min, uint64_t max, uint64_t& out,
                     const std::string& expected) {
  uint64_t v;
  if (!is_plain(f.value) || !parse_uint(f.value.Scalar(), v) || v < min || v > max) {
    error(f, key, "expected " + expected);
    return false;
  }
  out = v;
  return true;
}

bool Parser::bool_of(const Field& f, const std::string& key, bool& out) {
  static const std::set<std::string> yes = {"true", "True", "TRUE", "yes", "Yes", "YES", "on", "On", "ON"};
  static const std::set<std::string> no = {"false", "False", "FALSE", "no", "No", "NO", "off", "Off", "OFF"};
  if (is_plain(f.value) && yes.count(f.value.Scalar())) return out = true, true;
  if (is_plain(f.value) && no.count(f.value.Scalar())) return out = false, true;
  error(f, key, "expected true or false");
  return false;
}

void Parser::quotas(const Field& f, const std::string& path, Quotas& out,
                    std::map<std::string, QuotaSource>& where) {
  std::map<std::string, Field> q;
  if (!fields(f.value, path, "a mapping of quotas (" + join(kQuotaKeys) + ")", q, &kQuotaKeys, line_of(f.key)))
    return;
  for (auto& [name, fld] : q) {
    std::optional<uint64_t>* slot = name == "policies"       ? &out.policies
                                    : name == "maps"         ? &out.maps
                                    : name == "map_bytes"    ? &out.map_bytes
                                    : name == "insns"        ? &out.insns
                                    : name == "source_bytes" ? &out.source_bytes
                                    : name == "requests_per_second" ? &out.requests_per_second
                                    : name == "uid_policies"  ? &out.uid_policies
                                    : name == "uid_maps"      ? &out.uid_maps
                                    : name == "uid_map_bytes" ? &out.uid_map_bytes
                                    : name == "uid_insns"     ? &out.uid_insns
                                                             : nullptr;
    if (!slot) continue;  // reported as unknown
    where[name] = {value_line(fld), sub(path, name)};
    bool size = name == "map_bytes" || name == "source_bytes" || name == "uid_map_bytes";
    uint64_t v;
    if (fld.value.IsScalar() && fld.value.Scalar() == "unlimited") {
      *slot = kUnlimited;
    } else if (size && fld.value.IsScalar() && parse_size(fld.value.Scalar(), v) && v != kUnlimited) {
      *slot = v;
    } else if (!size && is_plain(fld.value) && parse_uint(fld.value.Scalar(), v) && v != kUnlimited) {
      *slot = v;
    } else {
      error(fld, sub(path, name),
            size ? "expected a size such as 65536, 64KiB or 16MiB (units B, KiB, MiB, GiB, TiB), or 'unlimited'"
                 : "expected a non-negative integer or 'unlimited'");
    }
  }
}

// The offset of the first byte that is not part of well-formed UTF-8 (no overlong forms,
// surrogates or code points past U+10FFFF), or npos.
size_t invalid_utf8(const std::string& s) {
  size_t i = 0, n = s.size();
  while (i < n) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (!len || i + len > n) return i;
    uint32_t cp = len == 1 ? c : len == 2 ? c & 0x1f : len == 3 ? c & 0x0f : c & 0x07;
    for (size_t k = 1; k < len; k++) {
      unsigned char cc = static_cast<unsigned char>(s[i + k]);
      if ((cc >> 6) != 2) return i;
      cp = (cp << 6) | (cc & 0x3f);
    }
    static const uint32_t min[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min[len] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return i;
    i += len;
  }
  return std::string::npos;
}

// Where each document of a YAML stream starts. yaml-cpp 0.7 cannot tokenize some
// garbage (",:a") and then reports empty documents at the same place forever, so that
// YAML::LoadAll() never returns and YAML::Load() returns an empty document: a document
// starting where the previous one did means the parser is stuck.
struct DocumentStarts : YAML::EventHandler {
  std::vector<YAML::Mark> starts;
  void OnDocumentStart(const YAML::Mark& m) override { starts.push_back(m); }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t, const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}
};

void Parser::run(const std::string& text, Config& out) {
  if (size_t bad = invalid_utf8(text); bad != std::string::npos) {
    int line = 1 + static_cast<int>(std::count(text.begin(), text.begin() + static_cast<long>(bad), '\n'));
    error(line, "", "the file is not UTF-8 text (byte " + std::to_string(bad) + ")");
    return;
  }
  YAML::Node doc;
  try {
    // First count the documents (two are enough to refuse), then build the first one.
    std::istringstream in(text);
    YAML::Parser parser(in);
    DocumentStarts ds;
    while (ds.starts.size() < 2 && parser.HandleNextDocument(ds)) {
      size_t n = ds.starts.size();
      if (n >= 2 && ds.starts[n - 1].pos == ds.starts[n - 2].pos) {
        const YAML::Mark& m = ds.starts[n - 1];
        error(m.line + 1, "", "syntax error: cannot parse the text at column " + std::to_string(m.column + 1));
        return;
      }
    }
    if (ds.starts.size() > 1) {
      error(ds.starts[1].line + 1, "", "a config file holds one YAML document; another one starts here");
      return;
    }
    doc = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    error(e.mark.line >= 0 ? e.mark.line + 1 : 0, "", "syntax error: " + e.msg);
    return;
  }
  if (doc.IsNull()) return;  // an empty file: no tenants
  std::map<std::string, Field> top;
  if (!fields(doc, "", "a mapping with the keys " + join(kTopKeys), top, &kTopKeys, 1)) return;

  if (auto it = top.find("version"); it != top.end()) {
    uint64_t v;
    if (uint_of(it->second, "version", 0, UINT64_MAX, v, "a version number") && v != kVersion)
      error(it->second, "version", "unsupported version " + std::to_string(v) + " (this syrupd reads version " +
                                       std::to_string(kVersion) + ")");
  }
  if (auto it = top.find("admin_group"); it != top.end()) {
    std::string g;
    bool ok = it->second.value.IsScalar() && !it->second.value.Scalar().empty();
    if (ok) {
      g = it->second.value.Scalar();
      uint64_t gid;
      if (is_plain(it->second.value) && parse_uint(g, gid)) {
        ok = gid < UINT32_MAX;
      } else {
        ok = g.size() <= 32 && g[0] != '-';
        for (char c : g)
          if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.' || c == '$')) ok = false;
      }
    }
    if (ok) out.admin_group = g;
    else error(it->second, "admin_group", "expected a group name or a numeric gid");
  }
  if (auto it = top.find("defaults"); it != top.end()) {
    std::map<std::string, Field> d;
    if (fields(it->second.value, "defaults", "a mapping with the key quotas", d, &kDefaultsKeys, line_of(it->second.key)))
      if (auto q = d.find("quotas"); q != d.end()) quotas(q->second, "defaults.quotas", out.defaults, out.default_sources);
  }
  if (auto it = top.find("tenants"); it != top.end()) {
    const YAML::Node& ts = it->second.value;
    if (ts.IsNull()) return;  // "tenants:" with nothing under it
    if (!ts.IsSequence()) {
      error(it->second, "tenants", "expected a list of tenants");
      return;
    }
    for (size_t i = 0; i < ts.size(); i++) {
      Tenant t;
      tenant(ts[i], idx("tenants", i), out, t);
      out.tenants.push_back(std::move(t));
    }
  }
  cross_checks(out);
}

void Parser::tenant(const YAML::Node& n, const std::string& path, const Config& cfg, Tenant& out) {
  out.line = line_of(n);
  std::map<std::string, Field> f;
  if (!fields(n, path, "a tenant: a mapping with the keys " + join(kTenantKeys), f, &kTenantKeys, out.line)) return;
  if (auto it = f.find("name"); it == f.end()) {
    error(out.line, sub(path, "name"), "required key is missing");
  } else if (string_of(it->second, sub(path, "name"), out.name, "a tenant name")) {
    if (std::string why = names::check("tenant", out.name); !why.empty()) {
      error(it->second, sub(path, "name"), why);
    } else if (auto [pos, inserted] = tenant_lines_.emplace(out.name, value_line(it->second)); !inserted) {
      error(it->second, sub(path, "name"),
            "duplicate tenant name '" + out.name + "' (first at line " + std::to_string(pos->second) + ")");
    }
  }
  if (auto it = f.find("uid"); it == f.end()) {
    error(out.line, sub(path, "uid"), "required key is missing");
  } else {
    uint64_t uid;
    if (uint_of(it->second, sub(path, "uid"), 0, UINT32_MAX - 1, uid, "a uid (a non-negative integer below 4294967295)"))
      out.uid = static_cast<uid_t>(uid);
  }
  if (auto it = f.find("quotas"); it != f.end())
    quotas(it->second, sub(path, "quotas"), out.quotas, out.quota_sources);
  out.effective = out.quotas.over(cfg.defaults);
  for (auto& [name, src] : cfg.default_sources) out.quota_sources.emplace(name, src);  // own ones win
  if (auto it = f.find("policies"); it != f.end()) {
    const YAML::Node& ps = it->second.value;
    if (ps.IsNull()) return;
    if (!ps.IsSequence()) {
      error(it->second, sub(path, "policies"), "expected a list of policies");
      return;
    }
    std::string pp = sub(path, "policies");
    if (out.effective.policies && ps.size() > *out.effective.policies)
      error(it->second, pp, std::to_string(ps.size()) + " policies declared; the tenant's policies quota is " +
                               std::to_string(*out.effective.policies));
    for (size_t i = 0; i < ps.size(); i++) policy(ps[i], idx(pp, i), out, out.policies);
  }
}

// A YAML value as the hook's parse() takes it from the protocol: plain integers (as
// parse_uint() reads them, or negated) become numbers, other scalars strings, sequences
// arrays and mappings objects (which no hook takes; nested deeper than 8, null).
json yaml_to_json(const YAML::Node& n, int depth = 0) {
  if (depth > 8 || n.IsNull() || !n.IsDefined()) return nullptr;
  if (n.IsSequence() || n.IsMap()) {
    json out = n.IsMap() ? json::object() : json::array();
    for (auto it = n.begin(); it != n.end(); ++it)
      if (n.IsMap()) out[it->first.IsScalar() ? it->first.Scalar() : "?"] = yaml_to_json(it->second, depth + 1);
      else out.push_back(yaml_to_json(*it, depth + 1));
    return out;
  }
  const std::string& text = n.Scalar();
  uint64_t v;
  if (is_plain(n) && parse_uint(text, v)) return v;
  if (is_plain(n) && text.starts_with('-') && parse_uint(text.substr(1), v) && v <= INT64_MAX)
    return -static_cast<int64_t>(v);
  return text;
}

void Parser::hook_request(const std::map<std::string, Field>& f, const std::string& path, const PolicyEntry& e,
                          const HookSpec& spec, json& req) {
  json fields = json::object();
  for (auto& [name, fld] : f)
    if (std::ranges::count(spec.keys, name) && !std::ranges::count(kSelectorKeys, name))
      fields[name] = yaml_to_json(fld.value);
  // The process is found at apply time; what the hook asks of a request that names one
  // (socket-select's port) is asked now, with a stand-in pid.
  if (e.target.kind != ProcessSelector::Kind::kNone && std::ranges::count(spec.keys, "pid"))
    fields["pid"] = e.target.kind == ProcessSelector::Kind::kPid ? e.target.pid : 1;
  Bad bad;
  json canonical;
  if (!spec.check(fields, bad, &canonical)) {
    auto it = f.find(bad.key);
    if (it != f.end()) error(it->second, sub(path, bad.key), bad.why);
    else error(e.line, sub(path, bad.key), bad.why);
    return;
  }
  req.update(canonical);
}

// A policy entry is read in phases, each reporting what it finds wrong and going on, so
// that one pass names every problem; the entry is kept only if no phase reported one.
// The phases after policy_hook() are given the hook's keys (null when the hook is
// missing or unknown), which decide what belongs to the entry.

// The hook, which decides which keys belong; its keys, or null.
const std::vector<std::string>* Parser::policy_hook(const std::map<std::string, Field>& f, const std::string& path,
                                                    PolicyEntry& e) {
  auto hit = f.find("hook");
  if (hit == f.end()) {
    error(e.line, sub(path, "hook"), "required key is missing");
  } else if (!hit->second.value.IsScalar()) {
    error(hit->second, sub(path, "hook"), "expected one of " + hook_names());
  } else {
    e.hook = hit->second.value.Scalar();
    if (auto k = keys_by_hook().find(e.hook); k != keys_by_hook().end()) return &k->second;
    error(hit->second, sub(path, "hook"), "unknown hook '" + e.hook + "' (known: " + hook_names() + ")");
  }
  return nullptr;
}

// Keys of another hook, and keys of none; without a known hook, keys of no hook at all.
void Parser::policy_keys(const std::map<std::string, Field>& f, const std::string& path, const PolicyEntry& e,
                         const std::vector<std::string>* hook_keys) {
  auto of_any_hook = [](const std::string& name) {
    bool found = false;
    for (auto& [h, keys] : keys_by_hook()) found |= std::find(keys.begin(), keys.end(), name) != keys.end();
    return found;
  };
  if (!hook_keys) {
    std::vector<std::string> any = kCommonPolicyKeys;
    for (auto& [h, keys] : keys_by_hook())
      for (auto& k : keys)
        if (std::find(any.begin(), any.end(), k) == any.end()) any.push_back(k);
    unknown_keys(f, path, any);
    return;
  }
  std::vector<std::string> all = kCommonPolicyKeys;
  all.insert(all.end(), hook_keys->begin(), hook_keys->end());
  for (auto& [name, fld] : f) {
    bool common = std::find(kCommonPolicyKeys.begin(), kCommonPolicyKeys.end(), name) != kCommonPolicyKeys.end();
    bool of_hook = std::find(hook_keys->begin(), hook_keys->end(), name) != hook_keys->end();
    if (!common && !of_hook && of_any_hook(name))
      error(fld.key, sub(path, name), "not used by the " + e.hook + " hook (its keys: " + join(all) + ")");
  }
  std::map<std::string, Field> unknown;
  for (auto& [name, fld] : f) {
    bool known = std::find(all.begin(), all.end(), name) != all.end() || of_any_hook(name);
    if (!known) unknown.emplace(name, fld);
  }
  unknown_keys(unknown, path, all);
}

// The policy file: e.path resolved, its text in `source`, within the limits.
void Parser::policy_source(const std::map<std::string, Field>& f, const std::string& path, const Tenant& t,
                           PolicyEntry& e, std::string& source) {
  auto it = f.find("policy");
  if (it == f.end()) {
    error(e.line, sub(path, "policy"), "required key is missing");
    return;
  }
  if (!string_of(it->second, sub(path, "policy"), e.path, "the path of the policy's C file")) return;
  e.path = resolve_path(base_dir_, e.path);
  std::string why;
  size_t limit = opts_.max_source_bytes;
  int r = opts_.read_file ? opts_.read_file(e.path, limit, source, why)
                          : read_regular_file(e.path, limit, source, why);
  if (r) {
    error(it->second, sub(path, "policy"), "cannot read " + e.path + ": " + why);
  } else if (source.size() > limit) {
    error(it->second, sub(path, "policy"),
          e.path + " is larger than " + std::to_string(limit) + " bytes (syrupd's --max_source_bytes)");
  } else if (source.empty()) {
    error(it->second, sub(path, "policy"), e.path + " is empty");
  } else if (source.find('\0') != std::string::npos) {
    error(it->second, sub(path, "policy"), e.path + " contains NUL bytes: not C source text");
  } else if (t.effective.source_bytes && source.size() > *t.effective.source_bytes) {
    error(it->second, sub(path, "policy"),
          e.path + " is " + std::to_string(source.size()) + " bytes; the tenant's source_bytes quota is " +
              std::to_string(*t.effective.source_bytes));
  }
}

// Its name: explicit, or the file's. Needs policy_source() (e.path).
void Parser::policy_name(const std::map<std::string, Field>& f, const std::string& path, PolicyEntry& e) {
  if (auto it = f.find("name"); it != f.end()) {
    if (string_of(it->second, sub(path, "name"), e.name, "a policy name"))
      if (std::string why = names::check("policy", e.name, names::Kind::kLabel); !why.empty())
        error(it->second, sub(path, "name"), why);
  } else if (!e.path.empty()) {
    e.name = fs::path(e.path).filename().string();
    if (std::string why = names::check("policy", e.name, names::Kind::kLabel); !why.empty())
      error(f.find("policy")->second, sub(path, "policy"), why + " (the file's name is the default; set name:)");
  }
}

json Parser::policy_params(const std::map<std::string, Field>& f, const std::string& path) {
  json params = json::object();
  auto it = f.find("params");
  if (it == f.end() || it->second.value.IsNull()) return params;
  std::map<std::string, Field> pf;
  std::string pp = sub(path, "params");
  if (!fields(it->second.value, pp, "a mapping of parameter names to non-negative integers", pf, nullptr,
              line_of(it->second.key)))
    return params;
  for (auto& [name, fld] : pf) {
    bool ident = !name.empty() && !std::isdigit(static_cast<unsigned char>(name[0]));
    for (char c : name) ident &= std::isalnum(static_cast<unsigned char>(c)) || c == '_';
    uint64_t v;
    if (!ident) error(fld.key, sub(pp, name), "parameter names are C identifiers");
    else if (name.starts_with("syr_")) error(fld.key, sub(pp, name), "parameter names starting with syr_ are reserved");
    else if (uint_of(fld, sub(pp, name), 0, UINT64_MAX, v, "a non-negative integer")) params[name] = v;
  }
  return params;
}

// socket-select and thread policies follow their process: removed when it exits, and
// deployed again (on the new process) by the next apply. Persisting past the process
// is refused: a socket-select policy holds the process's sockets, so the port would stay
// bound to sockets nobody reads, a restarted server joining that group (same uid,
// SO_REUSEPORT) would get none of its traffic, and, the entry being unchanged, no reload
// would ever move the policy to the new process. XDP policies belong to an interface
// and persist by default.
bool Parser::policy_persist(const std::map<std::string, Field>& f, const std::string& path, const PolicyEntry& e) {
  std::string refusal = persist_refusal(e.hook);
  bool persist = refusal.empty();
  if (auto it = f.find("persist"); it != f.end() && bool_of(it->second, sub(path, "persist"), persist) &&
                                   persist && !refusal.empty())
    error(it->second, sub(path, "persist"),
          "persist: true is not allowed for the " + e.hook +
              " hook: its policy follows the process (removed when it exits, deployed again on the new "
              "process by the next reload); " + refusal);
  return persist;
}

// The one selector key the hook uses (the first in file order; later ones are reported),
// or null with sel_key empty.
const Field* Parser::selector(const std::map<std::string, Field>& f, const std::string& path,
                              const std::vector<std::string>* hook_keys, std::string& sel_key) {
  auto used = [&](const std::string& k) {
    return hook_keys && std::find(hook_keys->begin(), hook_keys->end(), k) != hook_keys->end();
  };
  const Field* sel = nullptr;
  std::vector<std::pair<int, std::string>> given;  // in file order
  for (auto& k : kSelectorKeys)
    if (auto it = f.find(k); it != f.end() && used(k)) given.push_back({line_of(it->second.key), k});
  std::sort(given.begin(), given.end());
  for (auto& [line, k] : given) {
    auto it = f.find(k);
    if (sel) {
      error(it->second.key, sub(path, k), sel_key + ", " + k + ": give only one of process, pid and pidfile");
      continue;
    }
    sel = &it->second;
    sel_key = k;
  }
  return sel;
}

// The process it schedules, in e.target. Needs policy_hook() (e.hook).
void Parser::policy_target(const std::map<std::string, Field>& f, const std::string& path, PolicyEntry& e,
                           const std::vector<std::string>* hook_keys) {
  std::string sel_key;
  const Field* sel = selector(f, path, hook_keys, sel_key);
  if (sel && sel_key == "pid") {
    uint64_t pid;
    if (uint_of(*sel, sub(path, "pid"), 1, INT32_MAX, pid, "a pid (a positive integer)")) {
      e.target.kind = ProcessSelector::Kind::kPid;
      e.target.pid = static_cast<pid_t>(pid);
    }
  } else if (sel && sel_key == "pidfile") {
    if (string_of(*sel, sub(path, "pidfile"), e.target.pidfile, "the path of a pid file")) {
      e.target.kind = ProcessSelector::Kind::kPidfile;
      e.target.pidfile = resolve_path(base_dir_, e.target.pidfile);
    }
  } else if (sel && sel_key == "process") {
    std::string p;
    if (sel->value.IsScalar()) p = sel->value.Scalar();
    if (p.empty() || p.size() > 15 || p.find('/') != std::string::npos) {
      error(*sel, sub(path, "process"), "expected a process name as in /proc/PID/comm (1..15 characters, no '/')");
    } else {
      e.target.kind = ProcessSelector::Kind::kProcess;
      e.target.process = p;
    }
  } else if (!sel && !f.count("cgroup") && find_hook(e.hook) && find_hook(e.hook)->needs_process) {
    error(e.line, sub(path, "process"),
          "the " + e.hook + " hook needs the process it schedules: process, pid or pidfile (or a cgroup)");
  }
}

// The entry's request, identity and hash, once every phase passed.
void Parser::finish_policy(PolicyEntry& e, json req, std::vector<PolicyEntry>& out) {
  e.identity = e.tenant + "/" + e.name;
  e.request = std::move(req);
  json h = {{"request", e.request},
            {"uid", e.uid},
            {"target", {{"kind", static_cast<int>(e.target.kind)}, {"pid", e.target.pid},
                        {"pidfile", e.target.pidfile}, {"process", e.target.process}}}};
  // A policy file need not be UTF-8: hash its bytes as the protocol would send them.
  e.hash = sha256_hex(h.dump(-1, ' ', false, json::error_handler_t::replace));
  out.push_back(std::move(e));
}

void Parser::policy(const YAML::Node& n, const std::string& path, const Tenant& t, std::vector<PolicyEntry>& out) {
  PolicyEntry e;
  e.tenant = t.name;
  e.uid = t.uid;
  e.where = path;
  e.line = line_of(n);
  std::map<std::string, Field> f;
  std::string ex = "a policy: a mapping with hook, policy and the hook's keys";
  if (!fields(n, path, ex, f, nullptr, e.line)) return;
  size_t before = errs_.size();

  const std::vector<std::string>* hook_keys = policy_hook(f, path, e);
  policy_keys(f, path, e, hook_keys);
  std::string source;
  policy_source(f, path, t, e, source);
  policy_name(f, path, e);
  json params = policy_params(f, path);
  bool persist = policy_persist(f, path, e);
  policy_target(f, path, e, hook_keys);

  json req = {{"op", "deploy"}, {"hook", e.hook}, {"app", t.name}, {"name", e.name},
              {"source_name", e.path}, {"source", source}, {"params", params}, {"persist", persist}};
  // The hook's own keys: its parse() checks them (a process that schedules nothing is
  // already refused above, and the hook's keys are not checked on top of that).
  if (const HookSpec* spec = hook_keys ? find_hook(e.hook) : nullptr;
      spec && (!spec->needs_process || e.target.kind != ProcessSelector::Kind::kNone || f.count("cgroup")))
    hook_request(f, path, e, *spec, req);

  if (errs_.size() != before) return;
  finish_policy(e, std::move(req), out);
}

// For entries that name a cgroup (a request field, not a ProcessSelector): what they share
// if both name the same one, "" if either names another target; "-" if neither names one.
std::string same_cgroup(const PolicyEntry& a, const PolicyEntry& b, const HookSpec& s) {
  std::string ca = a.request.value("cgroup", std::string()), cb = b.request.value("cgroup", std::string());
  if (ca.empty() && cb.empty()) return "-";
  if (ca != cb) return {};
  return s.same_target(a.request, b.request, "cgroup " + ca);
}

// Whether two entries would be deployed to one target (at most one policy each), and if
// so, what they share: the hook's spec says, given the same process if it needs one.
std::string same_target(const PolicyEntry& a, const PolicyEntry& b) {
  const HookSpec* s = find_hook(a.hook);
  if (a.hook != b.hook || !s || !s->same_target) return {};
  if (std::string c = same_cgroup(a, b, *s); c != "-") return c;
  if (s->needs_process && (a.target.kind == ProcessSelector::Kind::kNone || !(a.target == b.target))) return {};
  return s->same_target(a.request, b.request, a.target.str());
}

void Parser::cross_checks(Config& cfg) {
  std::vector<PolicyEntry*> all;
  for (auto& t : cfg.tenants) {
    std::map<std::string, PolicyEntry*> names;
    for (auto& e : t.policies) {
      if (auto [pos, inserted] = names.emplace(e.name, &e); !inserted)
        error(e.line, sub(e.where, "name"),
              "duplicate policy name '" + e.name + "' in tenant '" + t.name + "' (first at line " +
                  std::to_string(pos->second->line) + "); set name: to tell them apart");
      all.push_back(&e);
    }
  }
  for (size_t i = 0; i < all.size(); i++)
    for (size_t j = 0; j < i; j++)
      if (std::string what = same_target(*all[j], *all[i]); !what.empty()) {
        error(all[i]->line, all[i]->where,
              "same target as " + all[j]->where + " (line " + std::to_string(all[j]->line) + "): " + what +
                  "; a target has at most one policy");
        break;
      }
}

}  // namespace

std::string Diagnostic::str() const {
  std::string s = file;
  if (line > 0) s += ":" + std::to_string(line);
  s += ": ";
  if (!key.empty()) s += key + ": ";
  return s + message;
}

Quotas Quotas::over(const Quotas& d) const {
  Quotas q = *this;
  for (auto [mine, def] : {std::pair{&q.policies, &d.policies}, {&q.maps, &d.maps}, {&q.map_bytes, &d.map_bytes},
                           {&q.insns, &d.insns}, {&q.source_bytes, &d.source_bytes},
                           {&q.requests_per_second, &d.requests_per_second}, {&q.uid_policies, &d.uid_policies},
                           {&q.uid_maps, &d.uid_maps}, {&q.uid_map_bytes, &d.uid_map_bytes},
                           {&q.uid_insns, &d.uid_insns}})
    if (!*mine) *mine = *def;
  return q;
}

json Quotas::to_json() const {
  json j = json::object();
  for (auto [k, v] : {std::pair{"policies", &policies}, {"maps", &maps}, {"map_bytes", &map_bytes},
                      {"insns", &insns}, {"source_bytes", &source_bytes},
                      {"requests_per_second", &requests_per_second}, {"uid_policies", &uid_policies},
                      {"uid_maps", &uid_maps}, {"uid_map_bytes", &uid_map_bytes}, {"uid_insns", &uid_insns}})
    if (*v) j[k] = **v == kUnlimited ? json("unlimited") : json(**v);
  return j;
}

std::map<std::string, uint64_t> Quotas::limits() const {
  std::map<std::string, uint64_t> m;
  for (auto [k, v] : {std::pair{"policies", &policies}, {"maps", &maps}, {"map_bytes", &map_bytes},
                      {"insns", &insns}, {"source_bytes", &source_bytes},
                      {"requests_per_second", &requests_per_second}, {"uid_policies", &uid_policies},
                      {"uid_maps", &uid_maps}, {"uid_map_bytes", &uid_map_bytes}, {"uid_insns", &uid_insns}})
    if (*v && **v != kUnlimited) m[k] = **v;
  return m;
}

std::string ProcessSelector::str() const {
  switch (kind) {
    case Kind::kPid: return "pid " + std::to_string(pid);
    case Kind::kPidfile: return "pidfile " + pidfile;
    case Kind::kProcess: return "process " + process;
    case Kind::kNone: break;
  }
  return "none";
}

const Tenant* Config::tenant(const std::string& name) const {
  for (auto& t : tenants)
    if (t.name == name) return &t;
  return nullptr;
}

size_t Config::num_policies() const {
  size_t n = 0;
  for (auto& t : tenants) n += t.policies.size();
  return n;
}

std::vector<const PolicyEntry*> Config::entries() const {
  std::vector<const PolicyEntry*> v;
  for (auto& t : tenants)
    for (auto& e : t.policies) v.push_back(&e);
  return v;
}

int load_string(const std::string& text, const std::string& file, const std::string& base_dir, Config& out,
                std::vector<Diagnostic>& errs, const LoadOptions& opts) {
  out = Config{};
  out.path = file;
  size_t before = errs.size();
  Parser(file, base_dir, opts, errs).run(text, out);
  // Diagnostics in file order (whole-file ones first), stable within a line.
  std::stable_sort(errs.begin() + static_cast<long>(before), errs.end(),
                   [](const Diagnostic& a, const Diagnostic& b) { return a.line < b.line; });
  return errs.size() == before ? 0 : -EINVAL;
}

int load(const std::string& path, Config& out, std::vector<Diagnostic>& errs, const LoadOptions& opts) {
  std::string text, why;
  // A config larger than this is a mistake (a policy file given instead, say).
  constexpr size_t kMaxConfig = 16 << 20;
  if (int r = read_regular_file(path, kMaxConfig, text, why)) {
    errs.push_back({path, 0, "", "cannot read the config file: " + why});
    return r;
  }
  if (text.size() > kMaxConfig) {
    errs.push_back({path, 0, "", "the config file is larger than 16 MiB"});
    return -EFBIG;
  }
  // Relative paths in the file resolve against its directory, whatever the cwd.
  std::error_code ec;
  fs::path abs = fs::absolute(path, ec);
  std::string dir = (ec ? fs::path(path) : abs).parent_path().lexically_normal().string();
  if (dir.empty()) dir = ".";
  return load_string(text, path, dir, out, errs, opts);
}

Plan plan(const Config& desired, const std::vector<Applied>& current) {
  Plan p;
  std::map<std::string, const Applied*> cur;
  for (auto& a : current) {
    if (auto [pos, inserted] = cur.emplace(a.identity, &a); !inserted) p.to_remove.push_back(a);
  }
  std::set<std::string> wanted;
  for (const PolicyEntry* e : desired.entries()) {
    wanted.insert(e->identity);
    auto it = cur.find(e->identity);
    if (it == cur.end()) p.to_deploy.push_back({*e, 0});
    else if (it->second->hash != e->hash) p.to_deploy.push_back({*e, it->second->policy_id});
    else p.unchanged.push_back(*it->second);
  }
  for (auto& a : current)
    if (!wanted.count(a.identity) && cur[a.identity] == &a) p.to_remove.push_back(a);
  return p;
}

namespace {

// Field 3 (state) and the owner of /proc/PID; false if there is no such process.
bool proc_info(const std::string& proc_root, pid_t pid, char& state, uid_t& uid) {
  std::string dir = proc_root + "/" + std::to_string(pid);
  struct stat st;
  if (stat(dir.c_str(), &st) < 0) return false;
  uid = st.st_uid;
  std::ifstream in(dir + "/stat");
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto rp = s.rfind(')');
  state = rp != std::string::npos && rp + 2 < s.size() ? s[rp + 2] : '?';
  return true;
}

}  // namespace

int resolve_pid(const ProcessSelector& sel, uid_t uid, pid_t& out, std::string& err, const std::string& proc_root) {
  constexpr uid_t kAny = static_cast<uid_t>(-1);
  auto check = [&](pid_t pid, const std::string& what) {
    char state;
    uid_t owner;
    if (pid <= 0 || !proc_info(proc_root, pid, state, owner) || state == 'Z' || state == 'X') {
      err = "no process " + std::to_string(pid) + what;
      return -ESRCH;
    }
    if (uid != kAny && owner != uid) {
      err = "process " + std::to_string(pid) + what + " belongs to uid " + std::to_string(owner) + ", not " +
            std::to_string(uid);
      return -EPERM;
    }
    out = pid;
    return 0;
  };
  switch (sel.kind) {
    case ProcessSelector::Kind::kNone:
      err = "the entry names no process";
      return -EINVAL;
    case ProcessSelector::Kind::kPid:
      return check(sel.pid, "");
    case ProcessSelector::Kind::kPidfile: {
      std::string text, why;
      if (int r = read_regular_file(sel.pidfile, 64, text, why)) {
        err = "cannot read pid file " + sel.pidfile + ": " + why;
        return r;
      }
      std::string first = text.substr(0, text.find('\n'));
      while (!first.empty() && std::isspace(static_cast<unsigned char>(first.back()))) first.pop_back();
      uint64_t v;
      if (!parse_uint(first, v) || v == 0 || v > INT32_MAX || first.starts_with("0x")) {
        err = "pid file " + sel.pidfile + " does not start with a pid";
        return -EINVAL;
      }
      return check(static_cast<pid_t>(v), " (from " + sel.pidfile + ")");
    }
    case ProcessSelector::Kind::kProcess: {
      DIR* d = opendir(proc_root.c_str());
      if (!d) {
        err = "cannot list " + proc_root + ": " + std::strerror(errno);
        return -errno;
      }
      std::vector<pid_t> found;
      size_t other_uid = 0;
      while (dirent* de = readdir(d)) {
        uint64_t v;
        if (!parse_uint(de->d_name, v) || v == 0 || v > INT32_MAX) continue;
        pid_t pid = static_cast<pid_t>(v);
        std::ifstream in(proc_root + "/" + de->d_name + "/comm");
        std::string comm;
        if (!std::getline(in, comm) || comm != sel.process) continue;
        char state;
        uid_t owner;
        if (!proc_info(proc_root, pid, state, owner) || state == 'Z' || state == 'X') continue;
        if (uid != kAny && owner != uid) {
          other_uid++;
          continue;
        }
        found.push_back(pid);
      }
      closedir(d);
      std::sort(found.begin(), found.end());
      if (found.empty()) {
        err = "no process named '" + sel.process + "'" +
              (uid != kAny ? " of uid " + std::to_string(uid) : std::string()) +
              (other_uid ? " (" + std::to_string(other_uid) + " of other users)" : std::string());
        return -ESRCH;
      }
      if (found.size() > 1) {
        err = std::to_string(found.size()) + " processes are named '" + sel.process + "' (pids";
        for (size_t i = 0; i < found.size() && i < 8; i++) err += " " + std::to_string(found[i]);
        err += found.size() > 8 ? " ...)" : ")";
        err += "; name one with pid or pidfile";
        return -EEXIST;
      }
      out = found[0];
      return 0;
    }
  }
  return -EINVAL;
}

int make_request(const PolicyEntry& entry, json& out, std::string& err, const std::string& proc_root) {
  out = entry.request;
  if (entry.target.kind == ProcessSelector::Kind::kNone) return 0;
  pid_t pid = 0;
  uid_t uid = entry.uid == 0 ? static_cast<uid_t>(-1) : entry.uid;
  if (int r = resolve_pid(entry.target, uid, pid, err, proc_root)) return r;
  out["pid"] = pid;
  return 0;
}

int resolve_group(const std::string& group, gid_t& out, std::string& err) {
  uint64_t v;
  if (parse_uint(group, v) && v < UINT32_MAX) {
    out = static_cast<gid_t>(v);
    return 0;
  }
  std::vector<char> buf(16384);
  struct group gr, *res = nullptr;
  int r = getgrnam_r(group.c_str(), &gr, buf.data(), buf.size(), &res);
  if (r || !res) {
    err = "no group '" + group + "'" + (r ? std::string(": ") + std::strerror(r) : std::string());
    return -ENOENT;
  }
  out = res->gr_gid;
  return 0;
}

std::string persist_refusal(const std::string& hook) {
  const HookSpec* s = find_hook(hook);
  return s ? s->persist_refusal : "";
}

bool parse_size(const std::string& s, uint64_t& out) {
  size_t i = 0;
  while (i < s.size() && s[i] >= '0' && s[i] <= '9') i++;
  if (i == 0 || i > 20) return false;
  uint64_t v;
  if (!parse_uint(s.substr(0, i), v)) return false;
  std::string unit = s.substr(i);
  if (!unit.empty() && unit[0] == ' ') unit = unit.substr(1);
  static const std::pair<const char*, int> units[] = {{"", 0},  {"B", 0},  {"KiB", 10}, {"MiB", 20},
                                                      {"GiB", 30}, {"TiB", 40}};
  for (auto [u, shift] : units)
    if (unit == u) {
      if (shift && v > (UINT64_MAX >> shift)) return false;
      out = v << shift;
      return true;
    }
  return false;
}

}  // namespace syrup::config
