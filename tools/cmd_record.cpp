// syrupctl record and syrupctl trace: ask syrupd to record a policy (docs/protocol.md,
// "record") and read the recording from the pipe it answers with (docs/recording.md).
//
// Design: the output file is opened by syrupctl, as the caller, before syrupd is asked:
// syrupd never opens a path a tenant names. The pipe's bytes go to the file unchanged,
// while a parser follows the stream (the header, then records by their `size`) to count
// the records and find the trailer, and for trace to print each decision. SIGINT or
// SIGTERM asks syrupd to end the recording (record_stop), so the trailer still comes and
// the file is complete; a second one exits at once.
#include "cmd_record.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gflags/gflags.h>
#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <functional>
#include <iostream>
#include <optional>
#include <string>

#include "cli.h"
#include "client.h"
#include "syrup/abi.h"
#include "syrup/recording.h"

DEFINE_int64(seconds, 0, "record, trace: stop after this many seconds (default: syrupd's --record_max_seconds)");
DEFINE_int64(count, 0, "record, trace: stop after this many inputs (0: no bound)");
DEFINE_string(sample, "1/1", "record, trace: keep one input in N, written 1/N");
DEFINE_int32(snap, -1, "record, trace: payload bytes kept per input, 0 to 256 (default: record 64, trace 0)");
DEFINE_string(o, "", "record: the file to write ('-': standard output)");
DEFINE_uint64(max_bytes, 0, "record: the recording's size bound in bytes (default and most: syrupd's --record_max_bytes)");

namespace syrupctl {

const char* const kRecordUsage =
    "  syrupctl record ID [--seconds N | --count N] [--sample 1/N] [--snap BYTES] -o FILE\n"
    "                                capture what policy ID sees and decides (docs/recording.md)\n"
    "  syrupctl trace ID [--sample 1/N] [--snap BYTES] [--json]\n"
    "                                print its decisions as they are made\n";

namespace {

constexpr int kExitFailed = 1, kExitUsage = 2, kExitUnreachable = 3;

int usage(const std::string& why) {
  std::fprintf(stderr, "syrupctl: %s\n(see syrupctl --help)\n", why.c_str());
  return kExitUsage;
}

// Follows a recording's bytes: the header, then whole records.
class Stream {
 public:
  using OnRecord = std::function<void(const syr_rec_record&, const uint8_t* payload)>;
  // 0, or -EPROTO with `error` set when the bytes are not a recording.
  int feed(const char* p, size_t n, const OnRecord& on) {
    buf_.append(p, n);
    size_t off = 0;
    if (!header_ && buf_.size() >= sizeof(syr_rec_header)) {
      header_.emplace();
      std::memcpy(&*header_, buf_.data(), sizeof *header_);
      if (std::memcmp(header_->magic, SYR_REC_MAGIC, 8) != 0 || header_->header_size < sizeof *header_) {
        error = "syrupd's stream is not a recording (bad magic or header size)";
        return -EPROTO;
      }
      off = header_->header_size;  // whole: the header is written at once
    }
    while (header_ && buf_.size() - off >= 16) {
      uint32_t size;
      std::memcpy(&size, buf_.data() + off, 4);
      if (size < 16 || size % SYR_REC_ALIGN) {
        error = "a record of " + std::to_string(size) + " bytes: the stream is corrupt";
        return -EPROTO;
      }
      if (buf_.size() - off < size) break;
      syr_rec_record rec{};
      std::memcpy(&rec, buf_.data() + off, std::min<size_t>(size, sizeof rec));
      const auto* payload = reinterpret_cast<const uint8_t*>(buf_.data() + off + sizeof rec);
      if (rec.type == SYR_REC_TRAILER) trailer = rec;
      else if (rec.type == SYR_REC_INPUT || rec.type == SYR_REC_THREAD) records++;
      if (on) on(rec, payload);
      off += size;
    }
    buf_.erase(0, off);
    return 0;
  }
  const std::optional<syr_rec_header>& header() const { return header_; }
  std::optional<syr_rec_record> trailer;
  uint64_t records = 0;
  std::string error;

 private:
  std::string buf_;
  std::optional<syr_rec_header> header_;
};

const char* end_reason(uint32_t r) {
  switch (r) {
    case SYR_REC_END_DONE: return "its seconds or count were reached";
    case SYR_REC_END_QUOTA: return "its size quota was reached";
    case SYR_REC_END_REMOVED: return "the policy was removed or replaced";
    case SYR_REC_END_STOPPED: return "stopped";
  }
  return "unknown";
}

std::string decision_text(uint32_t d) {
  return d == SYR_PASS ? "pass" : d == SYR_DROP ? "drop" : "executor " + std::to_string(d);
}

const char* outcome_text(uint32_t o) {
  static const char* const names[] = {"pass", "drop", "fallback", "enforced"};
  return o < 4 ? names[o] : "unknown";
}

std::string address(const uint8_t* ip, uint32_t family) {
  char s[INET6_ADDRSTRLEN] = "?";
  inet_ntop(family == AF_INET6 ? AF_INET6 : AF_INET, ip, s, sizeof s);
  return s;
}

// One decision as trace prints it: a text line, or a JSON object with --json.
void print_decision(const syr_rec_header& h, const syr_rec_record& r, const uint8_t* payload, bool json) {
  double t = static_cast<double>(r.ts_ns - h.clock_mono_ns) / 1e9;
  nlohmann::json j = {{"ts_ns", r.ts_ns},   {"cpu", r.in.cpu},
                      {"decision", r.in.decision == SYR_PASS ? nlohmann::json("pass")
                                   : r.in.decision == SYR_DROP ? nlohmann::json("drop")
                                                               : nlohmann::json(r.in.decision)},
                      {"outcome", outcome_text(r.in.outcome)}, {"executors", r.in.n_executors}};
  std::string detail;
  if (r.type == SYR_REC_THREAD) {
    const auto& th = r.in.thread;
    j.update({{"tid", th.tid}, {"tgid", th.tgid}, {"executor", th.executor}, {"reason", th.reason},
              {"prev_cpu", th.prev_cpu}, {"key", th.key_out}, {"slice_ns", th.slice_out}});
    detail = "tid " + std::to_string(th.tid) + " reason " + std::to_string(th.reason) + " key " +
             std::to_string(th.key_out);
  } else {
    const auto& p = r.in.packet;
    char hash[16];
    std::snprintf(hash, sizeof hash, "0x%08x", p.hash);
    j.update({{"len", r.in.len}, {"hash", p.hash}, {"ip_protocol", p.ip_protocol}});
    detail = "len " + std::to_string(r.in.len) + " hash " + hash + (p.ip_protocol == 6 ? " tcp" : " udp");
    if (p.family) {
      std::string from = address(p.remote_ip, p.family) + ":" + std::to_string(p.remote_port);
      std::string to = address(p.local_ip, p.family) + ":" + std::to_string(p.local_port);
      j.update({{"remote", from}, {"local", to}});
      detail += " " + from + " -> " + to;
    }
    if (r.in.cap_len) {
      std::string hex;
      for (uint32_t i = 0; i < r.in.cap_len; i++) {
        char b[3];
        std::snprintf(b, sizeof b, "%02x", payload[i]);
        hex += b;
      }
      j["payload"] = hex;
      detail += " payload " + hex;
    }
  }
  if (json) std::cout << j.dump() << "\n";
  else
    std::printf("%.6f cpu %u %s (%s) %s\n", t, r.in.cpu, decision_text(r.in.decision).c_str(),
                outcome_text(r.in.outcome), detail.c_str());
  std::fflush(stdout);
}

// The request's options from the flags: 0, or a usage error's exit code.
int request_from_flags(const std::vector<std::string>& args, bool trace, nlohmann::json& req) {
  if (args.size() != 1) return usage(std::string(trace ? "trace" : "record") + " takes one policy ID");
  int64_t id = 0, n = 0;
  if (!syrup::cli::integer_in(args[0], 1, INT32_MAX, id)) return usage("not a policy ID: '" + args[0] + "'");
  std::string s = FLAGS_sample;
  if (s.rfind("1/", 0) == 0) s = s.substr(2);
  if (!syrup::cli::integer_in(s, 1, 1000000, n))
    return usage("--sample takes 1/N with N in 1..1000000, got '" + FLAGS_sample + "'");
  if (FLAGS_seconds < 0 || FLAGS_count < 0) return usage("--seconds and --count take a number >= 0");
  if (FLAGS_snap > SYR_REC_SNAP_MAX) return usage("--snap takes 0 to 256 bytes");
  req = {{"op", "record"}, {"id", id}, {"sample", n}, {"snap", FLAGS_snap >= 0 ? FLAGS_snap : trace ? 0 : 64}};
  if (FLAGS_seconds) req["seconds"] = FLAGS_seconds;
  if (FLAGS_count) req["count"] = FLAGS_count;
  if (FLAGS_max_bytes) req["max_bytes"] = FLAGS_max_bytes;
  return 0;
}

bool write_all(int fd, const char* p, size_t n) {
  while (n) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

// Asks syrupd for the recording `req` and reads it to its end: into `out_fd` (-1: none),
// through `stream`. 0, or the exit code.
int run(const std::string& socket, const nlohmann::json& req, int out_fd, Stream& stream, const Stream::OnRecord& on,
        bool json) {
  syrup::Client c;
  syrup::Message resp;
  if (c.connect(socket) || c.call(req, resp)) {
    std::fprintf(stderr, "syrupctl: %s\n", c.error().c_str());
    return kExitUnreachable;
  }
  std::string err;
  if (syrup::response_status(resp, err) || resp.fds.size() != 1) {
    if (json) std::cout << resp.body.dump(2) << "\n";
    std::fprintf(stderr, "syrupctl: %s\n", err.empty() ? "syrupd sent no recording" : err.c_str());
    return kExitFailed;
  }
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGINT);
  sigaddset(&mask, SIGTERM);
  sigprocmask(SIG_BLOCK, &mask, nullptr);
  int sfd = signalfd(-1, &mask, SFD_CLOEXEC);
  bool asked_stop = false;
  static char buf[1 << 16];
  for (;;) {
    pollfd p[2] = {{resp.fds[0].get(), POLLIN, 0}, {sfd, POLLIN, 0}};
    if (poll(p, 2, -1) < 0 && errno != EINTR) break;
    if (p[1].revents & POLLIN) {
      signalfd_siginfo si;
      (void)!read(sfd, &si, sizeof si);
      if (asked_stop) return 130;
      asked_stop = true;  // the trailer still comes
      syrup::Client s;
      syrup::Message sr;
      if (s.connect(socket) || s.call({{"op", "record_stop"}, {"id", req["id"]}}, sr)) return 130;
    }
    if (!(p[0].revents & (POLLIN | POLLHUP))) continue;
    ssize_t n = read(p[0].fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    if (out_fd >= 0 && !write_all(out_fd, buf, static_cast<size_t>(n))) {
      std::fprintf(stderr, "syrupctl: writing the recording failed: %s\n", std::strerror(errno));
      return kExitFailed;
    }
    if (stream.feed(buf, static_cast<size_t>(n), on)) {
      std::fprintf(stderr, "syrupctl: %s\n", stream.error.c_str());
      return kExitFailed;
    }
  }
  if (!stream.trailer) {
    std::fprintf(stderr, "syrupctl: the recording ended without its trailer (syrupd stopped?)\n");
    return kExitFailed;
  }
  return 0;
}

nlohmann::json summary(const Stream& s) {
  const auto& t = s.trailer->trailer;
  return {{"recorded", t.recorded},
          {"not_sampled", t.not_sampled},
          {"not_recorded_full", t.not_recorded_full},
          {"not_recorded_quota", t.not_recorded_quota},
          {"end_reason", end_reason(t.end_reason)}};
}

}  // namespace

int cmd_record(const std::vector<std::string>& args, const std::string& socket, bool json) {
  nlohmann::json req;
  if (int r = request_from_flags(args, false, req)) return r;
  if (FLAGS_o.empty()) return usage("record needs -o FILE (the recording's file, '-' for standard output)");
  bool to_stdout = FLAGS_o == "-";
  // Opened as the caller, before syrupd is asked: a path the caller cannot write fails here.
  int fd = to_stdout ? STDOUT_FILENO : open(FLAGS_o.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    std::fprintf(stderr, "syrupctl: cannot write %s: %s\n", FLAGS_o.c_str(), std::strerror(errno));
    return kExitFailed;
  }
  Stream stream;
  int r = run(socket, req, fd, stream, nullptr, json && !to_stdout);
  if (!to_stdout && close(fd) < 0 && !r) {
    std::fprintf(stderr, "syrupctl: writing %s failed: %s\n", FLAGS_o.c_str(), std::strerror(errno));
    r = kExitFailed;
  }
  if (r) return r;
  nlohmann::json sum = summary(stream);
  sum["file"] = FLAGS_o;
  sum["id"] = req["id"];
  FILE* o = to_stdout ? stderr : stdout;
  if (json) std::fprintf(o, "%s\n", sum.dump(2).c_str());
  else
    std::fprintf(o,
                 "recorded %" PRIu64 " inputs of policy %d into %s; not recorded: %" PRIu64 " sampled out, %" PRIu64
                 " with the buffer full, %" PRIu64 " over the quota or unread; ended: %s\n",
                 sum["recorded"].get<uint64_t>(), req["id"].get<int>(), FLAGS_o.c_str(),
                 sum["not_sampled"].get<uint64_t>(), sum["not_recorded_full"].get<uint64_t>(),
                 sum["not_recorded_quota"].get<uint64_t>(), sum["end_reason"].get<std::string>().c_str());
  return 0;
}

int cmd_trace(const std::vector<std::string>& args, const std::string& socket, bool json) {
  nlohmann::json req;
  if (int r = request_from_flags(args, true, req)) return r;
  Stream stream;
  auto on = [&](const syr_rec_record& rec, const uint8_t* payload) {
    if (rec.type == SYR_REC_INPUT || rec.type == SYR_REC_THREAD) print_decision(*stream.header(), rec, payload, json);
  };
  if (int r = run(socket, req, -1, stream, on, json)) return r;
  nlohmann::json sum = summary(stream);
  if (json) std::cout << nlohmann::json{{"end", sum}}.dump() << "\n";
  else
    std::fprintf(stderr, "# %" PRIu64 " traced; %" PRIu64 " sampled out, %" PRIu64 " lost; ended: %s\n",
                 sum["recorded"].get<uint64_t>(), sum["not_sampled"].get<uint64_t>(),
                 sum["not_recorded_full"].get<uint64_t>() + sum["not_recorded_quota"].get<uint64_t>(),
                 sum["end_reason"].get<std::string>().c_str());
  return 0;
}

}  // namespace syrupctl
