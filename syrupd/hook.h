// The interface between syrupd's core and a hook backend (hooks/).
//
// A Hook turns a deploy request into a Target: the place one policy is attached (a
// socket group, an interface and ports, a process's threads) together with its
// executors. The core owns the order of operations (compile, load, install, register,
// retire what was replaced) and the rollback (deploy_txn.h); a Target owns the
// hook-specific kernel state. Invariants a Target keeps:
//  - install() attaches the new program (atomically replacing `old`'s, if given) and
//    pushes onto the deploy's transaction the undo of each change it makes, as it makes
//    it: unwound (on its own failure, or a later step's), the kernel is as install found
//    it, `old` still running;
//  - uninstall() returns the hook to the kernel's default behaviour;
//  - key() identifies the attachment point: at most one policy per key.
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <cerrno>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <linux/bpf.h>

#include <nlohmann/json.hpp>

#include "deploy_txn.h"
#include "loader.h"
#include "protocol.h"

namespace syrup {

// The uid owning process `pid`, or (uid_t)-1 if there is no such process.
inline uid_t process_uid(pid_t pid) {
  struct stat st;
  std::string p = "/proc/" + std::to_string(pid);
  return stat(p.c_str(), &st) == 0 ? st.st_uid : static_cast<uid_t>(-1);
}

struct Caller {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
  bool in_admin_group = false;  // a member of syrupd's --admin_group
  bool admin() const { return uid == 0 || in_admin_group; }
};

// May `caller` name process `pid` as the one a policy schedules? It must exist and,
// unless the caller is an admin, belong to the caller's uid. 0, or -ESRCH / -EPERM with
// `err` saying which.
inline int check_target_process(const Caller& caller, pid_t pid, std::string& err) {
  uid_t owner_uid = pid > 0 ? process_uid(pid) : static_cast<uid_t>(-1);
  if (owner_uid == static_cast<uid_t>(-1)) {
    err = "no process " + std::to_string(pid);
    return -ESRCH;
  }
  if (!caller.admin() && owner_uid != caller.uid) {
    err = "process " + std::to_string(pid) + " belongs to uid " + std::to_string(owner_uid) +
          ", not to the caller";
    return -EPERM;
  }
  return 0;
}

// Helpers every policy may use, at any hook: maps, time, random numbers, its CPU, bounded
// loops, spin locks, ring buffers. No tracing, probing, kernel-memory or packet-changing
// helpers: a hook adds the few its wrapper and its input need. ringbuf_query is safe for
// unprivileged code (the kernel offers it without CAP_BPF): it answers only the fill
// counters and size of a ring the program itself holds, no address; the recording
// capture uses it to wake syrupd when its ring fills.
inline std::set<int> policy_helpers() {
  return {BPF_FUNC_map_lookup_elem, BPF_FUNC_map_update_elem, BPF_FUNC_map_delete_elem,
          BPF_FUNC_map_push_elem,   BPF_FUNC_map_pop_elem,    BPF_FUNC_map_peek_elem,
          BPF_FUNC_ktime_get_ns,    BPF_FUNC_ktime_get_boot_ns, BPF_FUNC_ktime_get_coarse_ns,
          BPF_FUNC_jiffies64,       BPF_FUNC_get_prandom_u32, BPF_FUNC_get_smp_processor_id,
          BPF_FUNC_get_numa_node_id, BPF_FUNC_loop,           BPF_FUNC_spin_lock,
          BPF_FUNC_spin_unlock,     BPF_FUNC_ringbuf_output,  BPF_FUNC_ringbuf_reserve,
          BPF_FUNC_ringbuf_submit,  BPF_FUNC_ringbuf_discard, BPF_FUNC_ringbuf_query};
}

// Map types a policy may declare for its application (docs/policy-abi.md): plain data.
// No program arrays (tail calls), maps of maps, socket, device, CPU or XSK maps, arenas,
// user ring buffers, storage or struct_ops maps.
inline std::set<bpf_map_type> policy_map_types() {
  return {BPF_MAP_TYPE_ARRAY,       BPF_MAP_TYPE_HASH,     BPF_MAP_TYPE_PERCPU_ARRAY,
          BPF_MAP_TYPE_PERCPU_HASH, BPF_MAP_TYPE_LRU_HASH, BPF_MAP_TYPE_LRU_PERCPU_HASH,
          BPF_MAP_TYPE_QUEUE,       BPF_MAP_TYPE_STACK,    BPF_MAP_TYPE_RINGBUF};
}

class Target {
 public:
  virtual ~Target() = default;
  virtual std::string key() const = 0;
  virtual uint32_t num_executors() const = 0;
  // Before the new program is loaded over `old`: maps it must share with the old one.
  virtual int prepare_load(LoadSpec& spec, const Target* old, const LoadedPolicy* old_loaded) {
    (void)spec, (void)old, (void)old_loaded;
    return 0;
  }
  // A Target overrides one of the two installs. The one taking the transaction pushes
  // the undo of each change onto `txn` (socket-select, XDP). The other is all or nothing
  // (on failure the kernel is as it found it); by default it runs the first under a
  // transaction of its own, and the first runs it and pushes uninstall() as its undo
  // when it replaced nothing. (A hook that overrides only the second cannot take back a
  // successful replacement; the steps after install fail only through fault injection.)
  virtual int install(LoadedPolicy& p, const Target* old, DeployTxn& txn, std::string& err) {
    if (int r = install(p, old, err)) return r;
    if (!old) txn.on_undo("uninstall", [this, &p] { uninstall(p); });
    return 0;
  }
  virtual int install(LoadedPolicy& p, const Target* old, std::string& err) {
    DeployTxn txn;
    if (int r = install(p, old, txn, err)) return r;
    txn.commit();
    return 0;
  }
  virtual void uninstall(LoadedPolicy& p) = 0;
  // Hook-specific fields for `list`.
  virtual nlohmann::json describe() const = 0;
  // For list and stats at thousands of policies, describe() in two parts: the fields
  // that change while the policy runs (live_keys(), e.g. the executors still open),
  // appended to `out` as `,"key":value` pairs by describe_live(), and the others, which
  // syrupd serialises once per policy. A target that returns false from describe_live()
  // has all its fields serialised at every request.
  virtual std::vector<std::string> live_keys() const { return {}; }
  virtual bool describe_live(std::string& out) const {
    (void)out;
    return false;
  }
  // What a later syrupd needs to adopt this attachment (Hook::adopt); null: it cannot.
  virtual nlohmann::json save() const { return nullptr; }
  // Why the kernel no longer runs this attachment although no one removed the policy (an
  // interface was deleted, or its program detached by another tool, as Hook::refresh()
  // last found it; every socket of a group closed); empty while it runs. Asked after a
  // refresh(), every few seconds (only while some target ends_unannounced()) and before a
  // deploy to the same key; syrupd then removes the policy with this reason. Cheap: no
  // more than a few map lookups.
  virtual std::string gone() const { return {}; }
  // Whether the attachment can end with no news syrupd could wait for, so that only
  // looking every few seconds finds it (the last socket of a group closed). A syrupd
  // whose targets all say no sleeps until something happens.
  virtual bool ends_unannounced() const { return false; }
};

class Hook {
 public:
  virtual ~Hook() = default;
  virtual const char* name() const = 0;
  virtual const char* compile_define() const = 0;  // e.g. SYR_HOOK_SOCKET_SELECT
  virtual const char* wrapper() const = 0;         // e.g. socket_select.bpf.h
  // Where wrapper()'s program type makes the kernel verify with CAP_PERFMON (pointer
  // leaks allowed): a wrapper of a type verified with CAP_BPF alone, for the same policy
  // source; the loader verifies that build first (LoadSpec::verify_object_path). Null:
  // the hook's own program is verified as unprivileged code.
  virtual const char* verify_wrapper() const { return nullptr; }
  // The maps the wrapper declares (all named "syr_..."); see LoadSpec::system_maps.
  virtual std::vector<std::string> system_maps() const = 0;
  // What a policy at this hook may call and declare (the helpers, kernel functions and
  // map types of the policy together with the hook's wrapper, which is compiled into the
  // same object), checked by the loader before the verifier: an empty list allows none.
  // Every hook states its own; a hook with backends states the running backend's.
  virtual Allowlist allowlist() const = 0;
  // Builds the target of a deploy request, checking `caller` may use it; `owner` is set to
  // the process whose exit ends the policy. 0 or -errno with `err`. A target may be
  // destroyed without being installed, also after other requests ran (its deploy was
  // parked for a compile and runs again with a new target): until installed it schedules
  // nothing (it may hold descriptors, or a hook-wide root such as an interface's XDP
  // dispatcher, which passes what no installed policy claims).
  virtual int make_target(const Caller& caller, proto::Message& req, std::unique_ptr<Target>& out,
                          pid_t& owner, std::string& err) = 0;
  // A policy directory of application `app` left by a syrupd that did not shut down:
  // release what it holds.
  virtual void release_leftover(std::string_view app, const std::string& policy_dir) {
    (void)app;
    (void)policy_dir;
  }
  // Once at start, before any deploy: hook-wide state a previous syrupd left behind.
  virtual void recover() {}
  // Takes over an attachment a previous syrupd made (Target::save()'s `saved`), with its
  // program and maps `p` opened from the pins. The kernel state is left as it is: not a
  // packet is lost. 0 or -errno with `err`; on failure the caller releases the policy.
  virtual int adopt(const nlohmann::json& saved, LoadedPolicy& p, std::unique_ptr<Target>& out,
                    std::string& err) {
    (void)saved, (void)p, (void)out;
    err = std::string("the ") + name() + " hook cannot adopt a policy";
    return -EOPNOTSUPP;
  }
  // Hook-wide kernel state that others can take away or change (an interface and its XDP
  // program): a descriptor syrupd's loop watches for news of it (-1: none), and
  // refresh(), called when it is readable and before each deploy at this hook, which
  // reads the news and finds out what changed: true if something did (the targets on what
  // was lost then say so in gone(); a renamed interface changes targets' key() and
  // save()).
  virtual int event_fd() const { return -1; }
  virtual bool refresh() { return false; }
  // Once when syrupd exits, after the policies were removed or left for the next one.
  virtual void shutdown() {}
};

}  // namespace syrup
