// Command-line parsing shared by Syrup's programs (syrupd, syrupctl, syrup_bench and the
// RocksDB example's kv_server and kv_loadgen), on top of gflags.
//
// Design: gflags parses the flags, but two of its behaviours are not what a user of a
// system tool expects, and this is the one place that changes them:
//  - --help (also -h and --helpshort) prints the program's usage message and its own
//    flags (name, type, default, description) to stdout and exits 0. gflags' own help
//    lists its internal flags first, under the path of the file that defined each flag
//    on the build machine; --helpfull still shows that.
//  - A flag the program does not have, or a malformed value, ends the program with exit
//    status 2 (a usage error, as syrupctl documents) and "PROG: ... (see --help)" on
//    stderr, instead of gflags' exit status 1. The flags in a --flagfile are looked at
//    too ("... in the flagfile F"), and so is a flagfile that cannot be read.
// Invariant: flags are parsed exactly as gflags parses them (the checks above only look);
// --version and --helpfull keep gflags' behaviour.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace syrup::cli {

// The values an integer flag accepts. One outside them, or not an integer, is a usage
// error naming the flag and the range ("--port takes an integer in 1..65535, got
// '4294976396'"), where gflags would say only that the value is not an int32, or take
// it and leave the program to cut it.
struct IntRange {
  const char* flag;
  int64_t lo, hi;
};

// Sets the usage message and version, then parses like gflags::ParseCommandLineFlags
// (flags are removed from argv). `usage` is the text after "PROG: " in --help; `ranges`
// are checked on the command line and in flagfiles alike.
void parse_flags(int* argc, char*** argv, const std::string& usage, const std::string& version = "0.1.0",
                 const std::vector<IntRange>& ranges = {});

// Whether `text` is a whole decimal (or 0x hexadecimal) integer in lo..hi, as gflags reads
// integers; the value in `out`.
bool integer_in(const std::string& text, int64_t lo, int64_t hi, int64_t& out);

// The --help text (usage and the program's own flags), as parse_flags prints it.
std::string help_text(const std::string& program, const std::string& usage);

}  // namespace syrup::cli
