#include "common/config/flags.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <iostream>
#include <map>
#include <vector>

#include "common/base/check.h"
#include "common/base/logging.h"

extern char** environ;

namespace gradsync {

FlagParser::FlagParser(std::string program, std::string summary, std::string usage)
    // 120 columns: a description keeps its longest unbroken token (a codec list) on one line.
    : program_(std::move(program)), summary_(std::move(summary)), usage_(std::move(usage)), options_("Options", 120, 60) {
  options_.add_options()
      ("help,h", "print this help and exit")
      ("log-level", po::value<std::string>()->default_value("info"), "debug|info|warning|error");
}

void FlagParser::Fail(std::string_view message) const {
  std::cerr << program_ << ": error: " << message << " (see --help)" << std::endl;
  std::exit(kUsageExitCode);
}

Result<std::vector<int64_t>> ParseIntList(std::string_view text, int64_t min, int64_t max) {
  std::vector<int64_t> values;
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    if (comma == std::string_view::npos) comma = text.size();
    std::string item(text.substr(start, comma - start));
    char* end = nullptr;
    errno = 0;
    long long v = item.empty() ? 0 : std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || errno != 0 || v < min || v > max) {
      return InvalidArgumentError("'" + std::string(text) + "' is not a comma-separated list of integers in [" +
                                  std::to_string(min) + ", " + std::to_string(max) + "]");
    }
    values.push_back(v);
    start = comma + 1;
  }
  return values;
}

bool FlagGiven(const po::variables_map& vm, const char* name) {
  return vm.count(name) > 0 && !vm[name].defaulted();
}

std::string FlagEnvName(std::string_view flag) {
  if (flag.starts_with("--")) flag.remove_prefix(2);
  std::string name = "GRADSYNC_";
  for (char c : flag) name += (c == '-') ? '_' : static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return name;
}

EnvVars FlagsToEnv(const std::vector<std::string>& flags) {
  EnvVars env;
  for (const std::string& flag : flags) {
    GRADSYNC_CHECK(flag.starts_with("--")) << "not a flag: '" << flag << "'";
    const auto eq = flag.find('=');
    if (eq == std::string::npos) env.emplace_back(FlagEnvName(flag), "true");
    else env.emplace_back(FlagEnvName(flag.substr(0, eq)), flag.substr(eq + 1));
  }
  return env;
}

void FlagParser::RejectTogether(const po::variables_map& vm, const char* a, const char* b,
                                std::string_view why) const {
  if (FlagGiven(vm, a) && FlagGiven(vm, b)) {
    Fail("--" + std::string(a) + " and --" + std::string(b) + " contradict each other: " +
         std::string(why));
  }
}

po::variables_map FlagParser::ParseOrExit(int argc, const char* const* argv,
                                          const char* const* envp) {
  auto vm = Parse(argc, argv, envp);
  if (!vm.ok()) Fail(vm.status().message());
  if (vm->count("help")) {
    // The example variable is one this binary has.
    const std::string usage = "Usage: " + (usage_.empty() ? program_ + " [options]" : usage_);
    const char* example = options_.find_nothrow("lr", false) ? "GRADSYNC_LR=0.05" : "GRADSYNC_LOG_LEVEL=debug";
    std::cout << usage << "\n" << summary_ << "\n\n" << options_ << "\nAny option may also be set as GRADSYNC_<NAME> in the environment"
              << " (e.g. " << example << "); the command line wins.\n";
    std::exit(0);
  }
  return std::move(vm).value();
}

namespace {

// Edits (insert, delete, replace) between a and b.
size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

}  // namespace

std::string FlagParser::ClosestOption(std::string_view given) const {
  while (given.starts_with("-")) given.remove_prefix(1);
  given = given.substr(0, given.find('='));
  std::string best;
  size_t best_distance = std::max<size_t>(2, given.size() / 4) + 1;  // at most 2 edits, more for long names
  for (const auto& option : options_.options()) {
    const std::string& name = option->long_name();
    const size_t d = EditDistance(given, name);
    if (d < best_distance) best = name, best_distance = d;
  }
  return best;
}

Result<po::variables_map> FlagParser::Parse(int argc, const char* const* argv, const char* const* envp) const {
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(argc, argv)
                  .options(options_)
                  .positional(positional_)
                  .style(po::command_line_style::unix_style ^ po::command_line_style::allow_guessing)
                  .run(),
              vm);
    // Environment variables: GRADSYNC_<NAME> where <name> is a declared option.
    std::map<std::string, std::string, std::less<>> env;
    for (const char* const* e = envp ? envp : environ; e && *e; ++e) {
      std::string_view kv(*e);
      const auto eq = kv.find('=');
      if (!kv.starts_with("GRADSYNC_") || eq == std::string_view::npos) continue;
      env.emplace(kv.substr(0, eq), kv.substr(eq + 1));
    }
    std::vector<std::string> env_args;
    for (const auto& option : options_.options()) {
      const std::string& name = option->long_name();
      const auto it = env.find(FlagEnvName(name));
      if (name == "help" || it == env.end()) continue;
      if (vm.count(name) && !vm[name].defaulted()) continue;  // the command line wins
      if (option->semantic()->max_tokens() > 0) {
        env_args.push_back("--" + name + "=" + it->second);
      } else if (it->second == "true" || it->second == "1") {  // a switch
        env_args.push_back("--" + name);
      } else if (it->second != "false" && it->second != "0") {
        return InvalidArgumentError(it->first + " must be true, false, 1 or 0 (--" + name + " is a switch), not '" +
                                    it->second + "'");
      }
    }
    if (!env_args.empty()) {
      po::variables_map env_vm;
      po::store(po::command_line_parser(env_args).options(options_).run(), env_vm);
      for (auto& [k, v] : env_vm) {
        if (!v.defaulted() && (!vm.count(k) || vm[k].defaulted())) vm.erase(k), vm.emplace(k, v);
      }
    }
    if (vm.count("help")) return vm;
    po::notify(vm);
  } catch (const po::unknown_option& e) {
    const std::string closest = ClosestOption(e.get_option_name());
    return InvalidArgumentError(std::string(e.what()) + (closest.empty() ? "" : " (did you mean --" + closest + "?)"));
  } catch (const po::error& e) {
    return InvalidArgumentError(e.what());
  }
  if (vm.count("log-level")) {
    LogLevel level;
    if (!ParseLogLevel(vm["log-level"].as<std::string>(), &level)) {
      return InvalidArgumentError("--log-level must be one of debug|info|warning|error, not '" +
                                  vm["log-level"].as<std::string>() + "'");
    }
    SetLogLevel(level);
  }
  return vm;
}

}  // namespace gradsync
