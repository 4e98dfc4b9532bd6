// The socket-select hook backend (user side): finds an application's SO_REUSEPORT
// sockets, fills a policy's executor array with them, and attaches the policy's program
// to their group.
//
// Design: the application's descriptors alone keep its sockets open. syrupd holds
// duplicates only while it installs a policy (to fill the executor map and attach the
// program); when it needs the group again (to detach, to restore the map after a failed
// replacement, to adopt after a restart) it takes a socket back from the process that
// holds them (pidfd_getfd), or from any other that has one (a worker it forked). So a
// socket the application closes leaves its group at once: the kernel empties its slot in
// the executor map and the policy's choices of it fall back to the kernel's hash. A
// duplicate held for the policy's life would keep it bound and chosen, receiving traffic
// that no one reads until the application exits. syrupd takes only sockets it has
// matched first, by inode, or in the kernel's socket records (inet_diag.h) by cookie or
// as a UDP socket or TCP listener on the port: a socket taken is re-tagged with
// syrupd's net_cls class id.
// Attaching a program to a group replaces the previous one in a single pointer swap in
// the kernel (reuseport_attach_prog), which is what makes a live policy upgrade atomic:
// every datagram is seen by either the old or the new program, and both have full
// executor arrays. Invariants: all executors of one policy are in one group (same
// protocol, address, port and network namespace); the executor order is the order the application passed
// them in, or for --pid the ascending fd number inside the target process; an executor's
// identity is its socket's inode.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "hook.h"
#include "syrup/abi.h"
#include "unique_fd.h"

namespace syrup::socket_select {

// What identifies a policy's executors for its life: everything but the sockets.
struct ExecutorIds {
  std::vector<uint64_t> inodes;  // executor i's socket
  std::vector<int> source_fds;  // fd numbers in the owning process (for --pid), for messages
  int protocol = 0;             // IPPROTO_UDP or IPPROTO_TCP
  uint16_t port = 0;
  std::string address;          // bound address, e.g. "127.0.0.1" or "::"
  uint64_t netns = 0;           // the network namespace's inode (0: unknown, syrupd's)
  pid_t holder = 0;             // the process that holds the sockets, asked first (retake())
  // Identity of the reuseport group: "udp/127.0.0.1:9000", and " in net:[4026532123]"
  // (as /proc/PID/ns/net names it) outside syrupd's network namespace: a group is per
  // namespace, and one server in two containers has two.
  std::string group() const;
  size_t size() const { return inodes.size(); }
};

struct Executors : ExecutorIds {
  // Duplicates of the sockets while syrupd holds them (see above); -1 for one the holder
  // no longer has (retake()).
  std::vector<UniqueFd> sockets;
  // The same executors, without the duplicates.
  Executors identity() const {
    Executors e;
    static_cast<ExecutorIds&>(e) = *this;
    return e;
  }
};

// Validates sockets passed by an application. 0 or -errno with `err`.
int from_fds(std::vector<UniqueFd> fds, Executors& out, std::string& err);

// Takes the SO_REUSEPORT sockets of process `pid` bound to `port` (protocol: IPPROTO_UDP,
// IPPROTO_TCP, or 0 for UDP first, then TCP) and `address` (names::canonical_address(); empty:
// the only group there is, -EINVAL naming them if the process has several). Needs
// ptrace-level access to `pid`.
int from_pid(pid_t pid, uint16_t port, int protocol, const std::string& address, Executors& out,
             std::string& err);

// Takes the executors of `ex` back by inode, from ex.holder first and what it lacks from
// any other process that has it (a forked worker): ex.sockets[i] is executor i, or -1 if
// no process has it any more. 0 if at least one was taken, else -ESRCH (the holder is gone)
// or -ENOENT, with `err`. Reads every process's descriptors when the holder lacks one.
int retake(Executors& ex, std::string& err);

// Puts executor i in slot i of the REUSEPORT_SOCKARRAY `map_fd` (one not held: none). A socket can be in
// only one such map at a time (the kernel answers EBUSY otherwise), which is why a
// replacement policy reuses its predecessor's executor map.
int fill(const Executors& ex, int map_fd, std::string& err);

// Empties slots [0, n) of `map_fd`, releasing the sockets at once (the kernel would
// otherwise release them only when the map is freed, later). fill() puts a group's
// sockets in 0..size-1, so a known group's size is enough; n defaults to every slot
// (a delete each) for a map whose group is unknown.
void release(int map_fd, size_t n = SYR_MAX_EXECUTORS);

// True if both are the same sockets in the same order.
bool same_sockets(const Executors& a, const Executors& b);

// The kernel's id of a map (0 if it cannot be read).
uint32_t map_id(int map_fd);

// The socket-select hook for syrupd's core (hook.h).
class SocketSelectHook : public Hook {
 public:
  const char* name() const override { return "socket-select"; }
  const char* compile_define() const override { return "SYR_HOOK_SOCKET_SELECT"; }
  const char* wrapper() const override { return "socket_select/wrapper.bpf.h"; }
  std::vector<std::string> system_maps() const override { return {SYR_EXECUTORS_MAP, SYR_STATS_MAP}; }
  // The common helpers, the packet read and the wrapper's socket pick; no kernel
  // functions.
  Allowlist allowlist() const override {
    Allowlist a{policy_helpers(), {}, policy_map_types()};
    a.helpers.insert({BPF_FUNC_skb_load_bytes, BPF_FUNC_sk_select_reuseport});
    return a;
  }
  int make_target(const Caller& caller, proto::Message& req, std::unique_ptr<Target>& out,
                  pid_t& owner, std::string& err) override;
  void release_leftover(std::string_view app, const std::string& policy_dir) override;
  int adopt(const nlohmann::json& saved, LoadedPolicy& p, std::unique_ptr<Target>& out,
            std::string& err) override;

 private:
  std::set<uint32_t> adopted_maps_;  // executor maps of the policies adopt() took over
};

// Attaches `prog_fd` to the group through a socket of it that `ex` holds (atomically
// replacing any program there).
int attach(const Executors& ex, int prog_fd, std::string& err);

// Detaches whatever program the group has; the kernel's hash decides again.
int detach(const Executors& ex, std::string& err);

}  // namespace syrup::socket_select
