#include "daemon.h"
#include "daemon_util.h"
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
#include "syrup/recording.h"

namespace syrup {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

int ensure_bpffs() {
  struct statfs sf;
  if (statfs("/sys/fs/bpf", &sf) == 0 && sf.f_type == BPF_FS_MAGIC) return 0;
  if (mount("bpf", "/sys/fs/bpf", "bpf", 0, "mode=0755") < 0) return -errno;
  log(LogLevel::kInfo, "mounted bpffs at /sys/fs/bpf");
  return 0;
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
  if ((r = init_fault_injection())) return r;
  hooks_ = make_hooks({compiler_, cfg_.agent_cpus});

  std::string err;
  using Clock = std::chrono::steady_clock;
  auto t0 = Clock::now();
  if ((r = take_lock()) || (r = adopt_previous())) return r;
  auto t1 = Clock::now();
  if ((r = compiler_.init(cfg_.compiler, err))) {
    log(LogLevel::kError, "%s", err.c_str());
    return r;
  }
  if ((r = listen_control()) || (r = start_loop()) || (r = start_metrics())) return r;
  if ((r = load_config_at_start())) return r;
  auto t2 = Clock::now();
  changed();
  auto ms = [](Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); };
  log(LogLevel::kInfo, "serving on %s, pins under %s (start: %.0f ms adopting, %.0f ms to listen, %.0f ms writing the state)",
      cfg_.socket_path.c_str(), pins::root().c_str(), ms(t1 - t0), ms(t2 - t1), ms(Clock::now() - t2));
  return 0;
}

// SYRUP_FAULT_STEP (deploy_txn.h): read in a build with SYRUP_FAULT_INJECTION, else
// ignored with a warning. 0 or -EINVAL.
int Daemon::init_fault_injection() {
  const char* fault = getenv("SYRUP_FAULT_STEP");
  if (!fault) return 0;
  std::string err;
  if (!DeployTxn::fault_injection_built()) {
    log(LogLevel::kWarn, "SYRUP_FAULT_STEP is ignored: this syrupd is built without SYRUP_FAULT_INJECTION");
  } else if (int r = DeployTxn::set_fault(fault, err)) {
    log(LogLevel::kError, "%s", err.c_str());
    return r;
  } else {
    log(LogLevel::kWarn, "fault injection: deploy step %s fails (SYRUP_FAULT_STEP)", fault);
  }
  return 0;
}

// --config at start: a bad file is fatal (the operator is there to see it); on SIGHUP the
// running configuration stays (reload_config). 0 or -EINVAL.
int Daemon::load_config_at_start() {
  if (cfg_.config_path.empty()) return 0;
  // Watched before it is read: a change from now on is applied after this version.
  if (cfg_.config_watch) {
    std::string err;
    if (int r = config_watch_.start(cfg_.config_path, err)) {
      log(LogLevel::kError, "--config_watch: %s", err.c_str());
      return r;
    }
    epoll_event ev{EPOLLIN, {.fd = config_watch_.fd()}};
    epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, config_watch_.fd(), &ev);
  }
  config_generation_++;
  std::vector<config::Diagnostic> errs;
  config::LoadOptions lo;
  lo.max_source_bytes = cfg_.max_source_bytes;
  if (config::load(cfg_.config_path, config_, errs, lo)) {
    for (auto& d : errs) log(LogLevel::kError, "%s", d.str().c_str());
    return -EINVAL;
  }
  apply_config();
  return 0;
}

// One daemon per control socket: the lock is held for the daemon's lifetime. 0 or -errno.
int Daemon::take_lock() {
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
  return 0;
}

// What a previous syrupd left: the pin tree repaired, its policies adopted, the rest
// released. 0 or -errno.
int Daemon::adopt_previous() {
  int r = 0;
  using Clock = std::chrono::steady_clock;
  auto t0 = Clock::now();
  // A tree an older syrupd handed to tenants (their application directories chowned to
  // them, links of theirs in it) is made root's before anything in it is opened.
  std::vector<std::string> repaired;
  if ((r = pins::repair(repaired)))
    log(LogLevel::kWarn, "cannot check the pin tree %s: %s", pins::root().c_str(), std::strerror(-r));
  for (auto& line : repaired) log(LogLevel::kWarn, "pin tree: %s", line.c_str());

  // What a previous syrupd left: adopt what its state file describes and its pins still
  // hold; release and remove the rest.
  auto t1 = Clock::now();
  adopt_state();
  auto t2 = Clock::now();
  std::string apps = pins::root() + "/apps";
  release_leftovers(apps);
  for (auto& h : hooks_) h->recover();
  auto ms = [](Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); };
  log(LogLevel::kInfo, "start: pin tree checked in %.0f ms, state adopted in %.0f ms, leftovers in %.0f ms",
      ms(t1 - t0), ms(t2 - t1), ms(Clock::now() - t2));
  if ((r = pins::make_dirs(apps))) {
    log(LogLevel::kError, "cannot create %s: %s", apps.c_str(), std::strerror(-r));
    return r;
  }
  return 0;
}

// After adopt_state(): the policy directories under `apps` no adopted policy owns are
// released and removed, and the map pins no adopted policy declares.
void Daemon::release_leftovers(const std::string& apps) {
  std::error_code ec;
  int released = 0;
  for (auto& app_dir : fs::directory_iterator(apps, ec))
    for (auto& pol : fs::directory_iterator(app_dir.path() / "policies", ec)) {
      int id = std::atoi(pol.path().filename().c_str());
      if (policies_.count(id) && policies_[id]->app == app_dir.path().filename().string()) continue;
      // Its record may be what was lost (a torn last record of the journal): its id is
      // not handed out again either.
      if (id > 0 && id < INT32_MAX) next_id_ = std::max(next_id_, id + 1);
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
}

// The control socket, which anyone may connect to. 0 or -errno.
int Daemon::listen_control() {
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
  return 0;
}

// The signals, epoll and the workers; every descriptor the loop watches. 0 or -errno.
int Daemon::start_loop() {
  int r = 0;
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGINT);
  sigaddset(&mask, SIGTERM);
  sigaddset(&mask, SIGHUP);
  sigprocmask(SIG_BLOCK, &mask, nullptr);
  signal_fd_.reset(signalfd(-1, &mask, SFD_CLOEXEC));
  epoll_fd_.reset(epoll_create1(EPOLL_CLOEXEC));
  recorder_.init(epoll_fd_.get(), cfg_.record);
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
  // Each owner's pidfd once (an owner's policies share it: EEXIST for the others).
  for (auto& [id, p] : policies_)
    if (p->owner_pidfd) {
      epoll_event ev{EPOLLIN, {.fd = p->owner_pidfd->get()}};
      epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, p->owner_pidfd->get(), &ev);
    }
  return 0;
}

// --metrics_port: the Prometheus endpoint, its refresh watched. 0 or -errno.
int Daemon::start_metrics() {
  if (!cfg_.metrics_port) return 0;
  std::string merr;
  if (int r = metrics_.start(cfg_.metrics_address, cfg_.metrics_port, merr)) {
    log(LogLevel::kError, "metrics endpoint: %s", merr.c_str());
    return r;
  }
  metrics_refresh_fd_ = metrics_.refresh_fd();
  epoll_event ev{EPOLLIN, {.fd = metrics_refresh_fd_}};
  epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, metrics_refresh_fd_, &ev);
  for (auto& a : metrics_.addresses()) log(LogLevel::kInfo, "metrics on http://%s/metrics", a.c_str());
  return 0;
}

int Daemon::run() {
  // ready: adoption and --config done
  ready_ = true;
  metrics_.set_ready();
  write_status();
  if (cfg_.on_ready) cfg_.on_ready(policies_.size());
  epoll_event evs[32];
  for (bool stop = false; !stop;) {
    LoadedPolicy::release_reopened();  // what the start, or the last events, reopened
    int timeout = run_timers();
    LoadedPolicy::release_reopened();
    int n = epoll_wait(epoll_fd_.get(), evs, 32, timeout);
    if (n < 0) {
      if (errno == EINTR) continue;
      log(LogLevel::kError, "epoll_wait: %s", std::strerror(errno));
      break;
    }
    for (int i = 0; i < n; i++) stop |= on_event(evs[i].data.fd);
  }
  if (cfg_.on_stopping) cfg_.on_stopping();
  stop_serving();
  return 0;
}

// The loop's timers: the client sweeps, the check for policies that ended without news,
// the --config retry. The epoll timeout (ms) until the next is due, -1 when none is.
int Daemon::run_timers() {
  int timeout = sweep_clients();
  if (int rec = recorder_.run_due(); rec >= 0) timeout = timeout < 0 ? rec : std::min(timeout, rec);
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
  if (config_watch_.armed()) {
    if (config_watch_.due(now)) {
      log(LogLevel::kInfo, "%s changed: applying it", cfg_.config_path.c_str());
      reload_config("file change");
    } else {
      wake_at(config_watch_.due_at());
    }
  }
  return timeout;
}

// One epoll event, handed to the part it is for. True: a signal asks syrupd to stop.
bool Daemon::on_event(int fd) {
  if (fd == listen_fd_.get()) {
    accept_client();
  } else if (fd == signal_fd_.get()) {
    signalfd_siginfo si;
    if (read(fd, &si, sizeof si) != sizeof si) return false;
    if (si.ssi_signo == SIGHUP) {
      if (cfg_.config_path.empty()) log(LogLevel::kInfo, "SIGHUP: nothing to reload (no --config)");
      else reload_config();
      return false;
    }
    log(LogLevel::kInfo, "%s: shutting down", strsignal(static_cast<int>(si.ssi_signo)));
    return true;
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
  } else if (fd >= 0 && fd == config_watch_.fd()) {
    config_file_event();
  } else if (fd == metrics_refresh_fd_) {
    uint64_t n;
    if (read(fd, &n, sizeof n) == sizeof n) publish_metrics();
  } else if (recorder_.owns(fd)) {
    recorder_.on_event(fd);
  } else if (Hook* h = hook_watching(fd)) {
    if (h->refresh()) follow_kernel();
  } else {
    owner_exited(fd);
  }
  return false;
}

// After the loop: parked deploys answered, the workers stopped, the policies removed
// (--on_exit=remove) or left for the next syrupd.
void Daemon::stop_serving() {
  // Parked deploys are answered, not left hanging: their compiles are stopped, their
  // loads refused at the quota check or undone when the kernel returns.
  {
    std::lock_guard lk(asks_mu_);
    asks_closed_ = true;
    for (auto& a : asks_) a->answer.set_value("syrupd is shutting down; the policy was not deployed");
    asks_.clear();
  }
  recorder_.stop_all(SYR_REC_END_STOPPED);
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
    // The data path stays as it is; the next syrupd adopts it from the state file,
    // written whole (its journal emptied).
    compact_state();
    log(LogLevel::kInfo, "leaving %zu policies in place for the next syrupd (state in %s)",
        policies_.size(), cfg_.state_file.c_str());
  }
  for (auto& h : hooks_) h->shutdown();
  unlink(cfg_.socket_path.c_str());
}

void Daemon::changed() {
  save_state();
  write_status();
  publish_metrics();
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
  s.config = config_sample();
  if (!s.per_tenant) {
    metrics_.publish(std::move(s));
    return;
  }
  std::map<std::string, metrics::TenantSample> tenants;
  bool runs_counted = bpf_stats_enabled();  // once per publish, not once per policy
  for (auto& [id, p] : policies_) {
    s.policies.push_back(metrics::policy_sample(policy_stats(*p, runs_counted), p->hook, p->target->key()));
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

}  // namespace syrup
