// The click log (common/data/click/click_log.h) and its Zipf ids (common/data/click/zipf.h). The mutation
// each test catches:
//   ExampleIsTheSameWhateverRangeFillsIt      an example keyed by its row in the batch, or one
//                                             sequential stream carried from example to example
//   FillReusesItsVectors                      Fill building new vectors (allocating) every call
//   DifferentSeedsGiveDifferentExamples       the seed ignored
//   IdsLieInTheirFieldsRanges                 no cycle walking (ids >= n), one field's n used
//                                             for all, ids stuck at the low end of a huge range
//   TopRanksFollowZipfsPmf                    the hat's integral or its inverse off (H(0.5)
//                                             for H(1.5), s for 1 - s), ranks not scattered as
//                                             IdOfRank says
//   SmallRanksMatchThePmfClosely              the acceptance test dropped or its shortcut too
//                                             wide (rank 2 gains 2% at s = 1, 7% at s = 2)
//   FarRanksOfAHugeRangeAreAllReachable       the far ranks rounded in doubles (multiples of
//                                             1024 near 2^62) or not spread at all
//   PermutationIsABijection                   Decrypt's widths swapped, cycle walking dropped,
//                                             Forward the identity
//   PopularIdsAreScattered                    rank k written as id k - 1 (no permutation)
//   ProbabilityIsThePlantedModel              a term of the logit dropped, PlantedEffect not
//                                             what Fill adds, dense weights not normalized
//   LabelsAreDrawnFromTheProbability          labels drawn with 1 - p (u > p), or from a
//                                             stream shared with the features
//   DenseFeaturesAreStandardNormal            Box-Muller's radius or angle wrong
//   OracleMetricsAreTheProbabilitiesScores    the oracle over another range than asked, its
//                                             AUC or log loss not binary_metrics.h's
//   DefaultsGiveTheStatedDifficulty           defaults drifting out of the header's numbers
//   Refuses* (one each)                       Validate letting that option through
#include "common/data/click/click_log.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "common/data/binary_metrics.h"
#include "common/data/click/zipf.h"

namespace gradsync {
namespace {

ClickLog MakeLog(const ClickLogOptions& options) {
  Result<ClickLog> log = ClickLog::Create(options);
  EXPECT_TRUE(log.ok()) << log.status();
  return std::move(log).value();
}

// sum_{k=1}^{n} k^-s: directly up to 10^5, then by Euler-Maclaurin (error far below 1e-9).
double GeneralizedHarmonic(double n, double s) {
  double sum = 0.0, k = 1.0;
  for (; k <= n && k <= 1e5; k += 1.0) sum += std::pow(k, -s);
  if (k > n) return sum;
  auto integral = [s](double x) {
    return s == 1.0 ? std::log(x) : std::pow(x, 1.0 - s) / (1.0 - s);
  };
  return sum + integral(n) - integral(k) + 0.5 * (std::pow(k, -s) + std::pow(n, -s)) +
         s / 12.0 * (std::pow(k, -s - 1.0) - std::pow(n, -s - 1.0));
}

TEST(ClickLogTest, ExampleIsTheSameWhateverRangeFillsIt) {
  ClickLog log = MakeLog(ClickLogOptions{});
  ClickBatch all, part;
  log.Fill(0, 100, &all);
  log.Fill(37, 10, &part);
  ASSERT_EQ(part.size, 10);
  EXPECT_EQ(part.begin, 37);
  const int d = log.num_dense(), c = log.num_categorical();
  for (int r = 0; r < 10; ++r) {
    const int i = 37 + r;
    for (int j = 0; j < d; ++j)
      EXPECT_EQ(part.dense[r * d + j], all.dense[i * d + j]) << "example " << i;
    for (int f = 0; f < c; ++f)
      EXPECT_EQ(part.ids[r * c + f], all.ids[i * c + f]) << "example " << i;
    EXPECT_EQ(part.labels[r], all.labels[i]);
    EXPECT_EQ(part.probability[r], all.probability[i]);
  }
  // A test example far out, alone and in a range, and from another ClickLog of the same options.
  ClickBatch one, range;
  MakeLog(ClickLogOptions{}).Fill(ClickLog::kTestBegin + 5, 1, &one);
  log.Fill(ClickLog::kTestBegin, 8, &range);
  EXPECT_TRUE(std::equal(one.ids.begin(), one.ids.end(), range.ids.begin() + 5 * c));
  EXPECT_EQ(one.probability[0], range.probability[5]);
}

TEST(ClickLogTest, FillReusesItsVectors) {
  ClickLog log = MakeLog(ClickLogOptions{});
  ClickBatch batch;
  log.Fill(0, 256, &batch);
  const float* dense = batch.dense.data();
  const uint64_t* ids = batch.ids.data();
  const int32_t* labels = batch.labels.data();
  const float* probability = batch.probability.data();
  // Checked after each fill: a buffer freed by one fill could come back at the next.
  for (int64_t size : {256, 100, 256}) {
    log.Fill(1000 * size, size, &batch);
    EXPECT_EQ(batch.dense.data(), dense);
    EXPECT_EQ(batch.ids.data(), ids);
    EXPECT_EQ(batch.labels.data(), labels);
    EXPECT_EQ(batch.probability.data(), probability);
    EXPECT_EQ(batch.ids.size(), static_cast<size_t>(size) * 26u);
  }
}

TEST(ClickLogTest, DifferentSeedsGiveDifferentExamples) {
  ClickLogOptions o;
  o.ids_per_feature = {1000000000};
  ClickBatch a, b;
  MakeLog(o).Fill(0, 200, &a);
  o.seed = 1;
  MakeLog(o).Fill(0, 200, &b);
  int same_ids = 0, same_dense = 0;
  for (size_t k = 0; k < a.ids.size(); ++k) same_ids += a.ids[k] == b.ids[k];
  for (size_t k = 0; k < a.dense.size(); ++k) same_dense += a.dense[k] == b.dense[k];
  // Ids of 10^9 with Zipf(1.05): two seeds agree only where both pick the same id by chance.
  EXPECT_LT(same_ids, static_cast<int>(a.ids.size() / 100));
  EXPECT_EQ(same_dense, 0);
  EXPECT_NE(a.probability, b.probability);
}

TEST(ClickLogTest, IdsLieInTheirFieldsRanges) {
  ClickLogOptions o;
  o.num_categorical = 3;
  o.ids_per_feature = {10000, 1000000000, int64_t{1} << 62};
  ClickLog log = MakeLog(o);
  ClickBatch batch;
  log.Fill(0, 20000, &batch);
  std::vector<uint64_t> max_id(3, 0);
  std::vector<std::set<uint64_t>> distinct(3);
  for (int64_t r = 0; r < batch.size; ++r) {
    for (int f = 0; f < 3; ++f) {
      uint64_t id = batch.ids[r * 3 + f];
      ASSERT_LT(id, log.ids(f)) << "field " << f << ", example " << r;
      max_id[f] = std::max(max_id[f], id);
      distinct[f].insert(id);
    }
  }
  EXPECT_EQ(log.ids(1), 1000000000u);
  // Ids spread over each whole range, not only its low end.
  EXPECT_GT(max_id[0], 9000u);
  EXPECT_GT(max_id[1], 900000000u);
  EXPECT_GT(max_id[2], uint64_t{1} << 61);
  // Zipf(1.05) over 10^4 ids repeats ids much more than over 2^62.
  EXPECT_LT(distinct[0].size(), 5000u);
  EXPECT_GT(distinct[2].size(), distinct[1].size());
}

TEST(ClickLogTest, TopRanksFollowZipfsPmf) {
  constexpr int64_t kDraws = 200000;
  for (double s : {1.05, 1.0}) {
    ClickLogOptions o;
    o.num_dense = 0;
    o.num_categorical = 2;
    o.ids_per_feature = {1000000, 1000000000};
    o.zipf_s = s;
    ClickLog log = MakeLog(o);
    ClickBatch batch;
    log.Fill(0, kDraws, &batch);
    for (int f = 0; f < 2; ++f) {
      const double n = static_cast<double>(log.ids(f));
      const double harmonic = GeneralizedHarmonic(n, s);
      for (uint64_t rank = 1; rank <= 3; ++rank) {
        const uint64_t id = log.IdOfRank(f, rank);
        int64_t count = 0;
        for (int64_t r = 0; r < kDraws; ++r) count += batch.ids[r * 2 + f] == id;
        const double expected = kDraws * std::pow(static_cast<double>(rank), -s) / harmonic;
        // Four standard deviations: 3% to 5% of the expected count.
        EXPECT_NEAR(static_cast<double>(count), expected, 4.0 * std::sqrt(expected))
            << "s " << s << ", n " << n << ", rank " << rank;
      }
    }
  }
}

TEST(ZipfTest, SmallRanksMatchThePmfClosely) {
  constexpr int kDraws = 2000000;
  for (double s : {1.0, 2.0}) {
    ZipfSampler zipf(1000, s);
    std::vector<int64_t> counts(6, 0);
    for (int i = 0; i < kDraws; ++i) {
      SplitMixStream stream(Rng::Derive(3, static_cast<uint64_t>(i)));
      uint64_t k = zipf.Sample(&stream);
      if (k < counts.size()) ++counts[k];
    }
    const double harmonic = GeneralizedHarmonic(1000, s);
    for (int k = 1; k < 6; ++k) {
      const double expected = kDraws * std::pow(k, -s) / harmonic;
      EXPECT_NEAR(static_cast<double>(counts[k]), expected, 4.0 * std::sqrt(expected))
          << "s " << s << ", rank " << k;
    }
  }
}

TEST(ZipfTest, FarRanksOfAHugeRangeAreAllReachable) {
  constexpr uint64_t kN = uint64_t{1} << 62;
  constexpr int kDraws = 200000;
  for (double s : {1.0, 0.5}) {
    ZipfSampler zipf(kN, s);
    int64_t far = 0, multiples_of_1024 = 0, top_half = 0;
    for (int i = 0; i < kDraws; ++i) {
      SplitMixStream stream(Rng::Derive(7, static_cast<uint64_t>(i)));
      uint64_t k = zipf.Sample(&stream);
      ASSERT_TRUE(k >= 1 && k <= kN) << k;
      if (k > (uint64_t{1} << 50)) {
        ++far;
        multiples_of_1024 += k % 1024 == 0;
      }
      top_half += k > kN / 2;
    }
    // Doubles near 2^62 are 1024 apart: rounding there would make far ranks multiples of 1024.
    ASSERT_GT(far, kDraws / 10) << "s " << s;
    EXPECT_LT(multiples_of_1024, 3 * far / 1024 + 20) << "s " << s;
    // The mass of (2^61, 2^62], as the pmf gives it.
    const double n = static_cast<double>(kN);
    const double expected = kDraws * (GeneralizedHarmonic(n, s) - GeneralizedHarmonic(n / 2, s)) /
                            GeneralizedHarmonic(n, s);
    EXPECT_NEAR(static_cast<double>(top_half), expected, 5.0 * std::sqrt(expected)) << "s " << s;
  }
}

TEST(IdPermutationTest, PermutationIsABijection) {
  for (uint64_t n : {1u, 2u, 3u, 5u, 16u, 17u, 1000u, 4097u}) {
    IdPermutation p(n, 42);
    std::vector<int> hits(n, 0);
    for (uint64_t x = 0; x < n; ++x) {
      uint64_t y = p.Forward(x);
      ASSERT_LT(y, n);
      ++hits[y];
      EXPECT_EQ(p.Inverse(y), x);
    }
    EXPECT_TRUE(std::all_of(hits.begin(), hits.end(), [](int h) { return h == 1; })) << "n " << n;
  }
  // A huge range: inverse of forward, and not the identity.
  IdPermutation huge(uint64_t{1} << 62, 7);
  int fixed = 0;
  for (uint64_t i = 0; i < 1000; ++i) {
    uint64_t x = Rng::SplitMix64(i) >> 2;
    uint64_t y = huge.Forward(x);
    ASSERT_LT(y, uint64_t{1} << 62);
    EXPECT_EQ(huge.Inverse(y), x);
    fixed += y == x;
  }
  EXPECT_EQ(fixed, 0);
}

TEST(IdPermutationTest, PopularIdsAreScattered) {
  ClickLogOptions o;
  o.ids_per_feature = {1000000000};
  ClickLog log = MakeLog(o);
  std::set<uint64_t> top_ids;
  for (int f = 0; f < log.num_categorical(); ++f) {
    for (uint64_t rank = 1; rank <= 3; ++rank) {
      uint64_t id = log.IdOfRank(f, rank);
      EXPECT_EQ(log.RankOfId(f, id), rank);
      top_ids.insert(id);
    }
  }
  // 26 fields x 3 ranks, each its own scattered id: none of them among 0..9.
  EXPECT_EQ(top_ids.size(), 78u);
  EXPECT_GT(*top_ids.begin(), 9u);
}

TEST(ClickLogTest, ProbabilityIsThePlantedModel) {
  ClickLogOptions o;
  o.seed = 3;
  ClickLog log = MakeLog(o);
  double norm2 = 0.0;
  for (float w : log.dense_weights()) norm2 += static_cast<double>(w) * w;
  EXPECT_NEAR(std::sqrt(norm2), o.dense_scale, 1e-6);
  ClickBatch batch;
  log.Fill(ClickLog::kTestBegin, 200, &batch);
  const int d = log.num_dense(), c = log.num_categorical();
  for (int64_t r = 0; r < batch.size; ++r) {
    double logit = o.bias;
    for (int j = 0; j < d; ++j)
      logit += static_cast<double>(log.dense_weights()[j]) * batch.dense[r * d + j];
    for (int f = 0; f < c; ++f) logit += log.PlantedEffect(f, batch.ids[r * c + f]);
    EXPECT_NEAR(batch.probability[r], 1.0 / (1.0 + std::exp(-logit)), 1e-6) << "example " << r;
  }
  // The planted effects are standard normals times planted_scale.
  double sum = 0.0, sum2 = 0.0;
  for (uint64_t id = 0; id < 20000; ++id) {
    double v = log.PlantedEffect(5, id) / o.planted_scale;
    sum += v;
    sum2 += v * v;
  }
  EXPECT_NEAR(sum / 20000, 0.0, 0.04);
  EXPECT_NEAR(sum2 / 20000, 1.0, 0.05);
}

TEST(ClickLogTest, LabelsAreDrawnFromTheProbability) {
  ClickLog log = MakeLog(ClickLogOptions{});
  ClickBatch batch;
  log.Fill(0, 100000, &batch);
  // Calibration: in each decile of probability, the labels' mean is the mean probability.
  std::vector<double> p_sum(10, 0.0), y_sum(10, 0.0), n(10, 0.0);
  for (int64_t r = 0; r < batch.size; ++r) {
    int bin = std::min(9, static_cast<int>(batch.probability[r] * 10));
    p_sum[bin] += batch.probability[r];
    y_sum[bin] += batch.labels[r];
    n[bin] += 1;
  }
  for (int bin = 0; bin < 10; ++bin) {
    if (n[bin] < 500) continue;
    double p = p_sum[bin] / n[bin];
    EXPECT_NEAR(y_sum[bin] / n[bin], p, 4.0 * std::sqrt(p * (1 - p) / n[bin]) + 1e-3)
        << "bin " << bin;
  }
}

TEST(ClickLogTest, DenseFeaturesAreStandardNormal) {
  ClickLog log = MakeLog(ClickLogOptions{});
  ClickBatch batch;
  log.Fill(0, 20000, &batch);
  const int d = log.num_dense();
  for (int j = 0; j < d; ++j) {
    double sum = 0.0, sum2 = 0.0, beyond2 = 0.0;
    for (int64_t r = 0; r < batch.size; ++r) {
      double v = batch.dense[r * d + j];
      sum += v;
      sum2 += v * v;
      beyond2 += std::abs(v) > 2.0;
    }
    EXPECT_NEAR(sum / 20000, 0.0, 0.04) << "feature " << j;
    EXPECT_NEAR(sum2 / 20000, 1.0, 0.05) << "feature " << j;
    EXPECT_NEAR(beyond2 / 20000, 0.0455, 0.008) << "feature " << j;  // P(|N(0,1)| > 2)
  }
}

TEST(ClickLogTest, OracleMetricsAreTheProbabilitiesScores) {
  ClickLog log = MakeLog(ClickLogOptions{});
  ClickBatch batch;
  const int64_t begin = ClickLog::kTestBegin + 12345;
  log.Fill(begin, 20000, &batch);
  ClickOracleMetrics oracle = log.OracleMetrics(begin, 20000);
  EXPECT_DOUBLE_EQ(oracle.auc, Auc(batch.probability, batch.labels));
  EXPECT_DOUBLE_EQ(oracle.log_loss, MeanLogLoss(batch.probability, batch.labels));
  int64_t positives = 0;
  for (int32_t y : batch.labels) positives += y;
  EXPECT_DOUBLE_EQ(oracle.positive_rate, positives / 20000.0);
}

TEST(ClickLogTest, DefaultsGiveTheStatedDifficulty) {
  ClickLog log = MakeLog(ClickLogOptions{});
  ClickOracleMetrics oracle = log.OracleMetrics(ClickLog::kTestBegin, 50000);
  EXPECT_GT(oracle.auc, 0.7);
  EXPECT_LT(oracle.auc, 0.9);
  EXPECT_GT(oracle.positive_rate, 0.2);
  EXPECT_LT(oracle.positive_rate, 0.4);
  // Better than predicting the positive rate for everyone (the labels' entropy).
  double p = oracle.positive_rate;
  EXPECT_LT(oracle.log_loss, -(p * std::log(p) + (1 - p) * std::log(1 - p)) - 0.05);
}

void ExpectRefused(const ClickLogOptions& o, const std::string& names) {
  Status s = o.Validate();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find(names), std::string::npos) << s;
  EXPECT_EQ(s.message().find('\n'), std::string::npos) << s;
  EXPECT_EQ(ClickLog::Create(o).status(), s);
}

TEST(ClickLogTest, DefaultsAreValid) { EXPECT_TRUE(ClickLogOptions{}.Validate().ok()); }

TEST(ClickLogTest, RefusesIdsPerFeatureBelowOne) {
  ClickLogOptions o;
  o.ids_per_feature = {0};
  ExpectRefused(o, "ids_per_feature[0] = 0");
  o.num_categorical = 2;
  o.ids_per_feature = {10, -3};
  ExpectRefused(o, "ids_per_feature[1] = -3");
}

TEST(ClickLogTest, RefusesIdsPerFeatureAbove2To62) {
  ClickLogOptions o;
  o.ids_per_feature = {(int64_t{1} << 62) + 1};
  ExpectRefused(o, "ids_per_feature[0]");
  o.ids_per_feature = {int64_t{1} << 62};
  EXPECT_TRUE(o.Validate().ok());
}

TEST(ClickLogTest, RefusesMismatchedIdsPerFeatureLength) {
  ClickLogOptions o;
  o.ids_per_feature = {10, 20, 30};
  ExpectRefused(o, "ids_per_feature has 3 values");
  o.ids_per_feature = {};
  ExpectRefused(o, "ids_per_feature has 0 values");
}

TEST(ClickLogTest, RefusesZipfSOutOfRange) {
  ClickLogOptions o;
  for (double s : {0.0, -1.0, 3.01, std::nan("")}) {
    o.zipf_s = s;
    ExpectRefused(o, "zipf_s");
  }
  o.zipf_s = 3.0;
  EXPECT_TRUE(o.Validate().ok());
}

TEST(ClickLogTest, RefusesNoCategoricalFeatures) {
  ClickLogOptions o;
  o.num_categorical = 0;
  ExpectRefused(o, "num_categorical = 0");
}

TEST(ClickLogTest, RefusesNegativeNumDense) {
  ClickLogOptions o;
  o.num_dense = -1;
  ExpectRefused(o, "num_dense = -1");
  o.num_dense = 0;
  EXPECT_TRUE(o.Validate().ok());
}

TEST(ClickLogTest, RefusesBadScales) {
  ClickLogOptions o;
  o.planted_scale = -0.1;
  ExpectRefused(o, "planted_scale");
  o = ClickLogOptions{};
  o.dense_scale = INFINITY;
  ExpectRefused(o, "dense_scale");
  o = ClickLogOptions{};
  o.bias = std::nan("");
  ExpectRefused(o, "bias");
}

}  // namespace
}  // namespace gradsync
