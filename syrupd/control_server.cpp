// The control server: the listening socket, client connections, frames, rate limits,
// the idle and reject sweeps, and the parking of deploys for the compile and load workers
// (docs/protocol.md, "Connection model"). Daemon::run() hands it its epoll events.
//
// Design: connections are non-blocking; a request frame is assembled from what each
// readiness event brings and an answer is sent as the socket takes it. A connection has
// one request in flight: nothing more is read from it until it is answered (a parked
// deploy's connection is out of epoll until then).
// Invariants:
//  - a begun frame, and an answer, have kFrameDeadlineSec; an idle connection
//    --client_idle_timeout_s; a rejected one 1 s: then it is closed, having held no one;
//  - callers other than root hold at most --max_clients connections, --max_clients_per_uid
//    each; root is never turned away;
//  - a parked deploy is answered exactly once: when it resumes, when its load times out
//    (--load_timeout_s), or at shutdown; a load nobody takes is undone when it returns;
//  - workers never read the registry: a load's quota check is asked of the main loop.
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <stdexcept>

#include "daemon.h"
#include "test_run.h"
#include "daemon_util.h"
#include "log.h"
#include "names.h"
#include "pins.h"
#include "proc.h"
#include "syrup/abi.h"
#include "text.h"

namespace syrup {
namespace fs = std::filesystem;
using nlohmann::json;

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
  if (int r = resp.raw.empty() ? proto::encode_frame(resp.body, c.out) : proto::encode_payload(resp.raw, c.out)) {
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

// The caller behind credentials `cred` (SO_PEERCRED), with whether it is in an admin
// group (--admin_group, or the --config file's admin_group).
Caller Daemon::caller_of(const ucred& cred) const {
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
  return caller;
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
  Caller caller = caller_of(cred);

  // One request at a time per connection: nothing more is read until it is answered.
  watch(fd, conn, 0);
  may_park_ = true;
  Response resp = handle(caller, req);
  may_park_ = false;
  if (resp.park) return park(fd, caller, std::move(req), std::move(resp.park));
  answer(fd, resp);
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
  } else if (d->test) {
    log(LogLevel::kDebug, "pid %d uid %u: test run parked while a worker runs it (ticket %llu)", caller.pid,
        caller.uid, static_cast<unsigned long long>(ticket));
    load_pool_.submit(ticket, caller.uid, [job = d->test] { job->run(); });
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

}  // namespace syrup
