#include "daemon.h"
#include "proc.h"

#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/file.h>
#include <poll.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <algorithm>
#include <filesystem>
#include <set>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <tuple>

#include "config.h"
#include "log.h"
#include "names.h"
#include "pins.h"
#include "text.h"
#include "registry.h"
#include "syrup/abi.h"

namespace syrup {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// A begun request frame must be whole, and an answer read, within this: a peer that
// trickles bytes is closed then, and holds no one else meanwhile (reads never wait).
constexpr int kFrameDeadlineSec = 5;
// How often syrupd looks for policies whose attachment ended without news it could wait
// for (every socket of a socket-select group closed).
constexpr int kEndedCheckSec = 2;
constexpr int kConfigRetrySec = 5;  // how often --config entries waiting for their process or interface are retried

// The operations dispatch() serves (docs/protocol.md), in the order its error lists them.
// Only these become metric labels, so a client cannot grow the label set.
const std::vector<std::string> kOps = {"ping",     "deploy",   "remove",    "list",
                                       "stats",    "map_open", "map_dump", "thread_tid"};

// Has the process behind `pidfd` exited? A pidfd is readable from its process's exit on;
// false for -1 or a closed descriptor.
bool exited(int pidfd) {
  pollfd pf{pidfd, POLLIN, 0};
  return pidfd >= 0 && poll(&pf, 1, 0) == 1 && (pf.revents & POLLIN);
}

json ok(json extra = json::object()) {
  extra["ok"] = true;
  return extra;
}

int ensure_bpffs() {
  struct statfs sf;
  if (statfs("/sys/fs/bpf", &sf) == 0 && sf.f_type == BPF_FS_MAGIC) return 0;
  if (mount("bpf", "/sys/fs/bpf", "bpf", 0, "mode=0755") < 0) return -errno;
  log(LogLevel::kInfo, "mounted bpffs at /sys/fs/bpf");
  return 0;
}

std::string hex(const unsigned char* p, size_t n) {
  static const char* h = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; i++) {
    if (i) s += ' ';
    s += h[p[i] >> 4];
    s += h[p[i] & 15];
  }
  return s;
}

// The maps pinned under an application's directory, as its quotas count them: how many,
// and their memory (key + value bytes times entries). Quota checks and metrics agree.
struct MapUsage {
  size_t maps = 0;
  uint64_t bytes = 0;
};
MapUsage pinned_map_usage(const std::string& app) {
  MapUsage u;
  for (const auto& name : pins::app_map_names(app)) {
    UniqueFd m(pins::obj_get(pins::app_map(app, name)));
    bpf_map_info info{};
    uint32_t len = sizeof info;
    if (!m || bpf_map_get_info_by_fd(m.get(), &info, &len)) continue;
    u.maps++;
    u.bytes += uint64_t{info.key_size + info.value_size} * info.max_entries;
  }
  return u;
}

// A deploy request's policy name (shown in list) and the file name its diagnostics show:
// "name" and "source_name", each standing in for the other, else "policy.c".
void policy_names(const json& b, std::string& name, std::string& source_name) {
  auto str = [&](const char* k) {
    return b.contains(k) && b[k].is_string() ? b[k].get<std::string>() : std::string();
  };
  name = str("name");
  source_name = str("source_name");
  if (name.empty()) name = source_name.empty() ? "policy.c" : source_name;
  if (source_name.empty()) source_name = name;
  if (auto slash = name.rfind('/'); slash != std::string::npos) name = name.substr(slash + 1);
}

// A state-file entry as one line. Its strings may not be UTF-8 (a removal's reason quotes
// another process or the kernel; a --config policy's name is a file name): the dump
// replaces such bytes, so writing the state file can never make syrupd throw.
std::string state_entry(const json& entry) { return entry.dump(-1, ' ', false, json::error_handler_t::replace); }

json as_number(const unsigned char* p, size_t n) {
  switch (n) {
    case 1: return p[0];
    case 2: { uint16_t v; std::memcpy(&v, p, 2); return v; }
    case 4: { uint32_t v; std::memcpy(&v, p, 4); return v; }
    case 8: { uint64_t v; std::memcpy(&v, p, 8); return v; }
  }
  return nullptr;
}

}  // namespace

int Daemon::init(const DaemonConfig& cfg) {
  cfg_ = cfg;
  if (geteuid() != 0) {
    log(LogLevel::kError, "syrupd must run as root (it loads BPF programs and takes sockets)");
    return -EPERM;
  }
  signal(SIGPIPE, SIG_IGN);
  // Every policy holds a few fds (program, maps, executor sockets): 1024 would cap an
  // XDP deployment near a hundred applications.
  rlimit nofile;
  if (getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur < nofile.rlim_max) {
    nofile.rlim_cur = nofile.rlim_max;
    setrlimit(RLIMIT_NOFILE, &nofile);
  }
  loader_init();
  int r = ensure_bpffs();
  if (r) {
    log(LogLevel::kError, "bpffs is not mounted at /sys/fs/bpf and mounting it failed: %s",
        std::strerror(-r));
    return r;
  }
  pins::set_root(cfg_.bpffs_root);
  hooks_ = make_hooks({compiler_, cfg_.agent_cpus});

  // One daemon per control socket: the lock is held for the daemon's lifetime.
  fs::path sock(cfg_.socket_path);
  std::error_code ec;
  {
    // The socket's directory must be searchable by every user (syrupd's umask is 077);
    // only directories made here get 0755, no thread runs yet.
    mode_t old = umask(022);
    fs::create_directories(sock.parent_path(), ec);
    umask(old);
  }
  std::string lock_path = cfg_.socket_path + ".lock";
  lock_fd_.reset(open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
  if (!lock_fd_ || flock(lock_fd_.get(), LOCK_EX | LOCK_NB) < 0) {
    log(LogLevel::kError, "another syrupd is already serving %s (lock %s is held)",
        cfg_.socket_path.c_str(), lock_path.c_str());
    return -EBUSY;
  }

  // A tree an older syrupd handed to tenants (their application directories chowned to
  // them, links of theirs in it) is made root's before anything in it is opened.
  std::vector<std::string> repaired;
  if ((r = pins::repair(repaired)))
    log(LogLevel::kWarn, "cannot check the pin tree %s: %s", pins::root().c_str(), std::strerror(-r));
  for (auto& line : repaired) log(LogLevel::kWarn, "pin tree: %s", line.c_str());

  // What a previous syrupd left: adopt what its state file describes and its pins still
  // hold; release and remove the rest.
  adopt_state();
  std::string apps = pins::root() + "/apps";
  int released = 0;
  for (auto& app_dir : fs::directory_iterator(apps, ec))
    for (auto& pol : fs::directory_iterator(app_dir.path() / "policies", ec)) {
      int id = std::atoi(pol.path().filename().c_str());
      if (policies_.count(id) && policies_[id]->app == app_dir.path().filename().string()) continue;
      for (auto& h : hooks_) h->release_leftover(app_dir.path().filename().string(), pol.path());
      pins::remove_tree(pol.path());
      released++;
    }
  if (released)
    log(LogLevel::kWarn,
        "found %d policies of a previous syrupd under %s that could not be adopted: released "
        "what they held (their hooks use the kernel's default until deployed to again) and "
        "removed their pins",
        released, apps.c_str());
  // Applications no adopted policy belongs to go whole; those that have one keep only the
  // maps an adopted policy declares. A previous syrupd that died between pinning a new
  // policy's maps and recording the policy, or whose policies above could not be adopted,
  // leaves map pins nothing claims: they would hold kernel memory and count against the
  // application's quotas forever.
  std::vector<std::string> kept;
  for (auto& app_dir : fs::directory_iterator(apps, ec)) {
    std::string app = app_dir.path().filename().string();
    if (!app_owner_.count(app)) pins::remove_tree(app_dir.path());
    else kept.push_back(app);
  }
  for (auto& app : kept) {
    size_t before = pins::app_map_names(app).size();
    gc_app(app);
    size_t after = pins::app_map_names(app).size();
    if (after < before)
      log(LogLevel::kWarn, "removed %zu map pins of application '%s' that no adopted policy declares",
          before - after, app.c_str());
  }
  for (auto& h : hooks_) h->recover();
  if ((r = pins::make_dirs(apps))) {
    log(LogLevel::kError, "cannot create %s: %s", apps.c_str(), std::strerror(-r));
    return r;
  }

  std::string err;
  if ((r = compiler_.init(cfg_.compiler, err))) {
    log(LogLevel::kError, "%s", err.c_str());
    return r;
  }

  listen_fd_.reset(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (cfg_.socket_path.size() >= sizeof addr.sun_path) {
    log(LogLevel::kError, "socket path too long: %s", cfg_.socket_path.c_str());
    return -ENAMETOOLONG;
  }
  std::strcpy(addr.sun_path, cfg_.socket_path.c_str());
  unlink(cfg_.socket_path.c_str());  // stale: we hold the lock, so no daemon serves it
  if (bind(listen_fd_.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) < 0 ||
      listen(listen_fd_.get(), 64) < 0) {
    int e = errno;
    log(LogLevel::kError, "cannot listen on %s: %s", cfg_.socket_path.c_str(), std::strerror(e));
    return -e;
  }
  // Anyone may connect; what they may do is decided per request from SO_PEERCRED.
  chmod(cfg_.socket_path.c_str(), 0666);

  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGINT);
  sigaddset(&mask, SIGTERM);
  sigaddset(&mask, SIGHUP);
  sigprocmask(SIG_BLOCK, &mask, nullptr);
  signal_fd_.reset(signalfd(-1, &mask, SFD_CLOEXEC));
  epoll_fd_.reset(epoll_create1(EPOLL_CLOEXEC));
  // The workers start with the signals blocked, as they now are: SIGTERM must reach the
  // signalfd, not end the process on a worker thread.
  if ((r = compile_pool_.start(compiler_, cfg_.compile_workers, cfg_.compiles_per_uid))) {
    log(LogLevel::kError, "cannot start the compile workers: %s", std::strerror(-r));
    return r;
  }
  asks_fd_.reset(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!asks_fd_) return -errno;
  if ((r = load_pool_.start(cfg_.compile_workers))) {
    log(LogLevel::kError, "cannot start the load workers: %s", std::strerror(-r));
    return r;
  }
  std::vector<int> watched = {listen_fd_.get(), signal_fd_.get(), compile_pool_.event_fd(), load_pool_.event_fd(),
                              asks_fd_.get()};
  for (auto& h : hooks_)
    if (h->event_fd() >= 0) watched.push_back(h->event_fd());
  for (int fd : watched) {
    epoll_event ev{EPOLLIN, {.fd = fd}};
    epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, fd, &ev);
  }
  for (auto& [id, p] : policies_)
    if (p->owner_pidfd) {
      epoll_event ev{EPOLLIN, {.fd = p->owner_pidfd.get()}};
      epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, p->owner_pidfd.get(), &ev);
    }
  if (cfg_.metrics_port) {
    std::string merr;
    if ((r = metrics_.start(cfg_.metrics_port, merr))) {
      log(LogLevel::kError, "metrics endpoint: %s", merr.c_str());
      return r;
    }
    metrics_refresh_fd_ = metrics_.refresh_fd();
    epoll_event ev{EPOLLIN, {.fd = metrics_refresh_fd_}};
    epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, metrics_refresh_fd_, &ev);
    for (auto& a : metrics_.addresses()) log(LogLevel::kInfo, "metrics on http://%s/metrics", a.c_str());
  }
  if (!cfg_.config_path.empty()) {
    // At start a bad file is fatal (the operator is there to see it); on SIGHUP the
    // running configuration stays.
    std::vector<config::Diagnostic> errs;
    config::LoadOptions lo;
    lo.max_source_bytes = cfg_.max_source_bytes;
    if (config::load(cfg_.config_path, config_, errs, lo)) {
      for (auto& d : errs) log(LogLevel::kError, "%s", d.str().c_str());
      return -EINVAL;
    }
    apply_config();
  }
  changed();
  log(LogLevel::kInfo, "serving on %s, pins under %s", cfg_.socket_path.c_str(),
      pins::root().c_str());
  return 0;
}

int Daemon::run() {
  if (cfg_.on_ready) cfg_.on_ready(policies_.size());
  epoll_event evs[32];
  for (;;) {
    int timeout = sweep_clients();
    auto now = std::chrono::steady_clock::now();
    auto wake_at = [&](std::chrono::steady_clock::time_point t) {
      int ms = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(t - now).count() + 1);
      timeout = timeout < 0 ? ms : std::min(timeout, ms);
    };
    if (some_end_unannounced()) {
      if (now >= ended_check_at_) {
        if (remove_ended()) changed();
        ended_check_at_ = now + std::chrono::seconds(kEndedCheckSec);
      }
      if (some_end_unannounced()) wake_at(ended_check_at_);
    }
    if (!config_waiting_.empty()) {
      if (now >= config_retry_at_) {
        apply_config(true);
        config_retry_at_ = now + std::chrono::seconds(kConfigRetrySec);
      }
      if (!config_waiting_.empty()) wake_at(config_retry_at_);
    }
    int n = epoll_wait(epoll_fd_.get(), evs, 32, timeout);
    if (n < 0) {
      if (errno == EINTR) continue;
      log(LogLevel::kError, "epoll_wait: %s", std::strerror(errno));
      break;
    }
    bool stop = false;
    for (int i = 0; i < n; i++) {
      int fd = evs[i].data.fd;
      if (fd == listen_fd_.get()) {
        accept_client();
      } else if (fd == signal_fd_.get()) {
        signalfd_siginfo si;
        if (read(fd, &si, sizeof si) != sizeof si) continue;
        if (si.ssi_signo == SIGHUP) {
          if (cfg_.config_path.empty()) log(LogLevel::kInfo, "SIGHUP: nothing to reload (no --config)");
          else reload_config();
          continue;
        }
        log(LogLevel::kInfo, "%s: shutting down", strsignal(static_cast<int>(si.ssi_signo)));
        stop = true;
      } else if (auto c = clients_.find(fd); c != clients_.end()) {
        // What it is watched for now: an event fetched before it parked or began to
        // answer in this batch is stale.
        if (c->second.events & EPOLLOUT) flush_client(fd);
        else if (c->second.events & EPOLLIN) serve_client(fd);  // readable, closed or in error: the read tells which
      } else if (rejected_.count(fd)) {
        // Its request (or end of stream) came: the error it was sent has been delivered.
        epoll_ctl(epoll_fd_.get(), EPOLL_CTL_DEL, fd, nullptr);
        rejected_.erase(fd);
      } else if (fd == compile_pool_.event_fd() || fd == load_pool_.event_fd()) {
        resume_parked();
      } else if (fd == asks_fd_.get()) {
        answer_quota_asks();
      } else if (fd == metrics_refresh_fd_) {
        uint64_t n;
        if (read(fd, &n, sizeof n) == sizeof n) publish_metrics();
      } else if (Hook* h = hook_watching(fd)) {
        if (h->refresh()) follow_kernel();
      } else {
        owner_exited(fd);
      }
    }
    if (stop) break;
  }
  if (cfg_.on_stopping) cfg_.on_stopping();
  // Parked deploys are answered, not left hanging: their compiles are stopped, their
  // loads refused at the quota check or undone when the kernel returns.
  {
    std::lock_guard lk(asks_mu_);
    asks_closed_ = true;
    for (auto& a : asks_) a->answer.set_value("syrupd is shutting down; the policy was not deployed");
    asks_.clear();
  }
  compile_pool_.stop();
  load_pool_.stop();
  for (auto& [ticket, job] : loads_)
    if (job->loaded) job->loaded->unpin();
  for (auto& [ticket, p] : parked_) {
    Response resp{proto::error_response(ECANCELED, "syrupd is shutting down; the policy was not deployed")};
    totals_.error("deploy", ECANCELED);
    answer(p.fd, resp);
  }
  parked_.clear();
  if (cfg_.remove_on_exit) {
    std::vector<int> ids;
    for (auto& [id, p] : policies_) ids.push_back(id);
    for (int id : ids) remove_policy(id, true, "syrupd is shutting down");
    // Nothing of ours is left: the (now empty) pin tree goes too. remove() only takes
    // empty directories, so another daemon's pins under the same root stay.
    std::error_code ec;
    fs::remove(pins::root() + "/apps", ec);
    fs::remove(pins::xdp_dir(), ec);
    fs::remove(pins::root(), ec);
  } else {
    // The data path stays as it is; the next syrupd adopts it from the state file.
    save_state();
    log(LogLevel::kInfo, "leaving %zu policies in place for the next syrupd (state in %s)",
        policies_.size(), cfg_.state_file.c_str());
  }
  for (auto& h : hooks_) h->shutdown();
  unlink(cfg_.socket_path.c_str());
  return 0;
}

void Daemon::accept_client() {
  for (;;) {
    int c = accept4(listen_fd_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (c < 0) return;
    ucred cred{};
    socklen_t cl = sizeof cred;
    getsockopt(c, SOL_SOCKET, SO_PEERCRED, &cred, &cl);
    // Root is never turned away: the operator must be able to act while users crowd the
    // socket.
    if (cred.uid != 0 &&
        (clients_of_others() >= cfg_.max_clients || clients_of(cred.uid) >= cfg_.max_clients_per_uid)) {
      reject_client(c, cred.uid);
      continue;
    }
    auto [it, fresh] = clients_.emplace(c, Conn{});
    Conn& conn = it->second;
    conn.fd.reset(c);
    conn.uid = cred.uid;
    conn.pid = cred.pid;
    conn.last = std::chrono::steady_clock::now();
    watch(c, conn, EPOLLIN);
  }
}

void Daemon::watch(int fd, Conn& c, uint32_t events) {
  if (c.events == events) return;
  epoll_event ev{events, {.fd = fd}};
  int op = c.events == 0 ? EPOLL_CTL_ADD : events == 0 ? EPOLL_CTL_DEL : EPOLL_CTL_MOD;
  epoll_ctl(epoll_fd_.get(), op, fd, &ev);
  c.events = events;
}

// Counted from clients_ when asked (at most --max_clients and root's connections): no
// counter to keep in step with every place a connection ends.
size_t Daemon::clients_of(uid_t uid) const {
  return std::count_if(clients_.begin(), clients_.end(), [&](auto& c) { return c.second.uid == uid; });
}

size_t Daemon::clients_of_others() const { return clients_.size() - clients_of(0); }

void Daemon::reject_client(int c, uid_t uid) {
  UniqueFd fd(c);
  // The per-uid cap is named when it is the one reached: the user can then act on it
  // (close its own connections) rather than wait for others.
  size_t own = clients_of(uid), others = clients_of_others();
  std::string why;
  if (own >= cfg_.max_clients_per_uid) {
    log(LogLevel::kWarn, "refused a connection of uid %u: it has %zu open (--max_clients_per_uid)", uid, own);
    why = "syrupd serves at most " + std::to_string(cfg_.max_clients_per_uid) +
          " connections per user other than root at a time (syrupd --max_clients_per_uid); uid " +
          std::to_string(uid) + " has " + std::to_string(own) + " open; retry later";
  } else {
    log(LogLevel::kWarn, "refused a connection of uid %u: %zu connections of users other than root are open (--max_clients)",
        uid, others);
    why = "syrupd serves at most " + std::to_string(cfg_.max_clients) +
          " connections of users other than root at a time (syrupd --max_clients); " +
          std::to_string(others) + " are open; retry later";
  }
  totals_.error("connect", EBUSY);
  // The error goes out before the request comes in; the client reads it as the answer to
  // its request. Closing at once would make the client's send fail with EPIPE instead,
  // so the connection is half-closed and kept until the request arrives (or 1 s). The
  // frame is a few hundred bytes into an empty socket buffer: the non-blocking send
  // takes it whole.
  proto::send_message(c, proto::error_response(EBUSY, why));
  shutdown(c, SHUT_WR);
  constexpr size_t kMaxRejected = 64;  // beyond this, close at once: no unbounded parking
  if (rejected_.size() >= kMaxRejected) return;
  epoll_event ev{EPOLLIN, {.fd = c}};
  if (epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, c, &ev) < 0) return;
  rejected_.emplace(c, std::pair{std::move(fd), std::chrono::steady_clock::now() + std::chrono::seconds(1)});
}

int Daemon::sweep_clients() {
  auto now = std::chrono::steady_clock::now();
  auto next = std::chrono::steady_clock::time_point::max();
  for (auto it = rejected_.begin(); it != rejected_.end();) {
    if (it->second.second <= now) {
      epoll_ctl(epoll_fd_.get(), EPOLL_CTL_DEL, it->first, nullptr);
      it = rejected_.erase(it);
    } else {
      next = std::min(next, it->second.second);
      ++it;
    }
  }
  auto idle = std::chrono::seconds(cfg_.client_idle_timeout_s);
  std::vector<int> late;
  for (auto& [fd, c] : clients_) {
    // A begun frame, and an answer being sent, each have kFrameDeadlineSec: a peer that
    // trickles its request or reads its answer a byte at a time is closed then, having
    // held nobody else meanwhile.
    if (c.in.in_frame() && c.frame_by <= now) {
      log(LogLevel::kWarn, "pid %d uid %u: bad request: the frame did not arrive whole within %d s; closing the connection",
          c.pid, c.uid, kFrameDeadlineSec);
      late.push_back(fd);
    } else if (!c.out.empty() && c.out_by <= now) {
      log(LogLevel::kWarn, "pid %d uid %u: the answer (%zu bytes) was not read within %d s; closing the connection",
          c.pid, c.uid, c.out.size(), kFrameDeadlineSec);
      late.push_back(fd);
    } else if (!c.parked && c.out.empty() && !c.in.in_frame() && cfg_.client_idle_timeout_s && c.last + idle <= now) {
      log(LogLevel::kDebug, "closing a connection of uid %u idle for %u s", c.uid, cfg_.client_idle_timeout_s);
      late.push_back(fd);
    } else {
      if (c.in.in_frame()) next = std::min(next, c.frame_by);
      if (!c.out.empty()) next = std::min(next, c.out_by);
      if (!c.parked && cfg_.client_idle_timeout_s) next = std::min(next, c.last + idle);
    }
  }
  for (int fd : late) drop_client(fd);
  if (auto due = sweep_loads(now); due < next) next = due;
  if (next == std::chrono::steady_clock::time_point::max()) return -1;
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(next - now).count() + 1;
  return static_cast<int>(std::clamp<long long>(ms, 1, 60000));
}

void Daemon::drop_client(int fd) {
  auto it = clients_.find(fd);
  if (it == clients_.end()) return;
  watch(fd, it->second, 0);
  clients_.erase(it);
}

void Daemon::answer(int fd, Response& resp) {
  auto it = clients_.find(fd);
  if (it == clients_.end()) return;
  Conn& c = it->second;
  c.last = std::chrono::steady_clock::now();
  if (int r = proto::encode_frame(resp.body, c.out)) {
    log(LogLevel::kWarn, "pid %d uid %u: the answer is over the %u-byte frame limit", c.pid, c.uid, proto::kMaxPayload);
    proto::encode_frame(proto::error_response(-r, "the answer would be larger than the 4 MiB frame limit"), c.out);
    resp.fds.clear();
  }
  // The response's descriptors may be borrowed from what a later request removes: the
  // connection holds its own copies until they are sent.
  c.out_fds.clear();
  for (int f : resp.fds) c.out_fds.emplace_back(fcntl(f, F_DUPFD_CLOEXEC, 0));
  c.out_off = 0;
  c.out_by = c.last + std::chrono::seconds(kFrameDeadlineSec);
  flush_client(fd);
}

void Daemon::flush_client(int fd) {
  auto it = clients_.find(fd);
  if (it == clients_.end()) return;
  Conn& c = it->second;
  while (c.out_off < c.out.size()) {
    std::vector<int> fds;
    for (auto& f : c.out_fds) fds.push_back(f.get());
    ssize_t w = proto::send_some(fd, c.out, c.out_off, fds);
    if (w == -EAGAIN) {
      watch(fd, c, EPOLLOUT);  // resumed when the socket drains
      return;
    }
    if (w < 0) {
      log(LogLevel::kInfo, "pid %d uid %u: the connection ended before its answer (%zu of %zu bytes) was sent: %s",
          c.pid, c.uid, c.out_off, c.out.size(), std::strerror(static_cast<int>(-w)));
      return drop_client(fd);
    }
    c.out_off += static_cast<size_t>(w);
    c.out_fds.clear();  // they went with the first byte
  }
  c.out.clear();
  c.out.shrink_to_fit();
  c.out_off = 0;
  c.last = std::chrono::steady_clock::now();
  if (c.close_after) return drop_client(fd);
  // The next request: only now, so that a connection has one answer in flight at most.
  watch(fd, c, c.parked ? 0u : uint32_t{EPOLLIN});
}

// Thread-safe (a load worker's): the compiler serves several threads at once.
int Daemon::compile_verify_build(const CompileJob& job, LoadSpec& spec, LoadFailure& fail) {
  CompileResult cr = compiler_.compile(job);
  if (cr.err) {
    fail.message = "policy " + spec.policy_name + " does not compile with the " + job.wrapper +
                   " wrapper it is verified with as unprivileged code";
    fail.log = cr.diagnostics;
    return cr.err;
  }
  spec.verify_object_path = cr.object_path;
  return 0;
}

void Daemon::park(int fd, const Caller& caller, proto::Message req, std::unique_ptr<Deferred> d) {
  Conn& c = clients_[fd];
  c.parked = true;
  watch(fd, c, 0);
  uint64_t ticket = next_ticket_++;
  req.fds = std::move(d->fds);
  if (d->load) {
    std::shared_ptr<LoadJob> job = d->load;
    log(LogLevel::kDebug, "pid %d uid %u: deploy parked while policy %d (%s) is verified and loaded (ticket %llu)",
        caller.pid, caller.uid, job->spec.policy_id, job->spec.policy_name.c_str(),
        static_cast<unsigned long long>(ticket));
    d->load_by = std::chrono::steady_clock::now() + std::chrono::seconds(cfg_.load_timeout_s);
    job->ticket = ticket;
    job->spec.check_quota = [this, ticket](const LoadFootprint& fp) { return ask_quota(ticket, fp); };
    loads_[ticket] = job;
    loading_apps_[job->spec.app]++;
    load_pool_.submit(ticket, caller.uid, [this, job] {
      if (!job->verify.source.empty() && (job->err = compile_verify_build(job->verify, job->spec, job->fail))) return;
      job->err = load_policy(job->spec, job->loaded, job->fail);
    });
  } else {
    log(LogLevel::kDebug, "pid %d uid %u: deploy parked while %s compiles (ticket %llu)", caller.pid, caller.uid,
        d->job.display_name.c_str(), static_cast<unsigned long long>(ticket));
    compile_pool_.submit(ticket, caller.uid, std::move(d->job));
  }
  parked_.emplace(ticket, Parked{fd, caller, std::move(req), std::move(d)});
}

void Daemon::resume_parked() {
  std::vector<CompilePool::Done> dones = compile_pool_.take_done();
  for (auto& d : load_pool_.take_done()) dones.push_back(std::move(d));
  for (auto& done : dones) {
    if (auto w = config_warming_.find(done.ticket); w != config_warming_.end()) {
      if (done.result.err) config_warm_failed_[w->second] = std::move(done.result);
      config_warming_.erase(w);
      if (config_warming_.empty()) {
        apply_config();
        config_warm_failed_.clear();
        changed();
      }
      continue;
    }
    if (auto l = loads_.find(done.ticket); l != loads_.end()) {
      std::shared_ptr<LoadJob> job = std::move(l->second);
      loads_.erase(l);
      const std::string app = job->spec.app;
      if (--loading_apps_[app] <= 0) loading_apps_.erase(app);
      if (parked_.count(done.ticket)) resume(done.ticket);
      // Not taken by a deploy (it failed, timed out, or syrupd is stopping): undone.
      if (job->loaded) {
        log(LogLevel::kInfo, "undid the load of policy %d (%s) of app '%s': its deploy did not complete",
            job->spec.policy_id, job->spec.policy_name.c_str(), app.c_str());
        job->loaded->unpin();
        job->loaded.reset();
      }
      gc_app(app);
      continue;
    }
    auto it = parked_.find(done.ticket);
    if (it == parked_.end()) continue;
    it->second.deferred->result = std::move(done.result);
    resume(done.ticket);
  }
}

std::chrono::steady_clock::time_point Daemon::sweep_loads(std::chrono::steady_clock::time_point now) {
  auto next = std::chrono::steady_clock::time_point::max();
  std::vector<uint64_t> late;
  for (auto& [ticket, p] : parked_) {
    if (!p.deferred->load) continue;
    if (p.deferred->load_by <= now) late.push_back(ticket);
    else next = std::min(next, p.deferred->load_by);
  }
  for (uint64_t ticket : late) {
    auto it = parked_.find(ticket);
    Parked p = std::move(it->second);
    parked_.erase(it);
    const LoadSpec& spec = p.deferred->load->spec;
    log(LogLevel::kWarn, "pid %d uid %u: policy %d (%s) of app '%s' was not verified within %u s (--load_timeout_s): "
        "answered ETIMEDOUT; the load is undone when the kernel returns",
        p.caller.pid, p.caller.uid, spec.policy_id, spec.policy_name.c_str(), spec.app.c_str(), cfg_.load_timeout_s);
    Response resp{proto::error_response(ETIMEDOUT, "the kernel did not verify policy " + spec.policy_name + " within " +
                                                       std::to_string(cfg_.load_timeout_s) +
                                                       " s (syrupd --load_timeout_s); it was not deployed")};
    totals_.error("deploy", ETIMEDOUT);
    if (auto c = clients_.find(p.fd); c != clients_.end()) {
      c->second.parked = false;
      answer(p.fd, resp);
    }
  }
  return next;
}

std::string Daemon::ask_quota(uint64_t ticket, const LoadFootprint& fp) {
  auto a = std::make_shared<QuotaAsk>();
  a->ticket = ticket;
  a->fp = fp;
  std::future<std::string> answer = a->answer.get_future();
  {
    std::lock_guard lk(asks_mu_);
    if (asks_closed_) return "syrupd is shutting down; the policy was not deployed";
    asks_.push_back(a);
  }
  uint64_t one = 1;
  (void)!write(asks_fd_.get(), &one, sizeof one);
  // The main loop answers within a turn; a loop that does not (it is stopping) must not
  // keep a worker.
  if (answer.wait_for(std::chrono::seconds(2 * kFrameDeadlineSec)) != std::future_status::ready)
    return "syrupd did not check the application's quotas in time; the policy was not deployed; retry";
  return answer.get();
}

void Daemon::answer_quota_asks() {
  uint64_t n;
  while (read(asks_fd_.get(), &n, sizeof n) == sizeof n) {
  }
  std::vector<std::shared_ptr<QuotaAsk>> asks;
  {
    std::lock_guard lk(asks_mu_);
    asks.swap(asks_);
  }
  for (auto& a : asks) {
    std::string why;
    auto it = parked_.find(a->ticket);
    if (it == parked_.end()) {
      why = "the deploy was answered before its policy was verified; the policy was not deployed";
    } else if (const Deferred& d = *it->second.deferred; d.enforce_quotas) {
      auto old = d.replaces ? policies_.find(d.replaces) : policies_.end();
      why = check_quota(d.load->spec.app, old == policies_.end() ? nullptr : old->second.get(), a->fp);
    }
    a->answer.set_value(why);
  }
}

void Daemon::resume(uint64_t ticket) {
  auto it = parked_.find(ticket);
  Parked p = std::move(it->second);
  parked_.erase(it);
  resumed_ = std::move(p.deferred);
  may_park_ = true;  // for the load, after a compile
  Response resp = handle(p.caller, p.req, true);
  may_park_ = false;
  resumed_.reset();
  auto c = clients_.find(p.fd);
  if (c == clients_.end()) {
    if (resp.park && resp.park->load) gc_app(resp.park->load->spec.app);  // no load for nobody
    return;
  }
  c->second.parked = false;
  if (resp.park) return park(p.fd, p.caller, std::move(p.req), std::move(resp.park));
  answer(p.fd, resp);
}

void Daemon::serve_client(int fd) {
  auto it = clients_.find(fd);
  if (it == clients_.end()) return;
  Conn& conn = it->second;
  auto drop = [&] { drop_client(fd); };
  proto::Message req;
  std::string why;
  int r = conn.in.read(fd, req, &why);
  if (r == -EAGAIN) {
    // Part of a frame: the rest comes when it comes, by the frame's deadline.
    if (conn.in.in_frame() && !conn.timing) {
      conn.timing = true;
      conn.frame_by = std::chrono::steady_clock::now() + std::chrono::seconds(kFrameDeadlineSec);
    }
    return;
  }
  conn.timing = false;
  if (r == -ENODATA) return drop();
  if (r) {
    log(LogLevel::kWarn, "pid %d uid %u: bad request: %s", conn.pid, conn.uid,
        r == -EPROTO ? why.c_str() : std::strerror(-r));
    if (r != -EPROTO) return drop();
    // The stream cannot be resynchronised: the error is sent, then the connection closed.
    conn.close_after = true;
    Response resp{proto::error_response(EPROTO, "bad request: " + why)};
    return answer(fd, resp);
  }
  conn.last = std::chrono::steady_clock::now();
  ucred cred{};
  socklen_t cl = sizeof cred;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) < 0) return drop();
  Caller caller{cred.pid, cred.uid, cred.gid};
  std::vector<gid_t> admin_gids = cfg_.admin_gids;
  gid_t cg;
  std::string gerr;
  if (!config_.admin_group.empty() && config::resolve_group(config_.admin_group, cg, gerr) == 0)
    admin_gids.push_back(cg);
  if (!admin_gids.empty()) {
    // Supplementary groups count too; SO_PEERCRED has only the primary one.
    std::ifstream st("/proc/" + std::to_string(cred.pid) + "/status");
    std::set<gid_t> groups = {cred.gid};
    for (std::string line; std::getline(st, line);)
      if (line.starts_with("Groups:")) {
        std::istringstream gs(line.substr(7));
        for (gid_t g; gs >> g;) groups.insert(g);
      }
    for (gid_t g : admin_gids) caller.in_admin_group |= groups.count(g) > 0;
  }

  // One request at a time per connection: nothing more is read until it is answered.
  watch(fd, conn, 0);
  may_park_ = true;
  Response resp = handle(caller, req);
  may_park_ = false;
  if (resp.park) return park(fd, caller, std::move(req), std::move(resp.park));
  answer(fd, resp);
}

Daemon::Response Daemon::handle(const Caller& caller, proto::Message& req, bool resumed) {
  Response r;
  try {
    r = dispatch(caller, req, resumed);
  } catch (const std::exception& e) {  // a request of the wrong shape never ends syrupd
    r = {proto::error_response(EINVAL, std::string("malformed request: ") + e.what())};
  }
  if (!r.park && !r.body.value("ok", false)) {
    const json& op = req.body.is_object() && req.body.contains("op") ? req.body["op"] : json();
    totals_.error(op.is_string() && std::ranges::count(kOps, op.get<std::string>()) ? op.get<std::string>() : "other",
                  r.body.value("errno", EIO));
  }
  return r;
}

Daemon::Response Daemon::dispatch(const Caller& caller, proto::Message& req, bool resumed) {
  const json& b = req.body;
  std::string op = b.contains("op") && b["op"].is_string() ? b["op"].get<std::string>() : "";
  log(LogLevel::kDebug, "pid %d uid %u: %s", caller.pid, caller.uid, op.c_str());
  if (!resumed && !admit_request(caller))
    return {proto::error_response(EAGAIN, "uid " + std::to_string(caller.uid) +
                                              " is over its limit of requests per second (" +
                                              std::to_string(rate_for(caller.uid)) + "); retry later")};
  try {
    if (op == "ping") return {ok({{"version", proto::kVersion}, {"pid", getpid()}})};
    // SO_PEERCRED gives pid 0 for a process neither in syrupd's pid namespace nor in one
    // below it: syrupd cannot find it in /proc, own policies by it, or check its threads
    // and sockets.
    if (caller.pid == 0)
      return {proto::error_response(ESRCH, "syrupd cannot see the calling process: syrupd runs in a pid namespace "
                                           "that does not contain the caller's; run syrupd in the host's pid "
                                           "namespace")};
    if (op == "deploy") return deploy(caller, req, !caller.admin());
    if (op == "remove") return remove(caller, b);
    if (op == "list") return list(caller);
    if (op == "stats") return stats(caller, b);
    if (op == "map_open") return map_open(caller, b);
    if (op == "map_dump") return map_dump(caller, b);
    if (op == "thread_tid") return thread_tid(caller, b);
  } catch (const json::exception& e) {
    return {proto::error_response(EINVAL, std::string("malformed request: ") + e.what())};
  }
  std::string known;
  for (const auto& k : kOps) known += std::string(known.empty() ? "" : ", ") + k;
  return {proto::error_response(EOPNOTSUPP, "unknown request '" + op + "' (known: " + known + ")")};
}

Daemon::Response Daemon::thread_tid(const Caller& caller, const json& req) {
  if (!req.contains("tid") || !req["tid"].is_number_integer() || req["tid"].get<int64_t>() <= 0 ||
      req["tid"].get<int64_t>() > INT32_MAX)
    return {proto::error_response(EINVAL, "thread_tid needs a positive tid")};
  pid_t tid = req["tid"].get<pid_t>();
  uint64_t ns = pid_namespace(caller.pid);
  bool same = ns != 0 && ns == pid_namespace(0);
  pid_t found = 0;
  if (!same)
    found = thread_by_own_number(caller.pid, tid);
  else if (access(("/proc/" + std::to_string(caller.pid) + "/task/" + std::to_string(tid)).c_str(), F_OK) == 0)
    found = tid;
  if (!found)
    return {proto::error_response(ESRCH, "thread " + std::to_string(tid) + " is not a thread of process " +
                                             std::to_string(caller.pid) + (same ? "" : " (as its pid namespace numbers them)"))};
  return {ok({{"tid", found}, {"same_pid_namespace", same}})};
}

std::string Daemon::may_use_app(const Caller& caller, const std::string& app) const {
  auto it = app_owner_.find(app);
  if (it == app_owner_.end() || caller.admin() || it->second == caller.uid) return {};
  // Whose it is stays unsaid: another user learns only that the name is taken.
  return "application name '" + app + "' is taken by another user; choose another name";
}

Daemon::Response Daemon::deploy(const Caller& caller, proto::Message& req, bool enforce_quotas) {
  // A resumed deploy makes every check again, with the compile its first run waited for.
  std::unique_ptr<Deferred> resumed = std::move(resumed_);
  const json& b = req.body;
  auto str = [&](const char* k) {
    return b.contains(k) && b[k].is_string() ? b[k].get<std::string>() : std::string();
  };
  std::string hook = str("hook"), app = str("app"), source = str("source");
  // libsyrup names the hook by its enum syr_hook value, syrupctl and --config by name.
  if (b.contains("hook_id")) {
    const HookSpec* s = b["hook_id"].is_number_integer() ? find_hook(b["hook_id"].get<int>()) : nullptr;
    if (!s)
      return {proto::error_response(EINVAL, "unknown hook " + names::printable(b["hook_id"].dump()) +
                                                " (known: " + hook_names() + ")")};
    hook = s->name;
  }
  std::string name, source_name;
  policy_names(b, name, source_name);

  Hook* hi = hook_named(hook);
  if (!hi)
    return {proto::error_response(EINVAL, "unknown hook '" + names::printable(hook) + "' (known: " + hook_names() + ")")};
  if (std::string why = names::check("application", app); !why.empty())
    return {proto::error_response(EINVAL, why)};
  // The names a policy is shown and logged by: text, but never a control character.
  for (auto [what, v] : {std::pair{"policy", &name}, std::pair{"source", &source_name}})
    if (std::string why = names::check(what, *v, names::Kind::kDisplay); !why.empty())
      return {proto::error_response(EINVAL, why)};
  if (source.empty()) return {proto::error_response(EINVAL, "the policy source is empty")};
  if (std::string why = names::source_size(source.size(), cfg_.max_source_bytes, "syrupd --max_source_bytes");
      !why.empty())
    return {proto::error_response(EFBIG, why)};
  if (source.find('\0') != std::string::npos)
    return {proto::error_response(EINVAL, "policy source contains NUL bytes: not C source text")};
  if (std::string why = may_use_app(caller, app); !why.empty())
    return {proto::error_response(EPERM, why)};

  std::map<std::string, uint64_t> params;
  if (b.contains("params")) {
    if (!b["params"].is_object()) return {proto::error_response(EINVAL, "params must be an object")};
    for (auto& [k, v] : b["params"].items()) {
      if (std::string why = names::check("parameter", k, names::Kind::kParam); !why.empty())
        return {proto::error_response(EINVAL, why)};
      if (k.starts_with(SYR_SYSTEM_PREFIX))
        return {proto::error_response(EINVAL, "parameter '" + k +
                                                  "' is reserved (names starting with syr_ belong to Syrup)")};
      // Whether the value fits the variable's declared type is the loader's check (ERANGE).
      if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<int64_t>() >= 0))
        return {proto::error_response(EINVAL, "parameter '" + k + "' must be an integer in 0.." +
                                                  std::to_string(UINT64_MAX) + ", got " +
                                                  v.dump(-1, ' ', true, json::error_handler_t::replace).substr(0, 40))};
      params[k] = v.get<uint64_t>();
    }
  }
  bool persist = b.value("persist", false);
  if (std::string why = config::persist_refusal(hook); persist && !why.empty())
    return {proto::error_response(EINVAL, "persist is not allowed for the " + hook +
                                              " hook: the policy ends with the process it schedules; " + why +
                                              ". Deploy it again from the new process, or list it in syrupd's "
                                              "--config, which follows the process")};

  // The integer fields every hook reads, checked once for type and range: a hook then
  // takes them as they are (4294976396 is refused, not read as port 9100). A hook's own
  // rule (socket-select's pid > 0, a port required) comes on top.
  {
    int64_t v;
    for (auto [k, lo, hi] : {std::tuple{"pid", int64_t{0}, names::kMaxPid}, {"port", int64_t{0}, names::kMaxPort}})
      if (b.contains(k) && !b[k].is_null())
        if (std::string why = names::integer(k, b[k], lo, hi, v); !why.empty())
          return {proto::error_response(EINVAL, why)};
  }
  for (const char* k : {"ifname", "protocol", "address"})
    if (b.contains(k) && !b[k].is_string())
      return {proto::error_response(EINVAL, std::string(k) + " must be a string")};
  if (b.contains("ifname"))
    if (std::string why = names::check("interface", b["ifname"].get<std::string>(), names::Kind::kInterface);
        !why.empty())
      return {proto::error_response(EINVAL, why)};

  // Whether this run may park, for its compile or its load, is known before the target
  // takes the request's descriptors: only then are they copied, for the resumed run.
  CompileJob job{source, source_name, hi->compile_define(), hi->wrapper()};
  // Tenants' policies only: an admin's are trusted as the admin is (docs/security.md).
  bool verify_build = hi->verify_wrapper() && enforce_quotas;
  CompileJob verify_job{source, source_name, hi->compile_define(), verify_build ? hi->verify_wrapper() : ""};
  LoadJob* loaded_job = resumed && resumed->load ? resumed->load.get() : nullptr;
  bool compile_parks = !resumed && may_park_ && !compiler_.cached(job);
  std::unique_ptr<Deferred> parking;
  if (may_park_ && !loaded_job) {
    parking = std::make_unique<Deferred>();
    for (auto& f : req.fds) {
      parking->fds.emplace_back(fcntl(f.get(), F_DUPFD_CLOEXEC, 0));
      if (!parking->fds.back()) return {proto::error_response(EMFILE, "syrupd is out of descriptors; retry later")};
    }
  }

  // A `pid` names a process as the caller numbers it. A caller in a pid namespace of its
  // own (a container) numbers processes otherwise than syrupd and the hooks do: its 1 is
  // not the machine's init. (A resumed run has the body this run translated.)
  if (!resumed && b.contains("pid") && b["pid"].is_number_integer() && b["pid"].get<int64_t>() > 0) {
    uint64_t ns = pid_namespace(caller.pid);
    if (ns != pid_namespace(0)) {
      pid_t theirs = b["pid"].get<pid_t>(), mine = ns ? process_by_own_number(ns, theirs) : 0;
      if (!mine)
        return {proto::error_response(ESRCH, "no process " + std::to_string(theirs) +
                                                 " in the caller's pid namespace")};
      req.body["pid"] = mine;
    }
  }

  // What the kernel took away since the loop last looked (an interface deleted a moment
  // ago) is not built on.
  if (hi->refresh()) follow_kernel();

  std::unique_ptr<Target> target;
  std::string err;
  pid_t owner = caller.pid;
  if (int r = hi->make_target(caller, req, target, owner, err)) return {proto::error_response(-r, err)};

  // A policy on this target that has ended goes first: one whose owner has exited but
  // whose exit event is still queued behind this request (a port the kernel already gave
  // to a new process is not held by a dead one), or whose attachment the kernel no longer
  // has (every socket of its group closed: a group on that address now is another one).
  std::vector<std::pair<int, std::string>> dead;
  for (auto& [id, p] : policies_)
    if (p->target->key() == target->key())
      if (std::string why = why_ended(*p); !why.empty()) dead.emplace_back(id, std::move(why));
  for (auto& [id, why] : dead) end_policy(id, why);

  // One policy per target: the same application replaces, another is refused.
  Policy* old = nullptr;
  for (auto& [id, p] : policies_) {
    if (p->target->key() != target->key()) continue;
    if (p->app != app)
      return {proto::error_response(EBUSY, target->key() + " is scheduled by " +
                                               (visible(caller, *p) ? "application '" + p->app + "' (policy " +
                                                                          std::to_string(id) + ")"
                                                                    : std::string("another user's application")))};
    old = p.get();
  }

  CompileResult cr;
  if (resumed) {
    cr = resumed->result;  // a copy: a load's resume reads it again
  } else if (compile_parks) {
    parking->job = std::move(job);
    parking->first_target = std::move(target);
    Response parked;
    parked.park = std::move(parking);
    return parked;
  } else {
    // Hashing the job for the lookup only while a reload's failures are kept.
    auto f = config_warm_failed_.empty() ? config_warm_failed_.end() : config_warm_failed_.find(compiler_.key(job));
    cr = f != config_warm_failed_.end() ? f->second : compiler_.compile(job);
  }
  if (cr.err) {
    std::string first;
    if (auto pos = cr.diagnostics.find("error:"); pos != std::string::npos) {
      size_t ls = cr.diagnostics.rfind('\n', pos);
      ls = ls == std::string::npos ? 0 : ls + 1;
      first = cr.diagnostics.substr(ls, cr.diagnostics.find('\n', pos) - ls);
    }
    return {proto::error_response(-cr.err,
                                  "policy " + name + " does not compile" +
                                      (first.empty() ? std::string() : ": " + first),
                                  cr.diagnostics)};
  }

  auto pol = std::make_unique<Policy>();
  // A resumed load keeps the id its pins were made under.
  pol->id = loaded_job ? loaded_job->spec.policy_id : next_id_++;
  pol->app = app;
  pol->hook = hook;
  pol->name = name;
  pol->uid = caller.uid;
  pol->params = params;
  pol->created = time(nullptr);
  if (!persist) {
    // Watched from now on, so an owner that exits mid-deploy is not missed.
    pol->owner_pid = owner;
    pol->owner_start = process_start_time(owner);
    pol->owner_pidfd.reset(static_cast<int>(syscall(SYS_pidfd_open, owner, 0)));
    if (!pol->owner_pidfd)
      return {proto::error_response(ESRCH, "process " + std::to_string(owner) +
                                               " exited before its policy was deployed")};
  }

  // Plan: load+pin -> install (executors, attach; atomically over a replaced policy) ->
  // register -> retire the replaced policy. A failure undoes earlier steps in reverse
  // order; the policy already deployed on the target keeps running.
  if (!app_owner_.count(app)) app_owner_[app] = caller.uid;
  auto undo_app = [&] { gc_app(app); };  // new map pins, and a new app entry
  LoadFailure lf;
  LoadSpec spec;
  spec.object_path = cr.object_path;
  spec.app = app;
  spec.policy_id = pol->id;
  spec.policy_name = name;
  spec.hook = hook;
  spec.num_executors = target->num_executors();
  spec.params = params;
  spec.system_maps = hi->system_maps();
  spec.allowed = hi->allowlist();
  if (enforce_quotas) spec.check_quota = [&](const LoadFootprint& fp) { return check_quota(app, old, fp); };
  // A resumed load installs on the target its load was prepared with (the maps it
  // shares, a slot it took); the target this run made has made every check again and
  // is dropped after the install (until then it and the earlier ones hold what they
  // share, an interface's root).
  std::unique_ptr<Target> checked;
  if (loaded_job) {
    if (loaded_job->err) {
      undo_app();
      return {proto::error_response(-loaded_job->err, loaded_job->fail.message, loaded_job->fail.log)};
    }
    // Loaded on a worker while other requests ran: the target and the policy it replaces
    // must be those the load was prepared for, and the quotas must still hold with what
    // registered meanwhile (its maps are pinned now, so they count as pinned).
    if ((old ? old->id : 0) != resumed->replaces || target->key() != resumed->first_target->key()) {
      undo_app();  // the resume undoes the load
      std::string was = resumed->replaces ? "policy " + std::to_string(resumed->replaces) : std::string("none");
      return {proto::error_response(EAGAIN, "policy " + name + " was not deployed: the policy it replaces on " +
                                                target->key() + " changed while it was verified (it was " + was +
                                                "); deploy again")};
    }
    checked = std::move(target);
    target = std::move(resumed->first_target);
  } else if (int r = target->prepare_load(spec, old ? old->target.get() : nullptr,
                                          old ? old->loaded.get() : nullptr)) {
    undo_app();
    return {proto::error_response(-r, "cannot prepare the replacement of policy " +
                                          std::to_string(old ? old->id : 0))};
  }
  if (loaded_job) {
    if (enforce_quotas) {
      LoadFootprint now;
      bpf_prog_info info{};
      uint32_t len = sizeof info;
      if (bpf_prog_get_info_by_fd(loaded_job->loaded->prog_fd(), &info, &len) == 0) now.insns = info.xlated_prog_len / 8;
      if (std::string why = check_quota(app, old, now); !why.empty()) {
        undo_app();
        return {proto::error_response(EDQUOT, why)};
      }
    }
    pol->loaded = std::move(loaded_job->loaded);
  } else if (parking) {
    // The verifier goes to a worker; this deploy runs again from the start with its load.
    auto lj = std::make_shared<LoadJob>();
    lj->spec = spec;
    lj->spec.check_quota = nullptr;  // set when parked: asked of the main loop
    for (auto& [m, fd] : lj->spec.reuse_maps) {
      lj->reuse_fds.emplace_back(fcntl(fd, F_DUPFD_CLOEXEC, 0));
      if (!lj->reuse_fds.back()) {
        undo_app();
        return {proto::error_response(EMFILE, "syrupd is out of descriptors; retry later")};
      }
      fd = lj->reuse_fds.back().get();
    }
    if (verify_build) lj->verify = verify_job;
    parking->load = std::move(lj);
    parking->result = std::move(cr);
    // The compile's first target too: dropped now, it would take a hook-wide root with
    // it (an XDP root no installed policy uses is detached) from under this run's.
    if (resumed) parking->held = std::move(resumed->first_target);
    parking->enforce_quotas = enforce_quotas;
    parking->replaces = old ? old->id : 0;
    parking->first_target = std::move(target);
    Response parked;
    parked.park = std::move(parking);
    return parked;
  } else if (int r = (verify_build ? compile_verify_build(verify_job, spec, lf) : 0)
                         ?: load_policy(spec, pol->loaded, lf)) {
    undo_app();
    return {proto::error_response(-r, lf.message, lf.log)};
  }
  if (int r = target->install(*pol->loaded, old ? old->target.get() : nullptr, err)) {
    pol->loaded->unpin();
    pol->loaded.reset();
    undo_app();
    return {proto::error_response(-r, err)};
  }
  pol->target = std::move(target);

  json resp = pol->target->describe();
  resp["id"] = pol->id;
  resp["target"] = pol->target->key();
  resp["executors"] = pol->target->num_executors();
  resp["cached"] = cr.cached;
  if (!cr.diagnostics.empty()) resp["warnings"] = cr.diagnostics;
  if (pol->owner_pidfd) {
    epoll_event ev{EPOLLIN, {.fd = pol->owner_pidfd.get()}};
    epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, pol->owner_pidfd.get(), &ev);
  }
  log(LogLevel::kInfo, "deployed policy %d (%s) for app '%s' on %s, %u executors%s", pol->id,
      name.c_str(), app.c_str(), pol->target->key().c_str(), pol->target->num_executors(),
      cr.cached ? " (cached object)" : "");
  int id = pol->id;
  record(*pol);
  policies_.emplace(id, std::move(pol));
  if (old) {
    resp["replaced"] = old->id;
    remove_policy(old->id, false, ("replaced by policy " + std::to_string(id)).c_str());
  }
  gc_app(app);
  totals_.deploys++;
  changed();
  return {ok(resp)};
}

uint64_t Daemon::rate_for(uid_t uid) const {
  // A tenant of the config file has its own rate; anyone else the daemon's default.
  for (auto& t : config_.tenants)
    if (t.uid == uid && t.effective.requests_per_second) return *t.effective.requests_per_second;
  return cfg_.quotas.requests_per_second;
}

bool Daemon::admit_request(const Caller& caller) {
  if (caller.admin()) return true;
  double rate = static_cast<double>(rate_for(caller.uid)), burst = rate;
  auto now = std::chrono::steady_clock::now();
  auto [it, fresh] = buckets_.try_emplace(caller.uid, Bucket{burst, now});
  Bucket& b = it->second;
  b.tokens = std::min(burst, b.tokens + rate * std::chrono::duration<double>(now - b.last).count());
  b.last = now;
  if (b.tokens < 1) return false;
  b.tokens -= 1;
  return true;
}

std::string Daemon::check_quota(const std::string& app, const Policy* replaced, const LoadFootprint& fp) const {
  config::Quotas cq = quotas_for(app);
  Quotas q{config::Quotas::limit(cq.policies), config::Quotas::limit(cq.maps),
           config::Quotas::limit(cq.map_bytes), config::Quotas::limit(cq.insns), 0};
  size_t policies = 0, insns = fp.insns;
  for (auto& [id, p] : policies_) {
    if (p->app != app || p.get() == replaced) continue;
    policies++;
    bpf_prog_info info{};
    uint32_t len = sizeof info;
    if (bpf_prog_get_info_by_fd(p->loaded->prog_fd(), &info, &len) == 0) insns += info.xlated_prog_len / 8;
  }
  MapUsage pinned = pinned_map_usage(app);
  size_t maps = fp.new_maps.size() + pinned.maps;
  uint64_t bytes = fp.new_map_bytes + pinned.bytes;
  const config::Tenant* tenant = config_.tenant(app);
  auto over = [&](const char* what, uint64_t have, uint64_t limit) {
    std::string flag = what == std::string("bytes of maps") ? "map_bytes" : what;
    std::string where = " (syrupd --quota_" + flag + ")";
    if (tenant) {
      auto src = tenant->quota_sources.find(flag);
      where = src == tenant->quota_sources.end()
                  ? " (tenant quota " + flag + " in " + config_.path + ")"
                  : " (" + src->second.key + " at " + config_.path + ":" + std::to_string(src->second.line) + ")";
    }
    return "application '" + app + "' would have " + std::to_string(have) + " " + what +
           "; its quota is " + std::to_string(limit) + where;
  };
  if (policies + 1 > q.policies) return over("policies", policies + 1, q.policies);
  if (maps > q.maps) return over("maps", maps, q.maps);
  if (bytes > q.map_bytes) return over("bytes of maps", bytes, q.map_bytes);
  if (insns > q.insns) return over("insns", insns, q.insns);

  // The same over every application of the uid that owns this one (the caller, or a
  // --config tenant's uid): per-application quotas alone let one user make 20
  // applications of 32 MiB of maps each. Root's applications are not bound.
  auto owner = app_owner_.find(app);
  if (owner == app_owner_.end() || owner->second == 0) return {};
  uid_t uid = owner->second;
  struct Limit {
    const char* key;   // the flag's suffix and the config key
    const char* what;  // in the message
    uint64_t limit;
    std::string where;
  };
  Limit lim[] = {{"uid_policies", "policies", cfg_.quotas.uid_policies, {}},
                 {"uid_maps", "maps", cfg_.quotas.uid_maps, {}},
                 {"uid_map_bytes", "bytes of maps", cfg_.quotas.uid_map_bytes, {}},
                 {"uid_insns", "insns", cfg_.quotas.uid_insns, {}}};
  for (auto& l : lim) l.where = std::string(" (syrupd --quota_") + l.key + ")";
  // A tenant of the file with this uid sets its own (the last one in the file that sets
  // it, as for requests_per_second).
  for (auto& t : config_.tenants) {
    if (t.uid != uid) continue;
    for (auto& l : lim) {
      auto v = std::string(l.key) == "uid_policies" ? t.effective.uid_policies
               : std::string(l.key) == "uid_maps"   ? t.effective.uid_maps
               : std::string(l.key) == "uid_map_bytes" ? t.effective.uid_map_bytes
                                                       : t.effective.uid_insns;
      if (!v) continue;
      l.limit = *v;
      auto src = t.quota_sources.find(l.key);
      l.where = src == t.quota_sources.end()
                    ? " (tenant quota " + std::string(l.key) + " in " + config_.path + ")"
                    : " (" + src->second.key + " at " + config_.path + ":" + std::to_string(src->second.line) + ")";
    }
  }
  uint64_t have[4] = {1, fp.new_maps.size(), fp.new_map_bytes, fp.insns};
  std::set<std::string> apps;
  for (auto& [a, u] : app_owner_)
    if (u == uid) apps.insert(a);
  for (auto& [id, p] : policies_) {
    if (!apps.count(p->app) || p.get() == replaced) continue;
    have[0]++;
    bpf_prog_info info{};
    uint32_t len = sizeof info;
    if (bpf_prog_get_info_by_fd(p->loaded->prog_fd(), &info, &len) == 0) have[3] += info.xlated_prog_len / 8;
  }
  for (auto& a : apps) {
    MapUsage u = a == app ? pinned : pinned_map_usage(a);
    have[1] += u.maps;
    have[2] += u.bytes;
  }
  for (size_t i = 0; i < 4; i++)
    if (lim[i].limit != config::kUnlimited && have[i] > lim[i].limit)
      return "uid " + std::to_string(uid) + " would have " + std::to_string(have[i]) + " " + lim[i].what +
             " over all its applications; its quota is " + std::to_string(lim[i].limit) + lim[i].where;
  return {};
}

void Daemon::remove_policy(int id, bool detach_hook, const char* why) {
  auto it = policies_.find(id);
  if (it == policies_.end()) return;
  Policy& p = *it->second;
  // A replaced policy's attachment now belongs to its successor: only a real removal
  // uninstalls.
  if (detach_hook && p.loaded) p.target->uninstall(*p.loaded);
  if (p.owner_pidfd) epoll_ctl(epoll_fd_.get(), EPOLL_CTL_DEL, p.owner_pidfd.get(), nullptr);
  if (p.loaded) p.loaded->unpin();
  std::string app = p.app;
  log(LogLevel::kInfo, "removed policy %d (%s) of app '%s': %s", id, p.name.c_str(), app.c_str(), why);
  remember_gone(id, Gone{p.uid, app, p.name, why});
  policies_.erase(it);
  gc_app(app);
  totals_.removals++;
  changed();
}

void Daemon::gc_app(const std::string& app) {
  // A worker is loading into the application's pins: collected once it is done.
  if (loading_apps_.count(app)) return;
  bool any = false;
  std::map<std::string, bool> used;
  for (auto& [id, p] : policies_) {
    if (p->app != app) continue;
    any = true;
    for (auto& m : p->loaded->user_maps) used[m] = true;
  }
  for (const auto& name : pins::app_map_names(app))
    if (!used.count(name)) unlink(pins::app_map(app, name).c_str());
  if (!any) {
    pins::remove_tree(pins::app_dir(app));
    app_owner_.erase(app);
  }
}

void Daemon::owner_exited(int pidfd) {
  // An event fetched in one batch with a request or news that ended its policy is stale,
  // and by the time it is handled its number may be a new policy's pidfd: only an exit
  // the pidfd still shows ends policies.
  if (!exited(pidfd)) return;
  std::vector<int> ids;
  for (auto& [id, p] : policies_)
    if (p->owner_pidfd.get() == pidfd) ids.push_back(id);
  for (int id : ids) end_policy(id, owner_exited_reason(*policies_[id]));
  if (ids.empty()) epoll_ctl(epoll_fd_.get(), EPOLL_CTL_DEL, pidfd, nullptr);
}

std::string Daemon::owner_exited_reason(const Policy& p) {
  return "owner process " + std::to_string(p.owner_pid) + " exited";
}

std::string Daemon::why_ended(const Policy& p) {
  return exited(p.owner_pidfd.get()) ? owner_exited_reason(p) : p.target->gone();
}

bool Daemon::some_end_unannounced() const {
  return std::any_of(policies_.begin(), policies_.end(),
                     [](const auto& e) { return e.second->target->ends_unannounced(); });
}

bool Daemon::remove_ended() {
  std::vector<std::pair<int, std::string>> gone;
  for (auto& [id, p] : policies_)
    if (std::string why = why_ended(*p); !why.empty()) gone.emplace_back(id, std::move(why));
  for (auto& [id, why] : gone) end_policy(id, why);
  return !gone.empty();
}

void Daemon::follow_kernel() {
  remove_ended();
  // What the others save may have changed with the kernel (an interface's new name). Rare
  // enough to serialise them all again.
  for (auto& [id, p] : policies_) record(*p);
  changed();
}

void Daemon::end_policy(int id, const std::string& why) {
  // A --config entry's policy comes back on its process's successor, its process's new
  // group, its interface made again.
  if (const std::string& entry = policies_[id]->config_identity; !entry.empty()) {
    if (config_waiting_.empty()) config_retry_at_ = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    config_waiting_.insert(entry);
  }
  remove_policy(id, true, why.c_str());
}

Hook* Daemon::hook_watching(int fd) const {
  for (auto& h : hooks_)
    if (h->event_fd() == fd) return h.get();
  return nullptr;
}

Daemon::Response Daemon::remove(const Caller& caller, const json& req) {
  if (!req.contains("id") || !req["id"].is_number_integer())
    return {proto::error_response(EINVAL, "remove needs a policy id")};
  int64_t v;
  if (std::string why = names::integer("id", req["id"], 1, INT32_MAX, v); !why.empty())
    return {proto::error_response(EINVAL, why)};
  int id = static_cast<int>(v);
  auto it = policies_.find(id);
  if (it == policies_.end() || !visible(caller, *it->second))
    return {proto::error_response(ENOENT, no_policy(caller, id))};
  remove_policy(id, true, ("removed by pid " + std::to_string(caller.pid)).c_str());
  return {ok({{"id", id}})};
}

void Daemon::changed() {
  save_state();
  publish_metrics();
}

void Daemon::record(Policy& p) {
  json saved = p.target->save();
  if (saved.is_null()) {
    p.state_json.clear();
    return;
  }
  p.state_json = state_entry(json{{"id", p.id},
                      {"app", p.app},
                      {"hook", p.hook},
                      {"name", p.name},
                      {"uid", p.uid},
                      {"owner_pid", p.owner_pid},
                      {"owner_start", p.owner_start},
                      {"params", p.params},
                      {"created", p.created},
                      {"config_identity", p.config_identity},
                      {"config_hash", p.config_hash},
                      {"user_maps", p.loaded->user_maps},
                      {"system_maps", p.loaded->system_maps},
                      {"target", saved}});
}

void Daemon::publish_metrics() {
  if (!cfg_.metrics_port) return;
  metrics::Snapshot s;
  s.start_time_unix = static_cast<double>(start_time_);
  s.totals = totals_;
  s.compiles = compile_pool_.stats();
  s.compiles.cache_bytes = compiler_.cache_bytes();
  s.compiles.cache_max_bytes = compiler_.config().cache_max_bytes;
  s.compiles.cache_evictions = compiler_.cache_evictions();
  s.connections = {.max_others = cfg_.max_clients, .max_per_user = cfg_.max_clients_per_uid};
  for (auto& [fd, c] : clients_) s.connections.by_uid[c.uid]++;
  s.per_tenant = cfg_.metrics_per_tenant;
  if (!s.per_tenant) {
    metrics_.publish(std::move(s));
    return;
  }
  std::map<std::string, metrics::TenantSample> tenants;
  for (auto& [id, p] : policies_) {
    s.policies.push_back(metrics::policy_sample(policy_stats(*p), p->hook, p->target->key()));
    auto& t = tenants[p->app];
    t.tenant = p->app;
    t.policies++;
  }
  for (auto& [app, t] : tenants) {
    MapUsage pinned = pinned_map_usage(app);
    t.maps = pinned.maps;
    t.map_bytes = pinned.bytes;
    t.quotas = quotas_for(app).limits();
    s.tenants.push_back(t);
  }
  metrics_.publish(std::move(s));
}

config::Quotas Daemon::quotas_for(const std::string& app) const {
  if (const config::Tenant* t = config_.tenant(app)) return t->effective;
  config::Quotas q;
  q.policies = cfg_.quotas.policies;
  q.maps = cfg_.quotas.maps;
  q.map_bytes = cfg_.quotas.map_bytes;
  q.insns = cfg_.quotas.insns;
  q.source_bytes = cfg_.max_source_bytes;
  q.requests_per_second = cfg_.quotas.requests_per_second;
  return q;
}

void Daemon::reload_config() {
  config::Config next;
  std::vector<config::Diagnostic> errs;
  config::LoadOptions lo;
  lo.max_source_bytes = cfg_.max_source_bytes;
  if (config::load(cfg_.config_path, next, errs, lo)) {
    for (auto& d : errs) log(LogLevel::kError, "%s", d.str().c_str());
    log(LogLevel::kError, "SIGHUP: %s has errors; the running configuration stays", cfg_.config_path.c_str());
    totals_.config_reloads++;
    totals_.config_reload_failures++;
    changed();
    return;
  }
  config_ = std::move(next);
  warm_config();
}

Hook* Daemon::hook_named(const std::string& name) const {
  for (auto& h : hooks_)
    if (h->name() == name) return h.get();
  return nullptr;
}

std::vector<config::Applied> Daemon::config_applied() const {
  std::vector<config::Applied> current;
  for (auto& [id, p] : policies_)
    if (!p->config_identity.empty()) current.push_back({p->config_identity, p->config_hash, id});
  return current;
}

void Daemon::warm_config() {
  config_warming_.clear();  // a reload during another's compiles starts over
  config_warm_failed_.clear();
  for (auto& d : config::plan(config_, config_applied()).to_deploy) {
    const json& b = d.entry.request;
    Hook* h = b.contains("hook") && b["hook"].is_string() ? hook_named(b["hook"].get<std::string>()) : nullptr;
    if (!h || !b.contains("source") || !b["source"].is_string()) continue;
    std::string name, source_name;
    policy_names(b, name, source_name);
    CompileJob job{b["source"].get<std::string>(), source_name, h->compile_define(), h->wrapper()};
    if (compiler_.cached(job)) continue;
    uint64_t ticket = next_ticket_++;
    config_warming_.emplace(ticket, compiler_.key(job));
    compile_pool_.submit(ticket, d.entry.uid, std::move(job));
  }
  if (config_warming_.empty()) {
    apply_config();
    changed();
    return;
  }
  log(LogLevel::kInfo, "SIGHUP: compiling %zu policies of %s before applying it", config_warming_.size(),
      cfg_.config_path.c_str());
}

void Daemon::apply_config(bool retry) {
  config::Plan plan = config::plan(config_, config_applied());
  if (retry) {
    // Only what waits for its process or interface; the rest of the plan is the next reload's.
    std::erase_if(plan.to_deploy, [&](const config::PlannedDeploy& d) { return !config_waiting_.count(d.entry.identity); });
    plan.to_remove.clear();
    std::set<std::string> planned;
    for (auto& d : plan.to_deploy) planned.insert(d.entry.identity);
    std::erase_if(config_waiting_, [&](const std::string& id) { return !planned.count(id); });
  } else {
    config_waiting_.clear();
    config_retry_at_ = std::chrono::steady_clock::now() + std::chrono::seconds(kConfigRetrySec);
  }
  for (auto& a : plan.to_remove) remove_policy(a.policy_id, true, ("no longer in " + cfg_.config_path).c_str());
  int failed = 0, deployed = 0;
  for (auto& d : plan.to_deploy) {
    const config::PolicyEntry& e = d.entry;
    std::string where = config_.path + ":" + std::to_string(e.line) + ": " + e.where;
    bool was_waiting = retry && config_waiting_.count(e.identity);
    // A failure that may pass by itself -- no such process yet, or no such interface
    // (ENODEV from the deploy) -- waits: retried every kConfigRetrySec, logged once. Any
    // other waits for the next reload.
    auto fail = [&](int r, bool waits, const std::string& why) {
      bool again = was_waiting && waits;
      log(again ? LogLevel::kDebug : LogLevel::kError, "%s: %s%s", where.c_str(), why.c_str(),
          waits && !again ? " (retried every 5 s)" : "");
      if (waits) config_waiting_.insert(e.identity);
      else config_waiting_.erase(e.identity);
      if (!again) totals_.error("config", r);
      failed++;
    };
    proto::Message msg;
    std::string err;
    if (int r = config::make_request(e, msg.body, err)) {
      fail(r, r == -ESRCH || r == -ENOENT, err);
      continue;
    }
    // Deployed for the tenant (its uid owns the application), with an operator's rights:
    // the operator who wrote the file may name any port or process. The tenant's quotas
    // still apply: an operator who writes a quota for a tenant means all of its policies,
    // those the file declares included (otherwise a typo in the file could deploy a map
    // of gigabytes that the tenant's own deploys could never get).
    Caller as{getpid(), e.uid, e.uid, true};
    Response resp = deploy(as, msg, true);
    if (!resp.body.value("ok", false)) {
      int r = resp.body.value("errno", EIO);
      fail(r, r == ENODEV,
           resp.body.value("error", std::string()) +
               (resp.body.contains("log") ? "\n" + resp.body["log"].get<std::string>() : std::string()));
      continue;
    }
    config_waiting_.erase(e.identity);
    int id = resp.body["id"];
    deployed++;
    policies_[id]->config_identity = e.identity;
    policies_[id]->config_hash = e.hash;
    record(*policies_[id]);
    if (d.replaces && resp.body.value("replaced", 0) != d.replaces)
      remove_policy(d.replaces, true, ("replaced by " + e.identity).c_str());
  }
  if (retry) {
    if (deployed) {
      log(LogLevel::kInfo, "retried %s entries waiting for their process or interface: %d deployed, %zu still waiting",
          cfg_.config_path.c_str(), deployed, config_waiting_.size());
      changed();
    }
    return;
  }
  totals_.config_reloads++;
  if (failed) totals_.config_reload_failures++;
  else totals_.config_last_success_unix = static_cast<double>(time(nullptr));
  log(LogLevel::kInfo, "applied %s: %zu deployed, %zu removed, %zu unchanged, %d failed", cfg_.config_path.c_str(),
      plan.to_deploy.size() - failed, plan.to_remove.size(), plan.unchanged.size(), failed);
}

void Daemon::remember_gone(int id, Gone g) {
  g.state_json = state_entry(json{{"id", id}, {"uid", g.uid}, {"app", g.app}, {"name", g.name}, {"why", g.why}});
  gone_[id] = std::move(g);
  if (gone_.size() > kGoneKept) gone_.erase(gone_.begin());
}

void Daemon::save_state() {
  // Written after every change, synchronously, so a crash right after a deploy loses
  // nothing; each policy's entry is serialised once (record()), which keeps a write
  // cheap with thousands of policies.
  json apps = json::object();
  for (auto& [a, uid] : app_owner_) apps[a] = uid;
  json head = {{"version", 1}, {"bpffs_root", pins::root()}, {"next_id", next_id_}, {"apps", apps}};
  std::string text = state_entry(head);
  text.pop_back();  // the closing brace: the policies follow
  text += ",\"policies\":[";
  bool first = true;
  for (auto& [id, p] : policies_) {
    if (p->state_json.empty()) continue;
    if (!first) text += ",\n";
    first = false;
    text += p->state_json;
  }
  text += "],\n\"gone\":[";
  first = true;
  for (auto& [id, g] : gone_) {
    if (!first) text += ",\n";
    first = false;
    text += g.state_json;
  }
  text += "]}\n";
  // It lists every tenant's policies and parameters: created 0600 (a leftover temporary,
  // maybe of an older syrupd's mode, is replaced, not reused).
  std::string tmp = cfg_.state_file + ".tmp";
  unlink(tmp.c_str());
  {
    UniqueFd out(open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
    size_t done = 0;
    while (out && done < text.size()) {
      ssize_t n = write(out.get(), text.data() + done, text.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      done += static_cast<size_t>(n);
    }
    if (!out || done < text.size()) {
      log(LogLevel::kWarn, "cannot write the state file %s: %s", tmp.c_str(), std::strerror(errno));
      unlink(tmp.c_str());
      return;
    }
  }
  if (rename(tmp.c_str(), cfg_.state_file.c_str()) < 0)
    log(LogLevel::kWarn, "cannot replace the state file %s: %s", cfg_.state_file.c_str(), std::strerror(errno));
}

void Daemon::adopt_state() {
  // The file is syrupd's own, but it outlives the binary that wrote it and can be edited
  // by hand: a field of the wrong type costs its entry (whose pins the caller then
  // releases as leftovers), never the start.
  std::ifstream in(cfg_.state_file);
  if (!in) return;
  json state = json::parse(in, nullptr, false);
  auto field = [](const json& o, const char* k, json::value_t t) {
    return o.is_object() && o.contains(k) && o[k].type() == t;
  };
  if (!state.is_object() || state.value("version", json()) != 1 ||
      state.value("bpffs_root", json()) != pins::root()) {
    log(LogLevel::kWarn, "ignoring the state file %s (unreadable or for another pin root)", cfg_.state_file.c_str());
    return;
  }
  if (state.contains("next_id") && state["next_id"].is_number_integer())
    next_id_ = std::max<int64_t>(next_id_, std::min<int64_t>(state["next_id"].get<int64_t>(), INT32_MAX));
  const json no_apps = json::object();
  const json& apps = field(state, "apps", json::value_t::object) ? state["apps"] : no_apps;
  int skipped = 0;
  if (field(state, "gone", json::value_t::array))
    for (auto& g : state["gone"]) try {
        if (g.value("id", 0) > 0)
          remember_gone(g.value("id", 0), Gone{g.value("uid", 0u), g.value("app", std::string()),
                                               g.value("name", std::string()), g.value("why", std::string())});
      } catch (const json::exception&) {
        skipped++;
      }
  int adopted = 0, entry = 0;
  const json no_policies = json::array();
  for (auto& s : field(state, "policies", json::value_t::array) ? state["policies"] : no_policies) {
    auto pol = std::make_unique<Policy>();
    std::string err;
    int r = 0;
    const char* reading = "";   // the field being read, for the error
    std::string malformed;      // what was wrong with the entry
    auto get = [&](const char* k, auto fallback) {
      reading = k;
      return s.value(k, fallback);
    };
    entry++;
    try {
      if (!s.is_object()) throw std::invalid_argument("not a JSON object");
      pol->id = get("id", 0);
      pol->app = get("app", std::string());
      pol->hook = get("hook", std::string());
      pol->name = get("name", std::string());
      pol->uid = get("uid", 0u);
      pol->owner_pid = get("owner_pid", 0);
      pol->owner_start = get("owner_start", uint64_t{0});
      pol->params = get("params", std::map<std::string, uint64_t>{});
      pol->created = get("created", time_t{0});
      pol->config_identity = get("config_identity", std::string());
      pol->config_hash = get("config_hash", std::string());
      auto user_maps = get("user_maps", std::vector<std::string>{});
      auto system_maps = get("system_maps", std::vector<std::string>{});
      Hook* hook = hook_named(pol->hook);
      if (pol->id <= 0) r = -EINVAL, err = "its entry in the state file has no policy id";
      else if (policies_.count(pol->id)) r = -EEXIST, err = "an earlier entry of the state file has its id";
      else if (!hook) r = -EOPNOTSUPP, err = "unknown hook '" + pol->hook + "'";
      if (!r) r = adopt_policy(pol->app, pol->id, user_maps, system_maps, pol->loaded, err);
      reading = "target";
      if (!r) r = hook->adopt(get("target", json::object()), *pol->loaded, pol->target, err);
      reading = "apps";
      if (!r) app_owner_[pol->app] = apps.value(pol->app, pol->uid);
    } catch (const std::exception& e) {  // json's type errors; not an object
      malformed = e.what();  // "[json.exception.type_error.302] type must be ..."
      if (auto b = malformed.find("] "); b != std::string::npos) malformed.erase(0, b + 2);
      if (*reading) malformed = reading + (": " + malformed);
      r = -EINVAL;
      err = "its entry in the state file is malformed (" + malformed + ")";
    }
    if (r) {
      if (pol->id > 0) {
        log(LogLevel::kWarn, "cannot adopt policy %d (%s) of app '%s': %s", pol->id, pol->name.c_str(),
            pol->app.c_str(), err.c_str());
        if (r != -EEXIST)  // the policy of that id was adopted
          remember_gone(pol->id, Gone{pol->uid, pol->app, pol->name, "not adopted when syrupd restarted: " + err});
      } else {
        log(LogLevel::kWarn, "cannot adopt entry %d of the state file's policies: %s", entry,
            malformed.empty() ? err.c_str() : ("it is malformed (" + malformed + ")").c_str());
      }
      continue;
    }
    next_id_ = std::max(next_id_, pol->id + 1);  // ids are never reused, even if next_id was lost
    if (pol->owner_pid) {
      pol->owner_pidfd.reset(static_cast<int>(syscall(SYS_pidfd_open, pol->owner_pid, 0)));
      // The same process, not a new one that reused its pid.
      if (pol->owner_pidfd && process_start_time(pol->owner_pid) != pol->owner_start) pol->owner_pidfd.reset();
    }
    record(*pol);
    int id = pol->id;
    bool owner_gone = pol->owner_pid && !pol->owner_pidfd;
    policies_.emplace(id, std::move(pol));
    adopted++;
    if (owner_gone) remove_policy(id, true, "its owner exited while syrupd was down");
  }
  if (!gone_.empty()) next_id_ = std::max(next_id_, gone_.rbegin()->first + 1);
  if (skipped)
    log(LogLevel::kWarn, "skipped %d malformed entries of removed policies in the state file %s", skipped,
        cfg_.state_file.c_str());
  log(LogLevel::kInfo, "adopted %d policies of the previous syrupd from %s", adopted, cfg_.state_file.c_str());
}

json Daemon::describe(const Policy& p) const {
  bpf_prog_info info{};
  uint32_t len = sizeof info;
  bpf_prog_get_info_by_fd(p.loaded->prog_fd(), &info, &len);
  json j = p.target->describe();
  j.update(json{{"id", p.id},
          {"app", p.app},
          {"hook", p.hook},
          {"name", p.name},
          {"uid", p.uid},
          {"owner_pid", p.owner_pid},
          {"persist", p.owner_pid == 0},
          {"target", p.target->key()},
          {"executors", p.target->num_executors()},
          {"params", p.params},
          {"prog_id", info.id},
          {"created", p.created},
          {"pin", pins::policy_dir(p.app, p.id)}});
  return j;
}

std::string Daemon::no_policy(const Caller& caller, int id) const {
  std::string text = "no policy " + std::to_string(id);
  auto it = gone_.find(id);
  if (it == gone_.end() || (!caller.admin() && it->second.uid != caller.uid)) return text;
  const Gone& g = it->second;
  return text + " (" + g.name + " of app '" + g.app + "' was removed: " + g.why + ")";
}

bool Daemon::visible(const Caller& caller, const Policy& p) const {
  return caller.admin() || p.uid == caller.uid || may_use_app(caller, p.app).empty();
}

Daemon::Response Daemon::list(const Caller& caller) {
  json arr = json::array();
  for (auto& [id, p] : policies_)
    if (visible(caller, *p)) arr.push_back(describe(*p));
  return {ok({{"policies", arr}})};
}

json Daemon::policy_stats(const Policy& p) const {
  int fd = p.loaded->map_fd(SYR_STATS_MAP);
  int ncpu = libbpf_num_possible_cpus();
  std::vector<uint64_t> vals(static_cast<size_t>(ncpu > 0 ? ncpu : 1));
  auto slot = [&](uint32_t k) {
    uint64_t sum = 0;
    if (bpf_map_lookup_elem(fd, &k, vals.data()) == 0)
      for (auto v : vals) sum += v;
    return sum;
  };
  json execs = json::array();
  uint64_t total = 0;
  for (uint32_t i = 0; i < p.target->num_executors(); i++) {
    uint64_t v = slot(SYR_STAT_EXECUTOR_BASE + i);
    execs.push_back(v);
    total += v;
  }
  uint64_t pass = slot(SYR_STAT_PASS), drop = slot(SYR_STAT_DROP), fb = slot(SYR_STAT_FALLBACK);
  bpf_prog_info info{};
  uint32_t len = sizeof info;
  bpf_prog_get_info_by_fd(p.loaded->prog_fd(), &info, &len);
  json st = {{"id", p.id},           {"app", p.app},      {"name", p.name},     {"hook", p.hook},
             {"executors", execs},   {"pass", pass},      {"drop", drop},
             {"fallback", fb},       {"decisions", total + pass + drop + fb},
             {"run_cnt", info.run_cnt}, {"run_time_ns", info.run_time_ns}};
  // What `list` shows of the executors' state: a hook's health (a thread policy the kernel
  // ejected, a socket-select group that ended) and the socket-select executors still open.
  json d = p.target->describe();
  for (const char* k : {"status", "open_executors"})
    if (d.is_object() && d.contains(k)) st[k] = d[k];
  return st;
}

Daemon::Response Daemon::stats(const Caller& caller, const json& req) {
  json arr = json::array();
  if (req.contains("id") && !req["id"].is_null()) {
    int64_t v;
    if (std::string why = names::integer("id", req["id"], 1, INT32_MAX, v); !why.empty())
      return {proto::error_response(EINVAL, why)};
    int id = static_cast<int>(v);
    auto it = policies_.find(id);
    if (it == policies_.end() || !visible(caller, *it->second))
      return {proto::error_response(ENOENT, no_policy(caller, id))};
    arr.push_back(policy_stats(*it->second));
  } else {
    for (auto& [id, p] : policies_)
      if (visible(caller, *p)) arr.push_back(policy_stats(*p));
  }
  return {ok({{"stats", arr}})};
}

// The map `req` names ("app", "map"), opened for `caller`: its fd and info, or the error
// to answer (bad names, no such application or map). Another user's application is
// answered as one that does not exist. The pin is opened following no link (pins::obj_get)
// and must be the very map (by id) a deployed policy of the application holds.
std::optional<Daemon::Response> Daemon::open_app_map(const Caller& caller, const json& req, AppMap& out) {
  out.app = req.value("app", std::string());
  out.map = req.value("map", std::string());
  for (auto [kind, v] : {std::pair{"application", &out.app}, std::pair{"map", &out.map}})
    if (std::string why = names::check(kind, *v); !why.empty())
      return Response{proto::error_response(EINVAL, why)};
  if (!app_owner_.count(out.app) || !may_use_app(caller, out.app).empty())
    return Response{proto::error_response(ENOENT, "no application '" + out.app + "' (it has no deployed policy)")};
  uint32_t expected = 0;
  for (auto& [id, p] : policies_) {
    if (p->app != out.app || !p->loaded) continue;
    auto& um = p->loaded->user_maps;
    if (std::find(um.begin(), um.end(), out.map) == um.end()) continue;
    bpf_map_info held{};
    uint32_t hl = sizeof held;
    // A map libbpf took over from its pin carries the kernel's name, its first 15 characters.
    int fd = p->loaded->map_fd(out.map.c_str());
    if (fd < 0) fd = p->loaded->map_fd(out.map.substr(0, BPF_OBJ_NAME_LEN - 1).c_str());
    if (fd >= 0 && bpf_map_get_info_by_fd(fd, &held, &hl) == 0) expected = held.id;
    break;
  }
  if (expected) {
    out.fd.reset(pins::obj_get(pins::app_map(out.app, out.map)));
    uint32_t len = sizeof out.info;
    if (out.fd && (bpf_map_get_info_by_fd(out.fd.get(), &out.info, &len) != 0 || out.info.id != expected)) {
      log(LogLevel::kWarn, "pin %s is map id %u, not the application's map id %u: not handed out",
          pins::app_map(out.app, out.map).c_str(), out.info.id, expected);
      out.fd.reset();
    }
  }
  if (!out.fd) {
    // Name the maps it has: a user guessing a map's name needs them.
    std::vector<std::string> names = pins::app_map_names(out.app);
    std::string has = names.empty() ? "it has none" : "it has " + join(names);
    return Response{proto::error_response(ENOENT, "application '" + out.app + "' has no map '" + out.map + "' (" +
                                                      has + "; maps exist while a deployed policy declares them)")};
  }
  return std::nullopt;
}

Daemon::Response Daemon::map_open(const Caller& caller, const json& req) {
  AppMap m;
  if (auto err = open_app_map(caller, req, m)) return std::move(*err);
  const bpf_map_info& info = m.info;
  Response r{ok({{"map", m.map},
                 {"type", libbpf_bpf_map_type_str(static_cast<bpf_map_type>(info.type))},
                 {"key_size", info.key_size},
                 {"value_size", info.value_size},
                 {"max_entries", info.max_entries},
                 {"flags", info.map_flags}})};
  r.fds.push_back(m.fd.get());
  r.owned_fds.push_back(std::move(m.fd));
  return r;
}

Daemon::Response Daemon::map_dump(const Caller& caller, const json& req) {
  // One page per request: at most kDumpPageEntries entries and about kDumpPageBytes of
  // answer, so that a dump of any size costs syrupd bounded memory and main-loop time per
  // request; the answer's "cursor" continues it (docs/protocol.md, map_dump).
  // 1024 entries of 4-byte keys and 8-byte values: about 3 ms of main loop.
  constexpr size_t kDumpPageEntries = 1024, kDumpPageBytes = 256 << 10;
  int64_t limit = 4096;
  if (req.contains("limit"))
    if (std::string why = names::integer("limit", req["limit"], 0, INT32_MAX, limit); !why.empty())
      return {proto::error_response(EINVAL, why)};
  AppMap m;
  if (auto err = open_app_map(caller, req, m)) return std::move(*err);
  const bpf_map_info& info = m.info;
  const UniqueFd& fd = m.fd;
  const std::string &app = m.app, &map = m.map;
  bool percpu = info.type == BPF_MAP_TYPE_PERCPU_ARRAY || info.type == BPF_MAP_TYPE_PERCPU_HASH ||
                info.type == BPF_MAP_TYPE_LRU_PERCPU_HASH;
  size_t ncpu = percpu ? static_cast<size_t>(libbpf_num_possible_cpus()) : 1;
  size_t vstride = percpu ? (info.value_size + 7) / 8 * 8 : info.value_size;
  std::vector<unsigned char> key(info.key_size), next(info.key_size), val(vstride * ncpu);
  bool first = true;
  if (req.contains("cursor") && !req["cursor"].is_null()) {
    // The last key of the previous page, as that page's "cursor" gave it.
    std::string c = req["cursor"].is_string() ? req["cursor"].get<std::string>() : std::string();
    std::erase(c, ' ');
    bool good = c.size() == 2 * key.size() && std::all_of(c.begin(), c.end(), ::isxdigit);
    for (size_t i = 0; good && i < key.size(); i++) key[i] = static_cast<unsigned char>(std::stoi(c.substr(2 * i, 2), nullptr, 16));
    if (!good)
      return {proto::error_response(EINVAL, "map_dump: cursor must be a key of map '" + map + "' (" +
                                                std::to_string(key.size()) + " bytes in hex), as a page's cursor gives it")};
    first = false;
  }
  size_t page = static_cast<size_t>(std::min<uint64_t>(static_cast<uint64_t>(limit), kDumpPageEntries));
  size_t entry_bytes = 3 * key.size() + 3 * info.value_size * ncpu + 64, bytes = 0;
  json entries = json::array();
  bool more = false;
  while (bpf_map_get_next_key(fd.get(), first ? nullptr : key.data(), next.data()) == 0) {
    if (entries.size() >= page || bytes >= kDumpPageBytes) {
      more = true;
      break;
    }
    first = false;
    key = next;
    if (bpf_map_lookup_elem(fd.get(), key.data(), val.data()) != 0) continue;
    json e = {{"key", hex(key.data(), key.size())}};
    if (auto k = as_number(key.data(), key.size()); !k.is_null()) e["key_int"] = k;
    if (percpu) {
      json per = json::array();
      for (size_t c = 0; c < ncpu; c++) per.push_back(hex(&val[c * vstride], info.value_size));
      e["values"] = per;
    } else {
      e["value"] = hex(val.data(), val.size());
      if (auto v = as_number(val.data(), val.size()); !v.is_null()) e["value_int"] = v;
    }
    entries.push_back(e);
    bytes += entry_bytes;
  }
  json resp = {{"app", app},
               {"map", map},
               {"type", libbpf_bpf_map_type_str(static_cast<bpf_map_type>(info.type))},
               {"entries", entries},
               {"truncated", more}};
  // More entries follow, and the caller asked for more than this page: where to go on.
  if (more && entries.size() < static_cast<size_t>(limit)) resp["cursor"] = hex(key.data(), key.size());
  return {ok(resp)};
}

}  // namespace syrup
