#include "client.h"

#include <sys/socket.h>
#include <sys/un.h>

#include <cerrno>
#include <cstring>
#include <string_view>

namespace syrup {

int Client::connect(const std::string& path) {
  UniqueFd s(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!s) return -errno;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof addr.sun_path) {
    error_ = "control socket path too long: " + path;
    return -ENAMETOOLONG;
  }
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  if (::connect(s.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) < 0) {
    int e = errno;
    error_ = "cannot reach syrupd at " + path + ": " + std::strerror(e) +
             (e == ENOENT || e == ECONNREFUSED ? " (is syrupd running? see --socket / SYRUP_SOCKET)"
                                                : "");
    return -e;
  }
  sock_ = std::move(s);
  return 0;
}

int Client::call(const nlohmann::json& req, Message& resp, std::span<const int> fds) {
  if (!sock_) {
    error_ = "not connected to syrupd";
    return -ENOTCONN;
  }
  int r = proto::send_message(sock_.get(), req, fds);
  if (r == -EMSGSIZE) {
    error_ = "the request is larger than the " + std::to_string(proto::kMaxPayload) +
             " bytes (4 MiB) a frame carries; it was not sent";
    return r;
  }
  if (r) {
    error_ = std::string("sending request to syrupd failed: ") + std::strerror(-r);
    return r;
  }
  std::string why;
  r = proto::recv_message(sock_.get(), resp, &why);
  if (r) {
    error_ = r == -ENODATA ? "syrupd closed the connection without answering"
             : r == -EPROTO ? "bad response from syrupd: " + why
                            : std::string("reading syrupd's response failed: ") + std::strerror(-r);
    return r == -ENODATA ? -ECONNRESET : r;
  }
  return 0;
}

int response_status(const Message& resp, std::string& error) {
  const auto& b = resp.body;
  if (b.value("ok", false)) return 0;
  int e = b.value("errno", EIO);
  error = b.value("error", std::string("syrupd reported an error"));
  if (b.contains("log") && b["log"].is_string()) {
    std::string log = b["log"].get<std::string>();
    // The message may end with the log's first line (clang's first error): not twice.
    size_t nl = log.find('\n');
    std::string_view first = std::string_view(log).substr(0, nl);
    if (!first.empty() && std::string_view(error).ends_with(first))
      log.erase(0, nl == std::string::npos ? nl : nl + 1);
    while (!log.empty() && log.back() == '\n') log.pop_back();
    if (!log.empty()) error += "\n" + log;
  }
  return -(e > 0 ? e : EIO);
}

}  // namespace syrup
