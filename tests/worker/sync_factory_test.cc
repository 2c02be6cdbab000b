// MakeGradientSync: the sync each setting builds, as gradsync-worker and the Python frontend get
// it (both call it), and the pointers a caller reads afterwards.
#include "worker/sync/sync_factory.h"

#include <gtest/gtest.h>

#include "models/external_model.h"

namespace gradsync {
namespace {

// Answers size() only: building a sync touches no peer.
class TwoRanks final : public Collective {
 public:
  int rank() const override { return 0; }
  int size() const override { return 2; }
  Status AllReduce(FloatSpan, ReduceOp) override { return UnimplementedError("not built to run"); }
  Status AllReduce16(std::span<uint16_t>, Float16) override { return UnimplementedError("not built to run"); }
  Status ReduceScatter(FloatSpan, ReduceOp, std::span<const size_t>) override { return UnimplementedError("not built to run"); }
  Status AllGatherChunks(FloatSpan, std::span<const size_t>) override { return UnimplementedError("not built to run"); }
  Status Broadcast(FloatSpan, int) override { return UnimplementedError("not built to run"); }
  Status AllGather(std::span<const std::byte>, std::vector<std::vector<std::byte>>*) override {
    return UnimplementedError("not built to run");
  }
  Status Barrier() override { return UnimplementedError("not built to run"); }
  uint64_t bytes_sent() const override { return 0; }
  uint64_t bytes_received() const override { return 0; }
};

std::vector<TensorInfo> Dense() { return {{"w", {4, 3}, 0, 12, false}, {"b", {3}, 12, 3, false}}; }

SyncRecipe Ps() {
  SyncRecipe r;
  r.ps = true;
  r.ps_options.overlap.enabled = true;
  return r;
}

SyncRecipe Allreduce() {
  SyncRecipe r;
  r.allreduce_options.overlap = true;
  return r;
}

TEST(SyncFactoryTest, ThePsModesOverlapWhereTheModelAndSettingsAllowIt) {
  ExternalModel model(Dense());
  BuiltSync s = MakeGradientSync(Ps(), &model, {});
  EXPECT_EQ(s.kind, "ps-overlap");
  EXPECT_TRUE(s.overlapped);
  EXPECT_EQ(s.ps, s.sync.get());
  EXPECT_EQ(s.allreduce, nullptr);

  SyncRecipe compressed = Ps();
  compressed.ps_options.codec.compression = "topk:0.1";
  s = MakeGradientSync(compressed, &model, {});
  EXPECT_EQ(s.kind, "ps");
  EXPECT_TRUE(s.overlap_refused) << "asked for, refused: the worker says so";

  SyncRecipe straggling = Ps();
  straggling.ps_options.train.straggler.spec.kind = StragglerSpec::Kind::kFixed;
  EXPECT_EQ(MakeGradientSync(straggling, &model, {}).kind, "ps");

  SyncRecipe plain = Ps();
  plain.ps_options.overlap.enabled = false;
  s = MakeGradientSync(plain, &model, {});
  EXPECT_EQ(s.kind, "ps");
  EXPECT_FALSE(s.overlap_refused);

  ExternalModel sparse({{"emb", {100, 4}, 0, 400, true}});
  EXPECT_EQ(MakeGradientSync(Ps(), &sparse, {}).kind, "ps") << "a sparse model pushes after backward";
}

TEST(SyncFactoryTest, AllreduceOverlapsAnUncompressedGradientOverRanks) {
  ExternalModel model(Dense());
  TwoRanks ranks;
  BuiltSync s = MakeGradientSync(Allreduce(), &model, {.client = nullptr, .scheduler = nullptr, .collective = &ranks});
  EXPECT_EQ(s.kind, "allreduce-overlap");
  EXPECT_EQ(s.allreduce, s.sync.get());
  EXPECT_EQ(s.ps, nullptr);

  SyncRecipe bf16 = Allreduce();
  bf16.allreduce_options.train.numerics.precision = Precision::kBf16;
  EXPECT_EQ(MakeGradientSync(bf16, &model, {.client = nullptr, .scheduler = nullptr, .collective = &ranks}).kind,
            "allreduce")
      << "bf16's gradient travels through its codec after backward";
}

// A model with embedding tables: its dense gradient all-reduced by the AllreduceSync inside, its
// rows all-gathered by the TableAllreduceSync around it, never overlapped (the rows go after
// backward).
TEST(SyncFactoryTest, AllreduceWithTablesWrapsTheDenseSyncInTheTablesOne) {
  ModelOptions mo;
  mo.name = "dlrm";
  mo.dlrm.num_dense = 2;
  mo.dlrm.num_tables = 2;
  mo.dlrm.dim = 2;
  mo.dlrm.ids_per_table = 10;
  mo.dlrm.bottom = {4};
  mo.dlrm.top = {4};
  auto model = std::move(CreateModel(mo)).value();
  TwoRanks ranks;
  BuiltSync s = MakeGradientSync(Allreduce(), model.get(), {.client = nullptr, .scheduler = nullptr, .collective = &ranks});
  EXPECT_EQ(s.kind, "allreduce-tables");
  EXPECT_FALSE(s.overlapped);
  ASSERT_NE(s.allreduce, nullptr);
  EXPECT_NE(s.allreduce, s.sync.get());
}

TEST(SyncFactoryTest, RoundsWrapTheModesOwnSyncWithoutOverlap) {
  ExternalModel model(Dense());
  TwoRanks ranks;
  SyncRecipe ps = Ps();
  ps.ps_options.train.periodic.every = 4;
  BuiltSync s = MakeGradientSync(ps, &model, {});
  EXPECT_EQ(s.kind, "rounds-ps");
  EXPECT_FALSE(s.overlapped);
  EXPECT_FALSE(s.overlap_refused);
  EXPECT_EQ(s.ps, nullptr) << "the PS sync of rounds is the outer one, not the caller's";

  SyncRecipe ar = Allreduce();
  ar.allreduce_options.train.periodic.every = 4;
  ar.local_update = false;
  s = MakeGradientSync(ar, &model, {.client = nullptr, .scheduler = nullptr, .collective = &ranks});
  EXPECT_EQ(s.kind, "rounds-allreduce");
  ASSERT_NE(s.allreduce, nullptr) << "the outer all-reduce sync, whose optimizer state the trainer reports";
  EXPECT_NE(s.allreduce, s.sync.get());
}

}  // namespace
}  // namespace gradsync
