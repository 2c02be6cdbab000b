// GradientTransform: what a shard does to a counted push's values before it applies them, and
// what it must see of the workers' reads to do it. ShardCore calls one for every push it applies
// at once (ssp, asp) and every read it answers, whatever the job asked for:
//
// - PassThrough: the values as they came (bsp, which holds rounds and has nothing stale; a job
//   without a transform);
// - DelayCompensation (delay_compensation.h): DC-ASGD, each gradient corrected for the updates
//   applied since its worker's pull.
//
// A new transform is one more implementation here and a case in MakeGradientTransform. Soft
// state: made afresh with the shard (Build, a restore, a takeover), never in a checkpoint; the
// primary replicates the transformed values, so a backup applies what it applied. Not
// thread-safe: the shard's loop drives it.
#pragma once

#include <memory>
#include <span>

#include "common/base/numeric/segment.h"
#include "common/base/status.h"
#include "gradsync.pb.h"
#include "server/shard/push_assembler.h"

namespace gradsync {

class GradientTransform {
 public:
  virtual ~GradientTransform() = default;
  // Worker w read `segments` (flat, inside the shard's range) of the shard's parameters `params`
  // (the whole range) as they are now: a pull answered, or every worker after a parameter set.
  virtual void Pulled(int worker, std::span<const Segment> segments, std::span<const float> params) = 0;
  // Worker w's counted push, each chunk's values replaced by the transformed ones, against the
  // shard's parameters now.
  virtual void Transform(int worker, HeldPush* push, std::span<const float> params) = 0;
};

class PassThrough final : public GradientTransform {
 public:
  void Pulled(int, std::span<const Segment>, std::span<const float>) override {}
  void Transform(int, HeldPush*, std::span<const float>) override {}
};

// The transform of `job` for the shard over `range`: DelayCompensation for its delay
// compensation where pushes are applied at once (`aggregates` false), else PassThrough.
// kInvalidArgument for a lambda that is negative or not finite, or a sparse model with it.
Result<std::unique_ptr<GradientTransform>> MakeGradientTransform(const wire::JobConfig& job, Segment range,
                                                                 bool aggregates);

}  // namespace gradsync
