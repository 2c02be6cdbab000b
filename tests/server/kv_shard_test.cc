#include "common/ps/ps_protocol.h"
#include "server/replication/replication.h"
#include "server/shard/kv/kv_shard.h"


#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <cstdint>
#include <cmath>
#include <cstring>

namespace gradsync {
namespace {

std::vector<TensorInfo> Layout() {
  return {{"emb", {8}, 0, 8, true}, {"w", {4}, 8, 4, false}};
}

TEST(KvShardTest, ValidateRejectsOutOfRangeAndBadKeys) {
  KvShard s({4, 12}, Layout(), {}, {}, 2, false);
  std::vector<Segment> ok = {{8, 12}};
  size_t four = 4;
  EXPECT_TRUE(s.Validate(ok, {}, &four).ok());
  std::vector<Segment> outside = {{2, 6}};
  EXPECT_EQ(s.Validate(outside, {}, nullptr).code(), StatusCode::kInvalidArgument);
  std::vector<Segment> past_end = {{10, 14}};
  EXPECT_FALSE(s.Validate(past_end, {}, nullptr).ok());
  size_t three = 3;
  EXPECT_FALSE(s.Validate(ok, {}, &three).ok());
  std::vector<uint64_t> unsorted = {6, 5}, dense_key = {9}, foreign = {1};
  EXPECT_FALSE(s.Validate({}, unsorted, nullptr).ok());
  EXPECT_FALSE(s.Validate({}, dense_key, nullptr).ok());
  EXPECT_FALSE(s.Validate({}, foreign, nullptr).ok());
  std::vector<uint64_t> good = {4, 7};
  EXPECT_TRUE(s.Validate({}, good, nullptr).ok());
  // Found by fuzz_message: an offset whose sum with the length overflows (the wire decoder
  // refuses the sum, ps_protocol_test; far past the range here), a segment that ends before it
  // begins, and segments that overlap (each inside the range, together asking for more than the
  // shard holds).
  std::vector<Segment> overflow = {{INT64_MAX - 2, INT64_MAX}}, reversed = {{10, 8}};
  EXPECT_FALSE(s.Validate(overflow, {}, nullptr).ok());
  EXPECT_FALSE(s.Validate(reversed, {}, nullptr).ok());
  std::vector<Segment> twice = {{8, 12}, {8, 12}}, backwards = {{10, 12}, {8, 10}}, disjoint = {{4, 6}, {8, 12}};
  EXPECT_FALSE(s.Validate(twice, {}, nullptr).ok());
  EXPECT_FALSE(s.Validate(backwards, {}, nullptr).ok());
  EXPECT_TRUE(s.Validate(disjoint, {}, nullptr).ok());
}

TEST(KvShardTest, ValidateChecksKeysAgainstEverySparseTensorOfTheRange) {
  // Sparse [0, 8), dense [8, 12), sparse [12, 20), listed out of offset order; the shard holds
  // [2, 16): sparse elements 2..7 and 12..15.
  std::vector<TensorInfo> layout = {{"b", {8}, 12, 8, true}, {"emb", {8}, 0, 8, true}, {"w", {4}, 8, 4, false}};
  KvShard s({2, 16}, layout, {}, {}, 1, false);
  std::vector<uint64_t> both = {2, 7, 12, 15}, first = {3}, last = {15};
  EXPECT_TRUE(s.Validate({}, both, nullptr).ok());
  EXPECT_TRUE(s.Validate({}, first, nullptr).ok());
  EXPECT_TRUE(s.Validate({}, last, nullptr).ok());
  size_t five = 5;
  std::vector<Segment> dense = {{8, 12}};
  std::vector<uint64_t> one = {13};
  EXPECT_TRUE(s.Validate(dense, one, &five).ok());
  std::vector<uint64_t> in_dense = {3, 9, 13}, below = {1, 3}, above = {3, 16}, twice = {3, 3}, down = {13, 3};
  Status dense_key = s.Validate({}, in_dense, nullptr);
  EXPECT_EQ(dense_key.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(dense_key.message().find("key 9 is not in a sparse tensor"), std::string::npos) << dense_key;
  Status outside = s.Validate({}, below, nullptr);
  EXPECT_NE(outside.message().find("key 1 is outside"), std::string::npos) << outside;
  EXPECT_NE(s.Validate({}, above, nullptr).message().find("key 16 is outside"), std::string::npos);
  EXPECT_NE(s.Validate({}, twice, nullptr).message().find("not sorted and unique"), std::string::npos);
  EXPECT_NE(s.Validate({}, down, nullptr).message().find("not sorted and unique"), std::string::npos);
  // A shard with no sparse tensor takes no keys.
  KvShard dense_only({8, 12}, layout, {}, {}, 1, false);
  std::vector<uint64_t> nine = {9};
  EXPECT_NE(dense_only.Validate({}, nine, nullptr).message().find("key 9 is not in a sparse tensor"), std::string::npos);
}

TEST(KvShardTest, ApplyScalesByWorkersAndAccumulateAppliesTheMean) {
  LrSchedule lr{LrSchedule::Kind::kConstant, 0.5f, 0, 0};
  KvShard now({8, 12}, Layout(), {}, lr, 2, /*aggregate=*/false);
  KvShard bsp({8, 12}, Layout(), {}, lr, 2, /*aggregate=*/true);
  std::vector<float> init = {1, 1, 1, 1};
  now.SetValues(init);
  bsp.SetValues(init);
  std::vector<Segment> seg = {{8, 12}};
  std::vector<float> g1 = {2, 0, 4, 8}, g2 = {2, 4, 0, -8};
  now.Apply(seg, {}, g1.data());
  now.Apply(seg, {}, g2.data());
  bsp.Accumulate(seg, {}, g1.data());
  bsp.Accumulate(seg, {}, g2.data());
  bsp.ApplyAccumulated(2);
  // w - 0.5 * (g1 + g2) / 2
  std::vector<float> expect = {0, 0, 0, 1};
  for (int i = 0; i < 4; ++i) {
    EXPECT_FLOAT_EQ(now.params()[i], expect[i]) << i;
    EXPECT_FLOAT_EQ(bsp.params()[i], expect[i]) << i;
  }
  EXPECT_EQ(now.version(), 2);
  EXPECT_EQ(bsp.version(), 2);
  EXPECT_EQ(now.step(), 1);
  EXPECT_EQ(bsp.step(), 1);
}

TEST(KvShardTest, ApplyAtAScaledRate) {
  LrSchedule lr{LrSchedule::Kind::kConstant, 0.5f, 0, 0};
  KvShard s({8, 12}, Layout(), {}, lr, 1, /*aggregate=*/false);
  s.SetValues(std::vector<float>{1, 1, 1, 1});
  std::vector<Segment> seg = {{8, 12}};
  std::vector<float> g = {4, 8, -4, 0};
  s.Apply(seg, {}, g.data(), 0.25f);  // a gradient 4 versions stale, staleness-aware
  std::vector<float> expect = {0.5f, 0.0f, 1.5f, 1.0f};
  for (int i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(s.params()[i], expect[i]) << i;
}

OptimizerOptions Adam(float weight_decay) {
  OptimizerOptions o;
  o.kind = OptimizerKind::kAdam;
  o.weight_decay = weight_decay;
  return o;
}

TEST(KvShardTest, AdamInBspIsOneAdamStepPerRoundOnTheMean) {
  LrSchedule lr{LrSchedule::Kind::kConstant, 0.1f, 0, 0};
  KvShard bsp({8, 12}, Layout(), Adam(0.01f), lr, 2, /*aggregate=*/true);
  Optimizer reference(Adam(0.01f), 4);
  std::vector<float> w = {1, -1, 2, 0.5f};
  bsp.SetValues(w);
  std::vector<Segment> seg = {{8, 12}};
  std::vector<float> g1 = {2, 0, 4, 8}, g2 = {2, 4, 0, -8};
  for (int round = 0; round < 3; ++round) {
    bsp.Accumulate(seg, {}, g1.data());
    bsp.Accumulate(seg, {}, g2.data());
    bsp.ApplyAccumulated(2);
    std::vector<float> sum(4);
    for (int i = 0; i < 4; ++i) sum[i] = g1[i] + g2[i];
    reference.Step(w, sum, 0.1f, 0, 0.5f);
    reference.EndStep();
  }
  EXPECT_TRUE(std::equal(w.begin(), w.end(), bsp.params().begin()));
  EXPECT_TRUE(std::equal(reference.state().begin(), reference.state().end(), bsp.optimizer().state().begin()));
  EXPECT_EQ(bsp.optimizer().steps(), 3);
  EXPECT_EQ(bsp.version(), 6);
}

TEST(KvShardTest, AdamInSspAndAspIsOneAdamStepPerPushAtTheRateOverN) {
  // Each push: an Adam step on the gradient itself (not g / N, weight decay not divided) at
  // lr / N.
  LrSchedule lr{LrSchedule::Kind::kConstant, 0.1f, 0, 0};
  KvShard asp({8, 12}, Layout(), Adam(0.01f), lr, 2, /*aggregate=*/false);
  Optimizer reference(Adam(0.01f), 4);
  std::vector<float> w = {1, -1, 2, 0.5f};
  asp.SetValues(w);
  std::vector<Segment> seg = {{8, 12}};
  std::vector<std::vector<float>> grads = {{2, 0, 4, 8}, {2, 4, 0, -8}, {-1, 1, 0.5f, 0}};
  for (const auto& g : grads) {
    asp.Apply(seg, {}, g.data());
    reference.Step(w, g, 0.1f / 2, 0, 1.0f);
    reference.EndStep();
  }
  EXPECT_TRUE(std::equal(w.begin(), w.end(), asp.params().begin()));
  EXPECT_EQ(asp.optimizer().steps(), 3);
  EXPECT_EQ(asp.step(), 1);  // the schedule's step: gradients / N
}

TEST(KvShardTest, AdamPushInPartsIsOneStep) {
  // A push whose parts are applied with counts = false but for the last: one Adam step.
  LrSchedule lr{LrSchedule::Kind::kConstant, 0.1f, 0, 0};
  KvShard whole({8, 12}, Layout(), Adam(0), lr, 1, false), parts({8, 12}, Layout(), Adam(0), lr, 1, false);
  std::vector<float> w = {1, -1, 2, 0.5f}, g = {2, 0, 4, 8};
  whole.SetValues(w);
  parts.SetValues(w);
  for (int push = 0; push < 2; ++push) {
    whole.Apply(std::vector<Segment>{{8, 12}}, {}, g.data());
    parts.Apply(std::vector<Segment>{{10, 12}}, {}, g.data() + 2, 1.0f, /*counts=*/false);
    parts.Apply(std::vector<Segment>{{8, 10}}, {}, g.data(), 1.0f, /*counts=*/true);
  }
  EXPECT_TRUE(std::equal(whole.params().begin(), whole.params().end(), parts.params().begin()));
  EXPECT_EQ(parts.optimizer().steps(), 2);
  EXPECT_EQ(parts.version(), 2);
}

TEST(KvShardTest, APushsOwnRateReplacesTheSchedule) {
  // The schedule says 0.5; the pushes say 0.1 (times the staleness-aware 1/2 for the second).
  LrSchedule lr{LrSchedule::Kind::kConstant, 0.5f, 0, 0};
  KvShard asp({8, 12}, Layout(), {}, lr, 2, /*aggregate=*/false);
  KvShard bsp({8, 12}, Layout(), {}, lr, 2, /*aggregate=*/true);
  asp.SetValues(std::vector<float>{1, 1, 1, 1});
  bsp.SetValues(std::vector<float>{1, 1, 1, 1});
  std::vector<Segment> seg = {{8, 12}};
  std::vector<float> g = {4, 8, -4, 0};
  asp.Apply(seg, {}, g.data(), 1.0f, true, 0.1f);  // w - 0.1 * g / 2
  std::vector<float> expect = {0.8f, 0.6f, 1.2f, 1.0f};
  for (int i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(asp.params()[i], expect[i]) << i;
  asp.Apply(seg, {}, g.data(), 0.5f, true, 0.1f);  // w - 0.05 * g / 2
  expect = {0.7f, 0.4f, 1.3f, 1.0f};
  for (int i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(asp.params()[i], expect[i]) << i;
  bsp.Accumulate(seg, {}, g.data());
  bsp.ApplyAccumulated(1, 0.1f);  // w - 0.1 * g
  expect = {0.6f, 0.2f, 1.4f, 1.0f};
  for (int i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(bsp.params()[i], expect[i]) << i;
  EXPECT_EQ(bsp.step(), 1);  // the schedule's step goes on all the same
}

TEST(KvShardTest, AdamInAspTakesAPushsRateOverN) {
  LrSchedule lr{LrSchedule::Kind::kConstant, 0.5f, 0, 0};
  KvShard asp({8, 12}, Layout(), Adam(0), lr, 2, /*aggregate=*/false);
  Optimizer reference(Adam(0), 4);
  std::vector<float> w = {1, -1, 2, 0.5f}, g = {2, 0, 4, 8};
  asp.SetValues(w);
  asp.Apply(std::vector<Segment>{{8, 12}}, {}, g.data(), 1.0f, true, 0.01f);
  reference.Step(w, g, 0.01f / 2);
  EXPECT_TRUE(std::equal(w.begin(), w.end(), asp.params().begin()));
}

// LARS and LAMB on a shard: a 2x3 weight, its bias, a 3x1 weight.
std::vector<TensorInfo> Layers() {
  return {{"fc1.weight", {2, 3}, 0, 6, false}, {"fc1.bias", {3}, 6, 3, false}, {"fc2.weight", {3, 1}, 9, 3, false}};
}

OptimizerOptions LayerWise(OptimizerKind kind) {
  OptimizerOptions o;
  o.kind = kind;
  o.weight_decay = 0.01f;
  if (kind == OptimizerKind::kLars) {
    o.momentum = 0.9f;
    o.trust_coefficient = 0.02;
  }
  return o;
}

std::vector<float> Grad(int k, int n) {
  std::vector<float> g(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) g[static_cast<size_t>(i)] = std::sin(static_cast<float>(k * n + i) * 0.7f);
  return g;
}

TEST(KvShardTest, LarsAndLambInBspAreTheWorkersOptimizerOnTheMean) {
  // A shard holding whole layers, bsp: one step per round on the round's mean equals the
  // optimizer a worker runs (its layers from the same layout) on the averaged gradient.
  for (OptimizerKind kind : {OptimizerKind::kLars, OptimizerKind::kLamb}) {
    SCOPED_TRACE(OptimizerKindName(kind));
    LrSchedule lr{LrSchedule::Kind::kConstant, 0.5f, 0, 0};
    KvShard bsp({0, 12}, Layers(), LayerWise(kind), lr, 2, /*aggregate=*/true);
    Optimizer worker(LayerWise(kind), 12);
    worker.SetLayers(OptimizerLayers(Layers(), {0, 12}));
    std::vector<float> w = Grad(100, 12);
    bsp.SetValues(w);
    const std::vector<Segment> all = {{0, 12}};
    for (int round = 0; round < 4; ++round) {
      const std::vector<float> g1 = Grad(2 * round, 12), g2 = Grad(2 * round + 1, 12);
      bsp.Accumulate(all, {}, g1.data());
      bsp.Accumulate(all, {}, g2.data());
      bsp.ApplyAccumulated(2);
      std::vector<float> mean(12);
      for (int i = 0; i < 12; ++i) mean[i] = (g1[i] + g2[i]) * 0.5f;
      worker.Step(w, mean, 0.5f);
      worker.EndStep();
    }
    EXPECT_TRUE(std::equal(w.begin(), w.end(), bsp.params().begin()));
    EXPECT_TRUE(std::equal(worker.state().begin(), worker.state().end(), bsp.optimizer().state().begin()));
    EXPECT_EQ(bsp.optimizer().steps(), 4);
  }
}

TEST(KvShardTest, LarsAndLambShardsTakeTheirPartOfALayerAsTheLayer) {
  // A shard [4, 10) cuts fc1.weight and fc2.weight: its layers are their parts in it.
  for (OptimizerKind kind : {OptimizerKind::kLars, OptimizerKind::kLamb}) {
    LrSchedule lr{LrSchedule::Kind::kConstant, 0.5f, 0, 0};
    KvShard bsp({4, 10}, Layers(), LayerWise(kind), lr, 1, /*aggregate=*/true);
    Optimizer reference(LayerWise(kind), 6);
    reference.SetLayers({{0, 2, true}, {2, 5, false}, {5, 6, true}});
    std::vector<float> w = Grad(50, 6);
    bsp.SetValues(w);
    for (int round = 0; round < 3; ++round) {
      const std::vector<float> g = Grad(round, 6);
      bsp.Accumulate(std::vector<Segment>{{4, 10}}, {}, g.data());
      bsp.ApplyAccumulated(1);
      reference.Step(w, g, 0.5f, 0, 1.0f);
      reference.EndStep();
    }
    EXPECT_TRUE(std::equal(w.begin(), w.end(), bsp.params().begin())) << OptimizerKindName(kind);
  }
}

TEST(KvShardTest, LarsAndLambInAspAreOneStepPerPushAtTheRateOverN) {
  // As Adam: g itself (the trust ratio would undo g / N), weight decay undivided, rate lr / N.
  for (OptimizerKind kind : {OptimizerKind::kLars, OptimizerKind::kLamb}) {
    LrSchedule lr{LrSchedule::Kind::kConstant, 0.5f, 0, 0};
    KvShard asp({0, 12}, Layers(), LayerWise(kind), lr, 2, /*aggregate=*/false);
    Optimizer reference(LayerWise(kind), 12);
    reference.SetLayers(OptimizerLayers(Layers(), {0, 12}));
    std::vector<float> w = Grad(100, 12);
    asp.SetValues(w);
    for (int push = 0; push < 3; ++push) {
      const std::vector<float> g = Grad(push, 12);
      asp.Apply(std::vector<Segment>{{0, 12}}, {}, g.data());
      reference.Step(w, g, 0.5f / 2, 0, 1.0f);
      reference.EndStep();
    }
    EXPECT_TRUE(std::equal(w.begin(), w.end(), asp.params().begin())) << OptimizerKindName(kind);
    EXPECT_EQ(asp.optimizer().steps(), 3);
  }
}

TEST(KvShardTest, LarsAndLambPushInPartsThatCutALayerIsOneWholeLayerStep) {
  for (OptimizerKind kind : {OptimizerKind::kLars, OptimizerKind::kLamb}) {
    LrSchedule lr{LrSchedule::Kind::kConstant, 0.5f, 0, 0};
    KvShard whole({0, 12}, Layers(), LayerWise(kind), lr, 1, false), parts({0, 12}, Layers(), LayerWise(kind), lr, 1, false);
    const std::vector<float> w = Grad(100, 12);
    whole.SetValues(w);
    parts.SetValues(w);
    for (int push = 0; push < 2; ++push) {
      const std::vector<float> g = Grad(push, 12);
      whole.Apply(std::vector<Segment>{{0, 12}}, {}, g.data());
      // Parts [3, 8) and [0, 3) + [8, 12): fc1.weight in two parts, out of order.
      parts.Apply(std::vector<Segment>{{3, 8}}, {}, g.data() + 3, 1.0f, /*counts=*/false);
      std::vector<float> rest(g.begin(), g.begin() + 3);
      rest.insert(rest.end(), g.begin() + 8, g.end());
      parts.Apply(std::vector<Segment>{{0, 3}, {8, 12}}, {}, rest.data(), 1.0f, /*counts=*/true);
      EXPECT_EQ(parts.version(), push + 1);
    }
    EXPECT_TRUE(std::equal(whole.params().begin(), whole.params().end(), parts.params().begin())) << OptimizerKindName(kind);
    EXPECT_TRUE(std::equal(whole.optimizer().state().begin(), whole.optimizer().state().end(), parts.optimizer().state().begin()));
  }
}

TEST(KvShardTest, LarsAndLambOverApplyThreadsSplitAtLayersOnly) {
  // Layers far above the threads' piece size: the same bits with and without the threads, and
  // the reference (one Step call per layer) agrees, so no layer was cut.
  const int64_t a = 700000, b = 300000, c = 500000;
  const std::vector<TensorInfo> layout = {
      {"big.weight", {a}, 0, a, false}, {"x.weight", {b / 1000, 1000}, a, b, false}, {"y.weight", {c / 500, 500}, a + b, c, false}};
  // (big.weight is 1-D: it does not adapt; the others do.)
  const int64_t n = a + b + c;
  ParallelFor pool(4);
  for (OptimizerKind kind : {OptimizerKind::kLars, OptimizerKind::kLamb}) {
    LrSchedule lr{LrSchedule::Kind::kConstant, 0.5f, 0, 0};
    KvShard threaded({0, n}, layout, LayerWise(kind), lr, 1, true), alone({0, n}, layout, LayerWise(kind), lr, 1, true);
    threaded.set_parallel(&pool);
    Optimizer reference(LayerWise(kind), n);
    reference.SetLayers(OptimizerLayers(layout, {0, n}));
    std::vector<float> w = Grad(7, static_cast<int>(n));
    threaded.SetValues(w);
    alone.SetValues(w);
    const std::vector<float> g = Grad(3, static_cast<int>(n));
    for (KvShard* s : {&threaded, &alone}) {
      s->Accumulate(std::vector<Segment>{{0, n}}, {}, g.data());
      s->ApplyAccumulated(1);
    }
    for (const Segment& l : {Segment{0, a}, Segment{a, a + b}, Segment{a + b, n}}) {
      reference.Step(std::span<float>(w).subspan(l.begin, l.size()), std::span<const float>(g).subspan(l.begin, l.size()), 0.5f,
                     l.begin, 1.0f);
    }
    EXPECT_TRUE(std::equal(threaded.params().begin(), threaded.params().end(), alone.params().begin())) << OptimizerKindName(kind);
    EXPECT_TRUE(std::equal(w.begin(), w.end(), alone.params().begin())) << OptimizerKindName(kind);
  }
}

TEST(KvShardTest, AJobsShapesDecideWhichLayersAdapt) {
  // The worker sends each tensor's shape with the job; a shard built from it (server 1 of 2 here)
  // excludes the bias from LARS's trust ratios. Without shapes (an older worker) every tensor is
  // one-dimensional; a shape that does not hold the size is refused.
  wire::JobConfig job;
  int64_t offset = 0;
  for (const TensorInfo& t : Layers()) {
    auto* spec = job.add_tensors();
    spec->set_name(t.name);
    spec->set_offset(static_cast<uint64_t>(offset));
    spec->set_size(static_cast<uint64_t>(t.size));
    for (int64_t d : t.shape) spec->add_shape(d);
    offset += t.size;
  }
  job.set_num_params(12);
  job.set_num_workers(1);
  job.set_lr(0.1f);
  job.set_lr_schedule("constant");
  SetJobOptimizer(LayerWise(OptimizerKind::kLars), &job);
  auto whole = MakeShardForJob(job, 1, 0, true);
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ((*whole)->optimizer().layers(), OptimizerLayers(Layers(), {0, 12}));
  EXPECT_EQ((*whole)->optimizer().layers(), (std::vector<OptimizerLayer>{{0, 6, true}, {6, 9, false}, {9, 12, true}}));
  wire::JobConfig no_shapes = job;
  for (auto& t : *no_shapes.mutable_tensors()) t.clear_shape();
  auto flat = MakeShardForJob(no_shapes, 1, 0, true);
  ASSERT_TRUE(flat.ok()) << flat.status();
  for (const OptimizerLayer& l : (*flat)->optimizer().layers()) EXPECT_FALSE(l.adapt);
  wire::JobConfig wrong = job;
  wrong.mutable_tensors(0)->set_shape(1, 4);
  auto refused = MakeShardForJob(wrong, 1, 0, true);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("tensor 'fc1.weight': its shape does not hold its size"), std::string::npos)
      << refused.status();
  wrong.mutable_tensors(0)->set_shape(1, int64_t{1} << 40);
  EXPECT_FALSE(MakeShardForJob(wrong, 1, 0, true).ok());
}

TEST(KvShardTest, OptimizerStateSetOnAnotherShardGoesOnBitForBit) {
  // A shard given another's parameters, optimizer state and steps takes the same next steps.
  LrSchedule lr{LrSchedule::Kind::kConstant, 0.1f, 0, 0};
  OptimizerOptions sgd;
  sgd.momentum = 0.9f;
  sgd.nesterov = true;
  sgd.weight_decay = 0.01f;
  for (const OptimizerOptions& o : {sgd, Adam(0.01f)}) {
    for (bool aggregate : {true, false}) {
      KvShard a({8, 12}, Layout(), o, lr, 2, aggregate), b({8, 12}, Layout(), o, lr, 2, aggregate);
      const std::vector<Segment> seg = {{8, 12}};
      const std::vector<float> g1 = {2, 0, 4, 8}, g2 = {2, 4, 0, -8};
      auto step = [&](KvShard& s) {
        if (aggregate) {
          s.Accumulate(seg, {}, g1.data());
          s.Accumulate(seg, {}, g2.data());
          s.ApplyAccumulated(2);
        } else {
          s.Apply(seg, {}, g1.data());
          s.Apply(seg, {}, g2.data());
        }
      };
      a.SetValues(std::vector<float>{1, -1, 2, 0.5f});
      for (int i = 0; i < 3; ++i) step(a);
      ASSERT_EQ(a.optimizer().num_slots(), static_cast<int>(OptimizerSlotNames(o).size()));
      ASSERT_EQ(a.optimizer().state().size(), static_cast<size_t>(a.optimizer().num_slots()) * 4);
      b.SetValues(std::vector<float>(a.params().begin(), a.params().end()));
      const std::vector<float> state(a.optimizer().state().begin(), a.optimizer().state().end());
      ASSERT_TRUE(b.SetOptimizerState(state, a.optimizer().steps()).ok());
      EXPECT_EQ(b.optimizer().steps(), a.optimizer().steps());
      EXPECT_EQ(b.version(), 0);  // the state alone: the version and schedule step stay
      step(a);
      step(b);
      EXPECT_EQ(0, std::memcmp(a.params().data(), b.params().data(), 4 * sizeof(float))) << OptimizerKindName(o.kind);
      EXPECT_EQ(0, std::memcmp(a.optimizer().state().data(), b.optimizer().state().data(), state.size() * sizeof(float)));
    }
  }
}

TEST(KvShardTest, AnOptimizerStateThatCannotBeTheShardsIsRefusedAndChangesNothing) {
  LrSchedule lr{LrSchedule::Kind::kConstant, 0.1f, 0, 0};
  KvShard s({8, 12}, Layout(), Adam(0), lr, 1, true);
  const std::vector<float> good = {1, 2, 3, 4, 0.5f, 0.5f, 0.5f, 0.5f};
  ASSERT_TRUE(s.SetOptimizerState(good, 7).ok());
  auto refused = [&](std::vector<float> state, int64_t steps, const std::string& why) {
    Status st = s.SetOptimizerState(state, steps);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << why;
    EXPECT_NE(st.message().find(why), std::string::npos) << st;
    EXPECT_TRUE(std::equal(good.begin(), good.end(), s.optimizer().state().begin())) << why;
    EXPECT_EQ(s.optimizer().steps(), 7) << why;
  };
  refused({1, 2, 3, 4}, 7, "keeps 2 vector(s) of 4");
  refused({1, 2, 3, 4, 0.5f, 0.5f, 0.5f, 0.5f, 0}, 7, "keeps 2");
  refused({1, 2, NAN, 4, 0.5f, 0.5f, 0.5f, 0.5f}, 7, "vector 0, element 2: NaN");
  refused({1, 2, 3, 4, 0.5f, INFINITY, 0.5f, 0.5f}, 7, "vector 1, element 1: infinite");
  refused({1, 2, 3, 4, 0.5f, 0.5f, -0.5f, 0.5f}, 7, "element 2: a negative second moment");
  refused(good, -1, "out of range");
  // A negative first moment or momentum is a state like any other.
  KvShard sgd({8, 12}, Layout(), [] {
    OptimizerOptions o;
    o.momentum = 0.5f;
    return o;
  }(), lr, 1, true);
  EXPECT_TRUE(sgd.SetOptimizerState(std::vector<float>{-1, -2, 3, 4}, 2).ok());
  EXPECT_TRUE(s.SetOptimizerState(std::vector<float>{-1, -2, 3, 4, 0, 0, 0, 0}, 1).ok());
  // Plain SGD keeps no vectors: its state is the step count alone.
  KvShard plain({8, 12}, Layout(), {}, lr, 1, true);
  EXPECT_EQ(plain.optimizer().num_slots(), 0);
  EXPECT_TRUE(plain.SetOptimizerState({}, 3).ok());
  EXPECT_EQ(plain.optimizer().steps(), 3);
}

TEST(KvShardTest, OptimizerSlotsAreNamedAsTorchNamesThem) {
  OptimizerOptions o;
  EXPECT_TRUE(OptimizerSlotNames(o).empty());
  o.momentum = 0.9f;
  EXPECT_EQ(OptimizerSlotNames(o), std::vector<std::string>{"momentum_buffer"});
  o = Adam(0);
  EXPECT_EQ(OptimizerSlotNames(o), (std::vector<std::string>{"exp_avg", "exp_avg_sq"}));
  o.kind = OptimizerKind::kLamb;
  EXPECT_EQ(OptimizerSlotNames(o), (std::vector<std::string>{"exp_avg", "exp_avg_sq"}));
  o = OptimizerOptions{};
  o.kind = OptimizerKind::kLars;
  EXPECT_EQ(OptimizerSlotNames(o), std::vector<std::string>{"momentum_buffer"});
  EXPECT_EQ(Optimizer(o, 5).num_slots(), 1);
  EXPECT_EQ(Optimizer(o, 5).state().size(), 5u);
}

// A backup's copy (ReplicaStore) replays a worker's optimizer state set: its vectors, the state
// taken whole at the last; an entry out of order is refused and the copy dropped.
TEST(ReplicaStoreTest, ACopyTakesAnOptimizerStateSetWhole) {
  wire::JobConfig job;
  for (const auto& t : Layout()) {
    auto* spec = job.add_tensors();
    spec->set_name(t.name);
    spec->set_offset(static_cast<uint64_t>(t.offset));
    spec->set_size(static_cast<uint64_t>(t.size));
    spec->set_sparse(false);  // Adam: dense models only
  }
  job.set_num_params(12);
  job.set_num_workers(2);
  job.set_lr(0.1f);
  job.set_lr_schedule("constant");
  SetJobOptimizer(Adam(0), &job);
  const Segment range = {0, 12};  // one shard
  const std::string key = "0123456789abcdef";  // the job's replication key
  auto entry = [&](wire::ReplicaOp op, uint64_t index, const std::vector<float>* values) {
    Message m;
    m.peer = "primary";
    m.header.set_type(wire::REPLICATE);
    m.header.set_sender_role(wire::SERVER);
    m.header.set_sender_rank(0);
    if (op == wire::REPLICA_META) m.header.mutable_replica()->set_key(key);
    m.header.mutable_replica()->set_shard(0);
    m.header.mutable_replica()->set_op(op);
    m.header.mutable_replica()->set_index(index);
    m.header.set_request_id(index);
    if (values) {
      auto* seg = m.header.add_segments();
      seg->set_offset(static_cast<uint64_t>(range.begin));
      seg->set_length(static_cast<uint64_t>(range.size()));
      m.header.set_has_values(true);
      m.values = Frame::Copy(values->data(), values->size() * sizeof(float));
    }
    return m;
  };
  auto snapshot = [&](ReplicaStore& store) {
    wire::ShardCheckpoint meta;
    meta.set_rank(0);
    *meta.mutable_job() = job;
    meta.set_begin(0);
    meta.set_end(12);
    meta.set_optimizer("adam");
    Message m = entry(wire::REPLICA_META, 0, nullptr);
    m.header.mutable_replica()->set_meta(meta.SerializeAsString());
    ASSERT_TRUE(store.Apply(m).ok());
    const std::vector<float> zeros(12, 0.0f);
    ASSERT_TRUE(store.Apply(entry(wire::REPLICA_PARAMS, 1, &zeros)).ok());
    for (int k = 0; k < 2; ++k) {
      Message st = entry(wire::REPLICA_STATE, static_cast<uint64_t>(2 + k), &zeros);
      st.header.mutable_replica()->set_part(k);
      ASSERT_TRUE(store.Apply(st).ok());
    }
    ASSERT_TRUE(store.Complete(0));
  };
  auto state_entry = [&](int k, uint64_t index, const std::vector<float>& values, int slots = 2) {
    Message m = entry(wire::REPLICA_OPTIMIZER, index, &values);
    m.header.mutable_replica()->set_part(k);
    m.header.mutable_replica()->mutable_state()->set_optimizer("adam");
    m.header.mutable_replica()->mutable_state()->set_steps(9);
    m.header.mutable_replica()->mutable_state()->set_slots(slots);
    return m;
  };
  const std::vector<float> m(12, 0.25f), v(12, 0.75f);

  ReplicaStore store(1, ConsistencyMode::kBsp, 0, key);
  snapshot(store);
  ASSERT_TRUE(store.Apply(state_entry(0, 4, m)).ok());
  ASSERT_TRUE(store.Apply(state_entry(1, 5, v)).ok());
  auto copy = store.Take(0);
  ASSERT_TRUE(copy.ok()) << copy.status();
  EXPECT_EQ(copy->checkpoint.optimizer_steps(), 9);
  std::vector<float> state(24);
  ASSERT_EQ(copy->checkpoint.optimizer_state().size(), state.size() * sizeof(float));
  std::memcpy(state.data(), copy->checkpoint.optimizer_state().data(), state.size() * sizeof(float));
  for (size_t i = 0; i < 12; ++i) {
    EXPECT_EQ(state[i], 0.25f);
    EXPECT_EQ(state[12 + i], 0.75f);
  }

  // Vector 1 before vector 0, a count of vectors that is not the shard's, a bad value: refused,
  // and the copy is no longer whole (the primary sends a new snapshot).
  for (int bad = 0; bad < 3; ++bad) {
    ReplicaStore s2(1, ConsistencyMode::kBsp, 0, key);
    snapshot(s2);
    Status st;
    if (bad == 0) st = s2.Apply(state_entry(1, 4, v));
    if (bad == 1) st = s2.Apply(state_entry(0, 4, m, 1));
    if (bad == 2) {
      ASSERT_TRUE(s2.Apply(state_entry(0, 4, m)).ok());
      std::vector<float> negative = v;
      negative[3] = -1.0f;
      st = s2.Apply(state_entry(1, 5, negative));
    }
    EXPECT_FALSE(st.ok()) << bad;
    EXPECT_FALSE(s2.Complete(0)) << bad;
  }

  // Only the primary writes the copy: a snapshot needs the job's key and the shard's own rank,
  // and every other entry must come on the connection the snapshot came on. A stranger's
  // entries (no key, a wrong one, another rank's, another connection's: next in order,
  // replayed, out of order) are refused and leave the copy whole and as it was; the primary
  // goes on after them.
  ReplicaStore s3(1, ConsistencyMode::kBsp, 0, key);
  snapshot(s3);
  ASSERT_TRUE(s3.Apply(state_entry(0, 4, m)).ok());
  ASSERT_TRUE(s3.Apply(state_entry(1, 5, v)).ok());
  const std::vector<float> before(s3.params(0).begin(), s3.params(0).end());
  const std::vector<float> ones(12, 1.0f);
  auto stranger_meta = [&](const std::string& k, int sender_rank) {
    Message meta = entry(wire::REPLICA_META, 0, nullptr);
    meta.peer = "stranger";
    wire::ShardCheckpoint c;
    c.set_rank(0);
    *c.mutable_job() = job;
    c.set_begin(0);
    c.set_end(12);
    meta.header.mutable_replica()->set_meta(c.SerializeAsString());
    meta.header.mutable_replica()->set_key(k);
    meta.header.set_sender_rank(sender_rank);
    return meta;
  };
  std::vector<std::function<Message()>> hostile;
  for (const std::string& k : {std::string(), std::string("fedcba9876543210"), key.substr(0, 8)}) {
    hostile.push_back([&, k] { return stranger_meta(k, 0); });
  }
  hostile.push_back([&] { return stranger_meta(key, 1); });  // the key, but not the shard's primary
  for (uint64_t index : {6u, 1u, 5u, 100u}) {  // next in order, replayed, replayed, out of order
    hostile.push_back([&, index] {
      Message e = entry(wire::REPLICA_PARAMS, index, &ones);
      e.peer = "stranger";
      return e;
    });
    hostile.push_back([&, index] {
      Message e = state_entry(0, index, ones);
      e.peer = "";
      return e;
    });
  }
  for (const auto& make : hostile) {
    Status st = s3.Apply(make());
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.code(), StatusCode::kPermissionDenied) << st;
    ASSERT_TRUE(s3.Complete(0)) << st;
    ASSERT_EQ(std::vector<float>(s3.params(0).begin(), s3.params(0).end()), before) << st;
  }
  {
    // With the key, from the shard's rank, but no snapshot in it: refused, the copy kept.
    Message bad = stranger_meta(key, 0);
    bad.header.mutable_replica()->set_meta("\x08");
    EXPECT_FALSE(s3.Apply(std::move(bad)).ok());
    ASSERT_TRUE(s3.Complete(0));
    ASSERT_EQ(std::vector<float>(s3.params(0).begin(), s3.params(0).end()), before);
  }
  EXPECT_TRUE(s3.Apply(state_entry(0, 6, m)).ok()) << "the primary goes on where it was";
  EXPECT_TRUE(s3.Apply(state_entry(1, 7, v)).ok());
  // The primary's own out-of-order entry is a gap (it resends a snapshot), not an attack.
  Status gap = s3.Apply(state_entry(0, 9, m));
  EXPECT_EQ(gap.code(), StatusCode::kFailedPrecondition) << gap;
}

TEST(KvShardTest, SparseKeysAndRead) {
  LrSchedule lr{LrSchedule::Kind::kConstant, 1.0f, 0, 0};
  KvShard s({0, 12}, Layout(), {}, lr, 1, true);
  std::vector<float> init(12, 0.0f);
  s.SetValues(init);
  std::vector<uint64_t> keys = {3, 6};
  std::vector<float> g = {1, 2};
  s.Accumulate({}, keys, g.data());
  s.ApplyAccumulated(1);
  std::vector<float> out(2);
  s.Read({}, keys, out.data());
  EXPECT_FLOAT_EQ(out[0], -1);
  EXPECT_FLOAT_EQ(out[1], -2);
  EXPECT_FLOAT_EQ(s.params()[0], 0);
}

}  // namespace
}  // namespace gradsync

namespace gradsync {
namespace {

// Large dense updates split over threads (--apply-threads) give the very bits of one thread:
// SGD with momentum and Adam, a push's Apply and a bsp round's ApplyAccumulated.
TEST(KvShardTest, ApplyOverThreadsIsBitForBitOneThread) {
  const int64_t n = (int64_t{1} << 20) + 3;  // large enough to be split, and not evenly
  const std::vector<TensorInfo> layout = {{"w", {n}, 0, n, false}};
  for (OptimizerKind kind : {OptimizerKind::kSgd, OptimizerKind::kAdam}) {
    OptimizerOptions opt;
    opt.kind = kind;
    opt.momentum = kind == OptimizerKind::kSgd ? 0.9f : 0.0f;
    opt.weight_decay = 1e-4f;
    LrSchedule lr;
    lr.base = 0.01f;
    ParallelFor pool(3);
    for (bool aggregate : {false, true}) {
      KvShard one({0, n}, layout, opt, lr, 2, aggregate), many({0, n}, layout, opt, lr, 2, aggregate);
      many.set_parallel(&pool);
      std::vector<float> init(static_cast<size_t>(n)), grad(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) {
        init[static_cast<size_t>(i)] = std::sin(static_cast<float>(i)) * 0.1f;
        grad[static_cast<size_t>(i)] = std::cos(static_cast<float>(i) * 0.7f);
      }
      one.SetValues(init);
      many.SetValues(init);
      const std::vector<Segment> all = {{0, n}};
      for (int step = 0; step < 3; ++step) {
        for (KvShard* s : {&one, &many}) {
          if (aggregate) {
            s->Accumulate(all, {}, grad.data());
            s->Accumulate(all, {}, init.data());
            s->ApplyAccumulated(2);
          } else {
            s->Apply(all, {}, grad.data());
          }
        }
      }
      ASSERT_EQ(one.params().size(), many.params().size());
      EXPECT_EQ(0, std::memcmp(one.params().data(), many.params().data(), one.params().size() * sizeof(float)))
          << OptimizerKindName(kind) << (aggregate ? " bsp" : " asp");
      EXPECT_EQ(0, std::memcmp(one.optimizer().state().data(), many.optimizer().state().data(),
                               one.optimizer().state().size() * sizeof(float)));
    }
  }
}


// Three dense tensors a [0, 4), b [4, 8), c [8, 12); the shard holds [2, 12).
std::vector<TensorInfo> ThreeDense() {
  return {{"a", {2, 2}, 0, 4, false}, {"b", {2, 2}, 4, 4, false}, {"c", {2, 2}, 8, 4, false}};
}

OptimizerOptions MomentumDecay() {
  OptimizerOptions o;
  o.momentum = 0.9f;
  o.weight_decay = 0.1f;
  return o;
}

TEST(KvShardAbsentTest, ValidateAbsentNamesDenseTensorsThePushReaches) {
  KvShard s({2, 12}, ThreeDense(), {}, {}, 1, false);
  const std::vector<Segment> all = {{2, 12}}, first_two = {{2, 8}};
  const std::vector<uint32_t> b = {1}, ac = {0, 2}, c = {2}, beyond = {3}, unsorted = {2, 1};
  EXPECT_TRUE(s.Validate(all, {}, nullptr, b).ok());
  EXPECT_TRUE(s.Validate(all, {}, nullptr, ac).ok());
  EXPECT_FALSE(s.Validate(first_two, {}, nullptr, c).ok());  // c is not in the push
  EXPECT_FALSE(s.Validate(all, {}, nullptr, beyond).ok());
  EXPECT_FALSE(s.Validate(all, {}, nullptr, unsorted).ok());
  KvShard sparse({4, 12}, Layout(), {}, {}, 1, false);
  const std::vector<uint32_t> emb = {0};
  const std::vector<Segment> w = {{8, 12}};
  EXPECT_FALSE(sparse.Validate(w, {}, nullptr, emb).ok());  // sparse tensors say what they have by key
}

TEST(KvShardAbsentTest, ApplyLeavesAnAbsentTensorAndItsMomentumAlone) {
  KvShard s({2, 12}, ThreeDense(), MomentumDecay(), {}, 1, false);
  KvShard whole({2, 12}, ThreeDense(), MomentumDecay(), {}, 1, false);
  std::vector<float> init(10);
  for (int i = 0; i < 10; ++i) init[i] = 0.5f + 0.1f * static_cast<float>(i);
  s.SetValues(init);
  whole.SetValues(init);
  const std::vector<Segment> all = {{2, 12}};
  const std::vector<float> g(10, 1.0f);
  const std::vector<uint32_t> b = {1};
  s.Apply(all, {}, g.data(), 1.0f, true, NAN, b);
  whole.Apply(all, {}, g.data());
  // b ([4, 8): local 2..5) is untouched, parameters and momentum; a's and c's parts are as without.
  for (int i = 0; i < 10; ++i) {
    const bool in_b = i >= 2 && i < 6;
    EXPECT_EQ(s.params()[i], in_b ? init[i] : whole.params()[i]) << i;
    EXPECT_EQ(s.optimizer().state()[i], in_b ? 0.0f : whole.optimizer().state()[i]) << i;
  }
  EXPECT_EQ(s.version(), 1);  // the push counts
}

TEST(KvShardAbsentTest, ARoundSkipsOnlyWhatNoPushHasAGradientFor) {
  // bsp, 2 workers: worker 0 has no gradient for b, worker 1 none for b or c. b skips the step;
  // c gets the mean of worker 0's gradient and worker 1's zero; a the mean of both.
  KvShard s({0, 12}, ThreeDense(), MomentumDecay(), {}, 2, true);
  KvShard dense({0, 12}, ThreeDense(), MomentumDecay(), {}, 2, true);
  std::vector<float> init(12, 1.0f);
  s.SetValues(init);
  dense.SetValues(init);
  const std::vector<Segment> all = {{0, 12}};
  std::vector<float> g0(12, 2.0f), g1(12, 4.0f), g1_dense = g1;
  std::fill(g1_dense.begin() + 8, g1_dense.end(), 0.0f);  // c: worker 1's zero
  const std::vector<uint32_t> b = {1}, bc = {1, 2};
  s.Accumulate(all, {}, g0.data(), b);
  s.Accumulate(all, {}, g1.data(), bc);
  s.ApplyAccumulated(2);
  dense.Accumulate(all, {}, g0.data());
  dense.Accumulate(all, {}, g1_dense.data());
  dense.ApplyAccumulated(2);
  for (int i = 0; i < 12; ++i) {
    const bool in_b = i >= 4 && i < 8;
    EXPECT_EQ(s.params()[i], in_b ? 1.0f : dense.params()[i]) << i;
    EXPECT_EQ(s.optimizer().state()[i], in_b ? 0.0f : dense.optimizer().state()[i]) << i;
  }
  // The next round, with every gradient: b's first step now (momentum from zero).
  s.Accumulate(all, {}, g0.data());
  s.ApplyAccumulated(1);
  EXPECT_FLOAT_EQ(s.optimizer().state()[4], 2.0f + 0.1f * 1.0f);
}

TEST(KvShardAbsentTest, AdamCountsEachTensorsOwnSteps) {
  // Adam: b is absent from the first of two pushes. Its update in the second is Adam's first
  // step (t = 1), as a fresh shard's; a takes two steps. The skipped steps survive a restore.
  OptimizerOptions adam;
  adam.kind = OptimizerKind::kAdam;
  KvShard s({0, 12}, ThreeDense(), adam, {}, 1, false);
  KvShard fresh({0, 12}, ThreeDense(), adam, {}, 1, false);
  const std::vector<float> init(12, 1.0f);
  s.SetValues(init);
  fresh.SetValues(init);
  const std::vector<Segment> all = {{0, 12}}, just_b = {{4, 8}};
  std::vector<float> g(12);
  for (int i = 0; i < 12; ++i) g[i] = 0.1f * static_cast<float>(i + 1);
  const std::vector<uint32_t> b = {1};
  s.Apply(all, {}, g.data(), 1.0f, true, 0.01f, b);
  EXPECT_EQ(s.optimizer().steps(), 1);
  ASSERT_EQ(s.optimizer().skipped().size(), 3u);
  EXPECT_EQ(s.optimizer().skipped()[1], 1);
  EXPECT_EQ(s.optimizer().skipped()[0], 0);
  s.Apply(all, {}, g.data(), 1.0f, true, 0.01f);
  fresh.Apply(just_b, {}, g.data() + 4, 1.0f, true, 0.01f);
  for (int i = 4; i < 8; ++i) EXPECT_EQ(s.params()[i], fresh.params()[i]) << i;
  // A restored copy carries the counts, and so the same next step.
  KvShard copy({0, 12}, ThreeDense(), adam, {}, 1, false);
  const std::vector<float> params(s.params().begin(), s.params().end());
  const std::vector<float> state(s.optimizer().state().begin(), s.optimizer().state().end());
  const std::vector<int64_t> skipped(s.optimizer().skipped().begin(), s.optimizer().skipped().end());
  ASSERT_TRUE(copy.Restore(params, state, s.optimizer().steps(), s.version(), s.step(), s.gradients(), skipped).ok());
  s.Apply(all, {}, g.data(), 1.0f, true, 0.01f);
  copy.Apply(all, {}, g.data(), 1.0f, true, 0.01f);
  for (int i = 0; i < 12; ++i) EXPECT_EQ(s.params()[i], copy.params()[i]) << i;
  // Counts no shard could hold are refused.
  const std::vector<int64_t> too_many = {0, 9, 0}, wrong_size = {0, 1};
  EXPECT_FALSE(copy.SetOptimizerState(state, 2, too_many).ok());
  EXPECT_FALSE(copy.SetOptimizerState(state, 2, wrong_size).ok());
}

}  // namespace
}  // namespace gradsync

namespace gradsync {
namespace {

// What a message of table rows may name on a shard (ShardTables::Validate, MakeRoom). Mutations
// caught: an unknown table let through, a values count not checked against the tables' dims,
// ids not checked per run, a bsp room check that forgets the rows of pushes already held.
TEST(ShardTablesTest, ValidateRefusesRowsThatDoNotFitAndRoomCountsHeldPushes) {
  TableSpec a, b;
  a.name = "a";
  a.dim = 2;
  a.max_rows_per_shard = 3;
  b.name = "b";
  b.dim = 5;
  b.num_ids = 10;
  ShardTables tables({a, b}, 0, 1, 2);
  const std::vector<TableRun> runs = {{0, 2}, {1, 1}};
  const std::vector<uint64_t> ids = {7, 8, 9};
  size_t n = 2 * 2 + 5;
  EXPECT_TRUE(tables.Validate(runs, ids, &n).ok());
  size_t wrong = 8;
  EXPECT_EQ(tables.Validate(runs, ids, &wrong).code(), StatusCode::kInvalidArgument);
  const std::vector<TableRun> unknown = {{2, 3}};
  EXPECT_NE(tables.Validate(unknown, ids, nullptr).message().find("not one of the job's 2 tables"), std::string::npos);
  const std::vector<uint64_t> past = {7, 8, 10};
  EXPECT_NE(tables.Validate(runs, past, nullptr).message().find("table 'b'"), std::string::npos);
  // bsp: two held pushes of 2 new rows each in table a (bound 3): the second does not fit.
  const std::vector<TableRun> two = {{0, 2}};
  const std::vector<uint64_t> first = {1, 2}, second = {3, 4};
  EXPECT_TRUE(tables.MakeRoom(two, first, true).ok());
  EXPECT_EQ(tables.MakeRoom(two, second, true).code(), StatusCode::kResourceExhausted);
  const std::vector<uint64_t> same = {1, 2};
  EXPECT_TRUE(tables.MakeRoom(two, same, true).ok());  // rows the round already creates cost nothing
}

}  // namespace
}  // namespace gradsync
