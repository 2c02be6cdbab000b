// Codec specs, as --compress and specs write them: none | fp16 | bf16 | int8 | sign |
// qsgd:LEVELS | topk:RATIO | randomk:RATIO | powersgd:RANK. One table row per kind (codec_spec.cc)
// says how its parameter is written and what the codec needs of the path it runs on; callers ask
// those answers, never which codec it is. compression/ builds the codecs.
#pragma once

#include <string>

#include "common/base/status.h"

namespace gradsync {

struct CodecSpec {
  enum class Kind { kNone, kFp16, kBf16, kInt8, kSign, kQsgd, kTopK, kRandomK, kPowerSgd };
  Kind kind = Kind::kNone;
  double param = 0;  // qsgd levels, top-k / random-k ratio, PowerSGD's rank
  bool sparse() const { return kind == Kind::kTopK || kind == Kind::kRandomK; }
  // A payload codec (compression/compressor.h builds it), else factors averaged in all-reduces
  // (compression/powersgd.h, worker/allreduce/dense_averager.h's averager).
  bool payload() const;
  // The shards can aggregate it (a factored codec's second factor needs every worker's first
  // averaged: a bsp round in two phases, which the shards do not have).
  bool on_ps() const;
  bool on_device() const;
  // Each tensor is compressed as a matrix of its shape (a caller gives the shapes).
  bool needs_shapes() const;
  // PowerSGD: low-rank factors of each matrix, averaged in two all-reduces.
  bool low_rank() const { return kind == Kind::kPowerSgd; }
};
Result<CodecSpec> ParseCodecSpec(const std::string& spec);

}  // namespace gradsync
