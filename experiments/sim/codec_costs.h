// Codec costs, measured on this machine: a payload's size and the encode and decode times of a
// push and of a compressed pull, per message size.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/base/status.h"

namespace gradsync::sim {

struct CodecCost {
  size_t payload = 0;
  double encode_us = 0, decode_us = 0;            // a push: the sender's encoder, the codec's decode
  double pull_encode_us = 0, pull_decode_us = 0;  // a compressed pull: the shard's delta encoder, the worker's decoder
};

// PowerSGD ("powersgd:R", compression/powersgd.h): the floats of each rank's two all-reduces (the
// P factors and the whole tensors, then the Q factors) and the CPU time of its three passes
// (First before the first, Second between them, Finish after the second).
struct LowRankCost {
  size_t first_floats = 0, second_floats = 0;
  double first_us = 0, second_us = 0, finish_us = 0;
};

class Codecs {
 public:
  // The per-float times < 0: timed here; else a real run's (codec_from).
  Codecs(std::string spec, bool error_feedback, float correction, double encode_us_per_float,
         double pull_encode_us_per_float, double gather_decode_us_per_float);
  bool on() const { return spec_ != "none" && !spec_.empty(); }
  // A factored codec (not a payload codec: CodecSpec::payload): its costs are LowRank's.
  bool factored() const;
  const std::string& spec() const { return spec_; }
  // The payload of n floats and the median of 5 timed encodes and decodes of random values
  // (after 2 that warm up).
  Result<CodecCost> Cost(size_t n);
  // The low-rank codec on the model of these tensor shapes (forward order): the real PowerSgd's
  // sizes, and the median of 5 timed steps of random gradients (after 2 that warm up), the
  // passes back to back as a worker runs them, on the worker's `blas_threads` (train.threads).
  Result<LowRankCost> LowRank(const std::vector<std::vector<int64_t>>& shapes, int blas_threads);
  // A gather codec's all-gathered bucket of n floats made into the sum (BucketAverager): every
  // rank's payload decoded and added in rank order. From a real run's decode spans (per payload
  // and float, `payloads` of them); else, timed here, the codec's decode and an add pass
  // (apply_ns_per_byte) for each of the other payloads.
  Result<double> GatherDecodeUs(size_t n, int payloads, double apply_ns_per_byte);
  // What was measured, for the run's description.
  std::string Describe() const;
  bool summable();
  // A summable payload's elements as the collective sums them: random-k's floats, else 16-bit
  // halves (BucketAverager).
  size_t summed_element_bytes();

 private:
  // Codecs run in processes that share a machine's caches with others: each op is timed from
  // cold caches (a pass over 64 MiB first), not from the caches a loop of its own would warm.
  void Evict();
  std::vector<float> evict_;
  volatile float sink_ = 0;
  std::string spec_;
  bool error_feedback_;
  float correction_;
  double encode_per_float_, pull_encode_per_float_, gather_decode_per_float_;
  std::map<size_t, CodecCost> cache_;
  std::optional<LowRankCost> low_rank_;  // LowRank's, once measured
};

}  // namespace gradsync::sim
