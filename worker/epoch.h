// Pieces every trainer shares: which samples a step takes, and how an epoch is closed
// (its report, the evaluation, the evaluation row of the metrics file).
#pragma once

#include <cstdint>
#include <utility>

#include "common/clock.h"
#include "common/dataset.h"
#include "common/metrics.h"
#include "models/model.h"
#include "worker/local_trainer.h"

namespace gradsync {

// [begin, end) of step s's batch within a shard of `shard` indices, for steps_per_epoch steps of
// `batch`: the last step takes the rest (shards of one job differ by at most one sample).
std::pair<int64_t, int64_t> BatchRange(int64_t s, int64_t steps_per_epoch, int64_t batch, int64_t shard);

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
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
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
