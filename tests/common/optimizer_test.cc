#include "common/optimizer.h"

#include <gtest/gtest.h>

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
