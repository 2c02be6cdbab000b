// EpochReporter: what a TrainingLoop (worker/loop/training_loop.h) reports of its run, timed by
// the run's clock: the running epoch's totals, each closed epoch's report (EpochReport, handed
// to the caller's on_epoch; evaluated on the evaluating worker), the evaluations between epochs
// (every report.eval_every steps), and the metrics rows (a training row every report.log_every
// steps with the sync's figures, the evaluation rows). The loop decides when a step ends and an
// epoch closes; this decides what is written then. Borrowed: model, test set, metrics.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "common/base/clock.h"
#include "common/base/status.h"
#include "common/data/dataset.h"
#include "common/obs/metrics.h"
#include "models/model.h"
#include "worker/loop/epoch.h"
#include "worker/loop/train_options.h"
#include "worker/sync/gradient_sync.h"

namespace gradsync {

class EpochReporter {
 public:
  // `evaluate`: this worker evaluates. `metrics` may be null.
  EpochReporter(const ReportOptions& options, bool evaluate, Model* model, const Dataset* test, MetricsWriter* metrics)
      : options_(options), evaluate_(evaluate), model_(model), test_(test), metrics_(metrics) {}

  // A new run of `steps_per_epoch` steps per epoch: no totals and no reports yet, the run's
  // clock started; `on_epoch` (borrowed for the run) hears of each closed epoch.
  void Start(const std::function<void(const EpochReport&)>* on_epoch, int64_t steps_per_epoch);
  // Whether an --eval-every evaluation is due before the step after `step` steps, in a run that
  // started at `start_step`.
  bool MidEvaluationDue(int64_t step, int64_t start_step) const {
    return evaluate_ && step > start_step && EvaluateMidEpoch(options_.eval_every, step, steps_per_epoch_);
  }
  // A step ended, `step` steps now done: counted in the epoch's totals (`samples` samples over
  // `seconds`), and its training row written when one is due.
  Status StepDone(int64_t step, float loss, int64_t samples, double seconds, const SyncStepStats& stats,
                  double compute_ms, double delay_ms);
  // Epoch `epoch` (1-based) closed after `step` steps, the sync having moved `traffic`.
  Status CloseEpoch(int epoch, int64_t step, const SyncTraffic& traffic);
  // An evaluation row between epochs after `step` steps (the epoch's mean training loss so far).
  Status WriteEvaluationRow(int64_t step, const SyncTraffic& traffic);
  // The closed epochs' reports, once the run is over.
  std::vector<EpochReport> TakeReports() { return std::move(reports_); }
  // A model with tables: where its evaluations read their rows (the run's sync).
  void set_row_reader(RowReader read) { read_rows_ = std::move(read); }

 private:
  // Where the run is, for an epoch report or an evaluation row.
  EpochClose At(int64_t step, const SyncTraffic& traffic) const;
  Status WriteStepRow(int64_t step, float loss, const SyncStepStats& stats, double compute_ms, double delay_ms);

  ReportOptions options_;
  bool evaluate_;
  Model* model_;
  const Dataset* test_;
  MetricsWriter* metrics_;
  // The run's state (Start resets it).
  const std::function<void(const EpochReport&)>* on_epoch_ = nullptr;
  int64_t steps_per_epoch_ = 1;
  Stopwatch run_clock_;
  EpochTotals totals_;
  MetricsRow::RowReads row_reads_;  // the run's so far
  std::vector<EpochReport> reports_;
  RowReader read_rows_;
};

}  // namespace gradsync
