// PushRecord: what a PS sync (worker/ps/ps_sync.h) knows of this worker's pushes. The step's
// push as it is assembled: the tensors the caller declared absent (GradAbsent) and, with
// overlap, those whose gradient was already reported ready (which GradAbsent refuses); its
// sparse (key, value) pairs. The last push as sent: its pairs, rate and absent tensors, still
// valid while its gradient is the model's, so that Recover can send it again to a shard that
// came back without it. And whether it is answered: the request in flight, and the clock of a
// push not known to be acknowledged by every shard (its wait failed) until a later one is.
#pragma once

#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "common/base/status.h"
#include "models/model.h"

namespace gradsync {

class PushRecord {
 public:
  using RequestId = uint64_t;  // PsClient::RequestId

  // A new step's push over `ready_tensors` tensors whose readiness is reported (overlap; 0:
  // none is): no tensor absent or ready yet.
  void BeginStep(size_t ready_tensors) {
    absent_.clear();
    ready_.assign(ready_tensors, false);
  }
  // Tensor t is absent from this step's push (GradientSync::GradAbsent). kInvalidArgument for a
  // sparse tensor or one out of range; kFailedPrecondition when its gradient was already ready.
  Status MarkAbsent(const std::vector<TensorInfo>& layout, size_t tensor);
  void MarkReady(size_t tensor) {
    if (tensor < ready_.size()) ready_[tensor] = true;
  }
  // The step's absent tensors, sorted and unique, kept as the last push's.
  std::span<const uint32_t> TakeAbsent();
  // The step's sparse (key, value) pairs (flat keys) from the model's sparse gradients; none
  // when the model is dense (`sparse` false).
  void GatherSparse(const Model& model, bool sparse);
  std::span<const uint64_t> keys() const { return keys_; }
  std::span<const float> values() const { return values_; }

  // The push `id` went out at rate `lr`: in flight until answered.
  void Sent(RequestId id, float lr) {
    pending_ = id;
    last_lr_ = lr;
  }
  RequestId pending() const { return pending_; }
  // The wait for the push of `push_clock` ended: acknowledged by every shard, or not (then it
  // stays unacknowledged until a later push is).
  void Answered(bool acknowledged, int64_t push_clock) { unacked_clock_ = acknowledged ? -1 : push_clock; }
  // No push is waited for any more (answered, or given up on).
  void Settle() { pending_ = 0; }
  // A failure at `clock` (the step begun): a push still in flight is the previous step's, not
  // known to be acknowledged.
  void Interrupted(int64_t clock) {
    if (pending_ != 0 && clock > 0) unacked_clock_ = clock - 1;
    pending_ = 0;
  }
  // The clock of the push not known to be acknowledged; -1: none.
  int64_t unacked_clock() const { return unacked_clock_; }
  // The last push as sent: its rate and absent tensors (its pairs: keys(), values()).
  float last_lr() const { return last_lr_; }
  std::span<const uint32_t> last_absent() const { return last_absent_; }

 private:
  RequestId pending_ = 0;
  int64_t unacked_clock_ = -1;
  float last_lr_ = NAN;
  std::vector<uint32_t> absent_;       // this step's (GradAbsent)
  std::vector<uint32_t> last_absent_;  // the last push's, sorted
  std::vector<bool> ready_;            // overlap: the tensors reported ready this step
  std::vector<uint64_t> keys_;
  std::vector<float> values_;
};

}  // namespace gradsync
