// `syrupctl top [--json] [--once]`: a live view of the policies the caller may see.
//
// Design: every second it asks syrupd for `stats` (the counters of every policy the
// caller may see: syrupd filters by uid, so another user's policies never reach this
// file) and `list` (what each policy schedules), and prints the difference to the
// previous sample as rates: decisions, passes, drops and fallbacks per second and each
// executor's share of the decisions that chose an executor. For a thread policy it adds
// the threads of the scheduled process that are runnable (state R, running or waiting
// for a core) and how many it has, read from /proc. --once prints one refresh (two
// samples a second apart) and exits; --json prints one JSON object per policy per
// refresh, one per line. Invariant: a rate is computed only between two samples of the
// same policy id; a policy that appears starts at its next refresh.
#include <gflags/gflags.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <thread>

#include "commands.h"

DECLARE_bool(json);
DEFINE_bool(once, false, "top: print one refresh (two samples a second apart) and exit");
DEFINE_int32(top_interval_ms, 1000, "top: milliseconds between refreshes");

namespace syrup::ctl {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

struct Sample {
  Clock::time_point at;
  std::map<int, json> stats;  // by policy id
  std::map<int, json> info;   // `list` entries, by id
};

int take(const Env& env, Sample& s) {
  json st, ls;
  if (int r = env.call({{"op", "stats"}}, st, 50)) return r;
  if (int r = env.call({{"op", "list"}}, ls, 50)) return r;
  s.at = Clock::now();
  for (auto& p : st["stats"]) s.stats[p["id"].get<int>()] = p;
  for (auto& p : ls["policies"]) s.info[p["id"].get<int>()] = p;
  return 0;
}

// The threads of `pid` that are runnable (running or waiting for a core), and all of
// them; -1 when /proc does not show the process.
std::pair<int, int> threads_of(int pid) {
  int runnable = 0, all = 0;
  std::error_code ec;
  std::filesystem::directory_iterator it("/proc/" + std::to_string(pid) + "/task", ec), end;
  if (ec) return {-1, -1};
  for (; it != end; it.increment(ec)) {
    std::ifstream in(it->path() / "stat");
    std::string line;
    if (!std::getline(in, line)) continue;
    auto close = line.rfind(')');  // the command may hold spaces and parentheses
    if (close == std::string::npos || close + 2 >= line.size()) continue;
    all++;
    runnable += line[close + 2] == 'R';
  }
  return {runnable, all};
}

uint64_t u(const json& j, const char* k) { return j.contains(k) && j[k].is_number_unsigned() ? j[k].get<uint64_t>() : 0; }

// One policy's rates between two samples.
json rates(const json& prev, const json& now, const json& info, double secs) {
  auto per_s = [&](const char* k) { return double(u(now, k) - std::min(u(now, k), u(prev, k))) / secs; };
  json share = json::array();
  uint64_t chosen = 0;
  std::vector<uint64_t> d;
  for (size_t i = 0; i < now["executors"].size(); i++) {
    uint64_t a = now["executors"][i].get<uint64_t>(), b = i < prev["executors"].size() ? prev["executors"][i].get<uint64_t>() : 0;
    d.push_back(a - std::min(a, b));
    chosen += d.back();
  }
  for (uint64_t x : d) share.push_back(chosen ? double(x) / double(chosen) : 0.0);
  json r = {{"id", now["id"]}, {"app", now["app"]}, {"name", now["name"]}, {"hook", now["hook"]},
            {"decisions_per_s", per_s("decisions")}, {"pass_per_s", per_s("pass")}, {"drop_per_s", per_s("drop")},
            {"fallback_per_s", per_s("fallback")}, {"share", share}, {"decisions", u(now, "decisions")}};
  if (now["hook"] == "thread" && info.contains("owner_pid") && info["owner_pid"].get<int>() > 0) {
    auto [runnable, all] = threads_of(info["owner_pid"].get<int>());
    r["threads"] = {{"runnable", runnable}, {"total", all}};
  }
  return r;
}

void print_text(const std::vector<json>& rows, bool clear) {
  if (clear) std::printf("\033[H\033[2J");
  std::printf("%5s %-12s %-14s %-13s %10s %9s %9s %9s  %s\n", "ID", "APP", "POLICY", "HOOK", "DEC/S", "PASS/S",
              "DROP/S", "FALLBK/S", "SHARE PER EXECUTOR (THREADS RUNNABLE/ALL)");
  if (rows.empty()) std::printf("no policies you may see are deployed\n");
  for (auto& r : rows) {
    std::string share;
    for (auto& s : r["share"]) {
      char b[16];
      std::snprintf(b, sizeof b, "%s%.0f%%", share.empty() ? "" : " ", 100 * s.get<double>());
      share += b;
      if (share.size() > 60) {
        share += " ...";
        break;
      }
    }
    if (r.contains("threads"))
      share += " (" + r["threads"]["runnable"].dump() + "/" + r["threads"]["total"].dump() + ")";
    std::printf("%5d %-12.12s %-14.14s %-13.13s %10.0f %9.0f %9.0f %9.0f  %s\n", r["id"].get<int>(),
                r["app"].get<std::string>().c_str(), r["name"].get<std::string>().c_str(),
                r["hook"].get<std::string>().c_str(), r["decisions_per_s"].get<double>(),
                r["pass_per_s"].get<double>(), r["drop_per_s"].get<double>(), r["fallback_per_s"].get<double>(),
                share.c_str());
  }
  std::fflush(stdout);
}

}  // namespace

int cmd_top(const std::vector<std::string>& args, const Env& env) {
  if (!args.empty()) return env.usage("top takes no arguments");
  if (FLAGS_top_interval_ms < 100 || FLAGS_top_interval_ms > 60000)
    return env.usage("--top_interval_ms takes an integer in 100..60000");
  Sample prev;
  if (int r = take(env, prev)) return r;
  for (;;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(FLAGS_top_interval_ms));
    Sample now;
    if (int r = take(env, now)) return r;
    double secs = std::chrono::duration<double>(now.at - prev.at).count();
    std::vector<json> rows;
    for (auto& [id, st] : now.stats)
      if (auto p = prev.stats.find(id); p != prev.stats.end())
        rows.push_back(rates(p->second, st, now.info.count(id) ? now.info[id] : json::object(), secs));
    if (FLAGS_json) {
      auto t = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
      for (auto& r : rows) {
        r["time"] = t;
        std::cout << r.dump() << "\n";
      }
      if (rows.empty()) std::cout << json{{"time", t}, {"policies", 0}}.dump() << "\n";
      std::cout.flush();
    } else {
      print_text(rows, !FLAGS_once);
    }
    if (FLAGS_once) return 0;
    prev = std::move(now);
  }
}

}  // namespace syrup::ctl
