#include "server/shard/kv/kv_shard.h"

#include <algorithm>
#include <string>

#include "common/base/check.h"

namespace gradsync {
namespace {

// The rate of an update at schedule step `step`: the push's own (`pushed`), or NaN: the schedule's.
float Rate(const LrSchedule& lr, int64_t step, float pushed) { return std::isnan(pushed) ? lr.At(step) : pushed; }

}  // namespace

KvShard::KvShard(Segment range, std::vector<TensorInfo> layout, const OptimizerOptions& optimizer,
                 const LrSchedule& lr, int num_workers, bool aggregate, ShardTables tables)
    : stepper_(optimizer, num_workers, aggregate, range.size(), OptimizerLayers(layout, range)),
      layout_(range, std::move(layout), stepper_.optimizer().layers()),
      values_(range),
      round_(aggregate, layout_, static_cast<size_t>(range.size()), stepper_.optimizer().layers().size()),
      tables_(std::move(tables)),
      lr_(lr),
      num_workers_(num_workers) {}

void KvShard::SetValues(std::span<const float> values) {
  GRADSYNC_CHECK(values.size() == values_.size());
  std::vector<float>& params = values_.Own();
  std::copy(values.begin(), values.end(), params.begin());
}

void KvShard::Apply(std::span<const Segment> segments, std::span<const uint64_t> keys, const float* values,
                    float lr_scale, bool counts, float pushed_lr, std::span<const uint32_t> absent,
                    std::span<const TableRun> tables) {
  if (tables.empty()) {
    std::vector<float>& params = values_.Own();
    const float lr = Rate(lr_, step_, pushed_lr) * lr_scale * stepper_.push_lr_scale();
    push_.Apply(layout_, stepper_, params, segments, keys, values, lr, counts, absent);
  } else {
    tables_.Apply(tables, keys, values, Rate(lr_, step_, pushed_lr), lr_scale);
    if (counts) {
      // The push's last part: LARS and LAMB step the dense parts they gathered now.
      std::vector<float>& params = values_.Own();
      const float lr = Rate(lr_, step_, pushed_lr) * lr_scale * stepper_.push_lr_scale();
      push_.Apply(layout_, stepper_, params, {}, {}, nullptr, lr, true, {});
    }
  }
  if (!counts) return;
  stepper_.optimizer().EndStep();
  ++version_;
  ++gradients_;
  step_ = gradients_ / num_workers_;
}

void KvShard::Accumulate(std::span<const Segment> segments, std::span<const uint64_t> keys, const float* values,
                         std::span<const uint32_t> absent, std::span<const TableRun> tables) {
  if (tables.empty()) {
    round_.Add(layout_, stepper_.optimizer().layers(), segments, keys, values, absent);
  } else {
    tables_.Accumulate(tables, keys, values);
  }
}

void KvShard::ApplyAccumulated(int count, float pushed_lr) {
  GRADSYNC_CHECK(count > 0);
  std::vector<float>& params = values_.Own();
  const float lr = Rate(lr_, step_, pushed_lr);
  const float inv = 1.0f / static_cast<float>(count);
  round_.ApplyTo(layout_, stepper_, params, inv, lr);
  tables_.ApplyAccumulated(count, lr);
  stepper_.optimizer().EndStep();
  version_ += count;
  gradients_ += count;
  ++step_;
}

Status KvShard::SetOptimizerState(std::span<const float> state, int64_t steps, std::span<const int64_t> skipped) {
  return stepper_.SetState(state, steps, skipped, values_.size());
}

Status KvShard::SetParams(std::span<const float> params) {
  RETURN_IF_ERROR(values_.Check(params));
  std::vector<float>& own = values_.Own();  // a pull reply may still be sending the old values
  std::copy(params.begin(), params.end(), own.begin());
  return OkStatus();
}

Status KvShard::Restore(std::span<const float> params, std::span<const float> optimizer_state,
                        int64_t optimizer_steps, int64_t version, int64_t step, int64_t gradients,
                        std::span<const int64_t> optimizer_skipped) {
  Optimizer& optimizer = stepper_.optimizer();
  if (params.size() != values_.size()) {
    return DataLossError("checkpoint holds " + std::to_string(params.size()) + " parameters, the shard " +
                         std::to_string(values_.size()));
  }
  if (optimizer_state.size() != optimizer.state().size()) {
    return DataLossError("checkpoint's optimizer state has " + std::to_string(optimizer_state.size()) +
                         " values; this shard's " + OptimizerKindName(optimizer.options().kind) + " keeps " +
                         std::to_string(optimizer.state().size()));
  }
  // Counters go up by one per update: a negative one, or one that could overflow, is no shard's.
  constexpr int64_t kMaxCount = int64_t{1} << 62;
  for (const int64_t c : {version, step, gradients, optimizer_steps}) {
    if (c < 0 || c > kMaxCount) return DataLossError("checkpoint has a counter out of range: " + std::to_string(c));
  }
  if (Status st = CheckSkippedSteps(optimizer_skipped, optimizer.layers().size(), optimizer_steps); !st.ok()) {
    return DataLossError("checkpoint's optimizer: " + st.message());
  }
  std::vector<float>& own = values_.Own();
  std::copy(params.begin(), params.end(), own.begin());
  optimizer.SetState(optimizer_state);
  optimizer.set_steps(optimizer_steps);
  optimizer.set_skipped(optimizer_skipped);
  version_ = version;
  step_ = step;
  gradients_ = gradients;
  return OkStatus();
}

}  // namespace gradsync
