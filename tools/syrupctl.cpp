// syrupctl: the operator's command line for syrupd.
//
// Exit codes: 0 success; 1 syrupd refused or failed the request (its message is printed);
// 2 usage error; 3 syrupd could not be reached.
#include <gflags/gflags.h>
#include <arpa/inet.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cli.h"
#include "cmd_record.h"
#include "commands.h"
#include "client.h"
#include "config.h"
#include "names.h"
#include "protocol.h"
#include "registry.h"

DEFINE_string(socket, "", "syrupd's control socket (default: $SYRUP_SOCKET or /run/syrup/syrupd.sock)");
DEFINE_bool(json, false, "print syrupd's answer as JSON, for scripts");
DEFINE_string(hook, "socket-select", "deploy: the hook (syrupctl --help lists them)");
DEFINE_int64(pid, 0, "deploy: the process whose sockets (or, --hook thread, threads) to schedule");
DEFINE_string(cgroup, "",
              "deploy: instead of --pid, a cgroup v2 path as /proc/PID/cgroup's 0:: line prints it "
              "(e.g. /system.slice/nginx.service): its processes' sockets, threads (also of those that join "
              "later) or, --hook xdp, ports");
DEFINE_int64(port, 0, "deploy: the port its SO_REUSEPORT sockets are bound to (socket-lookup: the first port steered)");
DEFINE_int64(port_end, 0, "deploy --hook socket-lookup: the last port steered (default: --port alone)");
DEFINE_string(protocol, "", "deploy: udp or tcp (default: udp if the process has both)");
DEFINE_string(address, "",
              "deploy --hook socket-select: the address the group's sockets are bound to, when the process "
              "has several groups on the port (e.g. 127.0.0.1, ::)");
DEFINE_string(app, "", "application name (deploy: default the process's name; map: required)");
DEFINE_string(params, "", "deploy: policy parameters, NAME=VALUE[,NAME=VALUE...]");
DEFINE_bool(persist, false,
            "deploy --hook xdp --pid: keep the policy when the process exits (socket-select and thread "
            "policies end with their process)");
DEFINE_int32(limit, 4096, "map dump: most entries to print");
DEFINE_string(by, "", "stats: sum over policies per 'tenant' (application) or per 'hook'");
DEFINE_string(ifname, "", "deploy --hook xdp: the interface");
DEFINE_uint64(max_source_bytes, 1 << 20,
              "validate: largest policy file, in bytes; give syrupd's --max_source_bytes so the "
              "check matches what syrupd will accept");
DEFINE_string(cpus, "", "deploy --hook xdp: executor cores, CPU[,CPU...] (default: every core)");

namespace {

constexpr int kExitFailed = 1, kExitUsage = 2, kExitUnreachable = 3;

// The deploy lines come from the hook registry (hooks/registry.h), one per hook.
std::string usage_text() {
  std::string deploys, hooks;
  for (const syrup::HookSpec* s : syrup::hook_specs()) {
    deploys += std::string("  ") + s->usage + "\n";
    hooks += std::string("  ") + s->name + std::string(16 - std::min<size_t>(15, strlen(s->name)), ' ') + s->summary + "\n";
  }
  return "control the Syrup daemon.\n\n"
         "Usage:\n" + deploys +
         "  syrupctl remove ID\n"
         "  syrupctl list\n"
         "  syrupctl stats [ID] [--by tenant|hook]\n"
         "  syrupctl map dump --app APP MAP\n" + std::string(syrupctl::kRecordUsage) +
         "  syrupctl ping\n"
         "  syrupctl test POLICY.c CASES.yaml [--hook H] [--seed N]\n"
         "                                run a policy's unit tests in syrupd (docs/testing-policies.md)\n"
         "  syrupctl replay POLICY.c RECORDING [--seed N]\n"
         "                                run a policy over a recording; what moved (docs/recording.md)\n"
         "  syrupctl top [--once]         live decisions per second of the policies you may see\n"
         "  syrupctl validate [--max_source_bytes N] FILE\n"
         "                                check a syrupd --config file (no syrupd needed)\n\n"
         "Global: --json (machine-readable output), --socket PATH.\n"
         "Exit codes: 0 ok, 1 syrupd refused or failed, 2 usage, 3 syrupd unreachable.\n\n"
         "Hooks (--hook):\n" + hooks;
}

int usage(const std::string& why) {
  std::fprintf(stderr, "syrupctl: %s\n(see syrupctl --help)\n", why.c_str());
  return kExitUsage;
}

std::string socket_path() {
  if (!FLAGS_socket.empty()) return FLAGS_socket;
  const char* e = std::getenv("SYRUP_SOCKET");
  return e && *e ? e : syrup::proto::kDefaultSocket;
}

// syrupd could not be asked: says so (with --json as a JSON error object on stdout, the
// shape of syrupd's own errors, so a script reads one format) and returns exit code 3.
int unreachable(const std::string& why) {
  if (FLAGS_json)
    std::cout << nlohmann::json{{"ok", false}, {"errno", ECONNREFUSED}, {"error", why}, {"unreachable", true}}.dump(2)
              << "\n";
  std::fprintf(stderr, "syrupctl: %s\n", why.c_str());
  return kExitUnreachable;
}

// Sends `req`; on success returns 0 with the body in `out`, else prints and returns the
// exit code. `rate_waits`: how many times to wait 20 ms and ask again while syrupd says
// the caller is over its request rate (a paged map dump asks many times).
int call(const nlohmann::json& req, nlohmann::json& out, int rate_waits = 0) {
  syrup::Message resp;
  for (;;) {
    syrup::Client c;
    if (c.connect(socket_path()) || c.call(req, resp)) return unreachable(c.error());
    if (rate_waits-- <= 0 || resp.body.value("ok", false) || resp.body.value("errno", 0) != EAGAIN) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  out = resp.body;
  std::string err;
  if (syrup::response_status(resp, err)) {
    if (FLAGS_json)
      std::cout << out.dump(2) << "\n";
    else
      std::fprintf(stderr, "syrupctl: %s\n", err.c_str());
    return kExitFailed;
  }
  return 0;
}

std::string process_name(int pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/comm");
  std::string s;
  std::getline(in, s);
  return syrup::names::application_from(s);
}

// The ranges of syrupctl's integer flags (cli::parse_flags checks them): what syrupd takes.
// (--pid, --port and the other fields of a deploy are its hook's: hook_fields() checks them.)
const std::vector<syrup::cli::IntRange> kRanges = {{"limit", 0, INT32_MAX}};

// Why `name`, given as `flag`, is not a valid `what` name, or empty.
std::string bad_name(const char* flag, const char* what, const std::string& name, syrup::names::Kind k) {
  std::string why = syrup::names::check(what, name, k);
  return why.empty() ? why : std::string(flag) + ": " + why;
}

bool given(const char* flag) { return !gflags::GetCommandLineFlagInfoOrDie(flag).is_default; }

// The deploy's hook fields from the flags given, as the protocol spells them, checked by
// the hook's parse() (hooks/hook_request.h): a bad value is refused in syrupd's words,
// naming its flag. On success `out` holds them as syrupd takes them. Why not, or empty.
std::string hook_fields(const syrup::HookSpec& spec, nlohmann::json& out) {
  nlohmann::json f = nlohmann::json::object();
  if (given("pid")) f["pid"] = FLAGS_pid;
  if (given("port")) f["port"] = FLAGS_port;
  if (given("port_end")) f["port_end"] = FLAGS_port_end;
  for (auto [key, v] : {std::pair{"protocol", &FLAGS_protocol}, {"address", &FLAGS_address}, {"ifname", &FLAGS_ifname},
                                  {"cgroup", &FLAGS_cgroup}})
    if (given(key)) f[key] = *v;
  if (given("cpus")) {
    // CPU numbers as numbers (so a huge one is quoted as given), anything else as text.
    f["cpus"] = nlohmann::json::array();
    std::stringstream cs(FLAGS_cpus);
    for (std::string c; std::getline(cs, c, ',');) {
      int64_t v;
      if (syrup::cli::integer_in(c, 0, INT64_MAX, v)) f["cpus"].push_back(v);
      else f["cpus"].push_back(c);
    }
  }
  syrup::Bad bad;
  if (!spec.check(f, bad, &out)) return "--" + bad.key + ": " + bad.why;
  if (f.contains("pid")) out["pid"] = f["pid"];
  // syrupd takes cores 0 .. min(possible CPUs, 256) - 1, in its words.
  long ncpu = std::min(sysconf(_SC_NPROCESSORS_CONF), 256L);
  for (auto& c : out.value("cpus", nlohmann::json::array()))
    if (c.get<int64_t>() >= ncpu)
      return "--cpus: must be cores 0.." + std::to_string(ncpu - 1) + " (this machine's), got " + c.dump();
  return {};
}

// A deploy by --cgroup names its application after the cgroup's last name
// ("/system.slice/nginx.service": nginx.service) when that is a valid application name.
std::string cgroup_app(const std::string& cgroup) {
  std::string last = cgroup.substr(cgroup.rfind('/') + 1);
  if (last.empty() || !syrup::names::check("application", last, syrup::names::Kind::kPinned).empty()) return "syrupctl";
  return last;
}

int cmd_deploy(const std::vector<std::string>& args) {
  if (args.size() != 1) return usage("deploy takes exactly one POLICY.c");
  using syrup::names::Kind;
  if (!FLAGS_app.empty())
    if (std::string why = bad_name("--app", "application", FLAGS_app, Kind::kPinned); !why.empty()) return usage(why);
  if (std::string why = bad_name("POLICY.c", "source", args[0], Kind::kDisplay); !why.empty()) return usage(why);
  // Closed sets, checked before syrupd is asked: a typo is a usage error naming the flag.
  auto one_of = [](const char* flag, const std::string& v, const std::vector<const char*>& known) {
    std::string list;
    for (const char* k : known) {
      if (v == k) return std::string();
      list += (list.empty() ? "" : ", ") + std::string(k);
    }
    return std::string(flag) + " takes one of " + list + ", got '" + syrup::names::printable(v) + "'";
  };
  std::vector<const char*> hooks;
  for (const syrup::HookSpec* s : syrup::hook_specs()) hooks.push_back(s->name);
  if (std::string why = one_of("--hook", FLAGS_hook, hooks); !why.empty())
    return usage(why);
  bool thread_hook = FLAGS_hook == "thread";  // --pid alone: every thread of the process
  bool xdp_hook = FLAGS_hook == "xdp";  // --pid optional: without it the policy persists
  bool process = given("pid") || given("cgroup");
  if (thread_hook && !process) return usage("deploy --hook thread needs --pid PID or --cgroup PATH");
  if (xdp_hook && (!given("ifname") || !(given("port") || given("cgroup"))))
    return usage("deploy --hook xdp needs --ifname IF and --port PORT (or --cgroup PATH)");
  if (!thread_hook && !xdp_hook && (!process || !given("port")))
    return usage("deploy from the command line needs --pid PID (or --cgroup PATH) and --port PORT "
                 "(applications deploy with libsyrup and pass their sockets)");
  nlohmann::json fields;
  if (std::string why = hook_fields(*syrup::find_hook(FLAGS_hook), fields); !why.empty()) return usage(why);
  std::ifstream in(args[0], std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "syrupctl: cannot read policy file %s: %s\n", args[0].c_str(), std::strerror(errno));
    return kExitFailed;
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  // Refused here, before syrupd is reached: a source larger than a frame could not even be
  // sent ("Message too long").
  if (std::string why = syrup::names::source_size(ss.str().size(), FLAGS_max_source_bytes,
                                                  "syrupctl --max_source_bytes, " +
                                                      std::to_string(syrup::names::kDefaultMaxSourceBytes) +
                                                      " unless set: give syrupd's");
      !why.empty()) {
    std::fprintf(stderr, "syrupctl: %s: %s\n", args[0].c_str(), why.c_str());
    return kExitFailed;
  }
  nlohmann::json params = nlohmann::json::object();
  std::stringstream ps(FLAGS_params);
  for (std::string kv; std::getline(ps, kv, ',');) {
    auto eq = kv.find('=');
    if (eq == std::string::npos || eq == 0)
      return usage("--params entries are NAME=VALUE, got '" + syrup::names::printable(kv) + "'");
    std::string k = kv.substr(0, eq), text = kv.substr(eq + 1);
    if (std::string why = bad_name("--params", "parameter", k, Kind::kParam); !why.empty()) return usage(why);
    // Digits only: stoull would read "-1" as 18446744073709551615.
    bool hex = text.starts_with("0x") || text.starts_with("0X");
    std::string digits = text.substr(hex ? 2 : 0);
    bool ok = !digits.empty() && std::all_of(digits.begin(), digits.end(), [&](char c) {
      return hex ? std::isxdigit(static_cast<unsigned char>(c)) : std::isdigit(static_cast<unsigned char>(c));
    });
    errno = 0;
    unsigned long long v = ok ? std::strtoull(text.c_str(), nullptr, hex ? 16 : 10) : 0;
    if (!ok || errno == ERANGE)
      return usage("--params: the value of '" + k + "' must be an integer in 0.." + std::to_string(UINT64_MAX) +
                   ", got '" + syrup::names::printable(text) + "'");
    params[k] = v;
  }
  nlohmann::json req = {{"op", "deploy"},
                        {"hook", FLAGS_hook},
                        {"app", !FLAGS_app.empty() ? FLAGS_app
                                : FLAGS_pid > 0    ? process_name(FLAGS_pid)
                                                   : cgroup_app(FLAGS_cgroup)},
                        {"name", args[0]},
                        {"source_name", args[0]},
                        {"source", ss.str()},
                        {"params", params},
                        {"persist", FLAGS_persist || (FLAGS_pid <= 0 && FLAGS_cgroup.empty())}};
  req.update(fields);
  nlohmann::json out;
  if (int r = call(req, out)) return r;
  if (FLAGS_json) {
    std::cout << out.dump(2) << "\n";
  } else {
    std::printf("deployed policy %d (%s) on %s with %d executors%s\n", out["id"].get<int>(),
                args[0].c_str(), out["target"].get<std::string>().c_str(), out["executors"].get<int>(),
                out.contains("replaced") ? (" (replaced policy " + std::to_string(out["replaced"].get<int>()) + ")").c_str() : "");
    if (out.contains("mode"))
      std::printf("XDP root program on %s in %s mode\n", out["ifname"].get<std::string>().c_str(),
                  out["mode"].get<std::string>().c_str());
    if (FLAGS_pid <= 0 && FLAGS_cgroup.empty()) std::printf("the policy persists: remove it with 'syrupctl remove %d'\n", out["id"].get<int>());
    // A server's worker named: the policy lives with the process that owns its sockets
    // (hooks/socket_select/group_owner.h), or the reason it cannot.
    if (out.contains("anchor_reason"))
      std::fprintf(stderr, "note: anchored to process %d, not %d: %s\n", out["anchor_pid"].get<int>(),
                   out["pid_given"].get<int>(), out["anchor_reason"].get<std::string>().c_str());
    if (out.contains("anchor_note")) std::fprintf(stderr, "note: %s\n", out["anchor_note"].get<std::string>().c_str());
    if (out.contains("warnings")) std::fprintf(stderr, "%s", out["warnings"].get<std::string>().c_str());
  }
  return 0;
}

int parse_id(const std::string& s, int& id) {
  int64_t v;
  if (!syrup::cli::integer_in(s, 1, INT32_MAX, v)) return -1;
  id = static_cast<int>(v);
  return 0;
}

// A table whose columns are as wide as their widest cell, so that no value (an IPv6
// group, a long application name) pushes the rest of its row out of line. Cells are
// left-aligned, or right-aligned in the columns `right` names; a row may carry a note,
// printed indented on the line below it.
class Table {
 public:
  Table(std::vector<std::string> header, std::vector<bool> right = {})
      : width_(header.size()), right_(std::move(right)) {
    right_.resize(header.size());
    add(std::move(header));
  }
  void add(std::vector<std::string> cells, std::string note = "") {
    for (size_t i = 0; i < cells.size() && i < width_.size(); i++) width_[i] = std::max(width_[i], cells[i].size());
    rows_.push_back({std::move(cells), std::move(note)});
  }
  void print() const {
    for (auto& [cells, note] : rows_) {
      std::string line;
      for (size_t i = 0; i < cells.size(); i++) {
        std::string pad(width_[i] - cells[i].size(), ' ');
        bool last = i + 1 == cells.size();
        line += right_[i] ? pad + cells[i] : cells[i] + (last ? "" : pad);
        if (!last) line += "  ";
      }
      std::printf("%s\n", line.c_str());
      if (!note.empty()) std::printf("    %s\n", note.c_str());
    }
  }

 private:
  std::vector<size_t> width_;
  std::vector<bool> right_;
  std::vector<std::pair<std::vector<std::string>, std::string>> rows_;
};

int cmd_remove(const std::vector<std::string>& args) {
  int id;
  if (args.size() != 1 || parse_id(args[0], id))
    return usage("remove takes one policy ID, an integer in 1.." + std::to_string(INT32_MAX));
  nlohmann::json out;
  if (int r = call({{"op", "remove"}, {"id", id}}, out)) return r;
  if (FLAGS_json) std::cout << out.dump(2) << "\n";
  else std::printf("removed policy %d\n", id);
  return 0;
}

// The policies that ended without a request (their owner exited, their sockets all
// closed), the last few, so that one missing from the table says why.
void print_ended(const nlohmann::json& out) {
  constexpr size_t kShown = 10;
  if (!out.contains("ended") || !out["ended"].is_array() || out["ended"].empty()) return;
  const auto& e = out["ended"];
  Table t({"ENDED", "APP", "POLICY", "WHY"}, {true, false, false, false});
  for (size_t i = e.size() > kShown ? e.size() - kShown : 0; i < e.size(); i++)
    t.add({std::to_string(e[i].value("id", 0)), e[i].value("app", ""), e[i].value("name", ""), e[i].value("why", "")});
  std::printf("\n");
  t.print();
}

// `req` (list or stats) page after page (syrupd answers at most 1000 entries at a time,
// with "next" when more follow): every page's `field` in one array of `out`.
int call_pages(nlohmann::json req, const char* field, nlohmann::json& out) {
  nlohmann::json all = nlohmann::json::array();
  for (;;) {
    if (int r = call(req, out)) return r;
    for (auto& e : out[field]) all.push_back(std::move(e));
    if (!out.contains("next")) break;
    req["after"] = out["next"];
  }
  out[field] = std::move(all);
  return 0;
}

int cmd_list(const std::vector<std::string>& args) {
  if (!args.empty()) return usage("list takes no arguments");
  nlohmann::json out;
  if (int r = call_pages({{"op", "list"}}, "policies", out)) return r;
  if (FLAGS_json) {
    std::cout << out["policies"].dump(2) << "\n";
    return 0;
  }
  if (out["policies"].empty()) {
    std::printf("no policies deployed\n");
    print_ended(out);
    return 0;
  }
  Table t({"ID", "APP", "HOOK", "POLICY", "TARGET", "EXEC", "OWNER", "PROG"},
          {true, false, false, false, false, true, false, false});
  for (auto& p : out["policies"]) {
    std::string owner = p["persist"].get<bool>() ? "persist" : std::to_string(p["owner_pid"].get<int>());
    if (p.contains("pid_given")) owner += " (given " + std::to_string(p["pid_given"].get<int>()) + ")";
    std::string status =
        p.contains("status") && p["status"].is_string() ? p["status"].get<std::string>() : "running";
    t.add({std::to_string(p["id"].get<int>()), p["app"].get<std::string>(), p["hook"].get<std::string>(),
           p["name"].get<std::string>(), p["target"].get<std::string>(), std::to_string(p["executors"].get<int>()),
           owner, std::to_string(p["prog_id"].get<unsigned>())},
          status == "running" ? "" : "status: " + status);
  }
  t.print();
  print_ended(out);
  return 0;
}

int cmd_stats(const std::vector<std::string>& args) {
  nlohmann::json req = {{"op", "stats"}};
  int id;
  if (args.size() > 1 || (args.size() == 1 && parse_id(args[0], id))) return usage("stats takes at most one policy ID, an integer in 1.." + std::to_string(INT32_MAX));
  if (args.size() == 1) req["id"] = id;
  if (!FLAGS_by.empty() && FLAGS_by != "tenant" && FLAGS_by != "hook")
    return usage("--by takes 'tenant' or 'hook'");
  nlohmann::json out;
  if (int r = call_pages(req, "stats", out)) return r;
  if (!FLAGS_by.empty()) {
    // Sums of the per-policy counters, per application or per hook.
    std::map<std::string, nlohmann::json> groups;
    for (auto& s : out["stats"]) {
      std::string k = s.value(FLAGS_by == "tenant" ? "app" : "hook", std::string("?"));
      auto& g = groups[k];
      if (g.is_null())
        g = {{FLAGS_by, k}, {"policies", 0}, {"decisions", 0}, {"pass", 0}, {"drop", 0},
             {"fallback", 0}, {"run_cnt", 0}, {"run_time_ns", 0}};
      g["policies"] = g["policies"].get<uint64_t>() + 1;
      for (const char* f : {"decisions", "pass", "drop", "fallback", "run_cnt", "run_time_ns"})
        g[f] = g[f].get<uint64_t>() + s.value(f, uint64_t{0});
    }
    nlohmann::json arr = nlohmann::json::array();
    for (auto& [k, g] : groups) arr.push_back(g);
    if (FLAGS_json) {
      std::cout << arr.dump(2) << "\n";
      return 0;
    }
    Table t({FLAGS_by == "tenant" ? "TENANT" : "HOOK", "POLICIES", "DECISIONS", "PASS", "DROP", "FALLBACK"},
            {false, true, true, true, true, true});
    for (auto& g : arr)
      t.add({g[FLAGS_by].get<std::string>(), std::to_string(g["policies"].get<uint64_t>()),
             std::to_string(g["decisions"].get<uint64_t>()), std::to_string(g["pass"].get<uint64_t>()),
             std::to_string(g["drop"].get<uint64_t>()), std::to_string(g["fallback"].get<uint64_t>())});
    t.print();
    return 0;
  }
  if (FLAGS_json) {
    std::cout << out["stats"].dump(2) << "\n";
    return 0;
  }
  for (auto& s : out["stats"]) {
    std::printf("policy %d (%s, app %s): %llu decisions\n", s["id"].get<int>(),
                s["name"].get<std::string>().c_str(), s["app"].get<std::string>().c_str(),
                s["decisions"].get<unsigned long long>());
    int i = 0;
    for (auto& v : s["executors"]) std::printf("  executor %-3d %llu\n", i++, v.get<unsigned long long>());
    std::printf("  pass         %llu\n  drop         %llu\n  fallback     %llu\n",
                s["pass"].get<unsigned long long>(), s["drop"].get<unsigned long long>(),
                s["fallback"].get<unsigned long long>());
    if (s.contains("status") && s["status"].is_string() && s["status"].get<std::string>() != "running")
      std::printf("  status       %s\n", s["status"].get<std::string>().c_str());
    if (s["run_cnt"].get<unsigned long long>() > 0)
      std::printf("  cost         %.1f ns/decision (kernel.bpf_stats_enabled)\n",
                  double(s["run_time_ns"].get<unsigned long long>()) / double(s["run_cnt"].get<unsigned long long>()));
  }
  return 0;
}

int cmd_map(const std::vector<std::string>& args) {
  if (args.size() != 2 || args[0] != "dump") return usage("usage: syrupctl map dump --app APP MAP");
  if (FLAGS_app.empty()) return usage("map dump needs --app APP");
  if (FLAGS_limit < 0) return usage("--limit must be a non-negative number of entries");
  if (std::string why = bad_name("--app", "application", FLAGS_app, syrup::names::Kind::kPinned); !why.empty())
    return usage(why);
  if (std::string why = bad_name("MAP", "map", args[1], syrup::names::Kind::kPinned); !why.empty()) return usage(why);
  // syrupd answers a page at a time (docs/protocol.md, map_dump): ask on from each page's
  // cursor until --limit entries came or the map ended.
  nlohmann::json out, req = {{"op", "map_dump"}, {"app", FLAGS_app}, {"map", args[1]}};
  nlohmann::json entries = nlohmann::json::array();
  for (;;) {
    req["limit"] = static_cast<uint64_t>(FLAGS_limit) - entries.size();
    if (int r = call(req, out, 250)) return r;
    for (auto& e : out["entries"]) entries.push_back(std::move(e));
    if (!out.contains("cursor") || entries.size() >= static_cast<uint64_t>(FLAGS_limit)) break;
    req["cursor"] = out["cursor"];
  }
  out["entries"] = std::move(entries);
  out.erase("cursor");
  if (FLAGS_json) {
    std::cout << out.dump(2) << "\n";
    return 0;
  }
  std::printf("map %s of app %s (%s), %zu entries%s\n", args[1].c_str(), FLAGS_app.c_str(),
              out["type"].get<std::string>().c_str(), out["entries"].size(),
              out["truncated"].get<bool>() ? " (truncated, see --limit)" : "");
  for (auto& e : out["entries"]) {
    std::string k = e.contains("key_int") ? e["key_int"].dump() : e["key"].get<std::string>();
    std::string v = e.contains("value_int") ? e["value_int"].dump()
                    : e.contains("value")   ? e["value"].get<std::string>()
                                            : e["values"].dump();
    std::printf("  %-12s %s\n", k.c_str(), v.c_str());
  }
  return 0;
}

// Checks a --config file offline, as syrupd would load it: every problem as
// "FILE:LINE: KEY: MESSAGE" on stderr, exit 1; valid: a summary, exit 0.
int cmd_validate(const std::vector<std::string>& args) {
  if (args.size() != 1) return usage("validate takes one FILE (a syrupd --config file)");
  syrup::config::Config cfg;
  std::vector<syrup::config::Diagnostic> errs;
  syrup::config::LoadOptions lo;
  lo.max_source_bytes = FLAGS_max_source_bytes;
  int r = syrup::config::load(args[0], cfg, errs, lo);
  if (FLAGS_json) {
    nlohmann::json diags = nlohmann::json::array(), pols = nlohmann::json::array();
    for (auto& d : errs)
      diags.push_back({{"file", d.file}, {"line", d.line}, {"key", d.key}, {"message", d.message}});
    if (r == 0)
      for (const auto* e : cfg.entries()) {
        nlohmann::json req = e->request;
        req["source_bytes"] = req["source"].get<std::string>().size();
        req.erase("source");
        pols.push_back({{"identity", e->identity}, {"line", e->line}, {"target", e->target.str()},
                        {"hash", e->hash}, {"request", req}});
      }
    nlohmann::json tenants = nlohmann::json::array();
    if (r == 0)
      for (auto& t : cfg.tenants)
        tenants.push_back({{"name", t.name}, {"uid", t.uid}, {"quotas", t.effective.to_json()},
                           {"policies", t.policies.size()}});
    std::cout << nlohmann::json{{"file", args[0]}, {"valid", r == 0}, {"diagnostics", diags},
                                {"admin_group", cfg.admin_group}, {"tenants", tenants}, {"policies", pols}}
                     .dump(2, ' ', false, nlohmann::json::error_handler_t::replace)
              << "\n";
    return r ? kExitFailed : 0;
  }
  for (auto& d : errs) std::fprintf(stderr, "%s\n", d.str().c_str());
  if (r) {
    std::fprintf(stderr, "%s: invalid: %zu problem%s\n", args[0].c_str(), errs.size(), errs.size() == 1 ? "" : "s");
    return kExitFailed;
  }
  std::printf("%s: valid: %zu tenant%s, %zu polic%s\n", args[0].c_str(), cfg.tenants.size(),
              cfg.tenants.size() == 1 ? "" : "s", cfg.num_policies(), cfg.num_policies() == 1 ? "y" : "ies");
  for (auto& t : cfg.tenants) {
    std::string line = "  " + t.name + " (uid " + std::to_string(t.uid) + "):";
    if (t.policies.empty()) line += " no policies";
    for (size_t i = 0; i < t.policies.size(); i++)
      line += (i ? ", " : " ") + t.policies[i].identity + " (" + t.policies[i].hook + ")";
    std::printf("%s\n", line.c_str());
  }
  return 0;
}

int cmd_ping(const std::vector<std::string>&) {
  nlohmann::json out;
  if (int r = call({{"op", "ping"}}, out)) return r;
  if (FLAGS_json) std::cout << out.dump(2) << "\n";
  else std::printf("syrupd (pid %d) is serving %s\n", out["pid"].get<int>(), socket_path().c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  static const std::string kUsage = usage_text();
  syrup::cli::parse_flags(&argc, &argv, kUsage.c_str(), "0.1.0", kRanges);
  if (argc < 2) return usage("missing command (deploy, remove, list, stats, map, record, trace, ping, validate, test, replay, top)");
  std::string cmd = argv[1];
  std::vector<std::string> args(argv + 2, argv + argc);
  if (cmd == "deploy") return cmd_deploy(args);
  if (cmd == "remove") return cmd_remove(args);
  if (cmd == "list") return cmd_list(args);
  if (cmd == "stats") return cmd_stats(args);
  if (cmd == "map") return cmd_map(args);
  if (cmd == "ping") return cmd_ping(args);
  if (cmd == "validate") return cmd_validate(args);
  if (cmd == "record") return syrupctl::cmd_record(args, socket_path(), FLAGS_json);
  if (cmd == "trace") return syrupctl::cmd_trace(args, socket_path(), FLAGS_json);
  syrup::ctl::Env env{call, usage};
  if (cmd == "test") return syrup::ctl::cmd_test(args, env);
  if (cmd == "top") return syrup::ctl::cmd_top(args, env);
  if (cmd == "replay") return syrup::ctl::cmd_replay(args, env);
  return usage("unknown command '" + cmd + "'");
}
