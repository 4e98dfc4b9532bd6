// The inet sockets of every network namespace, as the kernel's sock_diag reports them:
// cookie, inode, protocol, state, family, local address and port, IPV6_V6ONLY, owner uid,
// bound interface and cgroup-v1 class id, read without touching a socket.
//
// Design: syrupd must find sockets by cookie (a leftover policy's executor map holds
// cookies) or by port (deploy by pid) in processes it does not own. Taking each socket
// of a process to look at it (pidfd_getfd) would work, but receiving a socket re-tags it
// with the receiver's net_cls class id and net_prio index (__receive_sock), which
// changes how tc and netfilter treat traffic of sockets that have nothing to do with
// the policy. A sock_diag dump reads the same facts from outside. A dump sees one
// network namespace (the one its netlink socket was made in), so one short-lived thread
// joins each namespace in turn. Invariants: every namespace asked for (all_sockets():
// each one a task is in or /run/netns names) is dumped once; UDP and TCP, IPv4 and
// IPv6, every state.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace syrup::inet_diag {

struct InetSock {
  uint64_t cookie = 0;    // SO_COOKIE; also what a REUSEPORT_SOCKARRAY lookup returns
  uint64_t inode = 0;     // the socket's inode: "socket:[inode]" in /proc/PID/fd
  int protocol = 0;       // IPPROTO_UDP or IPPROTO_TCP
  int state = 0;          // TCP_LISTEN, TCP_ESTABLISHED, ... (UDP: TCP_CLOSE or TCP_ESTABLISHED)
  uint16_t port = 0;      // local port, host order
  uint32_t class_id = 0;  // net_cls class id, or the socket's priority when that is 0
  int family = 0;         // AF_INET or AF_INET6
  uint8_t addr[16] = {};  // local address, network order (AF_INET: the first 4 bytes)
  bool v6only = false;    // AF_INET6 with IPV6_V6ONLY (INET_DIAG_SKV6ONLY)
  uint32_t uid = 0;       // the socket's owner, as syrupd's user namespace numbers it
  uint32_t ifindex = 0;   // SO_BINDTODEVICE's interface; 0 when bound to none
};

// Every UDP and TCP socket of every network namespace. 0, or -errno with `err` when not
// even syrupd's own namespace could be read; a namespace it cannot join is left out.
int all_sockets(std::vector<InetSock>& out, std::string& err);

// Every UDP and TCP socket of syrupd's own network namespace (the calling thread's),
// where the interfaces it attaches to are. 0 or -errno with `err`.
int own_sockets(std::vector<InetSock>& out, std::string& err);

// Every UDP and TCP socket of the network namespaces the tasks of process `pid` are in:
// where its sockets almost always are, found without walking every task of the machine
// (all_sockets() stats each task's namespace: about 40 ms with 5000 threads). 0, or
// -errno with `err` when none of them could be read.
int process_sockets(pid_t pid, std::vector<InetSock>& out, std::string& err);

// Every UDP and TCP socket of the network namespace `netns_fd` refers to (an nsfs
// descriptor, e.g. SIOCGSKNS of a socket). 0 or -errno with `err`.
int netns_sockets(int netns_fd, std::vector<InetSock>& out, std::string& err);

}  // namespace syrup::inet_diag
