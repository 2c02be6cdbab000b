// AllReduceAlgorithm: the one interface every CPU all-reduce algorithm runs behind (the ring,
// rhd, rd and the tree over TCP, shm and hier through this host's shared memory). RingCollective
// resolves which one runs (ResolveAllReduceAlgo) and calls it once per all-reduce: one virtual
// call per operation, never per element or segment.
#pragma once

#include <cstddef>
#include <functional>

#include "allreduce/shm/shm_group.h"
#include "common/base/status.h"

namespace gradsync {

class AllReduceAlgorithm {
 public:
  // reduce(acc, x, k) folds k received elements into acc.
  using Reducer = std::function<void(void*, const void*, size_t)>;

  virtual ~AllReduceAlgorithm() = default;
  // Sums `count` elements of `elem` bytes at `data` over every rank, in place. `add` (optional):
  // out = a + b in one pass, for shared memory's first addition. A failure breaks the mesh.
  virtual Status AllReduce(void* data, size_t count, size_t elem, const Reducer& reduce, ShmGroup::Adder add) = 0;
};

}  // namespace gradsync
