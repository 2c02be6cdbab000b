// The CUDA backend against the CPU one. Built with CUDA; the tests that need a GPU skip, saying
// so, where none is visible, and fail where one is listed that CUDA cannot use
// (GRADSYNC_REQUIRE_GPU, support/gpu_gate.h); the option checks run everywhere.
#include "models/cuda/cuda_model.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "common/base/numeric/rng.h"
#include "common/base/numeric/tensor.h"
#include "common/optim/optimizer.h"
#include "models/model.h"
#include "tests/support/cuda_gate.h"

namespace gradsync {
namespace {

ModelOptions Options(const std::string& name, std::vector<int64_t> hidden = {256, 128}) {
  ModelOptions o;
  o.name = name;
  o.input_dim = 784;
  o.num_classes = 10;
  o.hidden = std::move(hidden);
  return o;
}

// A random batch: inputs ~ N(0, 1)-ish (uniform in [-2, 2)), labels uniform.
struct RandomBatch {
  std::vector<float> x;
  std::vector<int32_t> y;
  Batch batch;
  RandomBatch(int64_t b, int64_t dim, int classes, uint64_t seed) : x(static_cast<size_t>(b * dim)), y(b) {
    Rng rng(seed);
    for (float& v : x) v = rng.Uniform(-2.0f, 2.0f);
    for (int32_t& l : y) l = static_cast<int32_t>(rng.UniformInt(static_cast<uint64_t>(classes)));
    batch.size = b;
    batch.dim = dim;
    batch.x = x.data();
    batch.labels = y;
  }
};

// max_i |a_i - b_i| / max_i |a_i|: the error relative to the tensor's scale.
double ScaledDiff(ConstFloatSpan a, ConstFloatSpan b) {
  double diff = 0, scale = 1e-30;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, static_cast<double>(std::fabs(a[i] - b[i])));
    scale = std::max(scale, static_cast<double>(std::fabs(a[i])));
  }
  return diff / scale;
}

TEST(CudaModelTest, RejectsWhatItCannotRunWithAClearError) {
  auto sparse = CreateCudaModel(Options("sparse_logreg"), {});
  EXPECT_EQ(sparse.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(sparse.status().message().find("no CUDA backend"), std::string::npos);
  auto bad = CreateCudaModel(Options("mlp", {}), {});
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  if (CudaDeviceCount() == 0) {
    auto none = CreateCudaModel(Options("mlp"), {});
    EXPECT_EQ(none.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(none.status().message().find("no CUDA device"), std::string::npos) << none.status();
  } else {
    auto missing = CreateCudaModel(Options("mlp"), {.device = CudaDeviceCount()});
    EXPECT_EQ(missing.status().code(), StatusCode::kFailedPrecondition);
  }
}

TEST(CudaModelTest, ForwardBackwardEqualsTheCpuBackend) {
  GRADSYNC_REQUIRE_GPU();
  for (const std::string name : {"softmax", "mlp"}) {
    for (int64_t b : {1, 64, 300}) {
      SCOPED_TRACE(name + " batch " + std::to_string(b));
      auto cpu = std::move(CreateModel(Options(name))).value();
      auto gpu = std::move(CreateCudaModel(Options(name), {})).value();
      cpu->Initialize(7);
      gpu->Initialize(7);
      ASSERT_TRUE(std::equal(cpu->params().begin(), cpu->params().end(), gpu->params().begin()));
      RandomBatch rb(b, 784, 10, 11 + static_cast<uint64_t>(b));
      const float loss_cpu = cpu->ForwardBackward(rb.batch);
      const float loss_gpu = gpu->ForwardBackward(rb.batch);
      EXPECT_NEAR(loss_gpu, loss_cpu, 1e-4 * std::fabs(loss_cpu));
      ASSERT_TRUE(gpu->GradsToHost().ok());
      for (size_t t = 0; t < cpu->layout().size(); ++t) {
        EXPECT_LE(ScaledDiff(cpu->grad(t), gpu->grad(t)), 1e-4) << cpu->layout()[t].name;
      }
      const EvalStats ec = cpu->EvaluateBatch(rb.batch), eg = gpu->EvaluateBatch(rb.batch);
      EXPECT_EQ(eg.count, ec.count);
      EXPECT_NEAR(eg.loss_sum, ec.loss_sum, 1e-4 * std::fabs(ec.loss_sum));
      EXPECT_NEAR(static_cast<double>(eg.correct), static_cast<double>(ec.correct), 1.0);  // a tie may flip
    }
  }
}

TEST(CudaModelTest, FiftyStepsFollowTheCpuTrajectory) {
  GRADSYNC_REQUIRE_GPU();
  OptimizerOptions oo;
  oo.momentum = 0.9f;
  oo.weight_decay = 1e-4f;
  auto cpu = std::move(CreateModel(Options("mlp"))).value();
  auto gpu = std::move(CreateCudaModel(Options("mlp"), {})).value();
  cpu->Initialize(3);
  gpu->Initialize(3);
  Optimizer opt(oo, cpu->num_params());
  ASSERT_TRUE(gpu->SetOptimizer(oo).ok());
  std::vector<float> loss_cpu, loss_gpu;
  for (int step = 0; step < 50; ++step) {
    RandomBatch rb(64, 784, 10, 100 + static_cast<uint64_t>(step));
    loss_cpu.push_back(cpu->ForwardBackward(rb.batch));
    opt.Step(cpu->params(), cpu->grads(), 0.05f);
    loss_gpu.push_back(gpu->ForwardBackward(rb.batch));
    ASSERT_TRUE(gpu->OptimizerStep(0.05f).ok());
  }
  ASSERT_TRUE(gpu->ParamsToHost().ok());
  for (size_t t = 0; t < cpu->layout().size(); ++t) {
    EXPECT_LE(ScaledDiff(cpu->tensor(t), gpu->tensor(t)), 1e-3) << cpu->layout()[t].name;
  }
  for (int step = 0; step < 50; ++step) EXPECT_NEAR(loss_gpu[step], loss_cpu[step], 1e-3 * loss_cpu[step]) << step;
}

TEST(CudaModelTest, StreamedGradientsAndUploadedParametersAreTheDevicesOwn) {
  GRADSYNC_REQUIRE_GPU();
  auto plain = std::move(CreateCudaModel(Options("mlp"), {})).value();
  auto streamed = std::move(CreateCudaModel(Options("mlp"), {.stream_grads_to_host = true})).value();
  std::vector<size_t> order;
  streamed->set_grad_ready([&](size_t t) { order.push_back(t); });
  plain->Initialize(5);
  streamed->Initialize(5);
  RandomBatch rb(128, 784, 10, 9);
  plain->ForwardBackward(rb.batch);
  streamed->ForwardBackward(rb.batch);
  ASSERT_TRUE(plain->GradsToHost().ok());
  ASSERT_TRUE(streamed->GradsToHost().ok());
  EXPECT_TRUE(std::equal(plain->grads().begin(), plain->grads().end(), streamed->grads().begin()));
  EXPECT_EQ(order, (std::vector<size_t>{4, 5, 2, 3, 0, 1}));  // the last layer first

  // A host write uploaded with ParamsToDevice is what the device computes with and returns.
  for (float& w : plain->params()) w *= 0.5f;
  std::vector<float> halved(plain->params().begin(), plain->params().end());
  ASSERT_TRUE(plain->ParamsToDevice().ok());
  std::fill(plain->params().begin(), plain->params().end(), 0.0f);
  ASSERT_TRUE(plain->ParamsToHost().ok());
  EXPECT_TRUE(std::equal(halved.begin(), halved.end(), plain->params().begin()));
  EXPECT_EQ(plain->OptimizerStep(0.1f).code(), StatusCode::kFailedPrecondition);  // no SetOptimizer
}

// The device optimizer is SGD's: LARS and LAMB (as Adam) are refused with one line that says
// where they run (the host, the servers); Validate() refuses --device=cuda with them outside the
// PS modes before a model is built.
TEST(CudaModelTest, LarsAndLambAreRefusedWithOneClearLine) {
  GRADSYNC_REQUIRE_GPU();
  auto gpu = std::move(CreateCudaModel(Options("mlp"), {})).value();
  for (OptimizerKind kind : {OptimizerKind::kLars, OptimizerKind::kLamb}) {
    OptimizerOptions o;
    o.kind = kind;
    if (kind == OptimizerKind::kLars) o.momentum = 0.9f;
    for (const Status& s : {gpu->SetOptimizer(o), gpu->SetOptimizerRanges(o, {Segment{0, gpu->num_params()}})}) {
      EXPECT_EQ(s.code(), StatusCode::kUnimplemented) << s;
      EXPECT_NE(s.message().find(std::string(OptimizerKindName(kind)) + " runs on the servers in the PS modes only"),
                std::string::npos)
          << s;
      EXPECT_EQ(s.message().find('\n'), std::string::npos) << s;
    }
  }
  EXPECT_EQ(gpu->OptimizerStep(0.1f).code(), StatusCode::kFailedPrecondition);  // nothing was set
}

TEST(CudaModelTest, CpuModelsRunTheirOptimizerOnTheHost) {
  auto cpu = std::move(CreateModel(Options("mlp"))).value();
  EXPECT_FALSE(cpu->on_device());
  EXPECT_EQ(cpu->device_grads(), nullptr);
  EXPECT_TRUE(cpu->GradsToHost().ok());
  EXPECT_EQ(cpu->OptimizerStep(0.1f).code(), StatusCode::kUnimplemented);
}

}  // namespace
}  // namespace gradsync

namespace gradsync {
namespace {

// --precision=bf16|fp16 on the GPU: GemmEx with 16-bit operands against the CPU model of the
// same precision (rounded operands, fp32 accumulation): the same numerics up to where the
// roundings fall, so close to each other and to fp32; the 16-bit gradient packs, unpacks with
// the scale divided out, and an overflow is seen.
TEST(CudaModelTest, SixteenBitPrecisionsTrackTheCpuAndCatchOverflow) {
  GRADSYNC_REQUIRE_GPU();
  for (Precision p : {Precision::kBf16, Precision::kFp16}) {
    SCOPED_TRACE(PrecisionName(p));
    ModelOptions o = Options("mlp");
    auto fp32 = std::move(CreateModel(o)).value();
    o.precision = p;
    auto cpu = std::move(CreateModel(o)).value();
    auto gpu = std::move(CreateCudaModel(o, {})).value();
    ASSERT_EQ(gpu->precision(), p);
    fp32->Initialize(7);
    cpu->Initialize(7);
    gpu->Initialize(7);
    RandomBatch rb(256, 784, 10, 3);
    const float loss32 = fp32->ForwardBackward(rb.batch);
    const float loss_cpu = cpu->ForwardBackward(rb.batch);
    const float loss_gpu = gpu->ForwardBackward(rb.batch);
    EXPECT_NEAR(loss_gpu, loss_cpu, 0.02 * loss32);
    EXPECT_NEAR(loss_gpu, loss32, 0.03 * loss32);
    ASSERT_TRUE(gpu->GradsToHost().ok());
    // (The GPU rounds each GEMM output to 16 bits before the bias, the CPU after it: fp16 lands
    // 1-2% of the scale apart at the extremes, bf16 more.)
    const double tolerance = p == Precision::kBf16 ? 0.08 : 0.03;
    EXPECT_LT(ScaledDiff(fp32->grads(), gpu->grads()), tolerance);
    EXPECT_LT(ScaledDiff(cpu->grads(), gpu->grads()), tolerance);
    // Through 16 bits and back with a scale: a power of two, so only the rounding to 16 bits.
    std::vector<float> before(gpu->grads().begin(), gpu->grads().end());
    ASSERT_TRUE(gpu->PackGrads16(0.25f).ok());
    ASSERT_TRUE(gpu->UnpackGrads16(4.0f).ok());
    auto finite = gpu->GradsFinite();
    ASSERT_TRUE(finite.ok()) << finite.status();
    EXPECT_TRUE(*finite);
    ASSERT_TRUE(gpu->GradsToHost().ok());
    EXPECT_LT(ScaledDiff(before, gpu->grads()), p == Precision::kBf16 ? 8e-3 : 1e-3);
    // A loss scale far too large: fp16 overflows, bf16 has float's range.
    gpu->set_loss_scale(1e12f);
    gpu->ForwardBackward(rb.batch);
    ASSERT_TRUE(gpu->PackGrads16(1.0f).ok());
    ASSERT_TRUE(gpu->UnpackGrads16(1e-12f).ok());
    finite = gpu->GradsFinite();
    ASSERT_TRUE(finite.ok()) << finite.status();
    EXPECT_EQ(*finite, p == Precision::kBf16);
    // An optimizer step on the 16-bit model moves the fp32 masters.
    gpu->set_loss_scale(1.0f);
    ASSERT_TRUE(gpu->SetOptimizer(OptimizerOptions{}).ok());
    ASSERT_TRUE(gpu->ParamsToHost().ok());
    std::vector<float> w0(gpu->params().begin(), gpu->params().end());
    gpu->ForwardBackward(rb.batch);
    ASSERT_TRUE(gpu->OptimizerStep(0.1f).ok());
    ASSERT_TRUE(gpu->ParamsToHost().ok());
    EXPECT_NE(w0, std::vector<float>(gpu->params().begin(), gpu->params().end()));
    EXPECT_TRUE(AllFinite(gpu->params()));
    // Evaluation runs in the same precision.
    EvalStats e = gpu->EvaluateBatch(rb.batch);
    EXPECT_EQ(e.count, 256);
    EXPECT_TRUE(std::isfinite(e.loss_sum));
  }
}

}  // namespace
}  // namespace gradsync
