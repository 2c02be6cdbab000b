// RowCache (worker/ps/row_cache.h): which reads it serves and which it sends to the shards, driven
// by hand as PsSyncBase drives it (ToPull, the pull "answered" by filling its buffer, Pulled).
// Mutations each test catches, by name:
//   ServesARowWhileWithinTheBoundOfWhatItHolds: a row served past c - g > bound, or never served;
//     the guarantee taken as the clock of the pull instead of the shard's answer (g = c - staleness);
//     a hit copying another row, or into another place of the read's buffer.
//   ARowAnsweredAtOrPastTheBoundIsNotKept: a row whose answer was already as stale as the bound
//     (or more) kept.
//   OffPullsEveryRowAndCountsTheAnswersStaleness: off still serving, or its reads not counted.
//   HoldsOnlyTheRowsALaterReadMayUse: expired rows never dropped, or their memory never taken back
//     (it grows with every id read); a dropped row served, or not held again once pulled anew.
//   CountsWhatItServedAndSaved: hits, pulls, saved bytes or the largest staleness miscounted.
#include "worker/ps/row_cache.h"

#include <gtest/gtest.h>

#include <vector>

namespace gradsync {
namespace {

constexpr int kShards = 2;

std::vector<TableSpec> Tables() {
  TableSpec a, b;
  a.name = "a";
  a.dim = 2;
  b.name = "b";
  b.dim = 3;
  return {a, b};
}

// The shards' value of a row at a version: distinct per table, id and version.
float Value(size_t table, uint64_t id, int version, int j) {
  return static_cast<float>(1000 * version + 100 * table + 10 * id + j);
}

struct Read {
  std::vector<float> rows;
  int64_t pulled_rows = 0;  // rows the pull asked for
};

// A read at `clock` of `ids` through the cache; the shards answer each row at `version`, shard s
// with clock staleness staleness[s].
Read DoRead(RowCache& cache, int64_t clock, const std::vector<std::vector<uint64_t>>& ids, int version,
            std::vector<int64_t> staleness = {0, 0}) {
  const std::vector<TableSpec> tables = Tables();
  TablePlan plan(tables, kShards);
  EXPECT_TRUE(plan.Set(ids).ok());
  Read r;
  r.rows.assign(plan.floats(), -1.0f);
  auto to_pull = cache.ToPull(clock, plan, ids, r.rows);
  EXPECT_TRUE(to_pull.ok()) << to_pull.status();
  if (to_pull->plan != nullptr) {
    // The shards' answer: each of their rows at `version`, through the pull's own plan.
    const TablePlan& asked = *to_pull->plan;
    for (int s = 0; s < kShards; ++s) {
      std::vector<float> answer;
      size_t k = 0;
      for (const TableRun& run : asked.runs(s)) {
        for (uint64_t i = 0; i < run.ids; ++i, ++k) {
          const uint64_t id = asked.ids(s)[k];
          for (int j = 0; j < tables[run.table].dim; ++j) answer.push_back(Value(run.table, id, version, j));
        }
      }
      r.pulled_rows += static_cast<int64_t>(asked.ids(s).size());
      asked.Scatter(s, answer.data(), to_pull->rows);
    }
  }
  cache.Pulled(clock, plan, r.rows, [&](int s) { return staleness[static_cast<size_t>(s)]; });
  return r;
}

// The rows of `ids` as the shards held them at `version`, in a read's layout.
std::vector<float> At(const std::vector<std::vector<uint64_t>>& ids, int version) {
  const std::vector<TableSpec> tables = Tables();
  std::vector<float> out;
  for (size_t t = 0; t < ids.size(); ++t) {
    for (uint64_t id : ids[t]) {
      for (int j = 0; j < tables[t].dim; ++j) out.push_back(Value(t, id, version, j));
    }
  }
  return out;
}

TEST(RowCacheTest, ServesARowWhileWithinTheBoundOfWhatItHolds) {
  RowCache cache(Tables(), kShards);
  cache.set_bound(2);
  const std::vector<std::vector<uint64_t>> ids = {{1, 4, 7}, {2, 9}};
  // Clock 5, answered fresh (staleness 0): g = 5, so reads at 6 and 7 are served, 8 is not.
  Read first = DoRead(cache, 5, ids, /*version=*/1);
  EXPECT_EQ(first.pulled_rows, 5);
  EXPECT_EQ(first.rows, At(ids, 1));
  for (int64_t c : {5, 6, 7}) {
    Read again = DoRead(cache, c, ids, /*version=*/2);
    EXPECT_EQ(again.pulled_rows, 0) << "clock " << c;
    EXPECT_EQ(again.rows, At(ids, 1)) << "clock " << c;  // the cached rows, each in its place
  }
  Read late = DoRead(cache, 8, ids, /*version=*/3);
  EXPECT_EQ(late.pulled_rows, 5);
  EXPECT_EQ(late.rows, At(ids, 3));

  // A subset, a new id beside cached ones: only the new one is pulled, each lands in its place.
  const std::vector<std::vector<uint64_t>> mixed = {{4, 5}, {9}};
  Read part = DoRead(cache, 9, mixed, /*version=*/4);
  EXPECT_EQ(part.pulled_rows, 1);
  EXPECT_EQ(part.rows, (std::vector<float>{Value(0, 4, 3, 0), Value(0, 4, 3, 1), Value(0, 5, 4, 0),
                                           Value(0, 5, 4, 1), Value(1, 9, 3, 0), Value(1, 9, 3, 1),
                                           Value(1, 9, 3, 2)}));

  // Answered 1 behind (the shard held only the updates before clock 19 at clock 20): g = 19, so
  // it serves reads at 21 but not at 22, whatever clock it was pulled at.
  RowCache stale(Tables(), kShards);
  stale.set_bound(2);
  DoRead(stale, 20, ids, 1, {1, 1});
  EXPECT_EQ(DoRead(stale, 21, ids, 2).pulled_rows, 0);
  EXPECT_EQ(DoRead(stale, 22, ids, 2).pulled_rows, 5);
  // Per shard: shard 0 answered 2 behind (as stale as the bound: no later clock may read it, so
  // it is not kept), shard 1 fresh; at the next clock only shard 0's rows are asked again.
  RowCache mixed_shards(Tables(), kShards);
  mixed_shards.set_bound(2);
  DoRead(mixed_shards, 30, ids, 1, {2, 0});
  TablePlan plan(Tables(), kShards);
  ASSERT_TRUE(plan.Set(ids).ok());
  EXPECT_EQ(DoRead(mixed_shards, 31, ids, 2).pulled_rows, static_cast<int64_t>(plan.ids(0).size()));
}

TEST(RowCacheTest, ARowAnsweredAtOrPastTheBoundIsNotKept) {
  RowCache cache(Tables(), kShards);
  cache.set_bound(1);
  const std::vector<std::vector<uint64_t>> ids = {{3}, {}};
  DoRead(cache, 10, ids, 1, {3, 3});  // an answer 3 behind, bound 1 (asp-like): nothing kept
  EXPECT_EQ(cache.size(), 0u);
  DoRead(cache, 10, ids, 1, {1, 1});  // 1 behind, bound 1: no later clock may read it
  EXPECT_EQ(cache.size(), 0u);
  EXPECT_EQ(DoRead(cache, 11, ids, 2).pulled_rows, 1);
}

TEST(RowCacheTest, OffPullsEveryRowAndCountsTheAnswersStaleness) {
  RowCache cache(Tables(), kShards);
  EXPECT_FALSE(cache.on());
  const std::vector<std::vector<uint64_t>> ids = {{1, 2, 3}, {4}};
  for (int64_t c = 0; c < 3; ++c) {
    Read r = DoRead(cache, c, ids, static_cast<int>(c), {1, 0});
    EXPECT_EQ(r.pulled_rows, 4);
    EXPECT_EQ(r.rows, At(ids, static_cast<int>(c)));
  }
  EXPECT_EQ(cache.size(), 0u);
  const MetricsRow::RowReads reads = cache.TakeReads();
  EXPECT_EQ(reads.pulled, 12);
  EXPECT_EQ(reads.cached, 0);
  EXPECT_EQ(reads.saved_bytes, 0u);
  EXPECT_EQ(reads.max_staleness, 1);  // shard 0 answered 1 behind
}

TEST(RowCacheTest, HoldsOnlyTheRowsALaterReadMayUse) {
  RowCache cache(Tables(), kShards);
  cache.set_bound(3);
  // Each clock reads 10 new ids: a row may serve 3 more clocks, so at most 4 clocks' rows stay.
  for (int64_t c = 0; c < 200; ++c) {
    std::vector<std::vector<uint64_t>> ids = {{}, {}};
    for (uint64_t i = 0; i < 10; ++i) ids[0].push_back(static_cast<uint64_t>(c) * 10 + i);
    DoRead(cache, c, ids, 1);
    EXPECT_LE(cache.size(), 40u) << "clock " << c;
    EXPECT_LE(cache.slots(), 2 * 1025u) << "clock " << c;  // dropped rows' memory taken back
  }
  // Then the same ids again: rows dropped and pulled anew serve within the bound as before.
  std::vector<std::vector<uint64_t>> again = {{1990, 1991}, {}};
  EXPECT_EQ(DoRead(cache, 200, again, 2).pulled_rows, 0);  // read at clock 199: still held
  EXPECT_EQ(DoRead(cache, 203, again, 3).pulled_rows, 2);  // 199 + 3 < 203: dropped, pulled
  EXPECT_EQ(DoRead(cache, 204, again, 4).rows, At(again, 3));  // and held again
  // A restored shard: every row forgotten.
  cache.Clear();
  EXPECT_EQ(cache.size(), 0u);
}

TEST(RowCacheTest, CountsWhatItServedAndSaved) {
  RowCache cache(Tables(), kShards);
  cache.set_bound(4);
  const std::vector<std::vector<uint64_t>> ids = {{1, 2}, {5}};
  DoRead(cache, 7, ids, 1, {1, 0});  // g = 6 for shard 0's rows, 7 for shard 1's
  MetricsRow::RowReads first = cache.TakeReads();
  EXPECT_EQ(first.pulled, 3);
  EXPECT_EQ(first.cached, 0);
  TablePlan plan(Tables(), kShards);
  ASSERT_TRUE(plan.Set(ids).ok());
  EXPECT_EQ(first.max_staleness, plan.ids(0).empty() ? 0 : 1);
  DoRead(cache, 9, ids, 2);
  const MetricsRow::RowReads second = cache.TakeReads();
  EXPECT_EQ(second.pulled, 0);
  EXPECT_EQ(second.cached, 3);
  EXPECT_EQ(second.saved_bytes, (2u + 2u + 3u) * sizeof(float));
  // The oldest row read at 9: one held since before clock 6 (shard 0's, 3 behind) or 7 (2).
  EXPECT_EQ(second.max_staleness, plan.ids(0).empty() ? 2 : 3);
  EXPECT_EQ(cache.TakeReads().pulled, 0);  // taken: reset
}

}  // namespace
}  // namespace gradsync
