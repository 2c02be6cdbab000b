// Command-line flags for the gradsync binaries, on Boost.Program_options.
//
// Every binary builds one FlagParser, declares its options, and calls ParseOrExit():
//   - `--help` prints the usage and every option, then exits 0;
//   - an unknown, malformed or contradictory flag prints ONE line
//     "<program>: error: <what is wrong> (see --help)" to stderr and exits 2;
//   - a flag may also come from the environment as GRADSYNC_<NAME> (FlagEnvName: upper case,
//     '-' -> '_'), e.g. GRADSYNC_LR=0.05 for --lr, GRADSYNC_NESTEROV=true (or 1; false or 0:
//     not given) for a switch; the command line wins over the environment, and a GRADSYNC_
//     variable that names no option of the binary is ignored;
//   - --help prints "Usage: <usage>" first: the `usage` given (positional arguments), else
//     "<program> [options]". Give a float or inexact double default its text, or --help
//     prints it as boost does (0.0199999996): default_value(0.02f, "0.02"), or
//     common/config/train_config.h's ShortestText().
// Only binaries (main.cc) use this; libraries take Options structs.
//
//   FlagParser flags("gradsync-worker", "Trains a model.");
//   flags.options().add_options()("lr", po::value<float>()->default_value(0.1f), "learning rate");
//   auto vm = flags.ParseOrExit(argc, argv);
//   if (vm["lr"].as<float>() <= 0) flags.Fail("--lr must be > 0");
#pragma once

#include <boost/program_options.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/base/status.h"

namespace gradsync {

namespace po = boost::program_options;

inline constexpr int kUsageExitCode = 2;

class FlagParser {
 public:
  FlagParser(std::string program, std::string summary, std::string usage = "");

  po::options_description& options() { return options_; }
  // Positional arguments (each maps to a declared option); none by default.
  po::positional_options_description& positional() { return positional_; }
  const std::string& program() const { return program_; }

  // Parses argv, then GRADSYNC_* variables from `envp` (nullptr: the process environment).
  // Applies --log-level. Exits as described above on --help or on an error.
  po::variables_map ParseOrExit(int argc, const char* const* argv, const char* const* envp = nullptr);
  // The same without exiting (for a library that parses flags, such as the Python frontend): a
  // bad flag is kInvalidArgument with the message Fail would print; --help is returned in the map.
  Result<po::variables_map> Parse(int argc, const char* const* argv, const char* const* envp = nullptr) const;
  // The declared option nearest to `given` ("--epoch=3" -> "epochs"): at most 2 edits away (a
  // quarter of its length for long names), or "" when none is.
  std::string ClosestOption(std::string_view given) const;

  // Prints "<program>: error: <message> (see --help)" and exits 2.
  [[noreturn]] void Fail(std::string_view message) const;

  // Fails when both flags were given explicitly (not by default).
  void RejectTogether(const po::variables_map& vm, const char* a, const char* b,
                      std::string_view why) const;

 private:
  std::string program_;
  std::string summary_;
  std::string usage_;
  po::options_description options_;
  po::positional_options_description positional_;
};

// Parses a comma-separated list of integers in [min, max] ("256,128"); empty items, junk and
// out-of-range values are errors that quote the text.
Result<std::vector<int64_t>> ParseIntList(std::string_view text, int64_t min, int64_t max);

// True when the option was given on the command line or in the environment (not a default).
bool FlagGiven(const po::variables_map& vm, const char* name);

// The environment variable FlagParser reads a flag from: "lr" or "--lr" -> "GRADSYNC_LR",
// "bucket-mib" -> "GRADSYNC_BUCKET_MIB".
std::string FlagEnvName(std::string_view flag);

// Environment variables, name and value, in order.
using EnvVars = std::vector<std::pair<std::string, std::string>>;

// The variables that give a process the same settings as `flags` ("--name=value", or "--name"
// for a switch, which becomes GRADSYNC_NAME=true): what a worker command started in place of
// gradsync-worker gets. Every word must start with "--".
EnvVars FlagsToEnv(const std::vector<std::string>& flags);

}  // namespace gradsync
