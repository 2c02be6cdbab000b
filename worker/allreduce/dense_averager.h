// DenseAverager: how AllreduceSync averages a step's dense gradient over a Collective when it is
// not overlapped with backward: the layout's dense tensors, in place, the same bits on every
// rank afterwards. Two ways:
//
//   bucketed (MakeDenseAverager with a payload codec or none): the flat buffer's dense runs cut
//     into buckets of bucket_bytes, each averaged by a BucketAverager (plain, or compressed by
//     a payload codec: bucket_average.h);
//   low-rank ("powersgd:R"): PowerSGD (compression/powersgd.h): every matrix's rank-r factors
//     and the whole vectors averaged in two all-reduces, warm-started, with error feedback when
//     the run has it.
//
//   ASSIGN_OR_RETURN(auto avg, MakeDenseAverager(&ring, layout, {.codec = "powersgd:4", ...}));
//   RETURN_IF_ERROR(avg->Average(model.grads(), step));
//
// Every rank must call Average for the same steps. Not thread-safe; uses the collective while
// Average runs.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "allreduce/collective.h"
#include "common/base/status.h"
#include "common/base/numeric/tensor.h"

namespace gradsync {

class DenseAverager {
 public:
  virtual ~DenseAverager() = default;
  // Averages the dense tensors of `grads` (the flat gradient of the layout) in place.
  virtual Status Average(FloatSpan grads, uint64_t step) = 0;
  // True when what travels is not the plain floats.
  virtual bool compressed() const = 0;
};

struct DenseAveragerOptions {
  std::string codec;  // "" or "none": a plain average; a payload codec; or powersgd:RANK
  uint64_t seed = 0;  // the codec's shared randomness (the same on every rank)
  bool error_feedback = false;
  float correction_momentum = 0;  // DGC (payload codecs)
  size_t bucket_bytes = 25u << 20;  // bucketed: the largest bucket
  bool allow_overflow = false;      // fp16 loss scaling: a bucket may hold an inf (BucketAverager)
};

// kInvalidArgument for a codec that cannot be built. `collective` must outlive the averager.
Result<std::unique_ptr<DenseAverager>> MakeDenseAverager(Collective* collective, const std::vector<TensorInfo>& layout,
                                                         const DenseAveragerOptions& options);

}  // namespace gradsync
