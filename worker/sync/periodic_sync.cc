#include "worker/sync/periodic_sync.h"

#include <algorithm>

#include "common/base/check.h"
#include "common/obs/trace.h"

namespace gradsync {

LocalTrainOptions OuterTrainOptions(const LocalTrainOptions& train) {
  LocalTrainOptions o = train;
  o.optimizer = OptimizerOptions();
  o.optimizer.kind = OptimizerKind::kSgd;
  o.optimizer.momentum = train.periodic.outer.momentum;
  o.optimizer.nesterov = train.periodic.outer.nesterov;
  o.lr = LrSchedule{.kind = LrSchedule::Kind::kConstant, .base = train.periodic.outer_lr};
  o.warmup_epochs = 0;
  o.numerics.precision = Precision::kFp32;
  o.micro_batch = 0;
  o.straggler.spec = StragglerSpec();
  o.periodic = PeriodicOptions();
  return o;
}

PeriodicSync::PeriodicSync(const LocalTrainOptions& train, Model* model, std::unique_ptr<GradientSync> inner,
                           const OuterFactory& make_outer)
    : rounds_{.every = train.periodic.every, .total_steps = 0}, model_(model), global_(model->layout()), inner_(std::move(inner)),
      outer_(make_outer(&global_, OuterTrainOptions(train))) {
  GRADSYNC_CHECK(rounds_.every >= 1) << "PeriodicSync needs rounds of at least one step";
  GRADSYNC_CHECK(!model_->on_device()) << "PeriodicSync runs on CPU models";
}

Result<int64_t> PeriodicSync::Start(const JobShape& shape) {
  rounds_.total_steps = shape.total_steps;
  const int64_t every = rounds_.every;
  const int64_t rounds = (shape.total_steps + every - 1) / every;
  const int64_t rounds_per_epoch = std::max<int64_t>(1, (shape.steps_per_epoch + every - 1) / every);
  // The initial parameters are the global model's (worker 0 sends them to the shards; rank 0's
  // are broadcast), and so the first round's start.
  std::copy(model_->params().begin(), model_->params().end(), global_.params().begin());
  ASSIGN_OR_RETURN(const int64_t first_round, outer_->Start({rounds, rounds_per_epoch}));
  if (inner_) RETURN_IF_ERROR(inner_->Start(shape).status());
  CopyGlobalToOwn();
  step_ = std::min(first_round * every, shape.total_steps);
  round_begun_ = applied_ = false;
  return step_;
}

void PeriodicSync::CopyGlobalToOwn() {
  std::copy(global_.params().begin(), global_.params().end(), model_->params().begin());
}

Status PeriodicSync::BeginStep(const StepPlan& plan) {
  step_ = plan.step;
  if (!round_begun_) {
    // The round's first step, or a step redone after Recover: the outer step begins (PS: the pull
    // of this round), and every tensor of the global model is waited for.
    RETURN_IF_ERROR(outer_->BeginStep({.step = rounds_.Round(step_), .evaluate = plan.evaluate}));
    for (size_t t = 0; t < global_.layout().size(); ++t) RETURN_IF_ERROR(outer_->WaitParams(t));
    round_begun_ = true;
    // A redone step whose update was applied keeps the worker's model; its push goes again.
    if (!applied_) CopyGlobalToOwn();
  }
  return inner_ ? inner_->BeginStep(plan) : CheckStepRate(plan.lr);
}

Result<SyncStepStats> PeriodicSync::FinishStep() {
  SyncStepStats stats;
  if (!applied_) {
    if (inner_) {
      ASSIGN_OR_RETURN(stats, inner_->FinishStep());
    }
    applied_ = true;
    ++unsent_steps_;
  }
  if (!rounds_.EndsRound(step_)) {
    applied_ = false;
    const SyncTraffic t = outer_->traffic();
    stats.bytes_sent = t.bytes_sent;
    stats.bytes_received = t.bytes_received;
    stats.shm_bytes_sent = t.shm_bytes_sent;
    stats.shm_bytes_received = t.shm_bytes_received;
    return stats;
  }
  ASSIGN_OR_RETURN(SyncStepStats outer, ExchangeRound());
  applied_ = false;
  // The step's own computation (the inner update) stays the step's; the rest is the exchange's.
  outer.compute_ms += stats.compute_ms;
  outer.loss_scale = stats.loss_scale;
  outer.skipped_steps = stats.skipped_steps;
  return outer;
}

Result<SyncStepStats> PeriodicSync::ExchangeRound() {
  {
    TraceSpan span("pseudo-gradient", "compute", {{"round", static_cast<double>(rounds_.Round(step_))}});
    const ConstFloatSpan global = global_.params();
    const ConstFloatSpan own = model_->params();
    FloatSpan delta = global_.grads();
    for (size_t i = 0; i < delta.size(); ++i) delta[i] = global[i] - own[i];
  }
  for (size_t t = 0; t < global_.layout().size(); ++t) RETURN_IF_ERROR(outer_->GradReady(t));
  ASSIGN_OR_RETURN(SyncStepStats outer, outer_->FinishStep());
  round_begun_ = false;
  unsent_steps_ = 0;
  return outer;
}

void PeriodicSync::AbandonStep() {
  if (inner_) inner_->AbandonStep();
  // A round begun with no step of it taken yet (a caller that begins the next step early) is let
  // go; one with steps taken is exchanged at the end.
  if (round_begun_ && unsent_steps_ == 0) {
    outer_->AbandonStep();
    round_begun_ = false;
  }
}

Status PeriodicSync::Recover(const Status& failure) {
  RETURN_IF_ERROR(outer_->Recover(failure));
  round_begun_ = false;  // the redone step begins the outer step again
  return OkStatus();
}

Status PeriodicSync::End(bool evaluate, bool leave) {
  if (unsent_steps_ > 0 && round_begun_) RETURN_IF_ERROR(ExchangeRound().status());
  RETURN_IF_ERROR(leave ? outer_->Leave(evaluate) : outer_->EndTraining(evaluate));
  if (inner_) RETURN_IF_ERROR(inner_->EndTraining(evaluate));
  CopyGlobalToOwn();
  return OkStatus();
}

void PeriodicSync::BeginEvaluation() {
  if (step_ % rounds_.every == 0) return;  // a round's start: the worker's model is the global one
  own_.assign(model_->params().begin(), model_->params().end());
  CopyGlobalToOwn();
  swapped_ = true;
}

void PeriodicSync::EndEvaluation() {
  if (!swapped_) return;
  std::copy(own_.begin(), own_.end(), model_->params().begin());
  swapped_ = false;
}

}  // namespace gradsync
