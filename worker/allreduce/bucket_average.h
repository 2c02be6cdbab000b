// BucketAverager: averages one bucket of a dense gradient over a Collective, in place, plain or
// compressed: what AllreduceSync does per bucket, and what the Python frontend's DDP
// communication hook does per DDP bucket.
//
//   ASSIGN_OR_RETURN(auto avg, BucketAverager::Create(&ring, "topk:0.01", seed, /*error_feedback=*/true));
//   RETURN_IF_ERROR(avg->Average(bucket, /*bucket_index=*/i, /*step=*/s));
//
// Plain: a ring average. fp16 and random-k are summed inside the ring (fp16: halves of gradients
// pre-divided by n; random-k: the k values every rank kept, the same indices for the same step).
// The other codecs' payloads are all-gathered and every rank decodes and averages them in rank
// order, so every rank ends with the same bits. Each bucket index has its own encoder (its
// error-feedback residual): every rank must call Average for the same buckets, in the same
// order, with the same sizes. A bucket index whose size changes gets a new encoder (its residual
// is dropped). Not thread-safe; uses the collective while Average runs.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "allreduce/collective.h"
#include "common/base/status.h"
#include "common/base/numeric/tensor.h"
#include "compression/compressor.h"
#include "compression/gradient_encoder.h"

namespace gradsync {

class BucketAverager {
 public:
  // `codec`: "" or "none" for a plain average, else a compressor spec. `collective` must
  // outlive the averager.
  static Result<std::unique_ptr<BucketAverager>> Create(Collective* collective, const std::string& codec,
                                                        uint64_t seed, bool error_feedback,
                                                        float correction_momentum = 0);

  Status Average(FloatSpan g, size_t bucket_index, uint64_t step);
  bool compressed() const { return decoder_ != nullptr; }
  // fp16's loss scaling: a bucket may hold an inf (the step is then skipped after the average,
  // on every rank alike). Codecs with a residual refuse it (GradientEncoder::AllowOverflow).
  void set_allow_overflow(bool allow) { allow_overflow_ = allow; }

 private:
  BucketAverager(Collective* collective, std::string codec, uint64_t seed, bool error_feedback,
                 float correction_momentum)
      : collective_(collective), codec_(std::move(codec)), seed_(seed), error_feedback_(error_feedback),
        correction_momentum_(correction_momentum) {}

  Collective* collective_;
  std::string codec_;
  uint64_t seed_;
  bool error_feedback_;
  float correction_momentum_;
  bool allow_overflow_ = false;
  std::unique_ptr<Compressor> decoder_;
  std::vector<std::unique_ptr<GradientEncoder>> encoders_;  // per bucket index
  std::vector<uint8_t> encoded_;
  std::vector<float> decoded_;
  std::vector<std::vector<std::byte>> gathered_;
};

}  // namespace gradsync
