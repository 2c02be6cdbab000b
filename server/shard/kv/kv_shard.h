// KvShard: the parameters one server owns (a contiguous range of the flat parameter space), the
// server-side optimizer that updates them, and their version. No sockets: server.cc feeds it.
// Its parts: ShardLayout (where a request's data lies, and its checks), ShardValues (the
// parameters, copy-on-write), ShardStepper (the optimizer and how it steps them), PushApplier
// (a push applied at once), RoundAccumulator (a bsp round summed and applied once) and
// ShardTables (the shard's rows of the job's embedding tables, stepped with the rest); KvShard
// keeps the version, the schedule's step and the gradient count, and puts state back whole.
//
// Data addressed by a request: dense `segments` (flat [offset, offset + length) ranges) followed
// by sparse `keys` (flat indices, sorted, unique, inside sparse tensors); values come in that
// order. Accumulate() + ApplyAccumulated(count) sum a round and apply the mean once: one
// optimizer step (bsp). Apply() applies one worker's gradient at once (ssp, asp), so that a round
// of N pushes moves the parameters about as far as one step:
//   SGD:  one step on g / N (weight decay divided by N too, so N pushes decay once);
//   Adam: one Adam step (m, v and t advance) on g itself at rate lr / N. Adam divides the
//         gradient by its own running scale, so g / N would not shorten the step; lr / N does.
//   LARS, LAMB: likewise one step on g itself at rate lr / N, weight decay undivided: LAMB's
//         m / sqrt(v) and LARS's trust ratio (eta ||w|| / ||g||) do not follow g's scale either.
//         Each push's trust ratios are its own gradient's (per layer, over the shard's part of
//         the layer); a push in parts is gathered and applied at its last part.
//         With N = 1 each is exactly the optimizer on one worker's gradient.
// LARS and LAMB adapt per layer: the shard's layers are the layout's tensors cut to its range
// (OptimizerLayers), and a dense update is split (over --apply-threads) at layer boundaries
// only, so each trust ratio is over a layer's whole part in this shard.
// The rate is the schedule's at the shard's step, or a push's own (`lr`: a worker whose own
// optimizer or schedule sets the rate, a frontend's LR scheduler) instead. The version counts
// gradients applied; the step that drives the learning-rate schedule counts rounds (bsp) or
// gradients / N (ssp, asp). Not thread-safe.
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "common/base/numeric/parallel_for.h"
#include "common/base/numeric/tensor.h"
#include "common/base/status.h"
#include "common/optim/optimizer.h"
#include "common/ps/partitioner.h"
#include "common/table/table_spec.h"
#include "server/shard/kv/push_applier.h"
#include "server/shard/kv/round_accumulator.h"
#include "server/shard/kv/shard_layout.h"
#include "server/shard/kv/shard_stepper.h"
#include "server/shard/kv/shard_tables.h"
#include "server/shard/kv/shard_values.h"

namespace gradsync {

class KvShard {
 public:
  KvShard(Segment range, std::vector<TensorInfo> layout, const OptimizerOptions& optimizer,
          const LrSchedule& lr, int num_workers, bool aggregate, ShardTables tables = {});

  const Segment& range() const { return layout_.range(); }
  // ShardLayout::Validate and ShardLayout::ValidateAbsent: what a request may address here (the
  // table rows a request names: tables().Validate).
  Status Validate(std::span<const Segment> segments, std::span<const uint64_t> keys, const size_t* num_values,
                  std::span<const uint32_t> absent = {}) const {
    RETURN_IF_ERROR(layout_.Validate(segments, keys, num_values));
    return absent.empty() ? OkStatus() : layout_.ValidateAbsent(segments, absent);
  }
  // The shard's part of the job's embedding tables (ShardTables), stepped with the parameters.
  ShardTables& tables() { return tables_; }
  const ShardTables& tables() const { return tables_; }

  // Sets the initial parameters (the whole range, from worker 0).
  void SetValues(std::span<const float> values);
  // With `tables` (a request of table rows), `keys` are their ids and `out` gets their rows.
  void Read(std::span<const Segment> segments, std::span<const uint64_t> keys, float* out,
            std::span<const TableRun> tables = {}) const {
    if (tables.empty()) {
      values_.Read(segments, keys, out);
    } else {
      tables_.Read(tables, keys, out);
    }
  }
  // Applies one worker's gradient now (ssp/asp, PushApplier), at `lr` (the push's own rate; NaN:
  // the schedule's) times lr_scale (the staleness-aware rate passes 1 / staleness). A gradient
  // that came in parts is applied part by part with counts = false but for the last: it counts
  // once (version, step, the optimizer's step).
  // With `tables`, the gradient is table rows (keys: their ids; ShardTables::Apply), stepped at the
  // same rate; it counts as a dense one does.
  // `absent` (ValidateAbsent): tensors the gradient does not have (the worker's step computed
  // none for them); their values are ignored, and their parameters and optimizer state are left
  // as they are, as torch leaves a parameter whose .grad is None (Adam's and LAMB's t included:
  // Optimizer::SkipLayer).
  void Apply(std::span<const Segment> segments, std::span<const uint64_t> keys, const float* values,
             float lr_scale = 1.0f, bool counts = true, float lr = NAN, std::span<const uint32_t> absent = {},
             std::span<const TableRun> tables = {});
  // Adds a gradient to the round (bsp, RoundAccumulator; with `tables`, rows: ShardTables).
  void Accumulate(std::span<const Segment> segments, std::span<const uint64_t> keys, const float* values,
                  std::span<const uint32_t> absent = {}, std::span<const TableRun> tables = {});
  // Applies the mean of the `count` gradients accumulated (bsp) at `lr` (NaN: the schedule's), the
  // tables' rows the round touched included.
  // A dense tensor that no push of the round carried a gradient for (absent from each, or not
  // in its segments) is left alone; the others are updated with the mean over `count` (an
  // absent push counts as a zero gradient there, as an all-reduce's average of workers' unused
  // parameters).
  void ApplyAccumulated(int count, float lr = NAN);

  // Large dense updates split over these threads (ShardStepper::set_parallel).
  void set_parallel(ParallelFor* pool) { stepper_.set_parallel(pool); }

  int64_t version() const { return version_; }
  int64_t step() const { return step_; }
  int64_t gradients() const { return gradients_; }
  std::span<const float> params() const { return values_.get(); }
  // The parameters' owner, for a reply that sends them without a copy (Payload::owner): until
  // the reply lets go, the next update writes a fresh copy instead (copy-on-write), so what the
  // reply sends stays one version.
  std::shared_ptr<const void> Share() const { return values_.Share(); }
  // The optimizer: its options, its state (Optimizer::state(): momentum, or Adam's m then v;
  // num_slots() vectors, named by OptimizerSlotNames: vector k is state()'s
  // [k * range().size(), (k + 1) * range().size())), its steps taken, per layer the steps it
  // skipped (skipped()), and LARS's and LAMB's layers (layers(): the layout's tensors cut to the
  // range, OptimizerLayers).
  const Optimizer& optimizer() const { return stepper_.optimizer(); }

  // Sets the optimizer's state (laid out as optimizer().state()) and its steps taken: a worker's
  // STATE_PUSH, or a backup's copy of one. kInvalidArgument, and nothing changes, when the size is
  // not this optimizer's, a vector holds a value CheckOptimizerSlot refuses, or steps is negative
  // or past 2^62. The parameters, version and schedule step stay as they are.
  // `skipped`: per optimizer layer, the steps it skipped (Optimizer::skipped; empty: none).
  Status SetOptimizerState(std::span<const float> state, int64_t steps, std::span<const int64_t> skipped = {});
  // Sets the range's parameters: a worker's parameter set (STATE_PUSH with params), or a backup's
  // copy of one. kInvalidArgument, and nothing changes, when the size is not the range's or a
  // value is not finite. The optimizer state, version and schedule step stay as they are.
  Status SetParams(std::span<const float> params);
  // What SetParams refuses: kInvalidArgument naming the first parameter that is not finite, or
  // the size when it is not the range's.
  Status CheckParams(std::span<const float> params) const { return values_.Check(params); }

  // Puts back a checkpointed state: the range's parameters, the optimizer's state (its size
  // must be this optimizer's) and steps, the version, the schedule's step and the gradient
  // count. kDataLoss when a size cannot be this shard's or a count is negative or past 2^62.
  Status Restore(std::span<const float> params, std::span<const float> optimizer_state, int64_t optimizer_steps,
                 int64_t version, int64_t step, int64_t gradients, std::span<const int64_t> optimizer_skipped = {});

 private:
  ShardStepper stepper_;  // before layout_: its layers are the layout's
  ShardLayout layout_;
  ShardValues values_;
  PushApplier push_;
  RoundAccumulator round_;
  ShardTables tables_;
  LrSchedule lr_;
  int num_workers_;
  int64_t version_ = 0;
  int64_t step_ = 0;
  int64_t gradients_ = 0;
};

}  // namespace gradsync
