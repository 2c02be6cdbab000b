// PeerMesh: the CPU collective's transport. Every rank of a job holds TCP connections to its two
// ring neighbours and to the ranks its algorithms pair it with (MeshPeers, and the hierarchy's
// neighbouring leaders), each one plain, authenticated or encrypted (allreduce/ring_security.h:
// the handshake and RingStream); every exchange starts with a step header that the receiver
// checks. The algorithms (allreduce/ring_pipeline.cc, plan_runner.cc, tcp_ring.cc) move their
// bytes only through it.
//
// Set-up is two-phase so that ports can be ephemeral: Listen() binds and tells the port to
// advertise (through the scheduler, or directly in tests); Connect() wires the connections once
// every rank's address is known. One io_context, driven by the calling thread: no background
// threads. A failure breaks the mesh: every later operation fails with the first failure.
//
// PeerMesh is the face its parts share: the topology (who is where, MeshTopology), the I/O loop
// (MeshLoop), the connections (MeshLinks), their wiring at Connect (MeshConnector, with the
// handshake), the step headers (StepHeaders) and one exchange with two peers (StepExchange). It
// owns the mesh's failure (the first one breaks it for good) and its byte counts.
//
// Why shared memory is not a PeerMesh: the ranks of a host do not exchange byte streams there,
// they sum in place in one region (allreduce/shm/shm_group.h); a stream over shared memory would
// copy every byte once more and lose the in-place sum that makes it fast.
#pragma once

#include <utility>  // before Boost.Asio 1.74, whose awaitable.hpp forgets it under C++20

#include <boost/asio.hpp>
#include <string>
#include <vector>

#include "allreduce/collective.h"
#include "allreduce/mesh/connector.h"
#include "allreduce/mesh/exchange.h"
#include "allreduce/mesh/links.h"
#include "allreduce/mesh/loop.h"
#include "allreduce/mesh/step_header.h"
#include "allreduce/mesh/topology.h"
#include "allreduce/ring_security.h"

namespace gradsync {

class PeerMesh {
 public:
  using Clock = MeshLoop::Clock;
  // on_segment(offset, length) runs as each received segment lands.
  using OnSegment = StepExchange::OnSegment;

  PeerMesh(const CollectiveOptions& options, const RingSecurity& security);
  ~PeerMesh();

  Status Listen(const std::string& bind_host) { return connector_.Listen(bind_host); }
  uint16_t port() const { return connector_.port(); }
  // peers[i] = "host:port" of rank i. Connects to the ring neighbours and to the ranks of
  // MeshPeers (and the neighbouring hosts' leaders); waits at most timeout_s for them.
  Status Connect(int rank, const std::vector<std::string>& peers, double timeout_s);

  bool encrypted() const { return security_.encrypt; }
  int rank() const { return topology_.rank(); }
  int size() const { return topology_.size(); }
  const MeshTopology& topology() const { return topology_; }
  MeshLinks& links() { return links_; }
  StepHeaders& headers() { return headers_; }
  MeshLoop& loop() { return loop_; }

  // A new operation: kFailedPrecondition on a broken mesh or before Connect.
  Status Begin();

  // One step with any two peers (StepExchange): sends `send_bytes` from `send` to `to` while
  // receiving `recv_bytes` from `from` into `recv` (-1 skips a side: no header either; a side of
  // 0 bytes still exchanges its header). With recv_reuse every segment lands at `recv` itself (a
  // segment-sized buffer that stays in cache) and on_segment consumes it before the next read.
  Status Exchange(CollectiveOp op, uint32_t step, int to, const void* send, size_t send_bytes, int from, void* recv,
                  size_t recv_bytes, const OnSegment& on_segment, bool recv_reuse = false);

  // A failed read or write: kDataLoss for an encrypted frame that fails authentication,
  // kUnavailable for a lost peer.
  Status PeerError(int peer, const boost::system::error_code& e, const std::string& where) const;
  // Breaks the mesh with `s` (or Cancel's reason), closes every connection, returns the status.
  Status Fail(Status s);
  // Closes every connection at once (tests use it to play a rank that dies).
  void Abort();
  // From any thread: the operation in progress, and every later one, fails at once with
  // kAborted and `why`. Returns false if it was cancelled already.
  bool Cancel(const std::string& why) { return loop_.Cancel(why); }

  // Plaintext bytes moved (the pipeline's and the exchanges' reads and writes).
  void CountSent(size_t n) { bytes_sent_ += n; }
  void CountReceived(size_t n) { bytes_received_ += n; }
  uint64_t moved() const { return bytes_sent_ + bytes_received_; }
  // Wire bytes: with encryption, frame headers and tags included.
  uint64_t bytes_sent() const { return bytes_sent_ + links_.overhead_sent(); }
  uint64_t bytes_received() const { return bytes_received_ + links_.overhead_received(); }

 private:
  const CollectiveOptions options_;
  const RingSecurity security_;
  MeshLoop loop_;
  MeshTopology topology_;
  MeshLinks links_;
  StepHeaders headers_;
  MeshConnector connector_;
  Status broken_;
  uint64_t bytes_sent_ = 0;
  uint64_t bytes_received_ = 0;
};

}  // namespace gradsync
