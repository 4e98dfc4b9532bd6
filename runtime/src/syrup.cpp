// libsyrup: the C API of runtime/include/syrup/syrup.h over the control protocol.
//
// Each call opens its own short connection to syrupd, so the library keeps no shared
// connection state and is safe from any thread; the only per-thread state is the last
// error message. Policy lifetime is tied to the deploying process (syrupd watches it),
// not to a connection.
#include "syrup/syrup.h"

#include <bpf/bpf.h>
#include <errno.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <string>

#include "client.h"
#include "names.h"

namespace {

thread_local std::string g_last_error;
std::mutex g_app_mu;
std::string g_app;

int fail(int err, std::string msg) {
  g_last_error = std::move(msg);
  return err;
}

std::string default_app() {
  std::lock_guard lk(g_app_mu);
  if (!g_app.empty()) return g_app;
  if (const char* e = std::getenv("SYRUP_APP"); e && *e) return e;
  return syrup::names::application_from(program_invocation_short_name);
}

// One request/response with syrupd; the response's fds are returned through `resp`.
int rpc(const nlohmann::json& req, syrup::Message& resp, std::span<const int> fds = {}) {
  syrup::Client c;
  int r = c.connect(syr_socket_path());
  if (r) return fail(r, c.error());
  r = c.call(req, resp, fds);
  if (r) return fail(r, c.error());
  std::string err;
  r = syrup::response_status(resp, err);
  if (r) return fail(r, err);
  g_last_error.clear();
  return 0;
}

// Options are read up to the size the caller compiled against (libbpf's OPTS idiom).
bool opts_has(const syr_deploy_opts* o, size_t end) { return o && o->sz >= end; }
#define OPT(o, field, dflt) \
  (opts_has(o, offsetof(syr_deploy_opts, field) + sizeof((o)->field)) ? (o)->field : (dflt))

}  // namespace

extern "C" {

const char* syr_socket_path(void) {
  const char* e = std::getenv("SYRUP_SOCKET");
  return e && *e ? e : syrup::proto::kDefaultSocket;
}

const char* syr_last_error(void) { return g_last_error.c_str(); }

int syr_set_app(const char* app) {
  if (!app || !*app) return fail(-EINVAL, "application name is empty");
  std::lock_guard lk(g_app_mu);
  g_app = app;
  return 0;
}

int syr_deploy_policy_source(const char* source, size_t len, const char* name,
                             enum syr_hook hook, const struct syr_deploy_opts* opts) {
  if (!source) return fail(-EINVAL, "policy source is NULL");
  if (opts && opts->sz < offsetof(syr_deploy_opts, app))
    return fail(-EINVAL, "syr_deploy_opts.sz is not set (use sizeof(struct syr_deploy_opts))");

  // What syrupd would refuse is refused here, in its words, before a connection: a source
  // larger than a request frame could not even be sent (syrupd's own --max_source_bytes,
  // 1 MiB by default, it checks itself).
  if (std::string why = syrup::names::source_size(len, syrup::proto::kMaxPayload,
                                                  "a deploy request carries at most 4 MiB; syrupd's "
                                                  "--max_source_bytes is 1048576 unless set");
      !why.empty())
    return fail(-EFBIG, why);
  const char* app = OPT(opts, app, nullptr);
  const char* shown = OPT(opts, name, nullptr);
  nlohmann::json req = {
      {"op", "deploy"},
      // By its enum value: syrupd's hook registry names it, so a hook added to syrupd
      // needs no table here.
      {"hook_id", static_cast<int>(hook)},
      {"app", app && *app ? std::string(app) : default_app()},
      {"name", shown && *shown ? shown : (name ? name : "policy.c")},
      {"source_name", name ? name : "policy.c"},
      {"source", std::string(source, len)},
      {"persist", OPT(opts, persist, false)},
  };
  const syr_param* params = OPT(opts, params, nullptr);
  size_t n_params = OPT(opts, n_params, 0);
  if (n_params && !params) return fail(-EINVAL, "n_params is set but params is NULL");
  nlohmann::json pj = nlohmann::json::object();
  for (size_t i = 0; i < n_params; i++) {
    if (!params[i].name) return fail(-EINVAL, "parameter " + std::to_string(i) + " has no name");
    if (std::string why = syrup::names::check("parameter", params[i].name, syrup::names::Kind::kParam); !why.empty())
      return fail(-EINVAL, why);
    pj[params[i].name] = params[i].value;
  }
  req["params"] = pj;

  const int* fds = OPT(opts, fds, nullptr);
  size_t n_fds = OPT(opts, n_fds, 0);
  int pid = OPT(opts, pid, 0);
  uint16_t port = OPT(opts, port, 0);
  if (n_fds && !fds) return fail(-EINVAL, "n_fds is set but fds is NULL");
  if (n_fds > syrup::proto::kMaxFds)
    return fail(-E2BIG, "at most " + std::to_string(syrup::proto::kMaxFds) +
                            " sockets can be passed in one deploy (the kernel's SCM_MAX_FD)");
  if (pid > 0) req["pid"] = pid;
  if (port) req["port"] = port;
  if (uint16_t end = OPT(opts, port_end, 0)) req["port_end"] = end;
  if (const char* ifname = OPT(opts, ifname, nullptr)) req["ifname"] = ifname;
  if (const char* proto = OPT(opts, protocol, nullptr)) req["protocol"] = proto;
  if (const char* address = OPT(opts, address, nullptr)) req["address"] = address;
  const uint16_t* ports = OPT(opts, ports, nullptr);
  size_t n_ports = OPT(opts, n_ports, 0);
  if (n_ports && !ports) return fail(-EINVAL, "n_ports is set but ports is NULL");
  if (n_ports) req["ports"] = std::vector<uint16_t>(ports, ports + n_ports);
  const int* cpus = OPT(opts, cpus, nullptr);
  size_t n_cpus = OPT(opts, n_cpus, 0);
  if (n_cpus && !cpus) return fail(-EINVAL, "n_cpus is set but cpus is NULL");
  if (n_cpus) req["cpus"] = std::vector<int>(cpus, cpus + n_cpus);
  if (std::string why = syrup::names::check("application", req["app"].get<std::string>()); !why.empty())
    return fail(-EINVAL, why);
  for (auto [what, key] : {std::pair{"policy", "name"}, std::pair{"source", "source_name"}})
    if (std::string why = syrup::names::check(what, req[key].get<std::string>(), syrup::names::Kind::kDisplay);
        !why.empty())
      return fail(-EINVAL, why);
  if (req.contains("ifname"))
    if (std::string why = syrup::names::check("interface", req["ifname"].get<std::string>(),
                                              syrup::names::Kind::kInterface);
        !why.empty())
      return fail(-EINVAL, why);
  if (pid < 0 || pid > syrup::names::kMaxPid)
    return fail(-EINVAL, "pid must be an integer in 0.." + std::to_string(syrup::names::kMaxPid) + ", got " +
                             std::to_string(pid));
  for (size_t i = 0; i < n_cpus; i++)
    if (cpus[i] < 0) return fail(-EINVAL, "cpus must be cores 0.., got " + std::to_string(cpus[i]));
  syrup::Message resp;
  int r = rpc(req, resp, std::span<const int>(fds, fds ? n_fds : 0));
  if (r) return r;
  {
    // The first application this process deploys for becomes its default (syr_map_open).
    std::lock_guard lk(g_app_mu);
    if (g_app.empty()) g_app = req["app"].get<std::string>();
  }
  return resp.body.value("id", -EIO);
}

int syr_deploy_policy(const char* path, enum syr_hook hook, const struct syr_deploy_opts* opts) {
  if (!path) return fail(-EINVAL, "policy path is NULL");
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    int e = errno ? errno : ENOENT;
    return fail(-e, std::string("cannot read policy file ") + path + ": " + std::strerror(e));
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  std::string src = ss.str();
  return syr_deploy_policy_source(src.data(), src.size(), path, hook, opts);
}

int syr_remove_policy(int policy_id) {
  syrup::Message resp;
  return rpc({{"op", "remove"}, {"id", policy_id}}, resp);
}

int syr_map_open_app(const char* app, const char* name) {
  if (!name || !*name) return fail(-EINVAL, "map name is empty");
  syrup::Message resp;
  int r = rpc({{"op", "map_open"}, {"app", app && *app ? std::string(app) : default_app()},
               {"map", name}},
              resp);
  if (r) return r;
  if (resp.fds.size() != 1) return fail(-EPROTO, "syrupd answered map_open without a map fd");
  return resp.fds[0].release();
}

int syr_map_open(const char* name) { return syr_map_open_app(nullptr, name); }

int syr_map_lookup_elem(int map_fd, const void* key, void* value) {
  if (bpf_map_lookup_elem(map_fd, key, value) < 0) {
    int e = errno;
    return fail(-e, std::string("map lookup failed: ") + std::strerror(e));
  }
  return 0;
}

int syr_map_update_elem(int map_fd, const void* key, const void* value, uint64_t flags) {
  if (bpf_map_update_elem(map_fd, key, value, flags) < 0) {
    int e = errno;
    return fail(-e, std::string("map update failed: ") + std::strerror(e));
  }
  return 0;
}

int syr_map_mmap(int map_fd, struct syr_mapped_array* out) {
  if (!out) return fail(-EINVAL, "out is NULL");
  // Zeroed first: a caller that stores through it after a failure faults at once instead
  // of writing wherever an uninitialised base pointed.
  *out = {};
  // A failed syr_map_open()'s result passed on unchecked (the README's form): its
  // error (and syr_last_error()'s text, "no map ...") is the one to report.
  if (map_fd < 0) return map_fd;
  bpf_map_info info{};
  uint32_t len = sizeof info;
  if (bpf_map_get_info_by_fd(map_fd, &info, &len) < 0) {
    int e = errno;
    return fail(-e, std::string("not a BPF map fd: ") + std::strerror(e));
  }
  if (info.type != BPF_MAP_TYPE_ARRAY || !(info.map_flags & BPF_F_MMAPABLE))
    return fail(-EOPNOTSUPP, std::string("map '") + info.name +
                                 "' is not an mmap'able array (declare it with SYR_ARRAY)");
  size_t stride = (info.value_size + 7) & ~size_t{7};
  size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  size_t mlen = (stride * info.max_entries + page - 1) / page * page;
  void* p = mmap(nullptr, mlen, PROT_READ | PROT_WRITE, MAP_SHARED, map_fd, 0);
  if (p == MAP_FAILED) {
    int e = errno;
    return fail(-e, std::string("mmap of map '") + info.name + "' failed: " + std::strerror(e));
  }
  *out = {p, mlen, info.value_size, static_cast<uint32_t>(stride), info.max_entries};
  return 0;
}

void syr_map_munmap(struct syr_mapped_array* arr) {
  if (arr && arr->base) {
    munmap(arr->base, arr->mapped_len);
    arr->base = nullptr;
  }
}

// ---- SO_REUSEPORT groups ------------------------------------------------------------

namespace {
// A new socket of `type` bound to `addr`, SO_REUSEPORT set first if `reuseport`; the fd
// or -errno.
int bound_socket(int type, const sockaddr* addr, socklen_t len, bool reuseport) {
  int fd = socket(addr->sa_family, type, 0);
  if (fd < 0) return -errno;
  int one = 1;
  if ((reuseport && setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one) < 0) ||
      bind(fd, addr, len) < 0) {
    int e = -errno;
    close(fd);
    return e;
  }
  return fd;
}

std::string addr_text(const sockaddr* addr) {
  char ip[INET6_ADDRSTRLEN] = "?";
  if (addr->sa_family == AF_INET) {
    auto* a = reinterpret_cast<const sockaddr_in*>(addr);
    inet_ntop(AF_INET, &a->sin_addr, ip, sizeof ip);
    return std::string(ip) + ":" + std::to_string(ntohs(a->sin_port));
  }
  auto* a = reinterpret_cast<const sockaddr_in6*>(addr);
  inet_ntop(AF_INET6, &a->sin6_addr, ip, sizeof ip);
  return "[" + std::string(ip) + "]:" + std::to_string(ntohs(a->sin6_port));
}
}  // namespace

int syr_open_reuseport_group(int type, struct sockaddr* addr, socklen_t addrlen, int* fds, size_t n) {
  if (!addr || !fds || n == 0) return fail(-EINVAL, "addr and fds must be set and n at least 1");
  in_port_t* port;
  if (addr->sa_family == AF_INET && addrlen >= sizeof(sockaddr_in))
    port = &reinterpret_cast<sockaddr_in*>(addr)->sin_port;
  else if (addr->sa_family == AF_INET6 && addrlen >= sizeof(sockaddr_in6))
    port = &reinterpret_cast<sockaddr_in6*>(addr)->sin6_port;
  else
    return fail(-EINVAL, "addr is neither a sockaddr_in nor a sockaddr_in6");
  // On failure the caller finds no fd number, not stale ones it might close twice.
  std::fill(fds, fds + n, -1);
  // Port 0: a placeholder without SO_REUSEPORT is given a port no socket holds (given
  // port 0 with SO_REUSEPORT, the kernel would also consider ports of same-user groups).
  // It then sets SO_REUSEPORT so that the group can bind beside it, and is closed once
  // the group holds the port: the port is never free in between, so no retry is needed.
  syrup::UniqueFd placeholder;
  if (*port == 0) {
    int fd = bound_socket(type, addr, addrlen, false);
    if (fd < 0) return fail(fd, "no free port on " + addr_text(addr) + ": " + std::strerror(-fd));
    placeholder.reset(fd);
    socklen_t l = addrlen;
    int one = 1;
    if (getsockname(placeholder.get(), addr, &l) < 0 ||
        setsockopt(placeholder.get(), SOL_SOCKET, SO_REUSEPORT, &one, sizeof one) < 0) {
      int e = -errno;
      *port = 0;
      return fail(e, "cannot hold a free port on " + addr_text(addr) + ": " + std::strerror(-e));
    }
  }
  for (size_t i = 0; i < n; i++) {
    int fd = bound_socket(type, addr, addrlen, true);
    if (fd < 0) {
      std::string where = addr_text(addr);
      for (size_t j = i; j > 0; j--) {
        close(fds[j - 1]);
        fds[j - 1] = -1;
      }
      if (placeholder) *port = 0;
      return fail(fd, "SO_REUSEPORT socket on " + where + ": " + std::strerror(-fd));
    }
    fds[i] = fd;
  }
  g_last_error.clear();
  return 0;
}

// ---- The thread hook -----------------------------------------------------------------
//
// A thread's critical-section counter is found by its tid in g_registered, which
// registration (of the calling thread or, by tid, of another) writes; each thread caches
// its own in t_cs and looks again only after g_registry_gen moved, so syr_cs_enter()
// stays one atomic load and a store while no registration happens.

namespace {
std::mutex g_thread_mu;
// The syrup_cs maps this process has mapped, by kernel map id: kept mapped for the life
// of the process, since threads may still hold pointers into them.
std::map<uint32_t, syr_mapped_array> g_cs_maps;
int g_threads_fd = -1;                 // the syrup_threads map of the last registration
// A thread registered here, by its tid (gettid() in this process's pid namespace).
struct Registered {
  uint64_t* cs;  // its critical-section depth, in the mapped syrup_cs
  uint32_t key;  // its syrup_threads key (kernel_tid())
};
std::map<pid_t, Registered> g_registered;
pid_t g_same_ns_pid = 0;               // getpid() once syrupd said it shares our pid namespace
std::atomic<uint64_t> g_registry_gen{1};  // bumped (under g_thread_mu) on each change of g_registered
thread_local uint64_t* t_cs = nullptr;    // this thread's counter, as of t_cs_gen
thread_local uint64_t t_cs_gen = 0;

pid_t my_tid() { return static_cast<pid_t>(syscall(SYS_gettid)); }

// Whether `tid` is a thread of this process: signal 0 to it, which needs no /proc (a
// sandbox may not mount it, and a container's may number threads differently).
bool is_my_thread(pid_t tid) {
  return tid == my_tid() || (tid > 0 && syscall(SYS_tgkill, getpid(), tid, 0) == 0);
}

// Whether `tid` is no thread of this process (any more).
bool has_left(pid_t tid) {
  return tid > 0 && syscall(SYS_tgkill, getpid(), tid, 0) < 0 && errno == ESRCH;
}

// Thread `tid` of this process as the kernel's hooks and syrupd number it, syrup_threads'
// key: the same number, unless this process is in a pid namespace of its own (a
// container), where syrupd translates (docs/protocol.md, thread_tid). Asked until syrupd
// says the namespaces are one, and again after a fork. Call with g_thread_mu held.
int kernel_tid(pid_t tid, uint32_t& key) {
  if (g_same_ns_pid == getpid()) {
    key = static_cast<uint32_t>(tid);
    return 0;
  }
  syrup::Message resp;
  if (int r = rpc({{"op", "thread_tid"}, {"tid", tid}}, resp)) return r;
  if (!resp.body.contains("tid") || !resp.body["tid"].is_number_integer())
    return fail(-EPROTO, "syrupd answered thread_tid without a tid");
  key = resp.body["tid"].get<uint32_t>();
  if (resp.body.value("same_pid_namespace", false)) g_same_ns_pid = getpid();
  return 0;
}

uint32_t map_id(int fd) {
  bpf_map_info info{};
  uint32_t len = sizeof info;
  return bpf_map_get_info_by_fd(fd, &info, &len) == 0 ? info.id : 0;
}

// Call with g_thread_mu held, after changing g_registered.
void registry_changed() { g_registry_gen.fetch_add(1, std::memory_order_release); }

uint64_t* my_cs() {
  if (t_cs_gen != g_registry_gen.load(std::memory_order_acquire)) {
    std::lock_guard lk(g_thread_mu);
    auto it = g_registered.find(my_tid());
    t_cs = it == g_registered.end() ? nullptr : it->second.cs;
    t_cs_gen = g_registry_gen.load(std::memory_order_relaxed);
  }
  return t_cs;
}
}  // namespace

int syr_thread_register_tid(pid_t tid, uint32_t executor_index) {
  if (executor_index >= SYR_MAX_EXECUTORS)
    return fail(-EINVAL, "executor index " + std::to_string(executor_index) + " is not below " +
                             std::to_string(SYR_MAX_EXECUTORS));
  if (!is_my_thread(tid))
    return fail(-ESRCH, "cannot register thread " + std::to_string(tid) + ": not a thread of this process (pid " +
                            std::to_string(getpid()) + ")");
  std::lock_guard lk(g_thread_mu);
  // Opened each time (registration is rare): the application's policy may have been
  // removed and deployed anew, with new maps, since the last call.
  int fd = syr_map_open("syrup_threads");
  if (fd < 0)
    return fail(fd, std::string("cannot register the thread: ") + syr_last_error() +
                        " (deploy a thread policy for this application first)");
  if (g_threads_fd >= 0) close(g_threads_fd);
  g_threads_fd = fd;
  int cfd = syr_map_open("syrup_cs");
  if (cfd < 0) return cfd;
  uint32_t id = map_id(cfd);
  auto it = g_cs_maps.find(id);
  if (it == g_cs_maps.end()) {
    syr_mapped_array a{};
    int r = syr_map_mmap(cfd, &a);
    if (r) {
      close(cfd);
      return r;
    }
    it = g_cs_maps.emplace(id, a).first;
  }
  close(cfd);
  uint32_t key;
  if (int r = kernel_tid(tid, key))
    return fail(r, "cannot register thread " + std::to_string(tid) + ": " + syr_last_error());
  if (int r = syr_map_update_elem(g_threads_fd, &key, &executor_index, 0)) return r;
  // Threads that exited registered: a new thread given one's tid must not find its counter.
  std::erase_if(g_registered, [](const auto& r) { return has_left(r.first); });
  g_registered[tid] = {static_cast<uint64_t*>(syr_array_elem(&it->second, executor_index)), key};
  registry_changed();
  return 0;
}

int syr_thread_register(uint32_t executor_index) { return syr_thread_register_tid(my_tid(), executor_index); }

int syr_thread_unregister_tid(pid_t tid) {
  std::lock_guard lk(g_thread_mu);
  auto here = g_registered.find(tid);
  if (here == g_registered.end() && !is_my_thread(tid))
    return fail(-ESRCH, "cannot unregister thread " + std::to_string(tid) +
                            ": not a thread of this process (pid " + std::to_string(getpid()) + ")");
  if (g_threads_fd < 0) return 0;  // nothing was registered in this process
  uint32_t key;
  if (here != g_registered.end()) {
    key = here->second.key;
    g_registered.erase(here);
    registry_changed();
  } else if (int r = kernel_tid(tid, key)) {
    return fail(r, "cannot unregister thread " + std::to_string(tid) + ": " + syr_last_error());
  }
  if (bpf_map_delete_elem(g_threads_fd, &key) < 0 && errno != ENOENT) {
    int e = errno;
    return fail(-e, std::string("cannot unregister the thread: ") + std::strerror(e));
  }
  return 0;
}

int syr_thread_unregister(void) { return syr_thread_unregister_tid(my_tid()); }

void syr_cs_enter(void) {
  if (uint64_t* p = my_cs()) __atomic_store_n(p, *p + 1, __ATOMIC_RELEASE);
}

void syr_cs_exit(void) {
  if (uint64_t* p = my_cs(); p && *p > 0) __atomic_store_n(p, *p - 1, __ATOMIC_RELEASE);
}

}  // extern "C"
