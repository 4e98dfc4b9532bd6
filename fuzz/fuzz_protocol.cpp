// libFuzzer target: the control protocol's frame parser (runtime/src/protocol.cpp),
// exactly as syrupd runs it: recv_message() on one end of a Unix stream socket pair.
//
// Input: byte 0 picks how many descriptors (0..3) ride SCM_RIGHTS on the first byte of
// the stream; the rest is the byte stream a client sends, then end of stream. Every
// frame in it is read until recv_message() stops. Invariants checked:
//  - the result is 0, -ENODATA (clean end before a frame) or -EPROTO with a reason;
//  - a parsed body is a JSON object, and sends and parses back to itself;
//  - no descriptor leaks, whatever the frames (received fds are owned by the Message).
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "protocol.h"

#define SYRUP_FUZZ_TARGET "fuzz_protocol"
#include "fuzz_check.h"

namespace {

// The descriptor the next open() gets: moves if a descriptor leaked.
int lowest_free_fd() {
  int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  close(fd);
  return fd;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using syrup::proto::Message;
  if (size < 1 || size > 150000) return 0;  // stays within the socket's buffer
  static int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
  size_t nfds = data[0] % 4;
  data++, size--;
  int before = lowest_free_fd();

  int sv[2];
  check(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0, "socketpair");
  size_t off = 0;
  if (nfds && size) {
    // The descriptors with the first byte, as send_message() does.
    int fds[3] = {devnull, devnull, devnull};
    char control[CMSG_SPACE(sizeof fds)] = {};
    iovec iov{const_cast<uint8_t*>(data), 1};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
    std::memcpy(CMSG_DATA(c), fds, sizeof(int) * nfds);
    check(sendmsg(sv[0], &msg, MSG_NOSIGNAL) == 1, "sendmsg");
    off = 1;
  }
  while (off < size) {
    ssize_t w = send(sv[0], data + off, size - off, MSG_NOSIGNAL);
    check(w > 0, "send");
    off += static_cast<size_t>(w);
  }
  close(sv[0]);

  for (int frames = 0; frames < 100000; frames++) {
    Message m;
    std::string why;
    int r = syrup::proto::recv_message(sv[1], m, &why);
    check(r == 0 || r == -ENODATA || r == -EPROTO, "recv_message returns 0, -ENODATA or -EPROTO");
    if (r == -EPROTO) check(!why.empty(), "-EPROTO comes with a reason");
    if (r) break;
    check(m.body.is_object(), "a parsed body is a JSON object");
    // What was parsed is sent and parsed back unchanged.
    int rt[2];
    check(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, rt) == 0, "socketpair");
    if (m.body.dump().size() < 100000) {
      check(syrup::proto::send_message(rt[0], m.body) == 0, "send_message of a parsed body");
      Message back;
      check(syrup::proto::recv_message(rt[1], back) == 0, "recv_message of a sent body");
      check(back.body == m.body, "a body survives send and receive");
      check(back.fds.empty(), "no descriptors were sent");
    }
    close(rt[0]);
    close(rt[1]);
  }
  close(sv[1]);
  check(lowest_free_fd() == before, "no descriptor leaks");
  return 0;
}
