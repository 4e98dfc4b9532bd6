// The state store: the state file that lets the next syrupd adopt what this one deployed.
//
// Design: two files. The snapshot (--state_file) holds everything, as one JSON object;
// the journal (FILE.journal) the changes since, one line per change (a deploy, a removal,
// a replacement: each one record, written synchronously before the request is answered),
// appended. Rewriting the whole snapshot after every change was half of syrupd's CPU at
// 5000 policies (2 MB per deploy); a record is the size of what changed. When the journal
// outgrows the snapshot (and kJournalMinBytes) the two are compacted into a new snapshot:
// amortised, a change writes a constant number of bytes. Each policy's entry is
// serialised once (record()); read once at start (adopt_state), which then compacts.
// Invariants:
//  - both files are created 0600 (O_EXCL, never through a link) and replaced atomically
//    (a temporary file, then rename): a crash leaves the old or the new file whole;
//  - the journal's first line names the snapshot's generation (random): a journal of
//    another snapshot (a crash between the two renames of a compaction, a snapshot
//    removed by hand) is never applied;
//  - a record is one write() of one line: a torn last record (SIGKILL, a full disk) costs
//    that record alone; a line that does not parse is skipped, the others applied; a
//    write that fails compacts at once, so no record is ever appended after a torn one;
//  - neither file is read unless it is a regular file of syrupd's own uid, with one
//    link, that no other user may write (another user's file would make syrupd take
//    sockets from the processes it names);
//  - reading never ends the start: a malformed entry costs that entry (its pins are then
//    released as leftovers), an unreadable file or one of another pin root is ignored;
//  - ids are never reused, also across restarts (next_id, and the gone list, are kept).
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <stdexcept>

#include "daemon.h"
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

void Daemon::record(Policy& p) {
  if (!p.prog_id) {
    bpf_prog_info info{};
    uint32_t len = sizeof info;
    if (bpf_prog_get_info_by_fd(p.loaded->prog_fd(), &info, &len) == 0) {
      p.prog_id = info.id;
      p.insns = info.xlated_prog_len / 8;
    }
  }
  p.list_json.clear();  // its target's key may have changed (an interface renamed)
  journal_.policies.insert(p.id);  // the next record of the journal has it
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

namespace {

// The journal is compacted once it is larger than the snapshot and than this: with few
// policies a snapshot is small, and compacting after every change would be the old cost.
constexpr uint64_t kJournalMinBytes = 64 << 10;
// A state file larger than this is not read (at 10,000 policies it is about 2 MB).
constexpr off_t kStateMaxBytes = off_t{256} << 20;

std::string journal_path(const std::string& state_file) { return state_file + ".journal"; }

// A new generation: 16 random hex digits.
std::string new_generation() {
  uint64_t v = 0;
  if (getrandom(&v, sizeof v, 0) != sizeof v) v = static_cast<uint64_t>(time(nullptr)) ^ static_cast<uint64_t>(getpid());
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

int write_all(int fd, const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return n < 0 ? -errno : -ENOSPC;
    done += static_cast<size_t>(n);
  }
  return 0;
}

// `text` as file `path`, whole or not at all: a temporary beside it (created 0600 with
// O_EXCL, so neither a leftover of an older syrupd's mode nor another user's link is
// reused), then renamed over it. With `keep`, the new file's descriptor (O_APPEND) is
// returned in it. 0 or -errno.
int replace_file(const std::string& path, const std::string& text, UniqueFd* keep = nullptr) {
  std::string tmp = path + ".tmp";
  unlink(tmp.c_str());
  UniqueFd out(open(tmp.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  int r = out ? write_all(out.get(), text) : -errno;
  if (!r && rename(tmp.c_str(), path.c_str()) < 0) r = -errno;
  if (r) {
    log(LogLevel::kWarn, "cannot write %s: %s", path.c_str(), std::strerror(-r));
    unlink(tmp.c_str());
    return r;
  }
  if (keep) *keep = std::move(out);
  return 0;
}

// File `path`'s text, if it is syrupd's own to read: a regular file (not followed
// through a link) of syrupd's uid with one link, that neither its group nor others may
// write. -ENOENT when there is none; -EPERM, with `why`, when it is not syrupd's own.
int read_own_file(const std::string& path, std::string& text, std::string& why) {
  UniqueFd in(open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (!in) {
    why = std::strerror(errno);
    return errno == ENOENT ? -ENOENT : -EPERM;
  }
  struct stat st;
  if (fstat(in.get(), &st) < 0) return -errno;
  if (!S_ISREG(st.st_mode)) why = "not a regular file";
  else if (st.st_uid != geteuid()) why = "owned by uid " + std::to_string(st.st_uid) + ", not syrupd's";
  else if (st.st_mode & (S_IWGRP | S_IWOTH)) why = "writable by its group or by others";
  else if (st.st_nlink != 1) why = "it has " + std::to_string(st.st_nlink) + " links";
  else if (st.st_size > kStateMaxBytes) why = "larger than " + std::to_string(kStateMaxBytes) + " bytes";
  if (!why.empty()) return -EPERM;
  text.resize(static_cast<size_t>(st.st_size));
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = read(in.get(), text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  text.resize(done);
  return 0;
}

// The policies of a snapshot with a journal's records applied, by id where they have one
// (a malformed entry without one stays, so that adoption reports it).
struct StateImage {
  json state;
  std::vector<json> entries;
  std::vector<bool> dropped;
  std::map<int64_t, size_t> at_id;

  // An entry of the snapshot: appended, a second one of an id too (adoption refuses it).
  void add(json e) {
    int64_t id = e.is_object() && e.contains("id") && e["id"].is_number_integer() ? e["id"].get<int64_t>() : 0;
    if (id) at_id.emplace(id, entries.size());  // the first of its id
    entries.push_back(std::move(e));
    dropped.push_back(false);
  }
  // An entry of the journal: it replaces the one of its id.
  void put(json e) {
    int64_t id = e.is_object() && e.contains("id") && e["id"].is_number_integer() ? e["id"].get<int64_t>() : 0;
    if (auto it = at_id.find(id); id && it != at_id.end()) entries[it->second] = std::move(e);
    else add(std::move(e));
  }
  void drop(int64_t id) {
    if (auto it = at_id.find(id); it != at_id.end()) {
      dropped[it->second] = true;
      at_id.erase(it);
    }
  }
  // One record of the journal (Daemon::save_state()); false: not one.
  bool apply(const json& rec) {
    if (!rec.is_object()) return false;
    if (rec.contains("next_id") && rec["next_id"].is_number_integer() &&
        (!state.contains("next_id") || !state["next_id"].is_number_integer() ||
         rec["next_id"].get<int64_t>() > state["next_id"].get<int64_t>()))
      state["next_id"] = rec["next_id"];
    if (rec.contains("apps") && rec["apps"].is_object()) {
      if (!state.contains("apps") || !state["apps"].is_object()) state["apps"] = json::object();
      for (auto& [app, uid] : rec["apps"].items()) {
        if (uid.is_null()) state["apps"].erase(app);
        else state["apps"][app] = uid;
      }
    }
    if (rec.contains("del") && rec["del"].is_array())
      for (auto& id : rec["del"])
        if (id.is_number_integer()) drop(id.get<int64_t>());
    if (rec.contains("put") && rec["put"].is_array())
      for (auto& e : rec["put"]) put(e);
    if (rec.contains("gone") && rec["gone"].is_array()) {
      if (!state.contains("gone") || !state["gone"].is_array()) state["gone"] = json::array();
      for (auto& g : rec["gone"]) state["gone"].push_back(g);
    }
    return true;
  }
};

// The journal's records applied to `img`, if the journal is syrupd's own and names the
// snapshot's generation. A line that does not parse is skipped (logged); so is a last
// line without its newline, a record torn by a crash.
void read_journal(const std::string& path, StateImage& img) {
  std::string text, why;
  if (int r = read_own_file(path, text, why)) {
    if (r != -ENOENT) log(LogLevel::kWarn, "ignoring the state journal %s: %s", path.c_str(), why.c_str());
    return;
  }
  const json& gen = img.state.contains("generation") ? img.state["generation"] : json();
  size_t nl = text.find('\n');
  json head = json::parse(text.substr(0, nl), nullptr, false);
  if (nl == std::string::npos || !gen.is_string() || !head.is_object() || head.value("journal", json()) != 1 ||
      head.value("generation", json()) != gen) {
    log(LogLevel::kInfo, "ignoring the state journal %s: it is not of the state file's generation", path.c_str());
    return;
  }
  int applied = 0;
  for (size_t at = nl + 1, line = 2; at < text.size(); line++) {
    size_t end = text.find('\n', at);
    if (end == std::string::npos) {
      log(LogLevel::kWarn, "ignoring the last record of the state journal %s (line %zu): it is torn (%zu bytes, no "
          "end of line)", path.c_str(), line, text.size() - at);
      break;
    }
    if (img.apply(json::parse(text.substr(at, end - at), nullptr, false))) applied++;
    else log(LogLevel::kWarn, "ignoring record %zu of the state journal %s: it is malformed", line, path.c_str());
    at = end + 1;
  }
  log(LogLevel::kInfo, "applied %d records of the state journal %s", applied, path.c_str());
}

}  // namespace

void Daemon::save_state() {
  // While adoption reads the files, nothing is written; its end compacts.
  if (journal_.held) return;
  if (!journal_.fd) {
    compact_state();
    return;
  }
  if (journal_.policies.empty() && journal_.gone.empty()) return;
  // One record, one line: {"next_id":N,"put":[entry...],"del":[id...],"gone":[...],
  // "apps":{app:uid|null}}. A policy changed is put with its entry as record() made it,
  // or deleted if it is no longer registered (or its target cannot be saved); the owners
  // of the applications of what changed go with it (null: the application is gone).
  std::string put, del, gone;
  std::set<std::string> apps;
  for (int id : journal_.policies) {
    auto it = policies_.find(id);
    if (it != policies_.end() && !it->second->state_json.empty()) {
      put += (put.empty() ? "" : ",") + it->second->state_json;
      apps.insert(it->second->app);
    } else {
      del += (del.empty() ? "" : ",") + std::to_string(id);
    }
  }
  for (int id : journal_.gone)
    if (auto it = gone_.find(id); it != gone_.end()) {
      gone += (gone.empty() ? "" : ",") + it->second.state_json;
      apps.insert(it->second.app);
    }
  json owners = json::object();
  for (const auto& app : apps) {
    auto it = app_owner_.find(app);
    owners[app] = it == app_owner_.end() ? json() : json(it->second);
  }
  std::string text = "{\"next_id\":" + std::to_string(next_id_) + ",\"put\":[" + put + "],\"del\":[" + del +
                     "],\"gone\":[" + gone + "],\"apps\":" + state_entry(owners) + "}\n";
  journal_.policies.clear();
  journal_.gone.clear();
  if (int r = write_all(journal_.fd.get(), text)) {
    // Part of the record may be in the file: nothing may follow it there.
    log(LogLevel::kWarn, "cannot append to the state journal %s: %s; writing the whole state instead",
        journal_path(cfg_.state_file).c_str(), std::strerror(-r));
    journal_.fd.reset();
    compact_state();
    return;
  }
  journal_.bytes += text.size();
  if (journal_.bytes > std::max(journal_.snapshot_bytes, kJournalMinBytes)) compact_state();
}

// The snapshot written whole, with a new generation, and a new journal naming it. 0 or
// -errno (then the next change tries again).
int Daemon::compact_state() {
  journal_.fd.reset();
  journal_.policies.clear();
  journal_.gone.clear();
  std::string generation = new_generation();
  json apps = json::object();
  for (auto& [a, uid] : app_owner_) apps[a] = uid;
  json head = {{"version", 1},     {"bpffs_root", pins::root()}, {"generation", generation},
               {"next_id", next_id_}, {"apps", apps}};
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
  // Snapshot first: a crash before the journal is replaced leaves a journal of the old
  // generation, which the new snapshot already contains and the next start ignores.
  if (int r = replace_file(cfg_.state_file, text)) return r;
  journal_.snapshot_bytes = text.size();
  std::string jhead = state_entry(json{{"journal", 1}, {"generation", generation}}) + "\n";
  if (int r = replace_file(journal_path(cfg_.state_file), jhead, &journal_.fd)) return r;
  journal_.generation = generation;
  journal_.bytes = jhead.size();
  return 0;
}

void Daemon::adopt_state() {
  // The files are syrupd's own, but they outlive the binary that wrote them and can be
  // edited by hand: a field of the wrong type costs its entry (whose pins the caller
  // then releases as leftovers), never the start.
  auto read_at = std::chrono::steady_clock::now();
  std::string text, why;
  // Nothing is written until adoption is done (its own removals included): the files
  // are what it reads. The start's first change then compacts.
  struct Release {
    bool& held;
    ~Release() { held = false; }
  } release{journal_.held};
  if (int r = read_own_file(cfg_.state_file, text, why)) {
    if (r != -ENOENT) log(LogLevel::kWarn, "ignoring the state file %s: %s", cfg_.state_file.c_str(), why.c_str());
    return;
  }
  StateImage img;
  img.state = json::parse(text, nullptr, false);
  json& state = img.state;
  auto field = [](const json& o, const char* k, json::value_t t) {
    return o.is_object() && o.contains(k) && o[k].type() == t;
  };
  if (!state.is_object() || state.value("version", json()) != 1 ||
      state.value("bpffs_root", json()) != pins::root()) {
    log(LogLevel::kWarn, "ignoring the state file %s (unreadable or for another pin root)", cfg_.state_file.c_str());
    return;
  }
  if (field(state, "policies", json::value_t::array))
    for (auto& e : state["policies"]) img.add(std::move(e));
  read_journal(journal_path(cfg_.state_file), img);
  auto read_took = std::chrono::steady_clock::now() - read_at;
  if (state.contains("next_id") && state["next_id"].is_number_integer())
    next_id_ = std::max<int64_t>(next_id_, std::min<int64_t>(state["next_id"].get<int64_t>(), INT32_MAX));
  const json no_apps = json::object();
  const json& apps = field(state, "apps", json::value_t::object) ? state["apps"] : no_apps;
  int skipped = field(state, "gone", json::value_t::array) ? adopt_gone(state["gone"]) : 0;
  int adopted = 0, entry = 0;
  std::vector<int> owner_gone;
  // Where the time goes, per phase over all policies (logged): a restart's cost is mostly
  // this loop, and its parts scale differently.
  using Clock = std::chrono::steady_clock;
  Clock::duration took[4]{};  // pins and hook, owner, record, release
  auto phase = [&, t = Clock::now()](int i) mutable {
    auto now = Clock::now();
    took[i] += now - t;
    t = now;
  };
  std::map<pid_t, uint64_t> start_times;  // an owner's start time, read once per owner
  pins::RootHeld root;  // two pins of each policy opened from one descriptor of the root
  for (size_t i = 0; i < img.entries.size(); i++) {
    if (img.dropped[i]) continue;
    const json& s = img.entries[i];
    auto pol = std::make_unique<Policy>();
    std::string err, malformed;  // malformed: what was wrong with the entry
    entry++;
    phase(3);
    int r = adopt_entry(s, apps, *pol, err, malformed);
    phase(0);
    if (r) {
      not_adopted(*pol, r, entry, err, malformed);
      continue;
    }
    next_id_ = std::max(next_id_, pol->id + 1);  // ids are never reused, even if next_id was lost
    if (pol->owner_pid) {
      pol->owner_pidfd = owner_fd(pol->owner_pid);
      // The same process, not a new one that reused its pid (its pidfd, open now, keeps
      // the pid from being reused while the start time is read).
      auto st = start_times.find(pol->owner_pid);
      if (pol->owner_pidfd && st == start_times.end())
        st = start_times.emplace(pol->owner_pid, process_start_time(pol->owner_pid)).first;
      if (pol->owner_pidfd && st->second != pol->owner_start) pol->owner_pidfd.reset();
    }
    phase(1);
    record(*pol);
    phase(2);
    pol->loaded->release();
    int id = pol->id;
    if (pol->owner_pid && !pol->owner_pidfd) owner_gone.push_back(id);
    index(*pol);
    policies_.emplace(id, std::move(pol));
    adopted++;
  }
  phase(3);
  for (int id : owner_gone) remove_policy(id, true, "its owner exited while syrupd was down", true);
  if (!gone_.empty()) next_id_ = std::max(next_id_, gone_.rbegin()->first + 1);
  if (skipped)
    log(LogLevel::kWarn, "skipped %d malformed entries of removed policies in the state file %s", skipped,
        cfg_.state_file.c_str());
  auto ms = [](Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); };
  log(LogLevel::kInfo,
      "adopted %d policies of the previous syrupd from %s (read in %.0f ms; pins and hooks %.0f ms, owners %.0f ms, "
      "records %.0f ms, the rest %.0f ms)",
      adopted, cfg_.state_file.c_str(), ms(read_took), ms(took[0]), ms(took[1]), ms(took[2]), ms(took[3]));
}

// One policy entry `s` of the state file, read into `pol` with its pins and attachment
// adopted (`apps`: the file's application owners). 0, or -errno with `err`; `malformed`
// says what was wrong with the entry's JSON, if that was it.
int Daemon::adopt_entry(const json& s, const json& apps, Policy& pol, std::string& err, std::string& malformed) {
  int r = 0;
  const char* reading = "";   // the field being read, for the error
  auto get = [&](const char* k, auto fallback) {
    reading = k;
    return s.value(k, fallback);
  };
  try {
    if (!s.is_object()) throw std::invalid_argument("not a JSON object");
    pol.id = get("id", 0);
    pol.app = get("app", std::string());
    pol.hook = get("hook", std::string());
    pol.name = get("name", std::string());
    pol.uid = get("uid", 0u);
    pol.owner_pid = get("owner_pid", 0);
    pol.owner_start = get("owner_start", uint64_t{0});
    pol.params = get("params", std::map<std::string, uint64_t>{});
    pol.created = get("created", time_t{0});
    pol.config_identity = get("config_identity", std::string());
    pol.config_hash = get("config_hash", std::string());
    auto user_maps = get("user_maps", std::vector<std::string>{});
    auto system_maps = get("system_maps", std::vector<std::string>{});
    Hook* hook = hook_named(pol.hook);
    if (pol.id <= 0) r = -EINVAL, err = "its entry in the state file has no policy id";
    else if (policies_.count(pol.id)) r = -EEXIST, err = "an earlier entry of the state file has its id";
    else if (!hook) r = -EOPNOTSUPP, err = "unknown hook '" + pol.hook + "'";
    if (!r) r = adopt_policy(pol.app, pol.id, user_maps, system_maps, pol.loaded, err);
    reading = "target";
    if (!r) r = hook->adopt(get("target", json::object()), *pol.loaded, pol.target, err);
    reading = "apps";
    if (!r) app_owner_[pol.app] = apps.value(pol.app, pol.uid);
  } catch (const std::exception& e) {  // json's type errors; not an object
    malformed = e.what();  // "[json.exception.type_error.302] type must be ..."
    if (auto b = malformed.find("] "); b != std::string::npos) malformed.erase(0, b + 2);
    if (*reading) malformed = reading + (": " + malformed);
    r = -EINVAL;
    err = "its entry in the state file is malformed (" + malformed + ")";
  }
  return r;
}

// The state file's list of removed policies: remembered. How many entries were malformed.
int Daemon::adopt_gone(const json& gone) {
  int skipped = 0;
  for (auto& g : gone) try {
      if (g.value("id", 0) > 0)
        remember_gone(g.value("id", 0), Gone{g.value("uid", 0u), g.value("app", std::string()),
                                             g.value("name", std::string()), g.value("why", std::string()), {},
                                             g.value("ended", false)});
    } catch (const json::exception&) {
      skipped++;
    }
  return skipped;
}

// Why entry `entry` (policy `pol`, as far as it was read) of the state file was not
// adopted: logged, and remembered as removed unless an adopted policy has its id.
void Daemon::not_adopted(const Policy& pol, int r, int entry, const std::string& err, const std::string& malformed) {
  if (pol.id > 0) {
    log(LogLevel::kWarn, "cannot adopt policy %d (%s) of app '%s': %s", pol.id, pol.name.c_str(),
        pol.app.c_str(), err.c_str());
    if (r != -EEXIST)  // the policy of that id was adopted
      remember_gone(pol.id, Gone{pol.uid, pol.app, pol.name, "not adopted when syrupd restarted: " + err, {}, true});
  } else {
    log(LogLevel::kWarn, "cannot adopt entry %d of the state file's policies: %s", entry,
        malformed.empty() ? err.c_str() : ("it is malformed (" + malformed + ")").c_str());
  }
}

}  // namespace syrup
