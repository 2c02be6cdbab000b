// ShardCopies on its own: where the copies are after deaths, takeovers and restarts, and the
// verdict on a dead shard, for 3 servers with --replicas=2 (shard s backed up on server s+1 mod 3).
#include "server/scheduler/shard_copies.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace gradsync {
namespace {

// Three shard servers in slots 0..2 (a scheduler's nodes would interleave workers: slots are its).
std::vector<ServerSlot> Three() {
  return {{0, 0, false, false, "server 0"}, {1, 1, false, false, "server 1"}, {2, 2, false, false, "server 2"}};
}

TEST(ShardCopiesTest, AFilledBackupRankIsNoCopyOfTheShardItNeverBackedUp) {
  // Server 1 dies; server 2 (its backup) takes rank 1 over in its own process: the new rank-1
  // server is server 2's process, which holds no copy of shard 0. Then server 0 dies at once,
  // before any snapshot of shard 0 reached the new rank 1: shard 0 has no live copy.
  ShardCopies copies(3, 2);
  std::vector<ServerSlot> s = Three();
  copies.Start(s);
  s[1].dead = true;
  copies.Died(1);
  EXPECT_FALSE(copies.NoLiveCopy(s, 1, 0.0).has_value()) << "server 2 holds shard 1's copy: its takeover is due";
  s[1] = {1, 1, false, false, "server 1 (taken over)"};
  copies.Rejoined(s, 1, /*adopted=*/true);
  s[0].dead = true;
  copies.Died(0);
  // Rank 1 now lives, in server 2's process; it is next in line for shard 0, and got no copy.
  const auto why = copies.NoLiveCopy(s, 0, 0.0);
  ASSERT_TRUE(why.has_value()) << "shard 0 has no live copy";
  EXPECT_NE(why->find("server 0"), std::string::npos) << *why;
  EXPECT_NE(why->find("holds no copy of it"), std::string::npos) << *why;
}

TEST(ShardCopiesTest, AfterTheTakeoverIsAnnouncedTheNewRankHoldsTheLivePrimarysCopy) {
  // The same, but the takeover is announced while server 0 still lives: server 0 sends it its
  // snapshot. Server 0's death then awaits its takeover (for kTakeoverGraceS), then gives up.
  ShardCopies copies(3, 2);
  std::vector<ServerSlot> s = Three();
  copies.Start(s);
  s[1].dead = true;
  copies.Died(1);
  s[1] = {1, 1, false, false, "server 1 (taken over)"};
  copies.Rejoined(s, 1, /*adopted=*/true);
  copies.Announced(s, 1);
  s[0].dead = true;
  copies.Died(0);
  EXPECT_FALSE(copies.NoLiveCopy(s, 0, 10.0).has_value()) << "the new rank 1 holds shard 0's copy";
  EXPECT_FALSE(copies.NoLiveCopy(s, 0, 10.0 + kTakeoverGraceS / 2).has_value());
  const auto late = copies.NoLiveCopy(s, 0, 10.0 + kTakeoverGraceS + 0.1);
  ASSERT_TRUE(late.has_value()) << "a takeover that never comes is given up";
  EXPECT_NE(late->find("did not take it over"), std::string::npos) << *late;
}

TEST(ShardCopiesTest, APrimaryAndItsOnlyBackupDeadTogetherLeaveNoCopy) {
  ShardCopies copies(3, 2);
  std::vector<ServerSlot> s = Three();
  copies.Start(s);
  s[0].dead = s[1].dead = true;
  copies.Died(0);
  copies.Died(1);
  const auto why = copies.NoLiveCopy(s, 0, 0.0);
  ASSERT_TRUE(why.has_value());
  EXPECT_NE(why->find("server 0 and its backup server 1 dead"), std::string::npos) << *why;
  EXPECT_FALSE(copies.NoLiveCopy(s, 1, 0.0).has_value()) << "shard 1's backup, server 2, lives";
  EXPECT_FALSE(copies.NoLiveCopy(s, 2, 0.0).has_value()) << "shard 2's server lives";
}

}  // namespace
}  // namespace gradsync
