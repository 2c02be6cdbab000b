// StateTransfer: the shards' optimizer state and parameters moved whole between a worker and the
// shards (ARCHITECTURE.md, "Optimizer state"): PullOptimizerState assembles every shard's
// vectors per tensor of the layout (StateGather collects them as they come), PushOptimizerState
// and PushParameters cut the caller's per-tensor state (flat parameters) into the shards' ranges.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/base/numeric/tensor.h"
#include "common/base/status.h"
#include "common/ps/partitioner.h"
#include "worker/ps/client/ps_requests.h"
#include "worker/ps/client/shard_links.h"

namespace gradsync {

// The shards' optimizer state, assembled per tensor of the layout (PullOptimizerState,
// PushOptimizerState).
struct OptimizerStateParts {
  std::string kind;   // the shards' optimizer: sgd | adam | lars | lamb
  int64_t steps = 0;  // its steps taken (Adam's and LAMB's t; 0: none yet, every vector zeros)
  // Per tensor of the layout, its own steps taken (at most `steps`: the steps it had no gradient
  // in are not its; torch's per-parameter "step"); empty: every tensor's is `steps`.
  std::vector<int64_t> tensor_steps;
  // slots[k][t]: the optimizer's state vector k (OptimizerSlotNames' order: SGD's momentum buffer;
  // Adam's exp_avg, exp_avg_sq) of tensor t of the layout, in layout order, flat (the tensor's size).
  std::vector<std::vector<std::vector<float>>> slots;
};

// A STATE_PULL's replies, per shard, as they come.
class StateGather {
 public:
  struct Shard {
    std::string kind;
    int64_t steps = 0;
    std::vector<int64_t> skipped;  // per layer of its range
    int slots = 0;
    int received = 0;           // vectors so far
    std::vector<float> values;  // slots * the range's size
  };

  explicit StateGather(int shards) : shards_(static_cast<size_t>(shards)) {}
  // A STATE_PULL_REPLY of `shard` (`who`), whose range is `range`; an error for one that is not
  // the vector due.
  Status Take(int shard, const Message& m, const PsReply& r, const Segment& range, const std::string& who);
  const Shard& shard(int s) const { return shards_[static_cast<size_t>(s)]; }

 private:
  std::vector<Shard> shards_;
};

class StateTransfer {
 public:
  StateTransfer(const std::vector<TensorInfo>& layout, const Partitioner& partitioner, const ShardLinks& links,
                PsRequests& requests)
      : layout_(layout), partitioner_(partitioner), links_(links), requests_(requests) {}

  // The optimizer state the shards hold, read or set at this worker's clock `clock` (its pushes
  // so far, one still in flight included): each shard serves the request where it would answer a
  // pull of that clock (bsp: once round clock - 1 is applied, and before round clock can be, which
  // needs this worker's next push). Each shard's vectors come in one go (one message each), so a
  // shard's state is one state.
  //
  // PullOptimizerState: `kind` is the optimizer the caller expects ("": whatever the shards'); a
  // shard with another refuses (kInvalidArgument). kFailedPrecondition when the shards disagree on
  // their optimizer or its step count (ssp/asp: another worker's push applied on some shards but
  // not yet on others; read where no push is in flight).
  Result<OptimizerStateParts> PullOptimizerState(int64_t clock, double timeout_s, const std::string& kind = "");
  // PushOptimizerState: sets every shard's part of `state`; each shard sets its whole part at once
  // (at its quiescent point, above) and answers once its backups hold it. kInvalidArgument, with
  // nothing sent, when `state` does not fit the layout (an unknown optimizer, steps < 0, more than
  // kMaxOptimizerSlots vectors, a vector without one entry per tensor, an entry whose size is not
  // its tensor's) or holds a value CheckOptimizerSlot refuses; a shard refuses a state that is not
  // its optimizer's (kind, number of vectors), and sets nothing of it (every shard refuses alike).
  Status PushOptimizerState(int64_t clock, const OptimizerStateParts& state, double timeout_s);
  // PushParameters: sets every shard's parameters to its range of `params` (the whole flat
  // buffer), at this worker's clock `clock` as PushOptimizerState sets the state (the optimizer
  // state stays as it is), and returns once every shard (and its backups) holds them: a worker
  // whose copy of the model was changed outside training (a checkpoint loaded on rank 0, then
  // broadcast) makes it the shards'. kInvalidArgument, with nothing sent, when `params` is not the
  // layout's size or holds a value that is not finite; a shard refuses such a set alike.
  Status PushParameters(int64_t clock, ConstFloatSpan params, double timeout_s);

 private:
  const std::vector<TensorInfo>& layout_;
  const Partitioner& partitioner_;
  const ShardLinks& links_;
  PsRequests& requests_;
};

}  // namespace gradsync
