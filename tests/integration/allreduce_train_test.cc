// Training in allreduce mode (threads over 127.0.0.1): the same SGD as local training with the
// global batch and as bsp over the parameter server.
#include <gtest/gtest.h>

#include <filesystem>
#include <thread>

#include "allreduce/tcp_ring.h"
#include "common/data/synthetic.h"
#include "tests/support/ps_job.h"
#include "tests/support/temp_dir.h"
#include "worker/job_trainer.h"

namespace gradsync::testing {
namespace {

// Float summation order differs (one sgemm over 32 rows locally, a ring sum of four 8-row
// gradients here, a rank-order sum on the PS), so the trajectories agree to rounding, not to the
// bit: after 200 steps at the worker's default rate the MLP is within 6e-6 of local SGD and 5e-6
// of bsp on this machine (at rate 0.05, ReLU kinks let the same last-bit differences grow to
// about 2e-5), softmax regression within 1e-6. Which sgemm kernel OpenBLAS picks moves the MLP's
// figure: on a KVM Xeon where it runs its Prescott (SSE3) kernel, 1.18e-5 from local SGD, the
// same before and after the frontend's changes of 2026-11-28; the MLP's bound is 2e-5.
class AllreduceEquivalenceTest : public ::testing::TestWithParam<std::pair<std::string, double>> {};

TEST_P(AllreduceEquivalenceTest, FourWorkersEqualLocalSgdAndBspWithTheGlobalBatch) {
  const auto [model_name, tolerance] = GetParam();
  Dataset data = SmallBlobs();
  ModelOptions mo = SmallMlp();
  mo.name = model_name;
  LocalTrainOptions t;
  t.batch = 8;
  t.epochs = 100;
  t.max_steps = 200;
  t.seed = 5;
  t.lr = {LrSchedule::Kind::kCosine, 0.02f, 200, 0.0f};  // the worker's default rate
  t.optimizer.momentum = 0.9f;
  t.optimizer.weight_decay = 1e-4f;
  // A 100-float bucket cuts the gradients into several all-reduces.
  auto ar = RunAllreduceJob(4, mo, t, data, 100 * sizeof(float));
  ASSERT_TRUE(ar.ok()) << ar.status();
  LocalTrainOptions local = t;
  local.batch = 32;
  std::vector<float> expect = RunLocal(mo, local, 0, data);
  const double vs_local = MaxRelativeDiff(*ar, expect, 1e-3);
  RecordProperty("max_relative_diff_vs_local", std::to_string(vs_local));
  EXPECT_LE(vs_local, tolerance);

  PsJobOptions ps;
  ps.mode = ConsistencyMode::kBsp;
  ps.num_servers = 2;
  ps.num_workers = 4;
  ps.model = mo;
  ps.train = t;
  PsJobResult bsp = RunPsJob(ps, data, data);
  ASSERT_TRUE(bsp.status.ok()) << bsp.status;
  const double vs_bsp = MaxRelativeDiff(*ar, bsp.params, 1e-3);
  RecordProperty("max_relative_diff_vs_bsp", std::to_string(vs_bsp));
  EXPECT_LE(vs_bsp, tolerance);
}

INSTANTIATE_TEST_SUITE_P(Models, AllreduceEquivalenceTest,
                         ::testing::Values(std::make_pair(std::string("softmax"), 1e-5),
                                           std::make_pair(std::string("mlp"), 2e-5)),
                         [](const auto& p) { return p.param.first; });

LocalTrainOptions AdamTrain(int64_t batch, int64_t steps) {
  LocalTrainOptions t = SmallTrain(batch, steps, 0.0f);
  t.lr = {LrSchedule::Kind::kConstant, 0.005f, 0, 0.0f};
  t.optimizer.kind = OptimizerKind::kAdam;
  return t;
}

// Every rank applies Adam to the averaged gradient: local Adam with the global batch.
TEST(AllreduceTrainTest, AdamEqualsLocalAdamWithTheGlobalBatch) {
  Dataset data = SmallBlobs();
  LocalTrainOptions t = AdamTrain(8, 100);
  auto ar = RunAllreduceJob(4, SmallMlp(), t, data, 100 * sizeof(float));
  ASSERT_TRUE(ar.ok()) << ar.status();
  LocalTrainOptions local = t;
  local.batch = 32;
  const double diff = MaxRelativeDiff(*ar, RunLocal(SmallMlp(), local, 0, data), 1e-3);
  RecordProperty("max_relative_diff_vs_local", std::to_string(diff));
  EXPECT_LE(diff, 1e-4);
}

// One rank's all-reduce job with Adam and checkpoints every 10 steps; its parameters.
Result<std::vector<float>> RunCheckpointed(const Dataset& data, LocalTrainOptions t, const std::string& dir,
                                           bool resume) {
  ASSIGN_OR_RETURN(auto ring, RingCollective::Listen("127.0.0.1", {}));
  RETURN_IF_ERROR(ring->Connect(0, {"127.0.0.1:" + std::to_string(ring->port())}, 10));
  auto model = MakeTestModel(SmallMlp(), false);
  model->Initialize(0);
  AllreduceTrainOptions o;
  o.train = t;
  o.evaluate = false;
  o.checkpoint.dir = dir;
  o.checkpoint.every = 10;
  o.checkpoint.resume = resume;
  AllreduceTrainer trainer(o, model.get(), &data, &data, nullptr, ring.get());
  RETURN_IF_ERROR(trainer.Run().status());
  return std::vector<float>(model->params().begin(), model->params().end());
}

// A resumed run goes on from the checkpoint's m, v and step (Adam's t) bit for bit; a checkpoint
// another optimizer wrote is refused.
TEST(AllreduceTrainTest, AdamResumesFromItsCheckpointBitForBit) {
  Dataset data = SmallBlobs();
  TempDir dir;
  auto straight = RunCheckpointed(data, AdamTrain(16, 40), dir.path(), false);
  ASSERT_TRUE(straight.ok()) << straight.status();
  ASSERT_TRUE(RunCheckpointed(data, AdamTrain(16, 20), dir.path(), false).ok());  // checkpoint at 20
  auto resumed = RunCheckpointed(data, AdamTrain(16, 40), dir.path(), true);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ(*resumed, *straight);

  LocalTrainOptions sgd = AdamTrain(16, 10);
  sgd.optimizer = OptimizerOptions{};
  ASSERT_TRUE(RunCheckpointed(data, sgd, dir.path(), false).ok());
  auto refused = RunCheckpointed(data, AdamTrain(16, 20), dir.path(), true);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("was written with --optimizer=sgd; this run uses --optimizer=adam"),
            std::string::npos)
      << refused.status();
}

LocalTrainOptions LayerWiseTrain(OptimizerKind kind, int64_t batch, int64_t steps) {
  LocalTrainOptions t = SmallTrain(batch, steps, kind == OptimizerKind::kLars ? 0.9f : 0.0f);
  t.optimizer.kind = kind;
  t.optimizer.weight_decay = 1e-3f;
  t.optimizer.trust_coefficient = 0.01;
  t.lr = {LrSchedule::Kind::kConstant, kind == OptimizerKind::kLars ? 1.0f : 0.01f, 0, 0.0f};
  return t;
}

// LARS and LAMB: every rank applies them to the averaged gradient (local with the global batch),
// and bsp on one server (its shard holds every layer whole) is the same optimizer on the mean.
TEST(AllreduceTrainTest, LarsAndLambEqualLocalAndBspWithTheGlobalBatch) {
  Dataset data = SmallBlobs();
  for (OptimizerKind kind : {OptimizerKind::kLars, OptimizerKind::kLamb}) {
    SCOPED_TRACE(OptimizerKindName(kind));
    LocalTrainOptions t = LayerWiseTrain(kind, 8, 100);
    auto ar = RunAllreduceJob(4, SmallMlp(), t, data, 100 * sizeof(float));
    ASSERT_TRUE(ar.ok()) << ar.status();
    LocalTrainOptions local = t;
    local.batch = 32;
    const std::vector<float> expect = RunLocal(SmallMlp(), local, 0, data);
    const double diff = MaxRelativeDiff(*ar, expect, 1e-3);
    RecordProperty(std::string("max_relative_diff_vs_local_") + OptimizerKindName(kind), std::to_string(diff));
    EXPECT_LE(diff, 1e-4);
    // Not a no-op: the parameters moved.
    auto model = MakeTestModel(SmallMlp(), false);
    model->Initialize(0);
    EXPECT_GT(MaxRelativeDiff(expect, std::vector<float>(model->params().begin(), model->params().end()), 1e-3), 1e-2);

    PsJobOptions ps;
    ps.mode = ConsistencyMode::kBsp;
    ps.num_servers = 1;
    ps.num_workers = 4;
    ps.model = SmallMlp();
    ps.train = t;
    PsJobResult bsp = RunPsJob(ps, data, data);
    ASSERT_TRUE(bsp.status.ok()) << bsp.status;
    const double vs_bsp = MaxRelativeDiff(*ar, bsp.params, 1e-3);
    RecordProperty(std::string("max_relative_diff_vs_bsp_") + OptimizerKindName(kind), std::to_string(vs_bsp));
    EXPECT_LE(vs_bsp, 1e-4);
  }
}

// A LARS or LAMB run resumes from its checkpoint (LARS's momentum; LAMB's m, v and t) bit for
// bit; a checkpoint of the other one is refused.
TEST(AllreduceTrainTest, LarsAndLambResumeFromTheirCheckpointsBitForBit) {
  Dataset data = SmallBlobs();
  for (OptimizerKind kind : {OptimizerKind::kLars, OptimizerKind::kLamb}) {
    SCOPED_TRACE(OptimizerKindName(kind));
    TempDir dir;
    auto straight = RunCheckpointed(data, LayerWiseTrain(kind, 16, 40), dir.path(), false);
    ASSERT_TRUE(straight.ok()) << straight.status();
    ASSERT_TRUE(RunCheckpointed(data, LayerWiseTrain(kind, 16, 20), dir.path(), false).ok());  // checkpoint at 20
    auto resumed = RunCheckpointed(data, LayerWiseTrain(kind, 16, 40), dir.path(), true);
    ASSERT_TRUE(resumed.ok()) << resumed.status();
    EXPECT_EQ(*resumed, *straight);

    const OptimizerKind other = kind == OptimizerKind::kLars ? OptimizerKind::kLamb : OptimizerKind::kLars;
    auto refused = RunCheckpointed(data, LayerWiseTrain(other, 16, 30), dir.path(), true);
    ASSERT_FALSE(refused.ok());
    EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(refused.status().message().find(std::string("was written with --optimizer=") + OptimizerKindName(kind) +
                                              "; this run uses --optimizer=" + OptimizerKindName(other)),
              std::string::npos)
        << refused.status();
  }
}

TEST(AllreduceTrainTest, SparseModelAllGathersItsGradients) {
  SparseLogisticOptions so;
  so.n = 3000;
  so.feature_bits = 14;
  so.nnz = 8;
  Dataset data = MakeSparseLogistic(so);
  ModelOptions mo;
  mo.name = "sparse_logreg";
  mo.feature_bits = 14;
  LocalTrainOptions t;
  t.batch = 25;
  t.epochs = 100;
  t.max_steps = 100;
  t.lr = {LrSchedule::Kind::kConstant, 4.0f, 0, 0.0f};
  auto ar = RunAllreduceJob(3, mo, t, data, 1 << 20);
  ASSERT_TRUE(ar.ok()) << ar.status();
  LocalTrainOptions local = t;
  local.batch = 75;
  std::vector<float> expect = RunLocal(mo, local, 0, data);
  EXPECT_LE(MaxRelativeDiff(*ar, expect, 1e-3), 1e-5);
}

// ZeRO: the same training as plain all-reduce after 200 steps, with 1/n of the optimizer state per
// rank and the same bytes on the wire. Three workers split the MLP's parameters unevenly.
struct ZeroCase {
  int stage;
  OptimizerKind optimizer;
  int n;
};

class ZeroTest : public ::testing::TestWithParam<ZeroCase> {};

TEST_P(ZeroTest, EqualsPlainAllReduceWithAnNthOfTheOptimizerStateAndTheSameBytes) {
  const ZeroCase c = GetParam();
  Dataset data = SmallBlobs();
  LocalTrainOptions t = c.optimizer == OptimizerKind::kAdam ? AdamTrain(8, 200) : SmallTrain(8, 200, 0.9f);
  // Plain: one all-reduce of the whole gradient per step. Stage 2 reduce-scatters buckets of 64
  // floats during backward, each cut at the shards' bounds.
  AllreduceTrainOptions plain;
  plain.overlap = false;
  AllreduceTrainOptions zero = plain;
  zero.zero = c.stage;
  if (c.stage == 2) {
    zero.overlap = true;
    zero.bucket_bytes = zero.first_bucket_bytes = 64 * sizeof(float);
  }
  // The ring for both: each element is summed in the same order (its chunk's, which its shard
  // decides), so the trajectories are the same to the bit.
  auto a = RunAllreduceJobWith(c.n, SmallMlp(), t, data, plain, false, AllReduceAlgo::kRing);
  ASSERT_TRUE(a.ok()) << a.status();
  auto z = RunAllreduceJobWith(c.n, SmallMlp(), t, data, zero, false, AllReduceAlgo::kRing);
  ASSERT_TRUE(z.ok()) << z.status();
  RecordProperty("max_relative_diff_vs_plain", std::to_string(MaxRelativeDiff(z->params, a->params, 1e-3)));
  EXPECT_EQ(z->params, a->params);  // to the bit
  // Optimizer state: each rank its shard's, together the whole.
  size_t total = 0;
  const size_t params = a->params.size(), per_param = a->optimizer_state_bytes[0] / params;
  ASSERT_GT(per_param, 0u);
  for (int r = 0; r < c.n; ++r) {
    EXPECT_EQ(a->optimizer_state_bytes[r], per_param * params);
    EXPECT_EQ(z->optimizer_state_bytes[r], per_param * (ChunkBegin(params, c.n, r + 1) - ChunkBegin(params, c.n, r))) << r;
    total += z->optimizer_state_bytes[r];
  }
  EXPECT_EQ(total, a->optimizer_state_bytes[0]);
  // The bytes on the wire, all ranks together: reduce-scatter + all-gather = all-reduce (stage 2
  // adds the step headers of its buckets).
  uint64_t plain_bytes = 0, zero_bytes = 0;
  for (int r = 0; r < c.n; ++r) {
    plain_bytes += a->bytes_sent[r];
    zero_bytes += z->bytes_sent[r];
  }
  RecordProperty("bytes_plain", std::to_string(plain_bytes));
  RecordProperty("bytes_zero", std::to_string(zero_bytes));
  if (c.stage == 1) {
    EXPECT_EQ(zero_bytes, plain_bytes);
  } else {
    // The same payload; the extra step headers (32 bytes) of at most ceil(P / 64) + 1 buckets
    // per rank and step.
    const uint64_t buckets = params / 64 + 2, headers = 200 * static_cast<uint64_t>(c.n * (c.n - 1)) * buckets * 32;
    EXPECT_GE(zero_bytes, plain_bytes);
    EXPECT_LE(zero_bytes, plain_bytes + headers);
  }
}

INSTANTIATE_TEST_SUITE_P(Stages, ZeroTest,
                         ::testing::Values(ZeroCase{1, OptimizerKind::kSgd, 3}, ZeroCase{1, OptimizerKind::kAdam, 4},
                                           ZeroCase{2, OptimizerKind::kSgd, 4}, ZeroCase{2, OptimizerKind::kAdam, 3}),
                         [](const auto& p) {
                           return "stage" + std::to_string(p.param.stage) + "_" + OptimizerKindName(p.param.optimizer) + "_n" +
                                  std::to_string(p.param.n);
                         });

// On the "device" (NCCL's equal chunks and the all-reduced rest) and with a codec (the codec's
// exchange, then the sharded update): the same parameters as without ZeRO.
TEST(ZeroTest, OnTheDeviceAndWithACodecTrainsAsWithoutIt) {
  Dataset data = SmallBlobs();
  LocalTrainOptions t = SmallTrain(8, 60, 0.9f);
  AllreduceTrainOptions plain, zero;
  zero.zero = 1;
  // Five ranks: the rest past NCCL's equal chunks is not empty.
  auto a = RunAllreduceJobWith(5, SmallMlp(), t, data, plain, /*fake_device=*/true, AllReduceAlgo::kRing);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_NE(a->params.size() % 5, 0u);
  auto z = RunAllreduceJobWith(5, SmallMlp(), t, data, zero, /*fake_device=*/true, AllReduceAlgo::kRing);
  ASSERT_TRUE(z.ok()) << z.status();
  // Not to the bit: on the device the plain run sums NCCL's equal chunks and then the rest in
  // another order than ZeRO's shards, so the two differ in the last bits (a few 1e-7).
  EXPECT_LE(MaxRelativeDiff(z->params, a->params, 1e-3), 1e-6);

  plain.codec.compression = zero.codec.compression = "fp16";
  plain.overlap = zero.overlap = false;
  zero.zero = 2;
  a = RunAllreduceJobWith(3, SmallMlp(), t, data, plain, false, AllReduceAlgo::kRing);
  ASSERT_TRUE(a.ok()) << a.status();
  z = RunAllreduceJobWith(3, SmallMlp(), t, data, zero, false, AllReduceAlgo::kRing);
  ASSERT_TRUE(z.ok()) << z.status();
  EXPECT_EQ(z->params, a->params);
  EXPECT_LT(z->optimizer_state_bytes[0], a->optimizer_state_bytes[0] / 2);
}

// Each rank checkpoints its shard; a resumed run goes on bit for bit; a plain checkpoint resumes
// into ZeRO (each rank takes its cut of the state), a ZeRO checkpoint does not resume without
// --zero, and a missing shard fails every rank naming the one that lacks it.
TEST(ZeroTest, EveryRankCheckpointsItsShardAndResumesFromIt) {
  Dataset data = SmallBlobs();
  TempDir dir;
  auto run = [&](int64_t steps, int zero, bool resume) {
    AllreduceTrainOptions o;
    o.zero = zero;
    o.checkpoint.dir = dir.path();
    o.checkpoint.every = 10;
    o.checkpoint.resume = resume;
    return RunAllreduceJobWith(3, SmallMlp(), AdamTrain(8, steps), data, o, false, AllReduceAlgo::kRing);
  };
  auto straight = run(40, 1, false);
  ASSERT_TRUE(straight.ok()) << straight.status();
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(std::filesystem::exists(dir.path() + "/allreduce-shard-" + std::to_string(r) + ".ckpt")) << r;
  }
  ASSERT_TRUE(run(20, 1, false).ok());  // checkpoint at 20
  auto resumed = run(40, 2, true);      // stage 2 reads stage 1's shards (the same cut)
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ(resumed->params, straight->params);

  auto refused = run(30, 0, true);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("resume with --zero"), std::string::npos) << refused.status();

  auto plain_straight = run(40, 0, false);
  ASSERT_TRUE(plain_straight.ok());
  ASSERT_TRUE(run(20, 0, false).ok());
  auto into_zero = run(40, 1, true);
  ASSERT_TRUE(into_zero.ok()) << into_zero.status();
  EXPECT_EQ(into_zero->params, plain_straight->params);

  ASSERT_TRUE(run(20, 1, false).ok());
  std::filesystem::remove(dir.path() + "/allreduce-shard-1.ckpt");
  std::filesystem::remove(dir.path() + "/allreduce-shard-1.prev.ckpt");
  auto missing = run(40, 1, true);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("rank 1: no shard of step 20"), std::string::npos) << missing.status();
}

// ZeRO with LARS and LAMB: each rank's layers are the model's cut to its shard (a layer the
// shard bounds cut takes the norms of its part). One rank: the whole model, so plain all-reduce
// to the bit; three ranks: each shard's state and a resume from the shard files bit for bit.
TEST(ZeroTest, LarsAndLambUpdateTheirShardAndResumeFromIt) {
  Dataset data = SmallBlobs();
  for (OptimizerKind kind : {OptimizerKind::kLars, OptimizerKind::kLamb}) {
    SCOPED_TRACE(OptimizerKindName(kind));
    AllreduceTrainOptions plain, zero;
    plain.overlap = zero.overlap = false;
    zero.zero = 1;
    auto a = RunAllreduceJobWith(1, SmallMlp(), LayerWiseTrain(kind, 8, 40), data, plain, false, AllReduceAlgo::kRing);
    ASSERT_TRUE(a.ok()) << a.status();
    auto z = RunAllreduceJobWith(1, SmallMlp(), LayerWiseTrain(kind, 8, 40), data, zero, false, AllReduceAlgo::kRing);
    ASSERT_TRUE(z.ok()) << z.status();
    EXPECT_EQ(z->params, a->params);

    TempDir dir;
    auto run = [&](int64_t steps, bool resume) {
      AllreduceTrainOptions o;
      o.zero = 2;
      o.checkpoint.dir = dir.path();
      o.checkpoint.every = 10;
      o.checkpoint.resume = resume;
      return RunAllreduceJobWith(3, SmallMlp(), LayerWiseTrain(kind, 8, steps), data, o, false, AllReduceAlgo::kRing);
    };
    auto straight = run(40, false);
    ASSERT_TRUE(straight.ok()) << straight.status();
    const size_t per = kind == OptimizerKind::kLars ? 1 : 2, params = straight->params.size();
    for (int r = 0; r < 3; ++r) {
      EXPECT_EQ(straight->optimizer_state_bytes[r], per * sizeof(float) * (ChunkBegin(params, 3, r + 1) - ChunkBegin(params, 3, r)));
    }
    ASSERT_TRUE(run(20, false).ok());
    auto resumed = run(40, true);
    ASSERT_TRUE(resumed.ok()) << resumed.status();
    EXPECT_EQ(resumed->params, straight->params);
  }
}

}  // namespace
}  // namespace gradsync::testing
