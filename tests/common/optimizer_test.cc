#include "common/optimizer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <sstream>
#include <vector>

namespace gradsync {
namespace {

// Reference: PyTorch's torch.optim.SGD update, written out in double for 3 parameters.
std::vector<double> Reference(const OptimizerOptions& o, std::vector<double> w,
                              const std::vector<std::vector<double>>& grads, double lr) {
  std::vector<double> buf(w.size(), 0.0);
  for (const auto& g : grads) {
    for (size_t i = 0; i < w.size(); ++i) {
      double gi = g[i] + o.weight_decay * w[i];
      if (o.momentum > 0) {
        buf[i] = o.momentum * buf[i] + gi;
        gi = o.nesterov ? gi + o.momentum * buf[i] : buf[i];
      }
      w[i] -= lr * gi;
    }
  }
  return w;
}

class OptimizerRuleTest : public ::testing::TestWithParam<OptimizerOptions> {};

TEST_P(OptimizerRuleTest, MatchesPyTorchRule) {
  const OptimizerOptions o = GetParam();
  std::vector<std::vector<double>> grads = {{0.5, -1.0, 2.0}, {0.25, 0.5, -1.5}, {1.0, 0.0, 0.75}};
  std::vector<float> w = {1.0f, -2.0f, 0.5f};
  Optimizer opt(o, 3);
  for (const auto& g : grads) {
    std::vector<float> gf(g.begin(), g.end());
    opt.Step(w, gf, 0.1f);
  }
  auto ref = Reference(o, {1.0, -2.0, 0.5}, grads, 0.1);
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(w[i], ref[i], 1e-6) << i;
}

INSTANTIATE_TEST_SUITE_P(
    Rules, OptimizerRuleTest,
    ::testing::Values(OptimizerOptions{0.0f, false, 0.0f}, OptimizerOptions{0.0f, false, 0.01f},
                      OptimizerOptions{0.9f, false, 0.0f}, OptimizerOptions{0.9f, true, 0.0f},
                      OptimizerOptions{0.5f, true, 0.05f}),
    [](const ::testing::TestParamInfo<OptimizerOptions>& p) {
      const OptimizerOptions& o = p.param;
      std::ostringstream name;
      name << (o.momentum == 0 ? "Sgd" : o.nesterov ? "Nesterov" : "Momentum")
           << (o.weight_decay > 0 ? "WeightDecay" : "") << p.index;
      return name.str();
    });

TEST(OptimizerTest, RangeStepsUseTheirOwnState) {
  OptimizerOptions o{0.9f, false, 0.0f};
  Optimizer whole(o, 4), split(o, 4);
  std::vector<float> a = {1, 2, 3, 4}, b = a, g = {0.1f, 0.2f, 0.3f, 0.4f};
  for (int step = 0; step < 3; ++step) {
    whole.Step(a, g, 0.5f);
    split.Step(std::span(b).subspan(0, 2), std::span<const float>(g).subspan(0, 2), 0.5f, 0);
    split.Step(std::span(b).subspan(2, 2), std::span<const float>(g).subspan(2, 2), 0.5f, 2);
  }
  EXPECT_EQ(a, b);
}

TEST(OptimizerTest, SparseStepIsLazyPerKey) {
  OptimizerOptions o{0.5f, false, 0.0f};
  Optimizer opt(o, 8);
  std::vector<float> w(8, 1.0f);
  std::vector<uint64_t> keys = {1, 6};
  std::vector<float> g = {1.0f, -2.0f};
  opt.StepSparse(w, keys, g, 0.1f);
  EXPECT_FLOAT_EQ(w[1], 0.9f);
  EXPECT_FLOAT_EQ(w[6], 1.2f);
  opt.StepSparse(w, std::vector<uint64_t>{1}, std::vector<float>{1.0f}, 0.1f);
  EXPECT_FLOAT_EQ(w[1], 0.9f - 0.1f * 1.5f);  // buf = 0.5 * 1 + 1
  EXPECT_FLOAT_EQ(w[6], 1.2f);                  // untouched key: momentum not advanced
  EXPECT_FLOAT_EQ(w[0], 1.0f);
}

TEST(OptimizerTest, Validation) {
  EXPECT_TRUE(ValidateOptimizerOptions({0.9f, true, 1e-4f}).ok());
  EXPECT_EQ(ValidateOptimizerOptions({0.0f, true, 0.0f}).code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(ValidateOptimizerOptions({-0.1f, false, 0.0f}).ok());
  EXPECT_FALSE(ValidateOptimizerOptions({1.0f, false, 0.0f}).ok());
  EXPECT_FALSE(ValidateOptimizerOptions({0.0f, false, -1.0f}).ok());
  EXPECT_FALSE(ValidateOptimizerOptions({NAN, false, 0.0f}).ok());
}

// Reference: torch.optim.Adam's update written out in double (beta^t, the bias corrections and
// every element-wise operation), for 3 parameters.
std::vector<double> AdamReference(const OptimizerOptions& o, std::vector<double> w,
                                  const std::vector<std::vector<double>>& grads, double lr) {
  std::vector<double> m(w.size(), 0.0), v(w.size(), 0.0);
  int t = 0;
  for (const auto& g : grads) {
    ++t;
    const double bias1 = 1 - std::pow(o.beta1, t), bias2 = 1 - std::pow(o.beta2, t);
    for (size_t i = 0; i < w.size(); ++i) {
      const double gi = g[i] + o.weight_decay * w[i];
      m[i] = o.beta1 * m[i] + (1 - o.beta1) * gi;
      v[i] = o.beta2 * v[i] + (1 - o.beta2) * gi * gi;
      w[i] -= lr / bias1 * m[i] / (std::sqrt(v[i]) / std::sqrt(bias2) + o.eps);
    }
  }
  return w;
}

OptimizerOptions Adam(float weight_decay = 0.0f) {
  OptimizerOptions o;
  o.kind = OptimizerKind::kAdam;
  o.weight_decay = weight_decay;
  return o;
}

const std::vector<std::vector<double>> kAdamGrads = {
    {0.5, -1.0, 2.0}, {0.25, 0.5, -1.5}, {1.0, 0.0, 0.75}, {-0.3, 0.2, 0.1}, {2.0, -4.0, 0.01}};

// Runs `o` over kAdamGrads from {1, -2, 0.5}, one Step and EndStep per gradient.
std::vector<float> RunAdam(const OptimizerOptions& o, float lr) {
  std::vector<float> w = {1.0f, -2.0f, 0.5f};
  Optimizer opt(o, 3);
  for (const auto& g : kAdamGrads) {
    std::vector<float> gf(g.begin(), g.end());
    opt.Step(w, gf, lr);
    opt.EndStep();
  }
  EXPECT_EQ(opt.steps(), static_cast<int64_t>(kAdamGrads.size()));
  return w;
}

TEST(AdamTest, TheFirstStepMovesEachWeightByTheRateAgainstItsGradientsSign) {
  // t = 1: m / bias1 = g and sqrt(v / bias2) = |g|, so w -= lr * g / (|g| + eps).
  Optimizer opt(Adam(), 3);
  std::vector<float> w = {1.0f, -2.0f, 0.5f}, g = {0.5f, -1.0f, 0.0f};
  opt.Step(w, g, 0.1f);
  EXPECT_FLOAT_EQ(w[0], 0.9f);
  EXPECT_FLOAT_EQ(w[1], -1.9f);
  EXPECT_EQ(w[2], 0.5f);  // a zero gradient: m = 0, the weight stays
  ASSERT_EQ(opt.state().size(), 6u);  // m then v
  EXPECT_FLOAT_EQ(opt.state()[0], 0.05f);        // (1 - beta1) g
  EXPECT_FLOAT_EQ(opt.state()[3], 0.001f * 0.25f);  // (1 - beta2) g^2
}

TEST(AdamTest, MatchesTheDoublePrecisionReference) {
  const std::vector<float> w = RunAdam(Adam(), 0.01f);
  const auto ref = AdamReference(Adam(), {1.0, -2.0, 0.5}, kAdamGrads, 0.01);
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(w[i], ref[i], 1e-6) << i;
}

TEST(AdamTest, WeightDecayIsL2OnTheGradient) {
  const std::vector<float> w = RunAdam(Adam(0.1f), 0.01f);
  const auto ref = AdamReference(Adam(0.1f), {1.0, -2.0, 0.5}, kAdamGrads, 0.01);
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(w[i], ref[i], 1e-6) << i;
  // Not AdamW (decoupled decay): L2 changes the moments, so the weights differ from Adam's.
  EXPECT_GT(std::abs(w[0] - RunAdam(Adam(), 0.01f)[0]), 1e-5);
}

TEST(AdamTest, OtherBetasAndEps) {
  OptimizerOptions o = Adam();
  o.beta1 = 0.5;
  o.beta2 = 0.9;
  o.eps = 0.1;
  const std::vector<float> w = RunAdam(o, 0.05f);
  const auto ref = AdamReference(o, {1.0, -2.0, 0.5}, kAdamGrads, 0.05);
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(w[i], ref[i], 1e-6) << i;
}

TEST(AdamTest, AStepInSeveralRangesIsOneStep) {
  // A shard applies a push segment by segment: the same t for every range until EndStep.
  Optimizer whole(Adam(), 4), split(Adam(), 4);
  std::vector<float> a = {1, 2, 3, 4}, b = a, g = {0.1f, -0.2f, 0.3f, 0.4f};
  for (int step = 0; step < 3; ++step) {
    whole.Step(a, g, 0.5f);
    whole.EndStep();
    split.Step(std::span(b).subspan(2, 2), std::span<const float>(g).subspan(2, 2), 0.5f, 2);
    split.Step(std::span(b).subspan(0, 2), std::span<const float>(g).subspan(0, 2), 0.5f, 0);
    split.EndStep();
  }
  EXPECT_EQ(a, b);
  EXPECT_TRUE(std::equal(whole.state().begin(), whole.state().end(), split.state().begin()));
}

TEST(AdamTest, AScaledGradientIsTheGradientScaled) {
  Optimizer scaled(Adam(0.01f), 3), plain(Adam(0.01f), 3);
  std::vector<float> a = {1, -2, 3}, b = a, g = {0.5f, 1.5f, -2.0f}, half = {0.25f, 0.75f, -1.0f};
  for (int step = 0; step < 3; ++step) {
    scaled.Step(a, g, 0.1f, 0, 0.5f);
    scaled.EndStep();
    plain.Step(b, half, 0.1f);
    plain.EndStep();
  }
  EXPECT_EQ(a, b);
}

TEST(AdamTest, StateAndStepCountRoundTrip) {
  // A checkpoint's m, v and t put into a fresh optimizer: it goes on bit for bit.
  Optimizer first(Adam(0.01f), 3);
  std::vector<float> w = {1.0f, -2.0f, 0.5f};
  for (int step = 0; step < 3; ++step) {
    std::vector<float> g(kAdamGrads[step].begin(), kAdamGrads[step].end());
    first.Step(w, g, 0.01f);
    first.EndStep();
  }
  Optimizer restored(Adam(0.01f), 3);
  restored.SetState(first.state());
  restored.set_steps(first.steps());
  std::vector<float> w2 = w;
  for (size_t step = 3; step < kAdamGrads.size(); ++step) {
    std::vector<float> g(kAdamGrads[step].begin(), kAdamGrads[step].end());
    first.Step(w, g, 0.01f);
    first.EndStep();
    restored.Step(w2, g, 0.01f);
    restored.EndStep();
  }
  EXPECT_EQ(w, w2);
  EXPECT_EQ(restored.steps(), 5);
  // Without t the bias corrections restart, and the weights differ.
  Optimizer no_step(Adam(0.01f), 3);
  no_step.SetState(restored.state());
  std::vector<float> w3 = w, w4 = w, g = {1.0f, 1.0f, 1.0f};
  restored.Step(w3, g, 0.01f);
  no_step.Step(w4, g, 0.01f);
  EXPECT_NE(w3, w4);
}

TEST(AdamTest, Validation) {
  EXPECT_TRUE(ValidateOptimizerOptions(Adam(1e-4f)).ok());
  auto with = [](auto change) {
    OptimizerOptions o = Adam();
    change(o);
    return ValidateOptimizerOptions(o).code();
  };
  EXPECT_EQ(with([](OptimizerOptions& o) { o.beta1 = 0.0; }), StatusCode::kOk);
  EXPECT_EQ(with([](OptimizerOptions& o) { o.beta1 = 1.0; }), StatusCode::kInvalidArgument);
  EXPECT_EQ(with([](OptimizerOptions& o) { o.beta2 = -0.1; }), StatusCode::kInvalidArgument);
  EXPECT_EQ(with([](OptimizerOptions& o) { o.beta2 = NAN; }), StatusCode::kInvalidArgument);
  EXPECT_EQ(with([](OptimizerOptions& o) { o.eps = 0.0; }), StatusCode::kInvalidArgument);
  EXPECT_EQ(with([](OptimizerOptions& o) { o.eps = INFINITY; }), StatusCode::kInvalidArgument);
  EXPECT_EQ(with([](OptimizerOptions& o) { o.momentum = 0.9f; }), StatusCode::kInvalidArgument);
  EXPECT_EQ(with([](OptimizerOptions& o) { o.nesterov = true; }), StatusCode::kInvalidArgument);
  EXPECT_EQ(with([](OptimizerOptions& o) { o.weight_decay = -1.0f; }), StatusCode::kInvalidArgument);
  EXPECT_EQ(*ParseOptimizerKind("adam"), OptimizerKind::kAdam);
  EXPECT_EQ(*ParseOptimizerKind("sgd"), OptimizerKind::kSgd);
  EXPECT_EQ(ParseOptimizerKind("Adam").status().code(), StatusCode::kInvalidArgument);
  EXPECT_STREQ(OptimizerKindName(OptimizerKind::kAdam), "adam");
}

TEST(LrScheduleTest, ConstantAndCosine) {
  LrSchedule c{LrSchedule::Kind::kConstant, 0.1f, 100, 0.0f};
  EXPECT_FLOAT_EQ(c.At(0), 0.1f);
  EXPECT_FLOAT_EQ(c.At(1000), 0.1f);
  LrSchedule cos{LrSchedule::Kind::kCosine, 0.1f, 100, 0.0f};
  EXPECT_FLOAT_EQ(cos.At(0), 0.1f);
  EXPECT_NEAR(cos.At(50), 0.05f, 1e-7);
  EXPECT_NEAR(cos.At(100), 0.0f, 1e-9);
  for (int s = 1; s <= 100; ++s) EXPECT_LE(cos.At(s), cos.At(s - 1));
  EXPECT_FALSE(ParseLrScheduleKind("linear").ok());
}

TEST(LrScheduleTest, LinearWarmUpThenTheSchedule) {
  LrSchedule w{LrSchedule::Kind::kCosine, 0.8f, 110, 0.0f, 10, 0.1f};
  EXPECT_FLOAT_EQ(w.At(0), 0.1f);
  EXPECT_FLOAT_EQ(w.At(5), 0.45f);  // halfway from 0.1 to 0.8
  for (int s = 1; s <= 10; ++s) EXPECT_GT(w.At(s), w.At(s - 1));
  EXPECT_FLOAT_EQ(w.At(10), 0.8f);  // the cosine starts where the warm-up ends
  EXPECT_NEAR(w.At(60), 0.4f, 1e-6);
  EXPECT_NEAR(w.At(110), 0.0f, 1e-9);
  LrSchedule c{LrSchedule::Kind::kConstant, 0.8f, 0, 0.0f, 4, 0.2f};
  EXPECT_FLOAT_EQ(c.At(2), 0.5f);
  EXPECT_FLOAT_EQ(c.At(4), 0.8f);
  EXPECT_FLOAT_EQ(c.At(400), 0.8f);
}

}  // namespace
}  // namespace gradsync
