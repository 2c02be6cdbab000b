// StepExchange: one step with any two peers, alive while PeerMesh::Exchange runs. It sends a
// buffer to one peer while it receives from another, each side after its step header (checked
// on arrival); the received bytes come segment by segment, each handed to the caller as it
// lands. A swap with one peer goes in lockstep (CollectiveOptions::exchange_segment_bytes): both
// directions in segments, the next one sent only once the peer's previous one has arrived. It
// drives the mesh's loop until both sides are done, and breaks the mesh on a failure or when no
// progress comes within the timeout.
#pragma once

#include <utility>  // before Boost.Asio 1.74, whose awaitable.hpp forgets it under C++20

#include <cstddef>
#include <functional>

#include "allreduce/collective.h"
#include "allreduce/mesh/step_header.h"
#include "allreduce/ring_security.h"

namespace gradsync {

class PeerMesh;

class StepExchange {
 public:
  // on_segment(offset, length) runs as each received segment lands.
  using OnSegment = std::function<void(size_t, size_t)>;
  // What the caller asks for (PeerMesh::Exchange): -1 skips a side.
  struct Request {
    CollectiveOp op;
    uint32_t step;
    int to;
    const void* send;
    size_t send_bytes;
    int from;
    void* recv;
    size_t recv_bytes;
    const OnSegment* on_segment;
    bool recv_reuse;  // every segment lands at `recv` itself
  };

  StepExchange(PeerMesh& mesh, const CollectiveOptions& options, const Request& request);
  Status Run();

 private:
  // How the step is cut: a swap with one peer goes in lockstep, segments of lock_seg both ways;
  // reads are no larger than the lockstep segment (else both ranks could wait for a whole read
  // segment that the other holds back), nor than segment_bytes (a caller's reduce scratch).
  struct Segments {
    size_t lock_seg = 0;
    bool lockstep = false;
    size_t read_seg = 0;
  };
  // How far each side has come.
  struct Progress {
    StepHeader out{}, in{};
    bool wdone = false, rdone = false;
    size_t sent = 0, received = 0;
    bool write_held = false;  // the next lockstep segment waits for the peer's
    RingStream* in_stream = nullptr;
    Status failure;
  };

  bool may_write() const { return p_.rdone || p_.received + seg_.lock_seg >= p_.sent; }
  char* segment_at(size_t off) const { return static_cast<char*>(req_.recv) + (req_.recv_reuse ? 0 : off); }
  void Failed(int peer, const boost::system::error_code& e);
  void StartWrite();
  void WriteLockstep();
  void StartRead();
  void ReadFrom(size_t off, size_t have);

  PeerMesh& mesh_;
  const Request req_;
  const Segments seg_;
  Progress p_;
};

}  // namespace gradsync
