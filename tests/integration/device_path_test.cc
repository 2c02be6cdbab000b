// The trainers' device path (--device=cuda) on the CPU: FakeDeviceModel keeps its tensors apart
// from the host mirrors, so every upload, gradient copy and device optimizer step the trainers
// must make is checked here, on machines without a GPU. (The CUDA kernels themselves are checked
// against the CPU backend in models_cuda_test, on a GPU.)
#include <gtest/gtest.h>

#include "common/synthetic.h"
#include "common/tensor.h"
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
