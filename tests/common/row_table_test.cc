// A table shard's rows (common/table/). Mutations each test catches, by name:
//   ReadAnswersInitialValuesAndCreatesNothing: Read creating rows (memory following reads), a
//     stored row not read back, an unstored row read as zeros.
//   ApplyCreatesOnFirstTouchAndSteps: the created row not starting at its initial value, the push
//     scales swapped (grad_scale as the rate's), a row stepped twice.
//   BspRoundAppliesTheMeanOnceAndLeavesOthersLazy: the sum applied instead of the mean, one step
//     per push instead of per round, untouched rows' Adam t advanced, the round kept after apply.
//   BoundRefusesWholePushesAndChangesNothing: a partial push applied before the refusal, the
//   round's
//     own new rows not counted, the refusal not naming the table.
//   CheckIdsRefusesAnotherShardsId: a shard accepting a row that hashes elsewhere.
//   SaveRestoreCarriesValuesStateAndSteps: lost optimizer state or step counts, Save not sorted.
//   RestoreRefusesDamagedRowsAndKeepsItsOwn: a damaged checkpoint half-restored, NaN or negative v
//     let through, foreign ids accepted.
//   RowIndexFindsEveryInsertedId: a probe loop that stops early, growth that loses entries.
//   MemoryFollowsTouchedRows: the store allocating by the id space, slabs growing per row.
#include "common/table/row_table.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "common/base/numeric/rng.h"

namespace gradsync {
namespace {

TableSpec Spec(RowOptimizerKind kind = RowOptimizerKind::kSgd, int dim = 4) {
  TableSpec spec;
  spec.name = "items";
  spec.dim = dim;
  spec.num_ids = 0;
  spec.init = {RowInit::Kind::kNormal, 0.1f};
  spec.init_seed = 42;
  spec.max_rows_per_shard = 1000;
  spec.optimizer.kind = kind;
  return spec;
}

std::vector<float> Init(const TableSpec& spec, uint64_t id) {
  std::vector<float> row(static_cast<size_t>(spec.dim));
  InitRow(spec, id, row.data());
  return row;
}

std::vector<float> ReadRow(const RowTable& t, uint64_t id) {
  std::vector<float> row(static_cast<size_t>(t.spec().dim));
  const uint64_t ids[] = {id};
  t.Read(ids, row.data());
  return row;
}

TEST(RowTableTest, ReadAnswersInitialValuesAndCreatesNothing) {
  RowTable t(Spec(), 0, 1);
  std::vector<uint64_t> ids = {3, 1u << 20, ~uint64_t{0}};
  std::vector<float> out(ids.size() * 4);
  t.Read(ids, out.data());
  EXPECT_EQ(t.rows(), 0);
  for (size_t i = 0; i < ids.size(); ++i) {
    EXPECT_EQ(std::vector<float>(out.begin() + static_cast<long>(i * 4),
                                 out.begin() + static_cast<long>(i * 4 + 4)),
              Init(t.spec(), ids[i]));
  }
}

TEST(RowTableTest, ApplyCreatesOnFirstTouchAndSteps) {
  RowTable t(Spec(), 0, 1);
  std::vector<uint64_t> ids = {7, 9};
  std::vector<float> g = {1, 2, 3, 4, -1, -2, -3, -4};
  ASSERT_TRUE(t.Apply(ids, g.data(), 0.5f, 0.25f, 1.0f).ok());
  EXPECT_EQ(t.rows(), 2);
  const std::vector<float> init7 = Init(t.spec(), 7);
  const std::vector<float> now7 = ReadRow(t, 7);
  for (int j = 0; j < 4; ++j) EXPECT_FLOAT_EQ(now7[j], init7[j] - 0.5f * (0.25f * g[j]));
  // Adagrad and Adam take the rate's scale instead: lr * lr_scale.
  RowTable a(Spec(RowOptimizerKind::kAdam), 0, 1);
  ASSERT_TRUE(a.Apply(ids, g.data(), 0.5f, 1.0f, 0.25f).ok());
  const std::vector<float> first = ReadRow(a, 7);
  for (int j = 0; j < 4; ++j)
    EXPECT_NEAR(first[j], init7[j] - 0.125f, 1e-6);  // Adam's first step: lr * sign(g)
}

TEST(RowTableTest, BspRoundAppliesTheMeanOnceAndLeavesOthersLazy) {
  RowTable t(Spec(RowOptimizerKind::kAdam), 0, 1);
  // Row 5 exists before the round (one step), row 6 too; the round touches 5 and 8 only.
  std::vector<uint64_t> before = {5, 6};
  std::vector<float> g0(8, 1.0f);
  ASSERT_TRUE(t.Apply(before, g0.data(), 0.1f, 1.0f, 1.0f).ok());
  const std::vector<float> six = ReadRow(t, 6);
  std::vector<uint64_t> w0 = {5, 8}, w1 = {5};
  std::vector<float> g1 = {2, 2, 2, 2, 4, 4, 4, 4}, g2 = {-6, -6, -6, -6};
  ASSERT_TRUE(t.Accumulate(w0, g1.data()).ok());
  ASSERT_TRUE(t.Accumulate(w1, g2.data()).ok());
  EXPECT_EQ(t.round_rows(), 2u);
  EXPECT_EQ(t.rows(), 2);  // row 8 comes with the round's apply
  // The reference: the same rows stepped once each by the mean over 2 gradients.
  RowTable ref(Spec(RowOptimizerKind::kAdam), 0, 1);
  ASSERT_TRUE(ref.Apply(before, g0.data(), 0.1f, 1.0f, 1.0f).ok());
  std::vector<uint64_t> both = {5, 8};
  std::vector<float> mean = {-2, -2, -2, -2, 2, 2, 2, 2};
  ASSERT_TRUE(ref.Apply(both, mean.data(), 0.1f, 1.0f, 1.0f).ok());
  t.ApplyAccumulated(2, 0.1f);
  EXPECT_EQ(t.round_rows(), 0u);
  EXPECT_EQ(t.rows(), 3);
  EXPECT_EQ(ReadRow(t, 5), ReadRow(ref, 5));
  EXPECT_EQ(ReadRow(t, 8), ReadRow(ref, 8));
  EXPECT_EQ(ReadRow(t, 6), six);
  const TableRows saved = t.Save();
  ASSERT_EQ(saved.ids, (std::vector<uint64_t>{5, 6, 8}));
  EXPECT_EQ(saved.steps,
            (std::vector<int64_t>{2, 1, 1}));  // lazy: row 6 did not take the round's step
}

TEST(RowTableTest, BoundRefusesWholePushesAndChangesNothing) {
  TableSpec spec = Spec();
  spec.max_rows_per_shard = 3;
  RowTable t(spec, 0, 1);
  std::vector<uint64_t> two = {1, 2}, three_more = {2, 3, 4};
  std::vector<float> g(12, 1.0f);
  ASSERT_TRUE(t.Apply(two, g.data(), 1.0f, 1.0f, 1.0f).ok());
  const std::vector<float> row2 = ReadRow(t, 2);
  Status full = t.Apply(three_more, g.data(), 1.0f, 1.0f, 1.0f);
  EXPECT_EQ(full.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(full.message().find("table 'items'"), std::string::npos) << full.message();
  EXPECT_NE(full.message().find("bound of 3 rows"), std::string::npos) << full.message();
  EXPECT_EQ(t.rows(), 2);
  EXPECT_EQ(ReadRow(t, 2), row2);  // the refused push's row 2 was not stepped
  // bsp: each push alone fits, the round's new rows together do not.
  std::vector<uint64_t> a = {3}, b = {4};
  ASSERT_TRUE(t.Accumulate(a, g.data()).ok());
  EXPECT_EQ(t.Accumulate(b, g.data()).code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(
      t.Accumulate(a, g.data()).ok());  // a row the round already creates costs nothing more
  EXPECT_EQ(t.round_rows(), 1u);
  t.ApplyAccumulated(2, 1.0f);
  EXPECT_EQ(t.rows(), 3);
}

// A bsp round whose held pushes entered their rows (Reserve) but one push was dropped (its
// worker left): its rows are neither created nor stepped. Mutation caught: reserved entries
// applied as zero gradients (Adam's t advanced, rows created), the bound's count not released.
TEST(RowTableTest, ReservedRowsOfADroppedPushAreNeitherCreatedNorStepped) {
  TableSpec spec = Spec(RowOptimizerKind::kAdam);
  spec.max_rows_per_shard = 2;
  RowTable t(spec, 0, 1);
  std::vector<uint64_t> kept = {1}, dropped = {2};
  std::vector<float> g(4, 1.0f);
  ASSERT_TRUE(t.Reserve(kept).ok());
  ASSERT_TRUE(t.Reserve(dropped).ok());
  std::vector<uint64_t> third = {3};
  EXPECT_EQ(t.Reserve(third).code(), StatusCode::kResourceExhausted);
  ASSERT_TRUE(t.Accumulate(kept, g.data()).ok());  // only the kept push's gradient is added
  t.ApplyAccumulated(1, 0.1f);
  EXPECT_EQ(t.rows(), 1);
  EXPECT_EQ(ReadRow(t, 2), Init(t.spec(), 2));
  EXPECT_EQ(t.Save().steps, std::vector<int64_t>{1});
  EXPECT_TRUE(t.Reserve(third).ok());  // the round's count was released with the round
}

TEST(RowTableTest, CheckIdsRefusesAnotherShardsId) {
  RowTable t(Spec(), 1, 2);
  std::vector<uint64_t> mine, theirs;
  for (uint64_t id = 0; mine.empty() || theirs.empty(); ++id)
    (TableShardOf(id, 2) == 1 ? mine : theirs).push_back(id);
  EXPECT_TRUE(t.CheckIds(mine).ok());
  Status st = t.CheckIds(theirs);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("belongs to shard 0"), std::string::npos) << st.message();
}

TEST(RowTableTest, SaveRestoreCarriesValuesStateAndSteps) {
  for (auto kind : {RowOptimizerKind::kSgd, RowOptimizerKind::kAdagrad, RowOptimizerKind::kAdam}) {
    RowTable t(Spec(kind), 0, 1);
    Rng rng(3);
    for (int step = 0; step < 5; ++step) {
      std::vector<uint64_t> ids;
      for (uint64_t id = 0; id < 50; ++id) {
        if (rng.Uniform() < 0.3f) ids.push_back(id * 7919);
      }
      std::vector<float> g(ids.size() * 4);
      for (float& x : g) x = rng.Uniform(-1, 1);
      ASSERT_TRUE(t.Apply(ids, g.data(), 0.05f, 1.0f, 1.0f).ok());
    }
    const TableRows saved = t.Save();
    ASSERT_TRUE(std::is_sorted(saved.ids.begin(), saved.ids.end()));
    RowTable back(Spec(kind), 0, 1);
    ASSERT_TRUE(back.Restore(saved).ok());
    EXPECT_EQ(back.rows(), t.rows());
    // The same next step on both: identical rows, so state and step counts came back too.
    std::vector<float> g(saved.ids.size() * 4, 0.5f);
    ASSERT_TRUE(t.Apply(saved.ids, g.data(), 0.05f, 1.0f, 1.0f).ok());
    ASSERT_TRUE(back.Apply(saved.ids, g.data(), 0.05f, 1.0f, 1.0f).ok());
    const TableRows a = t.Save(), b = back.Save();
    EXPECT_EQ(a.values, b.values) << RowOptimizerKindName(kind);
    EXPECT_EQ(a.state, b.state);
    EXPECT_EQ(a.steps, b.steps);
  }
}

TEST(RowTableTest, RestoreRefusesDamagedRowsAndKeepsItsOwn) {
  RowTable t(Spec(RowOptimizerKind::kAdam), 1, 2);
  std::vector<uint64_t> mine;
  for (uint64_t id = 0; mine.size() < 3; ++id) {
    if (TableShardOf(id, 2) == 1) mine.push_back(id);
  }
  std::vector<float> g(12, 1.0f);
  ASSERT_TRUE(t.Apply(mine, g.data(), 0.1f, 1.0f, 1.0f).ok());
  const TableRows good = t.Save();
  auto refused = [&](TableRows rows, const char* what) {
    Status st = t.Restore(rows);
    EXPECT_EQ(st.code(), StatusCode::kDataLoss) << what;
    EXPECT_NE(st.message().find("table 'items'"), std::string::npos) << st.message();
    EXPECT_EQ(t.Save().values, good.values) << what;
    EXPECT_EQ(t.Save().steps, good.steps) << what;
  };
  TableRows r = good;
  r.values.pop_back();
  refused(r, "a short row");
  r = good;
  r.steps.clear();
  refused(r, "no step counts");
  r = good;
  r.values[1] = NAN;
  refused(r, "a NaN value");
  r = good;
  r.state[5] = -1.0f;  // v of row 0
  refused(r, "a negative second moment");
  r = good;
  std::swap(r.ids[0], r.ids[1]);
  refused(r, "unsorted ids");
  r = good;
  for (uint64_t id = 0;; ++id) {
    if (TableShardOf(id, 2) == 0) {
      r.ids[0] = id;
      break;
    }
  }
  std::sort(r.ids.begin(), r.ids.end());
  refused(r, "another shard's id");
  TableSpec small = Spec(RowOptimizerKind::kAdam);
  small.max_rows_per_shard = 2;
  RowTable tiny(small, 1, 2);
  EXPECT_EQ(tiny.Restore(good).code(), StatusCode::kDataLoss);
  EXPECT_EQ(tiny.rows(), 0);
}

TEST(RowTableTest, RowIndexFindsEveryInsertedId) {
  RowIndex index;
  Rng rng(11);
  std::vector<uint64_t> ids;
  for (uint32_t i = 0; i < 100000; ++i) {
    ids.push_back(rng.NextU64());
    index.Insert(ids.back(), i);
  }
  EXPECT_EQ(index.size(), ids.size());
  for (uint32_t i = 0; i < ids.size(); ++i) ASSERT_EQ(index.Find(ids[i]), i);
  int absent = 0;
  for (int i = 0; i < 1000; ++i) absent += index.Find(rng.NextU64()) == RowIndex::kAbsent;
  EXPECT_EQ(absent, 1000);
  size_t seen = 0;
  index.ForEach([&](uint64_t id, uint32_t slot) { seen += ids[slot] == id; });
  EXPECT_EQ(seen, ids.size());
  index.Clear();
  EXPECT_EQ(index.Find(ids[0]), RowIndex::kAbsent);
  EXPECT_EQ(index.size(), 0u);
}

TEST(RowTableTest, MemoryFollowsTouchedRows) {
  // An id space of 2^64 and 10^5 rows touched, dim 32 with Adam (m and v per row): the shard holds
  // about rows * (3 * 32 floats + a step count) plus the index, nothing by the id space.
  TableSpec spec = Spec(RowOptimizerKind::kAdam, 32);
  spec.max_rows_per_shard = 1 << 20;
  RowTable t(spec, 0, 1);
  EXPECT_LT(t.bytes(), 4096u);
  std::vector<uint64_t> ids(1000);
  std::vector<float> g(ids.size() * 32, 0.01f);
  for (uint64_t batch = 0; batch < 100; ++batch) {
    for (uint64_t i = 0; i < ids.size(); ++i) ids[i] = (batch * ids.size() + i) << 20;
    ASSERT_TRUE(t.Apply(ids, g.data(), 0.1f, 1.0f, 1.0f).ok());
  }
  EXPECT_EQ(t.rows(), 100000);
  const double per_row = static_cast<double>(t.bytes()) / 100000.0;
  EXPECT_GT(per_row, 3 * 32 * 4 + 8);
  EXPECT_LT(per_row,
            3 * 32 * 4 + 8 + 60);  // slab rounding and the index (12 B / 0.7 load, doubled)
}

}  // namespace
}  // namespace gradsync
