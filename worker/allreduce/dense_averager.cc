#include "worker/allreduce/dense_averager.h"

#include <algorithm>

#include "common/config/train_config.h"
#include "common/obs/trace.h"
#include "common/ps/partitioner.h"
#include "compression/powersgd.h"
#include "worker/allreduce/bucket_average.h"

namespace gradsync {
namespace {

// The dense runs in buckets, each through a BucketAverager.
class BucketedAverager final : public DenseAverager {
 public:
  BucketedAverager(std::unique_ptr<BucketAverager> buckets, std::vector<Segment> runs, size_t bucket_floats)
      : buckets_(std::move(buckets)), runs_(std::move(runs)), bucket_floats_(bucket_floats) {}

  Status Average(FloatSpan grads, uint64_t step) override {
    size_t bucket_index = 0;
    for (const Segment& run : runs_) {
      const size_t begin = static_cast<size_t>(run.begin), end = static_cast<size_t>(run.end);
      for (size_t b = begin; b < end; b += bucket_floats_, ++bucket_index) {
        FloatSpan g = grads.subspan(b, std::min(bucket_floats_, end - b));
        TraceSpan span("all-reduce bucket", "comm", {{"floats", static_cast<double>(g.size())}});
        RETURN_IF_ERROR(buckets_->Average(g, bucket_index, step));
      }
    }
    return OkStatus();
  }
  bool compressed() const override { return buckets_->compressed(); }

 private:
  std::unique_ptr<BucketAverager> buckets_;
  std::vector<Segment> runs_;
  size_t bucket_floats_;
};

// PowerSGD's two averages of factors.
class LowRankAverager final : public DenseAverager {
 public:
  LowRankAverager(Collective* collective, const std::vector<TensorInfo>& layout, int rank, uint64_t seed,
                  bool error_feedback)
      : collective_(collective), power_(layout, rank, seed, error_feedback), first_(power_.first_floats()),
        second_(power_.second_floats()) {}

  Status Average(FloatSpan grads, uint64_t) override {
    {
      TraceSpan span("encode", "compute", {{"floats", static_cast<double>(first_.size())}});
      span.CountCpu();
      power_.First(grads, first_);
    }
    {
      TraceSpan span("all-reduce P", "comm", {{"floats", static_cast<double>(first_.size())}});
      RETURN_IF_ERROR(collective_->AllReduce(first_, ReduceOp::kAverage));
    }
    {
      TraceSpan span("encode", "compute", {{"floats", static_cast<double>(second_.size())}});
      span.CountCpu();
      power_.Second(first_, second_);
    }
    {
      TraceSpan span("all-reduce Q", "comm", {{"floats", static_cast<double>(second_.size())}});
      RETURN_IF_ERROR(collective_->AllReduce(second_, ReduceOp::kAverage));
    }
    TraceSpan span("decode", "compute", {{"floats", static_cast<double>(power_.dense_floats())}});
    power_.Finish(first_, second_, grads);
    return OkStatus();
  }
  bool compressed() const override { return true; }

 private:
  Collective* collective_;
  PowerSgd power_;
  std::vector<float> first_, second_;
};

}  // namespace

Result<std::unique_ptr<DenseAverager>> MakeDenseAverager(Collective* collective, const std::vector<TensorInfo>& layout,
                                                         const DenseAveragerOptions& o) {
  const std::string codec = o.codec == "none" ? "" : o.codec;
  if (!codec.empty()) {
    ASSIGN_OR_RETURN(const CodecSpec spec, ParseCodecSpec(codec));
    if (!spec.payload()) {
      if (o.correction_momentum > 0) return InvalidArgumentError("--momentum-correction applies to topk and randomk, not " + codec);
      return std::unique_ptr<DenseAverager>(
          std::make_unique<LowRankAverager>(collective, layout, static_cast<int>(spec.param), o.seed, o.error_feedback));
    }
  }
  ASSIGN_OR_RETURN(std::unique_ptr<BucketAverager> buckets,
                   BucketAverager::Create(collective, codec, o.seed, o.error_feedback, o.correction_momentum));
  buckets->set_allow_overflow(o.allow_overflow);
  return std::unique_ptr<DenseAverager>(std::make_unique<BucketedAverager>(
      std::move(buckets), DenseRuns(layout, {0, LayoutSize(layout)}), std::max<size_t>(1, o.bucket_bytes / sizeof(float))));
}

}  // namespace gradsync
