// gradsync-sim against the real thing: a few runs measured with gradsync-run over emulated 100 Mbit/s
// links (network namespaces, tc tbf), the same spec simulated, and --compare's verdict on step time
// and bytes per step. The full calibration (every mode, dense and top-k, 2 / 4 / 8 workers, two link
// speeds) is bench/sim_calibration.sh.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "tests/support/subprocess.h"
#include "tests/support/temp_dir.h"

namespace gradsync::testing {
namespace {

TEST(SimBinaryTest, PredictsTheMeasuredStepTimeAndBytesPerStepOfRealRunsOnSlowLinks) {
  if (!CanEmulateLinks()) {
    GRADSYNC_SKIP_UNLESS_CI("link emulation needs root and iproute2");
  }
  TempDir dir;
  const std::string out = dir.File("results");
  const std::string spec = dir.File("calibration.textproto");
  std::ofstream(spec) << "name: \"cal\"\n"
                         "defaults { servers: 1 train { model: \"mlp\" epochs: 1 max_steps: 30 batch: 32 log_every: 1 }\n"
                         "  sim { compute_from: \"" << out << "/cal/compute/metrics.csv\" host_cores: 2 loopback_rate: \"10gbit\" net_ns_per_byte: 1 msg_us: 100 usable_cores: 1.8 } }\n"
                         "run { name: \"compute\" workers: 1 train { mode: ALLREDUCE max_steps: 100 } }\n"
                         "run { name: \"bsp\" workers: 2 train { mode: BSP } link { rate: \"100mbit\" } }\n"
                         "run { name: \"ssp-straggler\" workers: 2 train { mode: SSP staleness: 2 compress: \"topk:0.01\" error_feedback: true }\n"
                         "      straggler { worker: 1 exp_mean_ms: 40 seed: 3 } link { rate: \"100mbit\" } }\n"
                         "run { name: \"ring\" workers: 2 train { mode: ALLREDUCE allreduce_algo: \"ring\" } link { rate: \"100mbit\" } }\n";
  ProcessResult real = RunProcess({BinaryPath("gradsync-run"), spec, "--out=" + out}, 240);
  ASSERT_EQ(real.exit_code, 0) << real.out << real.err;
  ProcessResult sim = RunProcess({BinaryPath("gradsync-sim"), spec, "--out=" + dir.File("sim"), "--only=bsp,ssp-straggler,ring",
                                  "--compare=" + out + "/cal", "--step-tolerance=0.2"},
                                 120);
  // Step time within 20% here (the bench holds it to 15% on a quiet machine), bytes within 1%.
  EXPECT_EQ(sim.exit_code, 0) << sim.out << sim.err;
  EXPECT_NE(sim.out.find("3 runs compared, 0 outside"), std::string::npos) << sim.out;
  EXPECT_TRUE(std::filesystem::exists(dir.File("sim") + "/cal/comparison.md"));
  std::ifstream md(dir.File("sim") + "/cal/summary.md");
  std::string first;
  std::getline(md, first);
  EXPECT_EQ(first, "# cal (simulated)");
}

// Several measurements of one spec (bench/sim_calibration.sh --repeat): each run is compared
// against their median, and the table shows their range.
TEST(SimBinaryTest, SeveralMeasurementsAreComparedByTheirMedian) {
  TempDir dir;
  const std::string spec = dir.File("rep.textproto");
  std::ofstream(spec) << "name: \"rep\"\n"
                         "defaults { servers: 1 train { model: \"mlp\" epochs: 1 max_steps: 20 batch: 32 log_every: 1 } sim { compute_ms: 2 } }\n"
                         "run { name: \"alone\" workers: 1 train { mode: ALLREDUCE } }\n";
  ProcessResult plain = RunProcess({BinaryPath("gradsync-sim"), spec, "--out=" + dir.File("plain")}, 60);
  ASSERT_EQ(plain.exit_code, 0) << plain.out << plain.err;
  // The predicted step time, read back from the simulated summary: one worker alone computes.
  std::ifstream plain_summary(dir.File("plain") + "/rep/summary.json");
  const std::string text((std::istreambuf_iterator<char>(plain_summary)), std::istreambuf_iterator<char>());
  const size_t at = text.find("\"step_ms\":");
  ASSERT_NE(at, std::string::npos) << text;
  const double predicted = std::stod(text.substr(at + 10));
  // Measured: 0.5x, 1.05x and 3x the prediction; the median (1.05x) is within 15%, the mean is not.
  std::vector<std::string> dirs;
  for (double f : {0.5, 1.05, 3.0}) {
    dirs.push_back(dir.File("m" + std::to_string(dirs.size())));
    std::filesystem::create_directories(dirs.back());
    std::ofstream(dirs.back() + "/summary.json")
        << "{\"experiment\":\"rep\",\"run\":[{\"name\":\"alone\",\"ok\":true,\"workers\":1,\"step_ms\":" << f * predicted
        << ",\"bytes_per_step\":0}]}";
  }
  ProcessResult sim = RunProcess({BinaryPath("gradsync-sim"), spec, "--out=" + dir.File("sim"),
                                  "--compare=" + dirs[0] + "," + dirs[1] + "," + dirs[2]},
                                 60);
  EXPECT_EQ(sim.exit_code, 0) << sim.out << sim.err;
  EXPECT_NE(sim.out.find("measured min–max"), std::string::npos) << sim.out;
  EXPECT_NE(sim.out.find("-4.8%"), std::string::npos) << sim.out;  // 1 / 1.05 - 1
  EXPECT_NE(sim.out.find("1 runs compared, 0 outside"), std::string::npos) << sim.out;
  // One measurement alone is the table without the range, and its verdict is its own.
  ProcessResult one = RunProcess({BinaryPath("gradsync-sim"), spec, "--out=" + dir.File("one"), "--compare=" + dirs[2]}, 60);
  EXPECT_EQ(one.exit_code, 1) << one.out << one.err;
  EXPECT_EQ(one.out.find("min–max"), std::string::npos) << one.out;
  EXPECT_NE(one.out.find("1 runs compared, 1 outside"), std::string::npos) << one.out;
  // A folder without a summary is one clear error.
  ProcessResult missing = RunProcess({BinaryPath("gradsync-sim"), spec, "--out=" + dir.File("x"), "--compare=" + dirs[0] + "," + dir.File("none")}, 60);
  EXPECT_EQ(missing.exit_code, 2) << missing.out << missing.err;
  EXPECT_NE(missing.err.find("cannot read"), std::string::npos) << missing.err;
}

}  // namespace
}  // namespace gradsync::testing
