#include "worker/allreduce/overlap.h"

#include <algorithm>

#include "common/base/clock.h"

namespace gradsync {

OverlappedReducer::OverlappedReducer(Collective* collective, const std::vector<TensorInfo>& layout,
                                     size_t bucket_bytes, size_t first_bucket_bytes)
    : collective_(collective), buckets_of_tensor_(layout.size()) {
  const size_t cap = std::max<size_t>(1, bucket_bytes / sizeof(float));
  const size_t first_cap = std::max<size_t>(1, std::min(bucket_bytes, first_bucket_bytes) / sizeof(float));
  // Walk the tensors last to first; a bucket grows downwards through the flat buffer and stays
  // contiguous (a gap between tensors closes it).
  Bucket cur;
  bool open = false;
  auto close = [&] {
    if (open) buckets_.push_back(cur);
    open = false;
  };
  for (size_t t = layout.size(); t-- > 0;) {
    const size_t off = static_cast<size_t>(layout[t].offset), size = static_cast<size_t>(layout[t].size);
    if (open && cur.begin != off + size) close();
    size_t left = size;
    while (left > 0) {
      if (!open) {
        cur = Bucket{off + left, off + left, 0, {}};
        open = true;
      }
      const size_t limit = buckets_.empty() ? first_cap : cap;
      const size_t take = std::min(left, limit - (cur.end - cur.begin));
      cur.begin -= take;
      left -= take;
      ++cur.tensors;
      buckets_of_tensor_[t].push_back(buckets_.size());
      if (cur.end - cur.begin == limit) close();
    }
  }
  close();
  for (auto& b : buckets_of_tensor_) std::sort(b.begin(), b.end());
  thread_ = std::thread([this] { Loop(); });
}

OverlappedReducer::~OverlappedReducer() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void OverlappedReducer::ReduceScatterToShards(const std::vector<size_t>& shards) {
  std::lock_guard lock(mu_);
  for (Bucket& b : buckets_) {
    b.shard_bounds.clear();
    for (size_t at : shards) b.shard_bounds.push_back(std::clamp(at, b.begin, b.end) - b.begin);
  }
}

void OverlappedReducer::Begin(FloatSpan grads) {
  std::lock_guard lock(mu_);
  grads_ = grads;
  pending_.resize(buckets_.size());
  for (size_t i = 0; i < buckets_.size(); ++i) pending_[i] = buckets_[i].tensors;
  queue_.clear();
  done_ = 0;
  status_ = OkStatus();
  busy_ms_ = 0;
}

void OverlappedReducer::OnReady(size_t tensor) {
  bool any = false;
  {
    std::lock_guard lock(mu_);
    for (size_t b : buckets_of_tensor_[tensor]) {
      if (--pending_[b] == 0) {
        queue_.push_back(b);
        any = true;
      }
    }
  }
  if (any) cv_.notify_all();
}

void OverlappedReducer::Loop() {
  std::unique_lock lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (stop_) return;
    const size_t b = queue_.front();
    queue_.pop_front();
    const bool failed = !status_.ok();
    FloatSpan data = grads_.subspan(buckets_[b].begin, buckets_[b].end - buckets_[b].begin);
    const std::vector<size_t>& shards = buckets_[b].shard_bounds;
    lock.unlock();
    Stopwatch sw;
    // After a failure the ring is broken anyway: the remaining buckets are only counted.
    Status s = failed           ? OkStatus()
               : shards.empty() ? collective_->AllReduce(data, ReduceOp::kAverage)
                                : collective_->ReduceScatter(data, ReduceOp::kAverage, shards);
    const double ms = sw.Millis();
    lock.lock();
    busy_ms_ += ms;
    if (!s.ok() && status_.ok()) status_ = s.WithContext("bucket " + std::to_string(b));
    ++done_;
    cv_.notify_all();
  }
}

Status OverlappedReducer::Finish() {
  Stopwatch waited;
  std::unique_lock lock(mu_);
  // Backward has returned, so every gradient is final: a bucket whose tensors were not all
  // reported (a model without readiness calls) goes now.
  bool late = false;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    if (pending_[b] > 0) {
      pending_[b] = 0;
      queue_.push_back(b);
      late = true;
    }
  }
  if (late) cv_.notify_all();
  cv_.wait(lock, [&] { return done_ == buckets_.size(); });
  exposed_ms_ = waited.Millis();
  return status_;
}

}  // namespace gradsync
