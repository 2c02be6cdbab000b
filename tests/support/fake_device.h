// Test support: a "device" model and collective that run on the CPU, so that the trainers' device
// paths (--device=cuda) are checked on machines without a GPU.
//
// FakeDeviceModel keeps its real tensors in an inner CPU model (the "device") and exposes
// params()/grads() as host mirrors that change only through ParamsToHost / GradsToHost /
// ParamsToDevice, as the CUDA model's do. Each ForwardBackward poisons the host gradient with
// NaN, so a trainer that pushes or reads it without GradsToHost diverges at once; the optimizer
// runs on the inner model (OptimizerStep). HostDeviceCollective all-reduces "device" pointers
// (host memory here) through a CPU collective.
#pragma once

#include <memory>

#include "allreduce/collective.h"
#include "common/optim/optimizer.h"
#include "models/model.h"

namespace gradsync::testing {

class FakeDeviceModel final : public Model {
 public:
  explicit FakeDeviceModel(const ModelOptions& options);

  std::string name() const override { return inner_->name(); }
  void Initialize(uint64_t seed) override;
  float ForwardBackward(const Batch& batch) override;
  EvalStats EvaluateBatch(const Batch& batch) override { return inner_->EvaluateBatch(batch); }

  bool on_device() const override { return true; }
  Status GradsToHost() override;
  Status ParamsToHost() override;
  Status ParamsToDevice() override;
  float* device_grads() override { return inner_->grads().data(); }
  float* device_params() override { return inner_->params().data(); }
  void* device_stream() override { return this; }
  Status SetOptimizer(const OptimizerOptions& options) override;
  Status SetOptimizerRanges(const OptimizerOptions& options, const std::vector<Segment>& ranges) override;
  Status OptimizerStep(float lr) override;
  // 16-bit precisions: the inner gradient through a 16-bit buffer, as the CUDA model's.
  uint16_t* device_grads16() override { return grads16_.empty() ? nullptr : grads16_.data(); }
  Status PackGrads16(float scale) override;
  Status UnpackGrads16(float scale) override;
  Result<bool> GradsFinite() override { return finite_; }

  int uploads() const { return uploads_; }

 private:
  std::unique_ptr<Model> inner_;
  std::unique_ptr<Optimizer> optimizer_;
  std::vector<Segment> ranges_;
  std::vector<uint16_t> grads16_;
  bool finite_ = true;
  int uploads_ = 0;
};

class HostDeviceCollective final : public DeviceCollective {
 public:
  explicit HostDeviceCollective(Collective* cpu) : cpu_(cpu) {}
  int rank() const override { return cpu_->rank(); }
  int size() const override { return cpu_->size(); }
  Status AllReduceDevice(float* data, size_t count, ReduceOp op, void* stream) override;
  Status AllReduceDevice16(uint16_t* data, size_t count, Float16 format, void* stream) override;
  Status ReduceScatterDevice(float* data, size_t count, ReduceOp op, void* stream) override;
  Status AllGatherDevice(float* data, size_t count, void* stream) override;
  Status SynchronizeDevice(void*, double) override { return OkStatus(); }
  uint64_t elements_reduced() const override { return elements_; }

 private:
  Collective* cpu_;
  uint64_t elements_ = 0;
};

}  // namespace gradsync::testing
