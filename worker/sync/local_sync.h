// LocalSync: the GradientSync of one worker alone (--mode=local): nothing is communicated, and
// FinishStep applies the optimizer in this process (ApplyGradients; a device model's own
// optimizer on the device) at the run's learning-rate schedule, or at the step's own rate
// (StepPlan::lr). A model's embedding tables live here whole (LocalTables): a step's rows are read
// at BeginStep and their gradients applied with the rows' optimizer at the step's rate.
#pragma once

#include <optional>

#include "common/optim/optimizer.h"
#include "models/model.h"
#include "worker/loop/train_options.h"
#include "worker/sync/gradient_sync.h"
#include "worker/sync/local_tables.h"
#include "worker/sync/loss_scaling.h"

namespace gradsync {

class LocalSync final : public GradientSync {
 public:
  // `model` must outlive the sync.
  LocalSync(const LocalTrainOptions& options, Model* model)
      : options_(options), model_(model), scaling_(options.numerics), tables_(model->tables()) {}

  int rank() const override { return 0; }
  int size() const override { return 1; }
  Result<int64_t> Start(const JobShape& shape) override;
  Status BeginStep(const StepPlan& plan) override {
    RETURN_IF_ERROR(CheckStepRate(plan.lr));
    step_ = plan.step;
    step_lr_ = plan.lr;
    scaling_.Begin(*model_);
    step_tables_ = plan.tables;
    return step_tables_ ? tables_.Read(step_tables_->ids, step_tables_->rows) : OkStatus();
  }
  Status ReadRows(std::span<const std::vector<uint64_t>> ids, std::span<float> rows) override {
    return tables_.Read(ids, rows);
  }
  Status SetStepTables(const TableStep* tables) override {
    step_tables_ = tables;
    return OkStatus();
  }
  Status WaitParams(size_t) override { return OkStatus(); }
  Status GradReady(size_t) override { return OkStatus(); }
  Result<SyncStepStats> FinishStep() override;
  void AbandonStep() override {}
  Status Recover(const Status& failure) override { return failure; }
  Status EndTraining(bool) override { return OkStatus(); }
  bool on_device() const override { return model_->on_device(); }

 private:
  LocalTrainOptions options_;
  Model* model_;
  LrSchedule lr_;
  std::optional<Optimizer> opt_;
  LossScaling scaling_;
  int64_t step_ = 0;
  float step_lr_ = NAN;  // the caller's rate for the step (StepPlan::lr), NaN: the schedule's
  LocalTables tables_;
  const TableStep* step_tables_ = nullptr;  // this step's rows (StepPlan::tables)
};

}  // namespace gradsync
