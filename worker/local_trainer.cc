#include "worker/local_trainer.h"

#include <algorithm>
#include <cmath>

#include "common/clock.h"
#include "common/partitioner.h"
#include "common/sampler.h"
#include "worker/epoch.h"

namespace gradsync {

void ApplyGradients(Model& model, Optimizer& opt, float lr) {
  const auto& layout = model.layout();
  for (size_t i = 0; i < layout.size(); ++i) {
    const TensorInfo& t = layout[i];
    if (t.sparse) {
      const SparseGrad& g = model.sparse_grad(i);
      opt.StepSparse(model.tensor(i), g.keys, g.values, lr, t.offset);
    }
  }
  // Dense tensors are contiguous runs of the flat buffer: update each run in one call.
  for (const Segment& run : DenseRuns(layout, {0, model.num_params()})) {
    opt.Step(model.params().subspan(run.begin, run.size()), model.grads().subspan(run.begin, run.size()), lr,
             run.begin);
  }
}

LocalTrainer::LocalTrainer(const LocalTrainOptions& options, Model* model, const Dataset* train,
                           const Dataset* test, MetricsWriter* metrics)
    : options_(options), model_(model), train_(train), test_(test), metrics_(metrics) {}

Result<std::vector<EpochReport>> LocalTrainer::Run(
    const std::function<void(const EpochReport&)>& on_epoch) {
  if (options_.batch <= 0) return InvalidArgumentError("batch must be > 0");
  if (train_->n == 0) return InvalidArgumentError("the training set is empty");
  ShardedSampler sampler(train_->n, 1, 0, options_.seed);
  const int64_t steps_per_epoch = (sampler.shard_size() + options_.batch - 1) / options_.batch;
  int64_t total_steps = steps_per_epoch * options_.epochs;
  if (options_.max_steps > 0) total_steps = std::min(total_steps, options_.max_steps);
  const LrSchedule lr = RunSchedule(options_, total_steps, steps_per_epoch);

  RETURN_IF_ERROR(CheckDeviceTraining(*model_, options_));
  const bool device = model_->on_device();
  if (device) RETURN_IF_ERROR(model_->SetOptimizer(options_.optimizer));
  Optimizer opt(options_.optimizer, device ? 0 : model_->num_params());
  Straggler straggler(options_.straggler, options_.straggler_seed);
  BatchBuffer buffer;
  std::vector<float> accum;
  std::vector<EpochReport> reports;
  Stopwatch run_clock;
  int64_t step = 0;
  for (int epoch = 0; epoch < options_.epochs && step < total_steps; ++epoch) {
    const std::vector<uint32_t> order = sampler.EpochIndices(epoch);
    EpochTotals totals;
    for (int64_t s = 0; s < steps_per_epoch && step < total_steps; ++s) {
      Stopwatch step_clock;
      const auto [begin, end] = BatchRange(s, steps_per_epoch, options_.batch, static_cast<int64_t>(order.size()));
      const auto indices = std::span(order).subspan(begin, end - begin);
      const float loss = ComputeGradients(*model_, *train_, indices, options_.micro_batch, buffer, accum);
      if (!std::isfinite(loss)) {
        return AbortedError("training diverged: loss is " + std::to_string(loss) + " at step " +
                            std::to_string(step) + " (lower --lr?)");
      }
      if (device) {
        RETURN_IF_ERROR(model_->OptimizerStep(lr.At(step)));  // enqueued; the next loss waits for it
      } else {
        ApplyGradients(*model_, opt, lr.At(step));
      }
      ++step;
      const double step_ms = step_clock.Millis();
      const double delay_ms = straggler.Sleep(step_ms);
      totals.AddStep(loss, static_cast<int64_t>(indices.size()), step_ms / 1e3);
      if (metrics_ && options_.log_every > 0 && step % options_.log_every == 0) {
        MetricsRow row = StepRow(step, steps_per_epoch, run_clock.Seconds(), loss);
        row.compute_ms = step_ms;
        row.delay_ms = delay_ms;
        RETURN_IF_ERROR(metrics_->Write(row));
      }
      if (EvaluateMidEpoch(options_.eval_every, step, steps_per_epoch)) {
        const EpochClose at{.step = step, .steps_per_epoch = steps_per_epoch, .run_clock = &run_clock,
                            .test = test_, .eval_batch = options_.eval_batch};
        RETURN_IF_ERROR(WriteEvaluationRow(at, totals.loss_sum / static_cast<double>(totals.steps), *model_, metrics_));
      }
    }
    const EpochClose close{.epoch = epoch + 1, .step = step, .steps_per_epoch = steps_per_epoch,
                           .run_clock = &run_clock, .evaluate = true, .test = test_, .eval_batch = options_.eval_batch};
    ASSIGN_OR_RETURN(EpochReport r, CloseEpoch(close, totals, *model_, metrics_));
    reports.push_back(r);
    if (on_epoch) on_epoch(r);
  }
  return reports;
}

}  // namespace gradsync
