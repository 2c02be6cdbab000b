// The benchmarks' input: a few fixed random Fashion-MNIST-shaped batches (784 pixels in [0, 1),
// 10 classes), cycled so that no data loading is timed.
#pragma once

#include <cstdint>
#include <vector>

#include "common/base/numeric/rng.h"
#include "common/data/dataset.h"

namespace gradsync {

class RandomBatches {
 public:
  static constexpr int64_t kDim = 784;
  RandomBatches(int64_t batch, int count = 16, uint64_t seed = 1) : batch_(batch), xs_(count), ys_(count) {
    Rng rng(seed);
    for (int i = 0; i < count; ++i) {
      xs_[i].resize(static_cast<size_t>(batch * kDim));
      ys_[i].resize(static_cast<size_t>(batch));
      for (float& v : xs_[i]) v = rng.Uniform();
      for (int32_t& y : ys_[i]) y = static_cast<int32_t>(rng.UniformInt(10));
    }
  }
  // The i-th batch, cycling.
  Batch Get(int i) const {
    const size_t k = static_cast<size_t>(i) % xs_.size();
    Batch b;
    b.size = batch_;
    b.dim = kDim;
    b.x = xs_[k].data();
    b.labels = ys_[k];
    return b;
  }

 private:
  int64_t batch_;
  std::vector<std::vector<float>> xs_;
  std::vector<std::vector<int32_t>> ys_;
};

}  // namespace gradsync
