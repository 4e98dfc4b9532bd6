#include "registry.h"
#include "socket_select.h"
#include "socket_select/group_owner.h"
#include "socket_select/request.h"
#include "pins.h"
#include "cgroup.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <linux/sockios.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <functional>
#include <map>
#include <unordered_map>
#include <set>

#include <bpf/bpf.h>

#include "inet_diag.h"
#include "names.h"
#include "proc.h"
#include "syrup/abi.h"

namespace syrup::socket_select {
namespace {

int sockopt_int(int fd, int level, int opt, int& v) {
  socklen_t l = sizeof v;
  return getsockopt(fd, level, opt, &v, &l) < 0 ? -errno : 0;
}

const char* proto_name(int p) { return p == IPPROTO_TCP ? "tcp" : "udp"; }

}  // namespace

int describe(int fd, SockInfo& si) {
  struct stat st;
  if (fstat(fd, &st) < 0) return -errno;
  if (!S_ISSOCK(st.st_mode)) return -ENOTSOCK;
  sockaddr_storage ss{};
  socklen_t sl = sizeof ss;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &sl) < 0) return -errno;
  char buf[INET6_ADDRSTRLEN] = "";
  if (ss.ss_family == AF_INET) {
    auto* a = reinterpret_cast<sockaddr_in*>(&ss);
    si.port = ntohs(a->sin_port);
    inet_ntop(AF_INET, &a->sin_addr, buf, sizeof buf);
  } else if (ss.ss_family == AF_INET6) {
    auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
    si.port = ntohs(a->sin6_port);
    inet_ntop(AF_INET6, &a->sin6_addr, buf, sizeof buf);
  } else {
    return -EAFNOSUPPORT;
  }
  si.address = buf;
  int v = 0;
  if (int r = sockopt_int(fd, SOL_SOCKET, SO_PROTOCOL, v)) return r;
  si.protocol = v;
  if (int r = sockopt_int(fd, SOL_SOCKET, SO_REUSEPORT, v)) return r;
  si.reuseport = v != 0;
  if (int r = sockopt_int(fd, SOL_SOCKET, SO_ACCEPTCONN, v)) return r;
  si.listening = v != 0;
  UniqueFd ns(ioctl(fd, SIOCGSKNS));
  if (ns && fstat(ns.get(), &st) == 0) si.netns = st.st_ino;
  return 0;
}

namespace {
// The group `si` is in, without executors (assigned to an ExecutorIds, it clears them).
ExecutorIds group_of(const SockInfo& si) {
  ExecutorIds g;
  g.protocol = si.protocol;
  g.port = si.port;
  g.address = si.address;
  g.netns = si.netns;
  return g;
}

}  // namespace

// " in net:[N]" for a network namespace other than syrupd's, as /proc/PID/ns/net names it.
std::string in_netns(uint64_t netns) {
  static const uint64_t own = [] {
    struct stat st;
    return stat("/proc/self/ns/net", &st) == 0 ? static_cast<uint64_t>(st.st_ino) : 0;
  }();
  return netns && netns != own ? " in net:[" + std::to_string(netns) + "]" : "";
}

// The socket descriptors of process `pid`: (fd number, inode) in ascending fd order, and
// a pidfd of it to take them with (take()). 0 or -errno with `err`.
int socket_fds(pid_t pid, UniqueFd& pidfd, std::vector<std::pair<int, uint64_t>>& out, std::string& err) {
  pidfd.reset(static_cast<int>(syscall(SYS_pidfd_open, pid, 0)));
  if (!pidfd) {
    int e = errno;
    err = "no process " + std::to_string(pid) + ": " + std::strerror(e);
    return -e;
  }
  if (int r = socket_descriptors(pid, out)) {
    err = "cannot list /proc/" + std::to_string(pid) + "/fd: " + std::strerror(-r);
    return r;
  }
  return 0;
}

// A duplicate of fd `n` of the process behind `pidfd`, if that is still socket `ino`: 0,
// -EBADF if the process closed it (or reused the number) since it was listed, else -errno.
int take(int pidfd, int n, uint64_t ino, UniqueFd& out) {
  out.reset(static_cast<int>(syscall(SYS_pidfd_getfd, pidfd, n, 0)));
  if (!out) return -errno;
  struct stat st;
  if (fstat(out.get(), &st) == 0 && st.st_ino == ino) return 0;
  out.reset();
  return -EBADF;
}

Search::Search(std::function<bool(const inet_diag::InetSock&)> match, pid_t within)
    : match_(std::move(match)), within_(within) {
  std::vector<inet_diag::InetSock> some;
  std::string ignored;
  if (within ? inet_diag::process_sockets(within, some, ignored) : inet_diag::all_sockets(some, ignored)) return;
  for (const auto& s : some)
    if (match_(s)) first_.insert(s.inode);
  if (!within) {
    every_ = true;
    for (const auto& s : some) seen_.insert(s.inode);
    wider_ = first_;
  }
}

std::vector<Search::Pass> Search::passes() const {
  return within_ ? std::vector{kFirst, kWider, kUnseen} : std::vector{kFirst, kUnseen};
}

bool Search::wants(uint64_t inode, Pass pass) {
  if (pass == kFirst) return first_.count(inode) > 0;
  if (!every_) {  // dumped once, when a pass first needs it
    every_ = true;
    std::vector<inet_diag::InetSock> all;
    std::string ignored;
    inet_diag::all_sockets(all, ignored);
    for (const auto& s : all) {
      seen_.insert(s.inode);
      if (match_(s)) wider_.insert(s.inode);
    }
  }
  return pass == kWider ? wider_.count(inode) && !first_.count(inode) : !seen_.count(inode);
}

namespace {
// Why `si` cannot be an executor, or "".
std::string unusable(const SockInfo& si) {
  if (si.protocol != IPPROTO_UDP && si.protocol != IPPROTO_TCP) return "not a UDP or TCP socket";
  if (!si.reuseport) return "SO_REUSEPORT is not set on it";
  if (si.port == 0) return "it is not bound to a port";
  if (si.protocol == IPPROTO_TCP && !si.listening) return "it is a TCP socket that is not listening";
  return {};
}

}  // namespace

std::string ExecutorIds::group() const {
  return std::string(proto_name(protocol)) + "/" + address + ":" + std::to_string(port) + in_netns(netns);
}

int from_fds(std::vector<UniqueFd> fds, Executors& out, std::string& err) {
  if (fds.empty()) {
    err = "the socket-select hook needs executors: pass the sockets (fds) or a pid and port";
    return -EINVAL;
  }
  if (fds.size() > SYR_MAX_EXECUTORS) {
    err = "at most " + std::to_string(SYR_MAX_EXECUTORS) + " executors per policy";
    return -E2BIG;
  }
  out = Executors{};
  for (size_t i = 0; i < fds.size(); i++) {
    SockInfo si;
    int r = describe(fds[i].get(), si);
    if (r) {
      err = "executor " + std::to_string(i) + " is not an inet socket: " + std::strerror(-r);
      return r == -EAFNOSUPPORT ? -EINVAL : r;
    }
    if (std::string why = unusable(si); !why.empty()) {
      err = "executor " + std::to_string(i) + " cannot be scheduled: " + why;
      return -EINVAL;
    }
    struct stat st;
    if (fstat(fds[i].get(), &st) < 0) return -errno;
    if (i == 0) {
      static_cast<ExecutorIds&>(out) = group_of(si);
    } else if (std::string g = group_of(si).group(); g != out.group()) {
      err = "executor " + std::to_string(i) + " (" + g + ") is not in the group of executor 0 (" + out.group() + ")";
      return -EINVAL;
    }
    out.inodes.push_back(st.st_ino);
  }
  out.sockets = std::move(fds);
  return 0;
}

int from_pid(pid_t pid, uint16_t port, int protocol, const std::string& address, Executors& out,
             std::string& err) {
  if (port == 0) {
    err = "--pid needs --port: which of the process's sockets to schedule";
    return -EINVAL;
  }
  UniqueFd pidfd;
  std::vector<std::pair<int, uint64_t>> fds;
  if (int r = socket_fds(pid, pidfd, fds, err)) return r;
  // A UDP socket or a TCP listener on the port: a connection a listener accepted has the
  // port too, but is never an executor (and a server may hold thousands).
  Search on_port(
      [&](const inet_diag::InetSock& s) {
        return s.port == port && (!protocol || s.protocol == protocol) &&
               (s.protocol == IPPROTO_UDP || s.state == TCP_LISTEN);
      },
      pid);

  // Per group (its name: protocol, address, namespace), the sockets on `port` in
  // ascending fd order, one per socket (a socket the process has under two fd numbers
  // counts once, at its lowest).
  std::map<std::string, Executors> found;
  std::string why_not;  // why the first of its sockets on the port cannot be an executor
  std::set<uint64_t> seen;
  for (Search::Pass pass : on_port.passes()) {
    for (auto [n, ino] : fds) {
      if (!on_port.wants(ino, pass) || !seen.insert(ino).second) continue;
      UniqueFd fd;
      if (int r = take(pidfd.get(), n, ino, fd)) {
        if (r == -EBADF) continue;  // closed meanwhile
        err = "cannot take socket fd " + std::to_string(n) + " of process " + std::to_string(pid) +
              ": " + std::strerror(-r);
        return r;
      }
      SockInfo si;
      if (describe(fd.get(), si) || si.port != port || (protocol && si.protocol != protocol)) continue;
      ExecutorIds group = group_of(si);
      std::string name = group.group();
      if (std::string why = unusable(si); !why.empty()) {
        if (why_not.empty()) why_not = "fd " + std::to_string(n) + ", " + name + ": " + why;
        continue;
      }
      Executors& ex = found[name];
      if (ex.inodes.empty()) static_cast<ExecutorIds&>(ex) = group;
      ex.inodes.push_back(ino);
      ex.sockets.push_back(std::move(fd));
      ex.source_fds.push_back(n);
    }
    // The next pass only if this one found none of the process's sockets on the port:
    // each one looked at is taken, and so re-tagged (Search).
    if (!seen.empty()) break;
  }
  // UDP first when both protocols qualify; then the address, which must be named when the
  // process has several groups on the port (a guess would leave the others unscheduled).
  // Groups of one address in several network namespaces cannot be told apart by address:
  // the application passes the sockets of the one it means.
  for (int p : {IPPROTO_UDP, IPPROTO_TCP}) {
    std::vector<Executors*> groups, named;
    auto where = [](const std::vector<Executors*>& gs) {
      std::string w;
      for (Executors* ex : gs) w += (w.empty() ? "" : ", ") + ex->address + in_netns(ex->netns);
      return w;
    };
    for (auto& [key, ex] : found)
      if (ex.protocol == p) {
        groups.push_back(&ex);
        if (address.empty() || ex.address == address) named.push_back(&ex);
      }
    if (groups.empty()) continue;
    if (named.size() > 1) {
      bool one_address = std::all_of(named.begin(), named.end(), [&](Executors* ex) { return ex->address == named[0]->address; });
      err = "process " + std::to_string(pid) + " has " + std::to_string(named.size()) + " SO_REUSEPORT " +
            proto_name(p) + " groups on port " + std::to_string(port) + " (bound to " + where(named) + "): " +
            (one_address ? "they differ only in network namespace: deploy with the sockets (fds) of the one meant"
                         : "say which with address (syrupctl --address)");
      return -EINVAL;
    }
    if (named.empty()) {
      bool tcp_there = std::any_of(found.begin(), found.end(), [&](const auto& kv) {
        return kv.second.protocol == IPPROTO_TCP && kv.second.address == address;
      });
      if (protocol || p == IPPROTO_TCP || !tcp_there) {
        err = "process " + std::to_string(pid) + " has no SO_REUSEPORT " + proto_name(p) + " socket bound to " +
              address + " port " + std::to_string(port) + " (its groups on the port are bound to " + where(groups) +
              ")";
        return -ENOENT;
      }
      continue;  // a TCP group of that address
    }
    Executors* chosen = named[0];
    if (chosen->sockets.size() > SYR_MAX_EXECUTORS) {
      err = "the group " + chosen->group() + " of process " + std::to_string(pid) + " has " +
            std::to_string(chosen->sockets.size()) + " sockets; a policy schedules at most " +
            std::to_string(SYR_MAX_EXECUTORS);
      return -E2BIG;
    }
    out = std::move(*chosen);
    return 0;
  }
  err = "process " + std::to_string(pid) + " has no SO_REUSEPORT " +
        (protocol == IPPROTO_TCP ? "TCP listener" : protocol == IPPROTO_UDP ? "UDP socket" : "socket") +
        " bound to port " + std::to_string(port) + (why_not.empty() ? "" : " (" + why_not + ")");
  return -ENOENT;
}

namespace {
// Calls fn(pid) for every process, until it returns true.
void each_process(const std::function<bool(pid_t)>& fn) {
  DIR* d = opendir("/proc");
  while (dirent* de = d ? readdir(d) : nullptr) {
    pid_t pid = std::atoi(de->d_name);
    if (pid > 0 && fn(pid)) break;
  }
  if (d) closedir(d);
}

using Listing = std::unordered_map<uint64_t, int>;  // socket inode -> its lowest fd number

// While syrupd adopts a previous one's policies (SocketSelectHook::adopt() until
// recover()), every policy's sockets are taken from the same few holders: each holder's
// descriptors are listed once for the whole adoption, not once per policy (10,000
// policies of one process were 10^8 readlinks). A listing goes stale only by the holder
// closing or reusing a descriptor, which take() notices (it checks the inode of what it
// took): then that holder is listed again. Main thread only, like adoption.
bool g_adopting = false;
std::map<pid_t, Listing> g_listings;
std::map<pid_t, UniqueFd> g_pidfds;  // and each holder's pidfd, opened once

int list_sockets(pid_t pid, Listing& out) {
  std::vector<std::pair<int, uint64_t>> fds;
  if (int r = socket_descriptors(pid, fds)) return r;
  out.clear();
  for (auto [n, ino] : fds) out.emplace(ino, n);  // ascending: the lowest number stays
  return 0;
}

// Takes from process `pid` the executors of `ex` it holds that ex.sockets lacks, by inode.
// Adds to `held` the number taken; the first failure other than a descriptor closed
// meanwhile goes to `failed` and `err`. -ESRCH if the process is gone.
int take_from(pid_t pid, Executors& ex, size_t& held, int& failed, std::string& err) {
  UniqueFd own_pidfd;
  UniqueFd& pidfd = g_adopting ? g_pidfds[pid] : own_pidfd;
  if (!pidfd) pidfd.reset(static_cast<int>(syscall(SYS_pidfd_open, pid, 0)));
  if (!pidfd) return -ESRCH;
  Listing own;
  bool cached = g_adopting && g_listings.count(pid);
  Listing& fds = g_adopting ? g_listings[pid] : own;
  if (!cached && list_sockets(pid, fds)) return -ESRCH;
  bool stale = false;
  for (size_t i = 0; i < ex.inodes.size(); i++) {
    auto it = fds.find(ex.inodes[i]);
    if (ex.sockets[i] || it == fds.end()) continue;
    int r = take(pidfd.get(), it->second, ex.inodes[i], ex.sockets[i]);
    held += r == 0;
    stale |= r == -EBADF;
    if (r && r != -EBADF && !failed) {
      failed = r;
      err = "cannot take socket fd " + std::to_string(it->second) + " of process " + std::to_string(pid) + ": " +
            std::strerror(-r);
    }
  }
  if (stale && cached) {  // listed before the holder changed its descriptors: again, fresh
    g_listings.erase(pid);
    return take_from(pid, ex, held, failed, err);
  }
  return 0;
}
}  // namespace

int retake(Executors& ex, std::string& err) {
  ex.sockets.clear();
  ex.sockets.resize(ex.inodes.size());
  size_t held = 0;
  int failed = 0;
  bool holder_gone = take_from(ex.holder, ex, held, failed, err) == -ESRCH;
  // What the holder lacks, from whichever process has it: a worker it forked, or a
  // process it passed the sockets to. Without this, a group that outlives its holder could
  // not be reached, and a program left attached to it would keep dropping what its policy
  // drops after the policy was removed.
  if (held < ex.size())
    each_process([&](pid_t pid) {
      if (pid != ex.holder) take_from(pid, ex, held, failed, err);
      return held == ex.size();
    });
  if (held) return 0;
  if (failed) return failed;
  err = (holder_gone ? "process " + std::to_string(ex.holder) + ", which held its sockets, is gone"
                     : "process " + std::to_string(ex.holder) + " holds none of the " + std::to_string(ex.size()) +
                           " sockets any more") +
        ", and no other process has one";
  return holder_gone ? -ESRCH : -ENOENT;
}

int fill(const Executors& ex, int map_fd, std::string& err) {
  for (uint32_t i = 0; i < ex.sockets.size(); i++) {
    if (!ex.sockets[i]) continue;
    uint64_t fd = static_cast<uint64_t>(ex.sockets[i].get());
    if (bpf_map_update_elem(map_fd, &i, &fd, 0) < 0) {
      int e = errno;
      err = "cannot add executor " + std::to_string(i) + " to the executor map: " + std::strerror(e);
      return -e;
    }
  }
  return 0;
}

void release(int map_fd, size_t n) {
  for (uint32_t i = 0; i < n && i < SYR_MAX_EXECUTORS; i++) bpf_map_delete_elem(map_fd, &i);
}

bool same_sockets(const Executors& a, const Executors& b) { return a.inodes == b.inodes; }

uint32_t map_id(int map_fd) {
  bpf_map_info info{};
  uint32_t len = sizeof info;
  return bpf_map_get_info_by_fd(map_fd, &info, &len) == 0 ? info.id : 0;
}

namespace {
// A socket of the group that `ex` holds, or -1.
int member(const Executors& ex) {
  for (auto& s : ex.sockets)
    if (s) return s.get();
  return -1;
}
}  // namespace

int attach(const Executors& ex, int prog_fd, std::string& err) {
  if (setsockopt(member(ex), SOL_SOCKET, SO_ATTACH_REUSEPORT_EBPF, &prog_fd,
                 sizeof prog_fd) < 0) {
    int e = errno;
    err = "cannot attach the policy to " + ex.group() + ": " + std::strerror(e);
    return -e;
  }
  return 0;
}

int detach(const Executors& ex, std::string& err) {
  int dummy = 0;
  if (setsockopt(member(ex), SOL_SOCKET, SO_DETACH_REUSEPORT_BPF, &dummy,
                 sizeof dummy) < 0 &&
      errno != ENOENT) {
    int e = errno;
    err = "cannot detach the policy from " + ex.group() + ": " + std::strerror(e);
    return -e;
  }
  return 0;
}

}  // namespace syrup::socket_select

// ---- The hook and its target --------------------------------------------------------

namespace syrup::socket_select {
namespace {

class GroupTarget : public Target {
 public:
  explicit GroupTarget(Executors ex, Anchor anchor = {}) : ex_(std::move(ex)), anchor_(std::move(anchor)) {}
  std::string key() const override { return ex_.group(); }
  uint32_t num_executors() const override { return static_cast<uint32_t>(ex_.size()); }

  // The executors still open, as the kernel shows them: it empties a socket's slot in the
  // executor map when the socket closes (a lookup gives the socket's cookie).
  // `any`: stop at the first open one (1 or 0).
  uint32_t open_executors(bool any = false) const {
    uint32_t n = 0;
    for (uint32_t i = 0; i < ex_.size() && !(any && n); i++) {
      uint64_t cookie;
      n += bpf_map_lookup_elem(map_.get(), &i, &cookie) == 0;
    }
    return n;
  }

  // With every executor closed the group this policy was attached to has ended (a group
  // bound to the same address since is another one, without the program): it schedules
  // nothing, and it must not keep another deploy off that address.
  std::string gone() const override { return map_ && open_executors(true) == 0 ? ended() : std::string(); }
  std::string ended() const { return "every socket of its group " + key() + " was closed"; }
  // A socket closing tells no one outside its process.
  bool ends_unannounced() const override { return true; }

  // After install() or adopt(): the executor map, to see which executors are open.
  // Its policy too (borrowed: the policy outlives its target's use of it), whose program
  // a replacement's undo puts back: asked for when needed, since a policy at rest holds
  // no descriptor of its program (LoadedPolicy::release()).
  void watch(const LoadedPolicy& p) {
    map_.reset(fcntl(p.map_fd(SYR_EXECUTORS_MAP), F_DUPFD_CLOEXEC, 0));
    loaded_ = &p;
  }

  // A socket can be in one REUSEPORT_SOCKARRAY only: the new program shares the old
  // one's executor map.
  int prepare_load(LoadSpec& spec, const Target*, const LoadedPolicy* old_loaded) override {
    if (old_loaded) spec.reuse_maps[SYR_EXECUTORS_MAP] = old_loaded->map_fd(SYR_EXECUTORS_MAP);
    return 0;
  }

  int install(LoadedPolicy& p, const Target* old, DeployTxn& txn, std::string& err) override {
    auto* prev = static_cast<const GroupTarget*>(old);
    int map = p.map_fd(SYR_EXECUTORS_MAP);
    // Same sockets: the swap is the attach alone, one atomic pointer exchange. Other
    // sockets: until the attach, the old program may find a slot empty and leave that
    // datagram to the kernel's hash (never a drop).
    if (!prev || !same_sockets(prev->ex_, ex_)) {
      // Undone: the (shared) map emptied, and the old group's sockets put back.
      size_t n = std::max(ex_.size(), prev ? prev->ex_.size() : 0);
      auto back = prev ? std::make_shared<Executors>(prev->ex_.identity()) : nullptr;
      txn.on_undo("executor map of " + key(), [map, n, back] {
        release(map, n);
        std::string ignored;
        if (back && retake(*back, ignored) == 0) fill(*back, map, ignored);
      });
      if (prev) release(map, prev->ex_.size());
      if (int r = fill(ex_, map, err)) return r;
    }
    if (int r = attach(ex_, p.prog_fd(), err)) return r;
    // From the commit on the application's descriptors alone keep the sockets; until
    // then the undo holds them, to put the old program back (or none) through one.
    auto held = std::make_shared<Executors>(ex_.identity());
    held->sockets = std::move(ex_.sockets);
    ex_.sockets.clear();
    int prev_prog = prev && prev->loaded_ ? prev->loaded_->prog_fd() : -1;
    txn.on_undo("attach to " + key(), [held, prev_prog] {
      std::string ignored;
      prev_prog >= 0 ? attach(*held, prev_prog, ignored) : detach(*held, ignored);
    });
    watch(p);
    return 0;
  }

  void uninstall(LoadedPolicy& p) override {
    // Through a socket of the group: one of the executors, which any process may still
    // have (a worker the owner forked outlives it), else one the holder bound to the group
    // since (the group lives on while any socket of it is open). With neither, the group
    // ended with its sockets.
    Executors now = ex_.identity();
    std::string err;
    if (retake(now, err) == 0 ||
        from_pid(ex_.holder, ex_.port, ex_.protocol, ex_.address, now, err) == 0)
      detach(now, err);
    // At once, so the group can be deployed to again (the kernel frees maps lazily).
    release(p.map_fd(SYR_EXECUTORS_MAP), ex_.size());
  }

  nlohmann::json describe() const override {
    nlohmann::json d = {{"group", ex_.group()}, {"executors", ex_.size()}};
    describe_anchor(anchor_, d);
    if (!map_) return d;
    uint32_t open = open_executors();
    d["open_executors"] = open;
    if (open == 0) d["status"] = "ended: " + ended();
    return d;
  }

  std::vector<std::string> live_keys() const override { return {"open_executors", "status"}; }
  bool describe_live(std::string& out) const override {
    if (!map_) return true;
    uint32_t open = open_executors();
    out += ",\"open_executors\":" + std::to_string(open);
    if (open == 0)
      out += ",\"status\":" + nlohmann::json("ended: " + ended()).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    return true;
  }

  // The sockets themselves cannot be saved: their identity (inodes, in executor order)
  // and a process that holds them can, and a later syrupd takes them again from there.
  nlohmann::json save() const override {
    nlohmann::json s = {{"protocol", ex_.protocol}, {"port", ex_.port},
                        {"address", ex_.address},   {"holder", ex_.holder}, {"inodes", ex_.inodes}};
    if (anchor_.pid) describe_anchor(anchor_, s);
    if (ex_.netns) s["netns"] = ex_.netns;
    return s;
  }

 private:
  Executors ex_;
  Anchor anchor_;  // deployed by pid: the process the policy lives with (group_owner.h)
  UniqueFd map_;
  const LoadedPolicy* loaded_ = nullptr;  // its policy's, once installed or adopted (watch())
};

// The group on the port among the sockets of a cgroup's processes (--cgroup): each
// process's group as from_pid() finds it, merged, each socket once (a forked worker shares
// its parent's), in ascending pid then fd order. The lowest pid that has one holds the
// group (Executors::holder) and owns the policy, as --pid's process would.
int from_cgroup(const Caller& caller, const SocketSelectRequest& r, Executors& out, pid_t& holder, std::string& err) {
  std::vector<pid_t> pids;
  if (int rc = cgroup::processes(r.cgroup, caller.uid, caller.admin(), pids, err)) return rc;
  std::string none;  // why the first process without the group has none
  out = Executors{};
  for (pid_t pid : pids) {
    Executors ex;
    std::string why;
    int rc = from_pid(pid, r.port, r.protocol, r.address, ex, why);
    if (rc == -ENOENT || rc == -ESRCH) {
      if (none.empty()) none = why;
      continue;
    }
    if (rc) {
      err = "cgroup " + r.cgroup + ": " + why;
      return rc;
    }
    if (out.inodes.empty()) {
      out = std::move(ex);
      holder = pid;
      continue;
    }
    if (ex.group() != out.group()) {
      err = "cgroup " + r.cgroup + " has two SO_REUSEPORT groups on port " + std::to_string(r.port) + ": " +
            out.group() + " (process " + std::to_string(holder) + ") and " + ex.group() + " (process " +
            std::to_string(pid) + "): say which with protocol or address";
      return -EINVAL;
    }
    for (size_t i = 0; i < ex.inodes.size(); i++) {
      if (std::count(out.inodes.begin(), out.inodes.end(), ex.inodes[i])) continue;
      out.inodes.push_back(ex.inodes[i]);
      out.sockets.push_back(std::move(ex.sockets[i]));
      out.source_fds.push_back(ex.source_fds[i]);
    }
  }
  if (out.inodes.empty()) {
    err = "no process of cgroup " + r.cgroup + " has an SO_REUSEPORT socket bound to port " + std::to_string(r.port) +
          (none.empty() ? "" : " (" + none + ")");
    return -ENOENT;
  }
  if (out.inodes.size() > SYR_MAX_EXECUTORS) {
    err = "the group " + out.group() + " of cgroup " + r.cgroup + " has " + std::to_string(out.inodes.size()) +
          " sockets; a policy schedules at most " + std::to_string(SYR_MAX_EXECUTORS);
    return -E2BIG;
  }
  return 0;
}

}  // namespace

namespace {
// A worker may hold only its own sockets of the group (a server may close the others'
// after the fork): the anchor's, a superset in the same group, are the executors then,
// so that whichever pid of the server was given, the policy schedules the same sockets.
void take_whole_group(pid_t anchor, Executors& ex) {
  Executors all;
  std::string ignored;
  if (from_pid(anchor, ex.port, ex.protocol, ex.address, all, ignored) || all.netns != ex.netns ||
      all.size() <= ex.size())
    return;
  std::set<uint64_t> have(all.inodes.begin(), all.inodes.end());
  if (std::all_of(ex.inodes.begin(), ex.inodes.end(), [&](uint64_t i) { return have.count(i) > 0; }))
    ex = std::move(all);
}
}  // namespace

int SocketSelectHook::make_target(const Caller& caller, proto::Message& req,
                                  std::unique_ptr<Target>& out, pid_t& owner, std::string& err) {
  SocketSelectRequest r;
  if (Bad bad; !parse(hook_fields(req.body), r, bad)) {
    err = bad.str();
    return -EINVAL;
  }
  Executors ex;
  Anchor anchor;
  owner = caller.pid;
  if (r.pid) {
    if (int rc = check_target_process(caller, r.pid, err)) return rc;
    if (int rc = from_pid(r.pid, r.port, r.protocol, r.address, ex, err)) return rc;
    anchor = group_owner(caller, r.pid, ex.inodes);
    if (anchor.pid != r.pid) take_whole_group(anchor.pid, ex);
    owner = anchor.pid;  // the scheduled server, not the tool that asked
  } else if (!r.cgroup.empty()) {
    if (int rc = from_cgroup(caller, r, ex, owner, err)) return rc;
  } else if (int rc = from_fds(std::move(req.fds), ex, err)) {
    return rc;
  }
  ex.holder = owner;
  out = std::make_unique<GroupTarget>(std::move(ex), std::move(anchor));
  return 0;
}

int SocketSelectHook::adopt(const nlohmann::json& saved, LoadedPolicy& p, std::unique_ptr<Target>& out,
                            std::string& err) {
  g_adopting = true;
  Executors ex;
  ex.protocol = saved.value("protocol", 0);
  ex.port = saved.value("port", 0);
  ex.address = saved.value("address", std::string());
  ex.holder = saved.value("holder", 0);
  ex.inodes = saved.value("inodes", std::vector<uint64_t>{});
  Anchor anchor = saved.contains("anchor_pid") ? anchor_from(saved, ex.holder) : Anchor{};
  if (ex.inodes.empty()) {
    err = "no executors were saved";
    return -EINVAL;
  }
  // Some process (the holder, else any) must still have a socket of the policy; one closed
  // meanwhile has left the group, and its slot in the executor map is empty.
  if (int r = retake(ex, err)) return r;
  // The group's network namespace (part of its name): as saved (a socket's namespace
  // never changes, and take() checked each socket's inode), else read from a socket of it
  // (8 syscalls: at 10,000 policies a tenth of a restart).
  ex.netns = saved.value("netns", uint64_t{0});
  for (const auto& s : ex.sockets) {
    if (ex.netns) break;
    SockInfo si;
    if (s && describe(s.get(), si) == 0) {
      ex.netns = si.netns;
      break;
    }
  }
  ex.sockets.clear();
  auto t = std::make_unique<GroupTarget>(std::move(ex), std::move(anchor));
  t->watch(p);
  out = std::move(t);
  adopted_maps_.insert(map_id(p.map_fd(SYR_EXECUTORS_MAP)));
  return 0;
}

void SocketSelectHook::recover() {
  g_adopting = false;
  g_listings.clear();
  g_pidfds.clear();
}

void SocketSelectHook::release_leftover(std::string_view, const std::string& policy_dir) {
  UniqueFd m(pins::obj_get(policy_dir + "/" SYR_EXECUTORS_MAP));
  // A replacement the previous syrupd had pinned but not recorded shares its executor map
  // with the adopted policy it was replacing: that group is the adopted policy's.
  if (!m || adopted_maps_.count(map_id(m.get()))) return;
  // Its program may still be attached to its group: no record says which, but the
  // executor map still holds the group's open sockets (a lookup gives a socket's cookie),
  // and any process's socket of that cookie is a way in to detach it. Then the map is
  // emptied, which frees the sockets for a new deploy.
  std::set<uint64_t> cookies;
  for (uint32_t i = 0; i < SYR_MAX_EXECUTORS; i++) {
    uint64_t c;
    if (bpf_map_lookup_elem(m.get(), &i, &c) == 0) cookies.insert(c);
  }
  if (cookies.empty()) {
    release(m.get());
    return;
  }
  Search in_group([&](const inet_diag::InetSock& s) { return cookies.count(s.cookie) > 0; }, 0);
  bool detached = false;
  for (Search::Pass pass : in_group.passes())
    each_process([&](pid_t pid) {
      UniqueFd pidfd;
      std::vector<std::pair<int, uint64_t>> fds;
      std::string ignored;
      if (detached || socket_fds(pid, pidfd, fds, ignored)) return detached;
      for (auto [n, ino] : fds) {
        Executors ex;
        ex.sockets.resize(1);
        uint64_t cookie = 0;
        socklen_t len = sizeof cookie;
        if (!in_group.wants(ino, pass) || take(pidfd.get(), n, ino, ex.sockets[0]) ||
            getsockopt(ex.sockets[0].get(), SOL_SOCKET, SO_COOKIE, &cookie, &len) || !cookies.count(cookie))
          continue;
        detach(ex, ignored);
        return detached = true;
      }
      return false;
    });
  release(m.get());
}

}  // namespace syrup::socket_select

namespace syrup {
// hooks/registry.h
std::unique_ptr<Hook> make_socket_select_hook(const HookContext&) {
  return std::make_unique<socket_select::SocketSelectHook>();
}
}  // namespace syrup
