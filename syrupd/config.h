// syrupd's declarative configuration (docs/operations.md): a YAML file naming the
// tenants, their quotas and the policies syrupd keeps deployed for them.
//
// Three pure pieces the daemon wires together (none touches daemon state):
//  - load(): parses and validates the file into a Config. Every policy entry carries a
//    stable identity ("<tenant>/<name>"), the deploy request the daemon already accepts
//    (docs/protocol.md, with the policy file's contents as `source`) and a content hash.
//    Every problem is reported as a Diagnostic naming file, line and key.
//  - plan(): compares the desired Config with what the daemon applied before, so a
//    reload (SIGHUP) redeploys only the entries that changed.
//  - resolve_pid() / make_request(): turn an entry's process selector (pid, pidfile,
//    process name) into a pid at apply time, since processes come and go.
// Invariants: a Config returned with load() == 0 is valid as a whole: names follow the
// pin-name rules, identities are unique, no two entries claim the same target, every
// policy file was read and fits the limits. On failure `out` is unspecified: keep using
// the previous Config.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace syrup::config {

// A quota written as "unlimited".
inline constexpr uint64_t kUnlimited = UINT64_MAX;

struct Diagnostic {
  std::string file;     // the path as given to load()
  int line = 0;         // 1-based; 0 when the problem is the file as a whole
  std::string key;      // e.g. "tenants[0].policies[1].ports"; empty for the whole file
  std::string message;
  // "FILE:LINE: KEY: MESSAGE" (a missing line or key is left out).
  std::string str() const;
};

// Limits for one tenant. Unset: the default applies (and, with no default, no limit).
struct Quotas {
  std::optional<uint64_t> policies;             // deployed policies
  std::optional<uint64_t> maps;                 // application maps
  std::optional<uint64_t> map_bytes;            // bytes of map memory (key+value sizes x entries)
  std::optional<uint64_t> insns;                // BPF instructions per policy (after compile)
  std::optional<uint64_t> source_bytes;         // policy source size
  std::optional<uint64_t> requests_per_second;  // control-protocol requests of the tenant's uid
  // Over every application the tenant's uid owns (its other tenants' and its own deploys'
  // alike); unset: syrupd's --quota_uid_* flags.
  std::optional<uint64_t> uid_policies;
  std::optional<uint64_t> uid_maps;
  std::optional<uint64_t> uid_map_bytes;
  std::optional<uint64_t> uid_insns;
  // Each unset field taken from `defaults`.
  Quotas over(const Quotas& defaults) const;
  // The value for the daemon: the limit, or kUnlimited when unset/unlimited.
  static uint64_t limit(const std::optional<uint64_t>& q) { return q ? *q : kUnlimited; }
  // {"policies": 8, ...}: set fields only; kUnlimited as "unlimited".
  nlohmann::json to_json() const;
  // The limited resources by name (set and not unlimited), e.g. for metrics::TenantSample.
  std::map<std::string, uint64_t> limits() const;
  bool operator==(const Quotas&) const = default;
};

// How an entry names the process it schedules (socket-select, thread; optional for xdp).
struct ProcessSelector {
  enum class Kind { kNone, kPid, kPidfile, kProcess };
  Kind kind = Kind::kNone;
  pid_t pid = 0;          // kPid
  std::string pidfile;    // kPidfile: absolute (relative paths resolved against the config)
  std::string process;    // kProcess: the comm name (at most 15 characters)
  std::string str() const;  // "pid 12", "pidfile /run/x.pid", "process rocksdb_server", "none"
  bool operator==(const ProcessSelector&) const = default;
};

struct PolicyEntry {
  std::string tenant;
  std::string name;       // unique within the tenant; default: the policy file's name
  std::string identity;   // "<tenant>/<name>": stable when entries are reordered
  std::string hook;       // socket-select, xdp or thread
  std::string path;       // the policy file, resolved
  std::string where;      // "tenants[0].policies[1]", for messages
  int line = 0;           // where the entry starts in the config file
  uid_t uid = 0;          // the tenant's uid: deploy as this user
  ProcessSelector target;
  // The deploy request (docs/protocol.md): op, hook, app (= tenant), name, source_name,
  // source, params, persist and the hook's fields (port, ports, protocol, ifname, cpus).
  // "pid" is added by make_request() when `target` names a process.
  nlohmann::json request;
  // sha256 (hex) over the request, the uid and the selector: equal hashes, same deploy.
  std::string hash;
};

// Where a quota was written, so a deploy refused for it can point the operator at the
// line to edit.
struct QuotaSource {
  int line = 0;
  std::string key;  // "tenants[0].quotas.map_bytes" or "defaults.quotas.map_bytes"
};

struct Tenant {
  std::string name;
  uid_t uid = 0;
  int line = 0;
  Quotas quotas;      // as written
  Quotas effective;   // quotas.over(Config::defaults)
  // Resource name ("policies", "maps", ...) -> where its effective value was written
  // (the tenant's own quotas, else defaults.quotas); absent when neither sets it.
  std::map<std::string, QuotaSource> quota_sources;
  std::vector<PolicyEntry> policies;
};

struct Config {
  std::string path;          // as given to load()
  int version = 1;
  std::string admin_group;   // a group name or a numeric gid, as written; "" = none
  Quotas defaults;
  std::map<std::string, QuotaSource> default_sources;  // as Tenant::quota_sources
  std::vector<Tenant> tenants;

  const Tenant* tenant(const std::string& name) const;
  size_t num_policies() const;
  std::vector<const PolicyEntry*> entries() const;  // all tenants' entries, in file order
};

struct LoadOptions {
  // The daemon's --max_source_bytes: larger policy files are an error.
  size_t max_source_bytes = 1 << 20;
  // Reads a policy file into `contents` (at most `limit` + 1 bytes, so "too large" can be
  // told). Returns 0 or -errno with `why`. Default: a regular file from disk.
  std::function<int(const std::string& path, size_t limit, std::string& contents, std::string& why)>
      read_file;
};

// Parses and validates the file at `path`. Relative policy and pidfile paths resolve
// against the file's directory. Returns 0 when valid; otherwise -EINVAL (or -errno when
// the file cannot be read) with at least one entry in `errs`, in file order.
int load(const std::string& path, Config& out, std::vector<Diagnostic>& errs,
         const LoadOptions& opts = {});
// The same from text: `file` names it in diagnostics, `base_dir` resolves relative paths.
int load_string(const std::string& text, const std::string& file, const std::string& base_dir,
                Config& out, std::vector<Diagnostic>& errs, const LoadOptions& opts = {});

// What the daemon deployed from a previous Config (it keeps one per live policy).
struct Applied {
  std::string identity;
  std::string hash;
  int policy_id = 0;
  bool operator==(const Applied&) const = default;
};

struct PlannedDeploy {
  PolicyEntry entry;
  // The policy currently deployed for this identity with another hash (0: none). Deploy
  // first; if the response's "replaced" is not this id (the target changed), remove it.
  int replaces = 0;
};

struct Plan {
  std::vector<PlannedDeploy> to_deploy;  // in file order
  std::vector<Applied> to_remove;        // identities no longer in the file (and duplicates)
  std::vector<Applied> unchanged;
  bool empty() const { return to_deploy.empty() && to_remove.empty(); }
};

// What to change to get from `current` to `desired`. Apply to_remove first (a target may
// move between tenants), then to_deploy. A policy that died (owner exited, removed by
// hand) must not be in `current`: it is then deployed again.
Plan plan(const Config& desired, const std::vector<Applied>& current);

// The pid `sel` names now: kPid checks the process exists, kPidfile reads the file's
// first line, kProcess scans `proc_root` for a process whose comm is exactly the name
// (zombies skipped). When `uid` is not (uid_t)-1 the process must belong to it (a
// process name matches only that uid's processes). More than one match is an error.
// 0 or -errno (ESRCH none, EPERM another uid's, ENOENT/EINVAL pidfile, EEXIST ambiguous)
// with `err`.
int resolve_pid(const ProcessSelector& sel, uid_t uid, pid_t& out, std::string& err,
                const std::string& proc_root = "/proc");

// entry.request with "pid" added when the entry names a process (resolved as above with
// the tenant's uid; uid 0 tenants match any process). 0 or -errno with `err`.
int make_request(const PolicyEntry& entry, nlohmann::json& out, std::string& err,
                 const std::string& proc_root = "/proc");

// A group name or numeric gid (Config::admin_group) to a gid. 0 or -ENOENT with `err`.
int resolve_group(const std::string& group, gid_t& out, std::string& err);

// Why a policy at `hook` may not outlive the process it schedules (`persist`), or "" if
// it may (xdp: the policy belongs to an interface). The rule of --config entries and of
// the deploy request alike.
std::string persist_refusal(const std::string& hook);

// "16MiB" -> 16777216. Units: B, KiB, MiB, GiB, TiB (or none). false on anything else.
bool parse_size(const std::string& s, uint64_t& out);

}  // namespace syrup::config
