#include <gtest/gtest.h>

#include <limits>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "common/base/numeric/rng.h"
#include "compression/codecs/codecs.h"
#include "compression/error_feedback.h"
#include "compression/gradient_encoder.h"
#include "compression/momentum_correction.h"

namespace gradsync {
namespace {

const std::vector<std::string> kSpecs = {"fp16", "int8", "qsgd:16", "qsgd:1", "sign", "topk:0.01", "topk:0.5", "randomk:0.1"};

std::unique_ptr<Compressor> Make(const std::string& spec, bool unbiased = false) {
  auto c = CreateCompressor(spec, 7, unbiased);
  GRADSYNC_CHECK(c.ok() && *c) << spec;
  return std::move(c).value();
}

std::vector<float> Gaussian(size_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> x(n);
  for (float& v : x) v = static_cast<float>(rng.Normal());
  return x;
}

TEST(CompressorTest, FactoryParsesAndRejects) {
  EXPECT_EQ(CreateCompressor("none", 0).value(), nullptr);
  for (const auto& s : kSpecs) EXPECT_TRUE(CreateCompressor(s, 0).ok()) << s;
  for (const char* bad : {"qsgd", "qsgd:0", "qsgd:2.5", "qsgd:200", "topk", "topk:0", "topk:1.5", "randomk:-1",
                          "fp16:2", "gzip", "topk:abc"}) {
    auto r = CreateCompressor(bad, 0);
    EXPECT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_EQ(Make("fp16")->aggregation(), Aggregation::kRingSummable);
  EXPECT_EQ(Make("randomk:0.1")->aggregation(), Aggregation::kRingSummable);
  for (const char* g : {"int8", "qsgd:16", "sign", "topk:0.01"}) EXPECT_EQ(Make(g)->aggregation(), Aggregation::kGatherOnly) << g;
}

TEST(CompressorTest, PayloadSizesEqualTheirFormula) {
  for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{511}, size_t{512}, size_t{513}, size_t{100000}}) {
    auto x = Gaussian(n, n);
    const size_t buckets = (n + kQuantBucket - 1) / kQuantBucket;
    const std::vector<std::pair<std::string, size_t>> expect = {
        {"fp16", 2 * n},
        {"int8", n + 4 * buckets},
        {"qsgd:16", n + 4 * buckets},
        {"sign", 4 + (n + 7) / 8},
        {"topk:0.01", 4 + 8 * KeptElements(n, 0.01)},
        {"randomk:0.1", 4 * KeptElements(n, 0.1)}};
    for (const auto& [spec, bytes] : expect) {
      auto c = Make(spec);
      std::vector<uint8_t> p;
      c->Encode(x, 3, &p);
      EXPECT_EQ(p.size(), bytes) << spec << " n=" << n;
      EXPECT_EQ(c->PayloadBytes(n), bytes) << spec << " n=" << n;
      std::vector<float> out(n);
      EXPECT_TRUE(c->Decode(p, n, 3, out).ok()) << spec << " n=" << n;
    }
  }
  EXPECT_EQ(KeptElements(1000, 0.01), 10u);
  EXPECT_EQ(KeptElements(10, 0.001), 1u);
}

TEST(CompressorTest, Fp16RoundsToNearestAndKnowsItsEdges) {
  auto c = Make("fp16");
  std::vector<float> x = {0.0f, -0.0f, 1.0f, -2.5f, 65504.0f, 70000.0f, 1e-8f, 0.333333f, 6.1035156e-05f, INFINITY};
  std::vector<uint8_t> p;
  c->Encode(x, 0, &p);
  auto half = [&](size_t i) { return static_cast<uint16_t>(p[2 * i] | (p[2 * i + 1] << 8)); };
  EXPECT_EQ(half(2), 0x3C00);
  EXPECT_EQ(half(3), 0xC100);
  EXPECT_EQ(half(4), 0x7BFF);
  EXPECT_EQ(half(5), 0x7C00);  // overflow -> infinity
  EXPECT_EQ(half(8), 0x0400);  // smallest normal
  std::vector<float> out(x.size());
  ASSERT_TRUE(c->Decode(p, x.size(), 0, out).ok());
  EXPECT_EQ(out[0], 0.0f);
  EXPECT_TRUE(std::signbit(out[1]));
  EXPECT_EQ(out[2], 1.0f);
  EXPECT_EQ(out[3], -2.5f);
  EXPECT_NEAR(out[6], 1e-8f, 3e-8f);  // subnormal half
  EXPECT_NEAR(out[7], 0.333333f, 0.333333f / 2048);
  auto y = Gaussian(10001, 1);
  c->Encode(y, 0, &p);
  std::vector<float> back(y.size());
  ASSERT_TRUE(c->Decode(p, y.size(), 0, back).ok());
  for (size_t i = 0; i < y.size(); ++i) ASSERT_LE(std::fabs(back[i] - y[i]), std::fabs(y[i]) / 2048 + 1e-7f) << i;
}

TEST(CompressorTest, Int8ErrorIsHalfAStep) {
  auto c = Make("int8");
  auto x = Gaussian(3000, 2);
  std::vector<uint8_t> p;
  c->Encode(x, 0, &p);
  std::vector<float> out(x.size());
  ASSERT_TRUE(c->Decode(p, x.size(), 0, out).ok());
  for (size_t b = 0; b < x.size(); b += kQuantBucket) {
    float m = 0;
    for (size_t i = b; i < std::min(x.size(), b + kQuantBucket); ++i) m = std::max(m, std::fabs(x[i]));
    for (size_t i = b; i < std::min(x.size(), b + kQuantBucket); ++i) ASSERT_LE(std::fabs(out[i] - x[i]), m / 127 / 2 * 1.0001f);
  }
}

// Found by fuzz/fuzz_codecs (UBSan: NaN and inf converted to int in Encode).
TEST(CompressorTest, Int8EncodesTinyAndNonFiniteBucketsWithinItsLevels) {
  auto c = Make("int8");
  std::vector<uint8_t> p;
  std::vector<float> out(4);
  // max|x| < 127 * 2^-128: 1 / scale overflows; the levels are still x / scale, rounded.
  const std::vector<float> tiny = {1e-38f, -5e-39f, 0.0f, 2.5e-39f};
  c->Encode(tiny, 0, &p);
  ASSERT_TRUE(c->Decode(p, tiny.size(), 0, out).ok());
  for (size_t i = 0; i < tiny.size(); ++i) EXPECT_NEAR(out[i], tiny[i], 1e-38 / 127) << i;
  // NaN is level 0; the others are as usual.
  const std::vector<float> nan = {NAN, 2.0f, -1.0f, 0.5f};
  c->Encode(nan, 0, &p);
  ASSERT_TRUE(c->Decode(p, nan.size(), 0, out).ok());
  EXPECT_EQ(out[0], 0.0f);
  for (size_t i = 1; i < nan.size(); ++i) EXPECT_NEAR(out[i], nan[i], 2.0 / 127 / 2 * 1.0001) << i;
  // A bucket with an infinity: every level in [-127, 127] (its scale is inf, which Decode
  // refuses, as it refuses any payload with a non-finite scale).
  const std::vector<float> inf = {INFINITY, 1.0f, -INFINITY, NAN};
  c->Encode(inf, 0, &p);
  ASSERT_EQ(p.size(), c->PayloadBytes(inf.size()));
  for (size_t i = 4; i < p.size(); ++i) EXPECT_NE(p[i], 0x80) << i;
  EXPECT_EQ(c->Decode(p, inf.size(), 0, out).code(), StatusCode::kDataLoss);
}

TEST(CompressorTest, TopKPicksExactlyTheKLargestWithTiesToTheLowerIndex) {
  auto x = Gaussian(5000, 3);
  auto c = Make("topk:0.01");
  std::vector<uint8_t> p;
  c->Encode(x, 0, &p);
  std::vector<float> out(x.size());
  ASSERT_TRUE(c->Decode(p, x.size(), 0, out).ok());
  std::vector<float> mags(x.size());
  for (size_t i = 0; i < x.size(); ++i) mags[i] = std::fabs(x[i]);
  std::vector<float> sorted = mags;
  std::sort(sorted.rbegin(), sorted.rend());
  const float threshold = sorted[49];  // k = 50
  int kept = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (out[i] != 0) {
      ++kept;
      EXPECT_EQ(out[i], x[i]);  // values travel exactly
      EXPECT_GE(mags[i], threshold);
    } else {
      EXPECT_LE(mags[i], threshold);
    }
  }
  EXPECT_EQ(kept, 50);
  // Ties: with equal magnitudes the lower indices are kept.
  std::vector<float> tie(10, 1.0f);
  tie[7] = -1.0f;
  auto c2 = Make("topk:0.3");
  c2->Encode(tie, 0, &p);
  std::vector<float> t(10);
  ASSERT_TRUE(c2->Decode(p, 10, 0, t).ok());
  EXPECT_EQ(t, (std::vector<float>{1, 1, 1, 0, 0, 0, 0, 0, 0, 0}));
}

// Found by fuzz/fuzz_codecs: a NaN broke the magnitude order, so Encode kept fewer than k indices
// and read past them (ASan: SEGV in TopK::Encode).
TEST(CompressorTest, TopKRanksNaNAsTheLargestMagnitude) {
  std::vector<float> x = {1, NAN, -3, 2, NAN, 0.5f, -INFINITY, 4, 0, 0};
  auto c = Make("topk:0.4");  // k = 4
  std::vector<uint8_t> p;
  c->Encode(x, 0, &p);
  ASSERT_EQ(p.size(), c->PayloadBytes(x.size()));
  std::vector<float> out(x.size());
  ASSERT_TRUE(c->Decode(p, x.size(), 0, out).ok());
  // NaN and inf rank above every finite magnitude (ties to the lower index): 1, 4, 6, then |4|.
  EXPECT_TRUE(std::isnan(out[1]));
  EXPECT_TRUE(std::isnan(out[4]));
  EXPECT_EQ(out[6], -INFINITY);
  EXPECT_EQ(out[7], 4.0f);
  for (size_t i : {0, 2, 3, 5, 8, 9}) EXPECT_EQ(out[i], 0.0f) << i;
  // All NaN: still k of them, the lowest indices.
  std::vector<float> all(10, NAN);
  c->Encode(all, 0, &p);
  ASSERT_TRUE(c->Decode(p, all.size(), 0, out).ok());
  for (size_t i = 0; i < all.size(); ++i) EXPECT_EQ(std::isnan(out[i]), i < 4) << i;
}

TEST(CompressorTest, RandomKSharesItsIndicesPerStep) {
  auto x = Gaussian(1000, 4);
  auto a = Make("randomk:0.1"), b = Make("randomk:0.1");
  std::vector<uint8_t> pa, pb;
  a->Encode(x, 5, &pa);
  b->Encode(x, 5, &pb);
  EXPECT_EQ(pa, pb);  // same seed and step on another rank: the same indices, so summable values
  std::vector<float> o5(1000), o6(1000);
  ASSERT_TRUE(a->Decode(pa, 1000, 5, o5).ok());
  a->Encode(x, 6, &pa);
  ASSERT_TRUE(a->Decode(pa, 1000, 6, o6).ok());
  int kept5 = 0, same = 0;
  for (int i = 0; i < 1000; ++i) {
    if (o5[i] != 0) {
      ++kept5;
      EXPECT_EQ(o5[i], x[i]);
    }
    same += (o5[i] != 0) == (o6[i] != 0) && o5[i] != 0;
  }
  EXPECT_EQ(kept5, 100);
  EXPECT_LT(same, 50);  // another step, another set
  auto u = Make("randomk:0.1", /*unbiased=*/true);
  u->Encode(x, 5, &pa);
  ASSERT_TRUE(u->Decode(pa, 1000, 5, o6).ok());
  for (int i = 0; i < 1000; ++i) {
    if (o5[i] != 0) {
      EXPECT_FLOAT_EQ(o6[i], 10.0f * x[i]);
    }
  }
}

TEST(CompressorTest, SignKeepsSignsAndTheMeanMagnitude) {
  std::vector<float> x = {2.0f, -1.0f, 0.0f, -3.0f, 4.0f};
  auto c = Make("sign");
  std::vector<uint8_t> p;
  c->Encode(x, 0, &p);
  std::vector<float> out(5);
  ASSERT_TRUE(c->Decode(p, 5, 0, out).ok());
  EXPECT_EQ(out, (std::vector<float>{2.0f, -2.0f, 2.0f, -2.0f, 2.0f}));
}

TEST(CompressorTest, QsgdIsUnbiasedWithinItsVarianceBound) {
  const int levels = 4;
  const size_t n = 700;  // two buckets, the second partial
  auto x = Gaussian(n, 9);
  auto c = Make("qsgd:" + std::to_string(levels));
  const int draws = 10000;
  std::vector<double> sum(n, 0.0);
  double sq_err = 0;
  std::vector<uint8_t> p;
  std::vector<float> out(n);
  for (int d = 0; d < draws; ++d) {
    c->Encode(x, static_cast<uint64_t>(d), &p);
    ASSERT_TRUE(c->Decode(p, n, 0, out).ok());
    for (size_t i = 0; i < n; ++i) {
      sum[i] += out[i];
      sq_err += (static_cast<double>(out[i]) - x[i]) * (static_cast<double>(out[i]) - x[i]);
    }
  }
  // Each element takes one of two values, l * unit or (l + 1) * unit (times its sign), the upper
  // one with probability p = r - l: its standard error over the draws is unit * sqrt(p (1 - p) / draws).
  int outside = 0;
  for (size_t b = 0; b < n; b += kQuantBucket) {
    const size_t e = std::min(n, b + kQuantBucket);
    double norm_sq = 0;
    for (size_t i = b; i < e; ++i) norm_sq += static_cast<double>(x[i]) * x[i];
    const double unit = std::sqrt(norm_sq) / levels;
    for (size_t i = b; i < e; ++i) {
      const double r = std::fabs(x[i]) / unit, prob = r - std::floor(r);
      const double se = unit * std::sqrt(prob * (1 - prob) / draws);
      if (std::fabs(sum[i] / draws - x[i]) > 4 * se + 1e-6 * std::fabs(x[i]) + 1e-7) ++outside;
    }
  }
  EXPECT_LE(outside, 1) << "elements whose mean of 10,000 draws is more than 4 standard errors off";
  // Variance bound (Alistarh et al., Lemma 3.1), summed over buckets.
  double bound = 0;
  for (size_t b = 0; b < n; b += kQuantBucket) {
    const size_t len = std::min(n, b + kQuantBucket) - b;
    double norm_sq = 0;
    for (size_t i = b; i < b + len; ++i) norm_sq += static_cast<double>(x[i]) * x[i];
    const double s = levels;
    bound += std::min(len / (s * s), std::sqrt(static_cast<double>(len)) / s) * norm_sq;
  }
  EXPECT_LE(sq_err / draws, bound);
}

// decode(sent) + new residual == gradient + old residual. The residual is one fp32 subtraction
// p - D(c): exact (Sterbenz) whenever D(c) is 0 or within a factor 2 of p, which holds for
// fp16, int8, top-k and random-k, so there the identity is bit-exact. Sign (and QSGD when it
// rounds a tiny element up to one level) can decode far from p; the residual then carries the
// rounding of that one subtraction: at most half an ulp of the larger of |p| and |D(c)|.
class ErrorFeedbackTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ErrorFeedbackTest, ConservesMass) {
  const bool exact = GetParam().rfind("sign", 0) != 0 && GetParam().rfind("qsgd", 0) != 0;
  const size_t n = 2000;
  ErrorFeedback ef(Make(GetParam()), n);
  auto probe = Make(GetParam());
  std::vector<uint8_t> p;
  std::vector<float> decoded(n), old_residual(n);
  for (uint64_t step = 0; step < 5; ++step) {
    auto g = Gaussian(n, 100 + step);
    std::copy(ef.residual().begin(), ef.residual().end(), old_residual.begin());
    ef.Encode(g, step, &p);
    ASSERT_TRUE(probe->Decode(p, n, step, decoded).ok());
    int mismatches = 0;
    for (size_t i = 0; i < n; ++i) {
      const float lhs = decoded[i] + ef.residual()[i];
      const float rhs = g[i] + old_residual[i];
      if (exact) {
        mismatches += lhs != rhs;
      } else {
        const float big = std::max(std::fabs(rhs), std::fabs(decoded[i]));
        mismatches += std::fabs(lhs - rhs) > std::nextafter(big, INFINITY) - big;
      }
    }
    EXPECT_EQ(mismatches, 0) << GetParam() << " step " << step;
  }
}

INSTANTIATE_TEST_SUITE_P(Codecs, ErrorFeedbackTest, ::testing::ValuesIn(kSpecs), [](const auto& p) {
  std::string s = p.param;
  for (char& ch : s)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return s;
});

TEST(MomentumCorrectionTest, AccumulatesMasksAndSendsTheRest) {
  const size_t n = 1000;
  MomentumCorrection dgc(Make("topk:0.02"), n, 0.9f);
  auto probe = Make("topk:0.02");
  std::vector<uint8_t> p;
  std::vector<float> decoded(n), u_old(n), v_old(n);
  for (uint64_t step = 0; step < 6; ++step) {
    auto g = Gaussian(n, 300 + step);
    std::copy(dgc.velocity().begin(), dgc.velocity().end(), u_old.begin());
    std::copy(dgc.accumulated().begin(), dgc.accumulated().end(), v_old.begin());
    dgc.Encode(g, step, &p);
    ASSERT_TRUE(probe->Decode(p, n, step, decoded).ok());
    int sent = 0;
    for (size_t i = 0; i < n; ++i) {
      const float u = 0.9f * u_old[i] + g[i];
      if (decoded[i] != 0) {
        ++sent;
        EXPECT_EQ(decoded[i], v_old[i] + u) << i;    // what was accumulated is what is sent
        EXPECT_EQ(dgc.velocity()[i], 0.0f) << i;     // momentum-factor masking
        EXPECT_EQ(dgc.accumulated()[i], 0.0f) << i;
      } else {
        EXPECT_EQ(dgc.velocity()[i], u) << i;
        EXPECT_EQ(dgc.accumulated()[i], v_old[i] + u) << i;
      }
    }
    EXPECT_EQ(sent, 20);
  }
}

TEST(MomentumCorrectionTest, SendingEverythingIsPlainSgdOfTheGradient) {
  MomentumCorrection dgc(Make("topk:1"), 50, 0.9f);
  auto probe = Make("topk:1");
  std::vector<uint8_t> p;
  std::vector<float> decoded(50);
  for (uint64_t step = 0; step < 3; ++step) {
    auto g = Gaussian(50, step + 1);
    dgc.Encode(g, step, &p);
    ASSERT_TRUE(probe->Decode(p, 50, step, decoded).ok());
    EXPECT_EQ(decoded, g);  // u and v are cleared every step: the receiver's SGD sees g
  }
}

TEST(CompressorTest, MalformedPayloadsAreRejected) {
  const size_t n = 1000;
  auto x = Gaussian(n, 5);
  std::vector<float> out(n);
  for (const auto& spec : kSpecs) {
    auto c = Make(spec);
    std::vector<uint8_t> p;
    c->Encode(x, 1, &p);
    auto shorter = p;
    if (!shorter.empty()) shorter.pop_back();
    EXPECT_EQ(c->Decode(shorter, n, 1, out).code(), StatusCode::kDataLoss) << spec;
    auto longer = p;
    longer.push_back(0);
    EXPECT_EQ(c->Decode(longer, n, 1, out).code(), StatusCode::kDataLoss) << spec;
    // A payload decoded for another n is refused whenever the sizes tell them apart.
    std::vector<float> bigger(n + 1);
    if (c->PayloadBytes(n + 1) != p.size()) {
      EXPECT_FALSE(c->Decode(p, n + 1, 1, bigger).ok()) << spec;
    }
  }
  auto topk = Make("topk:0.01");
  std::vector<uint8_t> p;
  topk->Encode(x, 0, &p);
  auto bad_index = p;
  const uint32_t huge = 5000;
  std::memcpy(bad_index.data() + 4, &huge, 4);
  EXPECT_FALSE(topk->Decode(bad_index, n, 0, out).ok());
  auto swapped = p;
  std::swap_ranges(swapped.begin() + 4, swapped.begin() + 8, swapped.begin() + 8);
  EXPECT_FALSE(topk->Decode(swapped, n, 0, out).ok());  // indices out of order
  auto qsgd = Make("qsgd:16");
  qsgd->Encode(x, 0, &p);
  p[10] = 0x7f;  // level 127 > 16
  EXPECT_FALSE(qsgd->Decode(p, n, 0, out).ok());
  qsgd->Encode(x, 0, &p);
  const float nan = NAN;
  std::memcpy(p.data(), &nan, 4);
  EXPECT_FALSE(qsgd->Decode(p, n, 0, out).ok());
  auto sign = Make("sign");
  sign->Encode(std::vector<float>(5, 1.0f), 0, &p);
  p.back() |= 0x80;  // a padding bit
  std::vector<float> five(5);
  EXPECT_FALSE(sign->Decode(p, 5, 0, five).ok());
  auto int8 = Make("int8");
  int8->Encode(x, 0, &p);
  p[4] = 0x80;  // -128
  EXPECT_FALSE(int8->Decode(p, n, 0, out).ok());
}

TEST(CompressorTest, RandomBytesNeverCrashADecoder) {
  Rng rng(77);
  std::vector<float> out(300);
  for (const auto& spec : kSpecs) {
    auto c = Make(spec);
    for (int trial = 0; trial < 300; ++trial) {
      std::vector<uint8_t> junk(rng.UniformInt(2 * c->PayloadBytes(300) + 8));
      for (auto& b : junk) b = static_cast<uint8_t>(rng.UniformInt(256));
      (void)c->Decode(junk, 300, 0, out);  // an error or a value; never a crash (ASan builds check reads)
    }
  }
}

}  // namespace
}  // namespace gradsync

namespace gradsync {
namespace {

TEST(GradientEncoderTest, ChoosesThePlainCodecFeedbackOrCorrection) {
  EXPECT_FALSE(GradientEncoder::Create("none", 0, 10, false, 0).ok());
  EXPECT_FALSE(GradientEncoder::Create("fp16", 0, 10, false, 0.9f).ok());  // DGC needs a sparsifier
  std::vector<float> g(100);
  for (size_t i = 0; i < g.size(); ++i) g[i] = std::sin(static_cast<float>(i));
  // With error feedback: the same bytes as an ErrorFeedback around the same codec, step by step.
  auto enc = std::move(GradientEncoder::Create("topk:0.1", 3, g.size(), true, 0)).value();
  ErrorFeedback ef(std::move(CreateCompressor("topk:0.1", 3)).value(), g.size());
  std::vector<uint8_t> a, b;
  for (uint64_t step = 0; step < 3; ++step) {
    ASSERT_TRUE(enc->Encode(g, step, &a).ok());
    ef.Encode(g, step, &b);
    EXPECT_EQ(a, b) << step;
  }
  // Plain random-k (no feedback) is the unbiased variant, scaled by n/k.
  auto plain = std::move(GradientEncoder::Create("randomk:0.5", 3, g.size(), false, 0)).value();
  std::vector<uint8_t> unbiased, raw;
  ASSERT_TRUE(plain->Encode(g, 1, &unbiased).ok());
  std::move(CreateCompressor("randomk:0.5", 3, true)).value()->Encode(g, 1, &raw);
  EXPECT_EQ(unbiased, raw);
}

// A diverged gradient used to reach the error-feedback memory, whose own payload check then
// aborted the process (int8 / sign / qsgd cannot carry NaN): now it is a clear error.
TEST(GradientEncoderTest, ADivergedGradientIsAnErrorNotACrash) {
  for (const char* spec : {"int8", "sign", "qsgd:16", "topk:0.1"}) {
    for (bool ef : {false, true}) {
      auto enc = std::move(GradientEncoder::Create(spec, 1, 16, ef, 0)).value();
      std::vector<float> g(16, 0.5f);
      g[3] = std::numeric_limits<float>::quiet_NaN();
      std::vector<uint8_t> out;
      EXPECT_EQ(enc->Encode(g, 0, &out).code(), StatusCode::kAborted) << spec;
      g[3] = std::numeric_limits<float>::infinity();
      EXPECT_EQ(enc->Encode(g, 1, &out).code(), StatusCode::kAborted) << spec;
      g[3] = 0.5f;
      EXPECT_TRUE(enc->Encode(g, 2, &out).ok()) << spec;  // the encoder is still usable
    }
  }
  auto dgc = std::move(GradientEncoder::Create("topk:0.1", 1, 16, false, 0.9f)).value();
  std::vector<float> g(16, std::numeric_limits<float>::infinity());
  std::vector<uint8_t> out;
  EXPECT_EQ(dgc->Encode(g, 0, &out).code(), StatusCode::kAborted);
}

}  // namespace
}  // namespace gradsync
