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
#include <functional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "hook.h"
#include "recorder.h"
#include "inet_diag.h"
#include "syrup/abi.h"
#include "unique_fd.h"

namespace syrup::socket_select {

// ---- Taking a process's sockets (shared with the socket-lookup hook) ----------------

// What an inet socket is bound to, read through its descriptor.
struct SockInfo {
  int protocol = 0;
  uint16_t port = 0;
  std::string address;
  uint64_t netns = 0;  // inode of its network namespace (0: the kernel would not say)
  bool reuseport = false;
  bool listening = false;
};

// Describes an inet socket. -ENOTSOCK / -EAFNOSUPPORT for anything else.
int describe(int fd, SockInfo& si);

// " in net:[N]" for a network namespace other than syrupd's, as /proc/PID/ns/net names it.
std::string in_netns(uint64_t netns);

// The socket descriptors of process `pid`: (fd number, inode) in ascending fd order, and
// a pidfd of it to take them with (take()). 0 or -errno with `err`.
int socket_fds(pid_t pid, UniqueFd& pidfd, std::vector<std::pair<int, uint64_t>>& out, std::string& err);

// A duplicate of fd `n` of the process behind `pidfd`, if that is still socket `ino`: 0,
// -EBADF if the process closed it (or reused the number) since it was listed, else -errno.
int take(int pidfd, int n, uint64_t ino, UniqueFd& out);

// Which sockets a search takes, so that it takes no other: taking a socket re-tags it
// with syrupd's net_cls class id and net_prio index (see inet_diag.h). It goes in passes
// (passes()) and stops at the first that gives something:
//  - kFirst: the sockets whose sock_diag record passes `match`, in the namespaces of
//    process `within`'s tasks, or (within 0) in every namespace;
//  - kWider (only with `within`): those of every namespace (a socket made before its
//    process's threads moved to another namespace);
//  - kUnseen: those no dump of every namespace saw (a socket of a namespace no task is
//    in and /run/netns does not name, or any socket when sock_diag cannot be read), so
//    such a socket is still found.
class Search {
 public:
  enum Pass { kFirst, kWider, kUnseen };
  Search(std::function<bool(const inet_diag::InetSock&)> match, pid_t within);
  std::vector<Pass> passes() const;
  bool wants(uint64_t inode, Pass pass);

 private:
  std::function<bool(const inet_diag::InetSock&)> match_;
  pid_t within_;
  bool every_ = false;  // seen_ and wider_ hold every namespace's records
  std::set<uint64_t> first_, wider_, seen_;
};

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
  std::vector<std::string> system_maps() const override {
    return {SYR_EXECUTORS_MAP, SYR_STATS_MAP, kRecCtlMap, kRecRingMap};
  }
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
  void recover() override;  // the end of an adoption
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
