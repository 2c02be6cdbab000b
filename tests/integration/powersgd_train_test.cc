// PowerSGD in mode allreduce (threads over 127.0.0.1, the ring): at full rank it trains as the
// dense average does; its bytes per step are the formula's (two ring all-reduces, of the P
// factors with the whole vectors and of the Q factors); at rank 1 it trains.
#include <gtest/gtest.h>

#include "allreduce/plan/schedule.h"
#include "common/data/synthetic.h"
#include "compression/powersgd.h"
#include "tests/support/ps_job.h"

namespace gradsync::testing {
namespace {

// What rank r sends for one ring all-reduce of `floats` floats among n ranks.
uint64_t RingBytes(int r, int n, size_t floats) {
  uint64_t bytes = 0;
  for (const PlanStep& s : AllReducePlan(AllReduceAlgo::kRing, r, n, floats)) bytes += StepWireBytes(s, sizeof(float));
  return bytes;
}

TEST(PowerSgdTrainTest, FullRankEqualsTheDenseAverageAndTheBytesAreTheFormulas) {
  const Dataset data = SmallBlobs();
  const int n = 4;
  const int64_t steps = 60;
  LocalTrainOptions t = SmallTrain(8, steps, 0.9f);
  AllreduceTrainOptions dense;
  dense.overlap = false;
  AllreduceTrainOptions full = dense;
  full.codec.compression = "powersgd:64";  // the MLP 12-16-4: 12x16 and 16x4, each at its smaller side
  full.codec.error_feedback = true;
  auto a = RunAllreduceJobWith(n, SmallMlp(), t, data, dense, false, AllReduceAlgo::kRing);
  ASSERT_TRUE(a.ok()) << a.status();
  auto p = RunAllreduceJobWith(n, SmallMlp(), t, data, full, false, AllReduceAlgo::kRing);
  ASSERT_TRUE(p.ok()) << p.status();
  const double diff = MaxRelativeDiff(p->params, a->params, 1e-3);
  RecordProperty("max_relative_diff_vs_dense", std::to_string(diff));
  EXPECT_LE(diff, 1e-5);

  // Rank 2: every step two all-reduces in place of the dense one; the broadcast and the barrier
  // are the same in both runs.
  AllreduceTrainOptions low = full;
  low.codec.compression = "powersgd:2";
  auto q = RunAllreduceJobWith(n, SmallMlp(), t, data, low, false, AllReduceAlgo::kRing);
  ASSERT_TRUE(q.ok()) << q.status();
  auto model = std::move(CreateModel(SmallMlp())).value();
  const PowerSgd formula(model->layout(), 2, 0, true);
  EXPECT_EQ(formula.PayloadFloats(), 2u * (12 + 16) + 16 + 2 * (16 + 4) + 4);
  for (int r = 0; r < n; ++r) {
    const uint64_t dense_step = RingBytes(r, n, static_cast<size_t>(model->num_params()));
    const uint64_t low_step = RingBytes(r, n, formula.first_floats()) + RingBytes(r, n, formula.second_floats());
    EXPECT_EQ(q->bytes_sent[r] - a->bytes_sent[r] + steps * dense_step, steps * low_step) << "rank " << r;
  }
  EXPECT_GT(MaxRelativeDiff(q->params, a->params, 1e-3), 1e-3);  // rank 2 is not the dense average
}

}  // namespace
}  // namespace gradsync::testing
