// SharedMemoryPath: the collective's use of this host's shared memory (CollectiveOptions::shm).
// It sets the host's ShmGroup up after Connect (the leader creates the region, the others
// attach, every rank learns every rank's verdict, so that all agree whether it is used, and if
// not why); and it runs the algorithms through it: `shm` (every rank on one host sums in the
// region) and `hier` (each host's ranks reduce into their leader through the region, the leaders
// all-reduce around their own ring over TCP, each leader broadcasts the result back).
#pragma once

#include <memory>
#include <string>

#include "allreduce/collective.h"
#include "allreduce/mesh/peer_mesh.h"
#include "allreduce/ring_algorithm.h"
#include "allreduce/shm_group.h"

namespace gradsync {

class SharedMemoryPath {
 public:
  using Reducer = RingPipeline::Reducer;

  SharedMemoryPath(PeerMesh& mesh, const CollectiveOptions& options) : mesh_(mesh), options_(options) {}

  // Not used, and why (set before SetUp, which replaces it).
  void Off(std::string why);
  // Every host's leader creates its group's region; the ranks learn every leader's (name,
  // nonce) over `ring` (its AllGather), the others attach, and every rank learns every rank's
  // verdict: shared memory is used only if every host that has several ranks could set it up.
  Status SetUp(Collective& ring);
  bool ready() const { return ready_; }
  const std::string& off_reason() const { return why_not_; }

  // `shm`: every rank on this host (kFailedPrecondition when they span hosts). `add`
  // (optional): out = a + b in one pass, for the first addition. A failure breaks the mesh.
  Status AllReduce(void* data, size_t count, size_t elem, const Reducer& reduce, ShmGroup::Adder add);
  // `hier` (HierarchicalPlan), the leaders' steps over `ring`.
  Status Hierarchical(void* data, size_t count, size_t elem, const Reducer& reduce, ShmGroup::Adder add,
                      RingAlgorithm& ring);

  // What went through the region, counted as the wire would.
  uint64_t bytes_sent() const { return group_ ? group_->bytes_sent() : 0; }
  uint64_t bytes_received() const { return group_ ? group_->bytes_received() : 0; }
  void Cancel() {
    if (group_) group_->Cancel();
  }

 private:
  PeerMesh& mesh_;
  const CollectiveOptions& options_;
  std::unique_ptr<ShmGroup> group_;  // this host's group (null: alone on the host, or off)
  bool ready_ = false;               // every host with several ranks has its group
  std::string why_not_;
};

}  // namespace gradsync
