#include "worker/loop/training_loop.h"

#include <algorithm>
#include <cmath>
#include <span>
#include <string>

#include "common/base/clock.h"
#include "common/base/numeric/tensor.h"
#include "common/data/sampler.h"
#include "common/obs/trace.h"
#include "worker/loop/epoch.h"

namespace gradsync {

namespace {
// Sorted unique flat keys of the batch for the model's sparse tensors (keys index tensor 0's rows,
// which start at its offset).
void BatchKeys(const Model& model, const Batch& batch, std::vector<uint64_t>* keys) {
  keys->clear();
  for (const auto& t : model.layout()) {
    if (!t.sparse) continue;
    for (uint64_t k : batch.keys) keys->push_back(static_cast<uint64_t>(t.offset) + k);
  }
  std::sort(keys->begin(), keys->end());
  keys->erase(std::unique(keys->begin(), keys->end()), keys->end());
}
}  // namespace

TrainingLoop::TrainingLoop(const TrainingLoopOptions& options, Model* model, const Dataset* train,
                           const Dataset* test, MetricsWriter* metrics, GradientSync* sync)
    : options_(options), model_(model), train_(train), sync_(sync),
      reporter_(options.train.report, options.evaluate, model, test, metrics) {}

void TrainingLoop::OnParamWait(size_t tensor) {
  if (!step_state_.failure.ok()) return;  // the step is redone or abandoned: compute on, send nothing
  if (Status s = sync_->WaitParams(tensor); !s.ok()) step_state_.failure = std::move(s);
}

void TrainingLoop::OnGradReady(size_t tensor) {
  StepState& st = step_state_;
  if (!st.failure.ok() || st.diverged) return;
  if (!st.any_ready) {
    st.any_ready = true;
    // The first tensor backward reports is the last layer's, whose gradient a non-finite loss
    // makes non-finite: a diverged step tells the sync nothing, so no part of it is sent. (A
    // device model's host gradient is not filled during backward; its loss is checked. An fp16
    // gradient may overflow with a finite loss: the loss scaler skips that step, and the loss
    // tells divergence.)
    const TensorInfo& t = model_->layout()[tensor];
    if (!t.sparse && !model_->on_device() && model_->precision() != Precision::kFp16 && !AllFinite(model_->grad(tensor))) {
      st.diverged = true;
      return;
    }
  }
  TraceInstant("gradient ready", "compute", {{"tensor", static_cast<double>(tensor)}});
  if (Status s = sync_->GradReady(tensor); !s.ok()) st.failure = std::move(s);
}

Result<std::vector<EpochReport>> TrainingLoop::Run(const std::function<void(const EpochReport&)>& on_epoch) {
  const LocalTrainOptions& o = options_.train;
  if (o.batch <= 0) return InvalidArgumentError("batch must be > 0");
  if (train_->n == 0) return InvalidArgumentError("the training set is empty");
  RETURN_IF_ERROR(CheckDeviceTraining(*model_, o));
  steps_per_epoch_ = StepsPerEpoch(train_->n, sync_->size(), o.batch);
  int64_t total_steps = steps_per_epoch_ * o.epochs;
  if (o.max_steps > 0) total_steps = std::min(total_steps, o.max_steps);
  ASSIGN_OR_RETURN(const int64_t start_step, sync_->Start({total_steps, steps_per_epoch_}));

  // The model calls the sync through this loop while it trains, and never after.
  model_->set_param_wait([this](size_t t) { OnParamWait(t); });
  model_->set_grad_ready([this](size_t t) { OnGradReady(t); });
  struct Unhook {
    Model* m;
    ~Unhook() {
      m->set_grad_ready({});
      m->set_param_wait({});
    }
  } unhook{model_};

  step_ = start_step;
  // A device model whose sync reads and writes the host buffers.
  copy_to_device_ = model_->on_device() && !sync_->on_device();
  straggler_ = Straggler(o.straggler.spec, o.straggler.seed);
  reporter_.Start(&on_epoch, steps_per_epoch_);
  ShardedSampler sampler(train_->n, sync_->size(), sync_->rank(), o.seed);
  const bool sparse = HasSparse(model_->layout());
  std::vector<uint64_t> keys;
  const bool tables = !model_->tables().empty();
  std::vector<std::vector<uint64_t>> table_ids;
  TableStep table_step;
  if (tables) {
    reporter_.set_row_reader([this](std::span<const std::vector<uint64_t>> ids, std::span<float> rows) {
      return sync_->ReadRows(ids, rows);
    });
  }
  const int first_epoch = static_cast<int>(start_step / steps_per_epoch_);
  for (int epoch = first_epoch; epoch < o.epochs && step_ < total_steps; ++epoch) {
    const std::vector<uint32_t> order = sampler.EpochIndices(epoch);
    for (int64_t s = epoch == first_epoch ? start_step % steps_per_epoch_ : 0; s < steps_per_epoch_ && step_ < total_steps;
         ++s) {
      const auto [begin, end] = BatchRange(s, steps_per_epoch_, o.batch, static_cast<int64_t>(order.size()));
      StepInput in{.indices = std::span(order).subspan(begin, end - begin), .epoch = epoch};
      // A sparse model's batch is gathered before the step starts: its keys say which rows (a
      // model with tables: which ids, whose rows the sync brings into the model's table_rows()).
      Batch batch;
      if (sparse || tables) {
        batch = buffer_.Gather(*train_, in.indices);
        if (sparse) BatchKeys(*model_, batch, &keys);
        in.batch = &batch;
        in.keys = keys;
      }
      if (tables) {
        RETURN_IF_ERROR(model_->TableIds(batch, &table_ids));
        table_step = TableStep{table_ids, model_->table_rows(), model_->table_grads()};
        in.tables = &table_step;
      }
      // Evaluations due before this step, on the parameters it computes on.
      in.epoch_end = s == 0 && epoch > 0 && step_ > start_step;
      in.mid_eval = reporter_.MidEvaluationDue(step_, start_step);
      RETURN_IF_ERROR(RunStep(in));
    }
  }
  RETURN_IF_ERROR(sync_->EndTraining(options_.evaluate));
  if (options_.evaluate && copy_to_device_) RETURN_IF_ERROR(model_->ParamsToDevice());
  RETURN_IF_ERROR(CloseEpoch(static_cast<int>((step_ + steps_per_epoch_ - 1) / steps_per_epoch_)));
  return reporter_.TakeReports();
}

Status TrainingLoop::RunStep(const StepInput& in) {
  const LocalTrainOptions& o = options_.train;
  const StepPlan plan{.step = step_, .sparse_keys = in.keys, .tables = in.tables,
                      .evaluate = options_.evaluate && (in.epoch_end || in.mid_eval),
                      .lr = options_.hooks.step_lr ? options_.hooks.step_lr(step_) : NAN};
  float loss = 0;
  double begin_ms = 0, compute_ms = 0, finish_ms = 0, delay_ms = 0;
  SyncStepStats stats;
  bool evaluated = false;  // a redone step does not evaluate twice
  for (int attempt = 0;; ++attempt) {
    step_state_ = StepState();
    Stopwatch begin_clock;
    Status failed = [&] {
      TraceSpan span("begin step", "comm", {{"step", static_cast<double>(step_)}});
      return sync_->BeginStep(plan);
    }();
    // A device model computes on its copy: upload what arrived (enqueued; the compute waits).
    if (failed.ok() && copy_to_device_) RETURN_IF_ERROR(model_->ParamsToDevice());
    begin_ms += begin_clock.Millis();
    if (failed.ok() && !evaluated) {
      // An evaluation reads its own batches' rows through the model: the step's are kept and
      // put back (its batch's ids named again) once it is done.
      std::vector<float> step_rows;
      if (in.tables != nullptr && plan.evaluate) step_rows.assign(in.tables->rows.begin(), in.tables->rows.end());
      RETURN_IF_ERROR(EvaluateDue(in));
      if (!step_rows.empty()) {
        std::vector<std::vector<uint64_t>> ids;
        RETURN_IF_ERROR(model_->TableIds(*in.batch, &ids));
        std::copy(step_rows.begin(), step_rows.end(), model_->table_rows().begin());
        in.tables->rows = model_->table_rows();  // the model's buffers may have moved
        in.tables->grads = model_->table_grads();
      }
      evaluated = true;
    }
    if (failed.ok()) {
      if (options_.hooks.before_compute) options_.hooks.before_compute(step_);
      Stopwatch compute_clock;
      {
        TraceSpan span("forward + backward", "compute", {{"samples", static_cast<double>(in.indices.size())}});
        loss = ComputeGradients(*model_, *train_, in.indices, o.micro_batch, buffer_, accum_, in.batch);
      }
      failed = step_state_.failure;
      if (failed.ok() && (step_state_.diverged || !std::isfinite(loss))) {
        sync_->AbandonStep();
        return AbortedError("training diverged: loss is " + std::to_string(loss) + " at step " + std::to_string(step_) +
                            " (lower --lr?)");
      }
      if (failed.ok() && copy_to_device_) RETURN_IF_ERROR(model_->GradsToHost());  // the sync reads the host copy
      compute_ms = compute_clock.Millis();
    }
    if (failed.ok()) {
      if (straggler_.active()) {
        TraceSpan span("straggler delay", "compute");
        delay_ms = straggler_.Sleep(compute_ms);
      }
      Stopwatch finish_clock;
      Result<SyncStepStats> finished = [&] {
        TraceSpan span("finish step", "comm", {{"step", static_cast<double>(step_)}});
        return sync_->FinishStep();
      }();
      finish_ms = finish_clock.Millis();
      if (finished.ok()) {
        stats = *finished;
        break;
      }
      failed = finished.status();
    }
    if (attempt >= 3) return failed;
    TraceInstant("step failed", "failure", {{"step", static_cast<double>(step_)}, {"code", static_cast<double>(failed.code())}});
    TraceSpan recovering("recovery", "failure", {{"step", static_cast<double>(step_)}});
    RETURN_IF_ERROR(sync_->Recover(failed));
  }
  ++step_;
  return reporter_.StepDone(step_, loss, static_cast<int64_t>(in.indices.size()), (compute_ms + begin_ms + finish_ms) / 1e3,
                            stats, compute_ms, delay_ms);
}

Status TrainingLoop::EvaluateDue(const StepInput& in) {
  // Only the evaluating worker evaluates (a closed epoch's report of the others has no test figures).
  const bool evaluates = options_.evaluate && (in.epoch_end || in.mid_eval);
  if (evaluates) sync_->BeginEvaluation();
  struct Restore {
    GradientSync* sync;
    ~Restore() {
      if (sync) sync->EndEvaluation();
    }
  } restore{evaluates ? sync_ : nullptr};
  if (in.epoch_end) RETURN_IF_ERROR(CloseEpoch(in.epoch));
  if (in.mid_eval) RETURN_IF_ERROR(reporter_.WriteEvaluationRow(step_, sync_->traffic()));
  return OkStatus();
}

}  // namespace gradsync
