// PlanAlgorithm: an all-reduce algorithm that runs one PlanStep at a time over the ring and mesh
// connections: recursive halving-doubling, recursive doubling or the binomial tree (one instance
// each, with the fold of a rank count that is not a power of two). Its steps come from
// allreduce/plan/ (AllReducePlan).
// A step that sums what it receives reduces it segment by segment through the segment scratch;
// a swap of the same range (recursive doubling) receives the whole buffer first, then sums.
#pragma once

#include <cstddef>
#include <vector>

#include "allreduce/allreduce_algorithm.h"
#include "allreduce/mesh/peer_mesh.h"
#include "allreduce/plan/schedule.h"
#include "allreduce/ring_pipeline.h"

namespace gradsync {

class PlanAlgorithm final : public AllReduceAlgorithm {
 public:
  // `algo`: rhd, rd or tree. `scratch` holds the incoming segment of a reduce (shared with the
  // other algorithms: one runs at a time).
  PlanAlgorithm(AllReduceAlgo algo, PeerMesh& mesh, size_t segment_bytes, std::vector<float>& scratch)
      : algo_(algo), mesh_(mesh), segment_bytes_(segment_bytes), scratch_(scratch) {}

  // The algorithm's steps over `data`; `add` is not used.
  Status AllReduce(void* data, size_t count, size_t elem, const Reducer& reduce, ShmGroup::Adder) override;

 private:
  // The steps of `plan` over `data` (elements of `elem` bytes), one at a time.
  Status Run(const Plan& plan, void* data, size_t elem, const Reducer& reduce);
  // Receives `bytes` from `from` and reduces them into `data` segment by segment (through the
  // segment scratch), while optionally sending `send_bytes` from `send` to `to`.
  Status ReceiveReducing(uint32_t step, int from, void* data, size_t bytes, size_t elem, const Reducer& reduce, int to,
                         const void* send, size_t send_bytes);

  const AllReduceAlgo algo_;
  PeerMesh& mesh_;
  const size_t segment_bytes_;
  std::vector<float>& scratch_;
  std::vector<std::byte> whole_;  // a whole incoming buffer (recursive doubling)
};

}  // namespace gradsync
