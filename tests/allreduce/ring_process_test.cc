// The ring across processes: n ring_check processes, each checking exact sums.
#include <gtest/gtest.h>

#include <thread>

#include "tests/support/subprocess.h"
#include "tests/support/temp_dir.h"

namespace gradsync::testing {
namespace {

class RingProcessTest : public ::testing::TestWithParam<int> {};

TEST_P(RingProcessTest, ExactSumsAcrossProcesses) {
  const int n = GetParam();
  TempDir dir;
  // The test helpers live next to the test binaries: build/tests, beside build/bin.
  const std::string bin = BinaryPath("../tests/ring_check");
  std::vector<ProcessResult> results(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] { results[r] = RunProcess({bin, std::to_string(r), std::to_string(n), dir.path()}, 60); });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) EXPECT_EQ(results[r].exit_code, 0) << "rank " << r << ": " << results[r].err;
}

INSTANTIATE_TEST_SUITE_P(Worlds, RingProcessTest, ::testing::Values(1, 2, 3, 4, 5));

}  // namespace
}  // namespace gradsync::testing
