// The ring's steps (RingPlan, or the leaders' part of HierarchicalPlan) run as one stream in
// each direction over a PeerMesh. Step t receives range recv(t) and sends send(t), and
// send(t + 1) == recv(t): so each received segment, once reduced (reduce-scatter) or stored
// (all-gather), is queued at once as the next step's outgoing segment, while it is still in
// cache. The writer may lag the reader by at most one step (the reader waits before a new step
// until the writer has sent everything of the steps before), which keeps a chunk from being
// overwritten while it is still queued for sending. A reader that has to wait is resumed by the
// write that lets it go on: no polling.
#pragma once

#include <deque>
#include <functional>
#include <span>
#include <vector>

#include "allreduce/mesh/peer_mesh.h"
#include "allreduce/plan/schedule.h"

namespace gradsync {

class RingPipeline {
 public:
  // reduce(acc, x, k) folds k received elements into acc.
  using Reducer = std::function<void(void*, const void*, size_t)>;

  // `scratch` holds a reduce-scatter's incoming segment; `segment_bytes` cuts the chunks.
  RingPipeline(PeerMesh& mesh, CollectiveOp op, void* data, size_t elem, const Reducer& reduce,
               std::span<const PlanStep> plan, size_t segment_bytes, std::vector<float>& scratch);
  // Runs every step; a failure breaks the mesh (PeerMesh::Fail).
  Status Run();

 private:
  struct Piece {
    const void* data;
    size_t len;
    int step;
  };
  const PlanStep& at(int t) const { return plan_[static_cast<size_t>(t)]; }
  size_t bytes_of(const ElementRange& c) const { return c.size() * elem_; }
  void PeerFailed(int peer, const boost::system::error_code& e, int t);
  void AdvanceWriterMark();
  void Pump();
  void Enqueue(const void* ptr, size_t len, int t);
  void StartStepSend(int t);
  void ReadStep();
  void ReadSegment(size_t off);
  bool Done() const { return all_read_ && writer_done_through_ == steps_ - 1; }

  PeerMesh& mesh_;
  const CollectiveOp op_;
  char* const d_;
  const size_t elem_;
  const Reducer& reduce_;
  const std::span<const PlanStep> plan_;
  const int steps_;
  const size_t seg_;  // whole elements
  std::vector<float>& scratch_;
  const int left_, right_;
  RingStream* const to_right_;  // null when there are no steps
  RingStream* const from_left_;

  std::deque<StepHeader> headers_;
  std::deque<Piece> queue_;
  bool writing_ = false;
  int writer_done_through_ = -1;  // every piece of steps <= this has been written
  std::vector<size_t> pieces_left_;
  std::vector<bool> step_queued_;  // all pieces of the step queued
  Status failure_;
  bool reader_waiting_ = false;  // ReadStep waits for the writer
  int reader_waits_for_ = -1;
  StepHeader in_{};
  int reading_ = 0;
  bool all_read_ = false;
};

}  // namespace gradsync
