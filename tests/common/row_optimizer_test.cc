// The row optimizers (common/optim/row_optimizer.h) and the table rules every process shares
// (common/table/table_spec.h). Mutations each test catches, by name:
//   SgdStepIsLrTimesScaledGradient: a grad_scale ignored or applied twice.
//   RowwiseAdagradKeepsOneAccumulatorPerRow: a per-element accumulator, the sum instead of the mean
//     of g^2, eps inside the sqrt, the accumulator updated after the step.
//   LazyAdamCountsStepsPerRow: a global t, bias corrections dropped or with t - 1, beta1/beta2
//   swapped. CheckStateRefusesWhatNoRowCouldHold / ValidateRefusesBadOptions / ParseRoundTrips: a
//   check dropped. InitRowIsAPureFunctionOfSeedAndId: init drawing from a sequential stream
//   (order-dependent),
//     the seed or the id ignored, normal's scale ignored, uniform outside [-a, a].
//   TableShardOfSpreadsIdsEvenly: shard = id % shards (consecutive Zipf heads all on one shard is
//     fine then, but a stride of shards is not), a shard index out of range.
//   CheckTableIdsRefusesWithOneLine: unsorted, duplicate, past-the-end or negative ids let through,
//     a message that does not name the table.
#include "common/optim/row_optimizer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "common/table/table_spec.h"

namespace gradsync {
namespace {

TEST(RowOptimizerTest, SgdStepIsLrTimesScaledGradient) {
  RowOptimizer opt({}, 3);
  EXPECT_EQ(opt.state_floats(), 0);
  EXPECT_FALSE(opt.counts_steps());
  std::vector<float> w = {1.0f, 2.0f, 3.0f}, g = {0.5f, -1.0f, 2.0f};
  opt.Step(w.data(), nullptr, nullptr, g.data(), 0.1f, 0.5f);
  EXPECT_FLOAT_EQ(w[0], 1.0f - 0.1f * 0.25f);
  EXPECT_FLOAT_EQ(w[1], 2.0f + 0.1f * 0.5f);
  EXPECT_FLOAT_EQ(w[2], 3.0f - 0.1f * 1.0f);
}

TEST(RowOptimizerTest, RowwiseAdagradKeepsOneAccumulatorPerRow) {
  RowOptimizerOptions o;
  o.kind = RowOptimizerKind::kAdagrad;
  o.eps = 1e-3;
  o.initial_accumulator = 0.1f;
  RowOptimizer opt(o, 2);
  ASSERT_EQ(opt.state_floats(), 1);
  float state = -1.0f;
  opt.InitState(&state);
  EXPECT_FLOAT_EQ(state, 0.1f);
  std::vector<double> ref = {1.0, -1.0};
  std::vector<float> w = {1.0f, -1.0f};
  double acc = 0.1;
  for (const auto& g : std::vector<std::vector<float>>{{3.0f, 4.0f}, {-1.0f, 0.0f}}) {
    opt.Step(w.data(), &state, nullptr, g.data(), 0.5f);
    acc += (double{g[0]} * g[0] + double{g[1]} * g[1]) / 2.0;
    for (int j = 0; j < 2; ++j) ref[j] -= 0.5 * g[j] / (std::sqrt(acc) + 1e-3);
  }
  EXPECT_NEAR(state, acc, 1e-5);
  EXPECT_NEAR(w[0], ref[0], 1e-5);
  EXPECT_NEAR(w[1], ref[1], 1e-5);
}

TEST(RowOptimizerTest, LazyAdamCountsStepsPerRow) {
  RowOptimizerOptions o;
  o.kind = RowOptimizerKind::kAdam;
  RowOptimizer opt(o, 2);
  ASSERT_EQ(opt.state_floats(), 4);
  ASSERT_TRUE(opt.counts_steps());
  // Row a steps three times, row b once: b's one step is a first step (t = 1) whenever it comes.
  std::vector<float> a = {1.0f, 1.0f}, b = {1.0f, 1.0f}, sa(4), sb(4);
  opt.InitState(sa.data());
  opt.InitState(sb.data());
  int64_t ta = 0, tb = 0;
  double m[2] = {0, 0}, v[2] = {0, 0}, ref[2] = {1.0, 1.0};
  const std::vector<std::vector<float>> grads = {{0.5f, -2.0f}, {1.0f, 1.0f}, {-0.25f, 3.0f}};
  for (size_t t = 1; t <= grads.size(); ++t) {
    opt.Step(a.data(), sa.data(), &ta, grads[t - 1].data(), 0.01f);
    for (int j = 0; j < 2; ++j) {
      const double g = grads[t - 1][j];
      m[j] = 0.9 * m[j] + 0.1 * g;
      v[j] = 0.999 * v[j] + 0.001 * g * g;
      const double mh = m[j] / (1 - std::pow(0.9, t)), vh = v[j] / (1 - std::pow(0.999, t));
      ref[j] -= 0.01 * mh / (std::sqrt(vh) + 1e-8);
    }
  }
  EXPECT_EQ(ta, 3);
  EXPECT_NEAR(a[0], ref[0], 1e-6);
  EXPECT_NEAR(a[1], ref[1], 1e-6);
  opt.Step(b.data(), sb.data(), &tb, grads[2].data(), 0.01f);
  EXPECT_EQ(tb, 1);
  // A first Adam step moves each element by lr * sign(g) (m / sqrt(v) = g / |g| after correction).
  EXPECT_NEAR(b[0], 1.0f + 0.01f, 1e-6);
  EXPECT_NEAR(b[1], 1.0f - 0.01f, 1e-6);
}

TEST(RowOptimizerTest, CheckStateRefusesWhatNoRowCouldHold) {
  RowOptimizerOptions o;
  o.kind = RowOptimizerKind::kAdam;
  RowOptimizer adam(o, 2);
  EXPECT_TRUE(
      adam.CheckState(std::vector<float>{-1.0f, 1.0f, 0.5f, 0.5f}, 3).ok());  // m may be negative
  EXPECT_EQ(adam.CheckState(std::vector<float>{0.0f, 0.0f, -0.5f, 0.5f}, 3).code(),
            StatusCode::kInvalidArgument);
  EXPECT_FALSE(adam.CheckState(std::vector<float>{NAN, 0.0f, 0.0f, 0.0f}, 3).ok());
  EXPECT_FALSE(adam.CheckState(std::vector<float>{0.0f, 0.0f, 0.0f, 0.0f}, -1).ok());
  o.kind = RowOptimizerKind::kAdagrad;
  EXPECT_FALSE(RowOptimizer(o, 2).CheckState(std::vector<float>{-0.1f}, 0).ok());
  EXPECT_TRUE(RowOptimizer(o, 2).CheckState(std::vector<float>{0.1f}, 0).ok());
}

TEST(RowOptimizerTest, ValidateRefusesBadOptions) {
  EXPECT_TRUE(ValidateRowOptimizerOptions({}).ok());
  RowOptimizerOptions o;
  o.eps = 0.0;
  EXPECT_EQ(ValidateRowOptimizerOptions(o).code(), StatusCode::kInvalidArgument);
  o = {};
  o.initial_accumulator = -1.0f;
  EXPECT_FALSE(ValidateRowOptimizerOptions(o).ok());
  o = {};
  o.beta2 = 1.0;
  EXPECT_FALSE(ValidateRowOptimizerOptions(o).ok());
}

TEST(RowOptimizerTest, ParseRoundTrips) {
  for (auto kind : {RowOptimizerKind::kSgd, RowOptimizerKind::kAdagrad, RowOptimizerKind::kAdam}) {
    auto parsed = ParseRowOptimizerKind(RowOptimizerKindName(kind));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, kind);
  }
  auto bad = ParseRowOptimizerKind("lamb");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("sgd | adagrad | adam"), std::string::npos);
  ASSERT_TRUE(ParseRowInit("uniform:0.25").ok());
  EXPECT_FLOAT_EQ(ParseRowInit("uniform:0.25")->scale, 0.25f);
  EXPECT_EQ(ParseRowInit("zeros")->kind, RowInit::Kind::kZeros);
  EXPECT_FALSE(ParseRowInit("normal:-1").ok());
  EXPECT_FALSE(ParseRowInit("normal:x").ok());
  EXPECT_FALSE(ParseRowInit("xavier").ok());
}

TableSpec Spec(RowInit::Kind kind, float scale, uint64_t seed) {
  TableSpec spec;
  spec.name = "t";
  spec.dim = 17;
  spec.init = {kind, scale};
  spec.init_seed = seed;
  return spec;
}

TEST(TableSpecTest, InitRowIsAPureFunctionOfSeedAndId) {
  const TableSpec normal = Spec(RowInit::Kind::kNormal, 0.5f, 7);
  std::vector<float> a(17), b(17), c(17);
  InitRow(normal, 12345, a.data());
  InitRow(normal, 99, c.data());  // another id in between changes nothing
  InitRow(normal, 12345, b.data());
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  InitRow(Spec(RowInit::Kind::kNormal, 0.5f, 8), 12345, c.data());
  EXPECT_NE(a, c);
  // N(0, 0.25) over many rows: mean ~ 0, variance ~ 0.25.
  double sum = 0, sq = 0;
  const int rows = 4000;
  for (int id = 0; id < rows; ++id) {
    InitRow(normal, static_cast<uint64_t>(id) * 1000003u, a.data());
    for (float x : a) {
      sum += x;
      sq += double{x} * x;
    }
  }
  const double n = rows * 17.0;
  EXPECT_NEAR(sum / n, 0.0, 0.01);
  EXPECT_NEAR(sq / n, 0.25, 0.01);
  const TableSpec uniform = Spec(RowInit::Kind::kUniform, 0.1f, 7);
  float lo = 1, hi = -1;
  for (int id = 0; id < 1000; ++id) {
    InitRow(uniform, static_cast<uint64_t>(id), a.data());
    for (float x : a) lo = std::min(lo, x), hi = std::max(hi, x);
  }
  EXPECT_GE(lo, -0.1f);
  EXPECT_LE(hi, 0.1f);
  EXPECT_LT(lo, -0.09f);
  EXPECT_GT(hi, 0.09f);
  InitRow(Spec(RowInit::Kind::kZeros, 0.0f, 7), 5, a.data());
  EXPECT_EQ(a, std::vector<float>(17, 0.0f));
}

TEST(TableSpecTest, TableShardOfSpreadsIdsEvenly) {
  for (int shards : {1, 2, 3, 4}) {
    std::vector<int> count(static_cast<size_t>(shards));
    // Consecutive ids and ids on a stride of the shard count: both must spread.
    for (uint64_t id = 0; id < 40000; ++id) ++count[static_cast<size_t>(TableShardOf(id, shards))];
    for (uint64_t id = 0; id < 40000; ++id)
      ++count[static_cast<size_t>(TableShardOf(id * 4, shards))];
    for (int c : count)
      EXPECT_NEAR(c, 80000.0 / shards, 80000.0 / shards * 0.03) << shards << " shards";
  }
  EXPECT_EQ(TableShardOf(~uint64_t{0}, 4), TableShardOf(~uint64_t{0}, 4));
  EXPECT_LT(TableShardOf(~uint64_t{0}, 7), 7);
}

TEST(TableSpecTest, CheckTableIdsRefusesWithOneLine) {
  TableSpec spec = Spec(RowInit::Kind::kNormal, 1.0f, 1);
  spec.name = "user_id";
  spec.num_ids = 100;
  EXPECT_TRUE(CheckTableIds(spec, std::vector<uint64_t>{0, 5, 99}).ok());
  Status past = CheckTableIds(spec, std::vector<uint64_t>{5, 100});
  EXPECT_EQ(past.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(past.message().find("user_id"), std::string::npos);
  EXPECT_NE(past.message().find("outside [0, 100)"), std::string::npos);
  Status negative = CheckTableIds(spec, std::vector<uint64_t>{static_cast<uint64_t>(int64_t{-3})});
  EXPECT_NE(negative.message().find("id -3 is negative"), std::string::npos) << negative.message();
  EXPECT_FALSE(CheckTableIds(spec, std::vector<uint64_t>{5, 5}).ok());
  EXPECT_FALSE(CheckTableIds(spec, std::vector<uint64_t>{6, 5}).ok());
  spec.num_ids = 0;  // any 64-bit id
  EXPECT_TRUE(CheckTableIds(spec, std::vector<uint64_t>{5, ~uint64_t{0}}).ok());
  EXPECT_TRUE(ValidateTableSpec(spec).ok());
  spec.dim = 0;
  EXPECT_NE(ValidateTableSpec(spec).message().find("user_id"), std::string::npos);
  spec.dim = 4;
  spec.max_rows_per_shard = 0;
  EXPECT_FALSE(ValidateTableSpec(spec).ok());
}

}  // namespace
}  // namespace gradsync
