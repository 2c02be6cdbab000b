// PlanAlgorithm: the all-reduce algorithms that run one PlanStep at a time over the ring and
// mesh connections: recursive halving-doubling, recursive doubling and the binomial tree (and
// the fold of a rank count that is not a power of two). Their steps come from allreduce/plan/.
// A step that sums what it receives reduces it segment by segment through the segment scratch;
// a swap of the same range (recursive doubling) receives the whole buffer first, then sums.
#pragma once

#include <cstddef>
#include <vector>

#include "allreduce/mesh/peer_mesh.h"
#include "allreduce/plan/schedule.h"
#include "allreduce/ring_pipeline.h"

namespace gradsync {

class PlanAlgorithm {
 public:
  using Reducer = RingPipeline::Reducer;

  // `scratch` holds the incoming segment of a reduce (shared with RingAlgorithm: one at a time).
  PlanAlgorithm(PeerMesh& mesh, size_t segment_bytes, std::vector<float>& scratch)
      : mesh_(mesh), segment_bytes_(segment_bytes), scratch_(scratch) {}

  // The steps of rhd, rd or the tree over `data` (elements of `elem` bytes); a failure breaks
  // the mesh.
  Status Run(const Plan& plan, void* data, size_t elem, const Reducer& reduce);

 private:
  // Receives `bytes` from `from` and reduces them into `data` segment by segment (through the
  // segment scratch), while optionally sending `send_bytes` from `send` to `to`.
  Status ReceiveReducing(uint32_t step, int from, void* data, size_t bytes, size_t elem, const Reducer& reduce, int to,
                         const void* send, size_t send_bytes);

  PeerMesh& mesh_;
  const size_t segment_bytes_;
  std::vector<float>& scratch_;
  std::vector<std::byte> whole_;  // a whole incoming buffer (recursive doubling)
};

}  // namespace gradsync
