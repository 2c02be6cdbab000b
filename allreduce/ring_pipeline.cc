#include "allreduce/ring_pipeline.h"

#include "common/base/clock.h"

namespace gradsync {
namespace asio = boost::asio;

RingPipeline::RingPipeline(PeerMesh& mesh, CollectiveOp op, void* data, size_t elem, const Reducer& reduce,
                           std::span<const PlanStep> plan, size_t segment_bytes, std::vector<float>& scratch)
    : mesh_(mesh),
      op_(op),
      d_(static_cast<char*>(data)),
      elem_(elem),
      reduce_(reduce),
      plan_(plan),
      steps_(static_cast<int>(plan.size())),
      seg_(std::max(elem, segment_bytes / elem * elem)),
      scratch_(scratch),
      left_(plan.empty() ? -1 : plan.front().from),
      right_(plan.empty() ? -1 : plan.front().to),
      to_right_(plan.empty() ? nullptr : &mesh.SendStream(right_)),
      from_left_(plan.empty() ? nullptr : &mesh.RecvStream(left_)),
      pieces_left_(plan.size(), 0),
      step_queued_(plan.size(), false) {
  scratch_.resize(std::max<size_t>(1, seg_ / sizeof(float) + 1));
}

void RingPipeline::PeerFailed(int peer, const boost::system::error_code& e, int t) {
  if (failure_.ok()) failure_ = mesh_.PeerError(peer, e, mesh_.Where(op_, at(t).tag));
}

void RingPipeline::AdvanceWriterMark() {
  while (writer_done_through_ + 1 < steps_ && step_queued_[writer_done_through_ + 1] &&
         pieces_left_[writer_done_through_ + 1] == 0) {
    ++writer_done_through_;
  }
  if (reader_waiting_ && writer_done_through_ >= reader_waits_for_) {
    reader_waiting_ = false;
    ReadStep();
  }
}

void RingPipeline::Pump() {
  if (writing_ || queue_.empty() || !failure_.ok()) return;
  writing_ = true;
  Piece p = queue_.front();
  to_right_->AsyncWrite({asio::buffer(p.data, p.len)}, [this, p](const boost::system::error_code& e, size_t w) {
    writing_ = false;
    if (e) return PeerFailed(right_, e, p.step);
    mesh_.CountSent(w);
    queue_.pop_front();
    --pieces_left_[p.step];
    AdvanceWriterMark();
    Pump();
  });
}

void RingPipeline::Enqueue(const void* ptr, size_t len, int t) {
  queue_.push_back({ptr, len, t});
  ++pieces_left_[t];
  Pump();
}

void RingPipeline::StartStepSend(int t) {
  headers_.push_back(mesh_.Header(op_, at(t).tag, bytes_of(at(t).send)));
  Enqueue(&headers_.back(), sizeof(StepHeader), t);
}

void RingPipeline::ReadSegment(size_t off) {
  const int t = reading_;
  const ElementRange& c = at(t).recv;
  const size_t total = bytes_of(c);
  if (off == total) {
    if (t + 1 < steps_) step_queued_[t + 1] = true;
    reading_ = t + 1;
    if (reading_ == steps_) all_read_ = true;
    AdvanceWriterMark();
    if (!all_read_) ReadStep();
    return;
  }
  const size_t len = std::min(seg_, total - off);
  char* dst = d_ + c.begin * elem_ + off;
  const bool reducing = at(t).reduce;
  void* target = reducing ? static_cast<void*>(scratch_.data()) : static_cast<void*>(dst);
  from_left_->AsyncRead(asio::buffer(target, len), [this, t, off, len, dst, reducing](const boost::system::error_code& e, size_t got) {
    if (e) return PeerFailed(left_, e, t);
    mesh_.CountReceived(got);
    if (reducing) reduce_(dst, scratch_.data(), len / elem_);
    if (t + 1 < steps_) Enqueue(dst, len, t + 1);  // forward it while it is hot
    ReadSegment(off + len);
  });
}

void RingPipeline::ReadStep() {
  const int t = reading_;
  // The writer must have sent every piece of the steps before t - 1 ... t - 1 is still allowed
  // to be in flight only for chunks this step does not touch (see the header).
  if (writer_done_through_ < t - 1) {
    reader_waits_for_ = t - 1;
    reader_waiting_ = true;
    return;
  }
  from_left_->AsyncRead(asio::buffer(&in_, sizeof(in_)), [this, t](const boost::system::error_code& e, size_t got) {
    if (e) return PeerFailed(left_, e, t);
    mesh_.CountReceived(got);
    if (Status s = mesh_.CheckHeader(in_, op_, at(t).tag, bytes_of(at(t).recv), left_); !s.ok()) {
      failure_ = s;
      return;
    }
    if (t + 1 < steps_) StartStepSend(t + 1);
    ReadSegment(0);
  });
}

Status RingPipeline::Run() {
  if (steps_ == 0) return OkStatus();
  // The first step sends this rank's starting chunk, whole; every later step sends what the step
  // before received (RingPlan), queued as it arrives.
  const ElementRange& first = plan_.front().send;
  StartStepSend(0);
  if (bytes_of(first) > 0) Enqueue(d_ + first.begin * elem_, bytes_of(first), 0);
  step_queued_[0] = true;
  ReadStep();
  auto deadline = mesh_.Deadline();
  mesh_.Restart();
  while (failure_.ok() && !Done()) {
    const uint64_t before = mesh_.moved();
    if (mesh_.RunOne(deadline) == 0 && failure_.ok()) {
      failure_ = DeadlineExceededError("no progress for " + SecondsText(mesh_.timeout_s()) + " s during " +
                                       mesh_.Where(op_, at(std::min(reading_, steps_ - 1)).tag) +
                                       (all_read_ ? " (sending to rank " + std::to_string(right_) + ")"
                                                  : " (waiting for rank " + std::to_string(left_) + ")"));
    }
    if (mesh_.moved() != before) deadline = mesh_.Deadline();  // a deadline on progress
  }
  if (!failure_.ok()) return mesh_.Fail(failure_);
  return OkStatus();
}

}  // namespace gradsync
