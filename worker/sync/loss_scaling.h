// LossScaling: the dynamic loss scaling of --precision=fp16, as the syncs that own a step's
// update (local, all-reduce) or its push (PS) run it.
//
//   LossScaling scaling(options.numerics);
//   BeginStep:   scaling.Begin(*model);             // the model's gradient is scale * the mean loss's
//   FinishStep:  (all-reduce: after averaging, so that every rank decides alike)
//                if (scaling.Finish(AllFinite(grads))) optimizer.Step(..., scaling.inverse());
//                scaling.Report(&stats);
//
// bf16 and fp32 do not scale: Begin leaves the model's scale at 1, Finish applies every step.
#pragma once

#include "common/optim/precision.h"
#include "models/model.h"
#include "worker/loop/train_options.h"
#include "worker/sync/gradient_sync.h"

namespace gradsync {

class LossScaling {
 public:
  explicit LossScaling(const PrecisionOptions& o)
      : active_(o.precision == Precision::kFp16), scaler_(DynamicLossScaler::Options{.initial = o.initial_loss_scale}) {}

  bool active() const { return active_; }
  // Sets the model's loss scale for the step about to be computed; returns the factor that
  // brings its gradient back to the mean loss's (1 / scale; 1 when inactive).
  void Begin(Model& model) {
    if (active_) model.set_loss_scale(scaler_.scale());
    step_scale_ = active_ ? scaler_.scale() : 1.0f;
  }
  float inverse() const { return 1.0f / step_scale_; }
  // After the step's gradient is final: whether to apply it (false: an fp16 gradient that
  // overflowed; the scale is halved). Call once per step.
  bool Finish(bool finite) { return !active_ || scaler_.Update(finite); }
  void Report(SyncStepStats* stats) const {
    if (!active_) return;
    stats->loss_scale = step_scale_;
    stats->skipped_steps = scaler_.skipped();
  }
  const DynamicLossScaler& scaler() const { return scaler_; }
  DynamicLossScaler& scaler() { return scaler_; }

 private:
  bool active_;
  DynamicLossScaler scaler_;
  float step_scale_ = 1.0f;
};

}  // namespace gradsync
