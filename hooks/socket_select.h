// The socket-select hook backend (user side): finds an application's SO_REUSEPORT
// sockets, fills a policy's executor array with them, and attaches the policy's program
// to their group.
//
// Design: executors are sockets syrupd holds duplicates of, so it can always reach the
// group to swap or detach a program. Attaching a program to a group replaces the
// previous one in a single pointer swap in the kernel (reuseport_attach_prog), which is
// what makes a live policy upgrade atomic: every datagram is seen by either the old or
// the new program, and both have full executor arrays. Invariants: all executors of one
// policy are in one group (same protocol, address and port); the executor order is the
// order the application passed them in, or for --pid the ascending fd number inside the
// target process.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "hook.h"
#include "syrup/abi.h"
#include "unique_fd.h"

namespace syrup::socket_select {

struct Executors {
  std::vector<UniqueFd> sockets;
  std::vector<int> source_fds;  // fd numbers in the owning process (for --pid), for messages
  int protocol = 0;             // IPPROTO_UDP or IPPROTO_TCP
  uint16_t port = 0;
  std::string address;          // bound address, e.g. "127.0.0.1" or "::"
  pid_t holder = 0;             // a process that holds the sockets (for adoption)
  // Identity of the reuseport group: "udp/127.0.0.1:9000".
  std::string group() const;
};

// Validates sockets passed by an application. 0 or -errno with `err`.
int from_fds(std::vector<UniqueFd> fds, Executors& out, std::string& err);

// Takes the SO_REUSEPORT sockets of process `pid` bound to `port` (protocol: IPPROTO_UDP,
// IPPROTO_TCP, or 0 for UDP first, then TCP) and `address` (names::canonical_address(); empty:
// the only group there is, -EINVAL naming them if the process has several). Needs
// ptrace-level access to `pid`.
int from_pid(pid_t pid, uint16_t port, int protocol, const std::string& address, Executors& out,
             std::string& err);

// Puts executor i in slot i of the REUSEPORT_SOCKARRAY `map_fd`. A socket can be in
// only one such map at a time (the kernel answers EBUSY otherwise), which is why a
// replacement policy reuses its predecessor's executor map.
int fill(const Executors& ex, int map_fd, std::string& err);

// Empties slots [0, n) of `map_fd`, releasing the sockets at once (the kernel would
// otherwise release them only when the map is freed, later). fill() puts a group's
// sockets in 0..size-1, so a known group's size is enough; n defaults to every slot
// (a delete each) for a map whose group is unknown.
void release(int map_fd, size_t n = SYR_MAX_EXECUTORS);

// True if both hold the same sockets in the same order.
bool same_sockets(const Executors& a, const Executors& b);

// The socket-select hook for syrupd's core (hook.h).
class SocketSelectHook : public Hook {
 public:
  const char* name() const override { return "socket-select"; }
  const char* compile_define() const override { return "SYR_HOOK_SOCKET_SELECT"; }
  const char* wrapper() const override { return "socket_select.bpf.h"; }
  std::vector<std::string> system_maps() const override { return {SYR_EXECUTORS_MAP, SYR_STATS_MAP}; }
  std::set<int> allowed_helpers() const override {
    auto h = packet_policy_helpers();
    h.insert({BPF_FUNC_skb_load_bytes, BPF_FUNC_sk_select_reuseport});
    return h;
  }
  bool allows_kfuncs() const override { return false; }
  int make_target(const Caller& caller, proto::Message& req, std::unique_ptr<Target>& out,
                  pid_t& owner, std::string& err) override;
  void release_leftover(std::string_view app, const std::string& policy_dir) override;
  int adopt(const nlohmann::json& saved, LoadedPolicy& p, std::unique_ptr<Target>& out,
            std::string& err) override;
};

// Attaches `prog_fd` to the group (atomically replacing any program there).
int attach(const Executors& ex, int prog_fd, std::string& err);

// Detaches whatever program the group has; the kernel's hash decides again.
int detach(const Executors& ex, std::string& err);

}  // namespace syrup::socket_select
