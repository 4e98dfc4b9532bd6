#include "cli.h"

#include <gflags/gflags.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <vector>

namespace syrup::cli {
namespace {

std::string g_program;
std::vector<IntRange> g_ranges;

[[noreturn]] void usage_error(const std::string& what) {
  std::fprintf(stderr, "%s: %s (see --help)\n", g_program.c_str(), what.c_str());
  std::exit(2);
}

// gflags' own flags (--flagfile, --helpxml, ...), defined in its three sources.
bool gflags_own(const gflags::CommandLineFlagInfo& f) {
  for (const char* src : {"/gflags.cc", "/gflags_reporting.cc", "/gflags_completions.cc"})
    if (f.filename.ends_with(src)) return true;
  return false;
}

std::string wrapped(const std::string& text, size_t indent, size_t width) {
  std::string out, line;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find(' ', pos);
    if (end == std::string::npos) end = text.size();
    std::string word = text.substr(pos, end - pos);
    if (!line.empty() && indent + line.size() + 1 + word.size() > width) {
      out += std::string(indent, ' ') + line + "\n";
      line.clear();
    }
    line += (line.empty() ? "" : " ") + word;
    pos = end + 1;
  }
  if (!line.empty()) out += std::string(indent, ' ') + line + "\n";
  return out;
}

void check_args(const std::vector<std::string>& args, const std::string& file, int depth);

// The flags in a --flagfile, one per line ("--name=value"; "#" starts a comment), looked at
// as those on the command line. A file that also has gflags' program-name lines (a line
// not starting with "-" limits the flags after it to the programs it names) is left to
// gflags, which knows which of its flags apply.
void check_flagfile(const std::string& path, int depth) {
  if (depth > 8) usage_error("--flagfile " + path + " includes flagfiles more than 8 deep");
  std::ifstream in(path);
  if (!in) usage_error("cannot read the flagfile " + path + ": " + std::strerror(errno));
  std::vector<std::string> args;
  std::string line;
  while (std::getline(in, line)) {
    size_t b = line.find_first_not_of(" \t\r");
    if (b == std::string::npos || line[b] == '#') continue;
    line = line.substr(b, line.find_last_not_of(" \t\r") + 1 - b);
    if (line[0] != '-') return;  // a program-name line
    args.push_back(line);
  }
  check_args(args, path, depth + 1);
}

// Looks at every flag in `args` (the command line, or the lines of `file`) as gflags will
// parse it, and ends the program with a usage error on one it would refuse. Values are
// tried with SetCommandLineOption under the caller's FlagSaver, which puts every flag back
// when it goes out of scope.
void check_args(const std::vector<std::string>& args, const std::string& file, int depth) {
  std::string where = file.empty() ? "" : " in the flagfile " + file;
  for (size_t i = 0; i < args.size(); i++) {
    const std::string& arg = args[i];
    if (arg == "--") break;
    if (arg.size() < 2 || arg[0] != '-') continue;  // a positional argument (or "-")
    std::string body = arg.substr(arg[1] == '-' ? 2 : 1);
    size_t eq = body.find('=');
    std::string name = body.substr(0, eq);
    gflags::CommandLineFlagInfo info;
    if (!gflags::GetCommandLineFlagInfo(name.c_str(), &info)) {
      if (eq == std::string::npos && name.starts_with("no") &&
          gflags::GetCommandLineFlagInfo(name.substr(2).c_str(), &info) && info.type == "bool")
        continue;  // --noFLAG of a bool flag
      usage_error("unknown flag --" + name + where);
    }
    std::string value;
    if (eq != std::string::npos) value = body.substr(eq + 1);
    else if (info.type == "bool") continue;
    else if (file.empty() && i + 1 < args.size()) value = args[++i];
    else usage_error("flag --" + name + " needs a value" + where);  // a flagfile has --name=value
    if (name == "flagfile") {
      // gflags reads a comma-separated list of files, in order.
      for (size_t b = 0; b <= value.size();) {
        size_t e = std::min(value.find(',', b), value.size());
        if (e > b) check_flagfile(value.substr(b, e - b), depth);
        b = e + 1;
      }
      continue;
    }
    if (gflags_own(info)) continue;  // --fromenv and the like act when set: gflags' own
    for (const auto& r : g_ranges) {
      int64_t v;
      if (name == r.flag && !integer_in(value, r.lo, r.hi, v))
        usage_error("--" + name + " takes an integer in " + std::to_string(r.lo) + ".." + std::to_string(r.hi) +
                    ", got '" + value + "'" + where);
    }
    if (gflags::SetCommandLineOption(name.c_str(), value.c_str()).empty())
      usage_error("'" + value + "' is not a valid value for --" + name + " (" + info.type + ")" + where);
  }
}

}  // namespace

std::string help_text(const std::string& program, const std::string& usage) {
  std::string out = program + ": " + usage + "\n\nFlags:\n";
  std::vector<gflags::CommandLineFlagInfo> flags;
  gflags::GetAllFlags(&flags);  // sorted by name
  for (auto& f : flags) {
    if (gflags_own(f)) continue;
    std::string head = "  --" + f.name;
    if (f.type == "bool") {
      head += f.default_value == "true" ? " (default: on; --no" + f.name + " turns it off)" : " (default: off)";
    } else {
      std::string shown = f.type == "string" ? "\"" + f.default_value + "\"" : f.default_value;
      head += "=" + std::string(f.type == "string" ? "STRING" : f.type == "double" ? "X" : "N") + "  (default " +
              shown + ")";
    }
    out += head + "\n" + wrapped(f.description, 6, 80);
  }
  out += "  --help, -h\n      this text (--helpfull: gflags' own flags too)\n";
  out += "  --version\n      the version\n";
  return out;
}

bool integer_in(const std::string& text, int64_t lo, int64_t hi, int64_t& out) {
  size_t i = text.starts_with('-') ? 1 : 0;
  bool hex = text.compare(i, 2, "0x") == 0 || text.compare(i, 2, "0X") == 0;
  std::string digits = text.substr(i + (hex ? 2 : 0));
  if (digits.empty() || digits.size() > 20) return false;
  for (char c : digits)
    if (!(hex ? std::isxdigit(static_cast<unsigned char>(c)) : std::isdigit(static_cast<unsigned char>(c))))
      return false;
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(text.c_str(), &end, hex ? 16 : 10);
  if (errno == ERANGE || *end || v < lo || v > hi) return false;
  out = v;
  return true;
}

void parse_flags(int* argc, char*** argv, const std::string& usage, const std::string& version,
                 const std::vector<IntRange>& ranges) {
  g_ranges = ranges;
  std::string path = (*argc > 0 && (*argv)[0]) ? (*argv)[0] : "syrup";
  g_program = path.substr(path.rfind('/') + 1);
  gflags::SetUsageMessage(usage);
  gflags::SetVersionString(version);
  bool help = false;
  for (int i = 1; i < *argc; i++) {
    std::string a = (*argv)[i];
    if (a == "--") break;
    if (a == "-h" || a == "-help" || a == "--help" || a == "-helpshort" || a == "--helpshort") help = true;
  }
  if (help) {
    std::fputs(help_text(g_program, usage).c_str(), stdout);
    std::exit(0);
  }
  {
    gflags::FlagSaver saver;
    check_args(std::vector<std::string>(*argv + 1, *argv + *argc), "", 0);
  }
  gflags::ParseCommandLineFlags(argc, argv, true);
}

}  // namespace syrup::cli
