// RingAlgorithm: the ring's steps (RingPlan for all-reduce, reduce-scatter and the chunks'
// all-gather, or the leaders' part of HierarchicalPlan), run as one pipeline each way over the
// mesh's ring connections (allreduce/ring_pipeline.h). The bandwidth-optimal algorithm: 2(n-1)
// steps, each rank sending 2(n-1)/n of the buffer.
#pragma once

#include <span>
#include <vector>

#include "allreduce/allreduce_algorithm.h"
#include "allreduce/mesh/peer_mesh.h"
#include "allreduce/plan/schedule.h"
#include "allreduce/ring_pipeline.h"

namespace gradsync {

class RingAlgorithm final : public AllReduceAlgorithm {
 public:
  // `scratch` holds the incoming segment of a reduce (shared with PlanAlgorithm: one at a time).
  RingAlgorithm(PeerMesh& mesh, size_t segment_bytes, std::vector<float>& scratch)
      : mesh_(mesh), segment_bytes_(segment_bytes), scratch_(scratch) {}

  // The ring all-reduce (RingAllReducePlan); `add` is not used.
  Status AllReduce(void* data, size_t count, size_t elem, const Reducer& reduce, ShmGroup::Adder) override {
    return Run(CollectiveOp::kAllReduce, data, elem, reduce, RingAllReducePlan(mesh_.rank(), mesh_.size(), count));
  }
  // Runs every step of `plan` over `data` (elements of `elem` bytes); a failure breaks the mesh.
  Status Run(CollectiveOp op, void* data, size_t elem, const Reducer& reduce, std::span<const PlanStep> plan) {
    return RingPipeline(mesh_, op, data, elem, reduce, plan, segment_bytes_, scratch_).Run();
  }

 private:
  PeerMesh& mesh_;
  const size_t segment_bytes_;
  std::vector<float>& scratch_;
};

}  // namespace gradsync
