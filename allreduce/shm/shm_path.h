// SharedMemoryPath: the collective's use of this host's shared memory (CollectiveOptions::shm).
// It sets the host's ShmGroup up after Connect (the leader creates the region, the others
// attach, every rank learns every rank's verdict, so that all agree whether it is used, and if
// not why), owns it, and counts what went through it. The algorithms that run through it are
// their own classes below: ShmAllReduce and HierarchicalAllReduce.
#pragma once

#include <memory>
#include <string>

#include "allreduce/allreduce_algorithm.h"
#include "allreduce/collective.h"
#include "allreduce/mesh/peer_mesh.h"
#include "allreduce/ring_algorithm.h"
#include "allreduce/shm/shm_group.h"

namespace gradsync {

class SharedMemoryPath {
 public:
  SharedMemoryPath(PeerMesh& mesh, const CollectiveOptions& options) : mesh_(mesh), options_(options) {}

  // Not used, and why (set before SetUp, which replaces it).
  void Off(std::string why);
  // Every host's leader creates its group's region; the ranks learn every leader's (name,
  // nonce) over `ring` (its AllGather), the others attach, and every rank learns every rank's
  // verdict: shared memory is used only if every host that has several ranks could set it up.
  Status SetUp(Collective& ring);
  bool ready() const { return ready_; }
  const std::string& off_reason() const { return why_not_; }

  // This host's group, once ready() (the algorithms below run through it).
  ShmGroup& group() { return *group_; }

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

// ShmAllReduce: `shm`, every rank on one host sums in the region (kFailedPrecondition when the
// ranks span hosts).
class ShmAllReduce final : public AllReduceAlgorithm {
 public:
  ShmAllReduce(SharedMemoryPath& path, PeerMesh& mesh, double timeout_s) : path_(path), mesh_(mesh), timeout_s_(timeout_s) {}
  Status AllReduce(void* data, size_t count, size_t elem, const Reducer& reduce, ShmGroup::Adder add) override;

 private:
  SharedMemoryPath& path_;
  PeerMesh& mesh_;
  const double timeout_s_;
};

// HierarchicalAllReduce: `hier` across hosts (HierarchicalPlan): each host's ranks reduce into
// their leader through the region, the leaders all-reduce around their own ring over TCP
// (`ring`'s pipeline), and each leader broadcasts the result back.
class HierarchicalAllReduce final : public AllReduceAlgorithm {
 public:
  HierarchicalAllReduce(SharedMemoryPath& path, RingAlgorithm& ring, PeerMesh& mesh, double timeout_s)
      : path_(path), ring_(ring), mesh_(mesh), timeout_s_(timeout_s) {}
  Status AllReduce(void* data, size_t count, size_t elem, const Reducer& reduce, ShmGroup::Adder add) override;

 private:
  SharedMemoryPath& path_;
  RingAlgorithm& ring_;
  PeerMesh& mesh_;
  const double timeout_s_;
};

}  // namespace gradsync
