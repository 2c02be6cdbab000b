#include "worker/allreduce/tables/table_allreduce_sync.h"

#include <string>

#include "common/base/clock.h"
#include "common/obs/trace.h"
#include "worker/loop/epoch.h"

namespace gradsync {

Result<int64_t> TableAllreduceSync::Start(const JobShape& shape) {
  const AllreduceCheckpointOptions& c = options_.checkpoint;
  if (c.resume || c.every > 0) {
    return InvalidArgumentError(
        "all-reduce checkpoints do not carry the embedding tables' replicas yet: a model with "
        "tables trains without --checkpoint-every and --resume");
  }
  lr_ = RunSchedule(options_.train, shape.total_steps, shape.steps_per_epoch);
  RETURN_IF_ERROR(rows_.CheckSameTables(*collective_));
  return dense_->Start(shape);
}

Status TableAllreduceSync::BeginStep(const StepPlan& plan) {
  RETURN_IF_ERROR(dense_->BeginStep(plan));
  step_ = plan.step;
  step_lr_ = plan.lr;
  step_tables_ = plan.tables;
  return step_tables_ != nullptr ? rows_.Read(step_tables_->ids, step_tables_->rows) : OkStatus();
}

Result<SyncStepStats> TableAllreduceSync::FinishStep() {
  // Every worker gathers every step, rows or none, so that the collective's calls pair up.
  Stopwatch gather;
  Status gathered = [&] {
    TraceSpan span("table rows all-gather", "comm");
    return step_tables_ != nullptr ? rows_.Gather(step_tables_->ids, step_tables_->grads, *collective_)
                                   : rows_.Gather({}, {}, *collective_);
  }();
  const double gather_ms = gather.Millis();
  const int64_t table_rows = TableStepRows(step_tables_);
  step_tables_ = nullptr;
  if (!gathered.ok()) {
    dense_->AbandonStep();
    return gathered.WithContext("step " + std::to_string(step_));
  }
  Result<SyncStepStats> stats = dense_->FinishStep();
  if (!stats.ok()) {
    rows_.Drop();
    return stats;
  }
  rows_.Apply(std::isnan(step_lr_) ? lr_.At(step_) : step_lr_);
  stats->comm_ms += gather_ms;
  stats->table_rows = table_rows;
  return stats;
}

}  // namespace gradsync
