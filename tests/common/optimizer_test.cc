#include "common/optim/optimizer.h"

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

// LARS and LAMB: a small model of three tensors (a 2x3 weight, its bias of 3, a 3x1 weight), a
// double-precision reference of each paper's rule, per layer.
std::vector<TensorInfo> ThreeLayers() {
  return {{"fc1.weight", {2, 3}, 0, 6, false}, {"fc1.bias", {3}, 6, 3, false}, {"fc2.weight", {3, 1}, 9, 3, false}};
}
const std::vector<float> kLayerW = {0.5f, -1.0f, 0.25f, 2.0f, -0.5f, 1.5f, 0.1f, -0.2f, 0.3f, 1.0f, -2.0f, 0.75f};
const std::vector<std::vector<double>> kLayerGrads = {
    {0.2, -0.1, 0.4, 0.05, -0.3, 0.1, 0.5, -0.25, 0.125, -0.6, 0.2, 0.9},
    {-0.1, 0.3, 0.2, -0.05, 0.1, 0.4, -0.5, 0.25, 0.0, 0.3, -0.1, -0.2},
    {0.05, 0.05, -0.2, 0.3, 0.2, -0.1, 0.1, 0.1, 0.1, -0.4, 0.6, 0.1},
    {0.3, -0.2, 0.1, 0.1, -0.1, 0.2, 0.2, -0.3, 0.4, 0.2, 0.3, -0.5}};

OptimizerOptions Lars(float momentum, float weight_decay, double eta) {
  OptimizerOptions o;
  o.kind = OptimizerKind::kLars;
  o.momentum = momentum;
  o.weight_decay = weight_decay;
  o.trust_coefficient = eta;
  return o;
}

OptimizerOptions Lamb(float weight_decay, double eps = 1e-6) {
  OptimizerOptions o;
  o.kind = OptimizerKind::kLamb;
  o.weight_decay = weight_decay;
  o.eps = eps;
  return o;
}

double Norm(const std::vector<double>& x, size_t b, size_t e) {
  double s = 0;
  for (size_t i = b; i < e; ++i) s += x[i] * x[i];
  return std::sqrt(s);
}

// You et al. 2017 with momentum, in double: per layer g' = g + wd w, trust = eta ||w|| / (||g|| +
// wd ||w||), b = mu b + lr trust g', w -= b; a layer that does not adapt: trust 1, no decay.
std::vector<double> LarsReference(const OptimizerOptions& o, const std::vector<OptimizerLayer>& layers, std::vector<double> w,
                                  const std::vector<std::vector<double>>& grads, double lr) {
  std::vector<double> b(w.size(), 0.0);
  for (const auto& g : grads) {
    for (const OptimizerLayer& l : layers) {
      const double wd = l.adapt ? o.weight_decay : 0.0;
      const double wn = Norm(w, l.begin, l.end), gn = Norm(g, l.begin, l.end);
      const double trust = l.adapt && wn > 0 && gn > 0 ? o.trust_coefficient * wn / (gn + wd * wn) : 1.0;
      for (auto i = static_cast<size_t>(l.begin); i < static_cast<size_t>(l.end); ++i) {
        b[i] = o.momentum * b[i] + lr * trust * (g[i] + wd * w[i]);
        w[i] -= b[i];
      }
    }
  }
  return w;
}

// You et al. 2019, Algorithm 2, in double.
std::vector<double> LambReference(const OptimizerOptions& o, const std::vector<OptimizerLayer>& layers, std::vector<double> w,
                                  const std::vector<std::vector<double>>& grads, double lr) {
  std::vector<double> m(w.size(), 0.0), v(w.size(), 0.0), r(w.size(), 0.0);
  int t = 0;
  for (const auto& g : grads) {
    ++t;
    for (const OptimizerLayer& l : layers) {
      const double wd = l.adapt ? o.weight_decay : 0.0;
      for (auto i = static_cast<size_t>(l.begin); i < static_cast<size_t>(l.end); ++i) {
        m[i] = o.beta1 * m[i] + (1 - o.beta1) * g[i];
        v[i] = o.beta2 * v[i] + (1 - o.beta2) * g[i] * g[i];
        const double mh = m[i] / (1 - std::pow(o.beta1, t)), vh = v[i] / (1 - std::pow(o.beta2, t));
        r[i] = mh / (std::sqrt(vh) + o.eps) + wd * w[i];
      }
      const double wn = Norm(w, l.begin, l.end), rn = Norm(r, l.begin, l.end);
      const double trust = l.adapt && wn > 0 && rn > 0 ? wn / rn : 1.0;
      for (auto i = static_cast<size_t>(l.begin); i < static_cast<size_t>(l.end); ++i) w[i] -= lr * trust * r[i];
    }
  }
  return w;
}

// The optimizer over the three layers, one Step call for the whole range per step.
std::vector<float> RunLayered(const OptimizerOptions& o, float lr, Optimizer* out = nullptr) {
  Optimizer opt(o, 12);
  opt.SetLayers(OptimizerLayers(ThreeLayers(), {0, 12}));
  std::vector<float> w = kLayerW;
  for (const auto& g : kLayerGrads) {
    std::vector<float> gf(g.begin(), g.end());
    opt.Step(w, gf, lr);
    opt.EndStep();
  }
  if (out != nullptr) {
    out->SetState(opt.state());
    out->set_steps(opt.steps());
  }
  return w;
}

void ExpectNearReference(const std::vector<float>& w, const std::vector<double>& ref, double tol) {
  ASSERT_EQ(w.size(), ref.size());
  for (size_t i = 0; i < w.size(); ++i) EXPECT_NEAR(w[i], ref[i], tol) << i;
}

TEST(OptimizerLayersTest, PerTensorStepsAndARangesSkippedStepsConvertBothWays) {
  // Tensors a [0, 4), b [4, 8), c [8, 12); a range [2, 10) holds part of each.
  const std::vector<TensorInfo> layout = {{"a", {4}, 0, 4, false}, {"b", {4}, 4, 4, false}, {"c", {4}, 8, 4, false}};
  const std::vector<int64_t> steps = {5, 2, 5};
  const std::vector<int64_t> skipped = SkippedSteps(layout, {2, 10}, 5, steps);
  EXPECT_EQ(skipped, (std::vector<int64_t>{0, 3, 0}));
  EXPECT_TRUE(SkippedSteps(layout, {2, 10}, 5, std::vector<int64_t>{5, 5, 5}).empty());
  EXPECT_TRUE(SkippedSteps(layout, {2, 10}, 5, {}).empty());
  std::vector<int64_t> back;
  ASSERT_TRUE(TensorSteps(layout, {2, 10}, 5, skipped, &back).ok());
  EXPECT_EQ(back, steps);
  std::vector<int64_t> none;
  ASSERT_TRUE(TensorSteps(layout, {2, 10}, 5, {}, &none).ok());
  EXPECT_TRUE(none.empty());
  EXPECT_EQ(TensorSteps(layout, {2, 10}, 5, std::vector<int64_t>{1, 2}, &back).code(), StatusCode::kDataLoss);
}

TEST(OptimizerLayersTest, EachTensorCutToTheRangeBiasesAndVectorsExcluded) {
  const auto layout = ThreeLayers();
  EXPECT_EQ(OptimizerLayers(layout, {0, 12}),
            (std::vector<OptimizerLayer>{{0, 6, true}, {6, 9, false}, {9, 12, true}}));
  // A shard [4, 10): the end of fc1.weight, the bias, the start of fc2.weight, in its coordinates.
  EXPECT_EQ(OptimizerLayers(layout, {4, 10}), (std::vector<OptimizerLayer>{{0, 2, true}, {2, 5, false}, {5, 6, true}}));
  EXPECT_EQ(OptimizerLayers(layout, {7, 8}), (std::vector<OptimizerLayer>{{0, 1, false}}));
  // A 1-D tensor not named a bias (a norm's scale), and a sparse one, do not adapt either.
  std::vector<TensorInfo> other = {{"ln.scale", {4}, 0, 4, false}, {"emb", {2, 2}, 4, 4, true}, {"w", {2, 2}, 8, 4, false}};
  EXPECT_EQ(OptimizerLayers(other, {0, 12}),
            (std::vector<OptimizerLayer>{{0, 4, false}, {4, 8, false}, {8, 12, true}}));
  EXPECT_TRUE(OptimizerLayers(layout, {5, 5}).empty());
  // Listed out of offset order, with a gap: sorted, the gap a layer of its own, still a cover.
  std::vector<TensorInfo> shuffled = {{"b.weight", {2, 2}, 8, 4, false}, {"a.weight", {2, 2}, 0, 4, false}};
  EXPECT_EQ(OptimizerLayers(shuffled, {2, 12}),
            (std::vector<OptimizerLayer>{{0, 2, true}, {2, 6, false}, {6, 10, true}}));
}

TEST(LarsTest, MatchesTheDoublePrecisionReference) {
  const auto layers = OptimizerLayers(ThreeLayers(), {0, 12});
  const std::vector<double> w0(kLayerW.begin(), kLayerW.end());
  for (const OptimizerOptions& o : {Lars(0.9f, 0.0f, 0.02), Lars(0.9f, 0.01f, 0.02), Lars(0.0f, 0.05f, 0.1)}) {
    SCOPED_TRACE(testing::Message() << "momentum " << o.momentum << " wd " << o.weight_decay);
    ExpectNearReference(RunLayered(o, 2.0f), LarsReference(o, layers, w0, kLayerGrads, 2.0), 2e-6);
  }
}

TEST(LarsTest, EachLayerMovesByItsOwnTrustRatioAndBiasesBySgd) {
  // First step, no momentum history, no decay: an adapting layer moves by lr * eta * ||w|| in
  // norm whatever its gradient's scale; the bias by lr * g.
  Optimizer opt(Lars(0.9f, 0.0f, 0.01), 12);
  opt.SetLayers(OptimizerLayers(ThreeLayers(), {0, 12}));
  std::vector<float> w = kLayerW, g(kLayerGrads[0].begin(), kLayerGrads[0].end());
  for (int i = 9; i < 12; ++i) g[i] *= 1000.0f;  // fc2's gradient 1000 times larger: the same step
  opt.Step(w, g, 1.0f);
  auto moved = [&](size_t b, size_t e) {
    double s = 0, n = 0;
    for (size_t i = b; i < e; ++i) {
      s += (double(kLayerW[i]) - w[i]) * (double(kLayerW[i]) - w[i]);
      n += double(kLayerW[i]) * kLayerW[i];
    }
    return std::sqrt(s) / std::sqrt(n);  // relative to ||w||
  };
  EXPECT_NEAR(moved(0, 6), 0.01, 1e-6);
  EXPECT_NEAR(moved(9, 12), 0.01, 1e-6);
  for (int i = 6; i < 9; ++i) EXPECT_FLOAT_EQ(w[i], kLayerW[i] - g[i]) << i;
}

TEST(LarsTest, ZeroNormsTakeTrustOne) {
  Optimizer opt(Lars(0.0f, 0.0f, 0.001), 12);
  opt.SetLayers(OptimizerLayers(ThreeLayers(), {0, 12}));
  std::vector<float> w = kLayerW, g(kLayerGrads[0].begin(), kLayerGrads[0].end());
  std::fill(w.begin(), w.begin() + 6, 0.0f);   // ||w|| = 0: plain SGD at lr
  std::fill(g.begin() + 9, g.end(), 0.0f);     // ||g|| = 0: trust 1, nothing to apply
  opt.Step(w, g, 0.5f);
  for (int i = 0; i < 6; ++i) EXPECT_FLOAT_EQ(w[i], -0.5f * g[i]) << i;
  for (int i = 9; i < 12; ++i) EXPECT_EQ(w[i], kLayerW[i]) << i;
  for (float x : w) EXPECT_TRUE(std::isfinite(x));
}

TEST(LambTest, MatchesTheDoublePrecisionReference) {
  const auto layers = OptimizerLayers(ThreeLayers(), {0, 12});
  const std::vector<double> w0(kLayerW.begin(), kLayerW.end());
  for (const OptimizerOptions& o : {Lamb(0.0f), Lamb(0.01f), Lamb(0.1f, 1e-8)}) {
    SCOPED_TRACE(testing::Message() << "wd " << o.weight_decay << " eps " << o.eps);
    ExpectNearReference(RunLayered(o, 0.05f), LambReference(o, layers, w0, kLayerGrads, 0.05), 2e-6);
  }
}

TEST(LambTest, TheFirstStepMovesEachLayerByTheRateTimesItsNorm) {
  // t = 1, no decay: r = g / (|g| + eps), about sign(g), so an adapting layer moves by lr * ||w||
  // (trust = ||w|| / ||r||); the bias, excluded, by lr * sign(g).
  Optimizer opt(Lamb(0.0f, 1e-12), 12);
  opt.SetLayers(OptimizerLayers(ThreeLayers(), {0, 12}));
  std::vector<float> w = kLayerW, g(kLayerGrads[0].begin(), kLayerGrads[0].end());
  opt.Step(w, g, 0.1f);
  double moved = 0, norm = 0;
  for (int i = 0; i < 6; ++i) {
    moved += (double(kLayerW[i]) - w[i]) * (double(kLayerW[i]) - w[i]);
    norm += double(kLayerW[i]) * kLayerW[i];
  }
  EXPECT_NEAR(std::sqrt(moved), 0.1 * std::sqrt(norm), 1e-6);
  for (int i = 6; i < 9; ++i) EXPECT_NEAR(w[i], kLayerW[i] - 0.1f * (g[i] > 0 ? 1 : -1), 1e-6) << i;
  ASSERT_EQ(opt.state().size(), 24u);  // m then v
  EXPECT_FLOAT_EQ(opt.state()[0], 0.1f * 0.2f);
  EXPECT_FLOAT_EQ(opt.state()[12], 0.001f * 0.04f);
}

TEST(LambTest, ZeroNormsTakeTrustOne) {
  Optimizer opt(Lamb(0.0f), 12);
  opt.SetLayers(OptimizerLayers(ThreeLayers(), {0, 12}));
  std::vector<float> w = kLayerW, g(kLayerGrads[0].begin(), kLayerGrads[0].end());
  std::fill(w.begin(), w.begin() + 6, 0.0f);  // ||w|| = 0: trust 1, the Adam-like step r
  std::fill(g.begin() + 9, g.end(), 0.0f);    // ||r|| = 0 (no decay): nothing moves
  opt.Step(w, g, 0.1f);
  for (int i = 0; i < 6; ++i) EXPECT_NEAR(w[i], -0.1 * g[i] / (std::abs(g[i]) + 1e-6), 1e-6) << i;
  for (int i = 9; i < 12; ++i) EXPECT_EQ(w[i], kLayerW[i]) << i;
}

TEST(LayerWiseTest, AStepSplitAtALayerBoundaryIsOneStepAndInsideALayerIsNot) {
  for (const OptimizerOptions& o : {Lars(0.9f, 0.01f, 0.02), Lamb(0.01f)}) {
    SCOPED_TRACE(OptimizerKindName(o.kind));
    Optimizer whole(o, 12), split(o, 12), cut(o, 12);
    for (Optimizer* opt : {&whole, &split, &cut}) opt->SetLayers(OptimizerLayers(ThreeLayers(), {0, 12}));
    std::vector<float> a = kLayerW, b = a, c = a;
    for (const auto& gd : kLayerGrads) {
      std::vector<float> g(gd.begin(), gd.end());
      const std::span<const float> gs(g);
      whole.Step(a, g, 0.5f);
      whole.EndStep();
      split.Step(std::span(b).subspan(9, 3), gs.subspan(9, 3), 0.5f, 9);  // in any order
      split.Step(std::span(b).subspan(0, 9), gs.subspan(0, 9), 0.5f, 0);
      split.EndStep();
      cut.Step(std::span(c).subspan(0, 3), gs.subspan(0, 3), 0.5f, 0);  // fc1.weight in two calls
      cut.Step(std::span(c).subspan(3, 9), gs.subspan(3, 9), 0.5f, 3);
      cut.EndStep();
    }
    EXPECT_EQ(a, b);
    EXPECT_TRUE(std::equal(whole.state().begin(), whole.state().end(), split.state().begin()));
    EXPECT_NE(std::vector<float>(a.begin(), a.begin() + 6), std::vector<float>(c.begin(), c.begin() + 6));
    EXPECT_TRUE(std::equal(a.begin() + 6, a.end(), c.begin() + 6));  // the other layers alike
  }
}

TEST(LayerWiseTest, WithoutLayersTheRangeIsOneAdaptingLayer) {
  OptimizerOptions o = Lars(0.0f, 0.0f, 0.1);
  Optimizer opt(o, 4);
  std::vector<float> w = {3, 0, 0, 4}, g = {0, 1, 0, 0};  // ||w|| = 5, ||g|| = 1
  opt.Step(w, g, 1.0f);
  EXPECT_FLOAT_EQ(w[1], -0.5f);
  EXPECT_EQ(opt.layers(), (std::vector<OptimizerLayer>{{0, 4, true}}));
}

TEST(LayerWiseTest, StateAndStepCountRoundTrip) {
  for (const OptimizerOptions& o : {Lars(0.9f, 0.01f, 0.02), Lamb(0.01f)}) {
    SCOPED_TRACE(OptimizerKindName(o.kind));
    Optimizer restored(o, 12);
    restored.SetLayers(OptimizerLayers(ThreeLayers(), {0, 12}));
    Optimizer first(o, 12);
    first.SetLayers(OptimizerLayers(ThreeLayers(), {0, 12}));
    std::vector<float> w = RunLayered(o, 0.5f, &restored), w2 = w;
    // `first` brought to the same point, then both go on with the same gradients.
    std::vector<float> w1 = kLayerW;
    for (const auto& gd : kLayerGrads) {
      std::vector<float> g(gd.begin(), gd.end());
      first.Step(w1, g, 0.5f);
      first.EndStep();
    }
    EXPECT_EQ(w1, w);
    EXPECT_EQ(restored.state().size(), o.kind == OptimizerKind::kLars ? 12u : 24u);
    EXPECT_EQ(restored.steps(), 4);
    for (const auto& gd : kLayerGrads) {
      std::vector<float> g(gd.begin(), gd.end());
      first.Step(w1, g, 0.5f);
      first.EndStep();
      restored.Step(w2, g, 0.5f);
      restored.EndStep();
    }
    EXPECT_EQ(w1, w2);
  }
}

TEST(LayerWiseTest, AScaledGradientIsTheGradientScaled) {
  for (const OptimizerOptions& o : {Lars(0.9f, 0.01f, 0.02), Lamb(0.01f)}) {
    Optimizer scaled(o, 3), plain(o, 3);
    std::vector<float> a = {1, -2, 3}, b = a, g = {0.5f, 1.5f, -2.0f}, half = {0.25f, 0.75f, -1.0f};
    for (int step = 0; step < 3; ++step) {
      scaled.Step(a, g, 0.1f, 0, 0.5f);
      scaled.EndStep();
      plain.Step(b, half, 0.1f);
      plain.EndStep();
    }
    EXPECT_EQ(a, b) << OptimizerKindName(o.kind);
  }
}

TEST(LayerWiseTest, Validation) {
  EXPECT_TRUE(ValidateOptimizerOptions(Lars(0.9f, 1e-4f, 0.001)).ok());
  EXPECT_TRUE(ValidateOptimizerOptions(Lars(0.0f, 0.0f, 0.001)).ok());
  EXPECT_TRUE(ValidateOptimizerOptions(Lamb(0.01f)).ok());
  OptimizerOptions o = Lars(0.9f, 0.0f, 0.001);
  o.nesterov = true;
  EXPECT_EQ(ValidateOptimizerOptions(o).code(), StatusCode::kInvalidArgument);
  for (double eta : {0.0, -0.1, double(NAN), double(INFINITY)}) {
    EXPECT_EQ(ValidateOptimizerOptions(Lars(0.9f, 0.0f, eta)).code(), StatusCode::kInvalidArgument) << eta;
  }
  o = Lamb(0.0f);
  o.momentum = 0.9f;
  EXPECT_EQ(ValidateOptimizerOptions(o).code(), StatusCode::kInvalidArgument);
  o = Lamb(0.0f);
  o.beta2 = 1.0;
  EXPECT_EQ(ValidateOptimizerOptions(o).code(), StatusCode::kInvalidArgument);
  o = Lamb(0.0f, 0.0);
  EXPECT_NE(ValidateOptimizerOptions(o).message().find("lamb eps must be > 0"), std::string::npos);
  for (OptimizerKind k : {OptimizerKind::kSgd, OptimizerKind::kAdam, OptimizerKind::kLars, OptimizerKind::kLamb}) {
    EXPECT_EQ(*ParseOptimizerKind(OptimizerKindName(k)), k);
  }
  EXPECT_FALSE(IsLayerWise(OptimizerKind::kAdam));
  EXPECT_TRUE(IsLayerWise(OptimizerKind::kLamb));
  EXPECT_NE(ParseOptimizerKind("LARS").status().message().find("sgd, adam, lars or lamb"), std::string::npos);
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
  EXPECT_FALSE(ParseLrScheduleKind("step").ok());
  // Linear: after a warm-up of 10 steps, a straight line from the base to 0 at step 110.
  LrSchedule lin{LrSchedule::Kind::kLinear, 0.8f, 110, 0.0f, 10, 0.0f};
  EXPECT_FLOAT_EQ(lin.At(10), 0.8f);
  EXPECT_NEAR(lin.At(35), 0.6f, 1e-6);
  EXPECT_NEAR(lin.At(60), 0.4f, 1e-6);
  EXPECT_NEAR(lin.At(110), 0.0f, 1e-9);
  for (auto k : {LrSchedule::Kind::kConstant, LrSchedule::Kind::kCosine, LrSchedule::Kind::kLinear}) {
    EXPECT_EQ(*ParseLrScheduleKind(LrScheduleKindName(k)), k);
  }
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
