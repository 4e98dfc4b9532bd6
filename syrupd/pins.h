// The bpffs pin layout, in one place (docs/pin-layout.md is its reference):
//
//   <root>/                                   --bpffs_root, default /sys/fs/bpf/syrup
//   <root>/apps/<app>/maps/<map>              an application's maps, shared by name by all
//                                             its policies and by the application itself
//   <root>/apps/<app>/policies/<id>/prog      the hook program of policy <id>
//   <root>/apps/<app>/policies/<id>/<sysmap>  its system maps (syr_executors, syr_stats)
//   <root>/apps/<app>/policies/<id>/link      its bpf_link, for a hook that attaches by
//                                             link (socket-lookup: the network namespace's)
//   <root>/xdp/<ifname>/prog                  the XDP root program attached to <ifname>
//   <root>/xdp/<ifname>/<map>                 its maps (syr_xdp_apps, syr_xdp_ports, ...)
//   <root>/thread_scx/link                    the sched_ext root scheduler's struct_ops link
//   <root>/thread_scx/exit_link               its sched_process_exit tracepoint's link
//   <root>/thread_scx/<map>                   its maps (syr_scx_procs, syr_scx_enq, ...)
//
//   <root>/xdp/<ifname> holds an interface's name with each '.' made ':' (xdp_pin_name):
//   bpffs refuses dots, a VLAN's name has them (eth0.100), and no interface name has a ':'.
//
// Invariants: every path syrupd pins or unpins comes from these functions; application
// and map names are checked (names::check, runtime/src/names.h) before they reach them,
// so no path leaves <root>.
//
// Ownership: the whole tree is root's, directories mode 0700, pins 0600. No tenant owns or
// can write any directory in it, so no tenant can put a link, a hard link or a renamed pin
// where syrupd looks: tenants reach their maps through syrupd (map_open hands over an fd),
// which they must anyway, since they cannot call bpf() (kernel.unprivileged_bpf_disabled).
// Still, every pin syrupd opens for a request goes through obj_get(), which follows no
// link under <root>, and repair() makes a tree an older syrupd handed to tenants (their
// directories chowned to them) root's again at start, following nothing.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace syrup::pins {

void set_root(std::string root);
const std::string& root();

std::string app_dir(std::string_view app);
std::string app_maps_dir(std::string_view app);
std::string app_map(std::string_view app, std::string_view map);
// The names of the maps pinned under app_maps_dir(app), sorted; none if it does not exist.
std::vector<std::string> app_map_names(std::string_view app);
std::string policy_dir(std::string_view app, int id);
std::string policy_prog(std::string_view app, int id);
std::string policy_map(std::string_view app, int id, std::string_view map);
std::string policy_link(std::string_view app, int id);
std::string xdp_dir();
std::string xdp_root_dir(std::string_view ifname);
// An interface's name as a directory of xdp_dir(), and back.
std::string xdp_pin_name(std::string_view ifname);
std::string xdp_ifname(std::string_view pin_name);
std::string xdp_root_obj(std::string_view ifname, std::string_view obj);
std::string thread_scx_dir();
std::string thread_scx_obj(std::string_view obj);

// The object pinned at `path` (a path of the functions above, under <root>), opened
// without following any link below <root> (openat2 RESOLVE_NO_SYMLINKS; the pin itself is
// then reached through its O_PATH descriptor, so nothing can be swapped in between). Only
// a root-owned pin with one name counts: a link, a hard link or anything else is -ENOENT,
// as a missing pin is. A new descriptor or -errno.
int obj_get(const std::string& path);
// While one lives, obj_get() resolves from one descriptor of <root> opened here, not from
// one of its own each call: a restart opens two pins of each of 10,000 policies.
struct RootHeld {
  RootHeld();
  ~RootHeld();
  RootHeld(const RootHeld&) = delete;
  RootHeld& operator=(const RootHeld&) = delete;
};

// mkdir -p of a path under <root>: <root> itself as given (the operator's), every
// directory below it created root's, mode 0700, no link followed. 0 or -errno.
int make_dirs(const std::string& path);
// Removes a directory tree of pins (unpinning every object in it). 0 or -errno.
int remove_tree(const std::string& path);

// Makes the tree under <root> the one described above, following nothing: directories
// become root's with mode 0700 (fchown/fchmod on an O_NOFOLLOW descriptor, before their
// entries are read, so no one can add an entry behind the scan), pins root's, and what
// syrupd never makes goes: links, pins with more than one name (hard links), names that
// are not in the layout, other kinds of files. Each thing done is appended to `done`, one
// line each, for the log. Run at start, before anything under <root> is opened.
int repair(std::vector<std::string>& done);

}  // namespace syrup::pins
