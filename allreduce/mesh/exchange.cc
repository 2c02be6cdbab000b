#include "allreduce/mesh/exchange.h"

#include "allreduce/mesh/peer_mesh.h"
#include "common/base/clock.h"

namespace gradsync {
namespace asio = boost::asio;

namespace {
// A valid address for empty buffers (a zero-length side is not a skipped side).
std::byte empty_buffer[1];

size_t LockSegment(const CollectiveOptions& options, const StepExchange::Request& r) {
  const size_t lock_seg = options.exchange_segment_bytes;
  return lock_seg > 0 && r.to >= 0 && r.from >= 0 && r.to == r.from && r.send_bytes > lock_seg ? lock_seg : 0;
}
}  // namespace

StepExchange::StepExchange(PeerMesh& mesh, const CollectiveOptions& options, const Request& request)
    : mesh_(mesh),
      req_(request),
      seg_{options.exchange_segment_bytes, LockSegment(options, request) > 0,
           LockSegment(options, request) > 0 ? std::min(options.exchange_segment_bytes, options.segment_bytes) : options.segment_bytes} {
  p_.out = mesh.headers().Header(request.op, request.step, request.send_bytes);
  p_.wdone = request.to < 0;
  p_.rdone = request.from < 0;
}

void StepExchange::Failed(int peer, const boost::system::error_code& e) {
  if (p_.failure.ok()) p_.failure = mesh_.PeerError(peer, e, mesh_.headers().Where(req_.op, req_.step));
}

void StepExchange::StartWrite() {
  if (seg_.lockstep) return WriteLockstep();
  mesh_.links().SendStream(req_.to).AsyncWrite(
      {asio::buffer(&p_.out, sizeof(p_.out)), asio::buffer(req_.send ? req_.send : empty_buffer, req_.send_bytes)},
      [this](const boost::system::error_code& e, size_t n) {
        if (e) return Failed(req_.to, e);
        mesh_.CountSent(n);
        p_.wdone = true;
      });
}

void StepExchange::WriteLockstep() {
  p_.write_held = false;
  const size_t len = std::min(seg_.lock_seg, req_.send_bytes - p_.sent);
  std::vector<asio::const_buffer> buffers;
  if (p_.sent == 0) buffers.push_back(asio::buffer(&p_.out, sizeof(p_.out)));
  buffers.push_back(asio::buffer(static_cast<const char*>(req_.send) + p_.sent, len));
  mesh_.links().SendStream(req_.to).AsyncWrite(std::move(buffers), [this, len](const boost::system::error_code& e, size_t n) {
    if (e) return Failed(req_.to, e);
    mesh_.CountSent(n);
    p_.sent += len;
    if (p_.sent == req_.send_bytes) {
      p_.wdone = true;
    } else if (may_write()) {
      WriteLockstep();
    } else {
      p_.write_held = true;
    }
  });
}

// The segment at `off`, whose first `have` bytes are already in place.
void StepExchange::ReadFrom(size_t off, size_t have) {
  if (off == req_.recv_bytes) {
    p_.rdone = true;
    return;
  }
  const size_t len = std::min(seg_.read_seg, req_.recv_bytes - off);
  p_.in_stream->AsyncRead(asio::buffer(segment_at(off) + have, len - have), [this, off, len](const boost::system::error_code& e, size_t n) {
    if (e) return Failed(req_.from, e);
    mesh_.CountReceived(n);
    if (*req_.on_segment) (*req_.on_segment)(off, len);
    p_.received = off + len;
    ReadFrom(off + len, 0);
    if (p_.write_held && may_write()) WriteLockstep();
  });
}

// The header, and with it whatever of the first segment has arrived: a small step's data comes
// in the same receive call.
void StepExchange::StartRead() {
  p_.in_stream = &mesh_.links().RecvStream(req_.from);
  p_.in_stream->AsyncReadHeader(asio::buffer(&p_.in, sizeof(p_.in)), asio::buffer(segment_at(0), std::min(seg_.read_seg, req_.recv_bytes)),
                                [this](const boost::system::error_code& e, size_t n) {
    if (e) return Failed(req_.from, e);
    mesh_.CountReceived(n);
    if (Status s = mesh_.headers().Check(p_.in, req_.op, req_.step, req_.recv_bytes, req_.from); !s.ok()) {
      p_.failure = s;
      return;
    }
    ReadFrom(0, n - sizeof(p_.in));
    if (p_.write_held && may_write()) WriteLockstep();  // an empty receive is done at its header
  });
}

Status StepExchange::Run() {
  if (req_.to >= 0) StartWrite();
  if (req_.from >= 0) StartRead();
  MeshLoop& loop = mesh_.loop();
  const auto deadline = loop.Deadline();
  loop.Restart();
  while (!(p_.wdone && p_.rdone) && p_.failure.ok()) {
    if (loop.RunOne(deadline) == 0 && !(p_.wdone && p_.rdone) && p_.failure.ok()) {
      p_.failure = DeadlineExceededError(std::string("no progress for ") + SecondsText(loop.timeout_s()) + " s during " +
                                         mesh_.headers().Where(req_.op, req_.step) +
                                         (p_.rdone ? "" : " (waiting for rank " + std::to_string(req_.from) + ")") +
                                         (p_.wdone ? "" : " (sending to rank " + std::to_string(req_.to) + ")"));
    }
  }
  if (!p_.failure.ok()) return mesh_.Fail(p_.failure);
  return OkStatus();
}

}  // namespace gradsync
