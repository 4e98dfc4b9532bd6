// Tests of the test harness itself (harness.h): what it promises the suites built on it.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>

#include "harness.h"

namespace syrup::test {
namespace {

// A test process that dies without stopping its syrupd (a ctest timeout, output into a
// closed pipe) takes it along: no syrupd is left behind holding programs and pins.
TEST(TestHarness, NoSyrupdOutlivesTheTestProcessThatStartedIt) {
  SYRUP_REQUIRE_ROOT();
  int p[2];
  ASSERT_EQ(pipe2(p, O_CLOEXEC), 0);
  // The orphaned syrupd comes to this process, which reaps it (and sees it end).
  ASSERT_EQ(prctl(PR_SET_CHILD_SUBREAPER, 1), 0) << strerror(errno);
  pid_t test = fork();
  ASSERT_GE(test, 0);
  if (test == 0) {
    auto* d = new Daemon;  // never stopped
    d->start();
    std::string s = std::to_string(d->pid()) + " " + d->socket() + "\n";
    (void)!write(p[1], s.data(), s.size());
    pause();
    _exit(0);
  }
  close(p[1]);
  char buf[512] = {};
  ssize_t n = read(p[0], buf, sizeof buf - 1);
  close(p[0]);
  pid_t syrupd = 0;
  char sock[400] = {};
  ASSERT_GT(n, 0);
  ASSERT_EQ(std::sscanf(buf, "%d %399s", &syrupd, sock), 2) << buf;
  kill(test, SIGKILL);
  waitpid(test, nullptr, 0);
  bool ended = false;
  auto gone = [&] { return ended = ended || waitpid(syrupd, nullptr, WNOHANG) == syrupd; };
  EXPECT_GE(wait_for(gone, 10000), 0) << "syrupd " << syrupd << " outlived the test process that started it";
  if (!gone()) {
    kill(syrupd, SIGKILL);
    waitpid(syrupd, nullptr, 0);
  }
  prctl(PR_SET_CHILD_SUBREAPER, 0);
  std::error_code ec;
  std::filesystem::remove_all(std::filesystem::path(sock).parent_path(), ec);
  std::filesystem::remove_all("/sys/fs/bpf/syrup-test-" + std::to_string(test), ec);
}

}  // namespace
}  // namespace syrup::test
