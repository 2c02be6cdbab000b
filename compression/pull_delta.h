// Compressed pulls (--compress-pull): a shard answers a worker's pull with the compressed delta
// between its parameters and what that worker holds, and the worker adds what it decodes. The
// shard keeps a mirror of each worker's copy that follows it bit for bit (it decodes its own
// payload and adds that), so what a payload leaves out (params - mirror) goes out with a later
// one: error feedback on the server, one residual per worker. The encoder (server/) and the
// decoder (worker/) live here together, with the codec step they share (PullCodecStep).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <vector>

#include "common/base/numeric/segment.h"
#include "common/base/status.h"
#include "common/base/numeric/tensor.h"
#include "compression/compressor.h"

namespace gradsync {

class PullDeltaEncoder {
 public:
  // `codec` as the workers' decoder (same spec and seed); `range` is the shard's.
  PullDeltaEncoder(std::unique_ptr<Compressor> codec, Segment range) : codec_(std::move(codec)), range_(range) {}

  // A raw reply gave `worker` `values` over `segments` (validated: sorted, disjoint, in the
  // range): its mirror takes them; it is complete once they have covered the whole range.
  void Record(int worker, std::span<const Segment> segments, const float* values);
  // The payload for `worker`'s pull at `clock` of `current` (the shard's values over
  // `segments`), and its mirror moved by what the worker will decode. False when the worker has
  // no complete mirror yet (the pull is answered raw); an error when the codec cannot decode its
  // own payload (answer raw too).
  Result<bool> Encode(int worker, std::span<const Segment> segments, std::span<const float> current, int64_t clock,
                      std::vector<uint8_t>* payload);
  // A worker that left or rejoined: its next pull is raw.
  void Forget(int worker) { mirrors_.erase(worker); }

 private:
  struct Mirror {
    std::vector<float> values;  // over the shard's range
    bool complete = false;
  };
  std::unique_ptr<Compressor> codec_;
  Segment range_;
  std::map<int, Mirror> mirrors_;
  std::vector<float> delta_, decoded_;
};

class PullDeltaDecoder {
 public:
  explicit PullDeltaDecoder(std::unique_ptr<Compressor> codec) : codec_(std::move(codec)) {}
  // Decodes a reply's payload (validated by the codec) for the pull at `clock` and adds it to
  // `target` at `segments` (which the caller has checked lie inside `target`).
  Status AddTo(std::span<const uint8_t> payload, std::span<const Segment> segments, int64_t clock, FloatSpan target);

 private:
  std::unique_ptr<Compressor> codec_;
  std::vector<float> decoded_;
};

}  // namespace gradsync
