#include "common/consistency.h"

#include <gtest/gtest.h>

namespace gradsync {
namespace {

TEST(ConsistencyTest, BspHoldsPullsUntilTheRoundIsApplied) {
  ConsistencyController c(ConsistencyMode::kBsp, 0, 3);
  EXPECT_TRUE(c.aggregates());
  for (int w = 0; w < 3; ++w) EXPECT_TRUE(c.CanAnswerPull(w, 0));
  ASSERT_TRUE(c.OnPush(0, 0).ok());
  ASSERT_TRUE(c.OnPush(1, 0).ok());
  EXPECT_FALSE(c.RoundComplete());
  EXPECT_FALSE(c.CanAnswerPull(0, 1));
  // Pushing ahead of the open round is refused.
  EXPECT_EQ(c.OnPush(0, 1).code(), StatusCode::kAborted);
  ASSERT_TRUE(c.OnPush(2, 0).ok());
  EXPECT_TRUE(c.RoundComplete());
  c.OnRoundApplied();
  EXPECT_TRUE(c.CanAnswerPull(0, 1));
  EXPECT_FALSE(c.CanAnswerPull(0, 2));
}

TEST(ConsistencyTest, ClocksMustBeTheWorkersNext) {
  ConsistencyController c(ConsistencyMode::kAsp, 0, 2);
  EXPECT_EQ(c.OnPush(0, 1).code(), StatusCode::kAborted);  // future
  ASSERT_TRUE(c.OnPush(0, 0).ok());
  EXPECT_EQ(c.OnPush(0, 0).code(), StatusCode::kAborted);  // old (a replay)
  EXPECT_TRUE(c.ValidatePull(0, 1).ok());
  EXPECT_EQ(c.ValidatePull(0, 0).code(), StatusCode::kAborted);
  EXPECT_EQ(c.ValidatePull(0, 5).code(), StatusCode::kAborted);
  EXPECT_EQ(c.OnPush(7, 0).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(c.OnPush(-1, 0).code(), StatusCode::kInvalidArgument);
}

TEST(ConsistencyTest, SspBoundsTheGapToTheSlowestLiveWorker) {
  const int s = 2;
  ConsistencyController c(ConsistencyMode::kSsp, s, 2);
  EXPECT_FALSE(c.aggregates());
  // Worker 0 races ahead; worker 1 has pushed nothing.
  for (int64_t clock = 0; clock < 5; ++clock) {
    bool allowed = c.CanAnswerPull(0, clock);
    EXPECT_EQ(allowed, clock <= s) << clock;  // needs min clock >= clock - s, min is 0
    if (!allowed) break;
    ASSERT_TRUE(c.OnPush(0, clock).ok());
  }
  ASSERT_TRUE(c.OnPush(1, 0).ok());
  EXPECT_TRUE(c.CanAnswerPull(0, 3));
  EXPECT_FALSE(c.CanAnswerPull(0, 4));
  // A dead straggler no longer holds anyone back.
  c.RemoveWorker(1);
  for (int64_t clock = 3; clock < 20; ++clock) {
    ASSERT_TRUE(c.ValidatePull(0, clock).ok());
    EXPECT_TRUE(c.CanAnswerPull(0, clock)) << clock;
    ASSERT_TRUE(c.OnPush(0, clock).ok());
  }
  EXPECT_EQ(c.OnPush(1, 1).code(), StatusCode::kFailedPrecondition);
}

TEST(ConsistencyTest, SspZeroIsBspAndAspNeverWaits) {
  EXPECT_TRUE(ConsistencyController(ConsistencyMode::kSsp, 0, 2).aggregates());
  ConsistencyController a(ConsistencyMode::kAsp, 0, 2);
  ASSERT_TRUE(a.OnPush(0, 0).ok());
  ASSERT_TRUE(a.OnPush(0, 1).ok());
  EXPECT_TRUE(a.CanAnswerPull(0, 2));
  EXPECT_EQ(a.min_live_clock(), 0);
}

TEST(ConsistencyTest, BspRoundFollowsLiveMembership) {
  ConsistencyController c(ConsistencyMode::kBsp, 0, 3);
  ASSERT_TRUE(c.OnPush(0, 0).ok());
  ASSERT_TRUE(c.OnPush(1, 0).ok());
  c.RemoveWorker(2);
  EXPECT_TRUE(c.RoundComplete());
  EXPECT_EQ(c.live_workers(), 2);
}

TEST(ConsistencyTest, ParseMode) {
  EXPECT_EQ(*ParseConsistencyMode("ssp"), ConsistencyMode::kSsp);
  EXPECT_FALSE(ParseConsistencyMode("sync").ok());
}

}  // namespace
}  // namespace gradsync
