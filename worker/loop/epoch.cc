#include "worker/loop/epoch.h"

#include <algorithm>
#include <cmath>

namespace gradsync {

std::pair<int64_t, int64_t> BatchRange(int64_t s, int64_t steps_per_epoch, int64_t batch, int64_t shard) {
  const int64_t begin = std::min(s * batch, shard);
  const int64_t end = s + 1 == steps_per_epoch ? shard : std::min(begin + batch, shard);
  return {begin, end};
}

int64_t StepsPerEpoch(int64_t n, int num_workers, int64_t batch) {
  const int64_t smallest = n / num_workers;
  return std::max<int64_t>(1, (smallest + batch - 1) / batch);
}

float AccumulateGradients(Model& model, const Dataset& data, std::span<const uint32_t> indices, int64_t micro_batch,
                          BatchBuffer& buffer, std::vector<float>& acc) {
  const size_t n = indices.size();
  // The micro-batches' gradients are not final: readiness is reported once, at the end.
  auto ready = model.grad_ready();
  model.set_grad_ready({});
  acc.assign(model.grads().size(), 0.0f);
  double loss = 0;
  for (size_t begin = 0; begin < n; begin += static_cast<size_t>(micro_batch)) {
    const size_t end = std::min(n, begin + static_cast<size_t>(micro_batch));
    Batch micro = buffer.Gather(data, indices.subspan(begin, end - begin));
    // Sums of per-sample gradients (mean times count), divided once at the end: fewer
    // roundings than weighting each micro-batch by its share.
    const float count = static_cast<float>(end - begin);
    loss += static_cast<double>(model.ForwardBackward(micro)) * count;
    Axpy(count, model.grads(), acc);
  }
  Scale(acc, 1.0f / static_cast<float>(n));
  Copy(acc, model.grads());
  model.set_grad_ready(ready);
  if (ready) {
    for (size_t t = model.layout().size(); t-- > 0;) ready(t);
  }
  return static_cast<float>(loss / static_cast<double>(n));
}

LrSchedule RunSchedule(const LocalTrainOptions& o, int64_t total_steps, int64_t steps_per_epoch) {
  LrSchedule lr = o.lr;
  if (lr.total_steps == 0) lr.total_steps = total_steps;
  if (o.warmup_epochs > 0) {
    lr.warmup_steps = std::max<int64_t>(1, std::llround(o.warmup_epochs * static_cast<double>(steps_per_epoch)));
  }
  return lr;
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
    ASSIGN_OR_RETURN(EvalResult e, EvaluateWithRows(model, *c.test, c.eval_batch, c.read_rows ? *c.read_rows : RowReader()));
    r.test_loss = e.loss;
    r.test_accuracy = e.accuracy;
    r.test_auc = e.auc;
  }
  r.wall_s = c.run_clock->Seconds();
  if (metrics && c.evaluate) {
    MetricsRow row = StepRow(c.step, c.steps_per_epoch, r.wall_s, r.train_loss);
    row.test.loss = r.test_loss;
    row.test.accuracy = r.test_accuracy;
    row.test.auc = r.test_auc;
    row.traffic.bytes_sent = c.bytes_sent;
    row.traffic.bytes_received = c.bytes_received;
    row.traffic.shm_bytes_sent = c.shm_bytes_sent;
    row.traffic.shm_bytes_received = c.shm_bytes_received;
    RETURN_IF_ERROR(metrics->Write(row));
  }
  return r;
}

Status WriteEvaluationRow(const EpochClose& c, double loss, Model& model, MetricsWriter* metrics) {
  if (!metrics) return OkStatus();
  ASSIGN_OR_RETURN(EvalResult e, EvaluateWithRows(model, *c.test, c.eval_batch, c.read_rows ? *c.read_rows : RowReader()));
  MetricsRow row = StepRow(c.step, c.steps_per_epoch, c.run_clock->Seconds(), loss);
  row.test.loss = e.loss;
  row.test.accuracy = e.accuracy;
  row.test.auc = e.auc;
  row.traffic.bytes_sent = c.bytes_sent;
  row.traffic.bytes_received = c.bytes_received;
  row.traffic.shm_bytes_sent = c.shm_bytes_sent;
  row.traffic.shm_bytes_received = c.shm_bytes_received;
  return metrics->Write(row);
}

}  // namespace gradsync
