#include "socket_select.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>

#include <bpf/bpf.h>

#include "syrup/abi.h"

namespace syrup::socket_select {
namespace {

int sockopt_int(int fd, int level, int opt, int& v) {
  socklen_t l = sizeof v;
  return getsockopt(fd, level, opt, &v, &l) < 0 ? -errno : 0;
}

const char* proto_name(int p) { return p == IPPROTO_TCP ? "tcp" : "udp"; }

struct SockInfo {
  int protocol = 0;
  uint16_t port = 0;
  std::string address;
  bool reuseport = false;
  bool listening = false;
};

// Describes an inet socket. -ENOTSOCK / -EAFNOSUPPORT for anything else.
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
  return 0;
}

// Why `si` cannot be an executor, or "".
std::string unusable(const SockInfo& si) {
  if (si.protocol != IPPROTO_UDP && si.protocol != IPPROTO_TCP) return "not a UDP or TCP socket";
  if (!si.reuseport) return "SO_REUSEPORT is not set on it";
  if (si.port == 0) return "it is not bound to a port";
  if (si.protocol == IPPROTO_TCP && !si.listening) return "it is a TCP socket that is not listening";
  return {};
}

}  // namespace

std::string Executors::group() const {
  return std::string(proto_name(protocol)) + "/" + address + ":" + std::to_string(port);
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
    if (i == 0) {
      out.protocol = si.protocol;
      out.port = si.port;
      out.address = si.address;
    } else if (si.protocol != out.protocol || si.port != out.port || si.address != out.address) {
      err = "executor " + std::to_string(i) + " (" + proto_name(si.protocol) + "/" + si.address +
            ":" + std::to_string(si.port) + ") is not in the group of executor 0 (" + out.group() + ")";
      return -EINVAL;
    }
  }
  out.sockets = std::move(fds);
  return 0;
}

int from_pid(pid_t pid, uint16_t port, int protocol, Executors& out, std::string& err) {
  if (port == 0) {
    err = "--pid needs --port: which of the process's sockets to schedule";
    return -EINVAL;
  }
  UniqueFd pidfd(static_cast<int>(syscall(SYS_pidfd_open, pid, 0)));
  if (!pidfd) {
    int e = errno;
    err = "no process " + std::to_string(pid) + ": " + std::strerror(e);
    return -e;
  }
  std::string dir = "/proc/" + std::to_string(pid) + "/fd";
  DIR* d = opendir(dir.c_str());
  if (!d) {
    int e = errno;
    err = "cannot list " + dir + ": " + std::strerror(e);
    return -e;
  }
  std::vector<int> nums;
  while (dirent* de = readdir(d)) {
    if (de->d_name[0] == '.') continue;
    nums.push_back(std::atoi(de->d_name));
  }
  closedir(d);
  std::sort(nums.begin(), nums.end());

  // Per protocol, the sockets on `port` in ascending fd order, one per socket (a socket
  // the process has under two fd numbers counts once, at its lowest).
  std::map<int, Executors> found;
  std::map<ino_t, bool> seen;
  for (int n : nums) {
    char link[64];
    std::string path = dir + "/" + std::to_string(n);
    ssize_t l = readlink(path.c_str(), link, sizeof link - 1);
    if (l <= 0 || std::strncmp(link, "socket:", 7) != 0) continue;
    UniqueFd fd(static_cast<int>(syscall(SYS_pidfd_getfd, pidfd.get(), n, 0)));
    if (!fd) {
      int e = errno;
      err = "cannot take socket fd " + std::to_string(n) + " of process " + std::to_string(pid) +
            ": " + std::strerror(e);
      return -e;
    }
    struct stat st;
    if (fstat(fd.get(), &st) < 0 || seen[st.st_ino]) continue;
    SockInfo si;
    if (describe(fd.get(), si) || si.port != port || !unusable(si).empty()) continue;
    if (protocol && si.protocol != protocol) continue;
    seen[st.st_ino] = true;
    Executors& ex = found[si.protocol];
    if (ex.sockets.empty()) {
      ex.protocol = si.protocol;
      ex.port = si.port;
      ex.address = si.address;
    } else if (si.address != ex.address) {
      continue;  // another group on the same port (other address): not this one
    }
    if (ex.sockets.size() >= SYR_MAX_EXECUTORS) continue;
    ex.sockets.push_back(std::move(fd));
    ex.source_fds.push_back(n);
  }
  for (int p : {IPPROTO_UDP, IPPROTO_TCP}) {
    auto it = found.find(p);
    if (it != found.end()) {
      out = std::move(it->second);
      return 0;
    }
  }
  err = "process " + std::to_string(pid) + " has no SO_REUSEPORT " +
        (protocol == IPPROTO_TCP ? "TCP listener" : protocol == IPPROTO_UDP ? "UDP socket" : "socket") +
        " bound to port " + std::to_string(port);
  return -ENOENT;
}

int fill(const Executors& ex, int map_fd, std::string& err) {
  for (uint32_t i = 0; i < ex.sockets.size(); i++) {
    uint64_t fd = static_cast<uint64_t>(ex.sockets[i].get());
    if (bpf_map_update_elem(map_fd, &i, &fd, 0) < 0) {
      int e = errno;
      err = "cannot add executor " + std::to_string(i) + " to the executor map: " + std::strerror(e);
      return -e;
    }
  }
  return 0;
}

void release(int map_fd) {
  for (uint32_t i = 0; i < SYR_MAX_EXECUTORS; i++) bpf_map_delete_elem(map_fd, &i);
}

bool same_sockets(const Executors& a, const Executors& b) {
  if (a.sockets.size() != b.sockets.size()) return false;
  for (size_t i = 0; i < a.sockets.size(); i++) {
    struct stat sa, sb;
    if (fstat(a.sockets[i].get(), &sa) || fstat(b.sockets[i].get(), &sb) || sa.st_ino != sb.st_ino)
      return false;
  }
  return true;
}

int attach(const Executors& ex, int prog_fd, std::string& err) {
  if (setsockopt(ex.sockets.at(0).get(), SOL_SOCKET, SO_ATTACH_REUSEPORT_EBPF, &prog_fd,
                 sizeof prog_fd) < 0) {
    int e = errno;
    err = "cannot attach the policy to " + ex.group() + ": " + std::strerror(e);
    return -e;
  }
  return 0;
}

int detach(const Executors& ex, std::string& err) {
  int dummy = 0;
  if (setsockopt(ex.sockets.at(0).get(), SOL_SOCKET, SO_DETACH_REUSEPORT_BPF, &dummy,
                 sizeof dummy) < 0 &&
      errno != ENOENT) {
    int e = errno;
    err = "cannot detach the policy from " + ex.group() + ": " + std::strerror(e);
    return -e;
  }
  return 0;
}

}  // namespace syrup::socket_select
