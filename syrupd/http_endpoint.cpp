#include "http_endpoint.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>

namespace syrup::http {
namespace {

// How long a connection whose response is sent may still take to close its side: its
// unread bytes are read and dropped meanwhile, so closing does not reset the connection
// under a response the client has not read yet.
constexpr std::chrono::milliseconds kLinger{1000};
// How long the listeners rest when syrupd is out of descriptors (accept fails with
// EMFILE or ENFILE): a readable listener would otherwise wake the loop at once, forever.
constexpr std::chrono::milliseconds kOutOfFdsPause{100};

const char* reason(int status) {
  switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 431: return "Request Header Fields Too Large";
    case 503: return "Service Unavailable";
    default: return "Error";
  }
}

Response plain(int status, const std::string& text) { return Response{.status = status, .body = text}; }

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t");
  return b == std::string::npos ? "" : s.substr(b, e + 1 - b);
}

}  // namespace

std::string render(const Response& r, bool head_only) {
  std::string out = "HTTP/1.1 " + std::to_string(r.status) + " " + reason(r.status) + "\r\n";
  out += "Content-Type: " + r.content_type + "\r\n";
  out += "Content-Length: " + std::to_string(r.body.size()) + "\r\n";
  if (r.status == 405) out += "Allow: GET, HEAD\r\n";
  out += "Connection: close\r\n\r\n";
  if (!head_only) out += r.body;
  return out;
}

size_t end_of_head(const std::string& in) {
  // The first empty line: "\r\n\r\n" from every client; "\n\n" from one typed by hand.
  for (size_t nl = in.find('\n'); nl != std::string::npos; nl = in.find('\n', nl + 1)) {
    if (nl + 1 < in.size() && in[nl + 1] == '\n') return nl;
    if (nl + 2 < in.size() && in[nl + 1] == '\r' && in[nl + 2] == '\n') return nl;
  }
  return std::string::npos;
}

struct Endpoint::Conn {
  // kParked: the handler said Later; answered on wake() or at park_until.
  enum class State { kReading, kParked, kWriting, kDraining };
  UniqueFd fd;
  Clock::time_point deadline;
  State state = State::kReading;
  std::string in, out;
  size_t sent = 0;
  Request req;  // once parsed
  Clock::time_point park_until{};
};

Endpoint::Endpoint(Handler handler, Limits limits) : handler_(std::move(handler)), limits_(limits) {}

Endpoint::~Endpoint() { stop(); }

int Endpoint::add_listener(const std::string& host, uint16_t port) {
  sockaddr_storage ss{};
  socklen_t len;
  auto* a4 = reinterpret_cast<sockaddr_in*>(&ss);
  auto* a6 = reinterpret_cast<sockaddr_in6*>(&ss);
  if (inet_pton(AF_INET, host.c_str(), &a4->sin_addr) == 1) {
    a4->sin_family = AF_INET;
    a4->sin_port = htons(port);
    len = sizeof *a4;
  } else if (inet_pton(AF_INET6, host.c_str(), &a6->sin6_addr) == 1) {
    a6->sin6_family = AF_INET6;
    a6->sin6_port = htons(port);
    len = sizeof *a6;
  } else {
    return -EINVAL;
  }
  UniqueFd fd(socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd) return -errno;
  // SO_REUSEADDR: a restarted syrupd rebinds at once. Not SO_REUSEPORT, with which a
  // second process could share the port unnoticed.
  int one = 1;
  setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (ss.ss_family == AF_INET6) setsockopt(fd.get(), IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
  if (bind(fd.get(), reinterpret_cast<sockaddr*>(&ss), len) < 0 || listen(fd.get(), 128) < 0 ||
      getsockname(fd.get(), reinterpret_cast<sockaddr*>(&ss), &len) < 0)
    return -errno;
  listeners_.push_back(std::move(fd));
  return ntohs(ss.ss_family == AF_INET ? a4->sin_port : a6->sin6_port);
}

int Endpoint::start() {
  epoll_fd_.reset(epoll_create1(EPOLL_CLOEXEC));
  if (!epoll_fd_) return -errno;
  stop_fd_.reset(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  wake_fd_.reset(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!stop_fd_ || !wake_fd_) return -errno;
  for (auto& fd : listeners_) watch(fd.get(), EPOLL_CTL_ADD, EPOLLIN);
  watch(stop_fd_.get(), EPOLL_CTL_ADD, EPOLLIN);
  watch(wake_fd_.get(), EPOLL_CTL_ADD, EPOLLIN);
  thread_ = std::thread([this] { loop(); });
  return 0;
}

void Endpoint::wake() {
  uint64_t one = 1;
  ssize_t w = write(wake_fd_.get(), &one, sizeof one);
  (void)w;  // only fails when the counter is full, i.e. a wake is pending anyway
}

void Endpoint::stop() {
  if (thread_.joinable()) {
    uint64_t one = 1;
    ssize_t w = write(stop_fd_.get(), &one, sizeof one);
    (void)w;
    thread_.join();
  }
  conns_.clear();
  listeners_.clear();
  epoll_fd_.reset();
  stop_fd_.reset();
  wake_fd_.reset();
}

void Endpoint::watch(int fd, int op, uint32_t events) {
  epoll_event ev{events, {.fd = fd}};
  epoll_ctl(epoll_fd_.get(), op, fd, &ev);
}

void Endpoint::loop() {
  epoll_event evs[64];
  Clock::time_point paused_until{};  // listeners out of epoll until then (out of fds)
  for (;;) {
    auto now = Clock::now();
    if (paused_until != Clock::time_point{} && now >= paused_until) {
      for (auto& fd : listeners_) watch(fd.get(), EPOLL_CTL_ADD, EPOLLIN);
      paused_until = {};
    }
    auto next = paused_until;
    for (auto& c : conns_) {
      auto t = c->state == Conn::State::kParked ? std::min(c->deadline, c->park_until) : c->deadline;
      if (next == Clock::time_point{} || t < next) next = t;
    }
    int timeout = -1;
    if (next != Clock::time_point{})
      timeout = static_cast<int>(std::clamp<int64_t>(
          std::chrono::duration_cast<std::chrono::milliseconds>(next - now).count() + 1, 0, 1000));
    int n = epoll_wait(epoll_fd_.get(), evs, 64, timeout);
    for (int i = 0; i < n; i++) {
      int fd = evs[i].data.fd;
      if (fd == stop_fd_.get()) return;
      if (fd == wake_fd_.get()) {
        uint64_t wakes;
        ssize_t r = read(fd, &wakes, sizeof wakes);
        (void)r;
        resume_parked(false);
        continue;
      }
      if (std::any_of(listeners_.begin(), listeners_.end(), [&](auto& l) { return l.get() == fd; })) {
        int r = accept_from(fd);
        if (r == -EMFILE || r == -ENFILE) {
          for (auto& l : listeners_) watch(l.get(), EPOLL_CTL_DEL, 0);
          paused_until = Clock::now() + kOutOfFdsPause;
        }
      } else if (Conn* c = find(fd)) {
        serve(*c);
      }
    }
    resume_parked(true);
    now = Clock::now();
    for (size_t i = 0; i < conns_.size();) {
      if (conns_[i]->deadline <= now) close_conn(conns_[i].get());
      else i++;
    }
  }
}

// Accepts every connection waiting; -errno of accept4 when it stopped (-EAGAIN: none
// left; -EMFILE, -ENFILE: out of descriptors).
int Endpoint::accept_from(int listen_fd) {
  for (;;) {
    int fd = accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      return -errno;
    }
    if (conns_.size() >= limits_.max_connections) {
      // Room for this one: the oldest connection still waiting for its request (or, if
      // every one is being answered, the oldest).
      auto victim = std::find_if(conns_.begin(), conns_.end(), [](auto& c) {
        return c->state == Conn::State::kReading || c->state == Conn::State::kDraining;
      });
      close_conn(victim != conns_.end() ? victim->get() : conns_.front().get());
    }
    conns_.push_back(std::make_unique<Conn>(Conn{UniqueFd(fd), Clock::now() + limits_.deadline}));
    watch(fd, EPOLL_CTL_ADD, EPOLLIN);
    serve(*conns_.back());  // on loopback the request is usually there already
  }
}

std::variant<Request, Response> parse(const std::string& head) {
  Request req;
  std::string version;
  size_t pos = 0;
  bool first = true;
  while (pos <= head.size()) {
    size_t eol = std::min(head.find('\n', pos), head.size());
    std::string line = head.substr(pos, eol - pos);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    pos = eol + 1;
    if (line.find_first_of(std::string("\r\0", 2)) != std::string::npos)
      return plain(400, "a bare CR or a NUL in the request's head\n");
    if (first) {
      first = false;
      size_t a = line.find(' '), b = line.rfind(' ');
      if (a == std::string::npos || a == b) return plain(400, "malformed request line\n");
      req.method = line.substr(0, a);
      req.path = line.substr(a + 1, b - a - 1);
      version = line.substr(b + 1);
      if (!version.starts_with("HTTP/1.") || !req.path.starts_with('/'))  // origin-form only
        return plain(400, "malformed request line\n");
      req.path = req.path.substr(0, req.path.find('?'));
      continue;
    }
    size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string name = line.substr(0, colon);
    for (auto& ch : name) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    if (name == "host") req.host = trim(line.substr(colon + 1));
  }
  if (req.method != "GET" && req.method != "HEAD") return plain(405, "only GET and HEAD are served\n");
  return req;
}

Endpoint::Conn* Endpoint::find(int fd) {
  for (auto& c : conns_)
    if (c->fd.get() == fd) return c.get();
  return nullptr;
}

void Endpoint::close_conn(Conn* c) {
  // Its descriptor closes with it, which also takes it out of the epoll set.
  conns_.erase(std::find_if(conns_.begin(), conns_.end(), [&](auto& p) { return p.get() == c; }));
}

void Endpoint::answer(Conn& c, bool last_call) {
  c.req.last_call = last_call;
  Reply r = handler_(c.req);
  if (auto* later = std::get_if<Later>(&r)) {
    if (!last_call) {
      if (c.state != Conn::State::kParked) {
        c.state = Conn::State::kParked;
        c.park_until = std::min(c.deadline, Clock::now() + later->wait);
        // Only an error or hang-up wakes a parked connection: a client that has sent its
        // request and half-closed still waits for the answer.
        watch(c.fd.get(), EPOLL_CTL_MOD, 0);
      }
      return;
    }
    r = plain(503, "no answer in time\n");
  }
  c.out = render(std::get<Response>(r), c.req.method == "HEAD");
  c.state = Conn::State::kWriting;
}

void Endpoint::resume_parked(bool due_only) {
  auto now = Clock::now();
  std::vector<int> fds;  // serve() may close connections: collect first
  for (auto& c : conns_)
    if (c->state == Conn::State::kParked && (!due_only || c->park_until <= now)) fds.push_back(c->fd.get());
  for (int fd : fds) {
    Conn* c = find(fd);
    answer(*c, due_only);
    if (c->state == Conn::State::kWriting) serve(*c);
  }
}

void Endpoint::serve(Conn& c) {
  char buf[4096];
  if (c.state == Conn::State::kParked) {  // woken by an error or a hang-up
    close_conn(&c);
    return;
  }
  if (c.state == Conn::State::kReading) {
    bool eof = false;
    for (;;) {
      ssize_t n = recv(c.fd.get(), buf, sizeof buf, 0);
      if (n > 0) {
        c.in.append(buf, static_cast<size_t>(n));
        if (c.in.size() > limits_.max_request_bytes) break;
      } else if (n == 0) {
        eof = true;
        break;
      } else if (errno != EINTR) {
        if (errno == EAGAIN) break;
        close_conn(&c);
        return;
      }
    }
    size_t end = end_of_head(c.in);
    if (end != std::string::npos && end <= limits_.max_request_bytes) {
      auto parsed = parse(c.in.substr(0, end));
      if (auto* refusal = std::get_if<Response>(&parsed)) {
        c.out = render(*refusal, false);
        c.state = Conn::State::kWriting;
      } else {
        c.req = std::move(std::get<Request>(parsed));
        c.req.arrived = Clock::now();
        answer(c, false);
        if (c.state == Conn::State::kParked) return;
      }
    } else if (c.in.size() > limits_.max_request_bytes) {
      c.out = render(plain(431, "the request's line and headers are over " +
                                    std::to_string(limits_.max_request_bytes) + " bytes\n"),
                     false);
      c.state = Conn::State::kWriting;
    } else {
      if (eof) close_conn(&c);  // the client left before a whole request
      return;
    }
  }
  if (c.state == Conn::State::kWriting) {
    while (c.sent < c.out.size()) {
      ssize_t n = send(c.fd.get(), c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL);
      if (n > 0) {
        c.sent += static_cast<size_t>(n);
      } else if (errno == EAGAIN) {
        watch(c.fd.get(), EPOLL_CTL_MOD, EPOLLOUT);
        return;
      } else if (errno != EINTR) {
        close_conn(&c);
        return;
      }
    }
    shutdown(c.fd.get(), SHUT_WR);
    c.state = Conn::State::kDraining;
    c.deadline = std::min(c.deadline, Clock::now() + kLinger);
    watch(c.fd.get(), EPOLL_CTL_MOD, EPOLLIN);
  }
  // Draining: drop what the client still sends until it closes its side.
  for (;;) {
    ssize_t n = recv(c.fd.get(), buf, sizeof buf, 0);
    if (n > 0 || (n < 0 && errno == EINTR)) continue;
    if (n < 0 && errno == EAGAIN) return;
    close_conn(&c);
    return;
  }
}

}  // namespace syrup::http
