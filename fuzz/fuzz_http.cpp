// libFuzzer target: the metrics endpoint's request parser, http::respond() in
// syrupd/http_endpoint.cpp, on a request's line and headers as the endpoint hands them
// over (cut at http::end_of_head()). Invariants checked:
//  - the response is "HTTP/1.1 NNN Reason", then headers with Content-Type,
//    Content-Length and "Connection: close", a blank line and exactly Content-Length
//    bytes of body (none for HEAD);
//  - the handler is called exactly when the method is GET or HEAD and the request line
//    is well formed, and then with a non-empty path without a query and a Host value
//    without surrounding blanks or line ends; otherwise the status is 400 or 405.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "http_endpoint.h"

#define SYRUP_FUZZ_TARGET "fuzz_http"
#include "fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace http = syrup::http;
  std::string head(reinterpret_cast<const char*>(data), size);
  size_t end = http::end_of_head(head);
  if (end != std::string::npos) {  // the endpoint cuts there
    check(end < head.size() && head[end] == '\n', "end_of_head");
    head.resize(end);
  }
  int calls = 0;
  http::Request seen;
  std::string r = http::respond(head, [&](const http::Request& req) {
    calls++;
    seen = req;
    return http::Response{req.path == "/404" ? 404 : 200, "text/plain", req.path + "|" + req.host};
  });
  check(r.starts_with("HTTP/1.1 ") && r.size() > 13 && r[12] == ' ', "status line");
  int status = std::atoi(r.substr(9, 3).c_str());
  check(status >= 200 && status <= 599, "status code");
  size_t hend = r.find("\r\n\r\n");
  check(hend != std::string::npos, "end of the headers");
  std::string headers = r.substr(0, hend + 2), body = r.substr(hend + 4);
  check(headers.find("\r\nContent-Type: ") != std::string::npos, "Content-Type");
  check(headers.find("\r\nConnection: close\r\n") != std::string::npos, "Connection: close");
  size_t cl = headers.find("\r\nContent-Length: ");
  check(cl != std::string::npos, "Content-Length");
  size_t length = std::strtoul(headers.c_str() + cl + 18, nullptr, 10);
  if (calls == 1 && seen.method == "HEAD") check(body.empty(), "a body for HEAD");
  else check(body.size() == length, "body length != Content-Length");
  check(calls <= 1, "the handler ran twice");
  if (calls == 1) {
    check(seen.method == "GET" || seen.method == "HEAD", "the handler saw another method");
    check(!seen.path.empty() && seen.path.find('?') == std::string::npos, "path");
    check(seen.host.find_first_of("\r\n") == std::string::npos, "a line end in Host");
    check(seen.host.empty() || (seen.host.front() != ' ' && seen.host.front() != '\t' && seen.host.back() != ' ' &&
                                seen.host.back() != '\t'),
          "blanks around Host");
    check(status == (seen.path == "/404" ? 404 : 200), "the handler's status");
  } else {
    check(status == 400 || status == 405, "refused without 400 or 405");
  }
  return 0;
}
