// The interface between syrupd's core and a hook backend (hooks/).
//
// A Hook turns a deploy request into a Target: the place one policy is attached (a
// socket group, an interface and ports, a process's threads) together with its
// executors. The core owns the order of operations (compile, load, install, register,
// retire what was replaced) and the rollback; a Target owns the hook-specific kernel
// state. Invariants a Target keeps:
//  - install() either attaches the new program (atomically replacing `old`'s, if given)
//    or leaves the kernel exactly as it found it, `old` still running;
//  - uninstall() returns the hook to the kernel's default behaviour;
//  - key() identifies the attachment point: at most one policy per key.
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

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
  bool admin() const { return uid == 0; }
};

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
  virtual int install(LoadedPolicy& p, const Target* old, std::string& err) = 0;
  virtual void uninstall(LoadedPolicy& p) = 0;
  // Hook-specific fields for `list`.
  virtual nlohmann::json describe() const = 0;
  // What a later syrupd needs to adopt this attachment (Hook::adopt); null: it cannot.
  virtual nlohmann::json save() const { return nullptr; }
};

class Hook {
 public:
  virtual ~Hook() = default;
  virtual const char* name() const = 0;
  virtual const char* compile_define() const = 0;  // e.g. SYR_HOOK_SOCKET_SELECT
  virtual const char* wrapper() const = 0;         // e.g. socket_select.bpf.h
  // The maps the wrapper declares (all named "syr_..."); see LoadSpec::system_maps.
  virtual std::vector<std::string> system_maps() const = 0;
  // Builds the target of a deploy request, checking `caller` may use it; `owner` is set to
  // the process whose exit ends the policy. 0 or -errno with `err`.
  virtual int make_target(const Caller& caller, proto::Message& req, std::unique_ptr<Target>& out,
                          pid_t& owner, std::string& err) = 0;
  // A policy directory left by a syrupd that did not shut down: release what it holds.
  virtual void release_leftover(const std::string& policy_dir) { (void)policy_dir; }
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
  // Once when syrupd exits, after the policies were removed or left for the next one.
  virtual void shutdown() {}
};

}  // namespace syrup
