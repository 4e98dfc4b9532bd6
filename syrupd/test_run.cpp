// The test_run request: its checks (parse_test_run), the run on a load worker
// (TestRunJob::run) and the handler that compiles, parks and answers (Daemon::test_run).
// Design and invariants: test_run.h.
#include "test_run.h"

#include <arpa/inet.h>
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <linux/bpf.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstring>

#include "daemon.h"
#include "daemon_util.h"
#include "hook.h"
#include "log.h"
#include "names.h"
#include "registry.h"
#include "syrup/abi.h"

namespace syrup {
using nlohmann::json;

namespace {

// Mirrors struct syr_thread of <syrup/policy.h> (as hooks/thread/thread_agent.cpp does).
struct SyrThread {
  uint32_t tid, tgid, executor, prev_cpu, nr_cpus, reason;
  uint64_t now_ns, runnable_ns, run_ns, key, slice_ns, oncore_ns;
};
static_assert(sizeof(SyrThread) == 72, "policy ABI layout changed");

// Mirrors kernel/hooks/socket_lookup/test/wrapper.bpf.h and test_run.bpf.h.
struct TestLookup {
  bpf_sk_lookup sk;
  uint32_t hash, pad;
};
// Mirror kernel/hooks/test_run.bpf.h and the test wrappers.
struct TestMeta {
  uint32_t n, next, off, len, hash, ip_protocol, pad[2];
};
struct TestRec {
  uint32_t len, hash, ip_protocol, pad;
};
struct TestThreadOut {
  uint64_t key, slice_ns;
  uint32_t decision, pad;
};
constexpr uint32_t kTestL4Off = 14;          // SYR_TEST_L4_OFF
constexpr size_t kBatch = 4096;              // SYR_TEST_BATCH
constexpr size_t kBlobBytes = 256 * 1024;    // SYR_TEST_BLOB
// struct syr_test_packets: the cursor, the decisions, the records.
constexpr size_t kPacketDecisions = sizeof(TestMeta), kPacketRecords = kPacketDecisions + 4 * kBatch;
static_assert(TestRunLimits::kInputBytes == 1500, "SYR_TEST_INPUT_BYTES");
constexpr uint64_t kDefaultSliceNs = 3'000'000;  // the backends' preset slice
constexpr uint32_t kNoExecutor = 0xffffffffU;    // SYR_NO_EXECUTOR

// The hooks that have a test build, and how their test program takes an input. A hook
// not listed has none: fail closed.
struct TestBuild {
  const char* hook;
  const char* dir;
  TestKind kind;
};
constexpr TestBuild kBuilds[] = {{"socket-select", "socket_select", TestKind::kPacket},
                                 {"xdp", "xdp", TestKind::kPacket},
                                 {"socket-lookup", "socket_lookup", TestKind::kLookup},
                                 {"thread", "thread", TestKind::kThread}};

// `v` as an unsigned integer of at most `max`; why not, or "".
std::string u64_of(const std::string& what, const json& v, uint64_t max, uint64_t& out) {
  if (v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0)) {
    out = v.get<uint64_t>();
    if (out <= max) return {};
  }
  std::string got = v.dump(-1, ' ', true, json::error_handler_t::replace).substr(0, 40);
  return what + " must be an integer in 0.." + std::to_string(max) + ", got " + got;
}

// Hex bytes ("0a 1b", "0a1b", "0x0a1b") into `out`; false if not hex or longer than `max`.
bool parse_hex(std::string s, size_t max, std::vector<uint8_t>& out) {
  std::erase_if(s, [](char c) { return c == ' ' || c == ':'; });
  if (s.starts_with("0x") || s.starts_with("0X")) s = s.substr(2);
  if (s.size() % 2 || s.size() / 2 > max || !std::all_of(s.begin(), s.end(), ::isxdigit)) return false;
  for (size_t i = 0; i < s.size(); i += 2) out.push_back(static_cast<uint8_t>(std::stoi(s.substr(i, 2), nullptr, 16)));
  return true;
}

// A map key or value of `size` bytes: an integer (little-endian, as the policy stores it,
// where it fits) or hex of exactly that size.
std::string map_bytes(const std::string& what, const json& v, size_t size, std::vector<uint8_t>& out) {
  out.assign(size, 0);
  if (v.is_string()) {
    std::vector<uint8_t> b;
    if (parse_hex(v.get<std::string>(), size, b) && b.size() == size) {
      out = b;
      return {};
    }
    return what + " must be " + std::to_string(size) + " bytes in hex or an integer";
  }
  uint64_t u;
  uint64_t max = size >= 8 ? UINT64_MAX : (uint64_t{1} << (8 * size)) - 1;
  if (std::string why = u64_of(what, v, max, u); !why.empty()) return why;
  std::memcpy(out.data(), &u, std::min<size_t>(size, 8));
  return {};
}

// The fields of an input object, refusing any other (a typo is an error, not a default).
std::string known_fields(const json& in, std::initializer_list<const char*> keys, size_t i) {
  for (auto& [k, v] : in.items())
    if (std::none_of(keys.begin(), keys.end(), [&](const char* n) { return k == n; }))
      return "inputs[" + std::to_string(i) + "]: unknown field '" + names::printable(k).substr(0, 40) + "'";
  return {};
}

std::string parse_packet(const json& in, size_t i, TestRunJob::Input& out) {
  std::string at = "inputs[" + std::to_string(i) + "]";
  if (std::string why = known_fields(in, {"bytes", "hash", "ip_protocol"}, i); !why.empty()) return why;
  std::vector<uint8_t> bytes;
  if (!in.contains("bytes") || !in["bytes"].is_string() ||
      !parse_hex(in["bytes"].get<std::string>(), TestRunLimits::kInputBytes, bytes))
    return at + ".bytes must be the input's bytes from the L4 header on, in hex, up to " +
           std::to_string(TestRunLimits::kInputBytes) + " bytes";
  out.bytes = std::move(bytes);
  uint64_t h = 0, p = IPPROTO_UDP;
  if (in.contains("hash"))
    if (std::string why = u64_of(at + ".hash", in["hash"], UINT32_MAX, h); !why.empty()) return why;
  if (in.contains("ip_protocol"))
    if (std::string why = u64_of(at + ".ip_protocol", in["ip_protocol"], 255, p); !why.empty()) return why;
  out.hash = static_cast<uint32_t>(h);
  out.ip_protocol = static_cast<uint32_t>(p);
  return {};
}

std::string parse_thread(const json& in, size_t i, uint32_t executors, TestRunJob::Input& out) {
  std::string at = "inputs[" + std::to_string(i) + "].";
  SyrThread t{1, 1, kNoExecutor, 0, executors, 1, 0, 0, 0, 0, kDefaultSliceNs, 0};
  struct F32 { const char* n; uint32_t* p; } f32[] = {{"tid", &t.tid}, {"tgid", &t.tgid}, {"executor", &t.executor},
      {"prev_cpu", &t.prev_cpu}, {"nr_cpus", &t.nr_cpus}, {"reason", &t.reason}};
  struct F64 { const char* n; uint64_t* p; } f64[] = {{"now_ns", &t.now_ns}, {"runnable_ns", &t.runnable_ns},
      {"run_ns", &t.run_ns}, {"key", &t.key}, {"slice_ns", &t.slice_ns}, {"oncore_ns", &t.oncore_ns}};
  if (std::string why = known_fields(in, {"tid", "tgid", "executor", "prev_cpu", "nr_cpus", "reason", "now_ns",
                                          "runnable_ns", "run_ns", "key", "slice_ns", "oncore_ns"}, i);
      !why.empty())
    return why;
  uint64_t v;
  for (auto& f : f32)
    if (in.contains(f.n)) {
      if (std::string why = u64_of(at + f.n, in[f.n], UINT32_MAX, v); !why.empty()) return why;
      *f.p = static_cast<uint32_t>(v);
    }
  for (auto& f : f64)
    if (in.contains(f.n))
      if (std::string why = u64_of(at + f.n, in[f.n], UINT64_MAX, *f.p); !why.empty()) return why;
  if (!in.contains("key")) t.key = t.runnable_ns;  // preset as the backends do
  out.bytes.resize(sizeof t);
  std::memcpy(out.bytes.data(), &t, sizeof t);
  return {};
}

std::string parse_lookup(const json& in, size_t i, TestRunJob::Input& out) {
  std::string at = "inputs[" + std::to_string(i) + "].";
  if (std::string why = known_fields(in, {"protocol", "local_ip4", "remote_ip4", "local_port", "remote_port", "hash"}, i);
      !why.empty())
    return why;
  TestLookup l{};
  l.sk.family = AF_INET;
  uint64_t proto = IPPROTO_TCP, lport = 0, rport = 0, h = 0;
  std::string why;
  if (in.contains("protocol")) why = u64_of(at + "protocol", in["protocol"], 255, proto);
  if (why.empty() && in.contains("local_port")) why = u64_of(at + "local_port", in["local_port"], 65535, lport);
  if (why.empty() && in.contains("remote_port")) why = u64_of(at + "remote_port", in["remote_port"], 65535, rport);
  if (why.empty() && in.contains("hash")) why = u64_of(at + "hash", in["hash"], UINT32_MAX, h);
  if (!why.empty()) return why;
  for (auto [k, dst] : {std::pair{"local_ip4", &l.sk.local_ip4}, std::pair{"remote_ip4", &l.sk.remote_ip4}}) {
    if (!in.contains(k)) continue;
    if (!in[k].is_string() || inet_pton(AF_INET, in[k].get<std::string>().c_str(), dst) != 1)
      return at + k + " must be an IPv4 address such as \"127.0.0.1\"";
  }
  l.sk.protocol = static_cast<uint32_t>(proto);
  l.sk.local_port = static_cast<uint32_t>(lport);
  l.sk.remote_port = htons(static_cast<uint16_t>(rport));
  l.hash = static_cast<uint32_t>(h);
  out.bytes.resize(sizeof l);
  std::memcpy(out.bytes.data(), &l, sizeof l);
  out.ip_protocol = l.sk.protocol;
  return {};
}

std::string parse_inputs(const json& b, TestRunJob& job) {
  if (!b.contains("inputs") || !b["inputs"].is_array() || b["inputs"].empty() ||
      b["inputs"].size() > TestRunLimits::kInputs)
    return "inputs must be a list of 1.." + std::to_string(TestRunLimits::kInputs) + " inputs";
  size_t i = 0;
  for (auto& in : b["inputs"]) {
    TestRunJob::Input one;
    if (!in.is_object()) return "inputs[" + std::to_string(i) + "] must be an object";
    std::string why = job.kind == TestKind::kPacket ? parse_packet(in, i, one)
                      : job.kind == TestKind::kThread ? parse_thread(in, i, job.spec.num_executors, one)
                                                      : parse_lookup(in, i, one);
    if (!why.empty()) return why;
    job.inputs.push_back(std::move(one));
    i++;
  }
  return {};
}

// The initial maps and the maps to dump: shapes and counts (sizes are checked against the
// loaded maps by run()).
std::string parse_maps(const json& b, TestRunJob& job) {
  size_t entries = 0;
  if (b.contains("maps")) {
    if (!b["maps"].is_object()) return "maps must be an object: map name -> list of [key, value]";
    for (auto& [name, list] : b["maps"].items()) {
      if (std::string why = names::check("map", name); !why.empty()) return why;
      if (!list.is_array()) return "maps." + name + " must be a list of [key, value]";
      for (auto& kv : list)
        if (!kv.is_array() || kv.size() != 2) return "maps." + name + " must be a list of [key, value]";
      if ((entries += list.size()) > TestRunLimits::kMapEntries)
        return "maps: at most " + std::to_string(TestRunLimits::kMapEntries) + " entries in all";
    }
    job.maps = b["maps"];
  }
  if (b.contains("dump")) {
    if (!b["dump"].is_array() || b["dump"].size() > TestRunLimits::kDumpMaps)
      return "dump must be a list of at most " + std::to_string(TestRunLimits::kDumpMaps) + " map names";
    for (auto& n : b["dump"]) {
      if (!n.is_string()) return "dump must be a list of map names (\"*\": all the policy's maps)";
      if (n == "*") {
        job.dump.push_back("*");
        continue;
      }
      if (std::string why = names::check("map", n.get<std::string>()); !why.empty()) return why;
      job.dump.push_back(n.get<std::string>());
    }
  }
  return {};
}

}  // namespace

int parse_test_run(const json& b, const Hook& hook, TestRunJob& job, std::string& why) {
  const TestBuild* tb = nullptr;
  for (auto& t : kBuilds)
    if (hook.name() == std::string(t.hook)) tb = &t;
  if (!tb) {
    why = std::string("the ") + hook.name() + " hook has no test build";
    return -EOPNOTSUPP;
  }
  job.kind = tb->kind;
  job.wrapper = std::string(tb->dir) + "/test/wrapper.bpf.h";  // with test/policy_input.h beside it
  int64_t n = 1;
  if (b.contains("executors"))
    if (why = names::integer("executors", b["executors"], 1, SYR_MAX_EXECUTORS, n); !why.empty()) return -EINVAL;
  job.spec.num_executors = static_cast<uint32_t>(n);
  if (b.contains("seed"))
    if (why = u64_of("seed", b["seed"], UINT64_MAX, job.seed); !why.empty()) return -EINVAL;
  if (b.contains("batch")) {  // the most inputs per test run (1: one run per input, as a baseline)
    int64_t batch = 0;
    if (why = names::integer("batch", b["batch"], 1, kBatch, batch); !why.empty()) return -EINVAL;
    job.max_batch = static_cast<size_t>(batch);
  }
  if (auto bad = check_params(b, job.spec.params)) {
    why = *bad;
    return -EINVAL;
  }
  if (b.contains("inputs") && b["inputs"].is_array() && b["inputs"].size() > TestRunLimits::kInputs) {
    why = "inputs: at most " + std::to_string(TestRunLimits::kInputs) + " per request, got " +
          std::to_string(b["inputs"].size());
    return -E2BIG;
  }
  if ((why = parse_inputs(b, job)).empty() && (why = parse_maps(b, job)).empty()) return 0;
  return why.find("at most") != std::string::npos ? -E2BIG : -EINVAL;
}

namespace {

struct MapShape {
  int fd = -1;
  bpf_map_info info{};
  bool percpu = false;
  size_t ncpu = 1, vstride = 0;
};

// One of the policy's own maps (never the wrapper's syr_* maps), by name.
int policy_map(const LoadedPolicy& p, const std::string& name, MapShape& m, std::string& why) {
  if (std::find(p.user_maps.begin(), p.user_maps.end(), name) == p.user_maps.end()) {
    why = "the policy has no map '" + name + "'";
    return -ENOENT;
  }
  m.fd = p.map_fd(name.c_str());
  uint32_t len = sizeof m.info;
  if (m.fd < 0 || bpf_map_get_info_by_fd(m.fd, &m.info, &len)) {
    why = "cannot read map '" + name + "'";
    return -EIO;
  }
  m.percpu = m.info.type == BPF_MAP_TYPE_PERCPU_ARRAY || m.info.type == BPF_MAP_TYPE_PERCPU_HASH ||
             m.info.type == BPF_MAP_TYPE_LRU_PERCPU_HASH;
  m.ncpu = m.percpu ? static_cast<size_t>(libbpf_num_possible_cpus()) : 1;
  m.vstride = m.percpu ? (m.info.value_size + 7) / 8 * 8 : m.info.value_size;
  return 0;
}

// Sets the request's initial entries; a per-CPU value is set on every CPU.
int set_maps(const LoadedPolicy& p, const json& maps, std::string& why) {
  for (auto& [name, list] : maps.items()) {
    MapShape m;
    if (int r = policy_map(p, name, m, why)) return r;
    std::vector<uint8_t> k, v, all;
    for (auto& kv : list) {
      if (!(why = map_bytes("maps." + name + " key", kv[0], m.info.key_size, k)).empty() ||
          !(why = map_bytes("maps." + name + " value", kv[1], m.info.value_size, v)).empty())
        return -EINVAL;
      all.assign(m.vstride * m.ncpu, 0);
      for (size_t c = 0; c < m.ncpu; c++) std::memcpy(&all[c * m.vstride], v.data(), v.size());
      if (int r = bpf_map_update_elem(m.fd, k.data(), all.data(), BPF_ANY)) {
        why = "cannot set an entry of map '" + name + "': " + std::strerror(errno);
        return r < 0 ? r : -EIO;
      }
    }
  }
  return 0;
}

json dump_map(const MapShape& m) {
  std::vector<unsigned char> key(m.info.key_size), next(m.info.key_size), val(m.vstride * m.ncpu);
  json entries = json::array();
  bool first = true;
  while (entries.size() < TestRunLimits::kDumpEntries &&
         bpf_map_get_next_key(m.fd, first ? nullptr : key.data(), next.data()) == 0) {
    first = false;
    key = next;
    if (bpf_map_lookup_elem(m.fd, key.data(), val.data()) == 0)
      entries.push_back(dump_entry(key, val, m.percpu ? m.ncpu : 0, m.vstride, m.info.value_size));
  }
  return entries;
}

// One batch: the program, its maps and the staging buffers, reused batch after batch.
struct Batch {
  int prog = -1, in = -1, out = -1;
  std::vector<uint8_t> in_buf, out_buf;
  std::vector<uint8_t> frame = std::vector<uint8_t>(kTestL4Off + TestRunLimits::kInputBytes, 0);

  int open(const LoadedPolicy& p) {
    prog = p.prog_fd();
    in = p.map_fd("syr_test_in");
    out = p.map_fd("syr_test_out");  // none in a packet build: its decisions are in `in`
    bpf_map_info ii{}, oi{};
    uint32_t l1 = sizeof ii, l2 = sizeof oi;
    if (in < 0 || bpf_map_get_info_by_fd(in, &ii, &l1) || (out >= 0 && bpf_map_get_info_by_fd(out, &oi, &l2)))
      return -EIO;
    in_buf.assign(ii.value_size, 0);
    out_buf.assign(out >= 0 ? oi.value_size : 0, 0);
    return 0;
  }
};

// Stages inputs [first, first + max) as one batch: as many as fit. How many.
size_t stage(TestKind kind, const std::vector<TestRunJob::Input>& inputs, size_t first, size_t max, Batch& b) {
  size_t n = 0, off = 0, end = std::min({inputs.size(), first + max, first + kBatch});
  for (size_t i = first; i < end; i++, n++) {
    const TestRunJob::Input& in = inputs[i];
    if (kind != TestKind::kPacket) {
      if ((n + 1) * in.bytes.size() > b.in_buf.size()) break;
      std::memcpy(&b.in_buf[n * in.bytes.size()], in.bytes.data(), in.bytes.size());
      continue;
    }
    size_t rec = sizeof(TestRec) + (in.bytes.size() + 7) / 8 * 8;
    if (off + rec > kBlobBytes || kPacketRecords + off + rec > b.in_buf.size()) break;
    TestRec h{static_cast<uint32_t>(in.bytes.size()), in.hash, in.ip_protocol, 0};
    std::memcpy(&b.in_buf[kPacketRecords + off], &h, sizeof h);
    std::memcpy(&b.in_buf[kPacketRecords + off + sizeof h], in.bytes.data(), in.bytes.size());
    off += rec;
  }
  return n;
}

// Runs a staged batch of n inputs and appends what each decided to `out` (key and slice
// for the thread hook only).
int run_batch(TestKind kind, Batch& b, size_t n, std::vector<TestThreadOut>& out) {
  uint32_t zero = 0;
  TestMeta meta{static_cast<uint32_t>(n), 0, 0, 0, 0, 0, {0, 0}};
  if (kind == TestKind::kPacket) std::memcpy(b.in_buf.data(), &meta, sizeof meta);
  if (bpf_map_update_elem(b.in, &zero, b.in_buf.data(), BPF_ANY)) return -errno;
  LIBBPF_OPTS(bpf_test_run_opts, o);
  uint32_t ctx[2] = {static_cast<uint32_t>(n), 0};
  if (kind == TestKind::kPacket) {
    o.data_in = b.frame.data();
    o.data_size_in = static_cast<uint32_t>(b.frame.size());
  } else {
    o.ctx_in = ctx;
    o.ctx_size_in = sizeof ctx;
  }
  if (bpf_prog_test_run_opts(b.prog, &o)) return -errno;
  // A packet batch's decisions come back in its own value, the others' in syr_test_out.
  std::vector<uint8_t>& res = kind == TestKind::kPacket ? b.in_buf : b.out_buf;
  if (bpf_map_lookup_elem(kind == TestKind::kPacket ? b.in : b.out, &zero, res.data())) return -errno;
  size_t at = 0, ran = o.retval;
  if (kind == TestKind::kPacket) {
    std::memcpy(&meta, res.data(), sizeof meta);
    ran = meta.next;
    at = kPacketDecisions;
  }
  if (ran != n) return -EIO;
  for (size_t i = 0; i < n; i++) {
    TestThreadOut t{};
    if (kind == TestKind::kThread) std::memcpy(&t, &res[i * sizeof t], sizeof t);
    else std::memcpy(&t.decision, &res[at + i * sizeof t.decision], sizeof t.decision);
    out.push_back(t);
  }
  return 0;
}

// The next batch's size: batches start at one input, grow while they take under 5 ms
// and shrink past 20, so the time bound is checked every few ms however long one input
// runs (short of one input alone outlasting it), and an XDP test run, which holds its
// CPU without preemption for the whole batch, holds it no longer than one run per
// input did, plus a few ms.
size_t next_batch(size_t cur, std::chrono::nanoseconds took) {
  if (took < std::chrono::milliseconds(5)) return std::min(cur * 2, kBatch);
  if (took > std::chrono::milliseconds(20)) return std::max<size_t>(cur / 2, 1);
  return cur;
}

}  // namespace

void TestRunJob::run() {
  deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(max_ms);
  std::unique_ptr<LoadedPolicy> p;
  if ((err = load_policy(spec, p, fail))) return;
  std::string why;
  if ((err = set_maps(*p, maps, why))) {
    fail.message = why;
    return;
  }
  Batch batch;
  if ((err = batch.open(*p))) {
    fail.message = "the test build lacks its batch maps";
    return;
  }
  std::vector<TestThreadOut> outs;
  outs.reserve(inputs.size());
  auto start = std::chrono::steady_clock::now();
  for (size_t i = 0, max = 1; i < inputs.size();) {
    auto t0 = std::chrono::steady_clock::now();
    if (t0 >= deadline) {
      err = -ETIMEDOUT;
      fail.message = "the test run was stopped after " + std::to_string(max_ms) + " ms at input " +
                     std::to_string(i) + " of " + std::to_string(inputs.size()) + ": a test run may take at most " +
                     std::to_string(max_ms) + " ms (syrupd --test_run_max_ms)";
      return;
    }
    size_t n = stage(kind, inputs, i, max, batch);
    if ((err = run_batch(kind, batch, n, outs))) {
      fail.message = "the test run of inputs " + std::to_string(i) + ".." + std::to_string(i + n - 1) +
                     " failed: " + std::strerror(-err);
      return;
    }
    i += n;
    max = std::min(next_batch(max, std::chrono::steady_clock::now() - t0), max_batch);
  }
  auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count();
  json results = json::array();
  for (auto& o : outs)
    results.push_back(kind == TestKind::kThread ? json{{"decision", o.decision}, {"key", o.key}, {"slice_ns", o.slice_ns}}
                                                : json{{"decision", o.decision}});
  json dumped = json::object();
  if (std::find(dump.begin(), dump.end(), "*") != dump.end()) {
    dump = p->user_maps;
    if (dump.size() > TestRunLimits::kDumpMaps) dump.resize(TestRunLimits::kDumpMaps);
  }
  for (auto& name : dump) {
    MapShape m;
    if ((err = policy_map(*p, name, m, why))) {
      fail.message = why;
      return;
    }
    dumped[name] = dump_map(m);
  }
  bpf_prog_info info{};
  uint32_t len = sizeof info;
  bpf_prog_get_info_by_fd(batch.prog, &info, &len);
  result = {{"results", std::move(results)}, {"maps", std::move(dumped)}, {"run_ns", ns},
            {"insns", info.xlated_prog_len / 8}, {"jited", info.jited_prog_len > 0}};
}  // the object closes here: the program and every map of the run are freed

// Check, compile (parked on the compile workers), load and run (parked on the load
// workers), answer: each resume runs this again with what the workers did.
Daemon::Response Daemon::test_run(const Caller& caller, proto::Message& req) {
  std::unique_ptr<Deferred> resumed = std::move(resumed_);
  auto fail = [](int e, const std::string& why, const std::string& log = "") {
    return Response{proto::error_response(e, why, log)};
  };
  auto answer_of = [&](const TestRunJob& job) {
    if (job.err) return fail(-job.err, job.fail.message, job.fail.log);
    json out = job.result;
    out["cached"] = job.cached;
    return Response{ok(out)};
  };
  if (resumed && resumed->test) return answer_of(*resumed->test);
  const json& b = req.body;
  std::string hook = b.contains("hook") && b["hook"].is_string() ? b["hook"].get<std::string>() : "";
  Hook* hi = hook_named(hook);
  if (!hi) return fail(EINVAL, "unknown hook '" + names::printable(hook) + "' (known: " + hook_names() + ")");
  std::string name, source_name;
  policy_names(b, name, source_name);
  std::string source = b.contains("source") && b["source"].is_string() ? b["source"].get<std::string>() : "";
  for (auto [what, v] : {std::pair{"policy", &name}, std::pair{"source", &source_name}})
    if (std::string why = names::check(what, *v, names::Kind::kDisplay); !why.empty()) return fail(EINVAL, why);
  if (source.empty()) return fail(EINVAL, "the policy source is empty");
  if (std::string why = names::source_size(source.size(), cfg_.max_source_bytes, "syrupd --max_source_bytes");
      !why.empty())
    return fail(EFBIG, why);
  if (source.find('\0') != std::string::npos) return fail(EINVAL, "policy source contains NUL bytes: not C source text");
  auto job = std::make_shared<TestRunJob>();
  std::string why;
  if (int r = parse_test_run(b, *hi, *job, why)) return fail(-r, why);

  CompileJob cj{source, source_name, hi->compile_define(), job->wrapper};
  CompileResult cr;
  if (resumed) {
    cr = resumed->result;
  } else if (may_park_ && !compiler_.cached(cj)) {
    Response parked;
    parked.park = std::make_unique<Deferred>();
    parked.park->job = std::move(cj);
    return parked;
  } else {
    cr = compiler_.compile(cj);
  }
  if (cr.err) return fail(-cr.err, "policy " + name + " does not compile", cr.diagnostics);

  LoadSpec& s = job->spec;
  s.object_path = cr.object_path;
  s.private_run = true;  // nothing pinned or shared: every map is the run's own
  s.policy_name = name;
  s.hook = hook;
  s.params["syr_test_seed"] = job->seed;
  s.system_maps = hi->system_maps();
  s.system_maps.insert(s.system_maps.end(), {"syr_test_in", "syr_test_out"});
  s.allowed = hi->allowlist();
  // The test wrappers' own calls: staging a packet input in the frame, the batch loop.
  s.allowed.helpers.insert({BPF_FUNC_xdp_load_bytes, BPF_FUNC_xdp_get_buff_len, BPF_FUNC_map_lookup_elem,
                            BPF_FUNC_xdp_adjust_tail, BPF_FUNC_xdp_store_bytes, BPF_FUNC_loop});
  // The run's maps are its own, bounded here; its instructions by the caller's quota.
  size_t insns = caller.admin() ? SIZE_MAX : cfg_.quotas.insns;
  s.check_quota = [insns](const LoadFootprint& fp) -> std::string {
    if (fp.new_map_bytes > TestRunLimits::kMapBytes)
      return "the policy's maps take " + std::to_string(fp.new_map_bytes) + " bytes; a test run allows at most " +
             std::to_string(TestRunLimits::kMapBytes);
    if (fp.insns > insns)
      return "the policy has " + std::to_string(fp.insns) + " instructions, over the quota of " +
             std::to_string(insns) + " (syrupd --quota_insns)";
    return {};
  };
  job->cached = cr.cached;
  job->max_ms = cfg_.test_run_max_ms;
  if (!may_park_) {
    job->run();
    return answer_of(*job);
  }
  Response parked;
  parked.park = std::make_unique<Deferred>();
  parked.park->test = job;
  return parked;
}

}  // namespace syrup
