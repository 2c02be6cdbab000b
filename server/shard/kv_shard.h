// KvShard: the parameters one server owns (a contiguous range of the flat parameter space), the
// server-side optimizer that updates them, and their version. No sockets: server.cc feeds it.
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
#include "common/base/status.h"
#include "common/base/numeric/tensor.h"
#include "common/optim/optimizer.h"
#include "common/ps/partitioner.h"

namespace gradsync {

class KvShard {
 public:
  KvShard(Segment range, std::vector<TensorInfo> layout, const OptimizerOptions& optimizer,
          const LrSchedule& lr, int num_workers, bool aggregate);

  const Segment& range() const { return range_; }
  // Checks that segments lie in the range and keys are sorted, unique, in range and sparse;
  // `values` (if not null) must hold exactly segment lengths + keys values.
  Status Validate(std::span<const Segment> segments, std::span<const uint64_t> keys,
                  const size_t* num_values) const;

  // Checks a push's absent tensors (PsRequest::absent_tensors): layout indices, increasing, of
  // dense tensors that its `segments` reach.
  Status ValidateAbsent(std::span<const Segment> segments, std::span<const uint32_t> absent) const;

  // Sets the initial parameters (the whole range, from worker 0).
  void SetValues(std::span<const float> values);
  void Read(std::span<const Segment> segments, std::span<const uint64_t> keys, float* out) const;
  // Applies one worker's gradient now (ssp/asp), at `lr` (the push's own rate; NaN: the
  // schedule's) times lr_scale (the staleness-aware rate passes 1 / staleness). A gradient that
  // came in parts is applied part by part with counts = false but for the last: it counts once
  // (version, step, the optimizer's step).
  // `absent` (ValidateAbsent): tensors the gradient does not have (the worker's step computed
  // none for them); their values are ignored, and their parameters and optimizer state are left
  // as they are, as torch leaves a parameter whose .grad is None (Adam's and LAMB's t included:
  // Optimizer::SkipLayer).
  void Apply(std::span<const Segment> segments, std::span<const uint64_t> keys, const float* values,
             float lr_scale = 1.0f, bool counts = true, float lr = NAN, std::span<const uint32_t> absent = {});
  void Accumulate(std::span<const Segment> segments, std::span<const uint64_t> keys, const float* values,
                  std::span<const uint32_t> absent = {});
  // Applies the mean of the `count` gradients accumulated (bsp) at `lr` (NaN: the schedule's).
  // A dense tensor that no push of the round carried a gradient for (absent from each, or not
  // in its segments) is left alone; the others are updated with the mean over `count` (an
  // absent push counts as a zero gradient there, as an all-reduce's average of workers' unused
  // parameters).
  void ApplyAccumulated(int count, float lr = NAN);

  // Large dense updates split over these threads (null: this thread alone). The same bits either
  // way: the optimizer's update is element-wise (LARS, LAMB: per layer, one layer per thread).
  void set_parallel(ParallelFor* pool) { parallel_ = pool; }

  int64_t version() const { return version_; }
  int64_t step() const { return step_; }
  int64_t gradients() const { return gradients_; }
  std::span<const float> params() const { return *params_; }
  // The parameters' owner, for a reply that sends them without a copy (Payload::owner): until
  // the reply lets go, the next update writes a fresh copy instead (copy-on-write), so what the
  // reply sends stays one version.
  std::shared_ptr<const void> Share() const;
  const OptimizerOptions& optimizer_options() const { return optimizer_.options(); }
  // The optimizer's state (Optimizer::state(): momentum, or Adam's m then v) and steps taken.
  std::span<const float> optimizer_state() const { return optimizer_.state(); }
  int64_t optimizer_steps() const { return optimizer_.steps(); }
  // LARS's and LAMB's layers: the layout's tensors cut to the range (OptimizerLayers).
  const std::vector<OptimizerLayer>& optimizer_layers() const { return optimizer_.layers(); }

  // The optimizer's state vectors (Optimizer::num_slots(), named by OptimizerSlotNames): vector k
  // is optimizer_state()'s [k * range().size(), (k + 1) * range().size()).
  int optimizer_slots() const { return optimizer_.num_slots(); }
  // Sets the optimizer's state (laid out as optimizer_state()) and its steps taken: a worker's
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
  Status CheckParams(std::span<const float> params) const;
  // Optimizer::skipped(): per layer (optimizer_layers()), the steps it took no part in.
  std::span<const int64_t> optimizer_skipped() const { return optimizer_.skipped(); }

  // Puts back a checkpointed state: the range's parameters, the optimizer's state (its size
  // must be this optimizer's) and steps, the version, the schedule's step and the gradient
  // count. kDataLoss when a size cannot be this shard's or a count is negative or past 2^62.
  Status Restore(std::span<const float> params, std::span<const float> optimizer_state, int64_t optimizer_steps,
                 int64_t version, int64_t step, int64_t gradients, std::span<const int64_t> optimizer_skipped = {});

 private:
  float Lr(float pushed) const { return std::isnan(pushed) ? lr_.At(step_) : pushed; }
  // Before any write: the parameters to itself alone (a copy if a reply still holds them).
  void Own();
  // optimizer_.Step over a dense run (local offset), in pieces over parallel_ when it is large;
  // `clear` (the accumulated gradient g itself, or null) is zeroed piece by piece after use.
  void StepDense(int64_t local, std::span<const float> g, float lr, float grad_scale, float* clear);
  // fn(local begin, local end, position in the segment's values) for each run of segment `s`
  // outside the absent tensors; skip(layer) for each absent tensor's layer it reaches.
  template <typename Fn, typename Skip>
  void ForPresent(const Segment& s, std::span<const uint32_t> absent, Fn&& fn, Skip&& skip) const;
  // Marks in present_ the layers segment `s` reaches but for the absent tensors'.
  void MarkPresent(const Segment& s, std::span<const uint32_t> absent);
  // Whether sorted, unique keys of sparse elements of the range (the fast check; Validate names
  // the first bad key when it fails).
  bool KeysValid(std::span<const uint64_t> keys) const;

  Segment range_;
  std::vector<TensorInfo> layout_;
  std::vector<Segment> dense_runs_;   // local offsets (relative to range_.begin)
  std::vector<Segment> sparse_runs_;  // local offsets, sorted
  std::shared_ptr<std::vector<float>> params_;  // copy-on-write (Share)
  Optimizer optimizer_;
  ParallelFor* parallel_ = nullptr;
  LrSchedule lr_;
  int num_workers_;
  float push_grad_scale_;  // Apply(): SGD 1/N, the others 1
  float push_lr_scale_;    // Apply(): SGD 1, Adam, LARS, LAMB 1/N
  bool layer_wise_;        // LARS, LAMB
  std::vector<Segment> layer_cuts_;    // StepDense: a run's layers, local to the run
  std::vector<float> pending_;         // Apply (LARS, LAMB): a push's values until its last part
  std::vector<Segment> pending_runs_;  // ... and the local runs they fill
  std::vector<float> scratch_;
  std::vector<uint64_t> local_keys_;  // Apply: a push's keys, local
  std::vector<float> accum_;
  std::vector<uint64_t> touched_keys_;  // local indices of sparse elements touched this round
  std::vector<uint8_t> touched_;
  std::vector<Segment> tensor_local_;  // per layout tensor: its part of the range, local (empty: none)
  std::vector<int> tensor_layer_;      // per layout tensor: its optimizer layer (-1: none in the range)
  std::vector<uint8_t> present_;       // bsp: per optimizer layer, the round carries a gradient for it
  int64_t version_ = 0;
  int64_t step_ = 0;
  int64_t gradients_ = 0;
};

}  // namespace gradsync
