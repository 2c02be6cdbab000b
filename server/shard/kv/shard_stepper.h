// ShardStepper: the shard's optimizer (common/optim/optimizer.h: its state and steps) and how it
// steps the shard's values: a dense run in pieces over the apply threads (LARS, LAMB: cut at
// layer boundaries only, one layer per piece, so each trust ratio is over a layer's whole part in
// the shard), and the scale of one worker's push, which moves the parameters about 1/N of a step:
//   SGD:  the gradient g / N (weight decay divided by N too, so N pushes decay once);
//   Adam, LARS, LAMB: g itself at rate lr / N (their step does not follow g's scale: Adam's and
//         LAMB's m / sqrt(v), LARS's trust ratio), weight decay undivided.
// Also the checks of an optimizer state set whole (a worker's STATE_PUSH, a backup's copy).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/base/numeric/parallel_for.h"
#include "common/base/numeric/segment.h"
#include "common/base/status.h"
#include "common/optim/optimizer.h"

namespace gradsync {

class ShardStepper {
 public:
  // An optimizer over `size` values with `layers` (OptimizerLayers, local); `aggregate`: pushes
  // are summed per round and stepped once (no per-push scale on the weight decay).
  ShardStepper(const OptimizerOptions& options, int num_workers, bool aggregate, int64_t size,
               std::vector<OptimizerLayer> layers);

  const Optimizer& optimizer() const { return optimizer_; }
  Optimizer& optimizer() { return optimizer_; }
  // Large dense updates split over these threads (null: this thread alone). The same bits either
  // way: the optimizer's update is element-wise (LARS, LAMB: per layer, one layer per thread).
  void set_parallel(ParallelFor* pool) { parallel_ = pool; }
  // One push's scales (Apply): its gradient's (SGD 1/N, the others 1) and its rate's (SGD 1,
  // Adam, LARS, LAMB 1/N).
  float push_grad_scale() const { return push_grad_scale_; }
  float push_lr_scale() const { return push_lr_scale_; }
  bool layer_wise() const { return layer_wise_; }  // LARS, LAMB

  // optimizer().Step over the dense run of `params` at `local`, in pieces over the threads when it
  // is large; `clear` (the gradient g itself, or null) is zeroed piece by piece after use.
  void StepDense(float* params, int64_t local, std::span<const float> g, float lr, float grad_scale, float* clear);
  // Sets the optimizer's state (its vectors over `size` values each), steps taken and per layer
  // the steps skipped, or kInvalidArgument and nothing changes (KvShard::SetOptimizerState).
  Status SetState(std::span<const float> state, int64_t steps, std::span<const int64_t> skipped, size_t size);

 private:
  Optimizer optimizer_;
  ParallelFor* parallel_ = nullptr;
  float push_grad_scale_;
  float push_lr_scale_;
  bool layer_wise_;
  std::vector<Segment> layer_cuts_;  // StepDense: a run's layers, local to the run
};

}  // namespace gradsync
