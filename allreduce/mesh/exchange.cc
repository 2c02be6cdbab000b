// PeerMesh's steps: the step header, one exchange with any two peers (lockstep swaps), the I/O
// loop with its spin, and failure, abort and cancellation.

#include "allreduce/mesh/peer_mesh.h"
#include "common/base/clock.h"
#include "common/base/wait_policy.h"

namespace gradsync {
namespace asio = boost::asio;
using tcp = asio::ip::tcp;

namespace {
constexpr uint32_t kStepMagic = 0x47535247;  // "GRSG"
// A valid address for empty buffers (a zero-length side is not a skipped side).
std::byte empty_buffer[1];

const char* OpName(uint32_t op) {
  switch (op) {
    case 1: return "allreduce";
    case 2: return "broadcast";
    case 3: return "allgather";
    case 4: return "barrier";
    case 5: return "reduce-scatter";
    case 6: return "allgather (chunks)";
    default: return "unknown op";
  }
}
}  // namespace

PeerMesh::PeerMesh(const CollectiveOptions& options, const RingSecurity& security)
    : options_(options), security_(security), acceptor_(io_) {}

PeerMesh::~PeerMesh() { Abort(); }

void PeerMesh::Abort() {
  aborted_ = true;
  boost::system::error_code ec;
  acceptor_.close(ec);
  for (Link* link : {&left_, &right_}) {
    link->socket.close(ec);
    link->stream.Reset();
  }
  for (auto& link : mesh_) {
    if (!link) continue;
    link->socket.close(ec);
    link->stream.Reset();
  }
  for (auto& weak : retries_) {
    if (auto timer = weak.lock()) timer->cancel();
  }
  retries_.clear();
  // Let handlers still queued see operation_aborted while their captures are alive.
  io_.restart();
  io_.poll();
}

uint64_t PeerMesh::bytes_sent() const {
  uint64_t overhead = right_.stream.overhead_sent();
  for (const auto& link : mesh_) overhead += link ? link->stream.overhead_sent() : 0;
  return bytes_sent_ + overhead;
}

uint64_t PeerMesh::bytes_received() const {
  uint64_t overhead = left_.stream.overhead_received();
  for (const auto& link : mesh_) overhead += link ? link->stream.overhead_received() : 0;
  return bytes_received_ + overhead;
}

RingStream& PeerMesh::SendStream(int peer) {
  return peer == (rank_ + 1) % size_ ? right_.stream : mesh_[static_cast<size_t>(peer)]->stream;
}

RingStream& PeerMesh::RecvStream(int peer) {
  return peer == (rank_ - 1 + size_) % size_ ? left_.stream : mesh_[static_cast<size_t>(peer)]->stream;
}

void PeerMesh::RetryAfter(std::chrono::microseconds delay, std::function<void()> fn) {
  if (aborted_) return;
  std::erase_if(retries_, [](const auto& weak) { return weak.expired(); });
  auto timer = std::make_shared<asio::steady_timer>(io_, delay);
  retries_.push_back(timer);
  timer->async_wait([timer, fn = std::move(fn)](const boost::system::error_code& e) {
    if (!e) fn();  // cancelled (aborted): the operation that asked is gone
  });
}

bool PeerMesh::Cancel(const std::string& why) {
  {
    std::lock_guard lock(cancel_mu_);
    if (cancelled_.load()) return false;
    cancel_why_ = why;
  }
  cancelled_.store(true);
  asio::post(io_, [] {});  // wakes a RunOne that waits, which then sees cancelled_
  return true;
}

size_t PeerMesh::RunOne(Clock::time_point deadline) {
  if (cancelled_.load(std::memory_order_acquire)) return 0;  // the caller fails; Fail says why
  // Poll first: a peer's answer usually comes within microseconds, and a thread that sleeps in
  // epoll pays a wake-up for every step. Yielding between polls leaves the core to a rank that
  // shares it.
  if (options_.mesh_wait.busy_poll_ms > 0) {
    Waiter waiter(options_.mesh_wait);
    do {
      if (const size_t ran = io_.poll_one(); ran > 0) return ran;
      if (io_.stopped()) io_.restart();
    } while (waiter.Poll());
  }
  return io_.run_one_until(deadline);
}

PeerMesh::Clock::time_point PeerMesh::Deadline() const {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(options_.timeout_s));
}

void PeerMesh::SetSocketOptions(tcp::socket& socket) const {
  boost::system::error_code ignore;  // a kernel that caps or refuses a size keeps its own
  socket.set_option(tcp::no_delay(true), ignore);
  if (options_.socket_buffer_bytes > 0) {
    const int bytes = static_cast<int>(std::min<size_t>(options_.socket_buffer_bytes, size_t{1} << 30));
    socket.set_option(asio::socket_base::send_buffer_size(bytes), ignore);
    socket.set_option(asio::socket_base::receive_buffer_size(bytes), ignore);
  }
}

Status PeerMesh::Fail(Status s) {
  if (cancelled_.load()) {
    std::lock_guard lock(cancel_mu_);
    s = AbortedError(cancel_why_);
  }
  if (broken_.ok()) broken_ = s;
  Abort();
  return s;
}

std::string PeerMesh::Where(CollectiveOp op, uint32_t step) const {
  return std::string(OpName(static_cast<uint32_t>(op))) + " #" + std::to_string(seq_) + " step " + std::to_string(step) +
         " on rank " + std::to_string(rank_);
}

Status PeerMesh::PeerError(int peer, const boost::system::error_code& e, const std::string& where) const {
  const std::string who = "rank " + std::to_string(peer) + " (" + peers_[peer] + ") ";
  if (e.category() == RingFrameCategory()) {
    // Not a lost peer: bytes that someone changed, replayed or reordered on the way.
    return DataLossError(who + e.message() + " during " + where + "; the collective is abandoned");
  }
  return UnavailableError(who + (e == asio::error::eof ? std::string("closed the connection") : e.message()) + " during " +
                          where);
}

Status PeerMesh::Begin() {
  if (!broken_.ok()) return FailedPreconditionError("the ring is broken by an earlier failure: " + broken_.message());
  if (size_ == 0) return FailedPreconditionError("Connect() first");
  ++seq_;
  return OkStatus();
}

StepHeader PeerMesh::Header(CollectiveOp op, uint32_t step, uint64_t bytes) const {
  const uint32_t algo = op == CollectiveOp::kAllReduce ? static_cast<uint32_t>(algo_) : 0;
  return {kStepMagic, static_cast<uint32_t>(op), seq_, step, algo, bytes};
}

Status PeerMesh::CheckHeader(const StepHeader& in, CollectiveOp op, uint32_t step, size_t bytes, int from) const {
  const uint32_t algo = op == CollectiveOp::kAllReduce ? static_cast<uint32_t>(algo_) : 0;
  if (in.magic == kStepMagic && in.op == static_cast<uint32_t>(op) && in.seq == seq_ && in.algo != algo &&
      op == CollectiveOp::kAllReduce) {
    return InvalidArgumentError("rank " + std::to_string(from) + " runs all-reduce #" + std::to_string(seq_) + " with " +
                                AllReduceAlgoName(static_cast<AllReduceAlgo>(in.algo)) + " but rank " + std::to_string(rank_) +
                                " with " + AllReduceAlgoName(static_cast<AllReduceAlgo>(algo)) +
                                ": every worker needs the same --allreduce-algo");
  }
  if (in.magic != kStepMagic || in.op != static_cast<uint32_t>(op) || in.seq != seq_ || in.step != step ||
      in.bytes != bytes || in.algo != algo) {
    return InternalError("mismatched collectives: rank " + std::to_string(from) + " sent " + OpName(in.op) + " #" +
                         std::to_string(in.seq) + " step " + std::to_string(in.step) + " (" + std::to_string(in.bytes) +
                         " bytes) but " + Where(op, step) + " expects " + std::to_string(bytes) +
                         " bytes: every rank must call the same operations in the same order");
  }
  return OkStatus();
}

// One Exchange in flight: everything its handlers use (they run inside Exchange).
struct PeerMesh::Step {
  CollectiveOp op = CollectiveOp::kAllReduce;
  uint32_t step = 0;
  int to = -1, from = -1;
  const void* send = nullptr;
  size_t send_bytes = 0;
  void* recv = nullptr;
  size_t recv_bytes = 0;
  const OnSegment* on_segment = nullptr;
  bool recv_reuse = false;
  StepHeader out{}, in{};
  bool wdone = false, rdone = false;
  Status failure;
  // A swap with one peer goes in lockstep: segments of exchange_segment_bytes both ways, the
  // next one sent only once the peer's previous one has arrived (its reads are never held back,
  // so two ranks that both wait for the other's segment always have it on the way).
  size_t lock_seg = 0;
  bool lockstep = false;
  // Reads no larger than the lockstep segment (else both ranks could wait for a whole read
  // segment that the other holds back), nor than segment_bytes (a caller's reduce scratch).
  size_t read_seg = 0;
  size_t sent = 0, received = 0;
  bool write_held = false;
  RingStream* in_stream = nullptr;

  bool may_write() const { return rdone || received + lock_seg >= sent; }
  char* segment_at(size_t off) const { return static_cast<char*>(recv) + (recv_reuse ? 0 : off); }
};

void PeerMesh::StartWrite(Step& st) {
  if (st.lockstep) return WriteLockstep(st);
  SendStream(st.to).AsyncWrite({asio::buffer(&st.out, sizeof(st.out)), asio::buffer(st.send ? st.send : empty_buffer, st.send_bytes)},
                               [this, &st](const boost::system::error_code& e, size_t n) {
    if (e) {
      if (st.failure.ok()) st.failure = PeerError(st.to, e, Where(st.op, st.step));
      return;
    }
    bytes_sent_ += n;
    st.wdone = true;
  });
}

void PeerMesh::WriteLockstep(Step& st) {
  st.write_held = false;
  const size_t len = std::min(st.lock_seg, st.send_bytes - st.sent);
  std::vector<asio::const_buffer> buffers;
  if (st.sent == 0) buffers.push_back(asio::buffer(&st.out, sizeof(st.out)));
  buffers.push_back(asio::buffer(static_cast<const char*>(st.send) + st.sent, len));
  SendStream(st.to).AsyncWrite(std::move(buffers), [this, &st, len](const boost::system::error_code& e, size_t n) {
    if (e) {
      if (st.failure.ok()) st.failure = PeerError(st.to, e, Where(st.op, st.step));
      return;
    }
    bytes_sent_ += n;
    st.sent += len;
    if (st.sent == st.send_bytes) {
      st.wdone = true;
    } else if (st.may_write()) {
      WriteLockstep(st);
    } else {
      st.write_held = true;
    }
  });
}

// The segment at `off`, whose first `have` bytes are already in place.
void PeerMesh::ReadFrom(Step& st, size_t off, size_t have) {
  if (off == st.recv_bytes) {
    st.rdone = true;
    return;
  }
  const size_t len = std::min(st.read_seg, st.recv_bytes - off);
  st.in_stream->AsyncRead(asio::buffer(st.segment_at(off) + have, len - have), [this, &st, off, len](const boost::system::error_code& e, size_t n) {
    if (e) {
      if (st.failure.ok()) st.failure = PeerError(st.from, e, Where(st.op, st.step));
      return;
    }
    bytes_received_ += n;
    if (*st.on_segment) (*st.on_segment)(off, len);
    st.received = off + len;
    ReadFrom(st, off + len, 0);
    if (st.write_held && st.may_write()) WriteLockstep(st);
  });
}

// The header, and with it whatever of the first segment has arrived: a small step's data comes
// in the same receive call.
void PeerMesh::StartRead(Step& st) {
  st.in_stream = &RecvStream(st.from);
  st.in_stream->AsyncReadHeader(asio::buffer(&st.in, sizeof(st.in)), asio::buffer(st.segment_at(0), std::min(st.read_seg, st.recv_bytes)),
                                [this, &st](const boost::system::error_code& e, size_t n) {
    if (e) {
      if (st.failure.ok()) st.failure = PeerError(st.from, e, Where(st.op, st.step));
      return;
    }
    bytes_received_ += n;
    if (Status s = CheckHeader(st.in, st.op, st.step, st.recv_bytes, st.from); !s.ok()) {
      st.failure = s;
      return;
    }
    ReadFrom(st, 0, n - sizeof(st.in));
    if (st.write_held && st.may_write()) WriteLockstep(st);  // an empty receive is done at its header
  });
}

Status PeerMesh::Drive(Step& st) {
  const auto deadline = Deadline();
  io_.restart();
  while (!(st.wdone && st.rdone) && st.failure.ok()) {
    if (RunOne(deadline) == 0 && !(st.wdone && st.rdone) && st.failure.ok()) {
      st.failure = DeadlineExceededError(std::string("no progress for ") + SecondsText(options_.timeout_s) + " s during " +
                                         Where(st.op, st.step) + (st.rdone ? "" : " (waiting for rank " + std::to_string(st.from) + ")") +
                                         (st.wdone ? "" : " (sending to rank " + std::to_string(st.to) + ")"));
    }
  }
  if (!st.failure.ok()) return Fail(st.failure);
  return OkStatus();
}

Status PeerMesh::Exchange(CollectiveOp op, uint32_t step, int to, const void* send, size_t send_bytes, int from, void* recv,
                          size_t recv_bytes, const OnSegment& on_segment, bool recv_reuse) {
  Step st;
  st.op = op;
  st.step = step;
  st.to = to;
  st.from = from;
  st.send = send;
  st.send_bytes = send_bytes;
  st.recv = recv;
  st.recv_bytes = recv_bytes;
  st.on_segment = &on_segment;
  st.recv_reuse = recv_reuse;
  st.out = Header(op, step, send_bytes);
  st.wdone = to < 0;
  st.rdone = from < 0;
  st.lock_seg = options_.exchange_segment_bytes;
  st.lockstep = st.lock_seg > 0 && to >= 0 && from >= 0 && to == from && send_bytes > st.lock_seg;
  st.read_seg = st.lockstep ? std::min(st.lock_seg, options_.segment_bytes) : options_.segment_bytes;
  if (to >= 0) StartWrite(st);
  if (from >= 0) StartRead(st);
  return Drive(st);
}

}  // namespace gradsync
