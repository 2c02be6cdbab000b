// In-memory datasets and mini-batches.
//
// A Dataset is either dense (n x dim row-major features) or sparse (CSR rows of (64-bit key,
// value) pairs over a huge key space, e.g. hashed click features), or both: a click log's rows
// hold dim dense features (stored as floats) and CSR ids, one per categorical feature, which a
// model with embedding tables reads (its batches carry both). A dense dataset keeps its
// features as they are stored: floats (the synthetic sets), or bytes (Fashion-MNIST's pixels, 4x
// smaller, often a read-only mapping that every worker on the host shares: data/dataset_cache.h),
// each byte standing for the float `byte_values[byte]` (scaled to [0, 1], perhaps standardized).
// Labels are class ids in [0, num_classes). A Batch is a read-only view of a few rows gathered into
// contiguous float buffers (BatchBuffer owns the storage and turns bytes into floats there, the
// one place every model's batches come from), which is what models consume. Datasets are
// immutable after loading and may be read from several threads.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace gradsync {

// Rows made on demand instead of stored (a click log generated from its seed: click_log.h): a
// Dataset whose `source` is set holds no features, keys or labels, and its batches are filled by
// the source, so a worker's memory holds its batch, not the data set.
class RowSource {
 public:
  virtual ~RowSource() = default;
  // Rows `indices` (positions in the data set) as a batch's buffers: dense features (Dataset::dim
  // each), CSR keys (row_ptr from 0, one entry more than rows), labels.
  virtual void Fill(std::span<const uint32_t> indices, std::vector<float>* x, std::vector<int64_t>* row_ptr,
                    std::vector<uint64_t>* keys, std::vector<int32_t>* labels) const = 0;
};

struct Dataset {
  std::string name;
  int64_t n = 0;          // examples
  int64_t dim = 0;        // features per example (dense, or both) or key space size (sparse)
  int num_classes = 0;
  bool sparse = false;

  std::vector<float> features;  // dense, stored as floats: n * dim
  // Dense, stored as bytes: n * dim, each standing for byte_values[byte]; `bytes_owner` keeps the
  // storage (a read-only mapping of a cache file, or a vector) alive, shared by every copy.
  std::span<const uint8_t> bytes;
  std::shared_ptr<const void> bytes_owner;
  std::array<float, 256> byte_values{};
  std::vector<int64_t> row_ptr;  // sparse: n + 1 offsets into keys/values
  std::vector<uint64_t> keys;    // sparse: feature ids in [0, dim), unique within a row
  std::vector<float> values;     // sparse
  std::vector<int32_t> labels;   // n

  // Generated on demand (RowSource): batches only through BatchBuffer.
  std::shared_ptr<const RowSource> source;

  bool stored_as_bytes() const { return bytes_owner != nullptr; }
  bool generated() const { return source != nullptr; }
  // Sparse rows and dense features both (a click log).
  bool mixed() const { return sparse && (!features.empty() || generated()); }
  // Dense feature `i` of the n * dim (row-major), as a model sees it.
  float FeatureAt(int64_t i) const {
    return stored_as_bytes() ? byte_values[bytes[static_cast<size_t>(i)]] : features[static_cast<size_t>(i)];
  }
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
  // Rows [begin, end): a view of a dataset stored as floats or sparse (SliceBatch), the rows
  // turned into floats here for one stored as bytes; valid until the next call.
  Batch Slice(const Dataset& data, int64_t begin, int64_t end);

 private:
  std::vector<float> x_;
  std::vector<int64_t> row_ptr_;
  std::vector<uint64_t> keys_;
  std::vector<float> values_;
  std::vector<int32_t> labels_;
  std::vector<uint32_t> slice_;  // Slice of a generated data set: its positions
};

// A view of rows [begin, end) of a dataset stored as floats or sparse, without copying (one
// stored as bytes: BatchBuffer::Slice).
Batch SliceBatch(const Dataset& data, int64_t begin, int64_t end);

// x = (x - mean) / stddev for every dense feature (a fixed transform, e.g. Fashion-MNIST's
// mean 0.2860, std 0.3530); for one stored as bytes, the value each byte stands for.
void Standardize(Dataset* data, float mean, float stddev);

}  // namespace gradsync
