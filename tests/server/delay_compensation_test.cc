// Delay-compensated ASGD on a shard (server/shard/transform/delay_compensation.h): the correction's
// formula (constant and adaptive lambda), what it keeps and its memory, and a ShardCore with it:
// lambda 0 applies exactly what asp applies, bit for bit, over the same pulls and pushes; a
// positive lambda applies the corrected gradient, and announces it corrected (what a backup
// replays).
#include "server/shard/transform/delay_compensation.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "common/base/numeric/rng.h"
#include "server/shard/shard_core.h"

namespace gradsync {
namespace {

TEST(DelayCompensationTest, CorrectsByLambdaTimesTheSquaredGradientTimesTheDrift) {
  const Segment range{100, 106};
  DelayCompensationOptions o;
  o.lambda = 0.5f;
  DelayCompensation dc(o, range, 2);
  const std::vector<float> pulled = {1, 2, 3, 4, 5, 6};
  const std::vector<Segment> all = {range};
  dc.Pulled(1, all, pulled);
  const std::vector<float> now = {1.5f, 2, 2, 4.25f, 5, 7};
  // A push of elements 101..104 only.
  const std::vector<Segment> part = {{101, 105}};
  const std::vector<float> g = {0.1f, -2, 3, 0};
  std::vector<float> out(4);
  ASSERT_TRUE(dc.Correct(1, part, g.data(), now, out.data()));
  for (size_t i = 0; i < 4; ++i) {
    const float drift = now[i + 1] - pulled[i + 1];
    EXPECT_EQ(out[i], g[i] + 0.5f * g[i] * g[i] * drift) << i;
  }
  EXPECT_EQ(out[0], 0.1f);  // element 101 did not move: as it came
  EXPECT_EQ(out[1], -4.0f);  // 102 moved by -1: -2 + 0.5 * 4 * -1
  EXPECT_EQ(out[2], 4.125f);  // 103 moved by 0.25: 3 + 0.5 * 9 * 0.25
  // The corrections (0, -2, 1.125, 0) over the gradients (0.1, -2, 3, 0), root mean squares.
  EXPECT_NEAR(dc.relative_correction(), std::sqrt((4 + 1.125 * 1.125) / (0.01 + 4 + 9)), 1e-6);
  // Worker 0 never pulled: its push goes as it came.
  ASSERT_FALSE(dc.Correct(0, part, g.data(), now, out.data()));
  EXPECT_EQ(out, g);
  // ... and is not in the relative correction.
  EXPECT_NEAR(dc.relative_correction(), std::sqrt((4 + 1.125 * 1.125) / (0.01 + 4 + 9)), 1e-6);
  // What it keeps: one copy of the range for the worker that pulled.
  EXPECT_EQ(dc.bytes(), 6 * sizeof(float));
  dc.Pulled(0, part, now);
  EXPECT_EQ(dc.bytes(), 2 * 6 * sizeof(float));
}

TEST(DelayCompensationTest, TheAdaptiveLambdaIsLambdaOverTheRootMeanSquare) {
  const Segment range{0, 3};
  DelayCompensationOptions o;
  o.lambda = 0.2f;
  o.adaptive = true;
  DelayCompensation dc(o, range, 1);
  const std::vector<Segment> all = {range};
  const std::vector<float> pulled = {0, 0, 0};
  dc.Pulled(0, all, pulled);
  const std::vector<float> now = {1, -1, 0.5f};
  std::vector<float> ms = {0, 0, 0};
  std::vector<float> out(3);
  for (const std::vector<float>& g : {std::vector<float>{1, 2, -3}, std::vector<float>{0.5f, 0, 1}}) {
    ASSERT_TRUE(dc.Correct(0, all, g.data(), now, out.data()));
    for (size_t i = 0; i < 3; ++i) {
      ms[i] = 0.95f * ms[i] + (1 - 0.95f) * g[i] * g[i];
      const float lambda = 0.2f / std::sqrt(ms[i] + 1e-7f);
      EXPECT_EQ(out[i], g[i] + lambda * g[i] * g[i] * now[i]) << i;
    }
  }
  EXPECT_EQ(dc.bytes(), 2 * 3 * sizeof(float));  // the worker's pull and the mean square
  EXPECT_GT(dc.relative_correction(), 0);
}

// A job of one shard holding all of a 40-float dense model, asp, 2 workers, plain SGD.
wire::JobConfig Job(bool compensate, float lambda) {
  wire::JobConfig job;
  auto* t = job.add_tensors();
  t->set_name("w");
  t->set_offset(0);
  t->set_size(40);
  job.set_num_params(40);
  job.set_num_workers(2);
  job.set_lr(0.1f);
  job.set_lr_schedule("constant");
  if (compensate) job.set_delay_compensation(lambda);
  return job;
}

// Records what the core announces: each push's values as announced.
class Announced final : public ShardEvents {
 public:
  void Pushed(const ShardCore&, int, const HeldPush& push, float) override {
    for (const PushChunk& c : push.chunks) values.insert(values.end(), c.values(), c.values() + 40);
  }
  void RoundApplied(const ShardCore&, const ShardCore::Round&) override {}
  void MembershipChanged(const ShardCore&, int) override {}
  void OptimizerSet(const ShardCore&, int) override {}
  void ParamsSet(const ShardCore&, int) override {}
  std::vector<float> values;
};

// The same script of pulls and pushes on a core: worker 1 pulls, worker 0 pushes twice (moving
// the parameters), then worker 1 pushes a gradient computed on what it pulled. Returns the
// parameters after each push.
std::vector<std::vector<float>> Script(ShardCore& core, const std::vector<std::vector<float>>& grads) {
  std::vector<float> init(40);
  for (size_t i = 0; i < init.size(); ++i) init[i] = 0.01f * static_cast<float>(i) - 0.2f;
  core.shard().SetValues(init);
  const std::vector<Segment> all = {{0, 40}};
  std::vector<std::vector<float>> after;
  int64_t clock[2] = {0, 0};
  auto push = [&](int w, const std::vector<float>& g) {
    PsRequest r;
    r.type = wire::PUSH;
    r.worker = w;
    r.clock = clock[w]++;
    r.push.version = 0;
    r.segments = all;
    PushChunk chunk;
    chunk.segments = all;
    chunk.owned = g;
    auto held = core.Accept(r, std::move(chunk), 0);
    ASSERT_TRUE(held.ok()) << held.status();
    ASSERT_NE(*held, nullptr);
    core.Take(w, std::move(**held), 0);
    after.emplace_back(core.shard().params().begin(), core.shard().params().end());
  };
  core.Pulled(1, all);
  core.Pulled(0, all);
  push(0, grads[0]);
  core.Pulled(0, all);
  push(0, grads[1]);
  push(1, grads[2]);
  return after;
}

std::vector<std::vector<float>> Gradients() {
  Rng rng(7);
  std::vector<std::vector<float>> g(3, std::vector<float>(40));
  for (auto& v : g)
    for (float& x : v) x = rng.Uniform(-3.0f, 3.0f);
  return g;
}

TEST(DelayCompensationTest, LambdaZeroAppliesWhatAspAppliesBitForBit) {
  const auto grads = Gradients();
  ShardCore plain(ConsistencyMode::kAsp, 0, 2), zero(ConsistencyMode::kAsp, 0, 2);
  ASSERT_TRUE(plain.Build(Job(false, 0), 1, 0).ok());
  ASSERT_TRUE(zero.Build(Job(true, 0), 1, 0).ok());
  ASSERT_EQ(AsDelayCompensation(plain.transform()), nullptr);
  ASSERT_NE(AsDelayCompensation(zero.transform()), nullptr);
  const auto a = Script(plain, grads), b = Script(zero, grads);
  ASSERT_EQ(a.size(), 3u);
  for (size_t k = 0; k < a.size(); ++k) EXPECT_EQ(0, std::memcmp(a[k].data(), b[k].data(), 40 * sizeof(float))) << k;
  EXPECT_EQ(AsDelayCompensation(zero.transform())->corrected(), 3);  // pushes
  EXPECT_EQ(AsDelayCompensation(zero.transform())->uncorrected(), 0);
}

TEST(DelayCompensationTest, AStalePushIsAppliedCorrectedAndAnnouncedCorrected) {
  const auto grads = Gradients();
  Announced announced;
  ShardCore plain(ConsistencyMode::kAsp, 0, 2), dc(ConsistencyMode::kAsp, 0, 2, 1, &announced);
  ASSERT_TRUE(plain.Build(Job(false, 0), 1, 0).ok());
  ASSERT_TRUE(dc.Build(Job(true, 0.3f), 1, 0).ok());
  const auto a = Script(plain, grads), b = Script(dc, grads);
  // Worker 0's pushes came right after its pulls: nothing to correct, the same bits.
  EXPECT_EQ(a[0], b[0]);
  EXPECT_EQ(a[1], b[1]);
  // Worker 1's gradient was computed two updates ago: w -= lr * g' / N with
  // g' = g + 0.3 g g (w_now - w_pulled).
  std::vector<float> init(40);
  for (size_t i = 0; i < init.size(); ++i) init[i] = 0.01f * static_cast<float>(i) - 0.2f;
  double moved = 0;
  for (size_t i = 0; i < 40; ++i) {
    const float g = grads[2][i];
    const float corrected = g + 0.3f * g * g * (b[1][i] - init[i]);
    EXPECT_FLOAT_EQ(b[2][i], b[1][i] - 0.1f * (corrected / 2)) << i;
    EXPECT_EQ(announced.values[80 + i], corrected) << i;
    moved += std::abs(b[2][i] - a[2][i]);
  }
  EXPECT_GT(moved, 1e-3);
  // A restored or rebuilt core keeps none of it: the next push of a worker that has not pulled
  // again goes uncorrected.
  ASSERT_TRUE(dc.Build(Job(true, 0.3f), 1, 0).ok());
  EXPECT_EQ(AsDelayCompensation(dc.transform())->bytes(), 0u);
}

TEST(DelayCompensationTest, AJobWithItOnASparseModelOrANegativeLambdaIsRefused) {
  ShardCore core(ConsistencyMode::kAsp, 0, 2);
  EXPECT_EQ(core.Build(Job(true, -1), 1, 0).code(), StatusCode::kInvalidArgument);
  wire::JobConfig sparse = Job(true, 0.1f);
  sparse.mutable_tensors(0)->set_sparse(true);
  EXPECT_EQ(core.Build(sparse, 1, 0).code(), StatusCode::kInvalidArgument);
  // bsp holds rounds: there is nothing stale to correct, and nothing is kept.
  ShardCore bsp(ConsistencyMode::kBsp, 0, 2);
  ASSERT_TRUE(bsp.Build(Job(true, 0.1f), 1, 0).ok());
  EXPECT_EQ(AsDelayCompensation(bsp.transform()), nullptr);
}

}  // namespace
}  // namespace gradsync
