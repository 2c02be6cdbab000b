#include "allreduce/tcp_ring.h"

#include <chrono>
#include <cstring>
#include <deque>
#include <functional>
#include <thread>

#include "common/half.h"
#include "common/transport.h"

namespace gradsync {
namespace asio = boost::asio;
using tcp = asio::ip::tcp;

namespace {
constexpr uint32_t kStepMagic = 0x47535247;   // "GRSG"
// A plaintext ring's hello is {ring_handshake::kPlainHelloMagic ("IHSG"), rank}.
using Clock = std::chrono::steady_clock;

Clock::time_point Deadline(double seconds) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

const char* OpName(uint32_t op) {
  switch (op) {
    case 1: return "allreduce";
    case 2: return "broadcast";
    case 3: return "allgather";
    case 4: return "barrier";
    default: return "unknown op";
  }
}
}  // namespace

std::byte RingCollective::empty_[1];

RingCollective::RingCollective(const CollectiveOptions& options, const RingSecurity& security)
    : options_(options), acceptor_(io_), left_(io_), right_(io_), security_(security) {
  options_.segment_bytes = std::max<size_t>(4, options_.segment_bytes / 4 * 4);
}

RingCollective::~RingCollective() { Abort(); }

Result<std::unique_ptr<RingCollective>> RingCollective::Listen(const std::string& bind_host,
                                                               const CollectiveOptions& options,
                                                               const RingSecurity& security) {
  if (security.encrypt && !security.authenticate) {
    return InvalidArgumentError("an encrypted ring needs the ring key (--ring-encrypt needs --auth-dir)");
  }
  auto ring = std::unique_ptr<RingCollective>(new RingCollective(options, security));
  boost::system::error_code ec;
  auto address = asio::ip::make_address(bind_host, ec);
  if (ec) return InvalidArgumentError("bad bind address '" + bind_host + "': " + ec.message());
  tcp::endpoint ep(address, 0);
  ring->acceptor_.open(ep.protocol(), ec);
  if (!ec) ring->acceptor_.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) ring->acceptor_.bind(ep, ec);
  if (!ec) ring->acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return UnavailableError("cannot listen on " + bind_host + ": " + ec.message());
  ring->port_ = ring->acceptor_.local_endpoint().port();
  return ring;
}

void RingCollective::Abort() {
  aborted_ = true;
  boost::system::error_code ec;
  left_.close(ec);
  right_.close(ec);
  acceptor_.close(ec);
  left_stream_.Reset();
  right_stream_.Reset();
  for (auto& weak : retries_) {
    if (auto timer = weak.lock()) timer->cancel();
  }
  retries_.clear();
  // Let handlers still queued see operation_aborted while their captures are alive.
  io_.restart();
  io_.poll();
}

void RingCollective::RetryAfter(std::chrono::microseconds delay, std::function<void()> fn) {
  if (aborted_) return;
  std::erase_if(retries_, [](const auto& weak) { return weak.expired(); });
  auto timer = std::make_shared<asio::steady_timer>(io_, delay);
  retries_.push_back(timer);
  timer->async_wait([timer, fn = std::move(fn)](const boost::system::error_code& e) {
    if (!e) fn();  // cancelled (aborted): the operation that asked is gone
  });
}

Status RingCollective::Fail(Status s) {
  if (broken_.ok()) broken_ = s;
  Abort();
  return s;
}

std::string RingCollective::Where(OpKind op, uint32_t step) const {
  return std::string(OpName(static_cast<uint32_t>(op))) + " #" + std::to_string(seq_) + " step " +
         std::to_string(step) + " on rank " + std::to_string(rank_);
}

Status RingCollective::Connect(int rank, const std::vector<std::string>& peers, double timeout_s) {
  rank_ = rank;
  size_ = static_cast<int>(peers.size());
  peers_ = peers;
  if (size_ < 1 || rank < 0 || rank >= size_) return InvalidArgumentError("rank " + std::to_string(rank) + " of " + std::to_string(size_));
  if (size_ == 1) return OkStatus();
  const int right = (rank + 1) % size_, left = (rank - 1 + size_) % size_;
  std::string host;
  uint16_t port = 0;
  RETURN_IF_ERROR(ParseHostPort(peers[right], &host, &port).WithContext("peer " + std::to_string(right)));
  boost::system::error_code ec;
  tcp::resolver resolver(io_);
  auto endpoints = resolver.resolve(host, std::to_string(port), ec);
  if (ec) return UnavailableError("cannot resolve " + peers[right] + ": " + ec.message());
  const auto deadline = Deadline(timeout_s);
  const auto context = ring_handshake::RingContext(peers);

  // Connect to the right (retrying while it is not listening yet) and accept the left, together.
  bool connected = false, accepted = false;
  Status failure;
  uint32_t hello_out[2] = {ring_handshake::kPlainHelloMagic, static_cast<uint32_t>(rank)};
  uint32_t hello_in[2] = {0, 0};
  std::function<void()> try_connect = [&] {
    asio::async_connect(right_, endpoints, [&](const boost::system::error_code& e, const tcp::endpoint&) {
      if (e) {
        if (Clock::now() > deadline) {
          failure = UnavailableError("cannot connect to rank " + std::to_string(right) + " at " + peers[right] + ": " + e.message());
          return;
        }
        boost::system::error_code ignore;
        right_.close(ignore);
        RetryAfter(std::chrono::milliseconds(20), [&] { try_connect(); });
        return;
      }
      right_.set_option(tcp::no_delay(true));
      if (security_.authenticate) return HandshakeAsConnector(right, context, &connected, &failure);
      asio::async_write(right_, asio::buffer(hello_out), [&](const boost::system::error_code& we, size_t) {
        if (we) failure = UnavailableError("hello to rank " + std::to_string(right) + " failed: " + we.message());
        else connected = true;
      });
    });
  };
  try_connect();
  acceptor_.async_accept(left_, [&](const boost::system::error_code& e) {
    if (e) {
      failure = UnavailableError("accepting rank " + std::to_string(left) + " failed: " + e.message());
      return;
    }
    left_.set_option(tcp::no_delay(true));
    if (security_.authenticate) return HandshakeAsAcceptor(left, context, &accepted, &failure);
    asio::async_read(left_, asio::buffer(hello_in), [&](const boost::system::error_code& re, size_t) {
      if (re) failure = UnavailableError("hello from rank " + std::to_string(left) + " failed: " + re.message());
      else if (hello_in[0] == ring_handshake::kHelloMagic) {
        failure = InvalidArgumentError("ring authentication refused on rank " + std::to_string(rank_) + ": rank " +
                                       std::to_string(left) + " (" + peers_[left] +
                                       ") authenticates the ring (--auth-dir) but this worker has no --auth-dir; "
                                       "every worker of the job needs the same --auth-dir");
      } else if (hello_in[0] != ring_handshake::kPlainHelloMagic || hello_in[1] != static_cast<uint32_t>(left)) {
        failure = InvalidArgumentError("the ring's left neighbor should be rank " + std::to_string(left) +
                                       " but a peer introduced itself as rank " + std::to_string(hello_in[1]));
      } else {
        accepted = true;
      }
    });
  });
  io_.restart();
  while (!(connected && accepted) && failure.ok()) {
    if (io_.run_one_until(deadline) == 0 || Clock::now() > deadline) {
      if (connected && accepted) break;
      failure = DeadlineExceededError("ring set-up on rank " + std::to_string(rank) + " timed out after " +
                                      std::to_string(timeout_s) + " s (right " + peers[right] + (connected ? " ok" : " missing") +
                                      ", left " + peers[left] + (accepted ? " ok" : " missing") + ")");
    }
  }
  if (!failure.ok()) return Fail(failure);
  boost::system::error_code ignore;
  acceptor_.close(ignore);
  return OkStatus();
}

Status RingCollective::PeerError(int peer, const boost::system::error_code& e, const std::string& where) const {
  const std::string who = "rank " + std::to_string(peer) + " (" + peers_[peer] + ") ";
  if (e.category() == RingFrameCategory()) {
    // Not a lost peer: bytes that someone changed, replayed or reordered on the way.
    return DataLossError(who + e.message() + " during " + where + "; the collective is abandoned");
  }
  return UnavailableError(who + (e == asio::error::eof ? std::string("closed the connection") : e.message()) + " during " +
                          where);
}

std::string RingCollective::AuthFailure(int peer, bool accepted_side, const std::string& why) const {
  std::string from;
  if (accepted_side) {
    // The connection may not be from the rank the ring expects there: say where it came from.
    boost::system::error_code ec;
    const auto remote = left_.remote_endpoint(ec);
    if (!ec) from = ", connection from " + remote.address().to_string() + ":" + std::to_string(remote.port());
  }
  return "ring authentication failed between rank " + std::to_string(rank_) + " and rank " + std::to_string(peer) + " (" +
         peers_[peer] + from + "): " + why;
}

// The connector's half (wire format in ARCHITECTURE.md): hello with its nonce; the acceptor's
// nonce and proof; this side's verdict and proof; the acceptor's verdict. Each side checks
// the other's proof, so a refusal is reported on both, each naming the other.
void RingCollective::HandshakeAsConnector(int peer, const std::array<uint8_t, 32>& context, bool* done, Status* failure) {
  using namespace ring_handshake;
  auto fail = [this, peer, failure](const std::string& why) {
    if (failure->ok()) *failure = InvalidArgumentError(AuthFailure(peer, false, why));
  };
  auto io_fail = [fail](const char* during, const boost::system::error_code& e) {
    fail(e == asio::error::eof ? std::string("it closed the connection during the handshake (") + during +
                                     "): a worker without --auth-dir, or one that refused this one"
                               : std::string(during) + ": " + e.message());
  };
  HandshakeState& h = as_connector_;
  const uint32_t flags = security_.encrypt ? kFlagEncrypt : 0;
  h.hello = Hello{kHelloMagic, static_cast<uint32_t>(rank_), flags, kVersion, RandomNonce()};
  asio::async_write(right_, asio::buffer(&h.hello, sizeof(h.hello)), [=, this, &h](const boost::system::error_code& e, size_t) {
    if (e) return io_fail("sending the hello", e);
    asio::async_read(right_, asio::buffer(&h.reply, sizeof(h.reply)), [=, this, &h](const boost::system::error_code& e2, size_t) {
      if (e2) return io_fail("waiting for its proof", e2);
      if (h.reply.magic != kReplyMagic) return fail("it does not speak the ring handshake");
      uint32_t verdict = kAccepted;
      h.transcript = Transcript(context, h.hello, h.reply);
      if (h.reply.version != kVersion) verdict = kBadVersion;
      else if (h.reply.rank != static_cast<uint32_t>(peer)) verdict = kWrongRank;
      else if (h.reply.flags != flags) verdict = kFlagsDiffer;
      else if (!MacEqual(h.reply.mac, AcceptorMac(security_.key, h.transcript))) verdict = kBadProof;
      h.finish = Finish{kFinishMagic, verdict, verdict == kAccepted ? ConnectorMac(security_.key, h.transcript) : Mac{}};
      asio::async_write(right_, asio::buffer(&h.finish, sizeof(h.finish)), [=, this, &h](const boost::system::error_code& e3, size_t) {
        if (verdict != kAccepted) return fail("this worker refused it: " + VerdictText(verdict));
        if (e3) return io_fail("sending this worker's proof", e3);
        asio::async_read(right_, asio::buffer(&h.verdict, sizeof(h.verdict)), [=, this, &h](const boost::system::error_code& e4, size_t) {
          if (e4) return io_fail("waiting for its verdict", e4);
          if (h.verdict.magic != kVerdictMagic) return fail("it does not speak the ring handshake");
          if (h.verdict.verdict != kAccepted) return fail("it refused this worker: " + VerdictText(h.verdict.verdict));
          if (security_.encrypt) right_stream_.Encrypt(DeriveSessionKeys(security_.key, h.transcript, /*connector=*/true));
          *done = true;
        });
      });
    });
  });
}

void RingCollective::HandshakeAsAcceptor(int peer, const std::array<uint8_t, 32>& context, bool* done, Status* failure) {
  using namespace ring_handshake;
  auto fail = [this, peer, failure](const std::string& why) {
    if (failure->ok()) *failure = InvalidArgumentError(AuthFailure(peer, true, why));
  };
  auto io_fail = [fail](const char* during, const boost::system::error_code& e) {
    fail(e == asio::error::eof ? std::string("it closed the connection during the handshake (") + during +
                                     "): a worker with other keys, or one that refused this one"
                               : std::string(during) + ": " + e.message());
  };
  HandshakeState& h = as_acceptor_;
  const uint32_t flags = security_.encrypt ? kFlagEncrypt : 0;
  // The first 8 bytes sit where a plaintext ring's hello has its magic and rank.
  asio::async_read(left_, asio::buffer(&h.hello, 8), [=, this, &h](const boost::system::error_code& e, size_t) {
    if (e) return io_fail("waiting for its hello", e);
    if (h.hello.magic == kPlainHelloMagic) {
      return fail("it connected without authentication (no --auth-dir): every worker of the ring needs --auth-dir with "
                  "the cluster's keys");
    }
    if (h.hello.magic != kHelloMagic) return fail("it is not a gradsync ring peer (unknown hello)");
    asio::async_read(left_, asio::buffer(reinterpret_cast<char*>(&h.hello) + 8, sizeof(h.hello) - 8),
                     [=, this, &h](const boost::system::error_code& e2, size_t) {
      if (e2) return io_fail("waiting for its hello", e2);
      h.reply = Reply{kReplyMagic, static_cast<uint32_t>(rank_), flags, kVersion, RandomNonce(), Mac{}};
      h.transcript = Transcript(context, h.hello, h.reply);
      h.reply.mac = AcceptorMac(security_.key, h.transcript);
      asio::async_write(left_, asio::buffer(&h.reply, sizeof(h.reply)), [=, this, &h](const boost::system::error_code& e3, size_t) {
        if (e3) return io_fail("sending this worker's proof", e3);
        asio::async_read(left_, asio::buffer(&h.finish, sizeof(h.finish)), [=, this, &h](const boost::system::error_code& e4, size_t) {
          if (e4) return io_fail("waiting for its proof", e4);
          if (h.finish.magic != kFinishMagic) return fail("it does not speak the ring handshake");
          if (h.finish.verdict != kAccepted) return fail("it refused this worker: " + VerdictText(h.finish.verdict));
          uint32_t verdict = kAccepted;
          if (h.hello.version != kVersion) verdict = kBadVersion;
          else if (h.hello.rank != static_cast<uint32_t>(peer)) verdict = kWrongRank;
          else if (h.hello.flags != flags) verdict = kFlagsDiffer;
          else if (!MacEqual(h.finish.mac, ConnectorMac(security_.key, h.transcript))) verdict = kBadProof;
          h.verdict = VerdictMsg{kVerdictMagic, verdict};
          asio::async_write(left_, asio::buffer(&h.verdict, sizeof(h.verdict)), [=, this, &h](const boost::system::error_code& e5, size_t) {
            if (verdict != kAccepted) return fail("this worker refused it: " + VerdictText(verdict));
            if (e5) return io_fail("sending this worker's verdict", e5);
            if (security_.encrypt) left_stream_.Encrypt(DeriveSessionKeys(security_.key, h.transcript, /*connector=*/false));
            *done = true;
          });
        });
      });
    });
  });
}

Status RingCollective::Begin(OpKind op) {
  (void)op;
  if (!broken_.ok()) return FailedPreconditionError("the ring is broken by an earlier failure: " + broken_.message());
  if (size_ == 0) return FailedPreconditionError("Connect() first");
  ++seq_;
  return OkStatus();
}

Status RingCollective::Exchange(OpKind op, uint32_t step, const void* send, size_t send_bytes, void* recv,
                                size_t recv_bytes, const std::function<void(size_t, size_t)>& on_segment,
                                bool recv_reuse) {
  const bool do_send = send != nullptr, do_recv = recv != nullptr;
  StepHeader out{kStepMagic, static_cast<uint32_t>(op), seq_, step, 0, send_bytes};
  StepHeader in{};
  bool wdone = !do_send, rdone = !do_recv;
  Status failure;
  const int left = (rank_ - 1 + size_) % size_, right = (rank_ + 1) % size_;
  auto peer_error = [&](int peer, const boost::system::error_code& e) {
    if (failure.ok()) failure = PeerError(peer, e, Where(op, step));
  };
  if (do_send) {
    right_stream_.AsyncWrite({asio::buffer(&out, sizeof(out)), asio::buffer(send, send_bytes)}, [&](const boost::system::error_code& e, size_t n) {
      if (e) return peer_error(right, e);
      bytes_sent_ += n;
      wdone = true;
    });
  }
  std::function<void(size_t)> read_from;
  if (do_recv) {
    read_from = [&](size_t off) {
      if (off == recv_bytes) {
        rdone = true;
        return;
      }
      const size_t len = std::min(options_.segment_bytes, recv_bytes - off);
      left_stream_.AsyncRead(asio::buffer(static_cast<char*>(recv) + (recv_reuse ? 0 : off), len),
                       [&, off, len](const boost::system::error_code& e, size_t n) {
                         if (e) return peer_error(left, e);
                         bytes_received_ += n;
                         if (on_segment) on_segment(off, len);
                         read_from(off + len);
                       });
    };
    left_stream_.AsyncRead(asio::buffer(&in, sizeof(in)), [&](const boost::system::error_code& e, size_t n) {
      if (e) return peer_error(left, e);
      bytes_received_ += n;
      if (in.magic != kStepMagic || in.op != static_cast<uint32_t>(op) || in.seq != seq_ || in.step != step ||
          in.bytes != recv_bytes) {
        failure = InternalError("mismatched collectives: rank " + std::to_string(left) + " sent " +
                                OpName(in.op) + " #" + std::to_string(in.seq) + " step " + std::to_string(in.step) +
                                " (" + std::to_string(in.bytes) + " bytes) but " + Where(op, step) + " expects " +
                                std::to_string(recv_bytes) + " bytes: every rank must call the same operations in the same order");
        return;
      }
      read_from(0);
    });
  }
  const auto deadline = Deadline(options_.timeout_s);
  io_.restart();
  while (!(wdone && rdone) && failure.ok()) {
    if (io_.run_one_until(deadline) == 0 && !(wdone && rdone) && failure.ok()) {
      failure = DeadlineExceededError(std::string("no progress for ") + std::to_string(options_.timeout_s) + " s during " +
                                      Where(op, step) + (rdone ? "" : " (waiting for rank " + std::to_string(left) + ")") +
                                      (wdone ? "" : " (sending to rank " + std::to_string(right) + ")"));
    }
  }
  if (!failure.ok()) return Fail(failure);
  return OkStatus();
}

// The 2(n-1) ring steps run as one stream in each direction. Step t receives chunk recv(t) and
// sends chunk send(t), and send(t + 1) == recv(t): so each received segment, once reduced
// (reduce-scatter) or stored (all-gather), is queued at once as the next step's outgoing
// segment, while it is still in cache. The writer may lag the reader by at most one step (the
// reader waits before a new step until the writer has sent everything of the steps before),
// which keeps a chunk from being overwritten while it is still queued for sending.
Status RingCollective::AllReduce(FloatSpan data, ReduceOp op) {
  RETURN_IF_ERROR(Begin(OpKind::kAllReduce));
  if (size_ == 1 || data.empty()) return OkStatus();
  RETURN_IF_ERROR(RingAllReduce(data.data(), data.size(), sizeof(float), [](void* acc, const void* x, size_t k) {
    float* __restrict a = static_cast<float*>(acc);
    const float* __restrict b = static_cast<const float*>(x);
    for (size_t i = 0; i < k; ++i) a[i] += b[i];
  }));
  if (op == ReduceOp::kAverage) Scale(data, 1.0f / static_cast<float>(size_));
  return OkStatus();
}

Status RingCollective::AllReduceHalf(std::span<uint16_t> data) {
  RETURN_IF_ERROR(Begin(OpKind::kAllReduce));
  if (size_ == 1 || data.empty()) return OkStatus();
  return RingAllReduce(data.data(), data.size(), sizeof(uint16_t), [](void* acc, const void* x, size_t k) {
    AddHalves(static_cast<uint16_t*>(acc), static_cast<const uint16_t*>(x), k);
  });
}

Status RingCollective::RingAllReduce(void* data, size_t count, size_t elem, const Reducer& reduce) {
  const int n = size_, r = rank_;
  char* d = static_cast<char*>(data);
  const int steps = 2 * (n - 1);
  auto recv_chunk = [&](int t) { return t < n - 1 ? (r - t - 1 + 2 * n) % n : (r - (t - (n - 1)) + 2 * n) % n; };
  auto send_chunk = [&](int t) { return t == 0 ? r : recv_chunk(t - 1); };
  auto begin_of = [&](int c) { return ChunkBegin(count, n, c) * elem; };  // in bytes
  auto bytes_of = [&](int c) { return (ChunkBegin(count, n, c + 1) - ChunkBegin(count, n, c)) * elem; };
  // Segments hold whole elements.
  const size_t seg = std::max(elem, options_.segment_bytes / elem * elem);
  scratch_.resize(std::max<size_t>(1, seg / sizeof(float) + 1));

  struct Piece {
    const void* data;
    size_t len;
    int step;
  };
  std::deque<StepHeader> headers;
  std::deque<Piece> queue;
  bool writing = false;
  int writer_done_through = -1;  // every piece of steps <= this has been written
  std::vector<size_t> pieces_left(static_cast<size_t>(steps), 0);
  std::vector<bool> step_queued(static_cast<size_t>(steps), false);  // all pieces of the step queued
  Status failure;
  const int left = (r - 1 + n) % n, right = (r + 1) % n;
  auto peer_error = [&](int peer, const boost::system::error_code& e, int t) {
    if (failure.ok()) failure = PeerError(peer, e, Where(OpKind::kAllReduce, static_cast<uint32_t>(t)));
  };
  auto advance_writer_mark = [&] {
    while (writer_done_through + 1 < steps && step_queued[writer_done_through + 1] &&
           pieces_left[writer_done_through + 1] == 0) {
      ++writer_done_through;
    }
  };
  std::function<void()> pump = [&] {
    if (writing || queue.empty() || !failure.ok()) return;
    writing = true;
    Piece p = queue.front();
    right_stream_.AsyncWrite({asio::buffer(p.data, p.len)}, [&, p](const boost::system::error_code& e, size_t w) {
      writing = false;
      if (e) return peer_error(right, e, p.step);
      bytes_sent_ += w;
      queue.pop_front();
      --pieces_left[p.step];
      advance_writer_mark();
      pump();
    });
  };
  auto enqueue = [&](const void* ptr, size_t len, int t) {
    queue.push_back({ptr, len, t});
    ++pieces_left[t];
    pump();
  };
  auto start_step_send = [&](int t) {
    headers.push_back({kStepMagic, static_cast<uint32_t>(OpKind::kAllReduce), seq_, static_cast<uint32_t>(t), 0,
                       bytes_of(send_chunk(t))});
    enqueue(&headers.back(), sizeof(StepHeader), t);
  };
  // Step 0 sends this rank's own chunk, whole.
  start_step_send(0);
  if (bytes_of(r) > 0) enqueue(d + begin_of(r), bytes_of(r), 0);
  step_queued[0] = true;

  StepHeader in{};
  int reading = 0;
  bool all_read = false;
  std::function<void()> read_step;
  std::function<void(size_t)> read_segment = [&](size_t off) {
    const int t = reading;
    const int c = recv_chunk(t);
    const size_t total = bytes_of(c);
    if (off == total) {
      if (t + 1 < steps) step_queued[t + 1] = true;
      advance_writer_mark();
      reading = t + 1;
      if (reading == steps) {
        all_read = true;
        return;
      }
      return read_step();
    }
    const size_t len = std::min(seg, total - off);
    char* dst = d + begin_of(c) + off;
    const bool reducing = t < n - 1;
    void* target = reducing ? static_cast<void*>(scratch_.data()) : static_cast<void*>(dst);
    left_stream_.AsyncRead(asio::buffer(target, len), [&, t, off, len, dst, reducing](const boost::system::error_code& e, size_t got) {
      if (e) return peer_error(left, e, t);
      bytes_received_ += got;
      if (reducing) reduce(dst, scratch_.data(), len / elem);
      if (t + 1 < steps) enqueue(dst, len, t + 1);  // forward it while it is hot
      read_segment(off + len);
    });
  };
  read_step = [&] {
    const int t = reading;
    // The writer must have sent every piece of the steps before t - 1 ... t - 1 is still allowed
    // to be in flight only for chunks this step does not touch (see above).
    if (writer_done_through < t - 1) {
      RetryAfter(std::chrono::microseconds(20), [&] { read_step(); });
      return;
    }
    left_stream_.AsyncRead(asio::buffer(&in, sizeof(in)), [&, t](const boost::system::error_code& e, size_t got) {
      if (e) return peer_error(left, e, t);
      bytes_received_ += got;
      const size_t want = bytes_of(recv_chunk(t));
      if (in.magic != kStepMagic || in.op != static_cast<uint32_t>(OpKind::kAllReduce) || in.seq != seq_ ||
          in.step != static_cast<uint32_t>(t) || in.bytes != want) {
        failure = InternalError("mismatched collectives: rank " + std::to_string(left) + " sent " + OpName(in.op) +
                                " #" + std::to_string(in.seq) + " step " + std::to_string(in.step) + " (" +
                                std::to_string(in.bytes) + " bytes) but " + Where(OpKind::kAllReduce, static_cast<uint32_t>(t)) +
                                " expects " + std::to_string(want) +
                                " bytes: every rank must call the same operations in the same order");
        return;
      }
      if (t + 1 < steps) start_step_send(t + 1);
      read_segment(0);
    });
  };
  read_step();
  const auto deadline_after = [&] { return Deadline(options_.timeout_s); };
  auto deadline = deadline_after();
  io_.restart();
  while (failure.ok() && !(all_read && writer_done_through == steps - 1)) {
    const uint64_t before = bytes_received_ + bytes_sent_;
    if (io_.run_one_until(deadline) == 0 && failure.ok()) {
      failure = DeadlineExceededError("no progress for " + std::to_string(options_.timeout_s) + " s during " +
                                      Where(OpKind::kAllReduce, static_cast<uint32_t>(std::min(reading, steps - 1))) +
                                      (all_read ? " (sending to rank " + std::to_string(right) + ")"
                                                : " (waiting for rank " + std::to_string(left) + ")"));
    }
    if (bytes_received_ + bytes_sent_ != before) deadline = deadline_after();  // a deadline on progress
  }
  if (!failure.ok()) return Fail(failure);
  return OkStatus();
}

Status RingCollective::Broadcast(FloatSpan data, int root) {
  RETURN_IF_ERROR(Begin(OpKind::kBroadcast));
  if (root < 0 || root >= size_) return Fail(InvalidArgumentError("broadcast root " + std::to_string(root) + " out of range"));
  if (size_ == 1) return OkStatus();
  const int pos = (rank_ - root + size_) % size_;  // distance from the root along the ring
  const size_t bytes = data.size_bytes();
  // Forwarded segment by segment: a rank passes on each segment as soon as it has it.
  const size_t seg = options_.segment_bytes;
  const size_t segments = std::max<size_t>(1, (bytes + seg - 1) / seg);
  char* p = data.empty() ? reinterpret_cast<char*>(empty_) : reinterpret_cast<char*>(data.data());
  for (size_t k = 0; k < segments; ++k) {
    const size_t off = k * seg, len = std::min(seg, bytes - std::min(bytes, off));
    const bool recv = pos > 0, send = pos < size_ - 1;
    if (recv) RETURN_IF_ERROR(Exchange(OpKind::kBroadcast, static_cast<uint32_t>(k), nullptr, 0, p + off, len, nullptr));
    if (send) RETURN_IF_ERROR(Exchange(OpKind::kBroadcast, static_cast<uint32_t>(k), p + off, len, nullptr, 0, nullptr));
  }
  return OkStatus();
}

Status RingCollective::AllGather(std::span<const std::byte> mine, std::vector<std::vector<std::byte>>* out) {
  RETURN_IF_ERROR(Begin(OpKind::kAllGather));
  const int n = size_, r = rank_;
  out->assign(static_cast<size_t>(n), {});
  (*out)[r].assign(mine.begin(), mine.end());
  if (n == 1) return OkStatus();
  // First every rank's size, around the ring; then the blocks themselves.
  std::vector<uint64_t> sizes(static_cast<size_t>(n), 0);
  sizes[r] = mine.size();
  for (int s = 0; s < n - 1; ++s) {
    const int send_idx = (r - s + n) % n, recv_idx = (r - s - 1 + n) % n;
    RETURN_IF_ERROR(Exchange(OpKind::kAllGather, static_cast<uint32_t>(s), &sizes[send_idx], sizeof(uint64_t),
                             &sizes[recv_idx], sizeof(uint64_t), nullptr));
  }
  for (int i = 0; i < n; ++i) {
    if (sizes[i] > (uint64_t{1} << 36)) return Fail(DataLossError("allgather: rank " + std::to_string(i) + " announces " + std::to_string(sizes[i]) + " bytes"));
    if (i != r) (*out)[i].resize(sizes[i]);
  }
  for (int s = 0; s < n - 1; ++s) {
    const int send_idx = (r - s + n) % n, recv_idx = (r - s - 1 + n) % n;
    auto& sb = (*out)[send_idx];
    auto& rb = (*out)[recv_idx];
    RETURN_IF_ERROR(Exchange(OpKind::kAllGather, static_cast<uint32_t>(n - 1 + s), sb.empty() ? empty_ : sb.data(),
                             sb.size(), rb.empty() ? empty_ : rb.data(), rb.size(), nullptr));
  }
  return OkStatus();
}

Status RingCollective::Barrier() {
  RETURN_IF_ERROR(Begin(OpKind::kBarrier));
  // After n - 1 steps every rank has (transitively) heard from every other.
  for (int s = 0; s < size_ - 1; ++s) {
    RETURN_IF_ERROR(Exchange(OpKind::kBarrier, static_cast<uint32_t>(s), empty_, 0, empty_, 0, nullptr));
  }
  return OkStatus();
}

}  // namespace gradsync
