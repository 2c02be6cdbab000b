#include "common/data/synthetic.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

namespace gradsync {
namespace {

TEST(SyntheticTest, BlobsAreDeterministicAndShaped) {
  BlobsOptions o;
  o.n = 200;
  o.dim = 5;
  o.classes = 3;
  Dataset a = MakeGaussianBlobs(o), b = MakeGaussianBlobs(o);
  EXPECT_EQ(a.features, b.features);
  EXPECT_EQ(a.labels, b.labels);
  EXPECT_EQ(a.features.size(), 1000u);
  EXPECT_FALSE(a.sparse);
  for (int32_t y : a.labels) EXPECT_TRUE(y >= 0 && y < 3);
  o.seed = 1;
  EXPECT_NE(MakeGaussianBlobs(o).features, a.features);
}

TEST(SyntheticTest, SparseLogisticIsAHugeSparseProblem) {
  SparseLogisticOptions o;
  o.n = 5000;
  o.feature_bits = 20;
  o.nnz = 16;
  Dataset d = MakeSparseLogistic(o);
  EXPECT_TRUE(d.sparse);
  EXPECT_EQ(d.dim, 1 << 20);
  ASSERT_EQ(d.row_ptr.size(), 5001u);
  std::set<uint64_t> distinct;
  int64_t positives = 0;
  for (int64_t i = 0; i < d.n; ++i) {
    ASSERT_EQ(d.row_ptr[i + 1] - d.row_ptr[i], 16);
    for (int64_t j = d.row_ptr[i]; j < d.row_ptr[i + 1]; ++j) {
      ASSERT_LT(d.keys[j], uint64_t{1} << 20);
      if (j > d.row_ptr[i]) {
        ASSERT_LT(d.keys[j - 1], d.keys[j]);  // sorted, unique per row
      }
      distinct.insert(d.keys[j]);
    }
    positives += d.labels[i];
  }
  // Power-law popularity: many distinct keys overall (a sparse problem), but far fewer than
  // n * nnz (popular keys repeat, so there is something to learn).
  EXPECT_GT(distinct.size(), 10000u);
  EXPECT_LT(distinct.size(), 5000u * 16u / 2);
  EXPECT_GT(positives, 1500);
  EXPECT_LT(positives, 3500);
  Dataset again = MakeSparseLogistic(o);
  EXPECT_EQ(again.keys, d.keys);
  EXPECT_EQ(again.labels, d.labels);
}

}  // namespace
}  // namespace gradsync
