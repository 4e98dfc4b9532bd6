// The request handlers other than deploy (deploy.cpp): ping, remove, list, stats,
// map_open, map_dump, thread_tid, and the dispatch that routes a request to them.
//
// Invariants: a request of the wrong shape is answered, never ends syrupd (handle());
// every refusal is one error naming the field or limit; another user's policy or
// application is answered as one that does not exist; a map dump, a list and a stats are
// one bounded page per request.
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
#include "registry.h"
#include "syrup/abi.h"
#include "syrup/recording.h"
#include "text.h"

namespace syrup {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// A page's cursor (hex bytes, spaces allowed) into `key`, which has the map's key size.
bool parse_cursor(std::string c, std::vector<unsigned char>& key) {
  std::erase(c, ' ');
  bool good = c.size() == 2 * key.size() && std::all_of(c.begin(), c.end(), ::isxdigit);
  for (size_t i = 0; good && i < key.size(); i++) key[i] = static_cast<unsigned char>(std::stoi(c.substr(2 * i, 2), nullptr, 16));
  return good;
}

}  // namespace

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
    if (op == "list") return list(caller, b);
    if (op == "stats") return stats(caller, b);
    if (op == "map_open") return map_open(caller, b);
    if (op == "map_dump") return map_dump(caller, b);
    if (op == "thread_tid") return thread_tid(caller, b);
    if (op == "record") return record(caller, b);
    if (op == "record_stop") return record_stop(caller, b);
    if (op == "test_run") return test_run(caller, req);
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

Daemon::Response Daemon::remove(const Caller& caller, const json& req) {
  if (!req.contains("id") || !req["id"].is_number_integer())
    return {proto::error_response(EINVAL, "remove needs a policy id")};
  Response refusal;
  Policy* p = visible_policy(caller, req["id"], refusal);
  if (!p) return refusal;
  int id = p->id;
  remove_policy(id, true, ("removed by pid " + std::to_string(caller.pid)).c_str());
  return {ok({{"id", id}})};
}

// The page of `list` or `stats` that `req` asks for: the caller's policies with ids above
// "after" (default 0), at most "limit" (default and most kListPage) of them, each as
// `entry` makes it, into `arr`. A 10,000-policy answer in one piece would hold the main
// loop (and everyone else's request) for its whole build and could pass the 4 MiB frame
// limit; a page bounds both. "next" (the page's last id) is set when more may follow: it
// names only a policy the caller sees. 0, or the error to answer.
std::optional<Daemon::Response> Daemon::page(const Caller& caller, const json& req, json& next,
                                             const std::function<void(const Policy&)>& entry) const {
  int64_t after = 0, limit = kListPage;
  if (req.contains("after"))
    if (std::string why = names::integer("after", req["after"], 0, INT32_MAX, after); !why.empty())
      return Response{proto::error_response(EINVAL, why)};
  if (req.contains("limit"))
    if (std::string why = names::integer("limit", req["limit"], 1, kListPage, limit); !why.empty())
      return Response{proto::error_response(EINVAL, why)};
  int64_t n = 0, last = 0;
  for (auto it = policies_.upper_bound(static_cast<int>(after)); it != policies_.end(); ++it) {
    if (!visible(caller, *it->second)) continue;
    if (n++ == limit) {
      next = last;
      break;
    }
    entry(*it->second);
    last = it->first;
  }
  return std::nullopt;
}

// A list page is most of what `list` costs: each entry is spliced from its policy's
// serialised fixed fields and its target's live state, not built as JSON and serialised
// whole (16 us of syrupd's CPU per policy before).
Daemon::Response Daemon::list(const Caller& caller, const json& req) {
  json next;
  std::string entries;
  if (auto err = page(caller, req, next, [&](const Policy& p) {
        entries += entries.empty() ? '[' : ',';
        list_entry(p, entries);
      }))
    return std::move(*err);
  if (entries.empty()) entries = "[";
  entries += ']';
  // What ended without a request (its owner exited, its sockets all closed), so that the
  // user sees why a policy is no longer listed, not only syrupd's log; to whom `no_policy`
  // would say it. At most 256 (gone_'s bound), on every page.
  json ended = json::array();
  for (auto& [id, g] : gone_)
    if (g.ended && (caller.admin() || g.uid == caller.uid))
      ended.push_back({{"id", id}, {"app", g.app}, {"name", g.name}, {"why", g.why}});
  json out = ok({{"ended", std::move(ended)}});
  if (!next.is_null()) out["next"] = next;
  Response resp{ok()};
  resp.raw = state_entry(out);
  resp.raw.back() = ',';  // its closing brace: the policies follow
  resp.raw += "\"policies\":" + entries + '}';
  return resp;
}

// Spliced as list is: each entry's fixed fields serialised once, its counters as text.
Daemon::Response Daemon::stats(const Caller& caller, const json& req) {
  json next;
  std::string entries;
  bool runs_counted = bpf_stats_enabled();  // once per page
  auto entry = [&](const Policy& p) {
    entries += entries.empty() ? '[' : ',';
    stats_entry(p, runs_counted, entries);
  };
  if (req.contains("id") && !req["id"].is_null()) {
    Response refusal;
    Policy* p = visible_policy(caller, req["id"], refusal);
    if (!p) return refusal;
    entry(*p);
  } else if (auto err = page(caller, req, next, entry)) {
    return std::move(*err);
  }
  if (entries.empty()) entries = "[";
  entries += ']';
  json out = ok();
  if (!next.is_null()) out["next"] = next;
  Response resp{ok()};
  resp.raw = state_entry(out);
  resp.raw.back() = ',';  // its closing brace: the entries follow
  resp.raw += "\"stats\":" + entries + '}';
  return resp;
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
    if (!parse_cursor(c, key))
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
    entries.push_back(dump_entry(key, val, percpu ? ncpu : 0, vstride, info.value_size));
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

namespace syrup {

Policy* Daemon::visible_policy(const Caller& caller, const json& id, Response& refusal) {
  int64_t v;
  if (std::string why = names::integer("id", id, 1, INT32_MAX, v); !why.empty()) {
    refusal = {proto::error_response(EINVAL, why)};
    return nullptr;
  }
  auto it = policies_.find(static_cast<int>(v));
  if (it == policies_.end() || !visible(caller, *it->second)) {
    refusal = {proto::error_response(ENOENT, no_policy(caller, static_cast<int>(v)))};
    return nullptr;
  }
  return it->second.get();
}

Daemon::Response Daemon::record(const Caller& caller, const json& req) {
  Response refusal;
  const Policy* found = visible_policy(caller, req.contains("id") ? req["id"] : json(), refusal);
  if (!found) return refusal;
  std::string err;
  RecordRequest rr;
  if (int r = parse_record_request(req, recorder_.limits(), rr, err)) return {proto::error_response(-r, err)};
  const Policy& p = *found;
  const HookSpec* spec = find_hook(p.hook);
  RecordSource src{p.id, spec ? spec->abi_id : 0, p.target->num_executors(), p.name, p.app,
                   p.loaded->map_fd(kRecCtlMap), p.loaded->map_fd(kRecRingMap)};
  UniqueFd out;
  if (int r = recorder_.start(src, rr, out, err)) return {proto::error_response(-r, err)};
  Response resp{ok({{"id", p.id}, {"seconds", rr.seconds}, {"max_bytes", rr.max_bytes}})};
  resp.owned_fds.push_back(std::move(out));
  resp.fds.push_back(resp.owned_fds.back().get());
  return resp;
}

Daemon::Response Daemon::record_stop(const Caller& caller, const json& req) {
  Response refusal;
  const Policy* p = visible_policy(caller, req.contains("id") ? req["id"] : json(), refusal);
  if (!p) return refusal;
  if (!recorder_.stop(p->id, SYR_REC_END_STOPPED))
    return {proto::error_response(ENOENT, "policy " + std::to_string(p->id) + " is not being recorded")};
  return {ok({{"id", p->id}})};
}

}  // namespace syrup
