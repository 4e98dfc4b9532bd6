// One logging function for the daemon: leveled lines on stderr (journald keeps them
// when syrupd runs as a service). Messages at or above the configured level are printed.
#pragma once

#include <string_view>

namespace syrup {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3 };

void set_log_level(LogLevel level);
// Parses "debug", "info", "warn", "error"; false if unknown.
bool parse_log_level(std::string_view s, LogLevel& out);
void log(LogLevel level, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

}  // namespace syrup
