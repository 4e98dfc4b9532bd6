// The socket-lookup hook (user side): a policy on the kernel's sk_lookup program type
// decides which of an application's sockets receives a new TCP connection or a UDP
// datagram arriving for a protocol, a local port range and (optionally) a local address
// in one network namespace. Executors are the application's listening TCP or bound UDP
// sockets, of any port, in a SOCKMAP (slot i = executor i); the wrapper
// (kernel/hooks/socket_lookup/wrapper.bpf.h) assigns the chosen one with bpf_sk_assign.
//
// Design: each policy is one bpf_link on the namespace (BPF_SK_LOOKUP), pinned with its
// SOCKMAP under the policy's directory (pins::policy_link), so a restarted syrupd adopts
// it with nothing detached. The wrapper passes whatever is outside its claim, so policies
// of several applications share a namespace. Replacing a policy (same application, same
// claim) is one bpf_link_update: every lookup sees the old or the new program.
//
// Invariants:
//  - a claim (namespace, protocol, port range) overlaps no other application's claim; a
//    caller who is not an admin claims only a range an admin granted its uid
//    (--socket_lookup_ports) or a single port one of its executors is bound to and no
//    other uid's socket is (SO_REUSEADDR shares UDP ports across users); refusals of
//    both kinds read the same, so no one learns whose a port is;
//  - all executors are in the claim's namespace and of its protocol: TCP listeners or
//    unconnected bound UDP sockets; for --pid, the process's such sockets in ascending
//    fd order;
//  - the SOCKMAP, not syrupd, holds the sockets while the policy runs: a socket the
//    application closes leaves the map at once (the kernel removes it on close) and the
//    policy's choices of it fall back to the kernel's own lookup.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "hook.h"
#include "recorder.h"
#include "syrup/abi.h"
#include "unique_fd.h"

namespace syrup::socket_lookup {

// A port range an admin granted a uid (--socket_lookup_ports=UID:LO-HI[,...]).
struct Grant {
  uid_t uid = 0;
  uint16_t lo = 0, hi = 0;
};

// Parses the flag's value. 0 or -EINVAL with `err` naming the bad entry.
int parse_grants(const std::string& text, std::vector<Grant>& out, std::string& err);

// What a policy steers: one protocol, a port range and optionally a local address, in one
// network namespace.
struct Claim {
  int protocol = 0;           // IPPROTO_TCP or IPPROTO_UDP
  uint16_t lo = 0, hi = 0;    // local ports, inclusive
  int family = 0;             // 0: any local address; else AF_INET / AF_INET6 of `address`
  std::string address;        // canonical text, empty for any
  uint8_t addr[16] = {};      // network order
  uint64_t netns = 0;         // the namespace's inode
  bool overlaps(const Claim& o) const {
    return netns == o.netns && protocol == o.protocol && lo <= o.hi && o.lo <= hi;
  }
  // "tcp/127.0.0.1:9000-9010 in net:[4026531840]" (address "*" for any; one port alone).
  std::string name() const;
};

// The claims of installed policies, by policy target; shared by the hook and its targets
// (a target's claim goes when it does).
class Claims {
 public:
  void add(const void* owner, const Claim& c, const std::string& app) { held_[owner] = {c, app}; }
  void drop(const void* owner) { held_.erase(owner); }
  // The application holding a claim that overlaps `c`, other than exactly `c` itself held
  // by `app` (a replacement): "" if none.
  const std::string* conflict(const Claim& c, const std::string& app, bool& same_app) const;

 private:
  std::map<const void*, std::pair<Claim, std::string>> held_;
};

class SocketLookupHook : public Hook {
 public:
  SocketLookupHook();
  const char* name() const override { return "socket-lookup"; }
  const char* compile_define() const override { return "SYR_HOOK_SOCKET_LOOKUP"; }
  const char* wrapper() const override { return "socket_lookup/wrapper.bpf.h"; }
  std::vector<std::string> system_maps() const override {
    return {SYR_EXECUTORS_MAP, SYR_STATS_MAP, kRecCtlMap, kRecRingMap};
  }
  // The common helpers and the wrapper's socket assignment (a SOCKMAP lookup takes a
  // reference that bpf_sk_release drops); no packet reads (the input has no payload), no
  // kernel functions.
  Allowlist allowlist() const override {
    Allowlist a{policy_helpers(), {}, policy_map_types()};
    a.helpers.insert({BPF_FUNC_sk_assign, BPF_FUNC_sk_release});
    return a;
  }
  int make_target(const Caller& caller, proto::Message& req, std::unique_ptr<Target>& out,
                  pid_t& owner, std::string& err) override;
  void release_leftover(std::string_view app, const std::string& policy_dir) override;
  int adopt(const nlohmann::json& saved, LoadedPolicy& p, std::unique_ptr<Target>& out,
            std::string& err) override;

 private:
  std::shared_ptr<Claims> claims_;
};

}  // namespace syrup::socket_lookup
