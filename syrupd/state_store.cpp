// The state store: the state file that lets the next syrupd adopt what this one deployed.
//
// Design: written whole after every change (save_state, through a temporary file and a
// rename), each policy's entry serialised once (record()) so a write stays cheap with
// thousands of policies; read once at start (adopt_state).
// Invariants:
//  - the file is created 0600, never followed through a link, and replaced atomically: a
//    crash leaves the old or the new file, never half of one;
//  - reading never ends the start: a malformed entry costs that entry (its pins are then
//    released as leftovers), an unreadable file or one of another pin root is ignored;
//  - ids are never reused, also across restarts (next_id, and the gone list, are kept).
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
  int skipped = field(state, "gone", json::value_t::array) ? adopt_gone(state["gone"]) : 0;
  int adopted = 0, entry = 0;
  const json no_policies = json::array();
  for (auto& s : field(state, "policies", json::value_t::array) ? state["policies"] : no_policies) {
    auto pol = std::make_unique<Policy>();
    std::string err, malformed;  // malformed: what was wrong with the entry
    entry++;
    int r = adopt_entry(s, apps, *pol, err, malformed);
    if (r) {
      not_adopted(*pol, r, entry, err, malformed);
      continue;
    }
    next_id_ = std::max(next_id_, pol->id + 1);  // ids are never reused, even if next_id was lost
    if (pol->owner_pid) {
      pol->owner_pidfd = owner_fd(pol->owner_pid);
      // The same process, not a new one that reused its pid.
      if (pol->owner_pidfd && process_start_time(pol->owner_pid) != pol->owner_start) pol->owner_pidfd.reset();
    }
    record(*pol);
    pol->loaded->release();
    int id = pol->id;
    bool owner_gone = pol->owner_pid && !pol->owner_pidfd;
    index(*pol);
    policies_.emplace(id, std::move(pol));
    adopted++;
    if (owner_gone) remove_policy(id, true, "its owner exited while syrupd was down", true);
  }
  if (!gone_.empty()) next_id_ = std::max(next_id_, gone_.rbegin()->first + 1);
  if (skipped)
    log(LogLevel::kWarn, "skipped %d malformed entries of removed policies in the state file %s", skipped,
        cfg_.state_file.c_str());
  log(LogLevel::kInfo, "adopted %d policies of the previous syrupd from %s", adopted, cfg_.state_file.c_str());
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
