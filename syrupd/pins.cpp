// Paths of the pin tree (pins.h) and the few operations on it that must not follow a
// link: opening a pin for a request, creating directories, and repairing a tree an older
// syrupd left tenant-writable. Every walk here is by descriptor (openat with O_NOFOLLOW,
// openat2 with RESOLVE_NO_SYMLINKS), never by re-resolving a path after a check.
#include "pins.h"

#include <bpf/bpf.h>
#include <dirent.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "names.h"
#include "unique_fd.h"

namespace syrup::pins {
namespace {
std::string g_root = "/sys/fs/bpf/syrup";

// `path` relative to <root> ("" for <root> itself); false if it is not under <root>.
bool relative(const std::string& path, std::string& rel) {
  if (path == g_root) {
    rel.clear();
    return true;
  }
  if (path.size() <= g_root.size() + 1 || path.compare(0, g_root.size(), g_root) != 0 || path[g_root.size()] != '/')
    return false;
  rel = path.substr(g_root.size() + 1);
  return rel.find("..") == std::string::npos;
}

UniqueFd open_root() { return UniqueFd(open(g_root.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC)); }
UniqueFd g_held_root;  // RootHeld's (main thread only, like adoption)
}  // namespace

RootHeld::RootHeld() { g_held_root = open_root(); }
RootHeld::~RootHeld() { g_held_root.reset(); }

void set_root(std::string root) {
  // "/sys/fs/bpf/syrup/" names the same root: every path is made from it and checked
  // against it (relative()), so it is kept without a trailing '/'.
  while (root.size() > 1 && root.back() == '/') root.pop_back();
  g_root = std::move(root);
}
const std::string& root() { return g_root; }

std::string app_dir(std::string_view app) { return g_root + "/apps/" + std::string(app); }
std::string app_maps_dir(std::string_view app) { return app_dir(app) + "/maps"; }
std::string app_map(std::string_view app, std::string_view map) {
  return app_maps_dir(app) + "/" + std::string(map);
}
std::vector<std::string> app_map_names(std::string_view app) {
  // Pins are regular files on bpffs; anything else there (a link an older syrupd's tenant
  // made) is no map.
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(app_maps_dir(app), ec))
    if (e.symlink_status(ec).type() == std::filesystem::file_type::regular) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}
std::string policy_dir(std::string_view app, int id) {
  return app_dir(app) + "/policies/" + std::to_string(id);
}
std::string policy_prog(std::string_view app, int id) { return policy_dir(app, id) + "/prog"; }
std::string policy_map(std::string_view app, int id, std::string_view map) {
  return policy_dir(app, id) + "/" + std::string(map);
}
std::string policy_link(std::string_view app, int id) { return policy_dir(app, id) + "/link"; }

std::string xdp_dir() { return g_root + "/xdp"; }
std::string xdp_pin_name(std::string_view ifname) {
  std::string n(ifname);
  std::replace(n.begin(), n.end(), '.', ':');
  return n;
}
std::string xdp_ifname(std::string_view pin_name) {
  std::string n(pin_name);
  std::replace(n.begin(), n.end(), ':', '.');
  return n;
}
std::string xdp_root_dir(std::string_view ifname) { return xdp_dir() + "/" + xdp_pin_name(ifname); }
std::string xdp_root_obj(std::string_view ifname, std::string_view obj) {
  return xdp_root_dir(ifname) + "/" + std::string(obj);
}

std::string thread_scx_dir() { return g_root + "/thread_scx"; }
std::string thread_scx_obj(std::string_view obj) { return thread_scx_dir() + "/" + std::string(obj); }

int obj_get(const std::string& path) {
  std::string rel;
  if (!relative(path, rel) || rel.empty()) return -EINVAL;
  UniqueFd own;
  int r = g_held_root.get();
  if (r < 0) {
    own = open_root();
    if (!own) return -errno;
    r = own.get();
  }
  open_how how{};
  how.flags = O_PATH | O_NOFOLLOW | O_CLOEXEC;
  how.resolve = RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_BENEATH | RESOLVE_NO_XDEV;
  UniqueFd f(static_cast<int>(syscall(SYS_openat2, r, rel.c_str(), &how, sizeof how)));
  if (!f) return errno == ELOOP ? -ENOENT : -errno;
  struct stat st;
  if (fstat(f.get(), &st) < 0) return -errno;
  if (!S_ISREG(st.st_mode) || st.st_nlink != 1 || st.st_uid != 0) return -ENOENT;
  // The O_PATH descriptor's magic link names exactly the inode checked above.
  int fd = bpf_obj_get(("/proc/self/fd/" + std::to_string(f.get())).c_str());
  return fd < 0 ? -errno : fd;
}

int make_dirs(const std::string& path) {
  std::string rel;
  if (!relative(path, rel)) return -EINVAL;
  std::error_code ec;
  std::filesystem::create_directories(g_root, ec);
  if (ec) return -ec.value();
  UniqueFd dir = open_root();
  if (!dir) return -errno;
  size_t at = 0;
  while (at < rel.size()) {
    size_t end = rel.find('/', at);
    if (end == std::string::npos) end = rel.size();
    std::string part = rel.substr(at, end - at);
    at = end + 1;
    if (part.empty()) continue;
    if (mkdirat(dir.get(), part.c_str(), 0700) < 0 && errno != EEXIST) return -errno;
    UniqueFd next(openat(dir.get(), part.c_str(), O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!next) return errno == ELOOP ? -ENOTDIR : -errno;
    dir = std::move(next);
  }
  return 0;
}

int remove_tree(const std::string& path) {
  // std::filesystem::remove_all unlinks a link, never what it points to.
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
  return ec ? -ec.value() : 0;
}

// ---- repair -------------------------------------------------------------------------

namespace {

// What the layout allows at a place of the tree.
enum class Place {
  kRoot,         // <root>: apps/, xdp/, thread_scx/
  kApps,         // apps/: application directories
  kApp,          // apps/<app>/: maps/, policies/
  kMaps,         // apps/<app>/maps/: pins named by map names
  kPolicies,     // apps/<app>/policies/: policy directories, decimal ids
  kPins,         // policies/<id>/, xdp/<if>/, thread_scx/: pins
  kXdp,          // xdp/: interface directories
  kOther,        // in <root>, what is not syrupd's (the operator's): left alone
};

constexpr int kMaxDepth = 16;

bool decimal(const std::string& s) {
  return !s.empty() && s.size() <= 10 && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

struct Repairer {
  std::vector<std::string>& done;

  // Where an entry `name` of a directory at `place` belongs: its place if it is a
  // directory the layout has there, kPins-like leaf if a pin belongs there.
  static bool dir_allowed(Place place, const std::string& name, Place& child) {
    switch (place) {
      case Place::kRoot:
        if (name == "apps") return child = Place::kApps, true;
        if (name == "xdp") return child = Place::kXdp, true;
        if (name == "thread_scx") return child = Place::kPins, true;
        return child = Place::kOther, true;
      case Place::kApps:
        return names::check("application", name).empty() && (child = Place::kApp, true);
      case Place::kApp:
        if (name == "maps") return child = Place::kMaps, true;
        if (name == "policies") return child = Place::kPolicies, true;
        return false;
      case Place::kPolicies:
        return decimal(name) && (child = Place::kPins, true);
      case Place::kXdp:
        return child = Place::kPins, true;
      default:
        return false;
    }
  }
  static bool pin_allowed(Place place, const std::string& name) {
    switch (place) {
      case Place::kMaps: return names::check("map", name).empty();
      case Place::kPins: return true;
      default: return false;
    }
  }

  // Makes the open directory `fd` root's and 0700.
  void own(int fd, const std::string& path) {
    struct stat st;
    if (fstat(fd, &st) < 0) return;
    if (st.st_uid != 0 || st.st_gid != 0) {
      if (fchown(fd, 0, 0) == 0)
        done.push_back("made " + path + " root's (was uid " + std::to_string(st.st_uid) + " gid " +
                       std::to_string(st.st_gid) + ")");
      else
        done.push_back("cannot make " + path + " root's: " + std::strerror(errno));
    }
    if ((st.st_mode & 07777) != 0700) {
      if (fchmod(fd, 0700) == 0) {
        char mode[8];
        std::snprintf(mode, sizeof mode, "%04o", st.st_mode & 07777);
        done.push_back("set " + path + " to mode 0700 (was " + mode + ")");
      }
    }
  }

  // Removes entry `name` of directory `dfd`, a directory with all it holds, following
  // nothing.
  void remove(int dfd, const std::string& name, const std::string& path, int depth) {
    struct stat st;
    if (fstatat(dfd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) < 0) return;
    if (S_ISDIR(st.st_mode) && depth < kMaxDepth) {
      UniqueFd d(openat(dfd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
      if (d) {
        // Root's first, so nobody adds entries while they are removed.
        fchown(d.get(), 0, 0);
        fchmod(d.get(), 0700);
        for (auto& e : entries(d.get())) remove(d.get(), e, path + "/" + e, depth + 1);
      }
    }
    if (unlinkat(dfd, name.c_str(), S_ISDIR(st.st_mode) ? AT_REMOVEDIR : 0) < 0)
      done.push_back("cannot remove " + path + ": " + std::strerror(errno));
  }

  static std::vector<std::string> entries(int fd) {
    std::vector<std::string> out;
    int dup_fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (dup_fd < 0) return out;
    DIR* d = fdopendir(dup_fd);
    if (!d) {
      close(dup_fd);
      return out;
    }
    while (dirent* e = readdir(d))
      if (std::strcmp(e->d_name, ".") && std::strcmp(e->d_name, "..")) out.emplace_back(e->d_name);
    closedir(d);
    return out;
  }

  static const char* kind(mode_t m) {
    return S_ISLNK(m) ? "link" : S_ISDIR(m) ? "directory" : S_ISREG(m) ? "pin" : "file";
  }

  // <root> itself is the operator's (--bpffs_root): its owner and mode stay, and of its
  // entries only syrupd's own are looked at.
  void walk(int fd, const std::string& path, Place place, int depth) {
    if (place != Place::kRoot) own(fd, path);
    if (depth >= kMaxDepth) return;
    for (auto& name : entries(fd)) {
      std::string child_path = path + "/" + name;
      struct stat st;
      if (fstatat(fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) < 0) continue;
      Place child = Place::kOther;
      if (place == Place::kRoot && (!dir_allowed(place, name, child) || child == Place::kOther)) continue;
      std::string why;
      if (S_ISLNK(st.st_mode)) {
        why = "a link (syrupd makes none)";
      } else if (S_ISDIR(st.st_mode)) {
        if (!dir_allowed(place, name, child)) why = "not in the pin layout";
      } else if (S_ISREG(st.st_mode)) {
        if (!pin_allowed(place, name)) why = "not in the pin layout";
        else if (st.st_nlink != 1) why = "a second name of a pin (syrupd pins each object under one name)";
      } else {
        why = "not a pin";
      }
      if (!why.empty()) {
        remove(fd, name, child_path, depth + 1);
        done.push_back("removed " + child_path + ": " + kind(st.st_mode) + ", " + why);
        continue;
      }
      if (S_ISDIR(st.st_mode)) {
        UniqueFd d(openat(fd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
        if (d) walk(d.get(), child_path, child, depth + 1);
        continue;
      }
      // A pin: the directory is root's by now, so nobody can swap it after this look.
      if (st.st_uid != 0 || st.st_gid != 0) {
        if (fchownat(fd, name.c_str(), 0, 0, AT_SYMLINK_NOFOLLOW) == 0)
          done.push_back("made " + child_path + " root's (was uid " + std::to_string(st.st_uid) + ")");
      }
      if ((st.st_mode & 07777) != 0600) fchmodat(fd, name.c_str(), 0600, 0);
    }
  }
};

}  // namespace

int repair(std::vector<std::string>& done) {
  UniqueFd r(open(g_root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!r) return errno == ENOENT ? 0 : -errno;
  Repairer{done}.walk(r.get(), g_root, Place::kRoot, 0);
  return 0;
}

}  // namespace syrup::pins
