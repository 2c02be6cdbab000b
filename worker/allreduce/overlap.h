// OverlappedReducer: averages the dense gradient over a Collective in buckets, on a
// communication thread, while the backward pass goes on (PyTorch DDP's recipe).
//
// Buckets are cut from the flat gradient buffer in readiness order (the last tensor first, the
// order Model::set_grad_ready reports them): the first bucket holds at most first_bucket_bytes,
// so that communication starts early, the others at most bucket_bytes; a tensor larger than a
// bucket spans several. A bucket is all-reduced as soon as every tensor in it is ready, and
// buckets always go in the same order, which every rank must share (all ranks have the same
// model, so they do). The collective is used by the communication thread only between Begin()
// and Finish(); the caller must not touch it in between.
//
//   OverlappedReducer r(ring, model.layout(), 25 << 20, 1 << 20);
//   model.set_grad_ready([&](size_t t) { r.OnReady(t); });
//   r.Begin(model.grads());
//   model.ForwardBackward(batch);
//   RETURN_IF_ERROR(r.Finish());     // every bucket averaged; r.busy_ms(), r.exposed_ms()
#pragma once

#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "allreduce/collective.h"
#include "common/base/status.h"
#include "common/base/numeric/tensor.h"

namespace gradsync {

class OverlappedReducer {
 public:
  // `layout` must be dense (sparse tensors are all-gathered elsewhere).
  OverlappedReducer(Collective* collective, const std::vector<TensorInfo>& layout, size_t bucket_bytes,
                    size_t first_bucket_bytes);
  ~OverlappedReducer();
  OverlappedReducer(const OverlappedReducer&) = delete;
  OverlappedReducer& operator=(const OverlappedReducer&) = delete;

  // ZeRO stage 2: reduce-scatter each bucket instead of all-reducing it, cut where the shards
  // of the flat buffer are cut (`shards`: n + 1 offsets, shard i = [shards[i], shards[i + 1])),
  // so that after Finish() this rank's shard holds the averaged gradient and the rest is
  // undefined. Call before the first Begin().
  void ReduceScatterToShards(const std::vector<size_t>& shards);
  // Arms every bucket for one step over `grads` (the model's flat gradient buffer).
  void Begin(FloatSpan grads);
  // Tensor t's gradient is final (the model's readiness callback).
  void OnReady(size_t tensor);
  // Waits until every bucket is averaged; the first failure, if any.
  Status Finish();

  size_t num_buckets() const { return buckets_.size(); }
  // [begin, end) of bucket i in the flat buffer, in launch order.
  std::pair<size_t, size_t> bucket(size_t i) const { return {buckets_[i].begin, buckets_[i].end}; }
  // Of the last step: the communication thread's busy time, and the part of it after the
  // backward pass had ended (what the step waited for).
  double busy_ms() const { return busy_ms_; }
  double exposed_ms() const { return exposed_ms_; }

 private:
  struct Bucket {
    size_t begin = 0, end = 0;
    int tensors = 0;  // distinct tensors with elements in it
    std::vector<size_t> shard_bounds;  // ReduceScatterToShards: the shards cut to this bucket
  };
  void Loop();

  Collective* collective_;
  std::vector<Bucket> buckets_;
  std::vector<std::vector<size_t>> buckets_of_tensor_;
  FloatSpan grads_;
  std::vector<int> pending_;  // per bucket: tensors not ready yet

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<size_t> queue_;
  size_t done_ = 0;
  bool stop_ = false;
  Status status_;
  double busy_ms_ = 0;
  double exposed_ms_ = 0;
  std::thread thread_;
};

}  // namespace gradsync
