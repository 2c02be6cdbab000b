#include "common/ps/consistency.h"

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
  c.clocks().OnRoundApplied();
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
  c.clocks().RemoveWorker(1);
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
  EXPECT_EQ(a.clocks().min_live_clock(), 0);
}

TEST(ConsistencyTest, BspRoundFollowsLiveMembership) {
  ConsistencyController c(ConsistencyMode::kBsp, 0, 3);
  ASSERT_TRUE(c.OnPush(0, 0).ok());
  ASSERT_TRUE(c.OnPush(1, 0).ok());
  c.clocks().RemoveWorker(2);
  EXPECT_TRUE(c.RoundComplete());
  EXPECT_EQ(c.clocks().live_workers(), 2);
}

// Uneven inputs: a worker that ended training without leaving blocks the pulls that need a push
// it will never make, and Blocker names it at once.
TEST(ConsistencyTest, BspPullThatNeedsAnEndedWorkersPushHasABlocker) {
  ConsistencyController c(ConsistencyMode::kBsp, 0, 3);
  for (int64_t round = 0; round < 4; ++round) {
    for (int w = 0; w < 3; ++w) {
      if (w == 1 && round == 3) continue;  // worker 1 runs 3 steps, the others 4
      ASSERT_TRUE(c.OnPush(w, round).ok());
    }
    if (c.RoundComplete()) c.clocks().OnRoundApplied();
  }
  EXPECT_EQ(c.clocks().rounds_applied(), 3);
  // Before worker 1 says it ended, a pull for 4 simply waits.
  EXPECT_FALSE(c.CanAnswerPull(0, 4));
  EXPECT_FALSE(c.Blocker(0, 4).has_value());
  c.clocks().EndAt(1, 3);
  EXPECT_EQ(c.clocks().ended_at(1), 3);
  EXPECT_TRUE(c.clocks().IsLive(1));  // ending alone changes nothing in the rule
  EXPECT_FALSE(c.RoundComplete());
  ASSERT_TRUE(c.Blocker(0, 4).has_value());
  EXPECT_EQ(*c.Blocker(0, 4), 1);
  EXPECT_EQ(*c.Blocker(2, 4), 1);
  // Worker 1's own final pull (clock 3) needs round 2 only: answered.
  ASSERT_TRUE(c.ValidatePull(1, 3).ok());
  EXPECT_TRUE(c.CanAnswerPull(1, 3));
  EXPECT_FALSE(c.Blocker(1, 3).has_value());
  const Status e = c.BlockedError(4, 1);
  EXPECT_EQ(e.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(e.message().find("worker 1 ended training after 3 steps"), std::string::npos) << e;
  EXPECT_NE(e.message().find("step 4 needs its push of step 3 (bsp)"), std::string::npos) << e;
  EXPECT_NE(e.message().find("gradsync.torch.join()"), std::string::npos) << e;
  // A dead worker blocks nobody (it left the live set).
  c.clocks().RemoveWorker(1);
  EXPECT_FALSE(c.Blocker(0, 4).has_value());
}

TEST(ConsistencyTest, SspBlockerOnlyPastTheBound) {
  const int s = 2;
  ConsistencyController c(ConsistencyMode::kSsp, s, 2);
  for (int64_t clock = 0; clock < 5; ++clock) ASSERT_TRUE(c.OnPush(1, clock).ok());
  c.clocks().EndAt(1, 5);
  // Worker 0 may run up to clock 5 + s without it; the pull of clock 8 needs worker 1 at 6.
  for (int64_t clock = 0; clock <= 7; ++clock) {
    ASSERT_TRUE(c.ValidatePull(0, clock).ok());
    EXPECT_TRUE(c.CanAnswerPull(0, clock)) << clock;
    EXPECT_FALSE(c.Blocker(0, clock).has_value()) << clock;
    ASSERT_TRUE(c.OnPush(0, clock).ok());
  }
  EXPECT_FALSE(c.CanAnswerPull(0, 8));
  ASSERT_TRUE(c.Blocker(0, 8).has_value());
  EXPECT_EQ(*c.Blocker(0, 8), 1);
  EXPECT_NE(c.BlockedError(8, 1).message().find("step 8 needs its push of step 5 (ssp with staleness 2)"),
            std::string::npos)
      << c.BlockedError(8, 1);
  // asp never waits, so nothing blocks.
  ConsistencyController a(ConsistencyMode::kAsp, 0, 2);
  a.clocks().EndAt(1, 0);
  EXPECT_TRUE(a.CanAnswerPull(0, 100));
  EXPECT_FALSE(a.Blocker(0, 100).has_value());
}

TEST(ConsistencyTest, TheWorkerThatEndedFirstIsNamed) {
  ConsistencyController c(ConsistencyMode::kSsp, 0, 4);  // ssp(0) aggregates as bsp
  c.clocks().EndAt(3, 2);
  c.clocks().EndAt(1, 1);
  c.clocks().EndAt(2, 1);
  EXPECT_EQ(*c.Blocker(0, 5), 1);
  EXPECT_NE(c.BlockedError(5, 1).message().find("(ssp with staleness 0)"), std::string::npos);
}

TEST(ConsistencyTest, AWorkerThatLeavesIsOutOfTheRoundsButMayStillPull) {
  ConsistencyController c(ConsistencyMode::kBsp, 0, 2);
  ASSERT_TRUE(c.OnPush(0, 0).ok());
  ASSERT_TRUE(c.OnPush(1, 0).ok());
  ASSERT_TRUE(c.RoundComplete());
  c.clocks().OnRoundApplied();
  // Worker 1 pushes round 1 and leaves before worker 0 has pushed it: its push stays in the round.
  ASSERT_TRUE(c.OnPush(1, 1).ok());
  c.clocks().EndAt(1, 2);
  c.clocks().Leave(1);
  EXPECT_TRUE(c.clocks().HasLeft(1));
  EXPECT_FALSE(c.clocks().IsLive(1));
  EXPECT_EQ(c.clocks().live_workers(), 1);
  EXPECT_FALSE(c.RoundComplete());  // worker 0's push of round 1 is still to come
  ASSERT_TRUE(c.OnPush(0, 1).ok());
  ASSERT_TRUE(c.RoundComplete());
  c.clocks().OnRoundApplied();
  // Worker 0 goes on alone: every round is its own push; nothing blocks it.
  for (int64_t round = 2; round < 6; ++round) {
    EXPECT_TRUE(c.CanAnswerPull(0, round));
    EXPECT_FALSE(c.Blocker(0, round).has_value());
    ASSERT_TRUE(c.OnPush(0, round).ok());
    ASSERT_TRUE(c.RoundComplete());
    c.clocks().OnRoundApplied();
  }
  // The worker that left pulls the final parameters at its clock; it pushes no more.
  ASSERT_TRUE(c.ValidatePull(1, 2).ok());
  EXPECT_TRUE(c.CanAnswerPull(1, 2));
  EXPECT_EQ(c.OnPush(1, 2).code(), StatusCode::kFailedPrecondition);
  // It is no blocker although it ended early.
  EXPECT_FALSE(c.Blocker(0, 6).has_value());
  // Declared dead later: its pulls are refused like any dead worker's.
  c.clocks().RemoveWorker(1);
  EXPECT_FALSE(c.clocks().HasLeft(1));
  EXPECT_EQ(c.ValidatePull(1, 2).code(), StatusCode::kFailedPrecondition);
}

TEST(ConsistencyTest, WhenEveryWorkerLeftTheOpenRoundIsApplied) {
  ConsistencyController c(ConsistencyMode::kBsp, 0, 2);
  // Worker 0 pushes round 0 and leaves; worker 1 leaves without pushing it (it ran 0 steps).
  ASSERT_TRUE(c.OnPush(0, 0).ok());
  c.clocks().Leave(0);
  EXPECT_FALSE(c.RoundComplete());
  c.clocks().Leave(1);
  EXPECT_EQ(c.clocks().live_workers(), 0);
  ASSERT_TRUE(c.RoundComplete());  // worker 0's push is applied all the same
  c.clocks().OnRoundApplied();
  EXPECT_FALSE(c.RoundComplete());
  EXPECT_TRUE(c.CanAnswerPull(0, 1));
  EXPECT_TRUE(c.CanAnswerPull(1, 0));
  // ssp: with nobody live, a pull of a worker that left has nothing to wait for.
  ConsistencyController s(ConsistencyMode::kSsp, 1, 2);
  for (int64_t clock = 0; clock < 5; ++clock) ASSERT_TRUE(s.OnPush(0, clock).ok());
  s.clocks().Leave(0);
  s.clocks().Leave(1);
  EXPECT_TRUE(s.CanAnswerPull(0, 5));
  EXPECT_EQ(s.ClockStaleness(5), 0);
}

TEST(ConsistencyTest, ARestartedWorkerStartsAfresh) {
  ConsistencyController c(ConsistencyMode::kBsp, 0, 2);
  c.clocks().EndAt(1, 0);
  c.clocks().Leave(1);
  c.clocks().RemoveWorker(1);
  c.clocks().SetWorker(1, 0);  // restarted: live again, neither ended nor left
  EXPECT_TRUE(c.clocks().IsLive(1));
  EXPECT_FALSE(c.clocks().HasLeft(1));
  EXPECT_EQ(c.clocks().ended_at(1), -1);
  EXPECT_FALSE(c.Blocker(0, 1).has_value());
}

TEST(ConsistencyTest, ParseMode) {
  EXPECT_EQ(*ParseConsistencyMode("ssp"), ConsistencyMode::kSsp);
  EXPECT_FALSE(ParseConsistencyMode("sync").ok());
}

}  // namespace
}  // namespace gradsync
