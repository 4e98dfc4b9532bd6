// A small HTTP/1.1 server for syrupd's metrics endpoint (docs/operations.md#metrics).
//
// Design: one thread and one epoll loop serve every listening socket and connection,
// non-blocking; each connection carries one request (GET or HEAD), gets one response and
// is closed ("Connection: close"), so a client that says nothing holds a slot and a
// descriptor, never a thread: a scrape is served at once however many such clients
// there are. Invariants:
//  - at most `max_connections` accepted connections are open; one more is accepted by
//    closing the oldest that has not sent a whole request yet (a request arrives with
//    its connection on loopback, and is read as soon as it is accepted), so clients that
//    hold connections cannot keep a scraper out or take syrupd's descriptors;
//  - every connection is closed by its deadline (`deadline` from accept, for the whole
//    exchange), whatever the client does;
//  - the handler runs on the endpoint's thread, one request at a time, and never
//    blocks: one that has no answer yet (the metrics scrape waiting for a fresh
//    snapshot) returns Later, and the endpoint parks that connection and serves the
//    others meanwhile; it asks the handler again when woken (wake(), from any thread)
//    and, for the last time, when the Later's wait is over.
// The thread blocks every signal (it is started with them blocked), so signals stay with
// the daemon's signalfd.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <variant>
#include <vector>

#include "unique_fd.h"

namespace syrup::http {

using Clock = std::chrono::steady_clock;

struct Request {
  std::string method;  // "GET" or "HEAD" (others are answered 405 without the handler)
  std::string path;    // the target without its query
  std::string host;    // the Host header ("" when there is none)
  Clock::time_point arrived{};  // when its head was complete (set by the endpoint)
  bool last_call = false;       // a Later's wait is over: answer now
};

struct Response {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
};

// No answer yet: ask again on wake() or after `wait` at the latest (then with
// Request::last_call set; a Later then is answered 503). The connection's deadline
// bounds the wait.
struct Later {
  std::chrono::milliseconds wait;
};

using Reply = std::variant<Response, Later>;
using Handler = std::function<Reply(const Request&)>;

struct Limits {
  size_t max_connections = 64;
  std::chrono::milliseconds deadline{5000};  // from accept to the last byte of the response
  size_t max_request_bytes = 8192;           // request line and headers; more: 431
};

// Where the line and headers of a request end in what arrived so far: the position of the
// line end before the first empty line, npos while there is none.
size_t end_of_head(const std::string& in);

// The request whose line and headers are `head` (in.substr(0, end_of_head(in))), or
// the response that refuses it: 405 for a method other than GET and HEAD, 400 for a
// malformed request line, a target not in origin form, or a bare CR or NUL. Pure; the
// endpoint's parser.
std::variant<Request, Response> parse(const std::string& head);

// What goes on the wire for `r`: status line, headers ("Connection: close"), and the
// body unless `head_only` (the answer to HEAD).
std::string render(const Response& r, bool head_only);

class Endpoint {
 public:
  explicit Endpoint(Handler handler, Limits limits = {});
  ~Endpoint();
  Endpoint(const Endpoint&) = delete;
  Endpoint& operator=(const Endpoint&) = delete;

  // Binds a listening socket to `host` (a numeric IPv4 or IPv6 address) and `port`
  // (0: any free one). Before start(). The bound port, or -errno.
  int add_listener(const std::string& host, uint16_t port);
  // Starts the serving thread. 0 or -errno.
  int start();
  // Any thread, after start(): the handler is asked again for every parked request.
  void wake();
  // Stops the thread and closes every socket; idempotent.
  void stop();

 private:
  struct Conn;
  void loop();
  int accept_from(int listen_fd);
  Conn* find(int fd);
  void serve(Conn& c);  // reads and writes what it can; closes the connection when done
  void answer(Conn& c, bool last_call);  // asks the handler; parks c on Later
  void resume_parked(bool due_only);     // answers parked requests (due_only: whose wait is over)
  void close_conn(Conn* c);
  void watch(int fd, int op, uint32_t events);  // epoll_ctl on the endpoint's set

  Handler handler_;
  Limits limits_;
  std::vector<UniqueFd> listeners_;
  UniqueFd epoll_fd_, stop_fd_, wake_fd_;
  std::thread thread_;
  std::vector<std::unique_ptr<Conn>> conns_;  // in accept order
};

}  // namespace syrup::http
