// Delay-compensated ASGD in a job (threads over 127.0.0.1): with a straggler in asp and ssp, every
// push after a worker's first pull is corrected on every shard (the corrections change the
// gradients, less than the gradients themselves), and the run trains.
#include <gtest/gtest.h>

#include <cmath>

#include "common/data/synthetic.h"
#include "tests/support/ps_job.h"

namespace gradsync::testing {
namespace {

TEST(DelayCompensationTrainTest, EveryPushIsCorrectedAndTheRunTrains) {
  const Dataset data = SmallBlobs();
  for (bool adaptive : {false, true}) {
    for (ConsistencyMode mode : {ConsistencyMode::kAsp, ConsistencyMode::kSsp}) {
      SCOPED_TRACE(std::string(adaptive ? "adaptive " : "") + (mode == ConsistencyMode::kAsp ? "asp" : "ssp"));
      PsJobOptions ps;
      ps.mode = mode;
      ps.staleness = 2;
      ps.num_servers = 2;
      ps.num_workers = 3;
      ps.model = SmallMlp();
      ps.train = SmallTrain(8, 40, 0.0f);
      ps.delay_compensation = adaptive ? 0.05f : 0.5f;
      ps.delay_compensation_adaptive = adaptive;
      ps.delay_ms = [](int worker, int64_t) { return worker == 2 ? 3.0 : 0.0; };
      PsJobResult r = RunPsJob(ps, data, data);
      ASSERT_TRUE(r.status.ok()) << r.status;
      ASSERT_EQ(r.compensated_pushes.size(), 2u);
      for (size_t k = 0; k < 2; ++k) {
        // Each worker pulls before each push: all 3 x 40 pushes were corrected.
        EXPECT_EQ(r.compensated_pushes[k], 3 * 40);
        EXPECT_EQ(r.uncompensated_pushes[k], 0);
        // The straggler's pushes are stale: the corrections changed the gradients, by little.
        EXPECT_GT(r.relative_correction[k], 0);
        EXPECT_LT(r.relative_correction[k], 1);
      }
      for (float p : r.params) ASSERT_TRUE(std::isfinite(p));
    }
  }
}

}  // namespace
}  // namespace gradsync::testing
