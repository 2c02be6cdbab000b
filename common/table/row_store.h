// RowStore: the rows a table shard holds, slot by slot: each slot a row's `dim` values followed by
// its optimizer state (RowOptimizer::state_floats()), and, for an optimizer that counts steps per
// row, its step count. Slots live in slabs of kSlabRows, so the store grows with the rows created
// and never copies the rows it has (no doubling spike at 10^6 rows).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace gradsync {

class RowStore {
 public:
  static constexpr uint32_t kSlabRows = 4096;

  // dim values and state_floats of state per row; steps: whether a step count is kept per row.
  RowStore(int dim, int state_floats, bool steps);

  uint32_t size() const { return size_; }
  int dim() const { return dim_; }
  int state_floats() const { return stride_ - dim_; }
  // A new slot (its floats unset); size() grows by one.
  uint32_t Add();
  // Forgets every row; keeps the memory of the first slab.
  void Clear();

  float* values(uint32_t slot) { return slabs_[slot / kSlabRows].get() + Offset(slot); }
  const float* values(uint32_t slot) const { return slabs_[slot / kSlabRows].get() + Offset(slot); }
  float* state(uint32_t slot) { return values(slot) + dim_; }
  const float* state(uint32_t slot) const { return values(slot) + dim_; }
  // The slot's step count (null when the store keeps none).
  int64_t* steps(uint32_t slot) { return keeps_steps_ ? &steps_[slot] : nullptr; }
  int64_t steps_of(uint32_t slot) const { return keeps_steps_ ? steps_[slot] : 0; }

  // The memory the rows hold, in bytes.
  uint64_t bytes() const;

 private:
  size_t Offset(uint32_t slot) const {
    return static_cast<size_t>(slot % kSlabRows) * static_cast<size_t>(stride_);
  }

  int dim_;
  int stride_;
  bool keeps_steps_;
  uint32_t size_ = 0;
  std::vector<std::unique_ptr<float[]>> slabs_;
  std::vector<int64_t> steps_;
};

}  // namespace gradsync
