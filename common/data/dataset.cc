#include "common/data/dataset.h"

#include <algorithm>

#include "common/base/check.h"

namespace gradsync {
namespace {

// Row `row` of a dense dataset into `out` (dim floats): the floats themselves, or what its
// bytes stand for.
void CopyRow(const Dataset& data, int64_t row, float* out) {
  const size_t dim = static_cast<size_t>(data.dim), at = static_cast<size_t>(row) * dim;
  if (!data.stored_as_bytes()) {
    std::copy(data.features.data() + at, data.features.data() + at + dim, out);
    return;
  }
  const uint8_t* src = data.bytes.data() + at;
  for (size_t j = 0; j < dim; ++j) out[j] = data.byte_values[src[j]];
}

}  // namespace

Batch BatchBuffer::Gather(const Dataset& data, std::span<const uint32_t> indices) {
  const int64_t b = static_cast<int64_t>(indices.size());
  if (data.generated()) {
    for (uint32_t i : indices) GRADSYNC_CHECK(i < data.n) << "index " << i << " >= " << data.n;
    data.source->Fill(indices, &x_, &row_ptr_, &keys_, &labels_);
    Batch batch;
    batch.size = b;
    batch.dim = data.dim;
    batch.x = x_.data();
    batch.row_ptr = row_ptr_;
    batch.keys = keys_;
    batch.labels = labels_;
    return batch;
  }
  labels_.resize(static_cast<size_t>(b));
  Batch batch;
  batch.size = b;
  batch.dim = data.dim;
  for (int64_t i = 0; i < b; ++i) {
    GRADSYNC_CHECK(indices[i] < data.n) << "index " << indices[i] << " >= " << data.n;
    labels_[i] = data.labels[indices[i]];
  }
  if (!data.sparse) {
    x_.resize(static_cast<size_t>(b * data.dim));
    for (int64_t i = 0; i < b; ++i) CopyRow(data, indices[i], x_.data() + i * data.dim);
    batch.x = x_.data();
  } else {
    row_ptr_.assign(1, 0);
    keys_.clear();
    values_.clear();
    for (int64_t i = 0; i < b; ++i) {
      int64_t lo = data.row_ptr[indices[i]], hi = data.row_ptr[indices[i] + 1];
      keys_.insert(keys_.end(), data.keys.begin() + lo, data.keys.begin() + hi);
      values_.insert(values_.end(), data.values.begin() + lo, data.values.begin() + hi);
      row_ptr_.push_back(static_cast<int64_t>(keys_.size()));
    }
    batch.row_ptr = row_ptr_;
    batch.keys = keys_;
    batch.values = values_;
    if (data.mixed()) {
      x_.resize(static_cast<size_t>(b * data.dim));
      for (int64_t i = 0; i < b; ++i) CopyRow(data, indices[i], x_.data() + i * data.dim);
      batch.x = x_.data();
    }
  }
  batch.labels = labels_;
  return batch;
}

Batch BatchBuffer::Slice(const Dataset& data, int64_t begin, int64_t end) {
  if (data.generated()) {
    GRADSYNC_CHECK(0 <= begin && begin <= end && end <= data.n) << begin << ".." << end;
    slice_.resize(static_cast<size_t>(end - begin));
    for (int64_t i = begin; i < end; ++i) slice_[static_cast<size_t>(i - begin)] = static_cast<uint32_t>(i);
    return Gather(data, slice_);
  }
  if (data.sparse || !data.stored_as_bytes()) return SliceBatch(data, begin, end);
  GRADSYNC_CHECK(0 <= begin && begin <= end && end <= data.n) << begin << ".." << end;
  Batch batch;
  batch.size = end - begin;
  batch.dim = data.dim;
  batch.labels = std::span<const int32_t>(data.labels).subspan(begin, end - begin);
  x_.resize(static_cast<size_t>(batch.size * data.dim));
  for (int64_t i = begin; i < end; ++i) CopyRow(data, i, x_.data() + (i - begin) * data.dim);
  batch.x = x_.data();
  return batch;
}

Batch SliceBatch(const Dataset& data, int64_t begin, int64_t end) {
  GRADSYNC_CHECK(0 <= begin && begin <= end && end <= data.n) << begin << ".." << end;
  GRADSYNC_CHECK(!data.generated()) << data.name << " is generated: BatchBuffer::Slice";
  GRADSYNC_CHECK(data.sparse || !data.stored_as_bytes()) << data.name << " is stored as bytes: BatchBuffer::Slice";
  Batch batch;
  batch.size = end - begin;
  batch.dim = data.dim;
  batch.labels = std::span<const int32_t>(data.labels).subspan(begin, end - begin);
  if (!data.sparse) {
    batch.x = data.features.data() + begin * data.dim;
  } else {
    batch.row_ptr = std::span<const int64_t>(data.row_ptr).subspan(begin, end - begin + 1);
    // Keys/values stay indexed by the absolute offsets in row_ptr.
    batch.keys = data.keys;
    batch.values = data.values;
    if (data.mixed()) batch.x = data.features.data() + begin * data.dim;
  }
  return batch;
}

void Standardize(Dataset* data, float mean, float stddev) {
  GRADSYNC_CHECK(!data->sparse && stddev > 0.0f);
  const float inv = 1.0f / stddev;
  for (float& v : data->features) v = (v - mean) * inv;
  for (float& v : data->byte_values) v = (v - mean) * inv;
}

}  // namespace gradsync
