// `syrupctl test POLICY.c CASES.yaml`: policy unit tests (docs/testing-policies.md).
//
// Design: the cases file is read here; each case becomes one test_run request
// (docs/protocol.md), so a case starts from fresh maps and a fresh random generator, and
// runs its inputs in order. syrupd compiles, verifies, JITs and runs the policy with its
// hook's test build and answers the raw decisions and the maps asked for; this file
// compares them with the case's expectations and prints a diff per failing case.
// Invariants: exit 0 when every case passed, 1 when one failed (or syrupd refused the
// policy), 2 for a cases file that cannot be used (naming its line), 3 when syrupd
// cannot be reached; --json prints one object for CI.
#include <gflags/gflags.h>
#include <yaml-cpp/yaml.h>

#include <arpa/inet.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>

#include "commands.h"
#include "syrup/abi.h"

DECLARE_bool(json);
DECLARE_string(hook);
DEFINE_uint64(seed, 1, "test, replay: the seed of the policy's random numbers (syr_random())");

namespace syrup::ctl {
namespace {

using nlohmann::json;

// A usage error in the cases file, at a node's line.
struct CasesError {
  std::string why;
};

[[noreturn]] void bad(const YAML::Node& n, const std::string& why) {
  throw CasesError{"line " + std::to_string(n.Mark().line + 1) + ": " + why};
}

// A YAML scalar as JSON: an integer where it reads as one (decimal or 0x hex), else text.
json scalar(const YAML::Node& n) {
  std::string s = n.as<std::string>();
  if (!s.empty() && (std::isdigit(static_cast<unsigned char>(s[0])))) {
    char* end = nullptr;
    errno = 0;
    unsigned long long v = std::strtoull(s.c_str(), &end, 0);
    if (end && *end == 0 && errno == 0) return v;
  }
  return s;
}

json to_json(const YAML::Node& n) {
  if (n.IsMap()) {
    json o = json::object();
    for (auto it = n.begin(); it != n.end(); ++it) o[it->first.as<std::string>()] = to_json(it->second);
    return o;
  }
  if (n.IsSequence()) {
    json a = json::array();
    for (const auto& e : n) a.push_back(to_json(e));
    return a;
  }
  return n.IsNull() ? json() : scalar(n);
}

std::string hex_of(const std::string& bytes) {
  std::string s;
  char b[3];
  for (unsigned char c : bytes) {
    std::snprintf(b, sizeof b, "%02x", c);
    s += b;
  }
  return s;
}

// Payload: hex bytes ("payload"), or little-endian __u32 words ("words"), as a policy
// reads them with syr_read_u32().
std::string payload_of(const YAML::Node& n) {
  std::string out;
  if (n["payload"]) {
    std::string h = n["payload"].as<std::string>();
    std::erase_if(h, [](char c) { return c == ' '; });
    if (h.size() % 2 || !std::all_of(h.begin(), h.end(), ::isxdigit)) bad(n["payload"], "payload must be hex bytes");
    for (size_t i = 0; i < h.size(); i += 2) out += static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16));
  }
  if (n["words"]) {
    if (!n["words"].IsSequence()) bad(n["words"], "words must be a list of integers");
    for (const auto& w : n["words"]) {
      json v = scalar(w);
      if (!v.is_number_unsigned() || v.get<uint64_t>() > UINT32_MAX) bad(w, "a word is an integer in 0..4294967295");
      uint32_t x = v.get<uint32_t>();
      out.append(reinterpret_cast<const char*>(&x), 4);
    }
  }
  return out;
}

// A UDP or TCP header (ports from the node, checksum 0) followed by the payload.
std::string l4_packet(const YAML::Node& n, bool tcp) {
  auto port = [&](const char* k, uint16_t dflt) {
    if (!n[k]) return dflt;
    json v = scalar(n[k]);
    if (!v.is_number_unsigned() || v.get<uint64_t>() > 65535) bad(n[k], std::string(k) + " is a port, 0..65535");
    return v.get<uint16_t>();
  };
  std::string payload = payload_of(n);
  std::string h(tcp ? 20 : 8, '\0');
  uint16_t sp = htons(port("src_port", 40000)), dp = htons(port("dst_port", 5000));
  std::memcpy(&h[0], &sp, 2);
  std::memcpy(&h[2], &dp, 2);
  if (tcp) {
    h[12] = 5 << 4;  // data offset: 5 words
    h[13] = 0x02;    // SYN
  } else {
    uint16_t len = htons(static_cast<uint16_t>(8 + payload.size()));
    std::memcpy(&h[4], &len, 2);
  }
  return h + payload;
}

// One input of a case as the test_run request takes it.
json input_of(const YAML::Node& n, const std::string& hook) {
  if (!n.IsMap()) bad(n, "an input is a map (udp:, tcp:, bytes:, or a thread's fields)");
  if (hook == "thread" || hook == "socket-lookup") return to_json(n);
  json in = json::object();
  for (auto it = n.begin(); it != n.end(); ++it) {
    std::string k = it->first.as<std::string>();
    if (k == "udp" || k == "tcp") in["bytes"] = hex_of(l4_packet(it->second, k == "tcp"));
    else if (k == "bytes") in["bytes"] = it->second.as<std::string>();
    else if (k == "hash" || k == "ip_protocol") in[k] = scalar(it->second);
    else bad(it->first, "unknown input field '" + k + "' (udp, tcp, bytes, hash, ip_protocol)");
    if (k == "tcp" && !n["ip_protocol"]) in["ip_protocol"] = 6;
  }
  if (!in.contains("bytes")) bad(n, "a packet input needs udp:, tcp: or bytes:");
  return in;
}

// An expected decision: an executor index, pass or drop.
json decision_of(const YAML::Node& n) {
  std::string s = n.as<std::string>();
  if (s == "pass" || s == "SYR_PASS") return SYR_PASS;
  if (s == "drop" || s == "SYR_DROP") return SYR_DROP;
  json v = scalar(n);
  if (!v.is_number_unsigned() || v.get<uint64_t>() > UINT32_MAX) bad(n, "a decision is an executor index, pass or drop");
  return v;
}

std::string decision_str(uint64_t d) {
  if (d == SYR_PASS) return "pass";
  if (d == SYR_DROP) return "drop";
  return "executor " + std::to_string(d);
}

// A map value from syrupd's answer as one integer (a per-CPU map's summed over CPUs), or
// its hex when it is wider than 8 bytes.
json value_of(const json& e) {
  if (e.contains("value_int")) return e["value_int"];
  if (e.contains("value")) return e["value"];
  uint64_t sum = 0;
  for (auto& v : e["values"]) {
    std::string h = v.get<std::string>();
    std::erase(h, ' ');
    if (h.size() > 16) return e["values"];
    uint64_t x = 0;
    for (size_t i = 0; i + 1 < h.size(); i += 2) x |= std::stoull(h.substr(i, 2), nullptr, 16) << (4 * i);
    sum += x;
  }
  return sum;
}

std::string norm_hex(std::string s) {
  std::erase_if(s, [](char c) { return c == ' ' || c == ':'; });
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

bool same(const json& want, const json& got) {
  if (want.is_string() && got.is_string()) return norm_hex(want.get<std::string>()) == norm_hex(got.get<std::string>());
  return want == got;
}

struct Case {
  std::string name;
  int line = 0;
  json req;
  std::vector<YAML::Node> expect;  // per input, or fewer
  YAML::Node maps_after;
};

// The differences between a case's expectations and syrupd's answer, one line each.
std::vector<std::string> diff(const Case& c, const json& out) {
  std::vector<std::string> d;
  const json& res = out["results"];
  for (size_t i = 0; i < c.expect.size() && i < res.size(); i++) {
    const YAML::Node& e = c.expect[i];
    const json& r = res[i];
    YAML::Node dn = e.IsMap() ? e["decision"] : e;
    if (dn) {
      uint64_t want = decision_of(dn).get<uint64_t>(), got = r["decision"].get<uint64_t>();
      if (want != got)
        d.push_back("input " + std::to_string(i) + ": expected " + decision_str(want) + ", got " + decision_str(got));
    }
    if (!e.IsMap()) continue;
    for (const char* f : {"key", "slice_ns"})
      if (e[f] && (!r.contains(f) || scalar(e[f]) != r[f]))
        d.push_back("input " + std::to_string(i) + ": expected " + f + " " + e[f].as<std::string>() + ", got " +
                    (r.contains(f) ? r[f].dump() : "none"));
  }
  if (!c.maps_after) return d;
  for (auto it = c.maps_after.begin(); it != c.maps_after.end(); ++it) {
    std::string m = it->first.as<std::string>();
    const json& entries = out["maps"].contains(m) ? out["maps"][m] : json::array();
    for (const auto& kv : it->second) {
      json k = scalar(kv[0]), want = scalar(kv[1]), got;
      for (auto& e : entries)
        if (same(k, e.contains("key_int") ? e["key_int"] : e["key"]) || same(k, e["key"])) got = value_of(e);
      if (!same(want, got))
        d.push_back("map " + m + "[" + kv[0].as<std::string>() + "]: expected " + kv[1].as<std::string>() + ", got " +
                    (got.is_null() ? std::string("no entry") : got.dump()));
    }
  }
  return d;
}

// The cases of a file, each as its request (the policy's source filled in by the caller).
std::vector<Case> load_cases(const YAML::Node& root, std::string& hook) {
  if (!root.IsMap() || !root["cases"] || !root["cases"].IsSequence())
    throw CasesError{"the cases file is a map with a list 'cases'"};
  if (root["hook"] && gflags::GetCommandLineFlagInfoOrDie("hook").is_default) hook = root["hook"].as<std::string>();
  std::vector<Case> cases;
  for (const auto& cn : root["cases"]) {
    Case c;
    c.line = cn.Mark().line + 1;
    c.name = cn["name"] ? cn["name"].as<std::string>() : "case at line " + std::to_string(c.line);
    if (!cn["inputs"] || !cn["inputs"].IsSequence()) bad(cn, "a case needs a list 'inputs'");
    c.req = {{"op", "test_run"}, {"hook", hook}, {"seed", FLAGS_seed}};
    for (const char* k : {"executors", "params", "seed"}) {
      if (root[k]) c.req[k] = to_json(root[k]);
      if (cn[k]) c.req[k] = to_json(cn[k]);
    }
    if (!gflags::GetCommandLineFlagInfoOrDie("seed").is_default) c.req["seed"] = FLAGS_seed;
    if (cn["maps"]) c.req["maps"] = to_json(cn["maps"]);
    c.req["inputs"] = json::array();
    for (const auto& in : cn["inputs"]) c.req["inputs"].push_back(input_of(in, hook));
    if (cn["expect"]) {
      if (!cn["expect"].IsSequence()) bad(cn["expect"], "expect is a list: one decision per input");
      for (const auto& e : cn["expect"]) {
        if (YAML::Node dn = e.IsMap() ? e["decision"] : e) decision_of(dn);  // checked now, not mid-run
        c.expect.push_back(e);
      }
      if (c.expect.size() > c.req["inputs"].size()) bad(cn["expect"], "more expectations than inputs");
    }
    if (cn["maps_after"]) {
      c.maps_after = cn["maps_after"];
      c.req["dump"] = json::array();
      for (auto it = c.maps_after.begin(); it != c.maps_after.end(); ++it) c.req["dump"].push_back(it->first.as<std::string>());
    }
    cases.push_back(std::move(c));
  }
  return cases;
}

bool read_file(const std::string& path, std::string& out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::ostringstream ss;
  ss << in.rdbuf();
  out = ss.str();
  return true;
}

}  // namespace

int cmd_test(const std::vector<std::string>& args, const Env& env) {
  if (args.size() != 2) return env.usage("test takes POLICY.c CASES.yaml");
  std::string source;
  if (!read_file(args[0], source)) {
    std::fprintf(stderr, "syrupctl: cannot read policy file %s: %s\n", args[0].c_str(), std::strerror(errno));
    return kExitFailed;
  }
  std::string hook = FLAGS_hook;
  std::vector<Case> cases;
  try {
    cases = load_cases(YAML::LoadFile(args[1]), hook);
  } catch (const CasesError& e) {
    return env.usage(args[1] + ": " + e.why);
  } catch (const YAML::Exception& e) {
    return env.usage(args[1] + ": " + e.what());
  }
  auto start = std::chrono::steady_clock::now();
  json report = json::array();
  size_t failed = 0;
  for (Case& c : cases) {
    c.req["hook"] = hook;
    c.req["source"] = source;
    c.req["source_name"] = args[0];
    json out;
    if (int r = env.call(c.req, out, 50)) return r;  // the policy does not compile or load
    std::vector<std::string> d = diff(c, out);
    failed += !d.empty();
    report.push_back({{"name", c.name}, {"line", c.line}, {"passed", d.empty()}, {"diffs", d},
                      {"results", out["results"]}, {"maps", out["maps"]}});
    if (FLAGS_json) continue;
    std::printf("%s  %s\n", d.empty() ? "ok  " : "FAIL", c.name.c_str());
    for (auto& line : d) std::printf("      %s\n", line.c_str());
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (FLAGS_json)
    std::cout << json{{"policy", args[0]}, {"cases", report}, {"passed", cases.size() - failed}, {"failed", failed},
                      {"seconds", secs}}.dump(2)
              << "\n";
  else
    std::printf("%s: %zu of %zu cases passed (%.2f s)\n", args[0].c_str(), cases.size() - failed, cases.size(), secs);
  return failed ? kExitFailed : 0;
}

}  // namespace syrup::ctl
