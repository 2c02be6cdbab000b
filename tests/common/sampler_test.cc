#include "common/data/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <sstream>
#include <vector>

namespace gradsync {
namespace {

class SamplerTest : public ::testing::TestWithParam<std::tuple<int64_t, int>> {};

TEST_P(SamplerTest, ShardsAreDisjointAndCover) {
  auto [n, replicas] = GetParam();
  for (int64_t epoch : {0, 3}) {
    std::vector<int> seen(static_cast<size_t>(n), 0);
    int64_t lo = n, hi = 0;
    for (int r = 0; r < replicas; ++r) {
      ShardedSampler s(n, replicas, r, 7);
      auto idx = s.EpochIndices(epoch);
      EXPECT_EQ(static_cast<int64_t>(idx.size()), s.shard_size());
      EXPECT_GE(s.shard_size(), s.min_shard_size());
      lo = std::min<int64_t>(lo, idx.size());
      hi = std::max<int64_t>(hi, idx.size());
      for (uint32_t i : idx) {
        ASSERT_LT(i, n);
        seen[i]++;
      }
    }
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(seen[i], 1) << "index " << i;
    EXPECT_LE(hi - lo, 1);
  }
}

INSTANTIATE_TEST_SUITE_P(Sizes, SamplerTest,
                         ::testing::Combine(::testing::Values<int64_t>(0, 1, 10, 1001),
                                            ::testing::Values(1, 2, 3, 4, 7)),
                         [](const auto& p) {
                           std::ostringstream name;
                           name << "n" << std::get<0>(p.param) << "_replicas" << std::get<1>(p.param);
                           return name.str();
                         });

TEST(SamplerTest, SeedAndEpochDecideTheOrder) {
  ShardedSampler a(1000, 1, 0, 1), b(1000, 1, 0, 1), c(1000, 1, 0, 2);
  EXPECT_EQ(a.EpochIndices(0), b.EpochIndices(0));
  EXPECT_NE(a.EpochIndices(0), a.EpochIndices(1));
  EXPECT_NE(a.EpochIndices(0), c.EpochIndices(0));
  ShardedSampler ordered(5, 1, 0, 1, /*shuffle=*/false);
  EXPECT_EQ(ordered.EpochIndices(4), (std::vector<uint32_t>{0, 1, 2, 3, 4}));
}

TEST(SamplerTest, NWorkersOfBatchBSeeWhatOneWorkerOfBatchNBSees) {
  const int n_workers = 4, b = 16;
  ShardedSampler one(6000, 1, 0, 9);
  auto global = one.EpochIndices(2);
  std::vector<std::vector<uint32_t>> shards;
  for (int r = 0; r < n_workers; ++r) shards.push_back(ShardedSampler(6000, n_workers, r, 9).EpochIndices(2));
  for (int step = 0; step < 6000 / (n_workers * b); ++step) {
    std::vector<uint32_t> union_of_steps, global_step(global.begin() + step * n_workers * b,
                                                       global.begin() + (step + 1) * n_workers * b);
    for (int r = 0; r < n_workers; ++r) {
      union_of_steps.insert(union_of_steps.end(), shards[r].begin() + step * b,
                            shards[r].begin() + (step + 1) * b);
    }
    std::sort(union_of_steps.begin(), union_of_steps.end());
    std::sort(global_step.begin(), global_step.end());
    ASSERT_EQ(union_of_steps, global_step) << "step " << step;
  }
}

}  // namespace
}  // namespace gradsync
