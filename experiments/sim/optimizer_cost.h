// What a worker's own optimizer step costs, timed here on the real Optimizer over the model's
// size (the median of a few steps, warm): the simulation's local SGD and DiLoCo charge it for a
// worker's update of its own model every step (Adam's moments cost some ten times a momentum
// buffer's pass, which apply_ns_per_byte stands for).
#pragma once

#include <cstdint>

#include "common/base/status.h"
#include "train_config.pb.h"

namespace gradsync::sim {

// Microseconds of one step of the run's optimizer (train's optimizer, momentum, Nesterov, betas,
// eps, weight decay) over `params` floats. kInvalidArgument for an optimizer the config does not
// name rightly.
Result<double> InnerOptimizerUs(const config::TrainConfig& train, int64_t params);

}  // namespace gradsync::sim
