#include "socket_lookup.h"
#include "socket_lookup/request.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/sockios.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>

#include <bpf/bpf.h>
#include <gflags/gflags.h>

#include "cgroup.h"
#include "inet_diag.h"
#include "names.h"
#include "pins.h"
#include "registry.h"
#include "socket_select.h"
#include "socket_select/group_owner.h"

DEFINE_string(socket_lookup_ports, "",
              "socket-lookup hook: port ranges a user who is not an admin may steer, UID:LO-HI[,UID:LO-HI...] "
              "(e.g. 1000:8000-8099). Without a grant such a user steers only single ports it holds a socket "
              "on");

namespace {
bool valid_grants(const char* flag, const std::string& v) {
  std::vector<syrup::socket_lookup::Grant> g;
  std::string err;
  if (syrup::socket_lookup::parse_grants(v, g, err) == 0) return true;
  fprintf(stderr, "--%s: %s\n", flag, err.c_str());
  return false;
}
}  // namespace
DEFINE_validator(socket_lookup_ports, &valid_grants);

namespace syrup::socket_lookup {
namespace ss = socket_select;

int parse_grants(const std::string& text, std::vector<Grant>& out, std::string& err) {
  out.clear();
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find(',', pos);
    std::string item = text.substr(pos, end == std::string::npos ? std::string::npos : end - pos);
    pos = end == std::string::npos ? text.size() : end + 1;
    unsigned long uid, lo, hi;
    char tail;
    int n = std::sscanf(item.c_str(), "%lu:%lu-%lu%c", &uid, &lo, &hi, &tail);
    if (n == 2 && std::sscanf(item.c_str(), "%lu:%lu%c", &uid, &lo, &tail) == 2) hi = lo, n = 3;
    if (n != 3 || item.find_first_not_of("0123456789:-") != std::string::npos || uid >= UINT32_MAX ||
        lo < 1 || hi > 65535 || lo > hi) {
      err = "'" + names::printable(item) + "' is not UID:LO-HI with 1 <= LO <= HI <= 65535";
      return -EINVAL;
    }
    out.push_back({static_cast<uid_t>(uid), static_cast<uint16_t>(lo), static_cast<uint16_t>(hi)});
  }
  return 0;
}

std::string Claim::name() const {
  std::string ports = std::to_string(lo) + (hi != lo ? "-" + std::to_string(hi) : "");
  std::string a = address.empty() ? "*" : family == AF_INET6 ? "[" + address + "]" : address;
  return std::string(protocol == IPPROTO_TCP ? "tcp" : "udp") + "/" + a + ":" + ports + " in net:[" +
         std::to_string(netns) + "]";
}

const std::string* Claims::conflict(const Claim& c, const std::string& app, bool& same_app) const {
  for (const auto& [owner, held] : held_) {
    const auto& [claim, holder] = held;
    if (!claim.overlaps(c)) continue;
    if (holder == app && claim.name() == c.name()) continue;  // a replacement
    same_app = holder == app;
    return &holder;
  }
  return nullptr;
}

namespace {

// The executors while syrupd holds them (until install() puts them in the SOCKMAP).
struct Sockets {
  std::vector<UniqueFd> fds;
  std::vector<uint64_t> inodes;
  std::vector<int> source_fds;  // --pid: fd numbers in the process, for messages
  uint64_t netns = 0;
};

// Why socket `fd` cannot be an executor of a `protocol` claim ("" if it can), with `si`.
std::string unusable(int fd, int protocol, ss::SockInfo& si) {
  if (int r = ss::describe(fd, si)) return std::string("it is not an inet socket: ") + std::strerror(-r);
  if (si.protocol != protocol) return std::string("it is not a ") + (protocol == IPPROTO_TCP ? "TCP" : "UDP") + " socket";
  if (si.port == 0) return "it is not bound to a port";
  if (protocol == IPPROTO_TCP && !si.listening) return "it is a TCP socket that is not listening";
  sockaddr_storage peer;
  socklen_t len = sizeof peer;
  if (protocol == IPPROTO_UDP && getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &len) == 0)
    return "it is a connected UDP socket";
  return {};
}

// Adds socket `fd` as the next executor. 0 or -errno with `err` (`which` names it).
int add(Sockets& s, UniqueFd fd, int protocol, const std::string& which, std::string& err) {
  ss::SockInfo si;
  if (std::string why = unusable(fd.get(), protocol, si); !why.empty()) {
    err = which + " cannot be an executor: " + why;
    return -EINVAL;
  }
  if (s.fds.empty()) s.netns = si.netns;
  if (si.netns != s.netns) {
    err = which + " is in another network namespace than executor 0: a policy steers one namespace";
    return -EINVAL;
  }
  struct stat st;
  if (fstat(fd.get(), &st) < 0) return -errno;
  s.inodes.push_back(st.st_ino);
  s.fds.push_back(std::move(fd));
  return 0;
}

int from_fds(std::vector<UniqueFd> fds, int protocol, Sockets& out, std::string& err) {
  if (fds.empty()) {
    err = "the socket-lookup hook needs executors: pass the sockets (fds) or a pid";
    return -EINVAL;
  }
  if (fds.size() > SYR_MAX_EXECUTORS) {
    err = "at most " + std::to_string(SYR_MAX_EXECUTORS) + " executors per policy";
    return -E2BIG;
  }
  for (size_t i = 0; i < fds.size(); i++)
    if (int r = add(out, std::move(fds[i]), protocol, "executor " + std::to_string(i), err)) return r;
  return 0;
}

// The listening (tcp) or bound, unconnected (udp) sockets of process `pid`, in ascending
// fd order, taken as socket-select takes a group's: only those sock_diag showed first.
int from_pid(pid_t pid, int protocol, Sockets& out, std::string& err) {
  UniqueFd pidfd;
  std::vector<std::pair<int, uint64_t>> fds;
  if (int r = ss::socket_fds(pid, pidfd, fds, err)) return r;
  ss::Search usable(
      [&](const inet_diag::InetSock& s) {
        return s.protocol == protocol && s.port != 0 &&
               (protocol == IPPROTO_TCP ? s.state == TCP_LISTEN : s.state == TCP_CLOSE);
      },
      pid);
  std::set<uint64_t> seen;
  for (ss::Search::Pass pass : usable.passes()) {
    for (auto [n, ino] : fds) {
      if (!usable.wants(ino, pass) || !seen.insert(ino).second) continue;
      UniqueFd fd;
      if (int r = ss::take(pidfd.get(), n, ino, fd)) {
        if (r == -EBADF) continue;  // closed meanwhile
        err = "cannot take socket fd " + std::to_string(n) + " of process " + std::to_string(pid) + ": " +
              std::strerror(-r);
        return r;
      }
      ss::SockInfo si;
      if (!unusable(fd.get(), protocol, si).empty()) continue;
      if (out.fds.size() == SYR_MAX_EXECUTORS) {
        err = "process " + std::to_string(pid) + " has more than " + std::to_string(SYR_MAX_EXECUTORS) +
              " such sockets; a policy steers to at most that many";
        return -E2BIG;
      }
      if (int r = add(out, std::move(fd), protocol, "fd " + std::to_string(n), err)) return r;
      out.source_fds.push_back(n);
    }
    if (!seen.empty()) break;  // as socket-select: a later pass only if this found none
  }
  if (out.fds.empty()) {
    err = "process " + std::to_string(pid) + " has no " +
          (protocol == IPPROTO_TCP ? "listening TCP socket" : "bound, unconnected UDP socket");
    return -ENOENT;
  }
  return 0;
}

// The listening (bound) sockets of a cgroup's processes (--cgroup): from_pid() of each,
// each socket once (a forked worker shares its parent's), in ascending pid then fd order,
// all in one network namespace. The lowest pid that has one holds them and owns the policy.
int from_cgroup(const Caller& caller, const std::string& path, int protocol, Sockets& out, pid_t& holder,
                std::string& err) {
  std::vector<pid_t> pids;
  if (int r = cgroup::processes(path, caller.uid, caller.admin(), pids, err)) return r;
  for (pid_t pid : pids) {
    Sockets one;
    std::string why;
    int r = from_pid(pid, protocol, one, why);
    if (r == -ENOENT || r == -ESRCH) continue;
    if (r) {
      err = "cgroup " + path + ": " + why;
      return r;
    }
    for (size_t i = 0; i < one.fds.size(); i++) {
      if (std::count(out.inodes.begin(), out.inodes.end(), one.inodes[i])) continue;
      if (out.fds.size() == SYR_MAX_EXECUTORS) {
        err = "cgroup " + path + " has more than " + std::to_string(SYR_MAX_EXECUTORS) +
              " such sockets; a policy steers to at most that many";
        return -E2BIG;
      }
      if (out.fds.empty()) holder = pid;
      if (int rc = add(out, std::move(one.fds[i]), protocol, "fd " + std::to_string(one.source_fds[i]) +
                                                                " of process " + std::to_string(pid), err))
        return rc;
      out.source_fds.push_back(one.source_fds[i]);
    }
  }
  if (out.fds.empty()) {
    err = "no process of cgroup " + path + " has a " +
          (protocol == IPPROTO_TCP ? "listening TCP socket" : "bound, unconnected UDP socket");
    return -ENOENT;
  }
  return 0;
}

// The claim a request names (without its namespace).
Claim claim_of(const SocketLookupRequest& r) {
  Claim c;
  c.protocol = r.protocol;
  c.lo = r.port;
  c.hi = r.port_end;
  if (!r.address.empty()) {
    c.address = r.address;
    c.family = c.address.find(':') == std::string::npos ? AF_INET : AF_INET6;
    inet_pton(c.family, c.address.c_str(), c.addr);
  }
  return c;
}

// The words of every refusal of a claim the caller may not make: whether no one holds the
// ports or another application does reads the same.
std::string not_yours(const Claim& c) {
  return std::string(c.protocol == IPPROTO_TCP ? "tcp" : "udp") + " port" + (c.lo == c.hi ? " " : "s ") +
         std::to_string(c.lo) + (c.lo == c.hi ? "" : "-" + std::to_string(c.hi)) +
         " in this network namespace cannot be steered by the caller: a port range needs a grant "
         "(syrupd --socket_lookup_ports=UID:LO-HI), a single port an executor of the caller's own bound to it, "
         "and no other application may steer it";
}

// Whether every socket bound to `port` of `protocol` in namespace `netns_fd` is `uid`'s,
// and one is among the executors `s`: a port shared with another user's socket
// (SO_REUSEADDR lets UDP sockets of any users share one) is not the caller's to steer.
bool holds_port(uid_t uid, int netns_fd, int protocol, uint16_t port, const Sockets& s) {
  std::vector<inet_diag::InetSock> all;
  std::string ignored;
  if (inet_diag::netns_sockets(netns_fd, all, ignored)) return false;
  bool own = false;
  for (const auto& k : all) {
    if (k.protocol != protocol || k.port != port) continue;
    if (k.uid != uid) return false;
    for (uint64_t ino : s.inodes) own |= ino == k.inode;
  }
  return own;
}

// Whether `caller` may claim `c` with executors `s` in namespace `netns_fd`, and no other
// application holds an overlapping claim. 0, -EPERM or -EBUSY with `err`.
int may_claim(const Caller& caller, const Claim& c, const Sockets& s, int netns_fd, const std::string& app,
              const Claims& claims, std::string& err) {
  bool granted = caller.admin();
  std::vector<Grant> grants;
  std::string ignored;
  if (!granted && parse_grants(FLAGS_socket_lookup_ports, grants, ignored) == 0)
    for (const Grant& g : grants) granted |= g.uid == caller.uid && g.lo <= c.lo && c.hi <= g.hi;
  if (!granted && c.lo == c.hi) granted = holds_port(caller.uid, netns_fd, c.protocol, c.lo, s);
  bool same_app = false;
  const std::string* holder = claims.conflict(c, app, same_app);
  if (!granted || (holder && !caller.admin() && !same_app)) {
    err = not_yours(c);
    return -EPERM;
  }
  if (holder) {
    err = c.name() + " overlaps a claim of application '" + *holder + "'" +
          (same_app ? ": one policy per port; deploy again with the same ports to replace it" : "");
    return -EBUSY;
  }
  return 0;
}

class LookupTarget : public Target {
 public:
  LookupTarget(std::shared_ptr<Claims> claims, Claim c, std::string app)
      : claims_(std::move(claims)), claim_(std::move(c)), app_(std::move(app)) {}
  ~LookupTarget() override { claims_->drop(this); }

  Sockets sockets;
  UniqueFd netns;  // until install(): where to attach
  pid_t holder = 0;
  ss::Anchor anchor;  // deployed by pid: the process the policy lives with (group_owner.h)

  std::string key() const override { return claim_.name(); }
  uint32_t num_executors() const override { return static_cast<uint32_t>(sockets.inodes.size()); }

  // The claim, as the wrapper's read-only data: it passes everything else untouched.
  int prepare_load(LoadSpec& spec, const Target*, const LoadedPolicy*) override {
    uint32_t w[4];
    std::memcpy(w, claim_.addr, sizeof w);
    spec.params["syr_sl_protocol"] = claim_.protocol;
    spec.params["syr_sl_port_lo"] = claim_.lo;
    spec.params["syr_sl_port_hi"] = claim_.hi;
    spec.params["syr_sl_family"] = claim_.family;
    for (int i = 0; i < 4; i++) spec.params["syr_sl_addr" + std::to_string(i)] = w[i];
    return 0;
  }

  int install(LoadedPolicy& p, const Target* old, std::string& err) override {
    int map = p.map_fd(SYR_EXECUTORS_MAP);
    if (int r = fill(map, err)) return r;
    std::string pin = pins::policy_link(p.app, p.policy_id);
    int r = old ? replace(*static_cast<const LookupTarget*>(old), p, pin, err) : attach(p, pin, err);
    if (r) {
      release(map);
      return r;
    }
    link_pin_ = pin;
    sockets.fds.clear();  // the SOCKMAP holds them now
    netns.reset();
    return 0;
  }

  void uninstall(LoadedPolicy& p) override {
    if (link_) bpf_link_detach(link_.get());
    if (!link_pin_.empty()) unlink(link_pin_.c_str());
    release(p.map_fd(SYR_EXECUTORS_MAP));
    claims_->drop(this);
  }

  nlohmann::json describe() const override {
    nlohmann::json d = {{"claim", claim_.name()}, {"executors", sockets.inodes.size()}};
    if (map_) d["open_executors"] = open_executors();
    if (std::string why = gone(); !why.empty()) d["status"] = "ended: " + why;
    ss::describe_anchor(anchor, d);
    return d;
  }

  // The kernel has it all (link and SOCKMAP pinned): what a later syrupd needs is the
  // claim and the executors' identity, for messages and for the claim table.
  nlohmann::json save() const override {
    nlohmann::json s = {{"protocol", claim_.protocol}, {"lo", claim_.lo},          {"hi", claim_.hi},
                        {"address", claim_.address},   {"netns", claim_.netns},    {"holder", holder},
                        {"inodes", sockets.inodes}};
    ss::describe_anchor(anchor, s);
    return s;
  }

  // A namespace that ended, or a link someone detached, reads as netns_ino 0.
  std::string gone() const override {
    if (!link_) return {};
    bpf_link_info info{};
    uint32_t len = sizeof info;
    if (bpf_link_get_info_by_fd(link_.get(), &info, &len) == 0 && info.netns.netns_ino != 0) return {};
    return "its network namespace net:[" + std::to_string(claim_.netns) + "] is gone or its link was detached";
  }
  bool ends_unannounced() const override { return true; }

  // After install() or adopt(): the link and the SOCKMAP, to watch them.
  void watch(UniqueFd link, const LoadedPolicy& p, std::string pin) {
    link_ = std::move(link);
    link_pin_ = std::move(pin);
    map_.reset(fcntl(p.map_fd(SYR_EXECUTORS_MAP), F_DUPFD_CLOEXEC, 0));
    claims_->add(this, claim_, app_);
  }

 private:
  int fill(int map, std::string& err) {
    for (uint32_t i = 0; i < sockets.fds.size(); i++) {
      uint64_t fd = static_cast<uint64_t>(sockets.fds[i].get());
      if (bpf_map_update_elem(map, &i, &fd, BPF_ANY) < 0) {
        int e = errno;
        err = "cannot add executor " + std::to_string(i) + " to the SOCKMAP: " + std::strerror(e);
        release(map);
        return -e;
      }
    }
    return 0;
  }
  void release(int map) const {
    for (uint32_t i = 0; i < sockets.inodes.size(); i++) bpf_map_delete_elem(map, &i);
  }
  uint32_t open_executors() const {
    uint32_t n = 0;
    for (uint32_t i = 0; i < sockets.inodes.size(); i++) {
      uint64_t cookie;
      n += bpf_map_lookup_elem(map_.get(), &i, &cookie) == 0;
    }
    return n;
  }

  int attach(LoadedPolicy& p, const std::string& pin, std::string& err) {
    UniqueFd link(bpf_link_create(p.prog_fd(), netns.get(), BPF_SK_LOOKUP, nullptr));
    if (!link) {
      int e = errno;
      err = "cannot attach the policy to net:[" + std::to_string(claim_.netns) + "]: " + std::strerror(e);
      return -e;
    }
    if (bpf_obj_pin(link.get(), pin.c_str()) < 0) {
      int e = errno;
      err = "cannot pin the link at " + pin + ": " + std::strerror(e);
      bpf_link_detach(link.get());
      return -e;
    }
    watch(std::move(link), p, pin);
    return 0;
  }

  // The old policy's link takes the new program: one pointer swap in the kernel. The link
  // is pinned under the new policy first, so a failed swap leaves only that pin to undo.
  int replace(const LookupTarget& prev, LoadedPolicy& p, const std::string& pin, std::string& err) {
    UniqueFd link(fcntl(prev.link_.get(), F_DUPFD_CLOEXEC, 0));
    if (!link || bpf_obj_pin(link.get(), pin.c_str()) < 0) {
      int e = errno;
      err = "cannot pin the link of the replaced policy at " + pin + ": " + std::strerror(e);
      return -e;
    }
    if (bpf_link_update(link.get(), p.prog_fd(), nullptr) < 0) {
      int e = errno;
      unlink(pin.c_str());
      err = "cannot swap the policy into its link: " + std::string(std::strerror(e));
      return -e;
    }
    unlink(prev.link_pin_.c_str());  // so the replaced policy's directory can go
    watch(std::move(link), p, pin);
    return 0;
  }

  std::shared_ptr<Claims> claims_;
  Claim claim_;
  std::string app_;
  UniqueFd link_, map_;
  std::string link_pin_;
};

}  // namespace

SocketLookupHook::SocketLookupHook() : claims_(std::make_shared<Claims>()) {}

int SocketLookupHook::make_target(const Caller& caller, proto::Message& req, std::unique_ptr<Target>& out,
                                  pid_t& owner, std::string& err) {
  const auto& b = req.body;
  std::string app = b.contains("app") && b["app"].is_string() ? b["app"].get<std::string>() : std::string();
  SocketLookupRequest asked;
  if (Bad bad; !parse(hook_fields(b), asked, bad)) {
    err = bad.str();
    return -EINVAL;
  }
  Claim claim = claim_of(asked);
  Sockets sockets;
  ss::Anchor anchor;
  owner = caller.pid;
  if (pid_t pid = asked.pid) {
    if (int r = check_target_process(caller, pid, err)) return r;
    if (int r = from_pid(pid, claim.protocol, sockets, err)) return r;
    anchor = ss::group_owner(caller, pid, sockets.inodes);
    owner = anchor.pid;  // the steered server, not the tool that asked
  } else if (!asked.cgroup.empty()) {
    if (int r = from_cgroup(caller, asked.cgroup, claim.protocol, sockets, owner, err)) return r;
  } else if (int r = from_fds(std::move(req.fds), claim.protocol, sockets, err)) {
    return r;
  }
  claim.netns = sockets.netns;
  UniqueFd netns(ioctl(sockets.fds[0].get(), SIOCGSKNS));
  if (!netns) {
    int e = errno;
    err = std::string("cannot open the executors' network namespace: ") + std::strerror(e);
    return -e;
  }
  if (int r = may_claim(caller, claim, sockets, netns.get(), app, *claims_, err)) return r;
  auto t = std::make_unique<LookupTarget>(claims_, claim, app);
  t->netns = std::move(netns);
  t->sockets = std::move(sockets);
  t->holder = owner;
  t->anchor = std::move(anchor);
  out = std::move(t);
  return 0;
}

int SocketLookupHook::adopt(const nlohmann::json& saved, LoadedPolicy& p, std::unique_ptr<Target>& out,
                            std::string& err) {
  Claim c;
  c.protocol = saved.value("protocol", 0);
  c.lo = saved.value("lo", uint16_t{0});
  c.hi = saved.value("hi", uint16_t{0});
  c.netns = saved.value("netns", uint64_t{0});
  c.address = saved.value("address", std::string());
  if (!c.address.empty()) {
    c.family = c.address.find(':') == std::string::npos ? AF_INET : AF_INET6;
    inet_pton(c.family, c.address.c_str(), c.addr);
  }
  if ((c.protocol != IPPROTO_TCP && c.protocol != IPPROTO_UDP) || !c.lo || c.lo > c.hi) {
    err = "the saved claim is not one this hook makes";
    return -EINVAL;
  }
  std::string pin = pins::policy_link(p.app, p.policy_id);
  UniqueFd link(pins::obj_get(pin));
  bpf_link_info info{};
  uint32_t len = sizeof info;
  bpf_prog_info prog{};
  uint32_t prog_len = sizeof prog;
  if (!link || bpf_link_get_info_by_fd(link.get(), &info, &len) < 0 || info.type != BPF_LINK_TYPE_NETNS ||
      info.netns.netns_ino != c.netns || bpf_prog_get_info_by_fd(p.prog_fd(), &prog, &prog_len) < 0 ||
      info.prog_id != prog.id) {
    err = "its link " + pin + " is gone, runs another program, or is no longer attached to net:[" +
          std::to_string(c.netns) + "]";
    return -ENOENT;
  }
  auto t = std::make_unique<LookupTarget>(claims_, c, p.app);
  t->holder = saved.value("holder", 0);
  if (saved.contains("anchor_pid")) t->anchor = ss::anchor_from(saved, t->holder);
  t->sockets.inodes = saved.value("inodes", std::vector<uint64_t>{});
  t->watch(std::move(link), p, pin);
  out = std::move(t);
  return 0;
}

void SocketLookupHook::release_leftover(std::string_view, const std::string& policy_dir) {
  UniqueFd link(pins::obj_get(policy_dir + "/link"));
  if (link) bpf_link_detach(link.get());
}

}  // namespace syrup::socket_lookup

namespace syrup {
// hooks/registry.h
std::unique_ptr<Hook> make_socket_lookup_hook(const HookContext&) {
  return std::make_unique<socket_lookup::SocketLookupHook>();
}
}  // namespace syrup
