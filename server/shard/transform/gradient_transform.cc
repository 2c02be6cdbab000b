#include "server/shard/transform/gradient_transform.h"

#include <cmath>

#include "server/shard/transform/delay_compensation.h"

namespace gradsync {

Result<std::unique_ptr<GradientTransform>> MakeGradientTransform(const wire::JobConfig& job, Segment range,
                                                                 bool aggregates) {
  if (job.has_delay_compensation()) {
    if (!(std::isfinite(job.delay_compensation()) && job.delay_compensation() >= 0)) {
      return InvalidArgumentError("INIT: delay compensation must be finite and >= 0");
    }
    for (const auto& t : job.tensors()) {
      if (t.sparse()) return InvalidArgumentError("INIT: delay compensation applies to dense models");
    }
  }
  if (!job.has_delay_compensation() || aggregates) return std::unique_ptr<GradientTransform>(std::make_unique<PassThrough>());
  DelayCompensationOptions o;
  o.lambda = job.delay_compensation();
  o.adaptive = job.delay_compensation_adaptive();
  return std::unique_ptr<GradientTransform>(std::make_unique<DelayCompensation>(o, range, job.num_workers()));
}

}  // namespace gradsync
