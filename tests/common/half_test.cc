#include "common/half.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace gradsync {
namespace {

TEST(HalfTest, EveryHalfRoundTripsExactly) {
  std::vector<uint16_t> all;
  for (uint32_t h = 0; h < 65536; ++h) {
    const uint16_t v = static_cast<uint16_t>(h);
    if ((v & 0x7c00u) == 0x7c00u && (v & 0x3ffu)) continue;  // NaNs: only NaN-ness is kept
    all.push_back(v);
  }
  std::vector<float> f(all.size());
  HalvesToFloats(all.data(), all.size(), f.data());
  std::vector<uint16_t> back(all.size());
  FloatsToHalves(f.data(), f.size(), back.data());
  for (size_t i = 0; i < all.size(); ++i) {
    ASSERT_EQ(back[i], all[i]) << "half 0x" << std::hex << all[i];
    ASSERT_EQ(FloatToHalf(HalfToFloat(all[i])), all[i]);
    ASSERT_EQ(HalfToFloat(all[i]), f[i]);
  }
}

TEST(HalfTest, RoundsToNearestEvenAndSaturatesToInfinity) {
  EXPECT_EQ(HalfToFloat(FloatToHalf(1.0f + 1.0f / 2048)), 1.0f);                 // tie: down to even
  EXPECT_EQ(HalfToFloat(FloatToHalf(1.0f + 3.0f / 2048)), 1.0f + 2.0f / 1024);   // tie: up to even
  EXPECT_EQ(HalfToFloat(FloatToHalf(65504.0f)), 65504.0f);
  EXPECT_TRUE(std::isinf(HalfToFloat(FloatToHalf(65520.0f))));
  EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(NAN))));
  EXPECT_EQ(HalfToFloat(FloatToHalf(std::ldexp(1.0f, -24))), std::ldexp(1.0f, -24));  // smallest subnormal
  // The bulk (F16C) path agrees with the scalar one, the tail included.
  std::vector<float> x(1003);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(static_cast<float>(i)) * std::ldexp(1.0f, static_cast<int>(i % 40) - 20);
  std::vector<uint16_t> h(x.size());
  FloatsToHalves(x.data(), x.size(), h.data());
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(h[i], FloatToHalf(x[i])) << i;
}

TEST(HalfTest, AddHalvesRoundsOncePerAddition) {
  std::vector<uint16_t> acc(1001), x(1001);
  for (size_t i = 0; i < acc.size(); ++i) {
    acc[i] = FloatToHalf(0.001f * static_cast<float>(i) - 0.3f);
    x[i] = FloatToHalf(0.37f * std::cos(static_cast<float>(i)));
  }
  std::vector<uint16_t> want(acc.size());
  for (size_t i = 0; i < acc.size(); ++i) want[i] = FloatToHalf(HalfToFloat(acc[i]) + HalfToFloat(x[i]));
  AddHalves(acc.data(), x.data(), acc.size());
  EXPECT_EQ(acc, want);
}

}  // namespace
}  // namespace gradsync
