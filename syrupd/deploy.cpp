// The deploy request: its checks, then its steps as one transaction (deploy_txn.h).
//
// Design: deploy() checks the request (check_deploy), makes the hook's target, finds the
// policy it replaces and compiles; run_deploy() then runs the remaining steps -- load and
// pin, install, register, retire -- each pushing its undo onto a DeployTxn, which unwinds
// them newest first on any failure. What the undo steps act on (the policy, its target)
// is declared before the transaction, so it is still there while the transaction unwinds.
// Parking (daemon.h): a deploy that waits for its compile or its load returns a Deferred
// and hands its transaction over; it runs again from the start, every check included,
// with a transaction of its own.
// Invariants: a deploy that fails leaves the kernel, bpffs and the registry as they
// were, and the policy it would have replaced keeps running; a deploy that reaches the
// retire step completes.
#include <bpf/bpf.h>
#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <tuple>

#include "daemon.h"
#include "daemon_util.h"
#include "log.h"
#include "names.h"
#include "proc.h"
#include "hook_request.h"
#include "registry.h"
#include "syrup/abi.h"

namespace syrup {
using nlohmann::json;
using Step = DeployTxn::Step;

namespace {

// The first "error:" line of clang's diagnostics, or "".
std::string first_error(const std::string& diagnostics) {
  auto pos = diagnostics.find("error:");
  if (pos == std::string::npos) return {};
  size_t ls = diagnostics.rfind('\n', pos);
  ls = ls == std::string::npos ? 0 : ls + 1;
  return diagnostics.substr(ls, diagnostics.find('\n', pos) - ls);
}

}  // namespace

std::optional<std::string> check_params(const json& b, std::map<std::string, uint64_t>& params) {
  if (!b.contains("params")) return std::nullopt;
  if (!b["params"].is_object()) return "params must be an object";
  for (auto& [k, v] : b["params"].items()) {
    if (std::string why = names::check("parameter", k, names::Kind::kParam); !why.empty()) return why;
    if (k.starts_with(SYR_SYSTEM_PREFIX))
      return "parameter '" + k + "' is reserved (names starting with syr_ belong to Syrup)";
    // Whether the value fits the variable's declared type is the loader's check (ERANGE).
    if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<int64_t>() >= 0))
      return "parameter '" + k + "' must be an integer in 0.." + std::to_string(UINT64_MAX) + ", got " +
             v.dump(-1, ' ', true, json::error_handler_t::replace).substr(0, 40);
    params[k] = v.get<uint64_t>();
  }
  return std::nullopt;
}

std::optional<Daemon::Response> Daemon::check_deploy(const Caller& caller, const json& b, DeployArgs& a) {
  auto str = [&](const char* k) { return b.contains(k) && b[k].is_string() ? b[k].get<std::string>() : std::string(); };
  auto fail = [](int e, const std::string& why) { return std::optional<Response>(Response{proto::error_response(e, why)}); };
  a.hook = str("hook"), a.app = str("app"), a.source = str("source");
  // libsyrup names the hook by its enum syr_hook value, syrupctl and --config by name.
  if (b.contains("hook_id")) {
    const HookSpec* s = b["hook_id"].is_number_integer() ? find_hook(b["hook_id"].get<int>()) : nullptr;
    if (!s) return fail(EINVAL, "unknown hook " + names::printable(b["hook_id"].dump()) + " (known: " + hook_names() + ")");
    a.hook = s->name;
  }
  policy_names(b, a.name, a.source_name);
  if (!(a.hi = hook_named(a.hook)))
    return fail(EINVAL, "unknown hook '" + names::printable(a.hook) + "' (known: " + hook_names() + ")");
  if (std::string why = names::check("application", a.app); !why.empty()) return fail(EINVAL, why);
  // The names a policy is shown and logged by: text, but never a control character.
  for (auto [what, v] : {std::pair{"policy", &a.name}, std::pair{"source", &a.source_name}})
    if (std::string why = names::check(what, *v, names::Kind::kDisplay); !why.empty()) return fail(EINVAL, why);
  if (a.source.empty()) return fail(EINVAL, "the policy source is empty");
  if (std::string why = names::source_size(a.source.size(), cfg_.max_source_bytes, "syrupd --max_source_bytes");
      !why.empty())
    return fail(EFBIG, why);
  if (a.source.find('\0') != std::string::npos) return fail(EINVAL, "policy source contains NUL bytes: not C source text");
  if (std::string why = may_use_app(caller, a.app); !why.empty()) return fail(EPERM, why);
  if (auto why = check_params(b, a.params)) return fail(EINVAL, *why);
  a.persist = b.value("persist", false);
  if (std::string why = config::persist_refusal(a.hook); a.persist && !why.empty())
    return fail(EINVAL, "persist is not allowed for the " + a.hook +
                            " hook: the policy ends with the process it schedules; " + why +
                            ". Deploy it again from the new process, or list it in syrupd's --config, which follows "
                            "the process");
  // The hook's fields, in the words its parse() gives every entry point (hooks/<id>/request.h),
  // before anything is compiled; the hook parses them again into its typed request.
  if (const HookSpec* spec = find_hook(a.hook); spec && spec->check)
    if (Bad bad; !spec->check(hook_fields(b), bad, nullptr)) return fail(EINVAL, bad.str());
  return std::nullopt;
}

// A `pid` names a process as the caller numbers it. A caller in a pid namespace of its own
// (a container) numbers processes otherwise than syrupd and the hooks do: its 1 is not the
// machine's init. Rewrites the request's pid as syrupd numbers it; "" or why not.
std::string Daemon::translate_pid(const Caller& caller, json& b) {
  if (!b.contains("pid") || !b["pid"].is_number_integer() || b["pid"].get<int64_t>() <= 0) return {};
  uint64_t ns = pid_namespace(caller.pid);
  if (ns == pid_namespace(0)) return {};
  pid_t theirs = b["pid"].get<pid_t>(), mine = ns ? process_by_own_number(ns, theirs) : 0;
  if (!mine) return "no process " + std::to_string(theirs) + " in the caller's pid namespace";
  b["pid"] = mine;
  return {};
}

Daemon::Response Daemon::deploy(const Caller& caller, proto::Message& req, bool enforce_quotas) {
  // A resumed deploy makes every check again, with the compile its first run waited for.
  DeployRun run;
  run.resumed = std::move(resumed_);
  run.enforce_quotas = enforce_quotas;
  DeployArgs& a = run.args;
  if (auto refused = check_deploy(caller, req.body, a)) return std::move(*refused);

  // Whether this run may park, for its compile or its load, is known before the target
  // takes the request's descriptors: only then are they copied, for the resumed run.
  run.job = {a.source, a.source_name, a.hi->compile_define(), a.hi->wrapper()};
  // Tenants' policies only: an admin's are trusted as the admin is (docs/security.md).
  run.verify_build = a.hi->verify_wrapper() && enforce_quotas;
  run.verify_job = {a.source, a.source_name, a.hi->compile_define(), run.verify_build ? a.hi->verify_wrapper() : ""};
  run.loaded_job = run.resumed && run.resumed->load ? run.resumed->load.get() : nullptr;
  bool compile_parks = !run.resumed && may_park_ && !compiler_.cached(run.job);
  if (may_park_ && !run.loaded_job) {
    run.parking = std::make_unique<Deferred>();
    for (auto& f : req.fds) {
      run.parking->fds.emplace_back(fcntl(f.get(), F_DUPFD_CLOEXEC, 0));
      if (!run.parking->fds.back()) return {proto::error_response(EMFILE, "syrupd is out of descriptors; retry later")};
    }
  }
  // (A resumed run has the body this run translated.)
  if (!run.resumed)
    if (std::string why = translate_pid(caller, req.body); !why.empty()) return {proto::error_response(ESRCH, why)};

  // What the kernel took away since the loop last looked (an interface deleted a moment
  // ago) is not built on.
  if (a.hi->refresh()) follow_kernel();
  std::string err;
  pid_t owner = caller.pid;
  if (int r = a.hi->make_target(caller, req, run.target, owner, err)) return {proto::error_response(-r, err)};
  if (auto refused = find_replaced(caller, run)) return std::move(*refused);

  if (run.resumed) {
    run.cr = run.resumed->result;  // a copy: a load's resume reads it again
  } else if (compile_parks) {
    run.parking->job = std::move(run.job);
    run.parking->first_target = std::move(run.target);
    Response parked;
    parked.park = std::move(run.parking);
    return parked;
  } else {
    // Hashing the job for the lookup only while a reload's failures are kept.
    auto f = config_warm_failed_.empty() ? config_warm_failed_.end() : config_warm_failed_.find(compiler_.key(run.job));
    run.cr = f != config_warm_failed_.end() ? f->second : compiler_.compile(run.job);
  }
  if (run.cr.err) {
    std::string first = first_error(run.cr.diagnostics);
    return {proto::error_response(-run.cr.err, "policy " + a.name + " does not compile" + (first.empty() ? "" : ": " + first),
                                  run.cr.diagnostics)};
  }
  return run_deploy(caller, run, owner);
}

// A policy on the new target that has ended goes first: one whose owner has exited but
// whose exit event is still queued behind this request (a port the kernel already gave to
// a new process is not held by a dead one), or whose attachment the kernel no longer has
// (every socket of its group closed: a group on that address now is another one). Then
// one policy per target: the same application replaces (run.old), another is refused.
std::optional<Daemon::Response> Daemon::find_replaced(const Caller& caller, DeployRun& run) {
  const std::string key = run.target->key();
  std::vector<std::pair<int, std::string>> dead;
  auto on_key = [&] { auto it = by_key_.find(key); return it == by_key_.end() ? std::set<int>() : it->second; };
  for (int id : on_key())
    if (std::string why = why_ended(*policies_.at(id)); !why.empty()) dead.emplace_back(id, std::move(why));
  for (auto& [id, why] : dead) end_policy(id, why);
  for (int id : on_key()) {
    Policy* p = policies_.at(id).get();
    if (p->app != run.args.app)
      return Response{proto::error_response(
          EBUSY, key + " is scheduled by " +
                     (visible(caller, *p) ? "application '" + p->app + "' (policy " + std::to_string(id) + ")"
                                          : std::string("another user's application")))};
    run.old = p;
  }
  return std::nullopt;
}

// The policy record before its load: id, names, owner (watched from now on, so an owner
// that exits mid-deploy is not missed). Null with the error in `resp` if the owner is gone.
std::unique_ptr<Policy> Daemon::new_policy(const Caller& caller, const DeployRun& run, pid_t owner, Response& resp) {
  const DeployArgs& a = run.args;
  auto pol = std::make_unique<Policy>();
  // A resumed load keeps the id its pins were made under.
  pol->id = run.loaded_job ? run.loaded_job->spec.policy_id : next_id_++;
  pol->app = a.app;
  pol->hook = a.hook;
  pol->name = a.name;
  pol->uid = caller.uid;
  pol->params = a.params;
  pol->created = time(nullptr);
  if (a.persist) return pol;
  pol->owner_pid = owner;
  pol->owner_start = process_start_time(owner);
  pol->owner_pidfd = owner_fd(owner);
  if (pol->owner_pidfd) return pol;
  resp = {proto::error_response(ESRCH, "process " + std::to_string(owner) + " exited before its policy was deployed")};
  return nullptr;
}

LoadSpec Daemon::load_spec(const DeployRun& run, const Policy& pol) {
  const DeployArgs& a = run.args;
  LoadSpec spec;
  spec.object_path = run.cr.object_path;
  spec.app = a.app;
  spec.policy_id = pol.id;
  spec.policy_name = a.name;
  spec.hook = a.hook;
  spec.num_executors = run.target->num_executors();
  spec.params = a.params;
  spec.system_maps = a.hi->system_maps();
  spec.allowed = a.hi->allowlist();
  if (run.enforce_quotas) {
    const std::string app = a.app;
    const Policy* old = run.old;
    spec.check_quota = [this, app, old](const LoadFootprint& fp) { return check_quota(app, old, fp); };
  }
  return spec;
}

// A resumed load, verified on a worker while other requests ran: the target and the
// policy it replaces must be those the load was prepared for, and the quotas must still
// hold with what registered meanwhile (its maps are pinned now, so they count as
// pinned). Installs on the target the load was prepared with (the maps it shares, a slot
// it took); the target this run made has made every check again and is kept in
// run.checked until the deploy ends (until then it and the earlier ones hold what they
// share, an interface's root). 0, or -errno with the answer in `resp`.
int Daemon::take_loaded(DeployRun& run, Policy& pol, Response& resp) {
  LoadJob& job = *run.loaded_job;
  const std::string& name = run.args.name;
  if (job.err) {
    resp = {proto::error_response(-job.err, job.fail.message, job.fail.log)};
    return job.err;
  }
  Policy* old = run.old;
  if ((old ? old->id : 0) != run.resumed->replaces || run.target->key() != run.resumed->first_target->key()) {
    std::string was = run.resumed->replaces ? "policy " + std::to_string(run.resumed->replaces) : std::string("none");
    resp = {proto::error_response(EAGAIN, "policy " + name + " was not deployed: the policy it replaces on " +
                                              run.target->key() + " changed while it was verified (it was " + was +
                                              "); deploy again")};
    return -EAGAIN;  // the resume undoes the load
  }
  run.checked = std::move(run.target);
  run.target = std::move(run.resumed->first_target);
  if (run.enforce_quotas) {
    LoadFootprint now;
    bpf_prog_info info{};
    uint32_t len = sizeof info;
    if (bpf_prog_get_info_by_fd(job.loaded->prog_fd(), &info, &len) == 0) now.insns = info.xlated_prog_len / 8;
    if (std::string why = check_quota(run.args.app, old, now); !why.empty()) {
      resp = {proto::error_response(EDQUOT, why)};
      return -EDQUOT;
    }
  }
  pol.loaded = std::move(job.loaded);
  return 0;
}

// Parks the deploy for its load: the verifier goes to a worker; this deploy runs again
// from the start with its load.
Daemon::Response Daemon::park_load(DeployRun& run, const LoadSpec& spec) {
  auto lj = std::make_shared<LoadJob>();
  lj->spec = spec;
  lj->spec.check_quota = nullptr;  // set when parked: asked of the main loop
  for (auto& [m, fd] : lj->spec.reuse_maps) {
    lj->reuse_fds.emplace_back(fcntl(fd, F_DUPFD_CLOEXEC, 0));
    if (!lj->reuse_fds.back()) return {proto::error_response(EMFILE, "syrupd is out of descriptors; retry later")};
    fd = lj->reuse_fds.back().get();
  }
  if (run.verify_build) lj->verify = run.verify_job;
  Deferred& d = *run.parking;
  d.load = std::move(lj);
  d.result = std::move(run.cr);
  // The compile's first target too: dropped now, it would take a hook-wide root with it
  // (an XDP root no installed policy uses is detached) from under this run's.
  if (run.resumed) d.held = std::move(run.resumed->first_target);
  d.enforce_quotas = run.enforce_quotas;
  d.replaces = run.old ? run.old->id : 0;
  d.first_target = std::move(run.target);
  Response parked;
  parked.park = std::move(run.parking);
  return parked;
}

// Step load and pin: from a worker (resumed), onto a worker (parks), or here. 0, or
// -errno with the answer in `resp` (a parked deploy: 1, with resp.park set).
int Daemon::load_step(DeployRun& run, Policy& pol, DeployTxn& txn, Response& resp) {
  LoadSpec spec = load_spec(run, pol);
  Policy* old = run.old;
  if (run.loaded_job) {
    if (int r = take_loaded(run, pol, resp)) return r;
  } else if (int r = run.target->prepare_load(spec, old ? old->target.get() : nullptr, old ? old->loaded.get() : nullptr)) {
    resp = {proto::error_response(-r, "cannot prepare the replacement of policy " + std::to_string(old ? old->id : 0))};
    return r;
  } else if (run.parking) {
    resp = park_load(run, spec);
    if (!resp.park) return -resp.body.value("errno", EIO);
    txn.hand_over();  // the application entry stays for the parked deploy
    return 1;
  } else {
    LoadFailure lf;
    if (int r = (run.verify_build ? compile_verify_build(run.verify_job, spec, lf) : 0)
                    ?: load_policy(spec, pol.loaded, lf)) {
      resp = {proto::error_response(-r, lf.message, lf.log)};
      return r;
    }
  }
  Policy* raw = &pol;
  txn.on_undo("load of policy " + std::to_string(pol.id), [raw] {
    raw->loaded->unpin();
    raw->loaded.reset();
  });
  return 0;
}

// Step register: the policy joins the registry, its owner watched. Undone, it leaves the
// registry back into `pol`, which the steps before act on.
void Daemon::register_step(std::unique_ptr<Policy>& pol, DeployTxn& txn) {
  int id = pol->id;
  // Watched again: an exit seen while the deploy ran found no policy and unwatched it
  // (EEXIST otherwise).
  if (pol->owner_pidfd) {
    epoll_event ev{EPOLLIN, {.fd = pol->owner_pidfd->get()}};
    epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, pol->owner_pidfd->get(), &ev);
  }
  record(*pol);
  index(*pol);
  policies_.emplace(id, std::move(pol));
  txn.on_undo("registration of policy " + std::to_string(id), [this, id, &pol] {
    auto it = policies_.find(id);
    unindex(*it->second);
    pol = std::move(it->second);
    policies_.erase(it);
  });
}

// Load+pin -> install (executors, attach; atomically over a replaced policy) -> register
// -> retire the replaced policy, under one transaction.
Daemon::Response Daemon::run_deploy(const Caller& caller, DeployRun& run, pid_t owner) {
  const DeployArgs& a = run.args;
  Response resp;
  std::unique_ptr<Policy> pol = new_policy(caller, run, owner, resp);
  if (!pol) return resp;
  DeployTxn txn(a.name);  // after pol and run: unwound while they are there
  auto failed = [&](int r, const std::string& why) { return Response{proto::error_response(-r, why)}; };
  std::string err;
  if (int r = txn.fault(Step::kCompile, err)) return failed(r, err);
  if (!app_owner_.count(a.app)) app_owner_[a.app] = caller.uid;
  // New map pins, and a new application entry; also after a failed load.
  txn.on_undo("application " + a.app, [this, app = a.app] { gc_app(app); });
  if (load_step(run, *pol, txn, resp) != 0) return resp;  // failed, or parked
  if (int r = txn.fault(Step::kLoad, err)) return failed(r, err);

  Policy* old = run.old;
  if (int r = run.target->install(*pol->loaded, old ? old->target.get() : nullptr, txn, err)) return failed(r, err);
  pol->target = std::move(run.target);
  if (int r = txn.fault(Step::kInstall, err)) return failed(r, err);

  int id = pol->id;
  register_step(pol, txn);
  if (int r = txn.fault(Step::kRegister, err)) return failed(r, err);
  if (int r = txn.fault(Step::kRetire, err)) return failed(r, err);
  txn.commit();

  const Policy& p = *policies_.at(id);
  json out = p.target->describe();
  out["id"] = id;
  out["target"] = p.target->key();
  out["executors"] = p.target->num_executors();
  out["cached"] = run.cr.cached;
  if (!run.cr.diagnostics.empty()) out["warnings"] = run.cr.diagnostics;
  log(LogLevel::kInfo, "deployed policy %d (%s) for app '%s' on %s, %u executors%s", id, a.name.c_str(), a.app.c_str(),
      p.target->key().c_str(), p.target->num_executors(), run.cr.cached ? " (cached object)" : "");
  // Retire: irreversible (the replaced policy is unpinned), so nothing fails after it.
  if (old) {
    out["replaced"] = old->id;
    remove_policy(old->id, false, ("replaced by policy " + std::to_string(id)).c_str());
  }
  gc_app(a.app);
  totals_.deploys++;
  changed();
  // Pinned and attached: its program and maps need no descriptor of syrupd's until a
  // request asks for them (LoadedPolicy::release()).
  p.loaded->release();
  return {ok(out)};
}

}  // namespace syrup
