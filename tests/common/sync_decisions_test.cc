// The decisions every path shares (common/config/sync_decisions.h): where a round ends, and when
// communication overlaps computation on the parameter server and in all-reduce.
#include "common/config/sync_decisions.h"

#include <gtest/gtest.h>

namespace gradsync {
namespace {

TEST(RoundScheduleTest, RoundsOfEveryStepsAndAShorterLastOne) {
  const RoundSchedule r{.every = 5, .total_steps = 12};
  EXPECT_EQ(r.Round(0), 0);
  EXPECT_EQ(r.Round(4), 0);
  EXPECT_EQ(r.Round(5), 1);
  EXPECT_EQ(r.Round(11), 2);
  for (int64_t step : {4, 9, 11}) EXPECT_TRUE(r.EndsRound(step)) << step;
  for (int64_t step : {0, 3, 5, 10}) EXPECT_FALSE(r.EndsRound(step)) << step;
  const RoundSchedule unknown{.every = 5, .total_steps = 0};
  EXPECT_FALSE(unknown.EndsRound(11)) << "a run of unknown length ends no round but every H-th step";
}

OverlapFacts Overlappable() {
  return {.requested = true,
          .compressed = false,
          .sparse = false,
          .on_device = false,
          .per_tensor_params = true,
          .straggles = false,
          .rounds = false,
          .workers = 4,
          .zero = 0};
}

TEST(OverlapDecisionTest, PsOverlapsADenseRawCpuModelWithoutStragglerOrRounds) {
  EXPECT_TRUE(PsOverlaps(Overlappable()));
  EXPECT_FALSE(PsOverlapRefused(Overlappable()));
  auto without = [](bool OverlapFacts::*fact, bool value) {
    OverlapFacts f = Overlappable();
    f.*fact = value;
    return f;
  };
  EXPECT_FALSE(PsOverlaps(without(&OverlapFacts::requested, false)));
  EXPECT_FALSE(PsOverlapRefused(without(&OverlapFacts::requested, false))) << "not asked for: nothing refused";
  for (auto fact : {&OverlapFacts::compressed, &OverlapFacts::sparse, &OverlapFacts::on_device, &OverlapFacts::straggles}) {
    EXPECT_FALSE(PsOverlaps(without(fact, true)));
    EXPECT_TRUE(PsOverlapRefused(without(fact, true)));
  }
  EXPECT_FALSE(PsOverlaps(without(&OverlapFacts::per_tensor_params, false)));
  EXPECT_FALSE(PsOverlaps(without(&OverlapFacts::rounds, true)));
  EXPECT_FALSE(PsOverlapRefused(without(&OverlapFacts::rounds, true))) << "rounds exchange after the step by design";
}

TEST(OverlapDecisionTest, AllreduceOverlapsADenseUncompressedCpuGradientOverRanks) {
  OverlapFacts f = Overlappable();
  EXPECT_TRUE(AllreduceOverlaps(f));
  f.per_tensor_params = false;
  f.straggles = true;
  EXPECT_TRUE(AllreduceOverlaps(f)) << "buckets follow backward whatever the forward reads, and a delay before it";
  for (auto fact : {&OverlapFacts::compressed, &OverlapFacts::sparse, &OverlapFacts::on_device, &OverlapFacts::rounds}) {
    OverlapFacts g = Overlappable();
    g.*fact = true;
    EXPECT_FALSE(AllreduceOverlaps(g));
  }
  OverlapFacts one = Overlappable();
  one.workers = 1;
  EXPECT_FALSE(AllreduceOverlaps(one)) << "one rank has nothing to average";
  OverlapFacts zero = Overlappable();
  zero.zero = 1;
  EXPECT_FALSE(AllreduceOverlaps(zero)) << "ZeRO 1 reduce-scatters after backward";
  zero.zero = 2;
  EXPECT_TRUE(AllreduceOverlaps(zero));
}

}  // namespace
}  // namespace gradsync
