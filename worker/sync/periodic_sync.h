// PeriodicSync: local SGD (Stich 2019; Lin et al., ICLR 2020) and DiLoCo (Douillard et al. 2023)
// over any exchange a worker has: the parameter server in bsp, ssp or asp, or all-reduce.
//
// The run is cut into rounds of H = PeriodicOptions::every steps (round r holds steps
// [r·H, (r+1)·H); the last may be shorter). Two models: the worker's own (the one it computes
// on) and the global one (an ExternalModel of the same layout: the parameters of the last
// synchronization, and the pseudo-gradient in its gradient buffer). Two syncs over them:
//
// - inner (LocalSync over the worker's model): every step's update, the job's optimizer and
//   schedule on the worker's own gradient. Its state (momentum, Adam's moments) stays across
//   rounds, as DiLoCo's inner optimizer does;
// - outer (PsSync or AllreduceSync over the global model, with the outer SGD as its optimizer at a
//   constant rate: OuterTrainOptions): one "step" per round. The round's first step begins it (PS:
//   the pull of clock r, held as the mode's rule says; all-reduce: nothing to fetch, every rank
//   updated the same global model) and copies the global model into the worker's; the round's
//   last step, after its inner update, puts the pseudo-gradient Δ = global − own into the global
//   model's gradient buffer and finishes the outer step: PS: pushed, and the shards apply the
//   outer SGD to the round's mean Δ (bsp) or to each Δ / N as it arrives (ssp, asp: the rules
//   hold for rounds, and clocks and staleness count rounds); all-reduce: averaged, and every rank
//   applies the outer SGD.
//
// With outer SGD at rate 1 and no momentum the global model becomes the mean of the workers'
// models (local SGD); with H = 1 and plain SGD inside, that is the mode's own training to
// rounding (the update is taken back out of the parameters as Δ). Communication is the outer
// sync's alone, counted the same way (traffic()); a step that ends no round sends nothing.
//
// Evaluation sees the global model: at a round's start it is in the worker's model already;
// within a round BeginEvaluation swaps it in and EndEvaluation swaps the worker's own back
// (PS: the global model as this worker last pulled it). After EndTraining the worker's model
// holds the final global model (PS: pulled when evaluating, else the last round's pull).
//
// Failures: only the outer calls communicate. When the round's push fails after the inner
// update was applied, Recover repairs the outer sync and the redone step begins the outer step
// again (a new pull), keeps the worker's own model (its update is not applied twice) and
// pushes Δ against the newly pulled global model. A caller that did not know the run's length
// (Start's total_steps 0) may end within a round: EndTraining exchanges the steps taken since the
// last round first. Not thread-safe, as GradientSync.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "common/config/sync_decisions.h"
#include "models/external_model.h"
#include "models/model.h"
#include "worker/loop/train_options.h"
#include "worker/sync/gradient_sync.h"

namespace gradsync {

// The options an outer sync is built with: `train`'s run (batch, epochs, seed, logging) with the
// outer SGD of train.periodic as its optimizer at a constant rate, in fp32, with no warm-up,
// straggler or rounds of its own.
LocalTrainOptions OuterTrainOptions(const LocalTrainOptions& train);

class PeriodicSync final : public GradientSync {
 public:
  // Builds the outer sync over `global` (the global model, owned by the PeriodicSync) with
  // `outer` (OuterTrainOptions(train)) as its training options.
  using OuterFactory = std::function<std::unique_ptr<GradientSync>(Model* global, const LocalTrainOptions& outer)>;

  // `model` (a CPU model) must outlive the sync; train.periodic.every >= 1. `inner` makes each
  // step's update of `model` (LocalSync), or is null when the caller has applied the step's
  // update before FinishStep (a frontend whose own optimizer steps); `make_outer` the exchange.
  PeriodicSync(const LocalTrainOptions& train, Model* model, std::unique_ptr<GradientSync> inner,
               const OuterFactory& make_outer);
  // The outer sync holds the address of the global model inside this object.
  PeriodicSync(const PeriodicSync&) = delete;
  PeriodicSync& operator=(const PeriodicSync&) = delete;

  int rank() const override { return outer_->rank(); }
  int size() const override { return outer_->size(); }
  Result<int64_t> Start(const JobShape& shape) override;
  Status BeginStep(const StepPlan& plan) override;
  Status WaitParams(size_t tensor) override { return inner_ ? inner_->WaitParams(tensor) : OkStatus(); }
  Status GradReady(size_t tensor) override { return inner_ ? inner_->GradReady(tensor) : OkStatus(); }
  Result<SyncStepStats> FinishStep() override;
  void AbandonStep() override;
  Status Recover(const Status& failure) override;
  Status EndTraining(bool evaluate) override { return End(evaluate, /*leave=*/false); }
  Status Leave(bool evaluate) override { return End(evaluate, /*leave=*/true); }
  void BeginEvaluation() override;
  void EndEvaluation() override;
  SyncTraffic traffic() const override { return outer_->traffic(); }

  // The rounds of the run (known after Start): which round a step belongs to, and whether it is
  // the round's last.
  const RoundSchedule& rounds() const { return rounds_; }

 private:
  Status End(bool evaluate, bool leave);
  void CopyGlobalToOwn();
  // The round's exchange: the pseudo-gradient into the global model's gradient buffer, the
  // outer step finished.
  Result<SyncStepStats> ExchangeRound();

  RoundSchedule rounds_;
  Model* model_;
  ExternalModel global_;
  std::unique_ptr<GradientSync> inner_;
  std::unique_ptr<GradientSync> outer_;
  int64_t step_ = 0;
  bool round_begun_ = false;  // the outer step of the current round was begun
  bool applied_ = false;      // the inner update of step_ was applied (its round's push failed)
  int64_t unsent_steps_ = 0;  // steps updated since the last round's exchange
  std::vector<float> own_;    // the worker's own parameters while the global model is evaluated
  bool swapped_ = false;
};

}  // namespace gradsync
