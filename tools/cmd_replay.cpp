// `syrupctl replay POLICY.c RECORDING [--seed N] [--json]`: a policy run over a
// recording (docs/recording.md) through syrupd's test_run request, compared with the
// recorded decisions (docs/testing-policies.md).
//
// Design: the recording is read here (runtime/include/syrup/recording.h: header_size and
// each record's size come from the file, unknown record types are skipped), its inputs
// become one test_run request, in order, so the policy's maps and its seeded random
// numbers carry from one input to the next as they did live. The answer is compared
// input by input: how many decisions moved and the first that did, the share of inputs
// per executor, the maps' final contents and the inputs per second the runs took.
// Invariants: a replay is deterministic for one policy, recording and seed; a recording
// larger than one request takes (TestRunLimits: 32768 inputs, a 4 MiB frame) is replayed
// up to that point, and the report says so; the policy reads only the recorded payload
// prefix (cap_len bytes) of each input.
#include <gflags/gflags.h>

#include <arpa/inet.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>

#include "commands.h"
#include "syrup/abi.h"
#include "syrup/recording.h"

DECLARE_bool(json);
DECLARE_uint64(seed);

namespace syrup::ctl {
namespace {

using nlohmann::json;

constexpr size_t kMaxInputs = 32768;           // syrupd's TestRunLimits::kInputs
constexpr size_t kMaxRequestBytes = 3u << 20;  // below the protocol's 4 MiB frame

const char* hook_name(uint32_t h) {
  switch (h) {
    case 1: return "socket-select";
    case 2: return "xdp";
    case 3: return "thread";
    case 4: return "socket-lookup";
  }
  return nullptr;
}

std::string hex(const uint8_t* p, size_t n) {
  static const char* h = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; i++) (s += h[p[i] >> 4]) += h[p[i] & 15];
  return s;
}

// One recorded input as test_run takes it.
json input_of(const syr_rec_record& r, const uint8_t* payload, uint32_t hook) {
  if (r.type == SYR_REC_THREAD) {
    const syr_rec_thread& t = r.in.thread;
    return {{"tid", t.tid},         {"tgid", t.tgid},     {"executor", t.executor}, {"prev_cpu", t.prev_cpu},
            {"nr_cpus", t.nr_cpus}, {"reason", t.reason}, {"now_ns", t.now_ns},     {"runnable_ns", t.runnable_ns},
            {"run_ns", t.run_ns},   {"key", t.key},       {"slice_ns", t.slice_ns}};
  }
  const syr_rec_packet& p = r.in.packet;
  if (hook == 4) {
    char l[INET_ADDRSTRLEN] = "0.0.0.0", rm[INET_ADDRSTRLEN] = "0.0.0.0";
    inet_ntop(AF_INET, p.local_ip, l, sizeof l);
    inet_ntop(AF_INET, p.remote_ip, rm, sizeof rm);
    return {{"protocol", p.ip_protocol}, {"local_ip4", l}, {"remote_ip4", rm}, {"local_port", p.local_port},
            {"remote_port", p.remote_port}, {"hash", p.hash}};
  }
  return {{"bytes", hex(payload, r.in.cap_len)}, {"hash", p.hash}, {"ip_protocol", p.ip_protocol}};
}

struct Recording {
  syr_rec_header h{};
  json inputs = json::array();
  std::vector<uint32_t> decisions;
  std::vector<uint64_t> ts;
  size_t skipped = 0;  // inputs past what one request takes
  bool trailer = false;
};

// Reads `path`; "" or why it is not a recording.
std::string read_recording(const std::string& path, Recording& rec) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "cannot read " + path + ": " + std::strerror(errno);
  std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (data.size() < 16 || std::memcmp(data.data(), SYR_REC_MAGIC, 8) != 0) return path + " is not a Syrup recording";
  std::memcpy(&rec.h, data.data(), std::min(sizeof rec.h, data.size()));
  if (rec.h.version != SYR_REC_VERSION) return path + ": recording version " + std::to_string(rec.h.version) + " (this syrupctl reads 1)";
  if (!hook_name(rec.h.hook)) return path + ": unknown hook " + std::to_string(rec.h.hook);
  size_t off = rec.h.header_size, bytes = 0;
  while (off + 8 <= data.size()) {
    syr_rec_record r{};
    std::memcpy(&r, data.data() + off, std::min(sizeof r, data.size() - off));
    if (r.size < 8 || off + r.size > data.size()) break;  // cut short: up to the last whole record
    if (r.type == SYR_REC_TRAILER) rec.trailer = true;
    if ((r.type == SYR_REC_INPUT || r.type == SYR_REC_THREAD) && sizeof r + r.in.cap_len <= r.size) {
      json one = input_of(r, reinterpret_cast<const uint8_t*>(data.data() + off + sizeof r), rec.h.hook);
      size_t b = one.dump().size();
      if (rec.inputs.size() >= kMaxInputs || bytes + b > kMaxRequestBytes) {
        rec.skipped++;
      } else {
        bytes += b;
        rec.inputs.push_back(std::move(one));
        rec.decisions.push_back(r.in.decision);
        rec.ts.push_back(r.ts_ns);
      }
    }
    off += r.size;
  }
  return {};
}

std::string decision_str(uint64_t d) {
  if (d == SYR_PASS) return "pass";
  if (d == SYR_DROP) return "drop";
  return std::to_string(d);
}

}  // namespace

int cmd_replay(const std::vector<std::string>& args, const Env& env) {
  if (args.size() != 2) return env.usage("replay takes POLICY.c RECORDING");
  std::ifstream src(args[0], std::ios::binary);
  if (!src) {
    std::fprintf(stderr, "syrupctl: cannot read policy file %s: %s\n", args[0].c_str(), std::strerror(errno));
    return kExitFailed;
  }
  std::ostringstream ss;
  ss << src.rdbuf();
  Recording rec;
  if (std::string why = read_recording(args[1], rec); !why.empty()) {
    std::fprintf(stderr, "syrupctl: %s\n", why.c_str());
    return kExitFailed;
  }
  if (rec.inputs.empty()) {
    std::fprintf(stderr, "syrupctl: %s holds no inputs\n", args[1].c_str());
    return kExitFailed;
  }
  json req = {{"op", "test_run"},   {"hook", hook_name(rec.h.hook)},
              {"source", ss.str()}, {"source_name", args[0]},
              {"executors", std::max<uint32_t>(1, std::min<uint32_t>(rec.h.n_executors, SYR_MAX_EXECUTORS))},
              {"seed", FLAGS_seed}, {"inputs", rec.inputs}, {"dump", {"*"}}};
  json out;
  if (int r = env.call(req, out, 50)) return r;
  const json& res = out["results"];
  size_t moved = 0;
  json first = json::array(), decisions = json::array();
  std::map<std::string, uint64_t> share;
  for (size_t i = 0; i < res.size(); i++) {
    uint32_t now = res[i]["decision"].get<uint32_t>();
    share[decision_str(now)]++;
    decisions.push_back(now);
    if (now == rec.decisions[i]) continue;
    if (moved++ < 10)
      first.push_back({{"input", i}, {"ts_ns", rec.ts[i]}, {"recorded", decision_str(rec.decisions[i])},
                       {"replayed", decision_str(now)}, {"input_fields", rec.inputs[i]}});
  }
  double secs = out["run_ns"].get<double>() / 1e9;
  json report = {{"policy", args[0]},  {"recording", args[1]}, {"hook", req["hook"]}, {"inputs", res.size()},
                 {"not_replayed", rec.skipped}, {"moved", moved}, {"first_moved", first}, {"share", share},
                 {"maps", out["maps"]}, {"inputs_per_s", secs > 0 ? double(res.size()) / secs : 0.0},
                 {"seed", FLAGS_seed}, {"complete_recording", rec.trailer}, {"decisions", decisions}};
  if (FLAGS_json) {
    std::cout << report.dump(2) << "\n";
    return 0;
  }
  std::printf("replayed %zu inputs of %s through %s (%s hook, seed %llu): %zu decisions moved\n", res.size(),
              args[1].c_str(), args[0].c_str(), req["hook"].get<std::string>().c_str(),
              static_cast<unsigned long long>(FLAGS_seed), moved);
  if (rec.skipped)
    std::printf("  %zu later inputs not replayed: one replay takes %zu inputs and 3 MiB\n", rec.skipped, kMaxInputs);
  for (auto& f : first)
    std::printf("  input %s: recorded %s, now %s\n", f["input"].dump().c_str(), f["recorded"].get<std::string>().c_str(),
                f["replayed"].get<std::string>().c_str());
  std::printf("share:");
  for (auto& [k, n] : share) std::printf(" %s %.1f%%", k.c_str(), 100.0 * double(n) / double(res.size()));
  std::printf("\n%.0f inputs/s through the JIT\n", report["inputs_per_s"].get<double>());
  for (auto& [m, entries] : out["maps"].items()) {
    std::printf("map %s:", m.c_str());
    for (auto& e : entries) {
      if (e.value("value_int", uint64_t{0}) == 0 && e.contains("value_int")) continue;  // zeros left out
      std::printf(" [%s]=%s", e.contains("key_int") ? e["key_int"].dump().c_str() : e["key"].get<std::string>().c_str(),
                  e.contains("value_int") ? e["value_int"].dump().c_str() : e.value("value", std::string("?")).c_str());
    }
    std::printf("\n");
  }
  return 0;
}

}  // namespace syrup::ctl
