// Recordings at the thread hook (docs/recording.md), end to end: a thread policy deployed
// for threads of this test process is recorded with `syrupctl record` while the threads
// run and sleep, and the recording is replayed with `syrupctl replay`: through the same
// policy every decision comes out the same; through a changed one exactly the inputs the
// change concerns move, and the replay names them. Another user cannot record the policy.
//
// The same tests serve both backends: here (no sched_ext) the policy runs in the
// user-space agent; in the VM (tests/vm/run.sh, linked into syrup_thread_scx_tests) it
// runs in syrupd's sched_ext scheduler, which records from its wrapper
// (kernel/hooks/thread/scx_wrapper.bpf.h).
//
// The workload: each thread spins for 2 ms and sleeps for 1 ms, over and over. The agent
// asks the policy about every registered thread each period (5 ms), blocked ones too;
// the sched_ext backend at each wakeup, enqueue and dispatch.
#include <gtest/gtest.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "client.h"
#include "harness.h"
#include "record_refusals.h"
#include "security/security.h"
#include "syrup/recording.h"
#include "syrup/syrup.h"

namespace syrup::test {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

// Registered threads (executors 0..n-1) that spin 2 ms and sleep 1 ms until destroyed.
class Workers {
 public:
  explicit Workers(int n) : reg_(n, -1) {
    for (int i = 0; i < n; i++)
      threads_.emplace_back([this, i] {
        reg_[i] = syr_thread_register(static_cast<uint32_t>(i));
        ready_++;
        while (!stop_.load(std::memory_order_relaxed)) {
          auto until = Clock::now() + std::chrono::milliseconds(2);
          while (Clock::now() < until) {
          }
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
      });
    while (ready_.load() < n) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ~Workers() {
    stop_ = true;
    for (auto& t : threads_) t.join();
  }
  int reg_result(int i) const { return reg_[i]; }

 private:
  std::vector<int> reg_;
  std::vector<std::thread> threads_;
  std::atomic<int> ready_{0};
  std::atomic<bool> stop_{false};
};

// The thread records of a recording file; "" or what is wrong with it.
std::string thread_records(const std::string& bytes, std::vector<syr_rec_record>& out, syr_rec_record& trailer) {
  syr_rec_header h{};
  if (bytes.size() < sizeof h) return "shorter than a header";
  std::memcpy(&h, bytes.data(), sizeof h);
  if (std::memcmp(h.magic, SYR_REC_MAGIC, 8) != 0) return "bad magic";
  if (h.hook != SYR_HOOK_THREAD) return "hook " + std::to_string(h.hook) + ", not the thread hook's";
  trailer = {};
  for (size_t off = h.header_size; off + 16 <= bytes.size();) {
    syr_rec_record r{};
    std::memcpy(&r, bytes.data() + off, std::min(sizeof r, bytes.size() - off));
    if (r.size < 16 || r.size % 8 || off + r.size > bytes.size()) return "bad record size at " + std::to_string(off);
    if (r.type == SYR_REC_THREAD) out.push_back(r);
    else if (r.type == SYR_REC_TRAILER) trailer = r;
    else return "record type " + std::to_string(r.type) + " at " + std::to_string(off);
    off += r.size;
  }
  return trailer.type == SYR_REC_TRAILER ? "" : "no trailer";
}

class ThreadRecording : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { daemon_ = start_suite_daemon(); }
  static void TearDownTestSuite() { stop_suite_daemon(daemon_); }
  void SetUp() override {
    SYRUP_REQUIRE_ROOT();
    if (sysconf(_SC_NPROCESSORS_ONLN) < 2) GTEST_SKIP() << "needs 2 cores";
    ASSERT_NE(daemon_, nullptr);
  }
  void TearDown() override {
    for (int id : ids_) syr_remove_policy(id);
    ids_.clear();
    if (HasFailure()) {
      std::string log = daemon_->log();
      if (log.size() > 6000) log = log.substr(log.size() - 6000);
      std::printf("---- syrupd log (tail) ----\n%s\n---- end of syrupd log ----\n", log.c_str());
    }
  }
  int deploy(const std::string& rel, const char* app) {
    syr_set_app(app);
    syr_deploy_opts o{.sz = sizeof o, .app = app};
    int id = syr_deploy_policy(source_path(rel).c_str(), SYR_HOOK_THREAD, &o);
    if (id > 0) ids_.push_back(id);
    return id;
  }
  // syrupctl's standard output (and its errors, unless `json`: then stdout alone).
  std::string ctl(const std::string& args, int& rc, bool json = false) {
    std::string out, cmd = build_bin("syrupctl") + " --socket " + daemon_->socket() + " " + args;
    rc = run_cmd(json ? "{ " + cmd + " 2>/dev/null; }" : cmd, out);
    return out;
  }
  static Daemon* daemon_;
  std::vector<int> ids_;
  TempDir dir_;
};
Daemon* ThreadRecording::daemon_ = nullptr;

// locality.c answers each thread's last core (no steering is known): the recording holds
// one record per answer with the thread as the policy saw it, and its replay through
// locality.c gives every decision again; a copy that sends executor 1 to the kernel
// (SYR_PASS) moves exactly executor 1's inputs, and the replay's first moved inputs are
// all executor 1's.
TEST_F(ThreadRecording, ReplayGivesTheRecordedDecisionsAndAChangeMovesItsInputs) {
  ASSERT_GT(deploy("policies/locality.c", "threc"), 0) << syr_last_error();
  int id = ids_.back();
  Workers w(3);
  for (int i = 0; i < 3; i++) ASSERT_EQ(w.reg_result(i), 0) << syr_last_error();
  std::string rec = dir_.path() + "/loc.rec";
  int rc;
  std::string out = ctl("record " + std::to_string(id) + " --seconds 2 --count 3000 -o " + rec, rc);
  ASSERT_EQ(rc, 0) << out;

  std::vector<syr_rec_record> recs;
  syr_rec_record trailer;
  ASSERT_EQ(thread_records(read_text(rec), recs, trailer), "") << out;
  ASSERT_GE(recs.size(), 30u) << "the workers' decisions in 2 s: " << out;
  EXPECT_EQ(trailer.trailer.recorded, recs.size());
  pid_t self = getpid();
  size_t exec1 = 0;
  int ncpu = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  for (const auto& r : recs) {
    const syr_rec_thread& t = r.in.thread;
    if (t.tgid != static_cast<uint32_t>(self)) continue;  // the agent: only ours; sched_ext: the app's
    exec1 += t.executor == 1;
    EXPECT_EQ(r.in.decision, t.prev_cpu) << "locality answers the thread's last core";
    EXPECT_LT(t.prev_cpu, static_cast<uint32_t>(ncpu));
    EXPECT_EQ(r.in.outcome, static_cast<uint32_t>(SYR_REC_OUTCOME_ENFORCED));
    EXPECT_EQ(t.key_out, t.key) << "locality leaves the key";
  }
  ASSERT_GT(exec1, 0u) << "no record of executor 1";
  std::printf("  %zu decisions recorded in 2 s (%zu of executor 1); not recorded: %llu with the buffer full\n",
              recs.size(), exec1, static_cast<unsigned long long>(trailer.trailer.not_recorded_full));

  out = ctl("replay " + source_path("policies/locality.c") + " " + rec + " --json", rc, true);
  ASSERT_EQ(rc, 0) << out;
  json same = json::parse(out);
  EXPECT_EQ(same["inputs"], recs.size());
  EXPECT_EQ(same["moved"], 0) << same["first_moved"].dump();

  out = ctl("replay " + source_path("tests/policies/locality_exec1_pass.c") + " " + rec + " --json", rc, true);
  ASSERT_EQ(rc, 0) << out;
  json changed = json::parse(out);
  size_t moved_exec1 = 0;
  for (const auto& r : recs) moved_exec1 += r.in.thread.executor == 1 && r.in.decision != SYR_PASS;
  EXPECT_EQ(changed["moved"], moved_exec1) << "exactly executor 1's inputs move";
  ASSERT_FALSE(changed["first_moved"].empty());
  for (const auto& f : changed["first_moved"]) {
    EXPECT_EQ(f["input_fields"]["executor"], 1) << f.dump();
    EXPECT_EQ(f["replayed"], "pass") << f.dump();
    EXPECT_EQ(recs.at(f["input"].get<size_t>()).in.thread.executor, 1u) << "the moved input's index names it";
  }
}

// Another user's thread policy reads as missing to record and record_stop, in the same
// words as a policy that does not exist, and hands over no pipe. The refusal is syrupd's
// (the ownership check comes before the hook's backend is asked anything), so it runs
// on the host only: the emulated guest (SYRUP_SCX_GUEST) spent a syrupd start and a
// compile on it for nothing the agent run does not show.
#ifndef SYRUP_SCX_GUEST
TEST_F(ThreadRecording, AnotherUsersThreadPolicyCannotBeRecorded) {
  ASSERT_GT(deploy("policies/locality.c", "threc-victim"), 0) << syr_last_error();  // compiled already
  int id = ids_.back();
  Workers w(1);
  ASSERT_EQ(w.reg_result(0), 0) << syr_last_error();
  std::string sock = daemon_->socket();
  json got = record_refusals_as(security::kMallory, sock, id);
  expect_refused_as_missing(got);
  if (HasFatalFailure()) return;
  // The owner still can.
  int rc;
  std::string out = ctl("record " + std::to_string(id) + " --seconds 1 -o " + dir_.path() + "/own.rec", rc);
  EXPECT_EQ(rc, 0) << out;
}
#endif

}  // namespace
}  // namespace syrup::test
