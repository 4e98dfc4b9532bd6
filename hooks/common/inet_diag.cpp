#include "inet_diag.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <functional>
#include <set>
#include <thread>

#include "unique_fd.h"

namespace syrup::inet_diag {
namespace {

// One dump (family, protocol) on netlink socket `nl`, appended to `out`. 0 or -errno.
int dump(int nl, int family, int protocol, std::vector<InetSock>& out) {
  struct {
    nlmsghdr nlh;
    inet_diag_req_v2 req;
  } msg{};
  msg.nlh.nlmsg_len = sizeof msg;
  msg.nlh.nlmsg_type = SOCK_DIAG_BY_FAMILY;
  msg.nlh.nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP;
  msg.req.sdiag_family = static_cast<uint8_t>(family);
  msg.req.sdiag_protocol = static_cast<uint8_t>(protocol);
  msg.req.idiag_states = ~0u;
  // idiag_ext has 8 bits, too few for INET_DIAG_CLASS_ID's: the kernel sends the class
  // id also when asked for INET_DIAG_TCLASS.
  msg.req.idiag_ext = 1 << (INET_DIAG_TCLASS - 1);
  if (send(nl, &msg, sizeof msg, 0) < 0) return -errno;
  alignas(nlmsghdr) char buf[32768];
  for (;;) {
    ssize_t n = recv(nl, buf, sizeof buf, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return -errno;
    }
    if (n == 0) return -EIO;
    int len = static_cast<int>(n);
    for (auto* h = reinterpret_cast<nlmsghdr*>(buf); NLMSG_OK(h, len); h = NLMSG_NEXT(h, len)) {
      if (h->nlmsg_type == NLMSG_DONE) return 0;
      if (h->nlmsg_type == NLMSG_ERROR) {
        auto* e = static_cast<nlmsgerr*>(NLMSG_DATA(h));
        return e->error ? e->error : -EIO;
      }
      if (h->nlmsg_type != SOCK_DIAG_BY_FAMILY || h->nlmsg_len < NLMSG_LENGTH(sizeof(inet_diag_msg))) continue;
      auto* m = static_cast<inet_diag_msg*>(NLMSG_DATA(h));
      InetSock s;
      s.cookie = m->id.idiag_cookie[0] | static_cast<uint64_t>(m->id.idiag_cookie[1]) << 32;
      s.inode = m->idiag_inode;
      s.protocol = protocol;
      s.state = m->idiag_state;
      s.port = ntohs(m->id.idiag_sport);
      s.family = m->idiag_family;
      std::memcpy(s.addr, m->id.idiag_src, sizeof s.addr);
      s.uid = m->idiag_uid;
      s.ifindex = m->id.idiag_if;
      int alen = static_cast<int>(h->nlmsg_len - NLMSG_LENGTH(sizeof *m));
      for (auto* a = reinterpret_cast<rtattr*>(reinterpret_cast<char*>(m) + NLMSG_ALIGN(sizeof *m));
           RTA_OK(a, alen); a = RTA_NEXT(a, alen))
        if (a->rta_type == INET_DIAG_CLASS_ID && RTA_PAYLOAD(a) >= sizeof(uint32_t))
          std::memcpy(&s.class_id, RTA_DATA(a), sizeof s.class_id);
        else if (a->rta_type == INET_DIAG_SKV6ONLY && RTA_PAYLOAD(a) >= 1)  // sent for every AF_INET6 socket
          s.v6only = *static_cast<const uint8_t*>(RTA_DATA(a)) != 0;
      out.push_back(s);
    }
  }
}

// Every inet socket of the calling thread's network namespace. 0 or -errno.
int dump_namespace(std::vector<InetSock>& out) {
  UniqueFd nl(socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG));
  if (!nl) return -errno;
  for (int family : {AF_INET, AF_INET6})
    for (int protocol : {IPPROTO_UDP, IPPROTO_TCP})
      if (int r = dump(nl.get(), family, protocol, out)) return r;
  return 0;
}

// Opens `path` (a network namespace file) into `out` unless its namespace is in `seen`.
void add_namespace(const std::string& path, std::set<ino_t>& seen, std::vector<UniqueFd>& out) {
  struct stat st;
  if (stat(path.c_str(), &st) < 0 || seen.count(st.st_ino)) return;
  UniqueFd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd || fstat(fd.get(), &st) < 0 || !seen.insert(st.st_ino).second) return;
  out.push_back(std::move(fd));
}

// Calls fn(name) for each entry of directory `dir` but . and ..
void each_entry(const std::string& dir, const std::function<void(const std::string&)>& fn) {
  DIR* d = opendir(dir.c_str());
  while (dirent* de = d ? readdir(d) : nullptr)
    if (de->d_name[0] != '.') fn(std::string(de->d_name));
  if (d) closedir(d);
}

// The network namespaces of the tasks of process `pid` into `out` (a thread may have
// joined a namespace its process is not in: setns is per thread).
void add_process(const std::string& pid, std::set<ino_t>& seen, std::vector<UniqueFd>& out) {
  each_entry("/proc/" + pid + "/task", [&](const std::string& tid) {
    add_namespace("/proc/" + pid + "/task/" + tid + "/ns/net", seen, out);
  });
}

// Every network namespace some task is in or /run/netns names; syrupd's own first.
std::vector<UniqueFd> every_namespace() {
  std::set<ino_t> seen;
  std::vector<UniqueFd> out;
  add_namespace("/proc/self/ns/net", seen, out);
  if (out.empty()) return out;  // all_sockets() reports it: the first is syrupd's own
  each_entry("/proc", [&](const std::string& pid) {
    if (pid[0] >= '0' && pid[0] <= '9') add_process(pid, seen, out);
  });
  each_entry("/run/netns", [&](const std::string& name) { add_namespace("/run/netns/" + name, seen, out); });
  return out;
}

// Dumps each of `ns` from a thread of its own; the result of each dump goes to `rc`.
// setns changes only the calling thread's namespace: a thread of its own keeps the rest
// of syrupd where it is, and its namespace ends with it.
void dump_each(const std::vector<UniqueFd>& ns, std::vector<InetSock>& out, std::vector<int>& rc) {
  rc.assign(ns.size(), 0);
  std::thread([&] {
    for (size_t i = 0; i < ns.size(); i++)
      rc[i] = setns(ns[i].get(), CLONE_NEWNET) < 0 ? -errno : dump_namespace(out);
  }).join();
}

}  // namespace

int all_sockets(std::vector<InetSock>& out, std::string& err) {
  std::vector<UniqueFd> ns = every_namespace();
  std::vector<int> rc;
  dump_each(ns, out, rc);
  int own = ns.empty() ? -ENOENT : rc[0];
  if (own) err = std::string("cannot read the sockets of syrupd's network namespace (sock_diag): ") + std::strerror(-own);
  return own;
}

int own_sockets(std::vector<InetSock>& out, std::string& err) {
  int r = dump_namespace(out);
  if (r) err = std::string("cannot read the sockets of syrupd's network namespace (sock_diag): ") + std::strerror(-r);
  return r;
}

int netns_sockets(int netns_fd, std::vector<InetSock>& out, std::string& err) {
  std::vector<UniqueFd> ns;
  ns.emplace_back(fcntl(netns_fd, F_DUPFD_CLOEXEC, 0));
  std::vector<int> rc;
  dump_each(ns, out, rc);
  if (rc[0]) err = std::string("cannot read the sockets of the namespace (sock_diag): ") + std::strerror(-rc[0]);
  return rc[0];
}

int process_sockets(pid_t pid, std::vector<InetSock>& out, std::string& err) {
  std::set<ino_t> seen;
  std::vector<UniqueFd> ns;
  add_process(std::to_string(pid), seen, ns);
  std::vector<int> rc;
  dump_each(ns, out, rc);
  int last = -ENOENT;
  for (int r : rc)
    if (r == 0) return 0;
    else last = r;
  err = "cannot read the sockets of the network namespaces of process " + std::to_string(pid) +
        " (sock_diag): " + std::strerror(-last);
  return last;
}

}  // namespace syrup::inet_diag
