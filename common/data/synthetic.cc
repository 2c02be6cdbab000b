#include "common/data/synthetic.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "common/base/check.h"
#include "common/base/numeric/rng.h"

namespace gradsync {

Dataset MakeGaussianBlobs(const BlobsOptions& o) {
  GRADSYNC_CHECK(o.n > 0 && o.dim > 0 && o.classes > 1);
  Rng rng(Rng::Derive(o.seed, kSyntheticStream, 1));
  std::vector<float> centers(static_cast<size_t>(o.classes * o.dim));
  for (float& c : centers) c = static_cast<float>(rng.Normal()) * o.center_scale;
  Dataset d;
  d.name = "blobs";
  d.n = o.n;
  d.dim = o.dim;
  d.num_classes = o.classes;
  d.features.resize(static_cast<size_t>(o.n * o.dim));
  d.labels.resize(static_cast<size_t>(o.n));
  for (int64_t i = 0; i < o.n; ++i) {
    int label = static_cast<int>(i % o.classes);
    d.labels[i] = label;
    for (int64_t j = 0; j < o.dim; ++j) {
      d.features[i * o.dim + j] =
          centers[label * o.dim + j] + static_cast<float>(rng.Normal()) * o.stddev;
    }
  }
  return d;
}

namespace {
uint64_t Mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}
}  // namespace

float SparseLogisticTrueWeight(uint64_t seed, uint64_t key) {
  uint64_t h1 = Mix(Rng::Derive(seed, kSyntheticStream, 2) ^ key);
  uint64_t h2 = Mix(h1 ^ 0x9e3779b97f4a7c15ULL);
  double u1 = (static_cast<double>(h1 >> 11) + 0.5) * 0x1.0p-53;
  double u2 = static_cast<double>(h2 >> 11) * 0x1.0p-53;
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2));
}

Dataset MakeSparseLogistic(const SparseLogisticOptions& o) {
  GRADSYNC_CHECK(o.n > 0 && o.feature_bits >= 4 && o.feature_bits <= 40 && o.nnz > 0);
  const uint64_t space = uint64_t{1} << o.feature_bits;
  GRADSYNC_CHECK(static_cast<uint64_t>(o.nnz) * 4 <= space);
  Rng rng(Rng::Derive(o.seed, kSyntheticStream, 3));
  const double log_space = std::log(static_cast<double>(space));
  const uint64_t key_salt = Rng::Derive(o.seed, kSyntheticStream, 4);
  const float value = 1.0f / std::sqrt(static_cast<float>(o.nnz));
  Dataset d;
  d.name = "sparse-logistic";
  d.n = o.n;
  d.dim = static_cast<int64_t>(space);
  d.num_classes = 2;
  d.sparse = true;
  d.row_ptr.reserve(static_cast<size_t>(o.n + 1));
  d.row_ptr.push_back(0);
  d.keys.reserve(static_cast<size_t>(o.n * o.nnz));
  d.labels.resize(static_cast<size_t>(o.n));
  std::vector<uint64_t> row;
  for (int64_t i = 0; i < o.n; ++i) {
    row.clear();
    while (row.size() < static_cast<size_t>(o.nnz)) {
      // Log-uniform popularity rank (Zipf-like with exponent 1), hashed into the key space.
      uint64_t rank = static_cast<uint64_t>(std::exp(rng.UniformDouble() * log_space)) - 1;
      uint64_t key = Mix(rank ^ key_salt) & (space - 1);
      if (std::find(row.begin(), row.end(), key) == row.end()) row.push_back(key);
    }
    std::sort(row.begin(), row.end());
    double margin = 0.0;
    for (uint64_t k : row) {
      d.keys.push_back(k);
      d.values.push_back(value);
      margin += SparseLogisticTrueWeight(o.seed, k) * value;
    }
    margin += rng.Normal() * o.noise;
    d.labels[i] = margin > 0.0 ? 1 : 0;
    d.row_ptr.push_back(static_cast<int64_t>(d.keys.size()));
  }
  return d;
}

}  // namespace gradsync
