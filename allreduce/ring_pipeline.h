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
  const PlanStep& at(int t) const { return work_.plan[static_cast<size_t>(t)]; }
  size_t bytes_of(const ElementRange& c) const { return c.size() * work_.elem; }
  void PeerFailed(int peer, const boost::system::error_code& e, int t);
  void AdvanceWriterMark();
  void Pump();
  void Enqueue(const void* ptr, size_t len, int t);
  void StartStepSend(int t);
  void ReadStep();
  void ReadSegment(size_t off);
  bool Done() const { return reader_.all_read && writer_.done_through == work_.steps - 1; }

  // The operation: its buffer, element size, reducer and steps (fixed while it runs).
  struct Work {
    const CollectiveOp op;
    char* const d;
    const size_t elem;
    const Reducer& reduce;
    const std::span<const PlanStep> plan;
    const int steps;
  };
  // The outgoing stream to the right: the pieces queued for it (each step's header, then its
  // segments as they arrive) and how far every step's pieces have been written.
  struct Sender {
    const int right;
    RingStream* const to_right;  // null when there are no steps
    std::deque<StepHeader> headers;
    std::deque<Piece> queue;
    bool writing = false;
    int done_through = -1;  // every piece of steps <= this has been written
    std::vector<size_t> pieces_left;
    std::vector<bool> step_queued;  // all pieces of the step queued
  };
  // The incoming stream from the left: the step being read, its header, the segment scratch a
  // reduce-scatter reads into, and whether it waits for the writer.
  struct Receiver {
    const int left;
    RingStream* const from_left;
    const size_t seg;  // whole elements
    std::vector<float>& scratch;
    StepHeader in{};
    int reading = 0;
    bool all_read = false;
    bool waiting = false;  // ReadStep waits for the writer
    int waits_for = -1;
  };

  PeerMesh& mesh_;
  const Work work_;
  Sender writer_;
  Receiver reader_;
  Status failure_;
};

}  // namespace gradsync
