// AUC and log loss (common/data/binary_metrics.h). The mutation each test catches:
//   AucMatchesABruteForcePairCount   ties counted as a win or a loss instead of one half, tie
//                                    groups split, positives and negatives swapped
//   AucIsNaNWithoutBothClasses       a division by zero returned as 0 or inf, a NaN score sorted
//   AucHandValues                    the ratio normalized by n^2 instead of positives x negatives
//   LogLossHandValues                log(p) for negatives, no clamp (inf on a confident mistake)
#include "common/data/binary_metrics.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/base/numeric/rng.h"

namespace gradsync {
namespace {

double BruteForceAuc(const std::vector<float>& scores, const std::vector<int32_t>& labels) {
  double wins = 0.0, pairs = 0.0;
  for (size_t i = 0; i < scores.size(); ++i) {
    for (size_t j = 0; j < scores.size(); ++j) {
      if (labels[i] != 1 || labels[j] != 0) continue;
      pairs += 1.0;
      wins += scores[i] > scores[j] ? 1.0 : (scores[i] == scores[j] ? 0.5 : 0.0);
    }
  }
  return wins / pairs;
}

TEST(BinaryMetricsTest, AucMatchesABruteForcePairCount) {
  Rng rng(11);
  int compared = 0;
  for (int trial = 0; trial < 500; ++trial) {
    const auto n = static_cast<size_t>(1 + rng.UniformInt(40));
    // Few distinct scores, so ties within and across the classes are common.
    const auto levels = static_cast<uint64_t>(1 + rng.UniformInt(6));
    std::vector<float> scores(n);
    std::vector<int32_t> labels(n);
    for (size_t i = 0; i < n; ++i) {
      scores[i] = static_cast<float>(rng.UniformInt(levels)) * 0.25f - 0.5f;
      labels[i] = static_cast<int32_t>(rng.UniformInt(2));
    }
    bool both = std::count(labels.begin(), labels.end(), 1) > 0 &&
                std::count(labels.begin(), labels.end(), 0) > 0;
    if (!both) {
      EXPECT_TRUE(std::isnan(Auc(scores, labels)));
      continue;
    }
    EXPECT_NEAR(Auc(scores, labels), BruteForceAuc(scores, labels), 1e-12) << "trial " << trial;
    ++compared;
  }
  EXPECT_GT(compared, 400);
}

TEST(BinaryMetricsTest, AucIsNaNWithoutBothClasses) {
  std::vector<float> scores = {0.1f, 0.7f, 0.3f};
  EXPECT_TRUE(std::isnan(Auc(scores, std::vector<int32_t>{1, 1, 1})));
  EXPECT_TRUE(std::isnan(Auc(scores, std::vector<int32_t>{0, 0, 0})));
  EXPECT_TRUE(std::isnan(Auc({}, {})));
  std::vector<float> with_nan = {0.1f, NAN, 0.3f};
  EXPECT_TRUE(std::isnan(Auc(with_nan, std::vector<int32_t>{0, 1, 1})));
}

TEST(BinaryMetricsTest, AucHandValues) {
  std::vector<int32_t> labels = {0, 0, 1, 1};
  EXPECT_DOUBLE_EQ(Auc(std::vector<float>{0.1f, 0.2f, 0.8f, 0.9f}, labels), 1.0);
  EXPECT_DOUBLE_EQ(Auc(std::vector<float>{0.9f, 0.8f, 0.2f, 0.1f}, labels), 0.0);
  EXPECT_DOUBLE_EQ(Auc(std::vector<float>{0.5f, 0.5f, 0.5f, 0.5f}, labels), 0.5);
  // Positive 0.6 beats both negatives, positive 0.3 beats 0.2 and ties 0.3: (2 + 1.5) / 4.
  EXPECT_DOUBLE_EQ(Auc(std::vector<float>{0.2f, 0.3f, 0.6f, 0.3f}, labels), 0.875);
  // One positive among three negatives, above two of them: 2 / 3.
  EXPECT_DOUBLE_EQ(
      Auc(std::vector<float>{-1.0f, 5.0f, 2.0f, 0.0f}, std::vector<int32_t>{0, 0, 1, 0}),
      2.0 / 3.0);
}

TEST(BinaryMetricsTest, LogLossHandValues) {
  EXPECT_NEAR(MeanLogLoss(std::vector<float>{0.8f, 0.25f}, std::vector<int32_t>{1, 0}),
              -(std::log(0.8) + std::log(0.75)) / 2, 1e-7);
  EXPECT_NEAR(MeanLogLoss(std::vector<float>{0.5f}, std::vector<int32_t>{0}), std::log(2.0), 1e-12);
  // A confident mistake costs -log(kLogLossEpsilon), not infinity.
  EXPECT_NEAR(MeanLogLoss(std::vector<float>{1.0f, 0.0f}, std::vector<int32_t>{0, 1}),
              -std::log(kLogLossEpsilon), 1e-6);
  EXPECT_NEAR(MeanLogLoss(std::vector<float>{1.0f, 0.0f}, std::vector<int32_t>{1, 0}),
              -std::log1p(-kLogLossEpsilon), 1e-12);
  EXPECT_TRUE(std::isnan(MeanLogLoss({}, {})));
}

}  // namespace
}  // namespace gradsync
