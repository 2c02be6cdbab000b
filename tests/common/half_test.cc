#include "common/base/numeric/half.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
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

namespace gradsync {
namespace {

TEST(Bf16Test, RoundsToNearestEvenKeepsRangeAndNaN) {
  EXPECT_EQ(Bf16ToFloat(FloatToBf16(1.0f)), 1.0f);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties go to the even (1).
  EXPECT_EQ(Bf16ToFloat(FloatToBf16(1.0f + 1.0f / 256)), 1.0f);
  EXPECT_EQ(Bf16ToFloat(FloatToBf16(1.0f + 3.0f / 256)), 1.0f + 4.0f / 256);  // tie: up to even
  EXPECT_EQ(Bf16ToFloat(FloatToBf16(1.0f + 1.0f / 200)), 1.0f + 1.0f / 128);  // nearest
  EXPECT_EQ(Bf16ToFloat(FloatToBf16(3e38f)), 3.00405527e38f);                 // float's range, not half's
  EXPECT_TRUE(std::isinf(Bf16ToFloat(FloatToBf16(INFINITY))));
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(NAN))));
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(std::bit_cast<float>(0x7f800001u)))));  // a NaN whose top half is inf
  EXPECT_EQ(Bf16ToFloat(FloatToBf16(-2.5f)), -2.5f);
  EXPECT_GT(Bf16ToFloat(FloatToBf16(1e-40f)), 0.0f);  // float's subnormals stay nonzero
}

TEST(Bf16Test, BuffersAndSumsRoundOncePerOperation) {
  std::vector<float> x = {1.0f, 1.0f / 3, -7.25f, 1e20f, 0.0f, 255.0f, 257.0f, 1e-3f, 0.1f};
  std::vector<uint16_t> b(x.size());
  FloatsTo16(Float16::kBfloat16, x.data(), x.size(), b.data());
  std::vector<float> back(x.size());
  Float16sToFloats(Float16::kBfloat16, b.data(), b.size(), back.data());
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_EQ(b[i], FloatToBf16(x[i])) << i;
    EXPECT_EQ(back[i], Bf16ToFloat(b[i])) << i;
    EXPECT_LE(std::fabs(back[i] - x[i]), std::fabs(x[i]) / 256) << i;  // 8 significant bits
  }
  // 256 + 1 rounds back to 256 in bf16 (ties to even); 256 + 2 is exact.
  std::vector<uint16_t> acc = {FloatToBf16(256.0f), FloatToBf16(256.0f)};
  const std::vector<uint16_t> add = {FloatToBf16(1.0f), FloatToBf16(2.0f)};
  Add16(Float16::kBfloat16, acc.data(), add.data(), acc.size());
  EXPECT_EQ(Bf16ToFloat(acc[0]), 256.0f);
  EXPECT_EQ(Bf16ToFloat(acc[1]), 258.0f);
}

TEST(Bf16Test, RoundTo16IsWhatA16BitStoreReadsBack) {
  std::vector<float> x = {1.0f / 3, 70000.0f, -1e-3f, 65504.0f, 1e-8f};
  for (Float16 f : {Float16::kHalf, Float16::kBfloat16}) {
    std::vector<float> r = x;
    RoundTo16(f, r.data(), r.size());
    std::vector<uint16_t> h(x.size());
    FloatsTo16(f, x.data(), x.size(), h.data());
    std::vector<float> back(x.size());
    Float16sToFloats(f, h.data(), h.size(), back.data());
    EXPECT_EQ(std::memcmp(r.data(), back.data(), r.size() * sizeof(float)), 0) << Float16Name(f);
  }
  std::vector<float> big = {70000.0f};
  RoundTo16(Float16::kHalf, big.data(), 1);
  EXPECT_TRUE(std::isinf(big[0]));  // beyond half's 65504
  big = {70000.0f};
  RoundTo16(Float16::kBfloat16, big.data(), 1);
  EXPECT_EQ(big[0], 70144.0f);      // bf16 keeps the range, not the digits
  // Longer than RoundTo16's chunk: every element rounded.
  std::vector<float> many(3000, 1.0f / 3);
  RoundTo16(Float16::kHalf, many.data(), many.size());
  for (float v : many) ASSERT_EQ(v, HalfToFloat(FloatToHalf(1.0f / 3)));
}

}  // namespace
}  // namespace gradsync
