#include "worker/loop/epoch_reporter.h"

#include <algorithm>

namespace gradsync {

void EpochReporter::Start(const std::function<void(const EpochReport&)>* on_epoch, int64_t steps_per_epoch) {
  on_epoch_ = on_epoch;
  steps_per_epoch_ = steps_per_epoch;
  totals_ = EpochTotals();
  row_reads_ = {};
  reports_.clear();
  run_clock_.Reset();
}

EpochClose EpochReporter::At(int64_t step, const SyncTraffic& t) const {
  return EpochClose{.step = step, .steps_per_epoch = steps_per_epoch_, .run_clock = &run_clock_,
                    .evaluate = evaluate_, .test = test_, .eval_batch = options_.eval_batch,
                    .read_rows = read_rows_ ? &read_rows_ : nullptr,
                    .bytes_sent = t.bytes_sent, .bytes_received = t.bytes_received,
                    .shm_bytes_sent = t.shm_bytes_sent, .shm_bytes_received = t.shm_bytes_received};
}

Status EpochReporter::CloseEpoch(int epoch, int64_t step, const SyncTraffic& traffic) {
  EpochClose close = At(step, traffic);
  close.epoch = epoch;
  ASSIGN_OR_RETURN(EpochReport r, gradsync::CloseEpoch(close, totals_, *model_, metrics_));
  r.row_reads = row_reads_;
  reports_.push_back(r);
  if (*on_epoch_) (*on_epoch_)(r);
  totals_ = EpochTotals();
  return OkStatus();
}

Status EpochReporter::WriteEvaluationRow(int64_t step, const SyncTraffic& traffic) {
  return gradsync::WriteEvaluationRow(At(step, traffic),
                                      totals_.loss_sum / static_cast<double>(std::max<int64_t>(1, totals_.steps)), *model_,
                                      metrics_);
}

Status EpochReporter::StepDone(int64_t step, float loss, int64_t samples, double seconds, const SyncStepStats& stats,
                               double compute_ms, double delay_ms) {
  totals_.AddStep(loss, samples, seconds);
  row_reads_.Add(stats.row_reads);
  if (!metrics_ || options_.log_every <= 0 || step % options_.log_every != 0) return OkStatus();
  return WriteStepRow(step, loss, stats, compute_ms, delay_ms);
}

Status EpochReporter::WriteStepRow(int64_t step, float loss, const SyncStepStats& stats, double compute_ms,
                                   double delay_ms) {
  MetricsRow row = StepRow(step, steps_per_epoch_, run_clock_.Seconds(), loss);
  row.staleness.version_lag = stats.version_lag;
  row.staleness.clock_staleness = stats.clock_staleness;
  row.traffic.bytes_sent = stats.bytes_sent;
  row.traffic.bytes_received = stats.bytes_received;
  row.traffic.shm_bytes_sent = stats.shm_bytes_sent;
  row.traffic.shm_bytes_received = stats.shm_bytes_received;
  row.times.compute_ms = std::max(0.0, compute_ms - stats.blocked_ms) + stats.compute_ms;
  row.times.comm_ms = stats.comm_ms;
  row.times.wait_ms = stats.wait_ms;
  row.times.hidden_ms = stats.hidden_ms;
  row.times.delay_ms = delay_ms;
  row.loss_scale = stats.loss_scale;
  row.skipped_steps = stats.skipped_steps;
  row.table_rows = stats.table_rows;
  row.row_reads = stats.row_reads;
  return metrics_->Write(row);
}

}  // namespace gradsync
