#include "common/base/numeric/tensor.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

namespace gradsync {
namespace {

TEST(TensorTest, Helpers) {
  std::vector<float> x = {1, 2, 3}, y = {10, 20, 30};
  Axpy(2.0f, x, y);
  EXPECT_EQ(y, (std::vector<float>{12, 24, 36}));
  Add(x, y);
  EXPECT_EQ(y, (std::vector<float>{13, 26, 39}));
  Scale(y, 0.5f);
  EXPECT_EQ(y, (std::vector<float>{6.5f, 13, 19.5f}));
  EXPECT_DOUBLE_EQ(Dot(x, x), 14.0);
  EXPECT_DOUBLE_EQ(SquaredNorm(x), 14.0);
  Copy(x, y);
  EXPECT_EQ(x, y);
  Fill(y, 0.0f);
  EXPECT_EQ(y, (std::vector<float>{0, 0, 0}));
  EXPECT_TRUE(AllFinite(x));
  x[1] = NAN;
  EXPECT_FALSE(AllFinite(x));
}

TEST(TensorTest, MaxRelativeDiff) {
  std::vector<float> a = {1.0f, 100.0f, 0.0f}, b = {1.0f, 101.0f, 1e-9f};
  EXPECT_NEAR(MaxRelativeDiff(a, b), 1.0 / 101.0, 1e-9);
  EXPECT_EQ(MaxRelativeDiff(a, a), 0.0);
}

// A NaN or an infinity anywhere, on either side, is never within any tolerance: {1, NaN, 3}
// against {1, 2, 3} returned 0 before (every comparison with NaN is false).
TEST(TensorTest, NonFiniteValuesNeverCompareClose) {
  const std::vector<float> finite = {1.0f, 2.0f, 3.0f};
  for (float bad : {NAN, INFINITY, -INFINITY}) {
    const std::vector<float> broken = {1.0f, bad, 3.0f};
    EXPECT_EQ(MaxRelativeDiff(broken, finite), std::numeric_limits<double>::infinity()) << bad;
    EXPECT_EQ(MaxRelativeDiff(finite, broken), std::numeric_limits<double>::infinity()) << bad;
    EXPECT_FALSE(MaxRelativeDiff(broken, broken) <= 1e-6) << bad;
  }
}

TEST(TensorTest, LayoutSize) {
  std::vector<TensorInfo> layout = {{"a", {2, 3}, 0, 6}, {"b", {3}, 6, 3}};
  EXPECT_EQ(LayoutSize(layout), 9);
}

}  // namespace
}  // namespace gradsync
