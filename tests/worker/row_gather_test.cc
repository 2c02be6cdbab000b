// RowGather: all-reduce's embedding tables, a replica per worker merged by an all-gather of
// (ids, row gradients). Mutations each test catches, by name:
//   TwoWorkersRowsWithOverlappingIdsApplyTheirMeanOnce: a round's rows summed but not divided by
//     the workers (the SGD table), each worker's rows applied as a step of their own (the Adagrad
//     table's shared id), a worker's rows dropped or scattered to other ids, rows created for ids
//     no worker touched, the round left open (applied again by the next step), replicas that merge
//     in their own order or read their own rows from the gathered copy differently.
//   TheMessageIsEightBytesATablePlusEachRowsIdAndFloats: another layout or header size than the
//     one ARCHITECTURE.md counts, the gather's bytes not going through the collective.
//   WorkersWhoseTablesDifferAreRefusedAtStart: replicas seeded otherwise (their untouched rows
//     differ silently) or of another dim accepted.
//   AMalformedPeerMessageIsAClearErrorAndAppliesNothing: a cut, padded or lying message read past
//     its end (a crash under ASan) or accepted, unsorted or out-of-table ids accepted, the round of
//     the ranks before the bad one applied anyway, the error not naming the rank and the table.
#include "worker/allreduce/tables/row_gather.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

namespace gradsync {
namespace {

// Two ranks: this one (`rank`) and a peer whose message is `peer`. AllGather answers both in rank
// order and counts the bytes as a two-rank exchange would (each message once each way).
class TwoRanks final : public Collective {
 public:
  TwoRanks(int rank, std::vector<std::byte> peer) : rank_(rank), peer_(std::move(peer)) {}
  int rank() const override { return rank_; }
  int size() const override { return 2; }
  Status AllReduce(FloatSpan, ReduceOp) override { return UnimplementedError("rows only"); }
  Status AllReduce16(std::span<uint16_t>, Float16) override { return UnimplementedError("rows only"); }
  Status ReduceScatter(FloatSpan, ReduceOp, std::span<const size_t>) override { return UnimplementedError("rows only"); }
  Status AllGatherChunks(FloatSpan, std::span<const size_t>) override { return UnimplementedError("rows only"); }
  Status Broadcast(FloatSpan, int) override { return UnimplementedError("rows only"); }
  Status AllGather(std::span<const std::byte> mine, std::vector<std::vector<std::byte>>* out) override {
    out->assign(2, {});
    (*out)[static_cast<size_t>(rank_)].assign(mine.begin(), mine.end());
    (*out)[static_cast<size_t>(1 - rank_)] = peer_;
    last_.assign(mine.begin(), mine.end());
    sent_ += mine.size();
    received_ += peer_.size();
    return OkStatus();
  }
  Status Barrier() override { return OkStatus(); }
  uint64_t bytes_sent() const override { return sent_; }
  uint64_t bytes_received() const override { return received_; }
  const std::vector<std::byte>& last_sent() const { return last_; }

 private:
  int rank_;
  std::vector<std::byte> peer_;
  std::vector<std::byte> last_;
  uint64_t sent_ = 0, received_ = 0;
};

constexpr int kDim = 2;

std::vector<TableSpec> Specs() {
  std::vector<TableSpec> specs(2);
  specs[0].name = "emb.sgd";
  specs[1].name = "emb.adagrad";
  for (int t = 0; t < 2; ++t) {
    specs[t].dim = kDim;
    specs[t].num_ids = 100;
    specs[t].init = {RowInit::Kind::kNormal, 0.1f};
    specs[t].init_seed = 7 + t;
  }
  specs[1].optimizer.kind = RowOptimizerKind::kAdagrad;
  return specs;
}

// A worker's step: ids per table and their gradients, table after table.
struct Step {
  std::vector<std::vector<uint64_t>> ids;
  std::vector<float> grads;
};
// Worker 0 touches ids 3 and 7 of each table, worker 1 ids 7 and 9: id 7 is shared.
Step WorkerA() { return {{{3, 7}, {3, 7}}, {0.5f, -1.0f, 2.0f, 0.25f, /*adagrad*/ 0.5f, -1.0f, 2.0f, 0.25f}}; }
Step WorkerB() { return {{{7, 9}, {7, 9}}, {1.0f, 3.0f, -0.75f, 0.5f, /*adagrad*/ 1.0f, 3.0f, -0.75f, 0.5f}}; }

std::vector<std::byte> Message(const Step& s) {
  RowGather g(Specs());
  std::vector<std::byte> out;
  EXPECT_TRUE(g.Encode(s.ids, s.grads, &out).ok());
  return out;
}

std::vector<float> Row(const RowGather& g, size_t table, uint64_t id) {
  std::vector<std::vector<uint64_t>> ids(2);
  ids[table] = {id};
  std::vector<float> row(kDim);
  EXPECT_TRUE(g.Read(ids, row).ok());
  return row;
}

std::vector<float> Initial(size_t table, uint64_t id) {
  std::vector<float> row(kDim);
  InitRow(Specs()[table], id, row.data());
  return row;
}

TEST(RowGatherTest, TwoWorkersRowsWithOverlappingIdsApplyTheirMeanOnce) {
  constexpr float kLr = 0.1f;
  RowGather rank0(Specs()), rank1(Specs());
  TwoRanks c0(0, Message(WorkerB())), c1(1, Message(WorkerA()));
  ASSERT_TRUE(rank0.Gather(WorkerA().ids, WorkerA().grads, c0).ok());
  ASSERT_TRUE(rank1.Gather(WorkerB().ids, WorkerB().grads, c1).ok());
  rank0.Apply(kLr);
  rank1.Apply(kLr);

  // Each id's gradient: the sum over the workers that touched it, over the 2 workers.
  const std::vector<std::pair<uint64_t, std::vector<float>>> mean = {
      {3, {0.5f * 0.5f, 0.5f * -1.0f}},
      {7, {0.5f * (2.0f + 1.0f), 0.5f * (0.25f + 3.0f)}},
      {9, {0.5f * -0.75f, 0.5f * 0.5f}}};
  for (const auto& [id, g] : mean) {
    const std::vector<float> sgd0 = Initial(0, id), ada0 = Initial(1, id);
    const double ms = (static_cast<double>(g[0]) * g[0] + static_cast<double>(g[1]) * g[1]) / kDim;
    const std::vector<float> sgd = Row(rank0, 0, id), ada = Row(rank0, 1, id);
    for (int j = 0; j < kDim; ++j) {
      EXPECT_NEAR(sgd[j], sgd0[j] - kLr * g[j], 1e-6) << "sgd id " << id << " [" << j << "]";
      EXPECT_NEAR(ada[j], ada0[j] - kLr * g[j] / (std::sqrt(ms) + 1e-8), 1e-6) << "adagrad id " << id << " [" << j << "]";
    }
    // Every replica holds the same bits.
    EXPECT_EQ(Row(rank1, 0, id), sgd) << id;
    EXPECT_EQ(Row(rank1, 1, id), ada) << id;
  }
  EXPECT_EQ(Row(rank0, 0, 5), Initial(0, 5)) << "an id no worker touched keeps its initial value";
  EXPECT_EQ(rank0.replica().rows(), 6) << "3 ids in each of 2 tables";
  // The round is emptied by Apply: a step without rows changes nothing.
  const std::vector<float> before = Row(rank0, 1, 7);
  TwoRanks empty(0, Message(Step{}));
  ASSERT_TRUE(rank0.Gather({}, {}, empty).ok());
  rank0.Apply(kLr);
  EXPECT_EQ(Row(rank0, 1, 7), before);
}

TEST(RowGatherTest, TheMessageIsEightBytesATablePlusEachRowsIdAndFloats) {
  const std::vector<std::byte> a = Message(WorkerA());
  EXPECT_EQ(a.size(), 2 * 8 + 4 * (8 + 4 * kDim));
  EXPECT_EQ(Message(Step{}).size(), 2u * 8);
  RowGather g(Specs());
  TwoRanks c(0, Message(WorkerB()));
  ASSERT_TRUE(g.Gather(WorkerA().ids, WorkerA().grads, c).ok());
  EXPECT_EQ(c.bytes_sent(), a.size()) << "the gather goes through the job's collective";
  std::vector<std::byte> out;
  const Step a_step = WorkerA();
  EXPECT_EQ(g.Encode(a_step.ids, std::span<const float>(a_step.grads).first(3), &out).code(),
            StatusCode::kInvalidArgument);
}

TEST(RowGatherTest, WorkersWhoseTablesDifferAreRefusedAtStart) {
  std::vector<TableSpec> other = Specs();
  other[1].init_seed += 1;
  RowGather peer(other);
  TwoRanks capture(1, {});
  (void)peer.CheckSameTables(capture);
  RowGather g(Specs());
  TwoRanks c(0, capture.last_sent());
  const Status st = g.CheckSameTables(c);
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << st;
  EXPECT_NE(st.message().find("rank 1's table 'emb.adagrad' differs from rank 0's"), std::string::npos) << st;

  RowGather same(Specs());
  TwoRanks capture_same(1, {});
  (void)same.CheckSameTables(capture_same);
  TwoRanks agree(0, capture_same.last_sent());
  EXPECT_TRUE(g.CheckSameTables(agree).ok());
}

TEST(RowGatherTest, AMalformedPeerMessageIsAClearErrorAndAppliesNothing) {
  const std::vector<std::byte> good = Message(WorkerB());
  auto with_count = [&](uint64_t count) {  // table 0's row count replaced
    std::vector<std::byte> m = good;
    std::memcpy(m.data(), &count, sizeof(count));
    return m;
  };
  auto with_id = [&](size_t i, uint64_t id) {  // table 0's i-th id replaced
    std::vector<std::byte> m = good;
    std::memcpy(m.data() + 8 + i * 8, &id, sizeof(id));
    return m;
  };
  std::vector<std::byte> cut(good.begin(), good.end() - 4);
  std::vector<std::byte> padded = good;
  padded.push_back(std::byte{0});
  std::vector<std::byte> headless(good.begin(), good.begin() + 5);
  struct Case {
    std::string name;
    std::vector<std::byte> peer;
    std::string says;
  };
  const std::vector<Case> cases = {
      {"cut", cut, "table 'emb.adagrad'"},
      {"padded", padded, "1 bytes past the last table's rows"},
      {"headless", headless, "table 'emb.sgd': the message ends after 5 bytes"},
      {"huge count", with_count(uint64_t{1} << 61), "table 'emb.sgd'"},
      {"one row too many", with_count(3), "table 'emb.adagrad'"},
      {"unsorted", with_id(1, 2), "table 'emb.sgd'"},
      {"past the table", with_id(1, 100), "table 'emb.sgd'"},
  };
  for (const Case& c : cases) {
    RowGather g(Specs());
    TwoRanks peers(0, c.peer);
    const Status st = g.Gather(WorkerA().ids, WorkerA().grads, peers);
    EXPECT_EQ(st.code(), StatusCode::kDataLoss) << c.name << ": " << st;
    EXPECT_NE(st.message().find("rank 1"), std::string::npos) << c.name << ": " << st;
    EXPECT_NE(st.message().find(c.says), std::string::npos) << c.name << ": " << st;
    g.Apply(0.1f);
    EXPECT_EQ(g.replica().rows(), 0) << c.name << ": nothing of the round is applied";
    EXPECT_EQ(Row(g, 0, 3), Initial(0, 3)) << c.name;
  }
}

}  // namespace
}  // namespace gradsync
