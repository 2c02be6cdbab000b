// The trainers' device path (--device=cuda) on the CPU: FakeDeviceModel keeps its tensors apart
// from the host mirrors, so every upload, gradient copy and device optimizer step the trainers
// must make is checked here, on machines without a GPU. (The CUDA kernels themselves are checked
// against the CPU backend in models_cuda_test, on a GPU.)
#include <gtest/gtest.h>

#include <cmath>

#include "common/base/numeric/tensor.h"
#include "common/data/synthetic.h"
#include "tests/support/fake_device.h"
#include "tests/support/ps_job.h"

namespace gradsync::testing {
namespace {

struct Job {
  Dataset data;
  ModelOptions model;
  LocalTrainOptions train;
  Job() {
    BlobsOptions bo;
    bo.n = 1600;
    bo.dim = 12;
    bo.classes = 4;
    bo.center_scale = 0.8f;
    data = MakeGaussianBlobs(bo);
    model.name = "mlp";
    model.input_dim = 12;
    model.num_classes = 4;
    model.hidden = {16};
    train.batch = 8;
    train.epochs = 100;
    train.max_steps = 120;
    train.seed = 5;
    train.lr = {LrSchedule::Kind::kCosine, 0.02f, 120, 0.0f};
    train.optimizer.momentum = 0.9f;
    train.optimizer.weight_decay = 1e-4f;
  }
};

TEST(DevicePathTest, LocalTrainingOnTheDeviceEqualsTheHost) {
  Job s;
  const std::vector<float> host = RunLocal(s.model, s.train, 0, s.data);
  const std::vector<float> device = RunLocal(s.model, s.train, 0, s.data, /*fake_device=*/true);
  EXPECT_EQ(device, host);  // the same optimizer rule on the same gradients
}

TEST(DevicePathTest, AllreduceOnDeviceBuffersEqualsTheHostRing) {
  Job s;
  // One bucket on the host: the same ring over the same buffer, so the same bits.
  auto host = RunAllreduceJob(4, s.model, s.train, s.data, 1 << 20);
  ASSERT_TRUE(host.ok()) << host.status();
  auto device = RunAllreduceJob(4, s.model, s.train, s.data, 1 << 20, "", false, 0, /*fake_device=*/true);
  ASSERT_TRUE(device.ok()) << device.status();
  EXPECT_EQ(*device, *host);
  // That the host ring equals local SGD with the global batch is allreduce_train_test's to show,
  // on a model whose training does not amplify rounding: this one's does (two exact summation
  // orders of the same batch of 32 end 2.6e-3 apart on one BLAS kernel and 2e-5 on another).
}

// --precision=bf16|fp16: the host ring sums the 16-bit codec's values; the device path packs
// the gradient into 16 bits, sums it there (NCCL on a GPU) and unpacks it with the loss scale
// divided out. Both are the same arithmetic, so the same bits; and the ring moves half the bytes
// of fp32's.
TEST(DevicePathTest, SixteenBitAllreduceOnTheDeviceEqualsTheHostAndHalvesTheBytes) {
  Job s;
  s.model.hidden = {256};  // ~4.4k parameters: the ring's per-step headers are noise beside them
  AllreduceTrainOptions base;
  base.bucket_bytes = 1 << 20;
  base.overlap = false;
  auto fp32 = RunAllreduceJobWith(4, s.model, s.train, s.data, base, false, AllReduceAlgo::kRing);
  ASSERT_TRUE(fp32.ok()) << fp32.status();
  for (Precision p : {Precision::kBf16, Precision::kFp16}) {
    s.model.precision = s.train.numerics.precision = p;
    auto host = RunAllreduceJobWith(4, s.model, s.train, s.data, base, false, AllReduceAlgo::kRing);
    ASSERT_TRUE(host.ok()) << host.status();
    auto device = RunAllreduceJobWith(4, s.model, s.train, s.data, base, /*fake_device=*/true, AllReduceAlgo::kRing);
    ASSERT_TRUE(device.ok()) << device.status();
    EXPECT_EQ(device->params, host->params) << PrecisionName(p);
    EXPECT_GT(MaxRelativeDiff(host->params, fp32->params, 1e-3), 0.0) << PrecisionName(p) << ": nothing was rounded";
    // Near fp32's trajectory as a whole (fp16 skips its first steps while the scale finds its level).
    std::vector<float> diff = host->params;
    Axpy(-1.0f, fp32->params, diff);
    const double relative = std::sqrt(SquaredNorm(diff) / SquaredNorm(fp32->params));
    RecordProperty("relative_l2_vs_fp32_" + std::string(PrecisionName(p)), std::to_string(relative));
    EXPECT_LT(relative, 0.1) << PrecisionName(p);
    for (size_t r = 0; r < 4; ++r) {
      const double ratio = static_cast<double>(host->bytes_sent[r]) / static_cast<double>(fp32->bytes_sent[r]);
      RecordProperty("bytes_ratio_" + std::string(PrecisionName(p)), std::to_string(ratio));
      EXPECT_LT(ratio, 0.56) << PrecisionName(p) << " rank " << r;
      EXPECT_GT(ratio, 0.45) << PrecisionName(p) << " rank " << r;
    }
  }
}

TEST(DevicePathTest, PsWorkersOnTheDeviceEqualHostWorkers) {
  Job s;
  for (ConsistencyMode mode : {ConsistencyMode::kBsp, ConsistencyMode::kSsp}) {
    PsJobOptions ps;
    ps.mode = mode;
    ps.staleness = 0;  // ssp with s = 0 is bsp: deterministic, so the two runs must agree
    ps.num_servers = 2;
    ps.num_workers = 2;
    ps.model = s.model;
    ps.train = s.train;
    PsJobResult host = RunPsJob(ps, s.data, s.data);
    ASSERT_TRUE(host.status.ok()) << host.status;
    ps.fake_device = true;
    PsJobResult device = RunPsJob(ps, s.data, s.data);
    ASSERT_TRUE(device.status.ok()) << device.status;
    EXPECT_EQ(device.params, host.params);
  }
}

TEST(DevicePathTest, DeviceModelsRefuseAccumulation) {
  Job s;
  s.train.micro_batch = 4;
  FakeDeviceModel m(s.model);
  m.Initialize(0);
  LocalTrainer t(s.train, &m, &s.data, &s.data, nullptr);
  auto r = t.Run();
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace gradsync::testing
