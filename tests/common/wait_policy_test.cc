// WaitPolicy / Waiter: the pauses and minimum polls every wait takes, the polling busy_poll_ms asks
// for (counted), and the end of polling (then the caller blocks).
#include "common/base/wait_policy.h"

#include <gtest/gtest.h>

#include <chrono>

namespace gradsync {
namespace {

TEST(WaiterTest, PausesAndMinimumPollsThenBlocksWhenNotAskedToPoll) {
  int64_t busy = 0;
  int polls = 0;
  {
    Waiter w({.busy_poll_ms = 0, .pause_spins = 4, .min_polls = 3}, &busy);
    while (w.Poll() && polls < 1000) ++polls;
    EXPECT_FALSE(w.Poll()) << "past the polling every later call says block";
  }
  EXPECT_EQ(polls, 7) << "4 pauses and 3 yields, then block";
  EXPECT_EQ(busy, 0) << "no poll was one busy_poll_ms asked for";
}

TEST(WaiterTest, PollsForBusyPollMsAndCountsThosePolls) {
  int64_t busy = 0;
  const auto start = std::chrono::steady_clock::now();
  int64_t polls = 0;
  {
    Waiter w({.busy_poll_ms = 30, .pause_spins = 0, .min_polls = 2}, &busy);
    while (w.Poll() && std::chrono::steady_clock::now() - start < std::chrono::seconds(5)) ++polls;
  }
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  EXPECT_GE(ms, 30.0) << "the waiter stopped polling before busy_poll_ms";
  EXPECT_LT(ms, 4000.0) << "the waiter kept polling past busy_poll_ms";
  EXPECT_GT(busy, 0);
  EXPECT_EQ(busy, polls - 2) << "every poll past the two minimum ones is counted";
}

}  // namespace
}  // namespace gradsync
