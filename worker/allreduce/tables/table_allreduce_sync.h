// TableAllreduceSync: --mode=allreduce for a model with embedding tables (Model::tables()). It
// wraps the AllreduceSync of the model's dense parameters, to which it forwards every call, and
// keeps the tables itself in a RowGather (worker/allreduce/tables/row_gather.h): BeginStep reads the
// step's rows from this worker's replica; FinishStep all-gathers every worker's (ids, row
// gradients) over the same collective, sums them per id in rank order, then lets the dense sync
// average and apply its gradient, then applies the rows' mean once with each table's row optimizer
// at the step's rate (StepPlan::lr, else the job's schedule): every replica the same update in the
// same order. A step whose rows are refused (a peer's malformed message, a table's bound) fails
// before the dense step, with nothing of either applied. The gather's bytes are the collective's,
// so traffic() and the step's bytes count them. MakeGradientSync builds it.
#pragma once

#include <cmath>
#include <memory>

#include "allreduce/collective.h"
#include "common/optim/optimizer.h"
#include "models/model.h"
#include "worker/allreduce/allreduce_sync.h"
#include "worker/allreduce/tables/row_gather.h"
#include "worker/sync/gradient_sync.h"

namespace gradsync {

class TableAllreduceSync final : public GradientSync {
 public:
  // `dense` is the AllreduceSync of `model` over `collective` (both must outlive the sync).
  TableAllreduceSync(std::unique_ptr<AllreduceSync> dense, const AllreduceTrainOptions& options,
                     Model* model, Collective* collective)
      : dense_(std::move(dense)), options_(options), collective_(collective), rows_(model->tables()) {}

  AllreduceSync* dense() const { return dense_.get(); }
  const RowGather& rows() const { return rows_; }

  int rank() const override { return dense_->rank(); }
  int size() const override { return dense_->size(); }
  Result<int64_t> Start(const JobShape& shape) override;
  Status BeginStep(const StepPlan& plan) override;
  Status WaitParams(size_t tensor) override { return dense_->WaitParams(tensor); }
  Status GradReady(size_t tensor) override { return dense_->GradReady(tensor); }
  Status ReadRows(std::span<const std::vector<uint64_t>> ids, std::span<float> rows) override {
    return rows_.Read(ids, rows);
  }
  Status SetStepTables(const TableStep* tables) override {
    step_tables_ = tables;
    return OkStatus();
  }
  Status GradAbsent(size_t tensor) override { return dense_->GradAbsent(tensor); }
  Result<SyncStepStats> FinishStep() override;
  void AbandonStep() override {
    step_tables_ = nullptr;
    dense_->AbandonStep();
  }
  Status Recover(const Status& failure) override { return dense_->Recover(failure); }
  Status EndTraining(bool evaluate) override { return dense_->EndTraining(evaluate); }
  Status Leave(bool evaluate) override { return dense_->Leave(evaluate); }
  void BeginEvaluation() override { dense_->BeginEvaluation(); }
  void EndEvaluation() override { dense_->EndEvaluation(); }
  bool on_device() const override { return dense_->on_device(); }
  SyncTraffic traffic() const override { return dense_->traffic(); }

 private:
  std::unique_ptr<AllreduceSync> dense_;
  AllreduceTrainOptions options_;
  Collective* collective_;
  RowGather rows_;
  LrSchedule lr_;  // the job's, as the dense sync's (RunSchedule)
  int64_t step_ = 0;
  float step_lr_ = NAN;  // the caller's rate for the step (StepPlan::lr), NaN: the schedule's
  const TableStep* step_tables_ = nullptr;  // this step's rows (StepPlan::tables, SetStepTables)
};

}  // namespace gradsync
