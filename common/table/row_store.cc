#include "common/table/row_store.h"

namespace gradsync {

RowStore::RowStore(int dim, int state_floats, bool steps)
    : dim_(dim), stride_(dim + state_floats), keeps_steps_(steps) {}

uint32_t RowStore::Add() {
  const uint32_t slot = size_;
  if (slot / kSlabRows == slabs_.size()) {
    slabs_.push_back(
        std::make_unique<float[]>(static_cast<size_t>(kSlabRows) * static_cast<size_t>(stride_)));
  }
  if (keeps_steps_) steps_.push_back(0);
  ++size_;
  return slot;
}

void RowStore::Clear() {
  if (slabs_.size() > 1) slabs_.resize(1);
  steps_.clear();
  size_ = 0;
}

uint64_t RowStore::bytes() const {
  return static_cast<uint64_t>(slabs_.size()) * kSlabRows * static_cast<uint64_t>(stride_) *
             sizeof(float) +
         steps_.capacity() * sizeof(int64_t);
}

}  // namespace gradsync
