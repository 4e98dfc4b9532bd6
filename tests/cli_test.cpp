// Unit tests of tools/cli (command-line parsing and --help shared by the programs), and
// the --help and flag errors of the built programs themselves.
#include <gflags/gflags.h>
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "cli.h"
#include "harness.h"

DEFINE_uint32(cli_test_count, 3, "how many things to count, a description long enough that the help text has to "
                                 "wrap it onto a second line");
DEFINE_string(cli_test_name, "x", "a name");
DEFINE_bool(cli_test_on, true, "on unless turned off");
DEFINE_bool(cli_test_off, false, "off unless turned on");

namespace {

using syrup::test::build_bin;
using syrup::test::run_cmd;

// Runs parse_flags on `args` (argv[0] is "prog").
void parse(std::vector<std::string> args) {
  args.insert(args.begin(), "prog");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  int argc = static_cast<int>(args.size());
  char** p = argv.data();
  syrup::cli::parse_flags(&argc, &p, "tests the flags.\n\nUsage: prog [flags]");
}

TEST(Cli, ParsesFlagsAsGflagsDoes) {
  gflags::FlagSaver saver;
  parse({"--cli_test_count=7", "--cli_test_name", "-dash-", "--nocli_test_on"});
  EXPECT_EQ(FLAGS_cli_test_count, 7u);
  EXPECT_EQ(FLAGS_cli_test_name, "-dash-");
  EXPECT_FALSE(FLAGS_cli_test_on);
}

TEST(Cli, BadFlagsAreUsageErrorsThatNameTheFlag) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(parse({"--cli_test_bogus"}), testing::ExitedWithCode(2),
              "^prog: unknown flag --cli_test_bogus \\(see --help\\)\n$");
  EXPECT_EXIT(parse({"--cli_test_count=many"}), testing::ExitedWithCode(2),
              "^prog: 'many' is not a valid value for --cli_test_count \\(uint32\\) \\(see --help\\)\n$");
  EXPECT_EXIT(parse({"--cli_test_count"}), testing::ExitedWithCode(2),
              "^prog: flag --cli_test_count needs a value \\(see --help\\)\n$");
  // After "--" nothing is a flag.
  EXPECT_EXIT(
      {
        parse({"--", "--cli_test_bogus"});
        std::exit(FLAGS_cli_test_count == 3 ? 0 : 1);
      },
      testing::ExitedWithCode(0), "");
}

// gflags' own --flagfile: its value may be the next argument, and the flags in the file are
// looked at as those on the command line, naming the file. "fast" (forked) death tests:
// the "threadsafe" ones run the whole test again in a child that exits inside
// EXPECT_EXIT, so the child's own TempDir was never removed (5 directories a run).
TEST(Cli, FlagsInAFlagfileAreCheckedAsOnTheCommandLine) {
  GTEST_FLAG_SET(death_test_style, "fast");
  syrup::test::TempDir dir;
  auto write_file = [](const std::string& path, const std::string& text) { std::ofstream(path) << text; };
  std::string good = dir.path() + "/good.flags", bad = dir.path() + "/bad.flags", worse = dir.path() + "/worse.flags";
  write_file(good, "# a comment\n\n  --cli_test_count=9\n--nocli_test_on\n");
  write_file(bad, "--cli_test_count=9\n--cli_test_bogus=1\n");
  write_file(worse, "--cli_test_count=lots\n");
  EXPECT_EXIT(
      {
        parse({"--flagfile", good, "--cli_test_name=y"});
        std::exit(FLAGS_cli_test_count == 9 && !FLAGS_cli_test_on && FLAGS_cli_test_name == "y" ? 0 : 1);
      },
      testing::ExitedWithCode(0), "");
  EXPECT_EXIT(parse({"--flagfile=" + good + "," + bad}), testing::ExitedWithCode(2),
              "^prog: unknown flag --cli_test_bogus in the flagfile /tmp/[^ ]*/bad.flags \\(see --help\\)\n$");
  EXPECT_EXIT(parse({"--flagfile", worse}), testing::ExitedWithCode(2),
              "^prog: 'lots' is not a valid value for --cli_test_count \\(uint32\\) in the flagfile "
              "/tmp/[^ ]*/worse.flags \\(see --help\\)\n$");
  EXPECT_EXIT(parse({"--flagfile", dir.path() + "/none"}), testing::ExitedWithCode(2),
              "^prog: cannot read the flagfile /tmp/[^ ]*/none: No such file or directory \\(see --help\\)\n$");
}

TEST(Cli, HelpShowsTheUsageAndOwnFlagsOnly) {
  std::string h = syrup::cli::help_text("prog", "tests the flags.\n\nUsage: prog [flags]");
  EXPECT_EQ(h.rfind("prog: tests the flags.\n\nUsage: prog [flags]\n\nFlags:\n", 0), 0u) << h;
  EXPECT_NE(h.find("  --cli_test_count=N  (default 3)\n"
                   "      how many things to count, a description long enough that the help text has\n"
                   "      to wrap it onto a second line\n"),
            std::string::npos)
      << h;
  EXPECT_NE(h.find("  --cli_test_name=STRING  (default \"x\")\n      a name\n"), std::string::npos) << h;
  EXPECT_NE(h.find("  --cli_test_on (default: on; --nocli_test_on turns it off)\n"), std::string::npos) << h;
  EXPECT_NE(h.find("  --cli_test_off (default: off)\n"), std::string::npos) << h;
  for (const char* internal : {"flagfile", "tab_completion", "helpxml", "gflags.cc", "Flags from"})
    EXPECT_EQ(h.find(internal), std::string::npos) << internal << " in:\n" << h;
  EXPECT_EXIT(parse({"-h"}), testing::ExitedWithCode(0), "");
}

// The built programs: --help lists their own flags; a bad flag exits 2 naming it.
TEST(Cli, TheProgramsHelpAndFlagErrors) {
  struct Want {
    const char* program;
    const char* starts;
    const char* flag;
  };
  for (const Want& w : std::vector<Want>{
           {"syrupd", "syrupd: the Syrup daemon", "  --max_clients_per_uid=N  (default 32)\n"},
           {"syrupctl", "syrupctl: control the Syrup daemon", "  --json (default: off)\n"},
           {"syrup_bench", "syrup_bench: Syrup's benchmarks", "  --rounds=N  (default 5)\n"},
       }) {
    std::string bin = build_bin(w.program), out;
    EXPECT_EQ(run_cmd(bin + " --help", out), 0) << out;
    EXPECT_EQ(out.rfind(w.starts, 0), 0u) << out;
    EXPECT_NE(out.find(w.flag), std::string::npos) << out;
    EXPECT_EQ(out.find("flagfile"), std::string::npos) << out;
    EXPECT_EQ(run_cmd(bin + " --no_such_flag", out), 2) << out;
    EXPECT_EQ(out, std::string(w.program) + ": unknown flag --no_such_flag (see --help)\n");
  }
}

// syrupctl refuses a value outside a closed set before asking syrupd (exit 2, naming the
// flag and what it takes), and with --json says "unreachable" as a JSON object on stdout.
TEST(Cli, SyrupctlNamesTheFlagAndItsValuesAndSpeaksJsonWhenUnreachable) {
  std::string ctl = build_bin("syrupctl") + " --socket /nonexistent/syrupd.sock ", out;
  struct Case {
    const char* args;
    const char* says;
  } cases[] = {
      {"deploy --hook sockselect --pid 1 --port 9000 p.c", "--hook takes one of socket-select, xdp, thread, socket-lookup, got 'sockselect'"},
      {"deploy --protocol sctp --pid 1 --port 9000 p.c", "--protocol: must be udp or tcp, got \"sctp\""},
      {"deploy --address 300.1.2.3 --pid 1 --port 9000 p.c",
       "--address: must be an IPv4 or IPv6 address as the sockets are bound (e.g. 127.0.0.1, ::, 0.0.0.0), got "
       "\"300.1.2.3\""},
      {"deploy --port 70000 --pid 1 p.c", "--port: must be an integer in 1..65535, got 70000"},
      {"deploy --hook thread --pid 1 --port 9000 p.c", "--port: is not a key of the thread hook (its keys: pid, cgroup)"},
      {"deploy --hook xdp --ifname lo --port 9000 --cpus 0-3,x p.c",
       "--cpus: must be a list of CPU numbers (0..4095) or ranges such as 0-3, got \"x\""},
  };
  for (auto& c : cases) {
    EXPECT_EQ(run_cmd(ctl + c.args + " 2>&1", out), 2) << c.args << ": " << out;
    EXPECT_NE(out.find(c.says), std::string::npos) << c.args << ": " << out;
  }
  EXPECT_EQ(run_cmd("{ " + ctl + "--json list 2>/dev/null; }", out), 3) << out;
  nlohmann::json j = nlohmann::json::parse(out, nullptr, false);
  ASSERT_TRUE(j.is_object()) << "not a JSON object on stdout: " << out;
  EXPECT_EQ(j.value("ok", true), false) << out;
  EXPECT_EQ(j.value("unreachable", false), true) << out;
  EXPECT_NE(j.value("error", std::string()).find("/nonexistent/syrupd.sock"), std::string::npos) << out;
}

}  // namespace
