// libFuzzer target: the metrics endpoint's request parser and response writer,
// http::parse() and http::render() in syrupd/http_endpoint.cpp, on a request's line and
// headers as the endpoint hands them over (cut at http::end_of_head()). Invariants
// checked:
//  - parse() gives a request exactly when the method is GET or HEAD and the request
//    line is well formed, and then with a path that starts with '/' and has no query
//    and a Host value without surrounding blanks or line ends; otherwise a refusal with
//    status 400 or 405;
//  - what render() writes is "HTTP/1.1 NNN Reason", then headers with Content-Type,
//    Content-Length and "Connection: close", a blank line and exactly Content-Length
//    bytes of body (none for HEAD).
#include <cstdio>
#include <cstdlib>
#include <string>
#include <variant>

#include "http_endpoint.h"

#define SYRUP_FUZZ_TARGET "fuzz_http"
#include "fuzz_check.h"

namespace {

void check_wire(const std::string& r, int want_status, size_t want_length, bool head_only) {
  check(r.starts_with("HTTP/1.1 ") && r.size() > 13 && r[12] == ' ', "status line");
  check(std::atoi(r.substr(9, 3).c_str()) == want_status, "status code");
  size_t hend = r.find("\r\n\r\n");
  check(hend != std::string::npos, "end of the headers");
  std::string headers = r.substr(0, hend + 2), body = r.substr(hend + 4);
  check(headers.find("\r\nContent-Type: ") != std::string::npos, "Content-Type");
  check(headers.find("\r\nConnection: close\r\n") != std::string::npos, "Connection: close");
  size_t cl = headers.find("\r\nContent-Length: ");
  check(cl != std::string::npos, "Content-Length");
  check(std::strtoul(headers.c_str() + cl + 18, nullptr, 10) == want_length, "Content-Length's value");
  check(body.size() == (head_only ? 0 : want_length), "body length");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace http = syrup::http;
  std::string head(reinterpret_cast<const char*>(data), size);
  size_t end = http::end_of_head(head);
  if (end != std::string::npos) {  // the endpoint cuts there
    check(end < head.size() && head[end] == '\n', "end_of_head");
    head.resize(end);
  }
  auto parsed = http::parse(head);
  if (auto* refusal = std::get_if<http::Response>(&parsed)) {
    check(refusal->status == 400 || refusal->status == 405, "refused without 400 or 405");
    check_wire(http::render(*refusal, false), refusal->status, refusal->body.size(), false);
    return 0;
  }
  auto& req = std::get<http::Request>(parsed);
  check(req.method == "GET" || req.method == "HEAD", "a request with another method");
  check(req.path.starts_with('/') && req.path.find('?') == std::string::npos, "path");
  check(req.host.find_first_of("\r\n") == std::string::npos, "a line end in Host");
  check(req.host.empty() || (req.host.front() != ' ' && req.host.front() != '\t' && req.host.back() != ' ' &&
                             req.host.back() != '\t'),
        "blanks around Host");
  // The response echoes what was parsed, so its length follows the input.
  http::Response r{.status = req.path == "/404" ? 404 : 200, .body = req.path + "|" + req.host};
  bool head_only = req.method == "HEAD";
  check_wire(http::render(r, head_only), r.status, r.body.size(), head_only);
  return 0;
}
