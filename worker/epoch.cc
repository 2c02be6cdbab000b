#include "worker/epoch.h"

#include <algorithm>
#include <cmath>

namespace gradsync {

std::pair<int64_t, int64_t> BatchRange(int64_t s, int64_t steps_per_epoch, int64_t batch, int64_t shard) {
  const int64_t begin = std::min(s * batch, shard);
  const int64_t end = s + 1 == steps_per_epoch ? shard : std::min(begin + batch, shard);
  return {begin, end};
}

MetricsRow StepRow(int64_t step, int64_t steps_per_epoch, double wall_s, double loss) {
  MetricsRow row;
  row.step = step;
  row.epoch = static_cast<double>(step) / static_cast<double>(steps_per_epoch);
  row.wall_s = wall_s;
  row.loss = loss;
  return row;
}

Result<EpochReport> CloseEpoch(const EpochClose& c, const EpochTotals& totals, Model& model, MetricsWriter* metrics) {
  EpochReport r;
  r.epoch = c.epoch;
  r.steps = c.step;
  r.train_loss = totals.loss_sum / static_cast<double>(std::max<int64_t>(1, totals.steps));
  r.train_seconds = totals.train_seconds;
  r.samples_per_s = static_cast<double>(totals.samples) / std::max(1e-9, totals.train_seconds);
  r.test_loss = r.test_accuracy = NAN;
  if (c.evaluate) {
    EvalResult e = Evaluate(model, *c.test, c.eval_batch);
    r.test_loss = e.loss;
    r.test_accuracy = e.accuracy;
  }
  r.wall_s = c.run_clock->Seconds();
  if (metrics && c.evaluate) {
    MetricsRow row = StepRow(c.step, c.steps_per_epoch, r.wall_s, r.train_loss);
    row.test_loss = r.test_loss;
    row.test_accuracy = r.test_accuracy;
    row.bytes_sent = c.bytes_sent;
    row.bytes_received = c.bytes_received;
    RETURN_IF_ERROR(metrics->Write(row));
    RETURN_IF_ERROR(metrics->Flush());
  }
  return r;
}

Status WriteEvaluationRow(const EpochClose& c, double loss, Model& model, MetricsWriter* metrics) {
  if (!metrics) return OkStatus();
  EvalResult e = Evaluate(model, *c.test, c.eval_batch);
  MetricsRow row = StepRow(c.step, c.steps_per_epoch, c.run_clock->Seconds(), loss);
  row.test_loss = e.loss;
  row.test_accuracy = e.accuracy;
  row.bytes_sent = c.bytes_sent;
  row.bytes_received = c.bytes_received;
  return metrics->Write(row);
}

}  // namespace gradsync
