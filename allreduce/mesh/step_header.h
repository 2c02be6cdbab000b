// StepHeaders: which operation and step the mesh is at. It numbers the operations (every rank
// calls the same ones in the same order), knows the algorithm the all-reduce steps carry, writes
// every step's header and checks a received one against the one expected (so a rank that gets
// another operation's data fails instead of mixing it), and names where a step is for errors.
#pragma once

#include <cstdint>
#include <string>

#include "allreduce/plan/algorithm.h"
#include "allreduce/plan/schedule.h"
#include "common/base/status.h"

namespace gradsync {

class MeshTopology;

// The operation a step belongs to (in every step header).
enum class CollectiveOp : uint32_t {
  kAllReduce = 1, kBroadcast = 2, kAllGather = 3, kBarrier = 4, kReduceScatter = 5, kAllGatherChunks = 6
};

// Every step's header on the wire (kStepHeaderBytes, allreduce/plan/schedule.h).
struct StepHeader {
  uint32_t magic;
  uint32_t op;
  uint64_t seq;
  uint32_t step;
  uint32_t algo;  // AllReduceAlgo for all-reduces (ranks that disagree fail, naming both), else 0
  uint64_t bytes;
};
static_assert(sizeof(StepHeader) == kStepHeaderBytes);

class StepHeaders {
 public:
  explicit StepHeaders(const MeshTopology& topology) : topology_(topology) {}

  // A new operation.
  void Next() { ++seq_; }
  // The algorithm the all-reduce steps' headers carry.
  void set_algorithm(AllReduceAlgo algo) { algo_ = algo; }
  StepHeader Header(CollectiveOp op, uint32_t step, uint64_t bytes) const;
  // A received step header against the one expected (kInternal "mismatched collectives", or
  // kInvalidArgument when two ranks run different all-reduce algorithms).
  Status Check(const StepHeader& in, CollectiveOp op, uint32_t step, size_t bytes, int from) const;
  // "allreduce #seq step s on rank r", for errors.
  std::string Where(CollectiveOp op, uint32_t step) const;

 private:
  const MeshTopology& topology_;
  uint64_t seq_ = 0;
  AllReduceAlgo algo_ = AllReduceAlgo::kRing;
};

}  // namespace gradsync
