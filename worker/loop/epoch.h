// Pieces every trainer shares: which samples a step takes, and how an epoch is closed
// (its report, the evaluation, the evaluation row of the metrics file).
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "common/base/clock.h"
#include "common/data/dataset.h"
#include "common/obs/metrics.h"
#include "models/model.h"
#include "worker/loop/local_trainer.h"

namespace gradsync {

// [begin, end) of step s's batch within a shard of `shard` indices, for steps_per_epoch steps of
// `batch`: the last step takes the rest (shards of one job differ by at most one sample).
std::pair<int64_t, int64_t> BatchRange(int64_t s, int64_t steps_per_epoch, int64_t batch, int64_t shard);

// Steps per epoch every worker of num_workers runs over a training set of n samples:
// ceil(smallest shard / batch), at least 1.
int64_t StepsPerEpoch(int64_t n, int num_workers, int64_t batch);

// Sums over the steps of one epoch.
struct EpochTotals {
  double loss_sum = 0;
  int64_t steps = 0;
  int64_t samples = 0;
  double train_seconds = 0;

  void AddStep(double loss, int64_t batch_samples, double seconds) {
    loss_sum += loss;
    ++steps;
    samples += batch_samples;
    train_seconds += seconds;
  }
};

// The gradient of the batch `indices` into model.grads(), computed micro_batch samples at a
// time (dense models): each micro-batch's mean gradient weighted by its share of the batch, so
// the result is the batch's mean gradient up to float summation order. Returns the batch's mean
// loss. `acc` is scratch.
float AccumulateGradients(Model& model, const Dataset& data, std::span<const uint32_t> indices, int64_t micro_batch,
                          BatchBuffer& buffer, std::vector<float>& acc);

// One step's gradient and loss over `indices`: the batch gathered into `buffer` and computed at
// once (`gathered`: the caller has gathered it already), or, when micro_batch > 0 splits it,
// AccumulateGradients (the whole batch is never gathered then).
inline float ComputeGradients(Model& model, const Dataset& data, std::span<const uint32_t> indices,
                              int64_t micro_batch, BatchBuffer& buffer, std::vector<float>& acc,
                              const Batch* gathered = nullptr) {
  if (indices.empty()) return 0.0f;
  if (micro_batch > 0 && static_cast<int64_t>(indices.size()) > micro_batch) {
    return AccumulateGradients(model, data, indices, micro_batch, buffer, acc);
  }
  return model.ForwardBackward(gathered ? *gathered : buffer.Gather(data, indices));
}

// What a device (CUDA) model cannot do yet in a trainer: accumulation sums micro-batch
// gradients on the host. OK for CPU models.
inline Status CheckDeviceTraining(const Model& model, const LocalTrainOptions& o) {
  if (model.on_device() && o.micro_batch > 0) {
    return InvalidArgumentError("--accumulate is not supported with --device=cuda (micro-batch gradients are summed on the host)");
  }
  return OkStatus();
}

// The learning-rate schedule of a run: o.lr with its total steps and its warm-up in steps.
LrSchedule RunSchedule(const LocalTrainOptions& o, int64_t total_steps, int64_t steps_per_epoch);

// A training row of the metrics file with the fields every trainer fills (the caller adds
// bytes, timings and staleness).
MetricsRow StepRow(int64_t step, int64_t steps_per_epoch, double wall_s, double loss);

struct EpochClose {
  int epoch = 0;                 // 1-based
  int64_t step = 0;              // steps done so far
  int64_t steps_per_epoch = 1;
  const Stopwatch* run_clock = nullptr;  // wall time is read after the evaluation
  bool evaluate = false;         // evaluate on `test` and write an evaluation row
  const Dataset* test = nullptr;
  int64_t eval_batch = 1000;
  const RowReader* read_rows = nullptr;  // a model with tables: where its evaluation reads rows
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
  uint64_t shm_bytes_sent = 0;
  uint64_t shm_bytes_received = 0;
};

// Builds the epoch's report (test loss / accuracy NaN when not evaluating) and, when evaluating
// and `metrics` is set, writes and flushes the evaluation row.
Result<EpochReport> CloseEpoch(const EpochClose& c, const EpochTotals& totals, Model& model, MetricsWriter* metrics);

// True when the evaluating worker evaluates after `step` steps: every eval_every steps, but not
// at an epoch's end (CloseEpoch does that).
inline bool EvaluateMidEpoch(int64_t eval_every, int64_t step, int64_t steps_per_epoch) {
  return eval_every > 0 && step > 0 && step % eval_every == 0 && step % steps_per_epoch != 0;
}

// Evaluates and writes an evaluation row (no epoch report): the rows between epochs that
// eval_every asks for. `loss` is the mean training loss so far in this epoch.
Status WriteEvaluationRow(const EpochClose& c, double loss, Model& model, MetricsWriter* metrics);

}  // namespace gradsync
