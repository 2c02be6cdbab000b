// In-memory datasets and mini-batches.
//
// A Dataset is either dense (n x dim row-major floats, e.g. Fashion-MNIST pixels in [0, 1]) or
// sparse (CSR rows of (64-bit key, value) pairs over a huge key space, e.g. hashed click
// features). Labels are class ids in [0, num_classes). A Batch is a read-only view of a few rows
// gathered into contiguous buffers (BatchBuffer owns the storage), which is what models consume.
// Datasets are immutable after loading and may be read from several threads.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace gradsync {

struct Dataset {
  std::string name;
  int64_t n = 0;          // examples
  int64_t dim = 0;        // features per example (dense) or key space size (sparse)
  int num_classes = 0;
  bool sparse = false;

  std::vector<float> features;  // dense: n * dim
  std::vector<int64_t> row_ptr;  // sparse: n + 1 offsets into keys/values
  std::vector<uint64_t> keys;    // sparse: feature ids in [0, dim), unique within a row
  std::vector<float> values;     // sparse
  std::vector<int32_t> labels;   // n
};

// What a model sees: `size` examples, either dense rows or CSR rows, and their labels.
struct Batch {
  int64_t size = 0;
  int64_t dim = 0;
  const float* x = nullptr;            // dense: size * dim
  std::span<const int64_t> row_ptr;    // sparse: size + 1
  std::span<const uint64_t> keys;      // sparse
  std::span<const float> values;       // sparse
  std::span<const int32_t> labels;     // size
};

// Owns the storage of gathered batches; reused across steps to avoid allocation.
class BatchBuffer {
 public:
  // Copies rows `indices` of `data` (in that order) and returns a view valid until the next call.
  Batch Gather(const Dataset& data, std::span<const uint32_t> indices);

 private:
  std::vector<float> x_;
  std::vector<int64_t> row_ptr_;
  std::vector<uint64_t> keys_;
  std::vector<float> values_;
  std::vector<int32_t> labels_;
};

// A view of rows [begin, end) of a dense or sparse dataset without copying.
Batch SliceBatch(const Dataset& data, int64_t begin, int64_t end);

// x = (x - mean) / stddev for every dense feature (a fixed transform, e.g. Fashion-MNIST's
// mean 0.2860, std 0.3530).
void Standardize(Dataset* data, float mean, float stddev);

}  // namespace gradsync
