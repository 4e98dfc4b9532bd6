// syrupd's core: the control socket, the registry of deployed policies, and the request
// handlers (docs/protocol.md). One class, Daemon, whose parts live in one file each, every
// file opening with its part's design and invariants:
//  - daemon.cpp: start (init: bpffs, lock, adoption, socket, workers) and the event loop
//    that hands each event to its part (run);
//  - control_server.cpp: connections, frames, rate limits, idle and reject sweeps, and the
//    parking of deploys for the compile and load workers;
//  - handlers.cpp: the requests other than deploy; deploy.cpp: the deploy, whose steps
//    run as one transaction (deploy_txn.h);
//  - policy_registry.cpp: policies, application owners, removed ids, visibility, quotas;
//  - state_store.cpp: the state file; config_reconciler.cpp: --config.
//
// Design: one main thread, one epoll loop over the listening socket, client connections,
// a signalfd, one pidfd per policy owner and the workers' eventfds. Requests are served
// one at a time on the main thread, so the registry needs no locks. No client can delay
// another (docs/security/server.md):
//  - connections are non-blocking: a request frame is assembled from what each
//    readiness event brings, an answer is sent as the socket takes it; a begun frame, and
//    an answer, have kFrameDeadlineSec, after which the connection is closed;
//  - what takes seconds runs on workers (compile_pool.h), uids in turn: clang on the
//    compile workers, the kernel's verifier (bpf_object__load) on as many load workers.
//    A deploy whose object is not cached is parked while a worker compiles it, then runs
//    again from the start, every check included; it parks again while a worker loads it
//    (the quota check before the verifier is asked of the main loop), and runs again
//    from the start to install on the target the load was prepared with and register,
//    refusing the load if the policy it replaces changed meanwhile (--load_timeout_s
//    bounds the wait: the client is then answered, the late load undone);
//  - a map dump answers a page of entries per request, a bounded amount of memory and
//    main-loop time, with a cursor for the next page.
// Invariants the registry keeps:
//  - every registered policy is loaded, pinned and attached; a deploy that fails at any
//    step leaves the kernel and bpffs as they were, and the policy already deployed on
//    that group keeps running;
//  - at most one policy per target (hook.h); deploying again to a target of the same
//    application replaces the old one atomically;
//  - an application is owned by the uid that first deployed for it;
//  - a policy whose owner process exits is removed unless it was deployed to persist;
//  - an application's map pins exist exactly while some policy of that application
//    declares the map, or a load into the application is in flight (loading_apps_).
#pragma once

#include <bpf/bpf.h>
#include <sys/socket.h>
#include <sys/types.h>

#include <chrono>
#include <ctime>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <future>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "compile_pool.h"
#include "compiler.h"
#include "config.h"
#include "config_watch.h"
#include "deploy_txn.h"
#include "metrics.h"
#include "hook.h"
#include "loader.h"
#include "protocol.h"
#include "recorder.h"

namespace syrup {

struct MapUsage;  // daemon_util.h
struct TestRunJob;  // test_run.h

struct Policy {
  int id = 0;
  std::string app;
  std::string hook;
  std::string name;
  uid_t uid = 0;
  pid_t owner_pid = 0;  // 0 when the policy persists
  uint64_t owner_start = 0;  // the owner's start time, to tell it from a reused pid
  // Shared by every policy of that owner (Daemon::owner_fd()): one descriptor and one epoll
  // entry per process, not per policy. Null when the policy persists.
  std::shared_ptr<UniqueFd> owner_pidfd;
  std::map<std::string, uint64_t> params;
  std::unique_ptr<Target> target;        // where it is attached, with its executors
  std::unique_ptr<LoadedPolicy> loaded;  // declared after target: destroyed first
  time_t created = 0;
  std::string config_identity;  // "<tenant>/<name>" when deployed from --config
  std::string config_hash;
  std::string state_json;  // its entry in the state file (Daemon::record)
  // Its list entry's fields that never change, serialised without the closing brace;
  // made by the first list after record(), which clears it (Daemon::list_entry).
  mutable std::string list_json;
  // Its stats entry's fixed fields (Daemon::stats_entry), and its program's run counts as
  // last read; `runs_final`: read while kernel.bpf_stats_enabled was off (they stand).
  mutable std::string stats_json;
  mutable uint64_t run_cnt = 0, run_time_ns = 0;
  mutable bool runs_final = false;
  std::string key;  // target->key() as the registry's index has it (Daemon::index)
  // The loaded program's kernel id and instruction count, read once (Daemon::record):
  // list and the quota checks need them for every policy, and they never change.
  uint32_t prog_id = 0;
  uint32_t insns = 0;
};

// Per-application limits for callers that are not admins (docs/protocol.md).
struct Quotas {
  size_t policies = 32;
  size_t maps = 64;
  uint64_t map_bytes = 64ull << 20;
  size_t insns = 200000;          // BPF instructions over all the application's programs
  unsigned requests_per_second = 200;  // per uid, on the control socket
  // Per uid, over every application it owns: without them one user could make many
  // applications, each within the per-application quotas.
  size_t uid_policies = 64;
  size_t uid_maps = 256;
  uint64_t uid_map_bytes = 256ull << 20;
  size_t uid_insns = 1000000;
};

struct DaemonConfig {
  Quotas quotas;
  std::vector<gid_t> admin_gids;  // members of these groups act as root does
  std::string socket_path;
  CompilerConfig compiler;
  std::string bpffs_root;
  size_t max_source_bytes = 1 << 20;
  std::string state_file;       // what is deployed, for the next syrupd to adopt
  std::string config_path;      // --config: tenants and their policies (docs/operations.md)
  uint16_t metrics_port = 0;    // --metrics_port: Prometheus text on localhost (0: off)
  // --metrics_address: a numeric IPv4 or IPv6 address; "" or 127.0.0.1: loopback only
  // (127.0.0.1 and ::1), as before the flag existed.
  std::string metrics_address;
  // --config_watch: apply --config when the file (or the kubelet's ..data link) changes.
  bool config_watch = false;
  // --status_file: what the last --config apply did, JSON, rewritten after every change
  // (written only with --config).
  std::string status_file;
  bool metrics_per_tenant = false;  // --metrics_per_tenant: series labelled by app, policy, uid
  bool remove_on_exit = false;  // SIGTERM: remove every policy (else leave them running)
  // Open control connections of callers other than root (--max_clients): each holds a
  // descriptor and an epoll entry, so a local user could otherwise exhaust syrupd's.
  size_t max_clients = 128;
  // Of those, at most this many per uid (--max_clients_per_uid), so that one user cannot
  // take every connection (and with them the compile workers' queue) from the others.
  size_t max_clients_per_uid = 32;
  // A connection with no request for this long is closed (--client_idle_timeout_s):
  // libsyrup and syrupctl make one call per connection, so only a squatter idles.
  unsigned client_idle_timeout_s = 60;
  // --agent_cpus: where the thread hook's user-space agents run (empty: where syrupd may).
  std::vector<int> agent_cpus;
  // --compile_workers: threads compiling parked deploys, and as many loading them
  // (docs/protocol.md, "Connection model").
  unsigned compile_workers = 2;
  // --quota_compiles_per_uid: compiles one uid other than root may have running at once
  // (more wait), so that one user cannot occupy every worker (0: no limit).
  unsigned compiles_per_uid = 1;
  // --load_timeout_s: a parked load not done by then is answered ETIMEDOUT; the kernel's
  // verifier cannot be interrupted, so its worker finishes and syrupd undoes the load.
  unsigned load_timeout_s = 30;
  // --test_run_max_ms: a test run's wall-clock bound on its worker (test_run.h).
  unsigned test_run_max_ms = 10000;
  // --record_max_bytes, --record_max_seconds, --max_recordings (recorder.h).
  RecordLimits record;
  // Told by run() once the previous syrupd's policies are adopted and the --config file is
  // applied, just before the first request is served (with how many policies there are),
  // and when it stops serving. main() tells systemd (sd_notify: READY=1, STOPPING=1); a
  // service manager that starts syrupd's clients after it relies on the order.
  std::function<void(size_t policies)> on_ready;
  std::function<void()> on_stopping;
};

class Daemon {
 public:
  // Mounts bpffs if needed, creates the pin root, binds the control socket. 0 or -errno.
  int init(const DaemonConfig& cfg);
  // Serves until SIGINT/SIGTERM, then removes every policy. Returns the exit code.
  int run();

 private:
  // init()'s parts, in order (daemon.cpp).
  int take_lock();
  int init_fault_injection();
  int load_config_at_start();
  int adopt_previous();
  void release_leftovers(const std::string& apps);
  // run()'s parts (daemon.cpp).
  int run_timers();
  bool on_event(int fd);
  void stop_serving();
  int listen_control();
  int start_loop();
  int start_metrics();
  // A policy verified and loaded on a worker for a parked deploy. Shared by the parked
  // deploy and the worker's task; the worker writes err/loaded/fail, read by the main
  // thread only after the pool reports the task done.
  struct LoadJob {
    uint64_t ticket = 0;
    LoadSpec spec;
    // Copies of spec.reuse_maps' descriptors, which the spec points at: the policy they
    // came from may be removed while the worker loads.
    std::vector<UniqueFd> reuse_fds;
    int err = 0;
    std::unique_ptr<LoadedPolicy> loaded;
    LoadFailure fail;
    // The hook's verification build (Hook::verify_wrapper()), compiled on the worker
    // before the load; empty source: none.
    CompileJob verify;
  };
  // A deploy that waits for its compile, or for its load.
  struct Deferred {
    CompileJob job;  // handed to the workers when parked
    // Copies of the request's descriptors, made before the first run's target took them:
    // the resumed run's request carries them.
    std::vector<UniqueFd> fds;
    // The first run's target, kept until the resumed run has made its own, so that a
    // hook-wide root it holds (an interface's XDP dispatcher) is not detached meanwhile.
    std::unique_ptr<Target> first_target;
    std::unique_ptr<Target> held;  // parked for a load: the compile's first target
    CompileResult result;  // the worker's compile
    std::shared_ptr<LoadJob> load;  // set: parked for (or resumed from) this load
    std::chrono::steady_clock::time_point load_by;
    bool enforce_quotas = true;
    int replaces = 0;  // the policy the load would replace, 0: none
    std::shared_ptr<TestRunJob> test;  // set: a test_run parked for (or resumed from) its run
  };
  struct Response {
    nlohmann::json body;
    // Set: the answer's payload, serialised already (list), sent instead of body, which
    // then only says whether it succeeded.
    std::string raw;
    std::vector<int> fds;  // borrowed: valid until the response is sent
    std::vector<UniqueFd> owned_fds;
    // Set by a deploy that may park and whose object is not cached.
    std::unique_ptr<Deferred> park;
  };

  struct Conn;
  void accept_client();
  // Makes epoll watch `fd` for `events` (0: not at all).
  void watch(int fd, Conn& c, uint32_t events);
  // Sends what the socket takes of `fd`'s pending answer; once all is sent, reads the
  // next request. A failed send closes the connection, logged.
  void flush_client(int fd);
  void serve_client(int fd);
  Caller caller_of(const ucred& cred) const;
  // Sends `resp` on client `fd`; a failed send closes the connection.
  void answer(int fd, Response& resp);
  // Compiles `job` (a verification build, Hook::verify_wrapper()) and sets its object in
  // `spec`: 0, or -errno with `fail` saying why. Runs on load workers.
  int compile_verify_build(const CompileJob& job, LoadSpec& spec, LoadFailure& fail);
  // Parks client `fd`'s deploy while a worker compiles `job`: syrupd reads nothing more
  // from the connection until it has answered.
  void park(int fd, const Caller& caller, proto::Message req, std::unique_ptr<Deferred> d);
  // The hook of that name, or nullptr.
  Hook* hook_named(const std::string& name) const;
  // The live policies deployed from --config: identity, content hash, id.
  std::vector<config::Applied> config_applied() const;
  // Runs the parked deploys whose compiles or loads finished, and answers them.
  void resume_parked();
  // Runs parked deploy `ticket` again (its compile or load is done) and answers it.
  void resume(uint64_t ticket);
  // Answers parked loads past --load_timeout_s; returns when the next one is due.
  std::chrono::steady_clock::time_point sweep_loads(std::chrono::steady_clock::time_point now);
  // On a worker: the quota check of LoadSpec::check_quota, asked of the main loop, which
  // alone reads the registry. "" or the refusal.
  std::string ask_quota(uint64_t ticket, const LoadFootprint& fp);
  // On the main loop: answers the workers' quota questions.
  void answer_quota_asks();
  // Closes client `fd`'s connection.
  void drop_client(int fd);
  // Answers a connection over --max_clients or --max_clients_per_uid with an error and
  // closes it soon after.
  void reject_client(int fd, uid_t uid);
  // Closes idle connections and rejected ones whose grace time is over; returns the
  // epoll timeout (ms) until the next sweep is due, -1 when none is.
  int sweep_clients();

  // dispatch + error totals. `resumed`: a parked deploy run again, which already counted
  // against the request rate.
  Response handle(const Caller& caller, proto::Message& req, bool resumed = false);
  Response dispatch(const Caller& caller, proto::Message& req, bool resumed);
  // `enforce_quotas`: whether the application's quotas apply. Requests: unless the caller
  // is an admin. --config entries: always (the file's quotas bind its own entries too).
  // The steps after the compile run as one transaction (deploy.cpp, deploy_txn.h).
  Response deploy(const Caller& caller, proto::Message& req, bool enforce_quotas);
  // A deploy request's fields, checked.
  struct DeployArgs {
    std::string hook, app, source, name, source_name;
    Hook* hi = nullptr;
    std::map<std::string, uint64_t> params;
    bool persist = false;
  };
  // One run of a deploy: what its steps hand on. Outlives the run's transaction, whose
  // undo steps act on the targets it holds.
  struct DeployRun {
    DeployArgs args;
    bool enforce_quotas = true;
    std::unique_ptr<Deferred> resumed;  // set: the run after a park
    LoadJob* loaded_job = nullptr;      // resumed from this load
    std::unique_ptr<Deferred> parking;  // set: this run may park
    CompileJob job, verify_job;
    bool verify_build = false;
    CompileResult cr;
    std::unique_ptr<Target> target;
    std::unique_ptr<Target> checked;  // a resumed load's own target, kept until the end
    Policy* old = nullptr;            // the policy it replaces
  };
  std::optional<Response> check_deploy(const Caller& caller, const nlohmann::json& b, DeployArgs& a);
  static std::string translate_pid(const Caller& caller, nlohmann::json& b);
  std::optional<Response> find_replaced(const Caller& caller, DeployRun& run);
  std::unique_ptr<Policy> new_policy(const Caller& caller, const DeployRun& run, pid_t owner, Response& resp);
  LoadSpec load_spec(const DeployRun& run, const Policy& pol);
  int take_loaded(DeployRun& run, Policy& pol, Response& resp);
  Response park_load(DeployRun& run, const LoadSpec& spec);
  int load_step(DeployRun& run, Policy& pol, DeployTxn& txn, Response& resp);
  void register_step(std::unique_ptr<Policy>& pol, DeployTxn& txn);
  Response run_deploy(const Caller& caller, DeployRun& run, pid_t owner);
  Response remove(const Caller& caller, const nlohmann::json& req);
  Response list(const Caller& caller, const nlohmann::json& req);
  // Most entries of one list or stats answer (docs/protocol.md, list).
  static constexpr int64_t kListPage = 1000;
  // Calls `entry` for each policy of the page; `next`: the cursor, when more may follow.
  std::optional<Response> page(const Caller& caller, const nlohmann::json& req, nlohmann::json& next,
                               const std::function<void(const Policy&)>& entry) const;
  // Appends `p`'s list entry, serialised, to `out`: its fields that never change are
  // serialised once (Policy::list_json), those of its target's state each time.
  void list_entry(const Policy& p, std::string& out) const;
  Response stats(const Caller& caller, const nlohmann::json& req);
  struct AppMap {
    std::string app, map;
    UniqueFd fd;
    bpf_map_info info{};
  };
  std::optional<Response> open_app_map(const Caller& caller, const nlohmann::json& req, AppMap& out);
  Response map_open(const Caller& caller, const nlohmann::json& req);
  Response map_dump(const Caller& caller, const nlohmann::json& req);
  Response thread_tid(const Caller& caller, const nlohmann::json& req);
  // record: starts recording a policy the caller may see, answered with the pipe the
  // recording comes out of; record_stop ends it (recorder.h).
  // The policy a request's `id` names, if `caller` may see it; else nullptr and, in
  // `refusal`, EINVAL for an id that is not 1..INT32_MAX, or ENOENT in the words of a
  // missing policy whether it does not exist or belongs to someone else.
  Policy* visible_policy(const Caller& caller, const nlohmann::json& id, Response& refusal);
  Response record(const Caller& caller, const nlohmann::json& req);
  Response record_stop(const Caller& caller, const nlohmann::json& req);
  // test_run.cpp: a policy run over given inputs, never attached.
  Response test_run(const Caller& caller, proto::Message& req);

  // Detaches (if `detach_hook`), unpins and forgets a policy; cleans its app's pins.
  // `ended`: no one asked (its owner exited, its attachment is gone): `list` shows it.
  void remove_policy(int id, bool detach_hook, const char* why, bool ended = false);
  void owner_exited(int pidfd);
  // The pidfd of owner `pid`, shared with its other policies, watched by epoll (once
  // epoll exists: start_loop() adds those of adopted policies); null if it is gone.
  std::shared_ptr<UniqueFd> owner_fd(pid_t pid);
  std::map<pid_t, std::weak_ptr<UniqueFd>> owner_fds_;
  // After a hook's refresh() found its kernel state changed by others: removes the
  // policies whose attachment the kernel no longer runs (Target::gone()), with that
  // reason, and records the rest (an XDP policy's interface renamed: its key and state).
  void follow_kernel();
  // Removes the policies that have ended (why_ended()), with that reason:
  // after a refresh(), and every kEndedCheckSec for what ends without news (the last
  // socket of a socket-select group closed). True if there were any.
  bool remove_ended();
  // Does some policy's target end without news (Target::ends_unannounced())? Only then
  // does syrupd wake every kEndedCheckSec.
  bool some_end_unannounced() const;
  // Why a policy has ended without a request, or empty: its owner exited (its exit event
  // perhaps still queued behind what asks: the owner's reason, as owner_exited() would
  // give it; a socket-select group's sockets closed with the owner), else its attachment
  // is gone (Target::gone()). For remove_ended() and a deploy to the same target.
  static std::string why_ended(const Policy& p);
  // The reason a policy ends with its owner.
  static std::string owner_exited_reason(const Policy& p);
  // Removes a policy that ended without being asked to (its owner exited, its attachment
  // is gone) with reason `why`; a --config entry's waits to be deployed again (retried
  // every kConfigRetrySec, the first time after 1 s): its process or interface may be back.
  void end_policy(int id, const std::string& why);
  // The hook whose event_fd() `fd` is, or null.
  Hook* hook_watching(int fd) const;
  // The state file (state_store.cpp): a snapshot, and a journal of the changes since it,
  // one record appended per change; compacted into a new snapshot when the journal
  // outgrows it. Read once at start to adopt.
  void save_state();
  void adopt_state();
  int compact_state();
  struct StateJournal {
    bool held = true;           // until adoption is done: nothing is written
    UniqueFd fd;                // the journal, O_APPEND; none: the next change compacts
    std::string generation;     // the snapshot's, which the journal's first line names
    uint64_t bytes = 0, snapshot_bytes = 0;
    // What changed since the last record: policies (entry or removal, whichever
    // policies_ shows when the record is written), removed ids, application owners.
    std::set<int> policies, gone;
    std::set<std::string> apps;
  };
  StateJournal journal_;
  int adopt_entry(const nlohmann::json& s, const nlohmann::json& apps, Policy& pol, std::string& err,
                  std::string& malformed);
  int adopt_gone(const nlohmann::json& gone);
  void not_adopted(const Policy& pol, int r, int entry, const std::string& err, const std::string& malformed);
  // After every change: the state file and the metrics snapshot.
  void changed();
  // Serialises `p`'s entry of the state file (once, when it is deployed or adopted).
  void record(Policy& p);
  void publish_metrics();
  // --config: load at start, reload on SIGHUP (or when the watch saw the file change;
  // `trigger` names which in the log), deploy/remove only what changed.
  void reload_config(const char* trigger = "SIGHUP");
  // --config_watch: the watch's descriptor was readable.
  void config_file_event();
  // --status_file: the --config file's state now, written atomically (config_reconciler.cpp).
  void write_status() const;
  nlohmann::json config_status() const;
  // The --config part of a metrics snapshot.
  metrics::ConfigSample config_sample() const;
  // SIGHUP: the sources the new file would deploy that are not cached compile on the
  // workers first, while requests are served; the file is applied once they all have
  // (a failed compile is not cached: applying compiles it again, on the main thread, to
  // report its diagnostics against its entry). At start the file is applied at once.
  void warm_config();
  // `retry`: only the entries in config_waiting_, quietly (a retry that finds the process
  // still missing logs at debug level and changes no totals).
  void apply_config(bool retry = false);
  bool apply_entry(const config::PlannedDeploy& d, bool retry);
  config::Quotas quotas_for(const std::string& app) const;
  void gc_app(const std::string& app);
  nlohmann::json describe(const Policy& p) const;
  // `p`'s stats entry as JSON; `runs_counted`: bpf_stats_enabled(), read once by a caller
  // that asks for many policies.
  nlohmann::json policy_stats(const Policy& p, bool runs_counted) const;
  // Appends `p`'s stats entry, serialised; `runs_counted`: bpf_stats_enabled().
  void stats_entry(const Policy& p, bool runs_counted, std::string& out) const;
  // kernel.bpf_stats_enabled: whether the kernel counts programs' runs now (unknown: true).
  static bool bpf_stats_enabled();
  // "" if `caller` may act on application `app`, else why not.
  std::string may_use_app(const Caller& caller, const std::string& app) const;
  // "" if deploying `fp` for `app` stays within the application's quotas and those of the
  // uid that owns it, else which one not (naming the limit and where it is set).
  std::string check_quota(const std::string& app, const Policy* replaced, const LoadFootprint& fp) const;
  std::string check_uid_quota(const std::string& app, const Policy* replaced, const LoadFootprint& fp,
                              const MapUsage& pinned) const;
  uint64_t rate_for(uid_t uid) const;  // requests per second allowed to `uid`
  // Token bucket per uid; false: over the rate.
  bool admit_request(const Caller& caller);
  // Whether `caller` may see `p` in list and stats: its own, its applications', or root.
  bool visible(const Caller& caller, const Policy& p) const;

  DaemonConfig cfg_;
  Compiler compiler_;
  CompilePool compile_pool_;  // after compiler_: destroyed (joined) before it
  struct Parked {
    int fd;
    Caller caller;
    proto::Message req;
    std::unique_ptr<Deferred> deferred;
  };
  std::map<uint64_t, Parked> parked_;  // by compile or load ticket
  // Loads on the workers, by ticket, until the pool reports them done (also those whose
  // deploy was answered meanwhile: their result is undone then), and how many of each
  // application: its map pins are not collected while one loads into them.
  std::map<uint64_t, std::shared_ptr<LoadJob>> loads_;
  std::map<std::string, int> loading_apps_;
  struct QuotaAsk {
    uint64_t ticket;
    LoadFootprint fp;
    std::promise<std::string> answer;
  };
  std::mutex asks_mu_;
  std::vector<std::shared_ptr<QuotaAsk>> asks_;  // under asks_mu_
  bool asks_closed_ = false;                      // under asks_mu_: shutting down
  UniqueFd asks_fd_;                              // eventfd: asks_ has some
  // Its tasks ask the main loop through asks_: declared after them, joined before them.
  CompilePool load_pool_;
  uint64_t next_ticket_ = 1;
  // Per request: whether deploy() may park (a client's request, not a --config entry or a
  // resumed deploy), and what a resumed deploy continues from.
  bool may_park_ = false;
  std::unique_ptr<Deferred> resumed_;
  std::map<uint64_t, std::string> config_warming_;  // the reloaded file's compiles: ticket -> key
  // Those that failed, by Compiler::key(): failures are not cached, so the apply takes
  // their diagnostics from here instead of running clang again on the main thread.
  std::map<std::string, CompileResult> config_warm_failed_;
  UniqueFd listen_fd_, epoll_fd_, signal_fd_, lock_fd_;
  struct Conn {
    UniqueFd fd;
    uid_t uid = 0;
    pid_t pid = 0;  // who connected, for the log
    std::chrono::steady_clock::time_point last;  // accepted, or its last request served
    bool parked = false;  // a deploy of it is parked: not in epoll, never idle
    uint32_t events = 0;  // what epoll watches it for; 0: not in epoll
    proto::FrameReader in;
    bool timing = false;  // a frame has begun: it must be whole by frame_by
    std::chrono::steady_clock::time_point frame_by;
    // The answer being sent (one at a time: the next request is read once it is out),
    // with its descriptors until the first byte goes; read by the peer by out_by.
    std::string out;
    size_t out_off = 0;
    std::vector<UniqueFd> out_fds;
    std::chrono::steady_clock::time_point out_by;
    bool close_after = false;  // closed once its answer is out (a bad frame's error)
  };
  std::map<int, Conn> clients_;
  size_t clients_of(uid_t uid) const;   // open connections of `uid`
  size_t clients_of_others() const;     // open connections of users other than root
  std::map<int, std::pair<UniqueFd, std::chrono::steady_clock::time_point>> rejected_;  // fd -> close by
  // Declared before the policies, so the policies (whose targets call into their hook)
  // are destroyed first.
  std::vector<std::unique_ptr<Hook>> hooks_;
  std::map<int, std::unique_ptr<Policy>> policies_;
  // The registry's indexes, so that a deploy reads the policies of its target and of its
  // application, not every policy (at 1000 policies walking them all was 27% of a
  // deploy's CPU, building each one's key string 19%). Kept by index()/unindex() beside
  // every change of policies_.
  std::map<std::string, std::set<int>> by_key_, by_app_;
  void index(Policy& p);
  void unindex(const Policy& p);
  // The ids of `app`'s policies (none: an empty set).
  const std::set<int>& policies_of(const std::string& app) const;
  // The most recently removed policies (ids only grow, so the first is the oldest), for
  // "no policy N" to say what became of N: a script removing an id that was replaced
  // or whose owner exited learns why. Shown to its uid and admins only. Those not adopted
  // at a restart count as removed; the list is kept in the state file, so a restart does
  // not forget it (`state_json`: the entry as written there).
  struct Gone {
    uid_t uid = 0;
    std::string app, name, why, state_json;
    bool ended = false;  // removed without a request (remove_policy's `ended`)
  };
  static constexpr size_t kGoneKept = 256;
  std::map<int, Gone> gone_;
  void remember_gone(int id, Gone g);
  std::string no_policy(const Caller& caller, int id) const;  // "no policy N[ (what became of it)]"
  std::map<std::string, uid_t> app_owner_;
  struct Bucket {
    double tokens = 0;
    std::chrono::steady_clock::time_point last;
  };
  std::map<uid_t, Bucket> buckets_;
  config::Config config_;
  // Identities of --config entries waiting for their process or interface: it was not
  // there at the last apply, or the entry's policy ended with it. Retried every
  // kConfigRetrySec, so a restarted server (a re-created interface) gets its policy back
  // without a reload.
  std::set<std::string> config_waiting_;
  std::chrono::steady_clock::time_point config_retry_at_;
  ConfigWatch config_watch_;
  std::string config_trigger_ = "SIGHUP";  // what started the running reload, for the log
  // What the file's versions did, for --status_file and the metrics: reads of the file
  // (good or bad), the last apply's time, the diagnostics of a refused version (empty:
  // the version read last is the one running), and each entry not deployed at its last
  // try, by identity (errno name and message).
  uint64_t config_generation_ = 0;
  double config_last_apply_unix_ = 0;
  std::vector<std::string> config_file_errors_;
  struct ConfigFailure {
    std::string kind, error;
  };
  std::map<std::string, ConfigFailure> config_failures_;
  std::chrono::steady_clock::time_point ended_check_at_;
  Recorder recorder_;
  metrics::Metrics metrics_;
  metrics::Totals totals_;
  bool ready_ = false;  // run() has begun: adopted, --config applied, serving
  int metrics_refresh_fd_ = -1;
  time_t start_time_ = time(nullptr);
  int next_id_ = 1;
};

}  // namespace syrup
