#include "registry.h"
#include "xdp.h"
#include "xdp/request.h"

#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <dirent.h>
#include <linux/ethtool.h>
#include <linux/if_link.h>
#include <linux/sockios.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <linux/if_xdp.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xdp/libxdp.h>

#include <cerrno>
#include <cstdarg>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>

#include "cgroup.h"
#include "inet_diag.h"
#include "log.h"
#include "names.h"
#include "pins.h"
#include "proc.h"
#include "unique_fd.h"

namespace syrup::xdp {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kRootProg = "prog";

// The policy wrapper's section (kernel/hooks/xdp/wrapper.bpf.h): XDP, expected attach type
// 0. The kernel lets a program into a prog array only if its expected attach type is the
// array's owner's; inside libxdp's dispatcher the root is an extension, which libxdp loads
// with 0, while libbpf's own "xdp" section gives BPF_XDP. So the root (open_object) and its
// policies are loaded with 0 wherever the root runs. Registered with libbpf before main(),
// ahead of any policy's load.
constexpr const char* kPolicySection = "syrup_xdp";
constexpr auto kNoAttachType = static_cast<bpf_attach_type>(0);
[[maybe_unused]] const int policy_section_registered =
    libbpf_register_prog_handler(kPolicySection, BPF_PROG_TYPE_XDP, kNoAttachType, nullptr);
constexpr const char* kRootMaps[] = {"syr_xdp_apps", "syr_xdp_ports", SYR_XDP_META_MAP,
                                     "syr_xdp_root_stats"};

int libxdp_print(enum libxdp_print_level level, const char* fmt, va_list ap) {
  char buf[1024];
  vsnprintf(buf, sizeof buf, fmt, ap);
  std::string line(buf);
  while (!line.empty() && line.back() == '\n') line.pop_back();
  // Even libxdp's warnings are debug here: on kernels without BPF trampolines it warns
  // that its dispatcher is unavailable, which Syrup expects (its root program dispatches).
  (void)level;
  log(LogLevel::kDebug, "libxdp: %s", line.c_str());
  return 0;
}

struct Claim {
  uint8_t protocol;
  uint16_t port;
  auto operator<=>(const Claim&) const = default;
  std::string str() const {
    return std::string(protocol == IPPROTO_TCP ? "tcp" : "udp") + ":" + std::to_string(port);
  }
  uint32_t key() const { return SYR_XDP_PORT_INDEX(protocol == IPPROTO_TCP, port); }
};

// Why a caller of uid `uid` whose process `pid` holds the sockets it holds may not claim
// `claims` on the interface of index `ifindex`, or empty.
//
// The root program matches a frame by (protocol, destination port) alone, IPv4 and IPv6
// alike and whatever the destination address (kernel/hooks/xdp/root.bpf.c), so a claim
// takes every frame of that port on the interface. A caller may have that only when its
// own sockets would receive all of those frames anyway: sockets of `pid` in syrupd's
// network namespace, where the interfaces are (one bound in a container's namespace holds
// the port there, not here), bound to no other interface, on the wildcard address of both
// families (an AF_INET6 socket on [::] without IPV6_V6ONLY, or 0.0.0.0 and [::]), and for
// TCP listening; and while no socket of another user has that port (SO_REUSEADDR lets two
// users bind one UDP port; a TCP connection may have it as its local port). A socket
// holding [::]:P with IPV6_V6ONLY alone would otherwise take another user's IPv4 traffic to
// 0.0.0.0:P.
std::string claim_refusal(pid_t pid, uid_t uid, uint32_t ifindex, const std::set<Claim>& claims) {
  std::vector<std::pair<int, uint64_t>> fds;
  socket_descriptors(pid, fds);
  std::set<uint64_t> inodes;
  for (auto [n, ino] : fds) inodes.insert(ino);
  std::vector<inet_diag::InetSock> here;
  std::string err;
  if (inet_diag::own_sockets(here, err)) log(LogLevel::kWarn, "xdp: %s", err.c_str());
  static const uint8_t any[16] = {}, mapped_any[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0, 0, 0, 0};
  for (const auto& c : claims) {
    bool mine = false, v4 = false, v6 = false;
    std::string have;  // what the caller's sockets on the port receive, for the refusal
    for (const auto& s : here) {
      // No inode: a TCP time-wait or request socket, nobody's traffic but the kernel's.
      if (s.protocol != c.protocol || s.port != c.port || !s.inode) continue;
      if (!inodes.count(s.inode)) {
        if (s.uid != uid)
          return c.str() + " is also bound by a socket of another user: a claim would take its frames "
                           "(only admins may claim it)";
        continue;
      }
      mine = true;
      char a[INET6_ADDRSTRLEN] = "?";
      inet_ntop(s.family, s.addr, a, sizeof a);
      std::string shown = s.family == AF_INET6 ? "[" + std::string(a) + "]" : std::string(a);
      if (s.ifindex && s.ifindex != ifindex) {
        have += (have.empty() ? "" : ", ") + shown + " bound to another interface";
        continue;
      }
      if (c.protocol == IPPROTO_TCP && s.state != TCP_LISTEN) {
        have += (have.empty() ? "" : ", ") + shown + " not listening";
        continue;
      }
      bool wild4 = s.family == AF_INET && std::memcmp(s.addr, any, 4) == 0;
      bool wild6 = s.family == AF_INET6 && std::memcmp(s.addr, any, 16) == 0;
      bool mapped4 = s.family == AF_INET6 && std::memcmp(s.addr, mapped_any, 16) == 0;
      v4 |= wild4 || mapped4 || (wild6 && !s.v6only);
      v6 |= wild6;
      have += (have.empty() ? "" : ", ") + shown +
              (wild6 ? (s.v6only ? " with IPV6_V6ONLY (IPv6 only)" : " (IPv4 and IPv6)")
               : wild4 || mapped4 ? " (IPv4 only)"
                                  : " (that address only)");
    }
    if (!mine) return "the caller has no socket bound to " + c.str() + " (only admins may claim other ports)";
    if (!v4 || !v6)
      return "the caller's sockets on " + c.str() + " do not receive all of its frames: " + have +
             "; the XDP root steers a claimed port's IPv4 and IPv6 frames to any address alike, so a claim "
             "needs sockets bound to the wildcard address of both families ([::] without IPV6_V6ONLY, or "
             "0.0.0.0 and [::])" +
             (c.protocol == IPPROTO_TCP ? ", listening" : "") + " (only admins may claim it otherwise)";
  }
  return {};
}

// Whether the kernel runs program `id` on interface `ifindex`: attached to it, or one of
// the programs of the libxdp dispatcher attached to it (found through libxdp's pins of the
// dispatcher's links, read under libxdp's lock). `mode`: how it is attached.
bool runs_on(int ifindex, uint32_t id, enum xdp_attach_mode& mode) {
  LIBBPF_OPTS(bpf_xdp_query_opts, q);
  if (!ifindex || bpf_xdp_query(ifindex, 0, &q) || !q.prog_id) return false;
  if (q.drv_prog_id == id || q.skb_prog_id == id) {
    mode = q.skb_prog_id == id ? XDP_MODE_SKB : XDP_MODE_NATIVE;
    return true;
  }
  xdp_multiprog* mp = xdp_multiprog__get_from_ifindex(ifindex);
  if (!mp || libxdp_get_error(mp)) return false;
  bool found = false;
  if (!xdp_multiprog__is_legacy(mp))
    for (xdp_program* p = nullptr; (p = xdp_multiprog__next_prog(p, mp));) found |= xdp_program__id(p) == id;
  if (found) mode = xdp_multiprog__attach_mode(mp);
  xdp_multiprog__close(mp);
  return found;
}

// The root program a previous syrupd pinned for `ifname` (`prog`, kernel id `prog_id`) and
// the interface it runs on (runs_on(), `mode` filled): its index, or 0 if it is not pinned
// or not attached. The kernel attaches by index, so the interface may have been renamed
// away from the pin's name while no syrupd ran: it is looked for by id.
int pinned_root(const std::string& ifname, UniqueFd& prog, uint32_t& prog_id, enum xdp_attach_mode& mode) {
  prog.reset(pins::obj_get(pins::xdp_root_obj(ifname, kRootProg)));
  bpf_prog_info info{};
  uint32_t len = sizeof info;
  if (!prog || bpf_prog_get_info_by_fd(prog.get(), &info, &len)) return 0;
  prog_id = info.id;
  auto has = [&](unsigned ifindex) { return runs_on(static_cast<int>(ifindex), prog_id, mode); };
  if (unsigned i = if_nametoindex(ifname.c_str()); has(i)) return static_cast<int>(i);
  int found = 0;
  if (struct if_nameindex* all = if_nameindex()) {
    for (struct if_nameindex* i = all; i->if_index && !found; i++)
      if (has(i->if_index)) found = static_cast<int>(i->if_index);
    if_freenameindex(all);
  }
  return found;
}

// --cgroup: the ports (of the request's protocol; of its ports, if it names some) that
// the cgroup's processes have a UDP socket bound to or a TCP socket listening on, in
// syrupd's network namespace (where the interfaces are), each with the process that
// holds it: the claim rules are then checked per process, as for --pid. The ports are
// read once, at the deploy; a port the cgroup opens later is not added.
int cgroup_claims(const Caller& caller, const XdpRequest& r, std::map<pid_t, std::set<Claim>>& out,
                  std::string& err) {
  std::vector<pid_t> pids;
  if (int rc = cgroup::processes(r.cgroup, caller.uid, caller.admin(), pids, err)) return rc;
  std::vector<inet_diag::InetSock> here;
  if (int rc = inet_diag::own_sockets(here, err)) return rc;
  std::map<uint64_t, uint16_t> port_of;  // by inode
  for (const auto& s : here)
    if (s.inode && s.port && s.protocol == r.protocol && s.state == (s.protocol == IPPROTO_UDP ? TCP_CLOSE : TCP_LISTEN))
      port_of[s.inode] = s.port;
  out.clear();
  std::set<uint16_t> taken;
  for (pid_t pid : pids) {
    std::vector<std::pair<int, uint64_t>> fds;
    socket_descriptors(pid, fds);
    for (auto [n, ino] : fds) {
      auto it = port_of.find(ino);
      if (it == port_of.end() || (!r.ports.empty() && !r.ports.count(it->second))) continue;
      if (taken.insert(it->second).second) out[pid].insert({static_cast<uint8_t>(r.protocol), it->second});
    }
  }
  const char* proto = r.protocol == IPPROTO_TCP ? "tcp" : "udp";
  for (uint16_t p : r.ports)
    if (!taken.count(p)) {
      err = std::string(proto) + ":" + std::to_string(p) + ": no process of cgroup " + r.cgroup +
            " has a socket on it in syrupd's network namespace, where " + r.ifname + " is";
      return -ENOENT;
    }
  if (taken.empty()) {
    err = "no process of cgroup " + r.cgroup + " has a " + (r.protocol == IPPROTO_TCP ? "listening TCP" : "bound UDP") +
          " socket in syrupd's network namespace, where " + r.ifname + " is: no ports to schedule";
    return -ENOENT;
  }
  return 0;
}

// The kernel driver of interface `ifname` (ETHTOOL_GDRVINFO), or empty.
std::string driver_of(const std::string& ifname) {
  UniqueFd s(socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  ethtool_drvinfo info{};
  info.cmd = ETHTOOL_GDRVINFO;
  ifreq ifr{};
  std::strncpy(ifr.ifr_name, ifname.c_str(), IFNAMSIZ - 1);
  ifr.ifr_data = reinterpret_cast<char*>(&info);
  if (!s || ioctl(s.get(), SIOCETHTOOL, &ifr) < 0) return {};
  return info.driver;
}

// Whether frames arriving on a device of `driver` may carry a checksum their sender left
// to offload (CHECKSUM_PARTIAL: the L4 checksum field holds only the pseudo-header's sum).
// veth hands the peer's skb over as it is, with tx checksum offload on by default, and tun
// takes the state from the writer's virtio-net header. Native XDP turns a frame it
// redirects (to a CPUMAP) into an xdp_frame without that state, and the skb the CPUMAP
// builds from it fails checksum validation: every datagram and segment is dropped. Generic
// XDP redirects the skb itself, state included. (docs/xdp.md)
bool partial_checksums(const std::string& driver) { return driver == "veth" || driver == "tun"; }

}  // namespace

// ---- Root ---------------------------------------------------------------------------

class Root {
 public:
  ~Root() {
    if (xprog_) xdp_program__close(xprog_);
    if (obj_) bpf_object__close(obj_);
  }

  static int create(Compiler& compiler, const std::string& ifname, std::shared_ptr<Root>& out,
                    std::string& err) {
    auto r = std::make_shared<Root>();
    r->ifname_ = ifname;
    r->ifindex_ = static_cast<int>(if_nametoindex(ifname.c_str()));
    if (!r->ifindex_) {
      err = "no network interface '" + ifname + "'";
      return -ENODEV;
    }
    if (int e = compiler.compile_own("xdp/root.bpf.c", "the XDP root program", r->object_path_, err)) return e;
    if (int e = r->open_object(err)) return e;
    out = std::move(r);
    return 0;
  }

  // The root a previous syrupd attached to `ifname`, from its pins, still attached.
  static int adopt(const std::string& ifname, std::shared_ptr<Root>& out, std::string& err) {
    // Kept under its saved name even if the interface was renamed meanwhile: the other
    // policies on it find it so; recover() then follows the rename.
    auto r = std::make_shared<Root>();
    r->ifname_ = ifname;
    uint32_t id = 0;
    if (!(r->ifindex_ = pinned_root(ifname, r->adopted_prog_, id, r->mode_))) {
      err = "the XDP root program of " + ifname + " is no longer attached";
      return -ENOENT;
    }
    for (const char* m : kRootMaps) {
      UniqueFd fd(pins::obj_get(pins::xdp_root_obj(ifname, m)));
      if (!fd) {
        err = std::string("map ") + m + " of the XDP root of " + ifname + " is not pinned";
        return -ENOENT;
      }
      r->adopted_maps_[m] = std::move(fd);
    }
    r->xprog_ = xdp_program__from_fd(r->adopted_prog_.get());
    if (!r->xprog_ || libxdp_get_error(r->xprog_)) {
      r->xprog_ = nullptr;
      err = "libxdp cannot use the adopted root program";
      return -EINVAL;
    }
    r->prog_id_ = id;
    r->attached_ = true;
    out = std::move(r);
    return 0;
  }

  // Opens the root's object. libxdp loads the program when it attaches it (as an
  // extension of its dispatcher where it can), but policies are loaded before that and
  // share the root's maps: the maps are made here, once (made_maps_), and an object
  // opened again (ensure_attached) has the same ones.
  int open_object(std::string& err) {
    if (xprog_) xdp_program__close(xprog_);
    xprog_ = nullptr;
    if (obj_) bpf_object__close(obj_);
    {
      // libbpf says it skips the section of libxdp's run config (root.bpf.c), which only
      // libxdp reads: expected, not a warning for the log.
      LibbpfQuiet quiet;
      obj_ = bpf_object__open_file(object_path_.c_str(), nullptr);
    }
    if (!obj_) {
      int e = -errno;
      err = "cannot open the XDP root program: " + std::string(std::strerror(-e));
      return e;
    }
    bpf_map* m;
    bpf_object__for_each_map(m, obj_) {
      UniqueFd& fd = made_maps_[bpf_map__name(m)];
      LIBBPF_OPTS(bpf_map_create_opts, o, .map_flags = bpf_map__map_flags(m));
      if (!fd)
        fd.reset(bpf_map_create(bpf_map__type(m), bpf_map__name(m), bpf_map__key_size(m), bpf_map__value_size(m),
                                bpf_map__max_entries(m), &o));
      int e = fd ? bpf_map__reuse_fd(m, fd.get()) : -errno;
      if (e) {
        err = std::string("cannot make map ") + bpf_map__name(m) + " of the XDP root program: " + std::strerror(-e);
        return e;
      }
    }
    prog_ = bpf_object__find_program_by_name(obj_, "syr_xdp_root");
    // As inside libxdp's dispatcher (an extension's is 0) and as the policies' (kPolicySection):
    // the kernel tail-calls only between programs of one expected attach type.
    if (prog_) bpf_program__set_expected_attach_type(prog_, kNoAttachType);
    return 0;
  }

  int map_fd(const char* name) const {
    if (!obj_) {
      auto it = adopted_maps_.find(name);
      return it == adopted_maps_.end() ? -ENOENT : it->second.get();
    }
    bpf_map* m = bpf_object__find_map_by_name(obj_, name);
    return m ? bpf_map__fd(m) : -ENOENT;
  }
  void mark_used(int slot) { used_[slot] = true; }

  // After adoption: slots and claims the kernel still has but no adopted policy owns (a
  // policy that could not be adopted) are cleared, so a slot given out again never
  // inherits another application's ports.
  int purge_unowned() {
    int ports = map_fd("syr_xdp_ports"), apps = map_fd("syr_xdp_apps"), purged = 0;
    for (uint32_t k = 0; k < SYR_XDP_PORT_SLOTS; k++) {
      uint32_t owner = 0, none = 0;
      if (bpf_map_lookup_elem(ports, &k, &owner) || !owner) continue;
      if (owner - 1 >= SYR_XDP_MAX_APPS || !used_[owner - 1]) {
        bpf_map_update_elem(ports, &k, &none, 0);
        purged++;
      }
    }
    for (uint32_t s = 0; s < SYR_XDP_MAX_APPS; s++)
      if (!used_[s] && bpf_map_delete_elem(apps, &s) == 0) purged++;
    return purged;
  }

  // Attaches through libxdp, in the mode choose_mode() says. Where the kernel has BPF
  // trampolines libxdp loads the root as an extension of its multi-program dispatcher (a
  // new one, or the interface's, which it replaces by one that runs both), so other
  // libxdp programs share the interface in order of run priority (root.bpf.c); elsewhere
  // it attaches the root alone. `to_cores`: the policy redirects to a CPUMAP.
  int ensure_attached(bool to_cores, std::string& err) {
    if (attached_) return 0;
    bool joining = false;
    if (int e = choose_mode(to_cores, joining, err)) return e;
    auto attach = [&](xdp_program* p) {
      if (xprog_) xdp_program__close(xprog_);
      xprog_ = p && !libxdp_get_error(p) ? p : nullptr;
      if (!xprog_) return -EINVAL;
      // Where libxdp's dispatcher cannot be used libbpf warns of the failed load, and
      // libxdp then attaches the root alone. Expected here: not a warning for the log.
      LibbpfQuiet quiet;
      return xdp_program__attach(xprog_, ifindex_, mode_, 0);
    };
    int r = attach(xdp_program__from_bpf_obj(obj_, "xdp"));
    if (r && !joining) {
      // The kernel has trampolines but refused the root as an extension of libxdp's
      // dispatcher: before libxdp 1.5.5 the dispatcher's slots do not change packet data,
      // and newer kernels count the root's tail call as such a change (docs/xdp.md). The
      // root alone, then, loaded here (libxdp only attaches it).
      log(LogLevel::kInfo,
          "libxdp's dispatcher cannot run the XDP root program on %s (%s): attaching it alone; other XDP programs "
          "can share the interface with a libxdp 1.5.5 dispatcher object in LIBXDP_OBJECT_PATH (docs/xdp.md)",
          ifname_.c_str(), std::strerror(-r));
      if (int e = open_object(err)) return e;
      if (int e = bpf_object__load(obj_)) {
        err = "cannot load the XDP root program: " + std::string(std::strerror(-e));
        return e;
      }
      r = attach(xdp_program__from_fd(bpf_program__fd(prog_)));
    }
    if (r && joining) {
      err = "cannot add the XDP root program to the libxdp dispatcher on " + ifname_ + ": " + std::strerror(-r) +
            " (libxdp's dispatcher takes a program that tail-calls, as the root does, from libxdp 1.5.5 on); "
            "with an older libxdp, start syrupd with LIBXDP_OBJECT_PATH naming a directory that holds a 1.5.5 "
            "dispatcher object (docs/xdp.md), or unload the other XDP programs first "
            "(e.g. xdp-loader unload " + ifname_ + " --all)";
      return r;
    }
    if (r) {
      err = "cannot attach the XDP root program to " + ifname_ + " (" + mode_name() + " mode): " + std::strerror(-r);
      return r;
    }
    bpf_prog_info info{};
    uint32_t len = sizeof info;
    bpf_prog_get_info_by_fd(bpf_program__fd(prog_), &info, &len);
    prog_id_ = info.id;
    attached_ = true;
    // Pinned so a later syrupd can recognise (and remove) what this one attached; a root
    // it could not recognise would refuse every later deploy to the interface, so without
    // its pins it is not attached at all.
    int e = pins::make_dirs(pins::xdp_root_dir(ifname_));
    if (!e) e = bpf_program__pin(prog_, pins::xdp_root_obj(ifname_, kRootProg).c_str());
    for (const char* m : kRootMaps)
      if (!e) e = bpf_map__pin(bpf_object__find_map_by_name(obj_, m), pins::xdp_root_obj(ifname_, m).c_str());
    if (e) {
      err = "cannot pin the XDP root program of " + ifname_ + " under " + pins::xdp_root_dir(ifname_) + ": " +
            std::strerror(-e);
      detach();
      return e;
    }
    log(LogLevel::kInfo, "attached the XDP root program to %s (%s mode%s)", ifname_.c_str(), mode_name(),
        in_dispatcher() ? ", in libxdp's dispatcher" : "");
    return 0;
  }

  // The attach mode, or why there is none. A libxdp dispatcher already on the interface is
  // joined in its mode; any other program is never replaced. Otherwise: generic mode on
  // devices that hand over partial checksums (partial_checksums()), native where the
  // driver has it, generic elsewhere.
  int choose_mode(bool to_cores, bool& joining, std::string& err) {
    LIBBPF_OPTS(bpf_xdp_query_opts, q);
    if (bpf_xdp_query(ifindex_, 0, &q)) q.prog_id = 0, q.feature_flags = 0;
    std::string driver = driver_of(ifname_);
    bool partial = partial_checksums(driver);
    constexpr uint64_t kXdpActBasic = 1;  // NETDEV_XDP_ACT_BASIC of <linux/netdev.h> (6.3)
    if (!q.prog_id) {
      mode_ = partial || !(q.feature_flags & kXdpActBasic) ? XDP_MODE_SKB : XDP_MODE_NATIVE;
      return 0;
    }
    xdp_multiprog* mp = xdp_multiprog__get_from_ifindex(ifindex_);
    bool dispatcher = mp && !libxdp_get_error(mp) && !xdp_multiprog__is_legacy(mp);
    if (dispatcher) mode_ = xdp_multiprog__attach_mode(mp), joining = true;
    if (mp && !libxdp_get_error(mp)) xdp_multiprog__close(mp);
    if (!dispatcher) {
      // Whatever is attached now is not ours (ours is attached only from here).
      UniqueFd other(bpf_prog_get_fd_by_id(q.prog_id));
      bpf_prog_info info{};
      uint32_t len = sizeof info;
      if (other) bpf_prog_get_info_by_fd(other.get(), &info, &len);
      err = "interface " + ifname_ + " already has an XDP program (id " + std::to_string(q.prog_id) +
            ", name '" + info.name + "') that this syrupd did not attach; remove it first " +
            "(e.g. xdp-loader unload " + ifname_ + " --all)";
      return -EBUSY;
    }
    if (mode_ == XDP_MODE_NATIVE && partial && to_cores) {
      err = "the libxdp dispatcher on " + ifname_ + " runs in native mode, where frames steered to cores lose the "
            "partial checksums a " + driver + " device hands over (the stack would drop them all); load the other "
            "XDP programs in generic mode (xdp-loader load -m skb, xdp-filter load -m skb) or turn checksum "
            "offload off where the frames are sent (ethtool -K <peer> tx off)";
      return -EOPNOTSUPP;
    }
    return 0;
  }

  // Whether the root runs inside a libxdp dispatcher (the interface's program is another).
  bool in_dispatcher() const {
    LIBBPF_OPTS(bpf_xdp_query_opts, q);
    return bpf_xdp_query(ifindex_, 0, &q) == 0 && q.prog_id && q.prog_id != prog_id_;
  }

  // Whether the kernel still runs this root: its interface is there and has it attached.
  // Once it does not, the root is lost for good (lost() says why): syrupd never attaches
  // it again, a deploy to the interface makes a new one.
  const std::string& check() {
    if (!attached_ || !lost_.empty()) return lost_;
    char name[IF_NAMESIZE];
    LIBBPF_OPTS(bpf_xdp_query_opts, q);
    if (!if_indextoname(static_cast<unsigned>(ifindex_), name)) {
      lost_ = "interface " + ifname_ + " is gone (deleted, or moved to another network namespace)";
    } else if (enum xdp_attach_mode m; bpf_xdp_query(ifindex_, 0, &q) == 0 && !runs_on(ifindex_, prog_id_, m)) {
      lost_ = q.prog_id ? "the XDP root program on " + ifname_ + " was replaced by another program (id " +
                              std::to_string(q.prog_id) + ")"
                        : "the XDP root program was detached from " + ifname_ + " by another tool";
    }
    return lost_;
  }
  const std::string& lost() const { return lost_; }

  // The interface's name now (the kernel knows it by index), or empty if it has none.
  std::string current_name() const {
    char name[IF_NAMESIZE];
    return if_indextoname(static_cast<unsigned>(ifindex_), name) ? name : "";
  }
  void renamed(std::string ifname) { ifname_ = std::move(ifname); }

  void detach() {
    if (!attached_) return;
    int r = xdp_program__detach(xprog_, ifindex_, mode_, 0);
    if (r) log(LogLevel::kWarn, "detaching the XDP root program from %s: %s", ifname_.c_str(), std::strerror(-r));
    else log(LogLevel::kInfo, "detached the XDP root program from %s", ifname_.c_str());
    attached_ = false;
    pins::remove_tree(pins::xdp_root_dir(ifname_));
  }

  int alloc_slot() {
    for (int i = 0; i < SYR_XDP_MAX_APPS; i++)
      if (!used_[i]) {
        used_[i] = true;
        return i;
      }
    return -ENOSPC;
  }
  void free_slot(int s) { used_[s] = false; }
  bool unused() const {
    for (bool u : used_)
      if (u) return false;
    return true;
  }

  const char* mode_name() const { return mode_ == XDP_MODE_NATIVE ? "native" : "generic"; }
  const std::string& ifname() const { return ifname_; }
  int ifindex() const { return ifindex_; }
  std::map<Claim, std::string>& claims() { return claims_; }

  json stats() const {
    static const char* names[] = {"unclaimed", "not_l4", "fragment", "malformed", "dispatched", "no_policy"};
    json j;
    int fd = map_fd("syr_xdp_root_stats");
    int ncpu = libbpf_num_possible_cpus();
    std::vector<uint64_t> v(static_cast<size_t>(ncpu));
    for (uint32_t k = 0; k < SYR_XDP_ROOT_SLOTS; k++) {
      uint64_t sum = 0;
      if (bpf_map_lookup_elem(fd, &k, v.data()) == 0)
        for (auto x : v) sum += x;
      j[names[k]] = sum;
    }
    return j;
  }

 private:
  std::string ifname_;
  int ifindex_ = 0;
  std::string object_path_;             // the compiled root (create())
  std::map<std::string, UniqueFd> made_maps_;  // its maps, made by open_object()
  bpf_object* obj_ = nullptr;
  bpf_program* prog_ = nullptr;
  xdp_program* xprog_ = nullptr;
  enum xdp_attach_mode mode_ = XDP_MODE_NATIVE;
  bool attached_ = false;
  uint32_t prog_id_ = 0;  // the kernel's id of the attached program
  std::string lost_;      // why the kernel no longer runs it (check())
  bool used_[SYR_XDP_MAX_APPS] = {};
  std::map<Claim, std::string> claims_;  // (protocol, port) -> application
  UniqueFd adopted_prog_;                 // when adopted: no bpf_object
  std::map<std::string, UniqueFd> adopted_maps_;
};

// ---- Target -------------------------------------------------------------------------

namespace {

class XdpTarget : public Target {
 public:
  XdpTarget(XdpHook& hook, std::shared_ptr<Root> root, std::string app, std::set<Claim> ports,
            std::vector<uint32_t> cpus, std::vector<UniqueFd> xsks, int slot = -1, const LoadedPolicy* loaded = nullptr,
            uint32_t n_xsks = 0)
      : hook_(hook), root_(std::move(root)), app_(std::move(app)), ports_(std::move(ports)),
        cpus_(std::move(cpus)), xsks_(std::move(xsks)), n_xsks_(xsks_.empty() ? n_xsks : xsks_.size()),
        slot_(slot), loaded_(loaded) {}

  ~XdpTarget() override { hook_.release_if_unused(std::move(root_)); }

  std::string key() const override { return "xdp/" + root_->ifname() + "/" + app_; }
  uint32_t num_executors() const override {
    return static_cast<uint32_t>(n_xsks_ ? n_xsks_ : cpus_.size());
  }

  int prepare_load(LoadSpec& spec, const Target*, const LoadedPolicy*) override {
    spec.reuse_maps[SYR_XDP_META_MAP] = root_->map_fd(SYR_XDP_META_MAP);
    if (n_xsks_) spec.params[SYR_XDP_KIND_VAR] = SYR_XDP_EXEC_XSK;
    return 0;
  }

  int install(LoadedPolicy& p, const Target* old, DeployTxn& txn, std::string& err) override {
    auto* prev = static_cast<const XdpTarget*>(old);
    if (int r = root_->ensure_attached(n_xsks_ == 0, err)) return r;
    if (int r = fill_executors(p, err)) return r;

    std::shared_ptr<Root> root = root_;  // the undo steps hold what they act on
    slot_ = prev ? prev->slot_ : root_->alloc_slot();
    if (slot_ < 0) {
      err = "interface " + root_->ifname() + " has no free application slot (" +
            std::to_string(SYR_XDP_MAX_APPS) + " in use)";
      return -ENOSPC;
    }
    if (!prev) txn.on_undo("slot " + std::to_string(slot_), [root, s = slot_] { root->free_slot(s); });
    uint32_t slot = static_cast<uint32_t>(slot_);
    int fd = p.prog_fd();
    // The swap: one prog-array update, atomic for every frame.
    if (bpf_map_update_elem(root_->map_fd("syr_xdp_apps"), &slot, &fd, 0) < 0) {
      int e = errno;
      err = "cannot install the policy in slot " + std::to_string(slot) + ": " + std::strerror(e);
      return -e;
    }
    txn.on_undo("program in slot " + std::to_string(slot), [root, slot, ofd = prev && prev->loaded_ ? prev->loaded_->prog_fd() : -1] {
      int apps = root->map_fd("syr_xdp_apps");
      ofd >= 0 ? bpf_map_update_elem(apps, &slot, &ofd, 0) : bpf_map_delete_elem(apps, &slot);
    });
    // Claims: add the new ports first, then drop the ones the old policy had and this
    // one does not, so a port kept across the swap never goes unclaimed (nor in an undo).
    for (auto& c : ports_) {
      if (int r = set_claim(*root_, c, slot + 1, app_, err)) return r;
      if (!prev || !prev->ports_.count(c))
        txn.on_undo("claim of " + c.str(), [root, c] { std::string e; set_claim(*root, c, 0, {}, e); });
    }
    if (prev)
      for (auto& c : prev->ports_)
        if (!ports_.count(c)) {
          std::string ignored;
          set_claim(*root_, c, 0, {}, ignored);
          txn.on_undo("release of " + c.str(),
                      [root, c, slot, app = app_] { std::string e; set_claim(*root, c, slot + 1, app, e); });
        }
    loaded_ = &p;
    return 0;
  }

  // Port `c` steered to slot owner-1 for application `app` (owner 0: unclaimed). 0 or
  // -errno with `err`.
  static int set_claim(Root& root, const Claim& c, uint32_t owner, const std::string& app, std::string& err) {
    auto k = c.key();
    if (bpf_map_update_elem(root.map_fd("syr_xdp_ports"), &k, &owner, 0) < 0) {
      int e = errno;
      err = "cannot claim " + c.str() + ": " + std::strerror(e);
      return -e;
    }
    if (owner) root.claims()[c] = app;
    else root.claims().erase(c);
    return 0;
  }

  void uninstall(LoadedPolicy&) override {
    int apps = root_->map_fd("syr_xdp_apps"), ports = root_->map_fd("syr_xdp_ports");
    uint32_t none = 0;
    for (auto& c : ports_) {
      auto k = c.key();
      bpf_map_update_elem(ports, &k, &none, 0);
      root_->claims().erase(c);
    }
    if (slot_ >= 0) {
      uint32_t slot = static_cast<uint32_t>(slot_);
      bpf_map_delete_elem(apps, &slot);
      root_->free_slot(slot_);
      slot_ = -1;
    }
  }

  json describe() const override {
    json ports = json::array();
    for (auto& c : ports_) ports.push_back(c.str());
    json j = {{"ifname", root_->ifname()},
              {"mode", root_->mode_name()},
              {"libxdp_dispatcher", root_->in_dispatcher()},
              {"ports", ports},
              {"executor_kind", n_xsks_ ? "af_xdp" : "cpu"},
              {"root", root_->stats()}};
    if (!n_xsks_) j["cpus"] = cpus_;
    return j;
  }

  json save() const override {
    json ports = json::array();
    for (auto& c : ports_) ports.push_back({c.protocol, c.port});
    return {{"ifname", root_->ifname()}, {"app", app_},   {"ports", ports},
            {"cpus", cpus_},             {"xsks", n_xsks_}, {"slot", slot_}};
  }

  std::string gone() const override { return root_->lost(); }

 private:
  int fill_executors(LoadedPolicy& p, std::string& err) {
    if (!xsks_.empty()) {
      int map = p.map_fd(SYR_XDP_XSKS_MAP);
      for (uint32_t i = 0; i < xsks_.size(); i++) {
        int fd = xsks_[i].get();
        if (bpf_map_update_elem(map, &i, &fd, 0) < 0) {
          int e = errno;
          err = "cannot add AF_XDP socket " + std::to_string(i) + " to the executor map: " + std::strerror(e);
          return -e;
        }
      }
      return 0;
    }
    int cpumap = p.map_fd(SYR_XDP_CPUS_MAP), idx = p.map_fd(SYR_XDP_EXEC_CPU_MAP);
    for (uint32_t i = 0; i < cpus_.size(); i++) {
      bpf_cpumap_val v{};
      v.qsize = 2048;
      if (bpf_map_update_elem(cpumap, &cpus_[i], &v, 0) < 0 ||
          bpf_map_update_elem(idx, &i, &cpus_[i], 0) < 0) {
        int e = errno;
        err = "cannot make core " + std::to_string(cpus_[i]) + " executor " + std::to_string(i) + ": " +
              std::strerror(e);
        return -e;
      }
    }
    return 0;
  }

  XdpHook& hook_;
  std::shared_ptr<Root> root_;
  std::string app_;
  std::set<Claim> ports_;
  std::vector<uint32_t> cpus_;
  std::vector<UniqueFd> xsks_;
  size_t n_xsks_ = 0;  // AF_XDP executors (the sockets are not re-taken on adoption)
  int slot_ = -1;
  // Its policy's, while installed: a replacement's undo puts its program back, asked for
  // then (a policy at rest holds no descriptor of it: LoadedPolicy::release()).
  const LoadedPolicy* loaded_ = nullptr;
};

}  // namespace

// ---- Hook ---------------------------------------------------------------------------

int XdpHook::get_root(const std::string& ifname, std::shared_ptr<Root>& out, std::string& err) {
  if (auto it = roots_.find(ifname); it != roots_.end()) {
    out = it->second;
    return 0;
  }
  if (int r = Root::create(compiler_, ifname, out, err)) return r;
  roots_[ifname] = out;
  return 0;
}

void XdpHook::release_if_unused(std::shared_ptr<Root> root) {
  // A lost root is no longer in roots_, and a new root of the same interface may be.
  auto it = roots_.find(root->ifname());
  if (it == roots_.end() || it->second != root || !root->unused()) return;
  root->detach();
  roots_.erase(it);
}

bool XdpHook::refresh() {
  // What changed is found by looking at each root, not by parsing the news: a socket that
  // overran (ENOBUFS) has lost some of it.
  char buf[8192];
  while (events_) {
    ssize_t n = recv(events_.get(), buf, sizeof buf, MSG_DONTWAIT);
    if (n < 0 && errno != ENOBUFS) break;
  }
  bool changed = false;
  for (auto it = roots_.begin(); it != roots_.end();) {
    if (it->second->check().empty()) {
      ++it;
      continue;
    }
    // Its policies are removed by the core (Target::gone()); its pins name an attachment
    // that is no more, and a new root of the interface will need the directory.
    log(LogLevel::kWarn, "%s: removing the policies on it", it->second->lost().c_str());
    pins::remove_tree(pins::xdp_root_dir(it->first));
    it = roots_.erase(it);
    changed = true;
  }
  return follow_renames() || changed;
}

bool XdpHook::follow_renames() {
  struct Move {
    std::string from, to;
    std::shared_ptr<Root> root;
  };
  std::map<std::string, std::shared_ptr<Root>> now;
  std::vector<Move> moves;
  for (auto& [ifname, root] : roots_) {
    std::string cur = root->current_name();
    if (cur.empty()) cur = ifname;  // gone since check(): found lost at the next news
    // Two roots under one name: read in the middle of a swap; the rest of it is news.
    if (!now.emplace(cur, root).second) return false;
    if (cur != ifname) moves.push_back({ifname, cur, root});
  }
  if (moves.empty()) return false;
  // The pins move in two steps, so names swapped between two of syrupd's interfaces do not
  // meet in the pin tree.
  // (The parked name is longer than any interface's: no interface is ever named so.)
  auto parked = [](const Move& m) { return pins::xdp_dir() + "/renaming-ifindex-" + std::to_string(m.root->ifindex()); };
  for (auto& m : moves)
    if (rename(pins::xdp_root_dir(m.from).c_str(), parked(m).c_str()) < 0)
      log(LogLevel::kWarn, "cannot move the pins of %s's XDP root program: %s", m.from.c_str(), std::strerror(errno));
  for (auto& m : moves) {
    m.root->renamed(m.to);
    if (rename(parked(m).c_str(), pins::xdp_root_dir(m.to).c_str()) < 0 && errno != ENOENT)
      log(LogLevel::kWarn, "cannot move the pins of %s's XDP root program: %s", m.to.c_str(), std::strerror(errno));
    log(LogLevel::kInfo, "interface %s was renamed to %s: its XDP root program and policies follow it",
        m.from.c_str(), m.to.c_str());
  }
  roots_ = std::move(now);
  return true;
}

int XdpHook::make_target(const Caller& caller, proto::Message& req, std::unique_ptr<Target>& out,
                         pid_t& owner, std::string& err) {
  static bool print_set = (libxdp_set_print(libxdp_print), true);
  (void)print_set;
  if (policy_section_registered < 0) {
    err = std::string("libbpf refused the XDP policy section ") + kPolicySection + ": " +
          std::strerror(-policy_section_registered);
    return policy_section_registered;
  }
  XdpRequest r;
  if (Bad bad; !parse(hook_fields(req.body), r, bad)) {
    err = bad.str();
    return -EINVAL;
  }
  const std::string& ifname = r.ifname;
  // The application (a deploy key, checked by syrupd before the hook is asked) names the
  // claims.
  const json& app_field = req.body.contains("app") ? req.body["app"] : json();
  std::string app = app_field.is_string() ? std::string(app_field) : std::string();
  std::set<Claim> ports;
  for (uint16_t p : r.ports) ports.insert({static_cast<uint8_t>(r.protocol), p});
  std::vector<uint32_t> cpus = std::move(r.cpus);
  std::vector<UniqueFd> xsks = std::move(req.fds);
  // The CPUMAP is keyed by core number and has SYR_MAX_EXECUTORS entries.
  int ncpu = std::min(libbpf_num_possible_cpus(), SYR_MAX_EXECUTORS);
  if (!cpus.empty() && !xsks.empty()) {
    err = "executors are either cores (cpus) or AF_XDP sockets (fds), not both";
    return -EINVAL;
  }
  for (uint32_t c : cpus)
    if (c >= static_cast<uint32_t>(ncpu)) {
      err = "cpus: must be cores 0.." + std::to_string(ncpu - 1) + " (this machine's), got " + std::to_string(c);
      return -EINVAL;
    }
  if (cpus.empty() && xsks.empty())
    for (int c = 0; c < ncpu; c++) cpus.push_back(static_cast<uint32_t>(c));
  if (cpus.size() > SYR_MAX_EXECUTORS || xsks.size() > SYR_MAX_EXECUTORS) {
    err = "at most " + std::to_string(SYR_MAX_EXECUTORS) + " executors per policy";
    return -E2BIG;
  }
  // Only what the caller owns: root may claim any port; others, ports a socket of the
  // deploying process is bound to.
  owner = caller.pid;
  if (r.pid) {
    owner = r.pid;
    if (int rc = check_target_process(caller, owner, err)) return rc;
  }
  // Which process holds which claimed port: with --cgroup, each of the cgroup's.
  std::map<pid_t, std::set<Claim>> holders = {{owner, ports}};
  if (!r.cgroup.empty()) {
    if (int rc = cgroup_claims(caller, r, holders, err)) return rc;
    ports.clear();
    for (auto& [pid, claims] : holders) ports.insert(claims.begin(), claims.end());
    owner = holders.begin()->first;  // the lowest pid with a port: the policy ends with it
  }
  if (!caller.admin()) {
    // The caller's own process, or its --pid, or the cgroup's processes.
    for (auto& [pid, claims] : holders)
      if (std::string why = claim_refusal(pid, caller.uid, if_nametoindex(ifname.c_str()), claims); !why.empty()) {
        err = why;
        return -EPERM;
      }
  }

  std::shared_ptr<Root> root;
  if (int r = get_root(ifname, root, err)) return r;
  // AF_XDP sockets do not report where they are bound (no getsockname); one bound to
  // another interface or queue makes the kernel drop what is redirected to it, as
  // docs/policy-abi.md says. Bound at all is checked by the XSKMAP update at install.
  for (size_t i = 0; i < xsks.size(); i++) {
    int domain = 0;
    socklen_t l = sizeof domain;
    if (getsockopt(xsks[i].get(), SOL_SOCKET, SO_DOMAIN, &domain, &l) < 0 || domain != AF_XDP) {
      err = "executor " + std::to_string(i) + " is not an AF_XDP socket";
      release_if_unused(std::move(root));
      return -EINVAL;
    }
  }
  for (auto& c : ports)
    if (auto it = root->claims().find(c); it != root->claims().end() && it->second != app) {
      // Named to admins only: to a tenant, another user's application is no one's.
      err = c.str() + " on " + ifname + " is scheduled by " +
            (caller.admin() ? "application '" + it->second + "'" : std::string("another application"));
      release_if_unused(std::move(root));
      return -EBUSY;
    }
  out = std::make_unique<XdpTarget>(*this, std::move(root), app, std::move(ports), std::move(cpus),
                                    std::move(xsks));
  return 0;
}

int XdpHook::adopt(const json& saved, LoadedPolicy& p, std::unique_ptr<Target>& out, std::string& err) {
  std::string ifname = saved.value("ifname", std::string());
  int slot = saved.value("slot", -1);
  if (slot < 0 || slot >= SYR_XDP_MAX_APPS) {
    err = "no valid prog-array slot was saved";
    return -EINVAL;
  }
  std::shared_ptr<Root> root;
  if (auto it = roots_.find(ifname); it != roots_.end()) {
    root = it->second;
  } else {
    if (int r = Root::adopt(ifname, root, err)) return r;
    roots_[ifname] = root;
  }
  std::set<Claim> ports;
  for (auto& c : saved.value("ports", json::array())) ports.insert({c[0].get<uint8_t>(), c[1].get<uint16_t>()});
  std::string app = saved.value("app", std::string());
  root->mark_used(slot);
  for (auto& c : ports) root->claims()[c] = app;
  out = std::make_unique<XdpTarget>(*this, root, app, std::move(ports),
                                    saved.value("cpus", std::vector<uint32_t>{}), std::vector<UniqueFd>{},
                                    slot, &p, saved.value("xsks", 0u));
  return 0;
}

void XdpHook::recover() {
  // News of the links: an interface deleted or moved away, an XDP program attached or
  // detached by another tool (RTM_NEWLINK/RTM_DELLINK).
  events_.reset(socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC | SOCK_NONBLOCK, NETLINK_ROUTE));
  sockaddr_nl sa{};
  sa.nl_family = AF_NETLINK;
  sa.nl_groups = RTMGRP_LINK;
  if (!events_ || bind(events_.get(), reinterpret_cast<sockaddr*>(&sa), sizeof sa) < 0) {
    log(LogLevel::kWarn, "cannot watch the network interfaces (%s): a policy whose interface is deleted is "
        "noticed only at the next XDP deploy", std::strerror(errno));
    events_.reset();
  }
  for (auto& [ifname, root] : roots_)
    if (int n = root->purge_unowned())
      log(LogLevel::kWarn, "cleared %d slots and claims on %s that no adopted policy owns", n, ifname.c_str());
  follow_renames();  // of interfaces renamed while no syrupd ran
  std::error_code ec;
  for (auto& e : fs::directory_iterator(pins::xdp_dir(), ec)) {
    std::string ifname = pins::xdp_ifname(e.path().filename().string());
    if (roots_.count(ifname)) continue;  // adopted with its policies
    UniqueFd prog;
    uint32_t id = 0;
    enum xdp_attach_mode mode = XDP_MODE_NATIVE;
    if (int ifindex = pinned_root(ifname, prog, id, mode)) {
      // By libxdp, which takes it out of a dispatcher and leaves the other programs there.
      xdp_program* xp = xdp_program__from_fd(prog.get());
      int r = !xp || libxdp_get_error(xp) ? -EINVAL : xdp_program__detach(xp, ifindex, mode, 0);
      if (xp && !libxdp_get_error(xp)) xdp_program__close(xp);
      char now[IF_NAMESIZE] = "?";
      if_indextoname(static_cast<unsigned>(ifindex), now);
      std::string where = now;
      if (ifname != now) where += " (pinned as " + ifname + ")";
      if (r) where += std::string(" (detach failed: ") + std::strerror(-r) + ")";
      log(LogLevel::kWarn, "removed the XDP root program a previous syrupd left on %s", where.c_str());
    } else {
      log(LogLevel::kWarn, "removed stale XDP pins of %s (its root program is no longer attached)", ifname.c_str());
    }
    pins::remove_tree(e.path());
  }
  pins::make_dirs(pins::xdp_dir());
}

}  // namespace syrup::xdp

namespace syrup {
// hooks/registry.h
std::unique_ptr<Hook> make_xdp_hook(const HookContext& ctx) { return std::make_unique<xdp::XdpHook>(ctx.compiler); }
}  // namespace syrup
