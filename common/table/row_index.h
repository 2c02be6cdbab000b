// RowIndex: where each row of a table shard is stored: a 64-bit id to a 32-bit slot, in one
// open-addressing array (linear probing, at most 7/10 full, doubled when it would pass that), so
// a lookup is one hashed probe into contiguous memory and an entry costs 12 bytes / 0.7, not a
// node per row as std::unordered_map's. Rows are never removed one by one (a table's bound refuses
// instead of evicting), so there are no tombstones; Clear() empties it keeping its memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace gradsync {

class RowIndex {
 public:
  static constexpr uint32_t kAbsent = UINT32_MAX;

  // The slot of `id`, or kAbsent.
  uint32_t Find(uint64_t id) const {
    if (size_ == 0) return kAbsent;
    for (size_t i = Home(id);; i = (i + 1) & mask_) {
      if (slots_[i] == kAbsent) return kAbsent;
      if (ids_[i] == id) return slots_[i];
    }
  }
  // Asks the CPU to bring `id`'s first probe into the cache: a loop over many ids prefetches a few
  // ahead, so that their lookups' cache misses overlap instead of coming one after another.
  void Prefetch(uint64_t id) const {
    if (size_ == 0) return;
    const size_t i = Home(id);
    __builtin_prefetch(&slots_[i]);
    __builtin_prefetch(&ids_[i]);
  }
  // Adds `id` at `slot` (id must be absent).
  void Insert(uint64_t id, uint32_t slot);
  // Forgets every id; keeps the memory.
  void Clear();
  // Makes room for `n` ids without growing again.
  void Reserve(size_t n);

  // fn(id, slot) for every id, in no particular order.
  template <typename Fn>
  void ForEach(Fn&& fn) const {
    for (size_t i = 0; i < slots_.size(); ++i) {
      if (slots_[i] != kAbsent) fn(ids_[i], slots_[i]);
    }
  }

  size_t size() const { return size_; }
  // The memory the index holds, in bytes.
  uint64_t bytes() const {
    return ids_.capacity() * sizeof(uint64_t) + slots_.capacity() * sizeof(uint32_t);
  }

 private:
  size_t Home(uint64_t id) const;
  void Grow(size_t capacity);

  std::vector<uint64_t> ids_;
  std::vector<uint32_t> slots_;  // kAbsent: an empty place
  size_t mask_ = 0;
  size_t size_ = 0;
};

}  // namespace gradsync
