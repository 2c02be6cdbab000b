// Experiment specs: a valid spec resolves to the flags each process gets; every kind of mistake
// is refused with the file, line and column of the field at fault.
#include "experiments/spec/spec.h"

#include <gtest/gtest.h>

namespace gradsync {
namespace {

TEST(SpecTest, ResolvesDefaultsRunsAndStragglers) {
  auto e = ParseExperiment(R"(
name: "demo"
description: "two runs"
target_accuracy: 0.8
defaults { workers: 4 servers: 2 train { model: "mlp" hidden: "32" dataset: "blobs" epochs: 3 batch: 16 } }
run { name: "ssp3" train { mode: SSP staleness: 3 compress: "topk:0.01" error_feedback: true compress_pull: true }
      straggler { worker: 3 multiple: 3 } straggler { worker: 1 uniform { low_ms: 1 high_ms: 5 } seed: 9 } }
run { name: "ar" workers: 2 train { mode: ALLREDUCE log_every: 10 } link { rate: "100mbit" } }
run { name: "cc" workers: 2 train { mode: ASP } link { rate: "1gbit" delay_ms: 2 congestion_control: "cubic" } }
)", "demo.textproto");
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->name, "demo");
  EXPECT_DOUBLE_EQ(e->target_accuracy, 0.8);
  ASSERT_EQ(e->runs.size(), 3u);
  const RunPlan& s = e->runs[0];
  EXPECT_EQ(s.mode, config::SSP);
  EXPECT_EQ(s.staleness, 3);
  EXPECT_EQ(s.workers, 4);
  EXPECT_EQ(s.servers, 2);
  EXPECT_EQ(s.epochs, 3);
  EXPECT_EQ(s.compression, "topk:0.01+ef+pull");
  EXPECT_EQ(s.straggler, "w3 3x w1 U(1,5)ms");
  EXPECT_EQ(s.worker_args, (std::vector<std::string>{"--run=ssp3", "--model=mlp", "--hidden=32", "--dataset=blobs",
                                                     "--epochs=3", "--batch=16", "--compress=topk:0.01",
                                                     "--error-feedback", "--compress-pull"}));
  EXPECT_EQ(s.worker_extra.at(3), (std::vector<std::string>{"--straggle=x:3", "--straggle-seed=0"}));
  EXPECT_EQ(s.worker_extra.at(1), (std::vector<std::string>{"--straggle=uniform:1:5", "--straggle-seed=9"}));
  const RunPlan& a = e->runs[1];
  EXPECT_EQ(a.mode, config::ALLREDUCE);
  EXPECT_EQ(a.servers, 0);  // the PS default does not apply
  EXPECT_EQ(a.workers, 2);
  EXPECT_EQ(a.link, "100mbit");
  EXPECT_EQ(a.worker_args.back(), "--log-every=10");
  EXPECT_TRUE(a.worker_extra.empty());
  EXPECT_EQ(e->runs[2].link, "1gbit +2ms cubic");  // the congestion control is part of the link
}

// A run's training settings become worker flags through gradsync-worker's own table: only the
// fields set, in the table's order, numbers in their shortest exact form.
TEST(SpecTest, TrainingSettingsBecomeWorkerFlags) {
  auto e = ParseExperiment("name: \"x\"\nrun { name: \"a\" train { mode: BSP overlap: false momentum: 0.9 lr: 0.04 push_part_mib: 0.5 } }",
                           "flags.textproto");
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->runs[0].worker_args,
            (std::vector<std::string>{"--run=a", "--lr=0.04", "--momentum=0.9", "--overlap=false", "--push-part-mib=0.5"}));
  EXPECT_EQ(e->runs[0].epochs, 10);  // the worker's defaults, from train_config.proto
  EXPECT_EQ(e->runs[0].batch, 64);
}

// A run's command: its words split on white space, inherited from the defaults or replacing
// them; the training settings are still written as flags (the launcher hands them to the
// command as variables).
TEST(SpecTest, ACommandIsSplitIntoWordsAndReplacesTheDefaults) {
  auto e = ParseExperiment(R"(
name: "py"
defaults { workers: 2 command: "python3 examples/train.py --epochs=3" train { batch: 32 } }
run { name: "bsp" train { mode: BSP } straggler { worker: 1 fixed_ms: 5 } }
run { name: "own" command: "  ./train.sh\t-v  --x=1 " train { mode: ALLREDUCE nesterov: true } }
run { name: "worker" train { mode: ASP } }
)", "py.textproto");
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->runs[0].command, (std::vector<std::string>{"python3", "examples/train.py", "--epochs=3"}));
  EXPECT_EQ(e->runs[0].worker_args, (std::vector<std::string>{"--run=bsp", "--batch=32"}));
  EXPECT_EQ(e->runs[0].worker_extra.at(1), (std::vector<std::string>{"--straggle=ms:5", "--straggle-seed=0"}));
  EXPECT_EQ(e->runs[1].command, (std::vector<std::string>{"./train.sh", "-v", "--x=1"}));
  EXPECT_EQ(e->runs[1].worker_args, (std::vector<std::string>{"--run=own", "--nesterov", "--batch=32"}));
  EXPECT_EQ(e->runs[2].command, e->runs[0].command);
  auto plain = ParseExperiment("name: \"x\"\nrun { name: \"a\" train { mode: BSP } }", "x.textproto");
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_TRUE(plain->runs[0].command.empty());  // gradsync-worker
}

// Every contradiction of a run is reported, each at its own line and column, on one line.
TEST(SpecTest, EveryContradictionOfARunIsReported) {
  auto e = ParseExperiment("name: \"x\"\nrun { name: \"a\" train { mode: BSP lr: 0\n batch: 0 } }", "bad.textproto");
  ASSERT_FALSE(e.ok());
  const std::string msg = e.status().message();
  EXPECT_EQ(msg.rfind("bad.textproto:2:35: run 'a': lr must be > 0", 0), 0u) << msg;
  EXPECT_NE(msg.find("; bad.textproto:3:2: run 'a': batch must be in"), std::string::npos) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
}

struct BadSpec {
  const char* name;
  const char* text;
  const char* where;    // "file:line:col" prefix the error starts with
  const char* problem;  // part of the message
};

class BadSpecTest : public ::testing::TestWithParam<BadSpec> {};

TEST_P(BadSpecTest, IsRefusedWithItsLine) {
  auto e = ParseExperiment(GetParam().text, "bad.textproto");
  ASSERT_FALSE(e.ok());
  const std::string msg = e.status().message();
  EXPECT_EQ(msg.rfind(GetParam().where, 0), 0u) << msg;
  EXPECT_NE(msg.find(GetParam().problem), std::string::npos) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;  // one line
}

INSTANTIATE_TEST_SUITE_P(
    Mistakes, BadSpecTest,
    ::testing::Values(
        BadSpec{"UnknownField", "name: \"x\"\nrun { name: \"a\" train { mode: BSP }\n  speed: 3 }", "bad.textproto:3:8", "speed"},
        BadSpec{"UnknownTrainField", "name: \"x\"\nrun { name: \"a\" train { mode: BSP\n  speed: 3 } }", "bad.textproto:3:8", "speed"},
        BadSpec{"FlatTrainingFieldOfOldSpecs", "name: \"x\"\nrun { name: \"a\" mode: BSP }", "bad.textproto:2:21", "no field named \"mode\""},
        BadSpec{"UnknownMode", "name: \"x\"\nrun { name: \"a\" train { mode: FAST } }", "bad.textproto:2:36", "FAST"},
        BadSpec{"WrongType", "name: \"x\"\nrun { name: \"a\" train { mode: BSP } workers: \"four\" }", "bad.textproto:2:46", "integer"},
        BadSpec{"NoName", "run { name: \"a\" train { mode: BSP } }", "bad.textproto", "needs a name"},
        BadSpec{"NoRuns", "name: \"x\"", "bad.textproto", "no runs"},
        BadSpec{"RunWithoutName", "name: \"x\"\nrun { train { mode: BSP } }", "bad.textproto:2:1", "every run needs a name"},
        BadSpec{"NoMode", "name: \"x\"\nrun { name: \"a\" }", "bad.textproto:2:1", "needs a mode"},
        BadSpec{"LocalMode", "name: \"x\"\nrun { name: \"a\" train { mode: LOCAL } }", "bad.textproto:2:25", "LOCAL trains one process"},
        BadSpec{"StalenessOutsideSsp", "name: \"x\"\nrun { name: \"a\" train { mode: BSP\n staleness: 2 } }", "bad.textproto:3:2", "staleness applies to mode SSP only"},
        BadSpec{"SspWithoutBound", "name: \"x\"\nrun { name: \"a\" train { mode: SSP } }", "bad.textproto:2:25", "needs a staleness bound"},
        BadSpec{"DuplicateNames", "name: \"x\"\nrun { name: \"a\" train { mode: BSP } }\nrun { name: \"a\" train { mode: ASP } }", "bad.textproto:3:7", "two runs are named 'a'"},
        BadSpec{"BadCodec", "name: \"x\"\nrun { name: \"a\" train { mode: BSP compress: \"gzip\" } }", "bad.textproto:2:35", "unknown compression"},
        BadSpec{"PullInAllreduce", "name: \"x\"\nrun { name: \"a\" train { mode: ALLREDUCE compress: \"fp16\" compress_pull: true } }", "bad.textproto:2:58", "all-reduce has no pulls"},
        BadSpec{"FeedbackWithoutCodec", "name: \"x\"\nrun { name: \"a\" train { mode: BSP error_feedback: true } }", "bad.textproto:2:35", "needs a compress codec"},
        BadSpec{"ModelDoesNotFitDataset", "name: \"x\"\nrun { name: \"a\" train { mode: BSP model: \"sparse_logreg\"\n  dataset: \"fashion-mnist\" } }", "bad.textproto:3:3", "model sparse_logreg cannot train on dataset fashion-mnist"},
        BadSpec{"InheritedDatasetDoesNotFitModel", "name: \"x\"\ndefaults { train {\n  dataset: \"fashion-mnist\" } }\nrun { name: \"a\" train { mode: BSP model: \"sparse_logreg\" } }", "bad.textproto:3:3", "cannot train on"},
        BadSpec{"StragglerOutOfRange", "name: \"x\"\nrun { name: \"a\" train { mode: BSP } workers: 2\n straggler { worker: 2 fixed_ms: 5 } }", "bad.textproto:3:2", "not in [0, 2)"},
        BadSpec{"StragglerWithoutDelay", "name: \"x\"\nrun { name: \"a\" train { mode: BSP } straggler { worker: 0 } }", "bad.textproto:2:37", "needs one of"},
        BadSpec{"StraggleForEveryWorker", "name: \"x\"\nrun { name: \"a\" train { mode: BSP straggle: \"x:3\" } }", "bad.textproto:2:35", "set per worker"},
        BadSpec{"BadRate", "name: \"x\"\nrun { name: \"a\" train { mode: BSP } link { rate: \"fast\" } }", "bad.textproto:2:37", "not a tc rate"},
        BadSpec{"BadCongestionControl", "name: \"x\"\nrun { name: \"a\" train { mode: BSP } link { congestion_control: \"cubic; reboot\" } }", "bad.textproto:2:37",
                "not a TCP congestion control name"},
        BadSpec{"WorkerArgsAreRetired", "name: \"x\"\nrun { name: \"a\" train { mode: BSP } worker_args: \"--rank=3\" }", "bad.textproto:2:48", "no field named \"worker_args\""},
        BadSpec{"ServersForAllreduce", "name: \"x\"\nrun { name: \"a\" train { mode: ALLREDUCE } servers: 2 }", "bad.textproto:2:43", "without servers"},
        BadSpec{"InheritedMistakeNamesTheDefaults", "name: \"x\"\ndefaults { train {\n  epochs: 0 } }\nrun { name: \"a\" train { mode: BSP } }", "bad.textproto:3:3", "epochs must be in"},
        BadSpec{"BadRunName", "name: \"x\"\nrun { name: \"a b\" train { mode: BSP } }", "bad.textproto:2:7", "names are letters"},
        BadSpec{"EmptyCommand", "name: \"x\"\nrun { name: \"a\" train { mode: BSP }\n  command: \" \\t \" }", "bad.textproto:3:3", "command is empty"},
        BadSpec{"TargetOutOfRange", "name: \"x\"\ntarget_accuracy: 85\nrun { name: \"a\" train { mode: BSP } }", "bad.textproto:2:1", "fraction"}),
    [](const ::testing::TestParamInfo<BadSpec>& p) { return p.param.name; });

// Found by fuzz/fuzz_spec: std::regex recursed once per character and overflowed the stack on a
// long hidden list or link rate; the long strings are refused before any regex sees them.
TEST(SpecTest, VeryLongStringsAreRefusedNotACrash) {
  std::string sizes;
  for (int i = 0; i < 50000; ++i) sizes += "1,";
  sizes += "1";
  auto h = ParseExperiment("name: \"x\"\nrun { name: \"a\" train { mode: BSP hidden: \"" + sizes + "\" } }", "long.textproto");
  ASSERT_FALSE(h.ok());
  EXPECT_NE(h.status().message().find("hidden is a list of sizes"), std::string::npos);
  auto r = ParseExperiment("name: \"x\"\nrun { name: \"a\" train { mode: BSP } link { rate: \"" + std::string(100000, '1') + "bit\" } }",
                           "long.textproto");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("is not a tc rate"), std::string::npos);
  auto n = ParseExperiment("name: \"" + std::string(100000, 'a') + "\"\nrun { name: \"" + std::string(100000, 'b') + "\" train { mode: BSP } }",
                           "long.textproto");
  ASSERT_FALSE(n.ok());
  // Still accepted: a list at the bound.
  std::string ok = "64";
  while (ok.size() + 3 <= 256) ok += ",64";
  EXPECT_TRUE(ParseExperiment("name: \"x\"\nrun { name: \"a\" train { mode: BSP hidden: \"" + ok + "\" } }", "ok.textproto").ok());
}

TEST(SpecTest, MissingFileNamesIt) {
  auto e = LoadExperiment("/nonexistent/spec.textproto");
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("/nonexistent/spec.textproto"), std::string::npos);
}

}  // namespace
}  // namespace gradsync
