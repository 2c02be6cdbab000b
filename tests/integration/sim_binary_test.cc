// gradsync-sim against the real thing: a few runs measured with gradsync-run over emulated 100 Mbit/s
// links (network namespaces, tc tbf), the same spec simulated, and --compare's verdict on step time
// and bytes per step. The full calibration (every mode, dense and top-k, 2 / 4 / 8 workers, two link
// speeds) is bench/sim_calibration.sh.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "tests/support/subprocess.h"
#include "tests/support/temp_dir.h"

namespace gradsync::testing {
namespace {

TEST(SimBinaryTest, PredictsTheMeasuredStepTimeAndBytesPerStepOfRealRunsOnSlowLinks) {
  if (::geteuid() != 0 || ::access("/usr/sbin/ip", X_OK) != 0 || ::access("/usr/sbin/tc", X_OK) != 0) {
    GTEST_SKIP() << "link emulation needs root and iproute2";
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

}  // namespace
}  // namespace gradsync::testing
