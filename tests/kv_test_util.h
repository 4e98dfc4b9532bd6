// What the RocksDB example's tests share: a child process whose stdout is read line by
// line, and a UDP client speaking kv_proto.h.
//
// Design: everything is RAII so a failing assertion still cleans up -- a child still
// running gets SIGTERM and then SIGKILL (a kv_server killed that way loses its policy
// too: syrupd removes a policy when its owner process exits).
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "harness.h"
#include "kv_proto.h"
#include "unique_fd.h"

namespace syrup::test {

// A child process with its stdout on a pipe (stderr goes to `errfile` if given).
class Child {
 public:
  Child(const std::vector<std::string>& argv, const std::string& errfile = "") {
    int p[2];
    if (pipe2(p, O_CLOEXEC) < 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      dup2(p[1], 1);
      if (!errfile.empty()) {
        int e = open(errfile.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (e >= 0) dup2(e, 2);
      }
      std::vector<char*> args;
      for (auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      execv(args[0], args.data());
      _exit(127);
    }
    close(p[1]);
    out_.reset(p[0]);
  }
  ~Child() {
    if (pid_ > 0 && stop(5000) == -2) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  pid_t pid() const { return pid_; }

  // The next line of stdout, or nullopt on timeout or end of file.
  std::optional<std::string> read_line(int timeout_ms) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    for (;;) {
      size_t nl = buf_.find('\n');
      if (nl != std::string::npos) {
        std::string line = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        return line;
      }
      int left = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                      deadline - std::chrono::steady_clock::now())
                                      .count());
      if (left <= 0) return std::nullopt;
      pollfd pfd{out_.get(), POLLIN, 0};
      if (poll(&pfd, 1, left) <= 0) continue;
      char tmp[4096];
      ssize_t n = read(out_.get(), tmp, sizeof tmp);
      if (n <= 0) return std::nullopt;
      buf_.append(tmp, static_cast<size_t>(n));
    }
  }

  // SIGTERM and wait up to timeout_ms: the exit status, -1 if killed by a signal, -2 if
  // still running.
  int stop(int timeout_ms) {
    if (pid_ <= 0) return status_;
    kill(pid_, SIGTERM);
    return wait(timeout_ms);
  }
  int wait(int timeout_ms) {
    if (pid_ <= 0) return status_;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    for (;;) {
      int st;
      pid_t r = waitpid(pid_, &st, WNOHANG);
      if (r == pid_) {
        pid_ = -1;
        status_ = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
        return status_;
      }
      if (std::chrono::steady_clock::now() > deadline) return -2;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  // Whatever stdout still holds (after the process ended).
  std::string rest() {
    std::string s = buf_;
    buf_.clear();
    char tmp[4096];
    ssize_t n;
    while ((n = read(out_.get(), tmp, sizeof tmp)) > 0) s.append(tmp, static_cast<size_t>(n));
    return s;
  }

 private:
  pid_t pid_ = -1;
  int status_ = -2;
  UniqueFd out_;
  std::string buf_;
};

// A decoded response.
struct KvReply {
  kv_response hdr{};
  std::string body;
};

// One client flow to a kv_server on 127.0.0.1.
class KvClient {
 public:
  explicit KvClient(uint16_t port) {
    fd_.reset(socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    int buf = 4 << 20;  // room for a few thousand answers read late
    setsockopt(fd_.get(), SOL_SOCKET, SO_RCVBUFFORCE, &buf, sizeof buf);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(fd_.get(), reinterpret_cast<sockaddr*>(&a), sizeof a);
    a.sin_port = htons(port);
    connect(fd_.get(), reinterpret_cast<sockaddr*>(&a), sizeof a);
  }
  bool send_raw(const void* p, size_t len) { return ::send(fd_.get(), p, len, 0) == static_cast<ssize_t>(len); }
  bool send_req(uint32_t type, uint64_t key, uint64_t id, uint32_t scan_len = 0) {
    kv_request q{};
    q.type = htole32(type);
    q.scan_len = htole32(scan_len);
    q.key = htole64(key);
    q.id = htole64(id);
    q.stamp = htole64(id * 7);
    return send_raw(&q, sizeof q);
  }
  std::optional<KvReply> recv_reply(int timeout_ms = 2000) {
    pollfd pfd{fd_.get(), POLLIN, 0};
    if (poll(&pfd, 1, timeout_ms) <= 0) return std::nullopt;
    char buf[65536];
    ssize_t n = ::recv(fd_.get(), buf, sizeof buf, 0);
    if (n < static_cast<ssize_t>(sizeof(kv_response))) return std::nullopt;
    KvReply r;
    memcpy(&r.hdr, buf, sizeof r.hdr);
    r.hdr.status = le32toh(r.hdr.status);
    r.hdr.type = le32toh(r.hdr.type);
    r.hdr.id = le64toh(r.hdr.id);
    r.hdr.stamp = le64toh(r.hdr.stamp);
    r.hdr.worker = le32toh(r.hdr.worker);
    r.hdr.count = le32toh(r.hdr.count);
    r.hdr.digest = le64toh(r.hdr.digest);
    r.hdr.len = le32toh(r.hdr.len);
    r.body.assign(buf + sizeof r.hdr, static_cast<size_t>(n) - sizeof r.hdr);
    return r;
  }
  std::optional<KvReply> call(uint32_t type, uint64_t key, uint64_t id, uint32_t scan_len = 0) {
    if (!send_req(type, key, id, scan_len)) return std::nullopt;
    return recv_reply();
  }

 private:
  UniqueFd fd_;
};

}  // namespace syrup::test
