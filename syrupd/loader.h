// The loader: turns a compiled policy object into a loaded, pinned BPF program.
//
// Steps, each undone in reverse if a later one fails: open the object; set its
// read-only parameters (syr_num_executors and the policy's SYR_PARAMs); point each user
// map at the application's pin (libbpf reuses an existing pin of that name, or creates
// the map and pins it); load (verifier); pin the program and the hook's system maps
// under the policy's directory. Invariants: user maps are exactly the non-internal maps
// whose names do not start with "syr_"; a failed load leaves no pin behind; libbpf's
// messages during a load are captured and returned to the caller, never lost.
//
// A tenant's object is checked before the kernel sees it (every call, kernel symbol and
// map it names against its hook's Allowlist, failing closed) and verified with only the
// capabilities its program type needs (CAP_BPF, + CAP_NET_ADMIN for XDP and
// sk_reuseport, + CAP_PERFMON for struct_ops, which the kernel demands): without
// CAP_PERFMON the verifier refuses pointer leaks and applies its Spectre mitigations.
// Everything a load sends back (message, verifier log) has kernel addresses scrubbed.
#pragma once

#include <bpf/bpf.h>
#include <bpf/libbpf.h>

#include <cstdint>
#include <functional>
#include <set>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "unique_fd.h"

namespace syrup {

// What a hook lets a policy call and declare; an empty list allows none.
struct Allowlist {
  std::set<int> helpers;             // BPF_FUNC_* ids
  std::set<std::string> kfuncs;      // kernel functions, by BTF name
  std::set<bpf_map_type> map_types;  // of the application's maps
};

struct LoadSpec {
  std::string object_path;
  std::string app;
  // A test run's load (syrupd/test_run.cpp): no application; every map is the load's own
  // and counts as new, and nothing is pinned, so closing the object frees all it made.
  bool private_run = false;
  int policy_id = 0;
  std::string policy_name;  // for messages
  std::string hook;         // for messages
  uint32_t num_executors = 1;
  std::map<std::string, uint64_t> params;
  // The hook wrapper's own maps (names start with "syr_"): pinned in the policy's
  // directory. Any other "syr_" map in the object is refused as reserved.
  std::vector<std::string> system_maps;
  // System maps the new program must share with existing ones (name -> fd), e.g. a
  // replaced policy's executor map or the XDP root program's scratch map.
  std::map<std::string, int> reuse_maps;
  // The hook wrapper's programs when it makes more than one (the thread hook's sched_ext
  // wrapper: enqueue and dispatch); the first is pinned as "prog". Empty: exactly one.
  std::vector<std::string> programs;
  // The hook's (Hook::allowlist()); empty lists allow nothing.
  Allowlist allowed;
  // Where the hook's program type needs CAP_PERFMON (sched_ext's struct_ops), under which
  // the verifier allows pointer leaks: the same policy built with a wrapper whose program
  // needs CAP_BPF alone (Hook::verify_wrapper()). The loader has the kernel verify it
  // with CAP_BPF and throws it away before the real load, so what the unprivileged
  // verifier refuses in the policy's own code is refused. Empty: none.
  std::string verify_object_path;
  // Called after open, before the verifier, with what the load would add; a non-empty
  // answer refuses the load with EDQUOT and that message (quotas).
  std::function<std::string(const struct LoadFootprint&)> check_quota;
};

// What one policy brings: its instructions and the application maps it would create.
struct LoadFootprint {
  size_t insns = 0;
  std::vector<std::string> new_maps;  // application maps not pinned yet
  uint64_t new_map_bytes = 0;          // their key+value bytes times entries
};

struct LoadFailure {
  std::string message;  // one paragraph: what went wrong, with the verifier's reason
  std::string log;      // the relevant tail of the verifier log or libbpf's messages
};

// A policy's program and maps: either loaded by this syrupd (obj set), or adopted from
// the pins a previous syrupd left (obj null, fds opened from bpffs), or released
// (release(): no descriptor held; the pins and the attachment keep the objects alive).
// A released policy's prog_fd() and map_fd() reopen the object by its kernel id and
// check it is the one recorded at release (an id is reused once its object is freed);
// what they reopen stays open until release_reopened(), which syrupd calls after each
// event, so a descriptor they return is valid until the event is handled.
class LoadedPolicy {
 public:
  ~LoadedPolicy();
  bpf_object* obj = nullptr;
  bpf_program* prog = nullptr;
  mutable UniqueFd adopted_prog;
  mutable std::map<std::string, UniqueFd> adopted_maps;
  std::vector<std::string> user_maps;    // names of the application maps it uses
  std::vector<std::string> system_maps;  // pinned under the policy's directory
  std::string app;
  int policy_id = 0;

  int prog_fd() const;
  int map_fd(const char* name) const;
  // Records the ids of the program and of the maps it names, then closes every
  // descriptor (the libbpf object's too). Only for a policy pinned and attached.
  void release();
  // Closes what prog_fd()/map_fd() reopened of every released policy.
  static void release_reopened();
  // Closes what they reopened of this one (a walk over every policy would otherwise hold
  // two descriptors per policy at once).
  void close_reopened() const;
  // The program's info (run counts), without keeping a descriptor of a released policy.
  // 0 or -errno.
  int prog_info(bpf_prog_info& info) const;
  // Removes the pins of the program and system maps (not the application's maps).
  void unpin();

 private:
  int reopen_prog(UniqueFd& fd, bpf_prog_info& now) const;
  int reopen_pin(const char* name) const;
  bool released_ = false;
  bpf_prog_info prog_info_{};                    // at release: id, tag, name
  std::map<std::string, bpf_map_info> map_info_;  // at release, by name
};

// Installs the libbpf print callback that load() captures from. Call once.
void loader_init();

// While one lives, libbpf's warnings go to the log at debug level: around a library call
// that makes libbpf report a failure it expects and recovers from.
struct LibbpfQuiet {
  LibbpfQuiet();
  ~LibbpfQuiet();
  LibbpfQuiet(const LibbpfQuiet&) = delete;
  LibbpfQuiet& operator=(const LibbpfQuiet&) = delete;
};

// 0 or -errno with `fail` filled.
int load_policy(const LoadSpec& spec, std::unique_ptr<LoadedPolicy>& out, LoadFailure& fail);

// Opens a pinned policy (program, system maps, the application's maps it uses) as a
// previous syrupd left it. 0 or -errno with `err`.
int adopt_policy(const std::string& app, int id, const std::vector<std::string>& user_maps,
                 const std::vector<std::string>& system_maps, std::unique_ptr<LoadedPolicy>& out,
                 std::string& err);

// `text` with every kernel address in it (16 hex digits starting ffff, with or without
// 0x) replaced by "<kernel address>": for text from the kernel that goes to a tenant.
std::string scrub_kernel_addresses(const std::string& text);

// Byte-exact tail of the last `max_lines` lines of `text`.
std::string tail_lines(const std::string& text, size_t max_lines);

}  // namespace syrup
