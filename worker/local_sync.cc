#include "worker/local_sync.h"

#include <cmath>

#include "common/clock.h"
#include "worker/epoch.h"

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
  if (model_->on_device()) {
    RETURN_IF_ERROR(model_->OptimizerStep(rate));  // enqueued; the next loss waits for it
  } else {
    ApplyGradients(*model_, *opt_, rate);
  }
  SyncStepStats stats;
  stats.compute_ms = update.Millis();  // the local update is the step's computation
  return stats;
}

}  // namespace gradsync
