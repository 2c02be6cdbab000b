#include "common/config/flags.h"

#include "common/base/logging.h"

#include <gtest/gtest.h>

namespace gradsync {
namespace {

FlagParser MakeParser() {
  FlagParser p("prog", "test program");
  p.options().add_options()
      ("lr", po::value<float>()->default_value(0.1f), "rate")
      ("batch-size", po::value<int>()->default_value(8), "batch")
      ("fast", po::bool_switch(), "go fast");
  return p;
}

po::variables_map Parse(std::vector<const char*> args, std::vector<const char*> env = {}) {
  FlagParser p = MakeParser();
  args.insert(args.begin(), "prog");
  env.push_back(nullptr);
  return p.ParseOrExit(static_cast<int>(args.size()), args.data(), env.data());
}

TEST(FlagsTest, DefaultsCommandLineAndEnvironment) {
  auto vm = Parse({});
  EXPECT_FLOAT_EQ(vm["lr"].as<float>(), 0.1f);
  EXPECT_FALSE(FlagGiven(vm, "lr"));
  vm = Parse({"--lr=0.5", "--batch-size", "3"});
  EXPECT_FLOAT_EQ(vm["lr"].as<float>(), 0.5f);
  EXPECT_EQ(vm["batch-size"].as<int>(), 3);
  EXPECT_TRUE(FlagGiven(vm, "lr"));
  vm = Parse({}, {"GRADSYNC_LR=0.25", "GRADSYNC_BATCH_SIZE=16", "GRADSYNC_UNRELATED=1", "PATH=/x"});
  EXPECT_FLOAT_EQ(vm["lr"].as<float>(), 0.25f);
  EXPECT_EQ(vm["batch-size"].as<int>(), 16);
  // The command line wins over the environment.
  vm = Parse({"--lr=0.5"}, {"GRADSYNC_LR=0.25"});
  EXPECT_FLOAT_EQ(vm["lr"].as<float>(), 0.5f);
  // A switch: true or 1 sets it, false or 0 leaves it as not given.
  for (const char* on : {"GRADSYNC_FAST=true", "GRADSYNC_FAST=1"}) {
    vm = Parse({}, {on});
    EXPECT_TRUE(vm["fast"].as<bool>()) << on;
    EXPECT_TRUE(FlagGiven(vm, "fast")) << on;
  }
  for (const char* off : {"GRADSYNC_FAST=false", "GRADSYNC_FAST=0"}) {
    vm = Parse({}, {off});
    EXPECT_FALSE(vm["fast"].as<bool>()) << off;
    EXPECT_FALSE(FlagGiven(vm, "fast")) << off;
  }
  // The variable is the flag's FlagEnvName exactly.
  vm = Parse({}, {"GRADSYNC_lr=0.25", "GRADSYNC_BATCH-SIZE=3"});
  EXPECT_FALSE(FlagGiven(vm, "lr"));
  EXPECT_FALSE(FlagGiven(vm, "batch-size"));
}

TEST(FlagsTest, AnUnknownFlagNamesTheClosestOne) {
  FlagParser p = MakeParser();
  auto error = [&](std::vector<const char*> args) {
    args.insert(args.begin(), "prog");
    auto vm = p.Parse(static_cast<int>(args.size()), args.data());
    return vm.ok() ? std::string("parsed") : vm.status().message();
  };
  EXPECT_EQ(error({"--batch-sise=3"}), "unrecognised option '--batch-sise=3' (did you mean --batch-size?)");
  EXPECT_EQ(error({"--fat"}), "unrecognised option '--fat' (did you mean --fast?)");
  EXPECT_EQ(error({"--learning-rate=3"}), "unrecognised option '--learning-rate=3'");  // nothing near
  EXPECT_EQ(p.ClosestOption("--l"), "lr");
  EXPECT_EQ(p.ClosestOption("momentum"), "");
}

TEST(FlagsTest, EnvNamesAndFlagsToEnv) {
  EXPECT_EQ(FlagEnvName("lr"), "GRADSYNC_LR");
  EXPECT_EQ(FlagEnvName("--bucket-mib"), "GRADSYNC_BUCKET_MIB");
  EXPECT_EQ(FlagsToEnv({"--rank=3", "--hidden=256,128", "--nesterov", "--compress=qsgd:4", "--run=a=b"}),
            (EnvVars{{"GRADSYNC_RANK", "3"},
                     {"GRADSYNC_HIDDEN", "256,128"},
                     {"GRADSYNC_NESTEROV", "true"},
                     {"GRADSYNC_COMPRESS", "qsgd:4"},
                     {"GRADSYNC_RUN", "a=b"}}));
  // What FlagsToEnv writes, FlagParser reads back as the same flags.
  std::vector<std::string> env;
  for (const auto& [name, value] : FlagsToEnv({"--lr=0.5", "--batch-size=3", "--fast"})) env.push_back(name + "=" + value);
  std::vector<const char*> envp;
  for (const auto& e : env) envp.push_back(e.c_str());
  auto vm = Parse({}, envp);
  EXPECT_FLOAT_EQ(vm["lr"].as<float>(), 0.5f);
  EXPECT_EQ(vm["batch-size"].as<int>(), 3);
  EXPECT_TRUE(vm["fast"].as<bool>());
}

TEST(FlagsDeathTest, BadFlagsExitTwoWithOneLine) {
  EXPECT_EXIT(Parse({"--nope"}), ::testing::ExitedWithCode(2),
              "^prog: error: unrecognised option '--nope' \\(see --help\\)\n$");
  EXPECT_EXIT(Parse({"--lr=abc"}), ::testing::ExitedWithCode(2), "^prog: error: .*lr.*\n$");
  EXPECT_EXIT(Parse({"--lr"}), ::testing::ExitedWithCode(2), "^prog: error: .*\n$");
  EXPECT_EXIT(Parse({}, {"GRADSYNC_BATCH_SIZE=many"}), ::testing::ExitedWithCode(2),
              "^prog: error: .*batch-size.*\n$");
  EXPECT_EXIT(Parse({}, {"GRADSYNC_FAST=yes please"}), ::testing::ExitedWithCode(2),
              "^prog: error: GRADSYNC_FAST must be true, false, 1 or 0 \\(--fast is a switch\\), not 'yes please' \\(see --help\\)\n$");
  EXPECT_EXIT(Parse({"--log-level=loud"}), ::testing::ExitedWithCode(2),
              "^prog: error: --log-level must be one of.*\n$");
  // Unique prefixes are not guessed: a typo never silently means another flag.
  EXPECT_EXIT(Parse({"--batch=3"}), ::testing::ExitedWithCode(2), "^prog: error: .*\n$");
}

TEST(FlagsDeathTest, Contradictions) {
  FlagParser p = MakeParser();
  const char* argv[] = {"prog", "--lr=1", "--fast"};
  auto vm = p.ParseOrExit(3, argv, nullptr);
  EXPECT_EXIT(p.RejectTogether(vm, "lr", "fast", "fast picks its own rate"),
              ::testing::ExitedWithCode(2),
              "^prog: error: --lr and --fast contradict each other: fast picks its own rate");
}

TEST(FlagsTest, ParseIntList) {
  EXPECT_EQ(*ParseIntList("256,128", 1, 1000), (std::vector<int64_t>{256, 128}));
  EXPECT_EQ(*ParseIntList("7", 1, 1000), (std::vector<int64_t>{7}));
  for (const char* bad : {"", ",", "256,", "a", "1,,2", "0", "1001", "12x", "99999999999999999999"}) {
    EXPECT_FALSE(ParseIntList(bad, 1, 1000).ok()) << bad;
  }
}

TEST(FlagsTest, LogLevelFlag) {
  Parse({"--log-level=warning"});
  EXPECT_EQ(GetLogLevel(), LogLevel::kWarning);
  Parse({}, {"GRADSYNC_LOG_LEVEL=debug"});
  EXPECT_EQ(GetLogLevel(), LogLevel::kDebug);
  LogLevel level;
  EXPECT_FALSE(ParseLogLevel("verbose", &level));
  SetLogLevel(LogLevel::kInfo);
}

TEST(FlagsDeathTest, HelpExitsZero) {
  EXPECT_EXIT(Parse({"--help"}), ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace gradsync
