#include "tests/support/fake_device.h"

#include <algorithm>
#include <limits>

#include "common/base/check.h"

namespace gradsync::testing {

FakeDeviceModel::FakeDeviceModel(const ModelOptions& options) {
  auto m = CreateModel(options);
  GRADSYNC_CHECK(m.ok()) << m.status();
  inner_ = std::move(m).value();
  SetLayout(inner_->layout());
  precision_ = inner_->precision();
  if (precision_ != Precision::kFp32) grads16_.assign(static_cast<size_t>(num_params()), 0);
  // The inner model reports readiness; pass it on.
  inner_->set_grad_ready([this](size_t t) { GradReady(t); });
}

void FakeDeviceModel::Initialize(uint64_t seed) {
  inner_->Initialize(seed);
  std::copy(inner_->params().begin(), inner_->params().end(), params_.begin());
}

float FakeDeviceModel::ForwardBackward(const Batch& batch) {
  std::fill(grads_.begin(), grads_.end(), std::numeric_limits<float>::quiet_NaN());
  inner_->set_loss_scale(loss_scale());
  return inner_->ForwardBackward(batch);
}

Status FakeDeviceModel::GradsToHost() {
  std::copy(inner_->grads().begin(), inner_->grads().end(), grads_.begin());
  return OkStatus();
}

Status FakeDeviceModel::ParamsToHost() {
  std::copy(inner_->params().begin(), inner_->params().end(), params_.begin());
  return OkStatus();
}

Status FakeDeviceModel::ParamsToDevice() {
  ++uploads_;
  std::copy(params_.begin(), params_.end(), inner_->params().begin());
  return OkStatus();
}

Status FakeDeviceModel::SetOptimizer(const OptimizerOptions& options) {
  return SetOptimizerRanges(options, {Segment{0, inner_->num_params()}});
}

Status FakeDeviceModel::SetOptimizerRanges(const OptimizerOptions& options, const std::vector<Segment>& ranges) {
  RETURN_IF_ERROR(ValidateOptimizerOptions(options));
  if (options.kind != OptimizerKind::kSgd) {  // as the CUDA models (models/cuda/)
    return UnimplementedError(name() + ": the device optimizer is SGD's; " + OptimizerKindName(options.kind) + " runs on the host or the servers");
  }
  int64_t state = 0;
  for (const Segment& r : ranges) state += r.size();
  optimizer_ = std::make_unique<Optimizer>(options, state);
  ranges_ = ranges;
  return OkStatus();
}

// As the CUDA models: each range's state follows the previous one's.
Status FakeDeviceModel::OptimizerStep(float lr) {
  if (!optimizer_) return FailedPreconditionError("OptimizerStep before SetOptimizer");
  int64_t state = 0;
  for (const Segment& r : ranges_) {
    optimizer_->Step(inner_->params().subspan(r.begin, r.size()), inner_->grads().subspan(r.begin, r.size()), lr, state);
    state += r.size();
  }
  optimizer_->EndStep();
  return OkStatus();
}

Status FakeDeviceModel::PackGrads16(float scale) {
  const auto format = PrecisionFormat(precision_);
  if (!format) return FailedPreconditionError("PackGrads16 on an fp32 model");
  std::vector<float> scaled(inner_->grads().begin(), inner_->grads().end());
  Scale(scaled, scale);
  FloatsTo16(*format, scaled.data(), scaled.size(), grads16_.data());
  return OkStatus();
}

Status FakeDeviceModel::UnpackGrads16(float scale) {
  const auto format = PrecisionFormat(precision_);
  if (!format) return FailedPreconditionError("UnpackGrads16 on an fp32 model");
  Float16sToFloats(*format, grads16_.data(), grads16_.size(), inner_->grads().data());
  Scale(inner_->grads(), scale);
  finite_ = AllFinite(inner_->grads());
  return OkStatus();
}

Status HostDeviceCollective::AllReduceDevice16(uint16_t* data, size_t count, Float16 format, void*) {
  elements_ += count;
  return cpu_->AllReduce16(std::span<uint16_t>(data, count), format);
}

Status HostDeviceCollective::AllReduceDevice(float* data, size_t count, ReduceOp op, void*) {
  elements_ += count;
  return cpu_->AllReduce(FloatSpan(data, count), op);
}

// As NCCL: equal chunks only.
Status HostDeviceCollective::ReduceScatterDevice(float* data, size_t count, ReduceOp op, void*) {
  if (count % static_cast<size_t>(size()) != 0) return InvalidArgumentError("reduce-scatter: count not a multiple of the ranks");
  elements_ += count;
  return cpu_->ReduceScatter(FloatSpan(data, count), op);
}

Status HostDeviceCollective::AllGatherDevice(float* data, size_t count, void*) {
  if (count % static_cast<size_t>(size()) != 0) return InvalidArgumentError("all-gather: count not a multiple of the ranks");
  elements_ += count;
  return cpu_->AllGatherChunks(FloatSpan(data, count));
}

}  // namespace gradsync::testing
