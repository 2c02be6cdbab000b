#include "common/ps/partitioner.h"

#include <gtest/gtest.h>

#include <vector>

namespace gradsync {
namespace {

class PartitionerTest : public ::testing::TestWithParam<std::tuple<int64_t, int>> {};

TEST_P(PartitionerTest, EveryKeyInExactlyOneShardBalancedWithinAChunk) {
  auto [n, shards] = GetParam();
  const int64_t chunk = 64;
  Partitioner p(n, shards, chunk);
  ASSERT_EQ(p.num_shards(), shards);
  int64_t expect_begin = 0, lo = n, hi = 0;
  for (int s = 0; s < shards; ++s) {
    EXPECT_EQ(p.range(s).begin, expect_begin);  // contiguous, no gap, no overlap
    EXPECT_GE(p.range(s).end, p.range(s).begin);
    expect_begin = p.range(s).end;
    lo = std::min(lo, p.range(s).size());
    hi = std::max(hi, p.range(s).size());
  }
  EXPECT_EQ(expect_begin, n);
  // Balanced within one chunk: every shard is within `chunk` elements of the ideal n / shards.
  const double ideal = static_cast<double>(n) / shards;
  EXPECT_LE(static_cast<double>(hi) - ideal, chunk) << "unbalanced";
  EXPECT_LE(ideal - static_cast<double>(lo), chunk) << "unbalanced";
  for (int64_t i = 0; i < n; i += std::max<int64_t>(1, n / 997)) {
    int s = p.ShardOf(i);
    EXPECT_TRUE(i >= p.range(s).begin && i < p.range(s).end) << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Sizes, PartitionerTest,
                         ::testing::Combine(::testing::Values<int64_t>(0, 1, 63, 1000, 235146, 1 << 20),
                                            ::testing::Values(1, 2, 3, 7)),
                         [](const auto& p) {
                           return "n" + std::to_string(std::get<0>(p.param)) + "_shards" +
                                  std::to_string(std::get<1>(p.param));
                         });

TEST(PartitionerTest, LargeTensorsSpanShardsAndKeysSplit) {
  // The MLP's first weight (200704 of 235146 parameters) is spread over both shards.
  Partitioner p(235146, 2);
  EXPECT_LT(p.range(0).end, 200704);
  std::vector<uint64_t> keys = {0, 5, 117000, 117760, 200000, 235145};
  auto parts = p.SplitSortedKeys(keys);
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(parts[0].size() + parts[1].size(), keys.size());
  for (uint64_t k : parts[0]) EXPECT_LT(static_cast<int64_t>(k), p.range(0).end);
  for (uint64_t k : parts[1]) EXPECT_GE(static_cast<int64_t>(k), p.range(1).begin);
}

TEST(PartitionerTest, DenseRunsSkipSparseTensors) {
  std::vector<TensorInfo> layout = {{"w", {100}, 0, 100, true}, {"b", {1}, 100, 1, false}};
  auto runs = DenseRuns(layout, {0, 101});
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].begin, 100);
  EXPECT_EQ(runs[0].end, 101);
  EXPECT_TRUE(DenseRuns(layout, {0, 50}).empty());
}

}  // namespace
}  // namespace gradsync
