#include "common/optim/precision.h"

#include <gtest/gtest.h>

namespace gradsync {
namespace {

TEST(PrecisionTest, NamesParseAndImplyTheirCodecs) {
  for (Precision p : {Precision::kFp32, Precision::kBf16, Precision::kFp16}) {
    auto parsed = ParsePrecision(PrecisionName(p));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, p);
  }
  EXPECT_FALSE(ParsePrecision("fp8").ok());
  EXPECT_NE(ParsePrecision("half").status().message().find("fp32, bf16 or fp16"), std::string::npos);
  EXPECT_EQ(PrecisionCodec(Precision::kFp32), "");
  EXPECT_EQ(PrecisionCodec(Precision::kBf16), "bf16");
  EXPECT_EQ(PrecisionCodec(Precision::kFp16), "fp16");
  EXPECT_FALSE(PrecisionFormat(Precision::kFp32).has_value());
  EXPECT_EQ(*PrecisionFormat(Precision::kFp16), Float16::kHalf);
}

TEST(DynamicLossScalerTest, SkipsHalveAndGoodRunsDouble) {
  DynamicLossScaler s({.initial = 1024.0f, .growth = 2.0f, .backoff = 0.5f, .growth_interval = 3});
  EXPECT_EQ(s.scale(), 1024.0f);
  EXPECT_FALSE(s.Update(false));  // overflow: skipped, halved
  EXPECT_EQ(s.scale(), 512.0f);
  EXPECT_EQ(s.skipped(), 1);
  EXPECT_TRUE(s.Update(true));
  EXPECT_TRUE(s.Update(true));
  EXPECT_EQ(s.scale(), 512.0f);
  EXPECT_FALSE(s.Update(false));  // an overflow restarts the run of good steps
  EXPECT_EQ(s.scale(), 256.0f);
  for (int i = 0; i < 2; ++i) EXPECT_TRUE(s.Update(true));
  EXPECT_EQ(s.scale(), 256.0f);
  EXPECT_TRUE(s.Update(true));   // the third good step in a row doubles
  EXPECT_EQ(s.scale(), 512.0f);
  EXPECT_EQ(s.skipped(), 2);
  EXPECT_EQ(s.good_in_a_row(), 0);
}

}  // namespace
}  // namespace gradsync
