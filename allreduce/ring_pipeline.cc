#include "allreduce/ring_pipeline.h"

#include "common/base/clock.h"

namespace gradsync {
namespace asio = boost::asio;

RingPipeline::RingPipeline(PeerMesh& mesh, CollectiveOp op, void* data, size_t elem, const Reducer& reduce,
                           std::span<const PlanStep> plan, size_t segment_bytes, std::vector<float>& scratch)
    : mesh_(mesh),
      work_{op, static_cast<char*>(data), elem, reduce, plan, static_cast<int>(plan.size())},
      writer_{plan.empty() ? -1 : plan.front().to, plan.empty() ? nullptr : &mesh.links().SendStream(plan.front().to), {}, {}, false, -1,
              std::vector<size_t>(plan.size(), 0), std::vector<bool>(plan.size(), false)},
      reader_{plan.empty() ? -1 : plan.front().from, plan.empty() ? nullptr : &mesh.links().RecvStream(plan.front().from),
              std::max(elem, segment_bytes / elem * elem), scratch} {
  reader_.scratch.resize(std::max<size_t>(1, reader_.seg / sizeof(float) + 1));
}

void RingPipeline::PeerFailed(int peer, const boost::system::error_code& e, int t) {
  if (failure_.ok()) failure_ = mesh_.PeerError(peer, e, mesh_.headers().Where(work_.op, at(t).tag));
}

void RingPipeline::AdvanceWriterMark() {
  while (writer_.done_through + 1 < work_.steps && writer_.step_queued[writer_.done_through + 1] &&
         writer_.pieces_left[writer_.done_through + 1] == 0) {
    ++writer_.done_through;
  }
  if (reader_.waiting && writer_.done_through >= reader_.waits_for) {
    reader_.waiting = false;
    ReadStep();
  }
}

void RingPipeline::Pump() {
  if (writer_.writing || writer_.queue.empty() || !failure_.ok()) return;
  writer_.writing = true;
  Piece p = writer_.queue.front();
  writer_.to_right->AsyncWrite({asio::buffer(p.data, p.len)}, [this, p](const boost::system::error_code& e, size_t w) {
    writer_.writing = false;
    if (e) return PeerFailed(writer_.right, e, p.step);
    mesh_.CountSent(w);
    writer_.queue.pop_front();
    --writer_.pieces_left[p.step];
    AdvanceWriterMark();
    Pump();
  });
}

void RingPipeline::Enqueue(const void* ptr, size_t len, int t) {
  writer_.queue.push_back({ptr, len, t});
  ++writer_.pieces_left[t];
  Pump();
}

void RingPipeline::StartStepSend(int t) {
  writer_.headers.push_back(mesh_.headers().Header(work_.op, at(t).tag, bytes_of(at(t).send)));
  Enqueue(&writer_.headers.back(), sizeof(StepHeader), t);
}

void RingPipeline::ReadSegment(size_t off) {
  const int t = reader_.reading;
  const ElementRange& c = at(t).recv;
  const size_t total = bytes_of(c);
  if (off == total) {
    if (t + 1 < work_.steps) writer_.step_queued[t + 1] = true;
    reader_.reading = t + 1;
    if (reader_.reading == work_.steps) reader_.all_read = true;
    AdvanceWriterMark();
    if (!reader_.all_read) ReadStep();
    return;
  }
  const size_t len = std::min(reader_.seg, total - off);
  char* dst = work_.d + c.begin * work_.elem + off;
  const bool reducing = at(t).reduce;
  void* target = reducing ? static_cast<void*>(reader_.scratch.data()) : static_cast<void*>(dst);
  reader_.from_left->AsyncRead(asio::buffer(target, len), [this, t, off, len, dst, reducing](const boost::system::error_code& e, size_t got) {
    if (e) return PeerFailed(reader_.left, e, t);
    mesh_.CountReceived(got);
    if (reducing) work_.reduce(dst, reader_.scratch.data(), len / work_.elem);
    if (t + 1 < work_.steps) Enqueue(dst, len, t + 1);  // forward it while it is hot
    ReadSegment(off + len);
  });
}

void RingPipeline::ReadStep() {
  const int t = reader_.reading;
  // The writer must have sent every piece of the steps before t - 1 ... t - 1 is still allowed
  // to be in flight only for chunks this step does not touch (see the header).
  if (writer_.done_through < t - 1) {
    reader_.waits_for = t - 1;
    reader_.waiting = true;
    return;
  }
  reader_.from_left->AsyncRead(asio::buffer(&reader_.in, sizeof(reader_.in)), [this, t](const boost::system::error_code& e, size_t got) {
    if (e) return PeerFailed(reader_.left, e, t);
    mesh_.CountReceived(got);
    if (Status s = mesh_.headers().Check(reader_.in, work_.op, at(t).tag, bytes_of(at(t).recv), reader_.left); !s.ok()) {
      failure_ = s;
      return;
    }
    if (t + 1 < work_.steps) StartStepSend(t + 1);
    ReadSegment(0);
  });
}

Status RingPipeline::Run() {
  if (work_.steps == 0) return OkStatus();
  // The first step sends this rank's starting chunk, whole; every later step sends what the step
  // before received (RingPlan), queued as it arrives.
  const ElementRange& first = work_.plan.front().send;
  StartStepSend(0);
  if (bytes_of(first) > 0) Enqueue(work_.d + first.begin * work_.elem, bytes_of(first), 0);
  writer_.step_queued[0] = true;
  ReadStep();
  auto deadline = mesh_.loop().Deadline();
  mesh_.loop().Restart();
  while (failure_.ok() && !Done()) {
    const uint64_t before = mesh_.moved();
    if (mesh_.loop().RunOne(deadline) == 0 && failure_.ok()) {
      failure_ = DeadlineExceededError("no progress for " + SecondsText(mesh_.loop().timeout_s()) + " s during " +
                                       mesh_.headers().Where(work_.op, at(std::min(reader_.reading, work_.steps - 1)).tag) +
                                       (reader_.all_read ? " (sending to rank " + std::to_string(writer_.right) + ")"
                                                  : " (waiting for rank " + std::to_string(reader_.left) + ")"));
    }
    if (mesh_.moved() != before) deadline = mesh_.loop().Deadline();  // a deadline on progress
  }
  if (!failure_.ok()) return mesh_.Fail(failure_);
  return OkStatus();
}

}  // namespace gradsync
