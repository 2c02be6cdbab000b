// The simulation's inputs from real runs and from the spec's train: the compute time and the
// accuracy curve of a real run's metrics, the codec times of a traced run, and the model's
// tensors.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/base/status.h"
#include "experiments/sim/sim.h"
#include "train_config.pb.h"

namespace gradsync::sim {

// The median compute_ms of a metrics file's training rows (every worker's).
Result<double> MedianComputeMs(const std::string& path);

// Worker 0's evaluation rows of a metrics file: accuracy vs step.
Result<std::vector<AccuracyPoint>> AccuracyCurve(const std::string& path);

// Accuracy at `step`: linear between measured points, the last one held past the end.
double AccuracyAt(const std::vector<AccuracyPoint>& curve, int64_t step);

// The model's tensors' shapes (forward order) from train's model: the MLP's and softmax's
// Fashion-MNIST layouts (weight {in, out}, then bias {out}, per layer, as models/mlp.cc has them).
Result<std::vector<std::vector<int64_t>>> ModelShapes(const config::TrainConfig& t);

// A tensor's shape written "64x32x5x5" (sim.tensor_shapes): every dimension >= 1.
Result<std::vector<int64_t>> ParseTensorShape(const std::string& text);

// The median encode time per float of a traced run's `encode` spans, its workers' and its
// shards' (spans that say how many values they encoded; their CPU time, `cpu_us`, where they
// have it), and, where the run all-gathered a
// codec's buckets, the median decode and sum time per payload and float of its `decode` spans.
Status CodecTimesFromTrace(const std::string& path, SimSettings* s);

}  // namespace gradsync::sim
