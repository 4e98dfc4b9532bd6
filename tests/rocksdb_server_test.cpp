// Integration tests of examples/rocksdb/kv_server: a real syrupd, a real kv_server process
// with a small RocksDB it creates itself, real datagrams on loopback.
//
// Design: answers are checked against the database itself -- the test opens the server's
// RocksDB read-only next to it (a read-only RocksDB takes no lock) and computes what each
// GET and SCAN must return -- and against the generator in kv_proto.h. One server serves
// the read-only checks of the whole suite (it is started once, ~1 s with the load); the
// shutdown test starts its own, because it ends it. Everything is torn down by RAII: the
// server gets SIGTERM then SIGKILL, the database directory is removed, syrupd is stopped.
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <random>
#include <set>
#include <map>
#include <thread>

#include <nlohmann/json.hpp>
#include <rocksdb/db.h>
#include <rocksdb/options.h>

#include "harness.h"
#include "kv_test_util.h"
#include "syrup/syrup.h"

namespace syrup::test {
namespace {

using nlohmann::json;

constexpr uint64_t kKeys = 20000;  // a SCAN of all of them takes milliseconds
constexpr uint32_t kScanLen = 40;
constexpr int kWorkers = 3;

// A kv_server process of the suite's syrupd, on a fresh port.
struct ServerProc {
  std::unique_ptr<Child> child;
  json ready;
  uint16_t port = 0;
};

std::unique_ptr<ServerProc> start_server(const std::string& db, const std::string& policy,
                                         const std::string& app, const std::string& errfile,
                                         const std::vector<std::string>& extra = {}) {
  auto s = std::make_unique<ServerProc>();
  std::vector<std::string> argv{build_bin("kv_server"), "--db=" + db, "--keys=" + std::to_string(kKeys),
                                "--workers=" + std::to_string(kWorkers), "--scan_len=" + std::to_string(kScanLen),
                                "--policy=" + source_path("policies/" + policy), "--app=" + app, "--cache_mb=16"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  s->child = std::make_unique<Child>(argv, errfile);
  auto line = s->child->read_line(30000);
  if (!line) return s;
  s->ready = json::parse(*line, nullptr, false);
  if (s->ready.is_object() && s->ready.contains("port")) s->port = s->ready["port"].get<uint16_t>();
  return s;
}

// The server's summed counters (its STATS answer's "total"), or null if it did not answer.
json server_totals(KvClient& c) {
  auto r = c.call(KV_STATS, 0, 9999);
  if (!r || r->hdr.status != KV_OK) return json();
  return json::parse(r->body, nullptr, false)["total"];
}

// The server's worker threads, named kv-w<i>: tid -> i.
std::map<pid_t, int> workers_of(pid_t pid) {
  std::map<pid_t, int> w;
  for (auto& t : std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/task")) {
    std::string comm = read_text(t.path().string() + "/comm");
    if (comm.rfind("kv-w", 0) == 0) w[std::stoi(t.path().filename().string())] = std::stoi(comm.substr(4));
  }
  return w;
}

// With --core_share 0.02 (0.1 with a reservation): a SCAN of every key costs milliseconds
// of CPU, 50 (10) times as long on the emulated core. The worker must not run ahead of its emulated core (a reservation
// would make it owe the kernel for it afterwards): it holds, and the SCAN's answer takes
// at least a hold's threshold.
void expect_scan_paced(KvClient& c) {
  json before = server_totals(c);
  ASSERT_TRUE(before.is_object());
  auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(c.send_req(KV_SCAN, 0, 77, kKeys));
  auto r = c.recv_reply(20000);
  auto took = std::chrono::steady_clock::now() - t0;
  ASSERT_TRUE(r) << "no answer to the SCAN";
  EXPECT_EQ(r->hdr.count, kKeys);
  json after = server_totals(c);
  ASSERT_TRUE(after.is_object());
  EXPECT_GT(after["core_holds"].get<uint64_t>(), before["core_holds"].get<uint64_t>())
      << "the worker ran the SCAN without ever holding for its emulated core";
  EXPECT_GE(took, std::chrono::microseconds(200)) << "the SCAN took less than one hold";
}

class KvServer : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!(daemon_ = start_suite_daemon())) return;
    dir_ = new TempDir();
    server_ = start_server(dir_->path() + "/db", "round_robin.c", "kvtest", dir_->path() + "/server.err").release();
  }
  static void TearDownTestSuite() {
    delete server_;  // SIGTERM (and SIGKILL if it hangs)
    server_ = nullptr;
    stop_suite_daemon(daemon_);
    delete dir_;  // removes the database
    dir_ = nullptr;
  }
  void SetUp() override {
    SYRUP_REQUIRE_ROOT();
    ASSERT_NE(server_, nullptr);
    ASSERT_NE(server_->port, 0) << "kv_server did not start:\n" << read_text(dir_->path() + "/server.err");
  }

  // The server's database, opened read-only next to it.
  static std::unique_ptr<rocksdb::DB> open_db_readonly() {
    rocksdb::DB* db = nullptr;
    rocksdb::Status s = rocksdb::DB::OpenForReadOnly(rocksdb::Options(), dir_->path() + "/db", &db);
    EXPECT_TRUE(s.ok()) << s.ToString();
    return std::unique_ptr<rocksdb::DB>(db);
  }

  static Daemon* daemon_;
  static TempDir* dir_;
  static ServerProc* server_;
};
Daemon* KvServer::daemon_ = nullptr;
TempDir* KvServer::dir_ = nullptr;
ServerProc* KvServer::server_ = nullptr;

TEST_F(KvServer, GetReturnsExactlyWhatRocksDbHolds) {
  auto db = open_db_readonly();
  ASSERT_TRUE(db);
  KvClient c(server_->port);
  std::mt19937_64 rng(42);
  std::vector<uint64_t> keys = {0, 1, kKeys - 1};
  for (int i = 0; i < 60; i++) keys.push_back(rng() % kKeys);
  std::set<uint32_t> workers;
  uint64_t id = 1;
  for (uint64_t k : keys) {
    auto r = c.call(KV_GET, k, id);
    ASSERT_TRUE(r) << "no answer to GET " << k;
    EXPECT_EQ(r->hdr.status, KV_OK);
    EXPECT_EQ(r->hdr.type, static_cast<uint32_t>(KV_GET));
    EXPECT_EQ(r->hdr.id, id);
    EXPECT_EQ(r->hdr.stamp, id * 7) << "the stamp must be echoed";
    char key[KV_KEY_LEN + 1];
    kv_key(k, key);
    std::string want;
    ASSERT_TRUE(db->Get(rocksdb::ReadOptions(), rocksdb::Slice(key, KV_KEY_LEN), &want).ok());
    EXPECT_EQ(r->body, want) << "GET " << k;
    EXPECT_EQ(r->hdr.len, want.size());
    EXPECT_EQ(r->hdr.digest, kv_digest(KV_FNV_BASIS, want.data(), want.size()));
    char gen[KV_VALUE_LEN];
    kv_value(k, gen);
    EXPECT_EQ(want, std::string(gen, sizeof gen)) << "the DB holds the generator's value";
    workers.insert(r->hdr.worker);
    id++;
  }
  EXPECT_EQ(workers.size(), static_cast<size_t>(kWorkers)) << "round_robin reaches every worker";

  auto r = c.call(KV_GET, kKeys, id);  // one past the last key
  ASSERT_TRUE(r);
  EXPECT_EQ(r->hdr.status, KV_NOT_FOUND);
  EXPECT_EQ(r->hdr.len, 0u);
}

TEST_F(KvServer, ScanVisitsTheRangeRocksDbHolds) {
  auto db = open_db_readonly();
  ASSERT_TRUE(db);
  KvClient c(server_->port);
  struct Case {
    uint64_t key;
    uint32_t scan_len;  // 0: the server's default (kScanLen)
  } cases[] = {{0, 0}, {1234, 0}, {kKeys - 10, 0}, {17, 1}, {500, 333}, {kKeys - 1, 5}, {kKeys + 5, 0}};
  uint64_t id = 100;
  for (auto& cs : cases) {
    // Expected: iterate the DB from the key, as many keys as asked, digest keys and values.
    uint32_t n = cs.scan_len ? cs.scan_len : kScanLen, count = 0;
    uint64_t h = KV_FNV_BASIS;
    char key[KV_KEY_LEN + 1];
    kv_key(cs.key, key);
    std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(rocksdb::ReadOptions()));
    for (it->Seek(rocksdb::Slice(key, KV_KEY_LEN)); it->Valid() && count < n; it->Next()) {
      if (it->key()[0] != 'k') break;
      h = kv_digest(h, it->key().data(), it->key().size());
      h = kv_digest(h, it->value().data(), it->value().size());
      count++;
    }
    auto r = c.call(KV_SCAN, cs.key, id++, cs.scan_len);
    ASSERT_TRUE(r) << "no answer to SCAN " << cs.key;
    EXPECT_EQ(r->hdr.status, KV_OK);
    EXPECT_EQ(r->hdr.type, static_cast<uint32_t>(KV_SCAN));
    EXPECT_EQ(r->hdr.count, count) << "SCAN " << cs.key << " len " << cs.scan_len;
    EXPECT_EQ(r->hdr.digest, h) << "SCAN " << cs.key << " len " << cs.scan_len;
  }
}

TEST_F(KvServer, MalformedAndTruncatedDatagramsAreCountedAnsweredAndSurvived) {
  KvClient c(server_->port);
  json before = server_totals(c);
  ASSERT_TRUE(before.is_object());

  // Truncated: nothing, 3 bytes (not even a type), 31 bytes (one short of a request).
  char req[64] = {};
  uint32_t get = htole32(KV_GET);
  memcpy(req, &get, 4);
  for (size_t len : {0, 3, 31}) {
    ASSERT_TRUE(c.send_raw(req, len));
    auto r = c.recv_reply();
    ASSERT_TRUE(r) << len << "-byte datagram not answered";
    EXPECT_EQ(r->hdr.status, KV_BAD_REQUEST) << len;
  }
  // Oversized: longer than any request the server accepts.
  std::string big(KV_MAX_DATAGRAM + 500, 'x');
  memcpy(big.data(), &get, 4);
  ASSERT_TRUE(c.send_raw(big.data(), big.size()));
  auto r = c.recv_reply();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->hdr.status, KV_BAD_REQUEST);
  // A full-size request of an unknown type.
  r = c.call(99, 1, 77);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->hdr.status, KV_BAD_REQUEST);
  EXPECT_EQ(r->hdr.type, 99u);
  EXPECT_EQ(r->hdr.id, 77u) << "an error echoes what it could read";

  json after = server_totals(c);
  ASSERT_TRUE(after.is_object());
  EXPECT_EQ(after["truncated"].get<uint64_t>() - before["truncated"].get<uint64_t>(), 3u);
  EXPECT_EQ(after["oversized"].get<uint64_t>() - before["oversized"].get<uint64_t>(), 1u);
  EXPECT_EQ(after["bad_type"].get<uint64_t>() - before["bad_type"].get<uint64_t>(), 1u);

  // Garbage of every length up to 100 bytes, random contents (sometimes a valid type
  // with garbage around it): every datagram is answered and the server keeps serving.
  std::mt19937_64 rng(7);
  int sent = 0, answered = 0;
  for (int batch = 0; batch < 20; batch++) {
    for (int i = 0; i < 100; i++) {
      char g[100];
      for (auto& b : g) b = static_cast<char>(rng());
      size_t len = rng() % sizeof g;
      if (len >= 4 && rng() % 4 == 0) {
        uint32_t t = htole32(1 + rng() % 3);
        memcpy(g, &t, 4);
      }
      ASSERT_TRUE(c.send_raw(g, len));
      sent++;
    }
    // Read the answers batch by batch, so no socket buffer on either side overflows.
    while (answered < sent && c.recv_reply(3000)) answered++;
  }
  EXPECT_EQ(answered, sent) << "every datagram gets an answer";
  r = c.call(KV_GET, 5, 12345);
  ASSERT_TRUE(r) << "the server stopped answering after garbage";
  EXPECT_EQ(r->hdr.status, KV_OK);
  EXPECT_EQ(r->hdr.id, 12345u);
  EXPECT_EQ(server_->child->wait(0), -2) << "kv_server exited";
}

TEST_F(KvServer, ScanMarksItsWorkerInScanMapWhileItRuns) {
  // A server of its own with scan_avoid, so scan_map exists; a SCAN over every key is long
  // enough (milliseconds) to see the mark through the test's own mapping of the map.
  auto s = start_server(dir_->path() + "/db", "scan_avoid.c", "kvtest-hints", dir_->path() + "/hints.err");
  ASSERT_NE(s->port, 0) << read_text(dir_->path() + "/hints.err");
  EXPECT_TRUE(s->ready["hints"]["scan_map"].get<bool>());
  syr_mapped_array m{};
  ASSERT_EQ(mmap_app_map("scan_map", &m, "kvtest-hints"), "");
  KvClient c(s->port);
  // Several tries: on a busy machine this thread may not run during one whole SCAN.
  bool seen = false;
  for (int attempt = 0; attempt < 20 && !seen; attempt++) {
    ASSERT_TRUE(c.send_req(KV_SCAN, 0, 1, kKeys));
    auto t0 = std::chrono::steady_clock::now();
    while (!seen && std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(500)) {
      for (uint32_t i = 0; i < kWorkers; i++) seen |= syr_hint_get(&m, i) != 0;
    }
    auto r = c.recv_reply(5000);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->hdr.count, kKeys);
  }
  EXPECT_TRUE(seen) << "no worker was ever marked busy during a SCAN";
  // More SCANs at once than workers: scan_avoid stacks them (all marked: round robin over
  // all), so a worker's count goes above 1 and must come back to 0 SCAN by SCAN.
  for (uint32_t i = 0; i < 2 * kWorkers; i++) ASSERT_TRUE(c.send_req(KV_SCAN, 100 + i, 1, kKeys));
  uint64_t most = 0;
  for (uint32_t i = 0; i < kWorkers; i++) most = std::max(most, syr_hint_get(&m, i));
  for (uint32_t i = 0; i < 2 * kWorkers; i++) ASSERT_TRUE(c.recv_reply(10000)) << "SCAN " << i << " unanswered";
  EXPECT_GE(most, 2u) << "no worker held two SCANs at once";
  for (uint32_t i = 0; i < kWorkers; i++) EXPECT_EQ(syr_hint_get(&m, i), 0u) << "mark left on worker " << i;
  syr_map_munmap(&m);
  EXPECT_EQ(s->child->stop(10000), 0);
}

// scan_avoid counts a SCAN when it steers it, before the server sees the datagram. A SCAN
// that never reaches a worker must not leave its count behind, or scan_avoid avoids that
// worker for good: a datagram of type SCAN the server rejects (truncated, oversized)
// comes off at once; SCANs the kernel dropped at a full socket buffer (receive buffers
// of a few datagrams, a burst of long SCANs) come off when their worker is idle.
TEST_F(KvServer, CountsOfScansThatNeverReachAWorkerAreTakenOff) {
  auto s = start_server(dir_->path() + "/db", "scan_avoid.c", "kvtest-lost", dir_->path() + "/lost.err",
                        {"--rcvbuf=2048"});
  ASSERT_NE(s->port, 0) << read_text(dir_->path() + "/lost.err");
  syr_mapped_array m{};
  ASSERT_EQ(mmap_app_map("scan_map", &m, "kvtest-lost"), "");
  auto marks = [&] {
    std::vector<uint64_t> v;
    for (uint32_t i = 0; i < kWorkers; i++) v.push_back(syr_hint_get(&m, i));
    return v;
  };
  const std::vector<uint64_t> none(kWorkers, 0);
  KvClient c(s->port);
  json before = server_totals(c);
  ASSERT_TRUE(before.is_object());

  // Rejected: SCAN-typed datagrams one byte short of a request, and oversized ones.
  char req[64] = {};
  uint32_t scan = htole32(KV_SCAN);
  memcpy(req, &scan, 4);
  std::string big(KV_MAX_DATAGRAM + 100, 'x');
  memcpy(big.data(), &scan, 4);
  for (int i = 0; i < 10; i++) {
    ASSERT_TRUE(i % 2 ? c.send_raw(big.data(), big.size()) : c.send_raw(req, sizeof(kv_request) - 1));
    auto r = c.recv_reply();
    ASSERT_TRUE(r) << "rejected datagram " << i << " not answered";
    EXPECT_EQ(r->hdr.status, KV_BAD_REQUEST);
  }
  EXPECT_EQ(marks(), none) << "the counts of rejected SCANs were left in scan_map";
  json mid = server_totals(c);
  ASSERT_TRUE(mid.is_object());
  EXPECT_EQ(mid["scan_marks_cleared"].get<uint64_t>(), before["scan_marks_cleared"].get<uint64_t>())
      << "rejects are taken off when rejected, not found idle later";

  // Dropped: a burst of SCANs over every key (milliseconds each) into buffers of a few
  // datagrams.
  constexpr int kBurst = 200;
  for (int i = 0; i < kBurst; i++) ASSERT_TRUE(c.send_req(KV_SCAN, 0, 1000 + i, kKeys));
  int answered = 0;
  while (c.recv_reply(3000)) answered++;
  json after = server_totals(c);
  ASSERT_TRUE(after.is_object());
  uint64_t drops = after["kernel_drops"].get<uint64_t>() - mid["kernel_drops"].get<uint64_t>();
  ASSERT_GT(drops, 0u) << "the burst did not overflow the receive buffers (" << answered << " answered)";
  EXPECT_EQ(static_cast<uint64_t>(answered) + drops, static_cast<uint64_t>(kBurst));
  // The STATS answer above came from an idle worker; the others may still be finishing.
  std::vector<uint64_t> left;
  for (int t = 0; t < 100 && (left = marks()) != none; t++)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(left, none) << "counts of SCANs the kernel dropped were left in scan_map";
  json fin = server_totals(c);
  ASSERT_TRUE(fin.is_object());
  EXPECT_GT(fin["scan_marks_cleared"].get<uint64_t>(), mid["scan_marks_cleared"].get<uint64_t>());
  syr_map_munmap(&m);
  EXPECT_EQ(s->child->stop(10000), 0);
}

TEST_F(KvServer, CoreShareGivesEachWorkerADeadlineReservationOfItsOwn) {
  // --core_share (the study's emulation of a core per worker): every worker thread runs
  // under SCHED_DEADLINE with runtime = share x period, and the server still answers.
  // The budget is 1 ms every 10 ms: with 20 us every 1 ms (0.02 of 1 ms, as until commit
  // cb3056c) a worker's own wake-ups can take the whole budget on this VM (kv-w1 was measured
  // at ~57 us of CPU per switch, 350 switches a second), and a SCAN of every key then did
  // not finish in 20 s.
  auto s = start_server(dir_->path() + "/db", "round_robin.c", "kvtest-share", dir_->path() + "/share.err",
                        {"--core_share=0.1", "--core_period_us=10000"});
  if (s->port == 0) {
    std::string err = read_text(dir_->path() + "/share.err");
    if (err.find("admits no more deadline bandwidth") != std::string::npos)
      GTEST_SKIP() << "the kernel admits no more SCHED_DEADLINE bandwidth here: " << err;
    FAIL() << "kv_server --core_share did not start:\n" << err;
  }
  auto tids = workers_of(s->child->pid());
  for (auto [tid, i] : tids) {
    SchedAttr a;
    int e = sched_attr_get(tid, a);
    ASSERT_EQ(e, 0) << strerror(-e);
    EXPECT_EQ(a.sched_policy, syrup::kSchedDeadline) << "worker " << tid << " is not SCHED_DEADLINE";
    EXPECT_EQ(a.sched_runtime, 1'000'000u) << "worker " << tid;
    EXPECT_EQ(a.sched_period, 10'000'000u) << "worker " << tid;
  }
  EXPECT_EQ(tids.size(), static_cast<size_t>(kWorkers));
  KvClient c(s->port);
  for (int i = 0; i < 30; i++) {
    auto r = c.call(KV_GET, static_cast<uint64_t>(i), static_cast<uint64_t>(i));
    ASSERT_TRUE(r) << "no answer to GET " << i;
    EXPECT_EQ(r->hdr.status, KV_OK);
  }
  expect_scan_paced(c);
  EXPECT_EQ(s->child->stop(10000), 0) << read_text(dir_->path() + "/share.err");
}

TEST_F(KvServer, CoreSharePacingOnlyKeepsWorkersOnTheirCpuInTheFairClass) {
  // --core_deadline=false (the study's default since commit 91c204c): the emulated core is the
  // pacing alone, so the workers stay in the fair class on --cpus (a deadline reservation
  // would have to span every CPU, the load generator's too) and still hold for it.
  int cpu = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN)) - 1;
  // --core_hold_us 2000: at share 0.02 a worker runs 40 us of CPU between holds (4 us at
  // the default 200), so the few us each hold's wake-up and clock reads cost stay a small
  // part of its budget. In two fresh-clone runs of the whole suite (2026-11-26) the SCAN at
  // the default got no answer in 20 s and the server did not stop in 10 s; alone it
  // passes in 2 s (cause not confirmed; the worker checks g_stop only between requests).
  auto s = start_server(dir_->path() + "/db", "round_robin.c", "kvtest-pace", dir_->path() + "/pace.err",
                        {"--core_share=0.02", "--core_deadline=false", "--core_hold_us=2000",
                         "--cpus=" + std::to_string(cpu)});
  ASSERT_NE(s->port, 0) << read_text(dir_->path() + "/pace.err");
  auto tids = workers_of(s->child->pid());
  for (auto [tid, i] : tids) {
    SchedAttr a;
    int e = sched_attr_get(tid, a);
    ASSERT_EQ(e, 0) << strerror(-e);
    EXPECT_EQ(a.sched_policy, static_cast<uint32_t>(SCHED_OTHER)) << "worker " << tid << " left the fair class";
    cpu_set_t set;
    ASSERT_EQ(sched_getaffinity(tid, sizeof set, &set), 0) << strerror(errno);
    EXPECT_EQ(CPU_COUNT(&set), 1) << "worker " << tid << " may run on more CPUs than --cpus";
    EXPECT_TRUE(CPU_ISSET(cpu, &set)) << "worker " << tid << " is not on CPU " << cpu;
  }
  EXPECT_EQ(tids.size(), static_cast<size_t>(kWorkers));
  KvClient c(s->port);
  auto r = c.call(KV_GET, 1, 1);
  ASSERT_TRUE(r) << "no answer to a GET";
  EXPECT_EQ(r->hdr.status, KV_OK);
  expect_scan_paced(c);
  EXPECT_EQ(s->child->stop(10000), 0) << read_text(dir_->path() + "/pace.err");
}

TEST_F(KvServer, CoreShareWithYieldingIsRefusedWithAClearError) {
  auto s = start_server(dir_->path() + "/db", "round_robin.c", "kvtest-share2", dir_->path() + "/share2.err",
                        {"--core_share=0.1", "--yield_keys=10"});
  EXPECT_EQ(s->port, 0);
  EXPECT_EQ(s->child->stop(10000), 2);
  EXPECT_NE(read_text(dir_->path() + "/share2.err").find("deadline reservations excludes --yield_keys"), std::string::npos)
      << read_text(dir_->path() + "/share2.err");
}

// --thread_policy (the study's cross-layer pair): the server deploys the thread policy
// beside its socket policy and each worker registers itself as the executor of its
// socket, so the thread policy reads the hints the socket policy writes for the same
// index. The application's syrup_threads map holds exactly the server's kv-w threads,
// worker i as executor i; requests are still answered; on SIGTERM both policies go.
TEST_F(KvServer, ThreadPolicyRegistersEachWorkerAsTheExecutorOfItsSocket) {
  auto s = start_server(dir_->path() + "/db", "scan_avoid.c", "kvtest-thr", dir_->path() + "/thr.err",
                        {"--thread_policy=" + source_path("policies/get_first.c")});
  ASSERT_NE(s->port, 0) << read_text(dir_->path() + "/thr.err");
  int thread_id = s->ready["thread_policy_id"].get<int>();
  ASSERT_GT(thread_id, 0) << s->ready.dump();
  pid_t pid = s->ready["pid"].get<pid_t>();

  std::string out;
  ASSERT_EQ(run_cmd(build_bin("syrupctl") + " --json map dump --app kvtest-thr syrup_threads", out), 0) << out;
  std::map<pid_t, int> executor_of;
  json dump = json::parse(out);
  for (auto& e : dump["entries"]) executor_of[e["key_int"].get<pid_t>()] = e["value_int"].get<int>();
  std::map<pid_t, int> workers = workers_of(pid);
  ASSERT_EQ(workers.size(), size_t(kWorkers));
  EXPECT_EQ(executor_of, workers) << "syrup_threads (tid -> executor) must be the server's workers, kv-w<i> as i: " << out;

  {
    KvClient c(s->port);
    for (int i = 0; i < 30; i++) c.send_req(i % 10 ? KV_GET : KV_SCAN, i, i);
    int got = 0;
    while (got < 30 && c.recv_reply()) got++;
    EXPECT_EQ(got, 30);
  }
  EXPECT_EQ(s->child->stop(10000), 0) << read_text(dir_->path() + "/thr.err");
  ASSERT_EQ(run_cmd(build_bin("syrupctl") + " --json list", out), 0) << out;
  EXPECT_EQ(out.find("kvtest-thr"), std::string::npos) << "a policy is still listed: " << out;
  EXPECT_FALSE(std::filesystem::exists(daemon_->bpffs_root() + "/apps/kvtest-thr"));
}

TEST_F(KvServer, ShutsDownCleanlyPolicyRemovedPinsGone) {
  auto s = start_server(dir_->path() + "/db", "scan_avoid.c", "kvtest-stop", dir_->path() + "/stop.err");
  ASSERT_NE(s->port, 0) << read_text(dir_->path() + "/stop.err");
  int id = s->ready["policy_id"].get<int>();
  ASSERT_GT(id, 0);
  std::string app_pins = daemon_->bpffs_root() + "/apps/kvtest-stop";
  EXPECT_TRUE(std::filesystem::exists(app_pins)) << "the live policy is pinned under " << app_pins;
  std::string out;
  ASSERT_EQ(run_cmd(build_bin("syrupctl") + " --json list", out), 0) << out;
  EXPECT_NE(out.find("kvtest-stop"), std::string::npos) << out;
  {
    KvClient c(s->port);
    for (int i = 0; i < 50; i++) c.send_req(i % 10 ? KV_GET : KV_SCAN, i, i);
    int got = 0;
    while (got < 50 && c.recv_reply()) got++;
    EXPECT_EQ(got, 50);
  }

  EXPECT_EQ(s->child->stop(10000), 0) << "kv_server must exit 0 on SIGTERM:\n" << read_text(dir_->path() + "/stop.err");
  json fin;
  std::string rest = s->child->rest();
  size_t p = rest.find("{\"event\":\"exit\"");
  if (p != std::string::npos) fin = json::parse(rest.substr(p, rest.find('\n', p) - p), nullptr, false);
  ASSERT_TRUE(fin.is_object()) << "no exit record";
  EXPECT_TRUE(fin["policy_removed"].get<bool>());
  EXPECT_EQ(fin["stats"]["total"]["get"].get<uint64_t>(), 45u);
  EXPECT_EQ(fin["stats"]["total"]["scan"].get<uint64_t>(), 5u);
  ASSERT_EQ(run_cmd(build_bin("syrupctl") + " --json list", out), 0) << out;
  EXPECT_EQ(out.find("kvtest-stop"), std::string::npos) << "policy still listed: " << out;
  EXPECT_FALSE(std::filesystem::exists(app_pins)) << "pins left behind in " << app_pins;
  // The port is free again: the sockets are closed.
  KvClient probe(s->port);
  probe.send_req(KV_GET, 1, 1);
  EXPECT_FALSE(probe.recv_reply(200)) << "something still answers on the server's port";
}

}  // namespace
}  // namespace syrup::test
