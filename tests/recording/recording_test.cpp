// End-to-end tests of recordings (`syrupctl record`, `syrupctl trace`; docs/recording.md):
// a real syrupd, real policies in the running kernel, real datagrams. A known stream is
// recorded and each record is held against what was sent and where it went: its payload
// prefix against the datagram, its decision against the socket that got it (socket-
// select) or the policy's known order (XDP); the trailer's counts against the stream.
// The abuse tests run as kMallory, a user who does not own the policy.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "client.h"
#include "harness.h"
#include "record_refusals.h"
#include "harness_socket_select.h"
#include "syrup/abi.h"
#include "syrup/recording.h"
#include "syrup/syrup.h"

namespace syrup::test {
namespace {

using nlohmann::json;

constexpr uid_t kMallory = 62001;  // tests/security/security.h

struct Recording {
  syr_rec_header header{};
  std::vector<syr_rec_record> records;
  std::vector<std::string> payloads;
  bool has_trailer = false;
  syr_rec_record trailer{};
};

// Parses a recording file as docs/recording.md describes it; "" or what is wrong.
std::string parse(const std::string& bytes, Recording& out) {
  if (bytes.size() < sizeof out.header) return "shorter than a header: " + std::to_string(bytes.size()) + " bytes";
  std::memcpy(&out.header, bytes.data(), sizeof out.header);
  if (std::memcmp(out.header.magic, SYR_REC_MAGIC, 8) != 0) return "bad magic";
  for (size_t off = out.header.header_size; off < bytes.size();) {
    syr_rec_record r{};
    if (bytes.size() - off < 16) return "a cut record at " + std::to_string(off);
    std::memcpy(&r, bytes.data() + off, std::min(sizeof r, bytes.size() - off));
    if (r.size < 16 || r.size % 8 || off + r.size > bytes.size()) return "bad record size at " + std::to_string(off);
    if (out.has_trailer) return "a record after the trailer";
    if (r.type == SYR_REC_TRAILER) {
      out.has_trailer = true;
      out.trailer = r;
    } else {
      if (r.size != SYR_REC_RECORD_SIZE(r.in.cap_len)) return "record size does not fit its cap_len";
      out.records.push_back(r);
      out.payloads.emplace_back(bytes.data() + off + sizeof r, r.in.cap_len);
    }
    off += r.size;
  }
  return "";
}

// `syrupctl ARGS` on a thread of its own, started once syrupd says the recording runs.
class Background {
 public:
  Background(const Daemon& d, int id, const std::string& args) {
    size_t before = occurrences(d.log(), "recording policy " + std::to_string(id) + " ");
    t_ = std::thread([this, args] { rc_ = run_cmd(build_bin("syrupctl") + " " + args, out_); });
    started_ = log_says(d, "recording policy " + std::to_string(id) + " ", before + 1, 10000);
  }
  // Its exit status and output, once it is done.
  int wait(std::string& out) {
    if (t_.joinable()) t_.join();
    out = out_;
    return rc_;
  }
  ~Background() {
    if (t_.joinable()) t_.join();
  }
  bool started() const { return started_; }

 private:
  std::thread t_;
  int rc_ = -1;
  std::string out_;
  bool started_ = false;
};

class Recordings : public SocketSelectTest {
 protected:
  TempDir dir_;
  std::string file(const char* name) const { return dir_.path() + "/" + name; }
};

uint32_t key_of(const std::string& payload_from_l4) {
  uint32_t k = 0;
  if (payload_from_l4.size() >= 16) std::memcpy(&k, payload_from_l4.data() + 12, 4);  // UDP header, type, key
  return k;
}

// The stream is known (keys 0..199 on one flow), round robin decides: each record's
// payload is the datagram's first bytes, its decision the socket that got that key.
TEST_F(Recordings, SocketSelectRecordsEveryDatagramWithTheSocketThatGotIt) {
  UdpGroup g(4);
  int id = deploy("policies/round_robin.c", g);
  ASSERT_GT(id, 0) << syr_last_error();
  std::string path = file("rr.rec");
  Background rec(*daemon_, id, "record " + std::to_string(id) + " --count 200 --snap 20 -o " + path);
  ASSERT_TRUE(rec.started()) << daemon_->log();
  UdpClient c(g.port());
  for (uint32_t i = 0; i < 200; i++) c.send_request(1, i);
  std::string out;
  ASSERT_EQ(rec.wait(out), 0) << out;
  EXPECT_NE(out.find("recorded 200 inputs of policy " + std::to_string(id)), std::string::npos) << out;

  std::vector<std::vector<std::string>> got;
  EXPECT_EQ(g.drain(&got), (std::vector<int>{50, 50, 50, 50}));
  std::map<uint32_t, uint32_t> socket_of;
  for (uint32_t s = 0; s < got.size(); s++)
    for (auto& p : got[s]) socket_of[key_of(std::string(8, '\0') + p)] = s;

  Recording r;
  ASSERT_EQ(parse(read_text(path), r), "");
  EXPECT_EQ(r.header.version, 1u);
  EXPECT_EQ(r.header.hook, static_cast<uint32_t>(SYR_HOOK_SOCKET_SELECT));
  EXPECT_EQ(r.header.n_executors, 4u);
  EXPECT_EQ(r.header.snap_len, 20u);
  EXPECT_EQ(r.header.policy_id, static_cast<uint64_t>(id));
  EXPECT_STREQ(r.header.policy_name, "round_robin.c");
  ASSERT_EQ(r.records.size(), 200u);
  for (size_t i = 0; i < r.records.size(); i++) {
    const auto& rec = r.records[i];
    SCOPED_TRACE("record " + std::to_string(i));
    ASSERT_EQ(rec.type, SYR_REC_INPUT);
    EXPECT_EQ(rec.in.len, 24u) << "UDP header and the 16-byte datagram";
    ASSERT_EQ(rec.in.cap_len, 20u);
    uint32_t type, key;
    std::memcpy(&type, r.payloads[i].data() + 8, 4);
    std::memcpy(&key, r.payloads[i].data() + 12, 4);
    EXPECT_EQ(type, 1u);
    EXPECT_EQ(key, i) << "records keep the order of one flow's datagrams";
    EXPECT_EQ(ntohs(*reinterpret_cast<const uint16_t*>(r.payloads[i].data() + 2)), g.port()) << "UDP dport";
    EXPECT_EQ(rec.in.decision, socket_of.at(key)) << "the decision is the socket that got the datagram";
    EXPECT_EQ(rec.in.outcome, static_cast<uint32_t>(SYR_REC_OUTCOME_ENFORCED));
    EXPECT_EQ(rec.in.n_executors, 4u);
    EXPECT_EQ(rec.in.packet.ip_protocol, static_cast<uint32_t>(IPPROTO_UDP));
    if (i) {
      EXPECT_GE(rec.ts_ns, r.records[i - 1].ts_ns);
    }
  }
  ASSERT_TRUE(r.has_trailer);
  EXPECT_EQ(r.trailer.trailer.recorded, 200u);
  EXPECT_EQ(r.trailer.trailer.not_sampled, 0u);
  EXPECT_EQ(r.trailer.trailer.not_recorded_full, 0u);
  EXPECT_EQ(r.trailer.trailer.not_recorded_quota, 0u);
  EXPECT_EQ(r.trailer.trailer.end_reason, static_cast<uint32_t>(SYR_REC_END_DONE));

  // The example reader shows the same shares.
  std::string py;
  ASSERT_EQ(run_cmd("python3 " + source_path("examples/recording/read_recording.py") + " " + path, py), 0) << py;
  EXPECT_NE(py.find("200 inputs"), std::string::npos) << py;
  for (int e = 0; e < 4; e++)
    EXPECT_NE(py.find("executor " + std::to_string(e) + ": 50 (25.0%)"), std::string::npos) << py;
}

// Sampling keeps about one in N and counts the rest; the snap length bounds the payload;
// a recording ends at its --seconds and its trailer accounts for every input.
TEST_F(Recordings, SampledRecordingCountsWhatItSkipped) {
  UdpGroup g(2);
  int id = deploy("policies/round_robin.c", g);
  ASSERT_GT(id, 0) << syr_last_error();
  std::string path = file("sampled.rec");
  Background rec(*daemon_, id, "record " + std::to_string(id) + " --seconds 2 --sample 1/4 --snap 0 -o " + path);
  ASSERT_TRUE(rec.started());
  UdpClient c(g.port());
  for (uint32_t i = 0; i < 400; i++) c.send_request(1, i);
  std::string out;
  ASSERT_EQ(rec.wait(out), 0) << out;
  Recording r;
  ASSERT_EQ(parse(read_text(path), r), "");
  ASSERT_TRUE(r.has_trailer);
  const auto& t = r.trailer.trailer;
  EXPECT_EQ(t.recorded, r.records.size());
  EXPECT_EQ(t.recorded + t.not_sampled + t.not_recorded_full + t.not_recorded_quota, 400u);
  EXPECT_GT(t.recorded, 50u);
  EXPECT_LT(t.recorded, 150u) << "about one in four of 400";
  for (auto& rec : r.records) EXPECT_EQ(rec.in.cap_len, 0u);
  EXPECT_EQ(t.end_reason, static_cast<uint32_t>(SYR_REC_END_DONE));
  EXPECT_EQ(r.header.sample_every, 4u);
}

// The size quota ends a recording: what did not fit is counted, the file stays whole.
TEST_F(Recordings, TheSizeQuotaEndsARecording) {
  UdpGroup g(2);
  int id = deploy("policies/round_robin.c", g);
  ASSERT_GT(id, 0) << syr_last_error();
  std::string path = file("quota.rec");
  // The header (192 bytes) and 31 records of 120 bytes fit in 4000 bytes.
  Background rec(*daemon_, id, "record " + std::to_string(id) + " --snap 0 --max_bytes 4000 -o " + path);
  ASSERT_TRUE(rec.started());
  UdpClient c(g.port());
  for (uint32_t i = 0; i < 100; i++) c.send_request(1, i);
  std::string out;
  ASSERT_EQ(rec.wait(out), 0) << out;
  Recording r;
  ASSERT_EQ(parse(read_text(path), r), "");
  ASSERT_TRUE(r.has_trailer);
  EXPECT_EQ(r.records.size(), 31u);
  EXPECT_EQ(r.trailer.trailer.end_reason, static_cast<uint32_t>(SYR_REC_END_QUOTA));
  EXPECT_GE(r.trailer.trailer.not_recorded_quota, 1u);
}

// trace prints each decision as it is made (--json: one object a line).
TEST_F(Recordings, TraceStreamsDecisionsAsJsonLines) {
  UdpGroup g(2);
  int id = deploy("policies/round_robin.c", g);
  ASSERT_GT(id, 0) << syr_last_error();
  Background tr(*daemon_, id, "trace " + std::to_string(id) + " --count 6 --snap 16 --json");
  ASSERT_TRUE(tr.started());
  UdpClient c(g.port());
  for (uint32_t i = 0; i < 6; i++) c.send_request(1, i);
  std::string out;
  ASSERT_EQ(tr.wait(out), 0) << out;
  std::vector<json> lines;
  size_t at = 0;
  for (size_t nl; (nl = out.find('\n', at)) != std::string::npos; at = nl + 1) {
    json j = json::parse(out.substr(at, nl - at), nullptr, false);
    if (!j.is_discarded()) lines.push_back(j);
  }
  ASSERT_EQ(lines.size(), 7u) << out;
  uint32_t first = lines[0]["decision"].get<uint32_t>();
  for (uint32_t i = 0; i < 6; i++) {
    EXPECT_EQ(lines[i]["decision"], (first + i) % 2) << "round robin alternates";
    EXPECT_EQ(lines[i]["outcome"], "enforced");
    EXPECT_EQ(lines[i]["len"], 24);
    EXPECT_EQ(lines[i]["payload"].get<std::string>().substr(24, 8), "0" + std::to_string(i) + "000000");
  }
  EXPECT_EQ(lines[6]["end"]["recorded"], 6);
}

// One recording per policy; bad fields name themselves.
TEST_F(Recordings, OneRecordingPerPolicyAndBadFieldsAreRefused) {
  UdpGroup g(2);
  int id = deploy("policies/round_robin.c", g);
  ASSERT_GT(id, 0) << syr_last_error();
  Background rec(*daemon_, id, "record " + std::to_string(id) + " --seconds 30 -o " + file("one.rec"));
  ASSERT_TRUE(rec.started());
  std::string out;
  EXPECT_EQ(run_cmd(build_bin("syrupctl") + " record " + std::to_string(id) + " -o " + file("two.rec"), out), 1);
  EXPECT_NE(out.find("policy " + std::to_string(id) + " is already being recorded"), std::string::npos) << out;
  // record_stop ends the first one with its trailer.
  syrup::Client cl;
  syrup::Message resp;
  ASSERT_EQ(cl.connect(daemon_->socket()), 0);
  ASSERT_EQ(cl.call({{"op", "record_stop"}, {"id", id}}, resp), 0);
  EXPECT_TRUE(resp.body.value("ok", false)) << resp.body.dump();
  ASSERT_EQ(rec.wait(out), 0) << out;
  EXPECT_NE(out.find("ended: stopped"), std::string::npos) << out;
  for (auto [field, value] : {std::pair{"snap", 257}, std::pair{"sample", 0}, std::pair{"seconds", -1}}) {
    syrup::Client c2;
    ASSERT_EQ(c2.connect(daemon_->socket()), 0);
    ASSERT_EQ(c2.call({{"op", "record"}, {"id", id}, {field, value}}, resp), 0);
    EXPECT_EQ(resp.body.value("errno", 0), EINVAL) << resp.body.dump();
    EXPECT_NE(resp.body.value("error", std::string()).find(field), std::string::npos) << resp.body.dump();
    EXPECT_TRUE(resp.fds.empty());
  }
}

// Another user cannot record, trace or stop a recording of a policy that is not theirs:
// the refusal is the one a missing policy gets, and nothing of the policy leaks.
TEST_F(Recordings, AnotherUsersPolicyIsRefusedAsIfItDidNotExist) {
  UdpGroup g(2);
  int id = deploy("policies/round_robin.c", g);
  ASSERT_GT(id, 0) << syr_last_error();
  Background rec(*daemon_, id, "record " + std::to_string(id) + " --seconds 30 -o " + file("victim.rec"));
  ASSERT_TRUE(rec.started());
  std::string sock = daemon_->socket();
  json got = record_refusals_as(kMallory, sock, id);
  expect_refused_as_missing(got);
  if (HasFatalFailure()) return;
  // The victim's recording ran on untouched.
  syrup::Client c;
  syrup::Message resp;
  ASSERT_EQ(c.connect(sock), 0);
  ASSERT_EQ(c.call({{"op", "record_stop"}, {"id", id}}, resp), 0);
  EXPECT_TRUE(resp.body.value("ok", false)) << resp.body.dump();
  std::string out;
  EXPECT_EQ(rec.wait(out), 0) << out;
}

// Removing the policy ends its recording with a trailer that says so.
TEST_F(Recordings, RemovingThePolicyEndsItsRecording) {
  UdpGroup g(2);
  int id = deploy("policies/round_robin.c", g);
  ASSERT_GT(id, 0) << syr_last_error();
  std::string path = file("removed.rec");
  Background rec(*daemon_, id, "record " + std::to_string(id) + " --seconds 30 -o " + path);
  ASSERT_TRUE(rec.started());
  UdpClient c(g.port());
  for (uint32_t i = 0; i < 10; i++) c.send_request(1, i);
  int delivered = 0;
  ASSERT_GE(wait_for([&] {
              for (int n : g.drain(nullptr, 0)) delivered += n;
              return delivered == 10;
            }, 2000), 0);
  ASSERT_EQ(syr_remove_policy(id), 0) << syr_last_error();
  std::string out;
  ASSERT_EQ(rec.wait(out), 0) << out;
  Recording r;
  ASSERT_EQ(parse(read_text(path), r), "");
  ASSERT_TRUE(r.has_trailer);
  EXPECT_EQ(r.trailer.trailer.end_reason, static_cast<uint32_t>(SYR_REC_END_REMOVED));
  EXPECT_EQ(r.records.size(), 10u);
}

// At the XDP hook: a known stream from a peer namespace over a veth pair, round robin over
// two cores. Each record carries the frame's L4 bytes, the L4 offset the root program
// parsed, and the alternating decision, enforced (redirected); the server got them all.
TEST_F(Recordings, XdpRecordsEveryPacketWithItsOffsetAndDecision) {
  TestNet net(230);
  ASSERT_TRUE(net.ok());
  constexpr uint16_t kPort = 9471;
  UniqueFd server(udp_server(net.host_ip, kPort));
  std::vector<int> cpus = {0, static_cast<int>(std::min(1L, sysconf(_SC_NPROCESSORS_ONLN) - 1))};
  uint16_t port = kPort;
  syr_deploy_opts o{.sz = sizeof o, .app = "rec-xdp", .ifname = net.host_if.c_str(), .ports = &port, .n_ports = 1,
                    .cpus = cpus.data(), .n_cpus = cpus.size()};
  int id = syr_deploy_policy(source_path("policies/round_robin.c").c_str(), SYR_HOOK_XDP, &o);
  ASSERT_GT(id, 0) << syr_last_error();
  ids_.push_back(id);
  std::string path = file("xdp.rec");
  Background rec(*daemon_, id, "record " + std::to_string(id) + " --count 100 --snap 16 -o " + path);
  ASSERT_TRUE(rec.started());
  UniqueFd peer(net.peer_udp());
  sockaddr_in dst{};
  dst.sin_family = AF_INET;
  dst.sin_port = htons(kPort);
  inet_pton(AF_INET, net.host_ip.c_str(), &dst.sin_addr);
  for (uint32_t i = 0; i < 100; i++) {
    uint32_t p[4] = {1, i, 0, 0};
    ASSERT_EQ(sendto(peer.get(), p, sizeof p, 0, reinterpret_cast<sockaddr*>(&dst), sizeof dst), 16);
  }
  std::string out;
  ASSERT_EQ(rec.wait(out), 0) << out;
  int received = 0;
  char buf[64];
  ASSERT_GE(wait_for([&] {
              while (recv(server.get(), buf, sizeof buf, MSG_DONTWAIT) > 0) received++;
              return received == 100;
            }, 3000), 0) << received;

  Recording r;
  ASSERT_EQ(parse(read_text(path), r), "");
  EXPECT_EQ(r.header.hook, static_cast<uint32_t>(SYR_HOOK_XDP));
  EXPECT_EQ(r.header.n_executors, 2u);
  ASSERT_EQ(r.records.size(), 100u);
  std::sort(r.records.begin(), r.records.end(), [](auto& a, auto& b) { return a.ts_ns < b.ts_ns; });
  std::vector<uint32_t> keys;
  for (size_t i = 0; i < r.records.size(); i++) {
    const auto& rec = r.records[i];
    SCOPED_TRACE("record " + std::to_string(i));
    EXPECT_EQ(rec.in.packet.l4_off, 34u) << "Ethernet and IPv4 headers";
    EXPECT_EQ(rec.in.len, 24u);
    EXPECT_EQ(rec.in.outcome, static_cast<uint32_t>(SYR_REC_OUTCOME_ENFORCED));
    if (i) {
      EXPECT_EQ(rec.in.decision, (r.records[i - 1].in.decision + 1) % 2) << "round robin alternates";
    }
  }
  for (auto& p : r.payloads) {
    ASSERT_EQ(p.size(), 16u);
    keys.push_back(key_of(p));
  }
  std::sort(keys.begin(), keys.end());
  for (uint32_t i = 0; i < 100; i++) EXPECT_EQ(keys[i], i) << "every key sent is recorded once";
  ASSERT_TRUE(r.has_trailer);
  EXPECT_EQ(r.trailer.trailer.recorded, 100u);
  EXPECT_EQ(syr_remove_policy(id), 0) << syr_last_error();  // before its interface goes
}

}  // namespace
}  // namespace syrup::test
