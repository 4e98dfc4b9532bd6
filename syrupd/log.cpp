#include "log.h"

#include <cstdarg>
#include <cstdio>

namespace syrup {
namespace {
LogLevel g_level = LogLevel::kInfo;
// sd-daemon(3) priority prefixes, so journald files each line at the right level.
const char* kPrefix[] = {"<7>debug: ", "<6>info: ", "<4>warning: ", "<3>error: "};
}  // namespace

void set_log_level(LogLevel level) { g_level = level; }

bool parse_log_level(std::string_view s, LogLevel& out) {
  static constexpr std::string_view names[] = {"debug", "info", "warn", "error"};
  for (int i = 0; i < 4; i++)
    if (s == names[i]) {
      out = static_cast<LogLevel>(i);
      return true;
    }
  return false;
}

void log(LogLevel level, const char* fmt, ...) {
  if (level < g_level) return;
  char buf[4096];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  std::fprintf(stderr, "%ssyrupd: %s\n", kPrefix[static_cast<int>(level)], buf);
}

}  // namespace syrup
