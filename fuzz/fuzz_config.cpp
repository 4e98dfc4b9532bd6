// libFuzzer target: the --config loader (syrupd/config.cpp) from a string, then the
// planner over what it produced. Policy files are fakes (no disk access): a path ending
// in "missing.c" does not exist, "empty.c" is empty, "big.c" is over the limit; others
// hold a few bytes derived from the path. Invariants checked:
//  - load_string() returns 0 with no diagnostics, or -EINVAL with at least one, each
//    naming the file and a line within it (or 0) and a message;
//  - a valid Config has unique identities "<tenant>/<name>" of valid names, deploy
//    requests of a known hook for its tenant, and 64-hex-digit hashes;
//  - plan() against nothing deploys every entry; against itself changes nothing.
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <set>

#include "config.h"
#include "registry.h"

#define SYRUP_FUZZ_TARGET "fuzz_config"
#include "fuzz_check.h"
#include "names.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace config = syrup::config;
  std::string text(reinterpret_cast<const char*>(data), size);
  config::LoadOptions o;
  o.max_source_bytes = 4096;
  o.read_file = [](const std::string& path, size_t limit, std::string& out, std::string& why) {
    if (path.ends_with("missing.c")) {
      why = "No such file or directory";
      return -ENOENT;
    }
    if (path.ends_with("empty.c")) out.clear();
    else if (path.ends_with("big.c")) out.assign(limit + 1, 'x');
    else out = "/* " + path + " */\nint x;\n";
    return 0;
  };
  config::Config cfg;
  std::vector<config::Diagnostic> errs;
  int r = config::load_string(text, "fuzz.yaml", "/etc/syrup", cfg, errs, o);
  size_t lines = 1;
  for (char c : text) lines += c == '\n';
  if (r) {
    check(r == -EINVAL, "load_string fails with -EINVAL");
    check(!errs.empty(), "a failure has diagnostics");
  } else {
    check(errs.empty(), "success has no diagnostics");
  }
  for (auto& d : errs) {
    check(d.file == "fuzz.yaml", "a diagnostic names the file");
    check(d.line >= 0 && static_cast<size_t>(d.line) <= lines + 1, "a diagnostic's line is in the file");
    check(!d.message.empty(), "a diagnostic has a message");
    check(d.str().starts_with("fuzz.yaml"), "str() starts with the file");
  }
  if (r) return 0;

  std::set<std::string> ids, tenants;
  std::vector<config::Applied> applied;
  for (auto& t : cfg.tenants) {
    check(syrup::names::check("tenant", t.name).empty(), "tenant names are valid");
    check(tenants.insert(t.name).second, "tenant names are unique");
    for (auto& e : t.policies) {
      check(e.tenant == t.name && e.uid == t.uid, "an entry belongs to its tenant");
      check(e.identity == t.name + "/" + e.name, "identity is tenant/name");
      check(syrup::names::check("policy", e.name, syrup::names::Kind::kLabel).empty(), "policy names are valid");
      check(ids.insert(e.identity).second, "identities are unique");
      check(e.hash.size() == 64, "hashes are sha256 hex");
      check(e.request.value("op", "") == "deploy" && e.request.value("app", "") == t.name &&
                e.request.value("hook", "") == e.hook,
            "the request deploys the entry's hook for its tenant");
      const syrup::HookSpec* spec = syrup::find_hook(e.hook);
      check(spec != nullptr, "a known hook");
      check(!spec || !spec->needs_process || e.target.kind != config::ProcessSelector::Kind::kNone,
            "socket-select and thread entries name a process");
      applied.push_back({e.identity, e.hash, static_cast<int>(applied.size()) + 1});
    }
  }
  config::Plan first = config::plan(cfg, {});
  check(first.to_deploy.size() == cfg.num_policies() && first.to_remove.empty(), "a first plan deploys everything");
  config::Plan again = config::plan(cfg, applied);
  check(again.empty() && again.unchanged.size() == applied.size(), "a plan against itself changes nothing");
  return 0;
}
