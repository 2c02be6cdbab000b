// Synthetic datasets for tests and benchmarks, fully determined by their options (seed included).
#pragma once

#include <cstdint>

#include "common/data/dataset.h"

namespace gradsync {

// Dense classification: `classes` Gaussian blobs in `dim` dimensions. Centers ~ N(0, center_scale^2)
// per coordinate, points = center + N(0, stddev^2). Labels cycle 0..classes-1.
struct BlobsOptions {
  int64_t n = 1000;
  int64_t dim = 16;
  int classes = 4;
  float center_scale = 1.0f;
  float stddev = 1.0f;
  uint64_t seed = 0;
};
Dataset MakeGaussianBlobs(const BlobsOptions& options);

// The classic parameter-server workload: binary logistic regression over 2^feature_bits hashed
// features. Each example has `nnz` distinct keys drawn from a power-law popularity (a few keys
// are in most examples, most keys are rare) with value 1/sqrt(nnz); the label is
// 1[w*.x + N(0, noise^2) > 0] for a hidden weight vector w*(key) ~ N(0, 1).
struct SparseLogisticOptions {
  int64_t n = 10000;
  int feature_bits = 20;  // key space 2^feature_bits (>= 2^20 is the intended size)
  int nnz = 20;
  float noise = 0.1f;
  uint64_t seed = 0;
};
Dataset MakeSparseLogistic(const SparseLogisticOptions& options);

// The hidden weight w*(key) used by MakeSparseLogistic (for tests that check learnability).
float SparseLogisticTrueWeight(uint64_t seed, uint64_t key);

}  // namespace gradsync
