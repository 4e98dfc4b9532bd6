// A child process that acts as an unprivileged user and stays alive, holding what it made
// (sockets, policies whose owner it is), until the test releases it: for the attacks of
// docs/security/input.md where the victim acts while the attacker's state is in place.
#pragma once

#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <functional>
#include <string>

#include <nlohmann/json.hpp>

namespace syrup::test::security {

class HeldUser {
 public:
  // Runs `fn` as `uid` in a child; the JSON it returns is result() once it has returned.
  HeldUser(uid_t uid, const std::function<nlohmann::json()>& fn) {
    int out[2], quit[2];
    if (pipe2(out, O_CLOEXEC) || pipe2(quit, O_CLOEXEC)) return;
    pid_ = fork();
    if (pid_ == 0) {
      close(out[0]);
      close(quit[1]);
      nlohmann::json j = setgroups(0, nullptr) || setgid(uid) || setuid(uid)
                             ? nlohmann::json{{"error", "cannot become uid " + std::to_string(uid)}}
                             : fn();
      std::string s = j.dump() + "\n";
      (void)!write(out[1], s.data(), s.size());
      char c;
      (void)!read(quit[0], &c, 1);  // until release() or the test's end
      _exit(0);
    }
    close(out[1]);
    close(quit[0]);
    quit_ = quit[1];
    std::string s;
    char buf[4096];
    for (ssize_t n; (n = read(out[0], buf, sizeof buf)) > 0;) {
      s.append(buf, static_cast<size_t>(n));
      if (s.back() == '\n') break;
    }
    close(out[0]);
    result_ = nlohmann::json::parse(s, nullptr, false);
    if (result_.is_discarded()) result_ = {{"error", "child reported nothing: " + s}};
  }
  ~HeldUser() { release(); }
  const nlohmann::json& result() const { return result_; }
  // Lets the child exit (what it held goes with it) and waits for it.
  void release() {
    if (quit_ >= 0) close(quit_);
    quit_ = -1;
    if (pid_ > 0) waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

 private:
  pid_t pid_ = -1;
  int quit_ = -1;
  nlohmann::json result_;
};

}  // namespace syrup::test::security
