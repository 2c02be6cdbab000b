#include "worker/sync/local_sync.h"

#include <cmath>

#include "common/base/clock.h"
#include "worker/loop/epoch.h"

namespace gradsync {

Result<int64_t> LocalSync::Start(const JobShape& shape) {
  lr_ = RunSchedule(options_, shape.total_steps, shape.steps_per_epoch);
  const bool device = model_->on_device();
  if (device) RETURN_IF_ERROR(model_->SetOptimizer(options_.optimizer));
  opt_.emplace(options_.optimizer, device ? 0 : model_->num_params());
  opt_->SetLayers(OptimizerLayers(model_->layout(), {0, device ? 0 : model_->num_params()}));
  return int64_t{0};
}

Result<SyncStepStats> LocalSync::FinishStep() {
  Stopwatch update;
  const float rate = std::isnan(step_lr_) ? lr_.At(step_) : step_lr_;
  if (model_->on_device() && scaling_.active()) {
    // fp16 on the device: the gradient is unscaled there and its finiteness read back (the
    // step's one extra wait) before the optimizer is enqueued.
    RETURN_IF_ERROR(model_->PackGrads16(1.0f));
    RETURN_IF_ERROR(model_->UnpackGrads16(scaling_.inverse()));
    ASSIGN_OR_RETURN(const bool finite, model_->GradsFinite());
    if (scaling_.Finish(finite)) RETURN_IF_ERROR(model_->OptimizerStep(rate));
  } else if (model_->on_device()) {
    RETURN_IF_ERROR(model_->OptimizerStep(rate));  // enqueued; the next loss waits for it
  } else if (scaling_.Finish(!scaling_.active() || AllFinite(model_->grads()))) {
    ApplyGradients(*model_, *opt_, rate, scaling_.inverse());
  }
  if (step_tables_ != nullptr) RETURN_IF_ERROR(tables_.Apply(step_tables_->ids, step_tables_->grads, rate));
  SyncStepStats stats;
  scaling_.Report(&stats);
  stats.table_rows = TableStepRows(step_tables_);
  stats.compute_ms = update.Millis();  // the local update is the step's computation
  return stats;
}

}  // namespace gradsync
