#include "common/table/row_index.h"

#include <algorithm>

#include "common/base/numeric/rng.h"

namespace gradsync {

size_t RowIndex::Home(uint64_t id) const {
  // Salted, so that the bits picking a place here are not those TableShardOf picked the shard by.
  return static_cast<size_t>(Rng::SplitMix64(id ^ 0x5bd1e9955bd1e995ULL)) & mask_;
}

void RowIndex::Insert(uint64_t id, uint32_t slot) {
  if (ids_.empty() || (size_ + 1) * 10 > ids_.size() * 7) Grow(ids_.empty() ? 64 : ids_.size() * 2);
  size_t i = Home(id);
  while (slots_[i] != kAbsent) i = (i + 1) & mask_;
  ids_[i] = id;
  slots_[i] = slot;
  ++size_;
}

void RowIndex::Clear() {
  std::fill(slots_.begin(), slots_.end(), kAbsent);
  size_ = 0;
}

void RowIndex::Reserve(size_t n) {
  size_t capacity = ids_.empty() ? 64 : ids_.size();
  while (n * 10 > capacity * 7) capacity *= 2;
  if (capacity > ids_.size()) Grow(capacity);
}

void RowIndex::Grow(size_t capacity) {
  std::vector<uint64_t> old_ids = std::move(ids_);
  std::vector<uint32_t> old_slots = std::move(slots_);
  ids_.assign(capacity, 0);
  slots_.assign(capacity, kAbsent);
  mask_ = capacity - 1;
  size_ = 0;
  for (size_t i = 0; i < old_slots.size(); ++i) {
    if (old_slots[i] == kAbsent) continue;
    size_t j = Home(old_ids[i]);
    while (slots_[j] != kAbsent) j = (j + 1) & mask_;
    ids_[j] = old_ids[i];
    slots_[j] = old_slots[i];
    ++size_;
  }
}

}  // namespace gradsync
