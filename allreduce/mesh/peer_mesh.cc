#include "allreduce/mesh/peer_mesh.h"

namespace gradsync {
namespace asio = boost::asio;

PeerMesh::PeerMesh(const CollectiveOptions& options, const RingSecurity& security)
    : options_(options),
      security_(security),
      loop_(options_.mesh_wait, options_.timeout_s),
      links_(loop_.io()),
      headers_(topology_),
      connector_(options_.socket_buffer_bytes, security_, loop_, topology_, links_) {}

PeerMesh::~PeerMesh() { Abort(); }

Status PeerMesh::Connect(int rank, const std::vector<std::string>& peers, double timeout_s) {
  RETURN_IF_ERROR(topology_.Set(rank, peers));
  if (topology_.size() == 1) return OkStatus();
  RETURN_IF_ERROR(connector_.Start(timeout_s));
  if (Status s = connector_.Wait(timeout_s); !s.ok()) return Fail(s);
  return OkStatus();
}

void PeerMesh::Abort() {
  loop_.Stop();
  connector_.Close();
  links_.CloseAll();
  // Let handlers still queued see operation_aborted while their captures are alive.
  loop_.Drain();
}

Status PeerMesh::Fail(Status s) {
  if (loop_.cancelled()) s = AbortedError(loop_.cancel_reason());
  if (broken_.ok()) broken_ = s;
  Abort();
  return s;
}

Status PeerMesh::PeerError(int peer, const boost::system::error_code& e, const std::string& where) const {
  const std::string who = "rank " + std::to_string(peer) + " (" + topology_.address(peer) + ") ";
  if (e.category() == RingFrameCategory()) {
    // Not a lost peer: bytes that someone changed, replayed or reordered on the way.
    return DataLossError(who + e.message() + " during " + where + "; the collective is abandoned");
  }
  return UnavailableError(who + (e == asio::error::eof ? std::string("closed the connection") : e.message()) + " during " +
                          where);
}

Status PeerMesh::Begin() {
  if (!broken_.ok()) return FailedPreconditionError("the ring is broken by an earlier failure: " + broken_.message());
  if (topology_.size() == 0) return FailedPreconditionError("Connect() first");
  headers_.Next();
  return OkStatus();
}

Status PeerMesh::Exchange(CollectiveOp op, uint32_t step, int to, const void* send, size_t send_bytes, int from, void* recv,
                          size_t recv_bytes, const OnSegment& on_segment, bool recv_reuse) {
  return StepExchange(*this, options_, {op, step, to, send, send_bytes, from, recv, recv_bytes, &on_segment, recv_reuse}).Run();
}

}  // namespace gradsync
