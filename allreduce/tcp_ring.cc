#include "allreduce/tcp_ring.h"

#include <chrono>
#include <cstring>
#include <deque>
#include <functional>
#include <random>
#include <sstream>
#include <thread>

#include "common/clock.h"
#include "common/half.h"
#include "common/logging.h"
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
    case 5: return "reduce-scatter";
    case 6: return "allgather (chunks)";
    default: return "unknown op";
  }
}
}  // namespace

std::byte RingCollective::empty_[1];

void AddFloats(void* acc, const void* x, size_t k) {
  float* __restrict a = static_cast<float*>(acc);
  const float* __restrict b = static_cast<const float*>(x);
  for (size_t i = 0; i < k; ++i) a[i] += b[i];
}

void SumFloats(void* out, const void* a, const void* b, size_t k) {
  float* __restrict o = static_cast<float*>(out);
  const float* __restrict x = static_cast<const float*>(a);
  const float* __restrict y = static_cast<const float*>(b);
  for (size_t i = 0; i < k; ++i) o[i] = x[i] + y[i];
}

RingCollective::RingCollective(const CollectiveOptions& options, const RingSecurity& security)
    : options_(options), acceptor_(io_), security_(security) {
  options_.segment_bytes = std::max<size_t>(4, options_.segment_bytes / 4 * 4);
  if (options_.exchange_segment_bytes > 0) options_.exchange_segment_bytes = std::max<size_t>(4, options_.exchange_segment_bytes / 4 * 4);
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

uint64_t RingCollective::bytes_sent() const {
  uint64_t overhead = right_.stream.overhead_sent();
  for (const auto& link : mesh_) overhead += link ? link->stream.overhead_sent() : 0;
  return bytes_sent_ + overhead;
}

uint64_t RingCollective::bytes_received() const {
  uint64_t overhead = left_.stream.overhead_received();
  for (const auto& link : mesh_) overhead += link ? link->stream.overhead_received() : 0;
  return bytes_received_ + overhead;
}

RingStream& RingCollective::SendStream(int peer) {
  return peer == (rank_ + 1) % size_ ? right_.stream : mesh_[static_cast<size_t>(peer)]->stream;
}

RingStream& RingCollective::RecvStream(int peer) {
  return peer == (rank_ - 1 + size_) % size_ ? left_.stream : mesh_[static_cast<size_t>(peer)]->stream;
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

void RingCollective::Cancel(const std::string& why) {
  {
    std::lock_guard lock(cancel_mu_);
    if (cancelled_.load()) return;
    cancel_why_ = why;
  }
  cancelled_.store(true);
  if (shm_) shm_->Cancel();
  asio::post(io_, [] {});  // wakes a RunOne that waits, which then sees cancelled_
}

size_t RingCollective::RunOne(std::chrono::steady_clock::time_point deadline) {
  if (cancelled_.load(std::memory_order_acquire)) return 0;  // the caller fails; Fail says why
  // Poll first: a peer's answer usually comes within microseconds, and a thread that sleeps in
  // epoll pays a wake-up for every step. Yielding between polls leaves the core to a rank that
  // shares it.
  if (options_.spin_us > 0) {
    const auto spin_until = Clock::now() + std::chrono::microseconds(options_.spin_us);
    do {
      if (const size_t ran = io_.poll_one(); ran > 0) return ran;
      if (io_.stopped()) io_.restart();
      std::this_thread::yield();
    } while (Clock::now() < spin_until);
  }
  return io_.run_one_until(deadline);
}

void RingCollective::SetSocketOptions(tcp::socket& socket) const {
  boost::system::error_code ignore;  // a kernel that caps or refuses a size keeps its own
  socket.set_option(tcp::no_delay(true), ignore);
  if (options_.socket_buffer_bytes > 0) {
    const int bytes = static_cast<int>(std::min<size_t>(options_.socket_buffer_bytes, size_t{1} << 30));
    socket.set_option(asio::socket_base::send_buffer_size(bytes), ignore);
    socket.set_option(asio::socket_base::receive_buffer_size(bytes), ignore);
  }
}

Status RingCollective::Fail(Status s) {
  if (cancelled_.load()) {
    std::lock_guard lock(cancel_mu_);
    s = AbortedError(cancel_why_);
  }
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
  // The hosts, by the host part of the ranks' addresses: each host's ranks in rank order, and
  // its leader (the first). Auto's choice looks at this host's ranks against its cores.
  {
    host_groups_.clear();
    std::vector<std::string> hosts;
    std::string host;
    uint16_t port = 0;
    for (int i = 0; i < size_; ++i) {
      if (!ParseHostPort(peers[i], &host, &port).ok()) host = peers[i];
      auto at = std::find(hosts.begin(), hosts.end(), host);
      if (at == hosts.end()) {
        hosts.push_back(host);
        host_groups_.push_back({i});
      } else {
        host_groups_[static_cast<size_t>(at - hosts.begin())].push_back(i);
      }
    }
    for (size_t g = 0; g < host_groups_.size(); ++g) {
      if (std::find(host_groups_[g].begin(), host_groups_[g].end(), rank) != host_groups_[g].end()) my_group_ = static_cast<int>(g);
    }
    leaders_.clear();
    for (const auto& g : host_groups_) leaders_.push_back(g.front());
    oversubscribed_ = host_groups_[static_cast<size_t>(my_group_)].size() >
                      static_cast<size_t>(std::max(1u, std::thread::hardware_concurrency()));
  }
  // This rank connects to its right neighbor and to its mesh peers above it, and accepts its
  // left neighbor and its mesh peers below it.
  std::vector<int> mesh_up;
  int mesh_down = 0;
  mesh_.clear();
  mesh_.resize(static_cast<size_t>(size_));
  if (size_ > 2) {
    std::vector<int> pairs = MeshPeers(rank, size_);
    // Spanning hosts with several ranks on one: the leaders' ring of the hierarchical all-reduce.
    const bool may_nest = leaders_.size() > 1 && leaders_.size() < static_cast<size_t>(size_);
    if (auto at = std::find(leaders_.begin(), leaders_.end(), rank); may_nest && at != leaders_.end()) {
      const size_t i = static_cast<size_t>(at - leaders_.begin()), l = leaders_.size();
      for (int p : {leaders_[(i + 1) % l], leaders_[(i + l - 1) % l]}) {
        if (std::find(pairs.begin(), pairs.end(), p) == pairs.end()) pairs.push_back(p);
      }
    }
    for (int p : pairs) {
      mesh_[static_cast<size_t>(p)] = std::make_unique<Link>(io_);
      if (p > rank) mesh_up.push_back(p);
      else ++mesh_down;
    }
  }
  boost::system::error_code ec;
  tcp::resolver resolver(io_);
  auto resolve = [&](int peer) -> Result<tcp::resolver::results_type> {
    std::string host;
    uint16_t port = 0;
    RETURN_IF_ERROR(ParseHostPort(peers[peer], &host, &port).WithContext("peer " + std::to_string(peer)));
    auto endpoints = resolver.resolve(host, std::to_string(port), ec);
    if (ec) return UnavailableError("cannot resolve " + peers[peer] + ": " + ec.message());
    return endpoints;
  };
  const auto deadline = Deadline(timeout_s);
  const auto context = ring_handshake::RingContext(peers);
  Status failure;

  // Connect (retrying while the peer is not listening yet) and accept, all together.
  struct Outgoing {
    Link* link;
    int peer;
    bool mesh;
    tcp::resolver::results_type endpoints;
    ring_handshake::PlainHello hello;
    std::function<void()> attempt;
  };
  const auto token = ring_handshake::RingToken(context);
  std::vector<std::unique_ptr<Outgoing>> outgoing;
  auto add_outgoing = [&](Link* link, int peer, bool mesh) -> Status {
    ASSIGN_OR_RETURN(auto endpoints, resolve(peer));
    auto o = std::make_unique<Outgoing>(Outgoing{link, peer, mesh, endpoints, {}, nullptr});
    o->hello = {mesh ? ring_handshake::kPlainMeshHelloMagic : ring_handshake::kPlainHelloMagic, static_cast<uint32_t>(rank),
                token};
    Outgoing* out = o.get();
    out->attempt = [&, out] {
      asio::async_connect(out->link->socket, out->endpoints, [&, out](const boost::system::error_code& e, const tcp::endpoint&) {
        if (e) {
          if (Clock::now() > deadline) {
            failure = UnavailableError("cannot connect to rank " + std::to_string(out->peer) + " at " + peers[out->peer] + ": " + e.message());
            return;
          }
          boost::system::error_code ignore;
          out->link->socket.close(ignore);
          RetryAfter(std::chrono::milliseconds(20), [out] { out->attempt(); });
          return;
        }
        SetSocketOptions(out->link->socket);
        if (security_.authenticate) return HandshakeAsConnector(*out->link, out->peer, out->mesh, context, &failure);
        asio::async_write(out->link->socket, asio::buffer(&out->hello, sizeof(out->hello)), [&, out](const boost::system::error_code& we, size_t) {
          if (we) failure = UnavailableError("hello to rank " + std::to_string(out->peer) + " failed: " + we.message());
          else out->link->ready = true;
        });
      });
    };
    outgoing.push_back(std::move(o));
    return OkStatus();
  };
  RETURN_IF_ERROR(add_outgoing(&right_, right, false));
  for (int p : mesh_up) RETURN_IF_ERROR(add_outgoing(mesh_[static_cast<size_t>(p)].get(), p, true));
  for (auto& o : outgoing) o->attempt();

  // Each accepted connection says who it is in its hello's first 8 bytes (magic, rank): the ring's
  // left neighbor or a mesh peer below this rank.
  struct Incoming {
    tcp::socket socket;
    std::array<uint32_t, 2> first{};
    std::array<uint8_t, 8> token{};  // plaintext hellos: the rest of ring_handshake::PlainHello
  };
  int accepts_left = 1 + mesh_down;
  // Every accepted connection still reading its hello: closed before Connect returns, so that no
  // handler of this frame's runs after it (Abort does not know these sockets).
  std::vector<std::shared_ptr<Incoming>> incoming;
  std::function<void()> accept_next = [&] {
    if (accepts_left == 0) return;
    auto in = std::make_shared<Incoming>(Incoming{tcp::socket(io_)});
    incoming.push_back(in);
    acceptor_.async_accept(in->socket, [&, in](const boost::system::error_code& e) {
      if (e) {
        failure = UnavailableError("accepting a ring connection failed: " + e.message());
        return;
      }
      --accepts_left;
      accept_next();
      SetSocketOptions(in->socket);
      // A connection that is not of this ring (another job's rank on a reused port, a port
      // scanner) is closed and another is awaited, instead of failing the ring.
      auto drop = [&, in](const std::string& why) {
        boost::system::error_code ignore;
        const auto remote = in->socket.remote_endpoint(ignore);
        GRADSYNC_LOG(WARNING) << "rank " << rank_ << ": dropped a ring connection from "
                              << (ignore ? std::string("?") : remote.address().to_string() + ":" + std::to_string(remote.port()))
                              << ": " << why;
        in->socket.close(ignore);
        if (accepts_left++ == 0) accept_next();
      };
      auto place = [&, in, drop](const boost::system::error_code& re) {
        const uint32_t magic = in->first[0], claimed = in->first[1];
        const bool mesh = magic == ring_handshake::kPlainMeshHelloMagic || magic == ring_handshake::kMeshHelloMagic;
        const bool authenticating = magic == ring_handshake::kHelloMagic || magic == ring_handshake::kMeshHelloMagic;
        // Where it goes: the mesh link of the rank it claims to be, else the ring's left.
        Link* link = &left_;
        int peer = left;
        if (mesh) {
          if (claimed >= static_cast<uint32_t>(size_) || static_cast<int>(claimed) >= rank ||
              !mesh_[claimed] || mesh_[claimed]->ready || mesh_[claimed]->socket.is_open()) {
            failure = InvalidArgumentError("rank " + std::to_string(rank_) + " got a mesh connection from a peer calling itself rank " +
                                           std::to_string(claimed) + ", which it does not pair with (or twice)");
            return;
          }
          link = mesh_[claimed].get();
          peer = static_cast<int>(claimed);
        } else if (left_.socket.is_open()) {
          failure = InvalidArgumentError("rank " + std::to_string(rank_) + " got a second connection claiming to be its left neighbor");
          return;
        }
        link->socket = std::move(in->socket);
        if (re) {
          failure = UnavailableError("hello from rank " + std::to_string(peer) + " failed: " + re.message());
          return;
        }
        if (security_.authenticate) {
          std::memcpy(&link->handshake.hello, in->first.data(), 8);
          return HandshakeAsAcceptor(*link, peer, mesh, context, &failure);
        }
        if (authenticating) {
          failure = InvalidArgumentError("ring authentication refused on rank " + std::to_string(rank_) + ": rank " +
                                         std::to_string(peer) + " (" + peers_[peer] +
                                         ") authenticates the ring (--auth-dir) but this worker has no --auth-dir; "
                                         "every worker of the job needs the same --auth-dir");
        } else if ((magic != ring_handshake::kPlainHelloMagic && !mesh) || static_cast<int>(claimed) != peer) {
          failure = InvalidArgumentError("the ring's left neighbor should be rank " + std::to_string(left) +
                                         " but a peer introduced itself as rank " + std::to_string(claimed));
        } else {
          link->ready = true;
        }
      };
      asio::async_read(in->socket, asio::buffer(in->first), [&, in, drop, place](const boost::system::error_code& re, size_t) {
        if (re == asio::error::operation_aborted) return;  // Connect is giving up on it
        const uint32_t magic = in->first[0];
        const bool plain = ring_handshake::IsPlainHelloMagic(magic);
        // (An authenticating ring refuses what does not authenticate in its handshake, naming it.)
        if (!security_.authenticate &&
            (re || (!plain && magic != ring_handshake::kHelloMagic && magic != ring_handshake::kMeshHelloMagic))) {
          return drop(re ? "no hello (" + re.message() + ")" : "not a ring hello");
        }
        if (!plain || security_.authenticate) return place(re);  // refused there, saying why
        asio::async_read(in->socket, asio::buffer(in->token), [&, in, drop, place](const boost::system::error_code& te, size_t) {
          if (te == asio::error::operation_aborted) return;
          if (te) return drop("no ring token (" + te.message() + ")");
          if (in->token != token) return drop("another ring's hello (not this job's members)");
          place(te);
        });
      });
    });
  };
  accept_next();
  auto all_ready = [&] {
    if (!left_.ready || !right_.ready) return false;
    for (const auto& link : mesh_) {
      if (link && !link->ready) return false;
    }
    return true;
  };
  io_.restart();
  while (!all_ready() && failure.ok()) {
    if (io_.run_one_until(deadline) == 0 || Clock::now() > deadline) {
      if (all_ready()) break;
      std::string missing;
      for (int p = 0; p < size_; ++p) {
        if (mesh_[static_cast<size_t>(p)] && !mesh_[static_cast<size_t>(p)]->ready) missing += " " + std::to_string(p);
      }
      failure = DeadlineExceededError("ring set-up on rank " + std::to_string(rank) + " timed out after " +
                                      SecondsText(timeout_s) + " s (right " + peers[right] + (right_.ready ? " ok" : " missing") +
                                      ", left " + peers[left] + (left_.ready ? " ok" : " missing") +
                                      (missing.empty() ? "" : ", mesh peers" + missing + " missing") + ")");
    }
  }
  boost::system::error_code ignore;
  for (auto& in : incoming) in->socket.close(ignore);
  if (!failure.ok()) return Fail(failure);
  acceptor_.close(ignore);
  // Handlers that never ran (the accept loop's last async_accept) hold captures of this frame.
  io_.restart();
  io_.poll();
  shm_ready_ = false;
  shm_why_not_ = options_.shm ? "the ring is encrypted (--ring-encrypt keeps every byte on encrypted TCP)" : "off (--allreduce-shm=false)";
  if (options_.shm && !security_.encrypt) RETURN_IF_ERROR(SetUpSharedMemory().WithContext("shared-memory set-up"));
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

std::string RingCollective::AuthFailure(const Link& link, int peer, bool accepted_side, const std::string& why) const {
  std::string from;
  if (accepted_side) {
    // The connection may not be from the rank the ring expects there: say where it came from.
    boost::system::error_code ec;
    const auto remote = link.socket.remote_endpoint(ec);
    if (!ec) from = ", connection from " + remote.address().to_string() + ":" + std::to_string(remote.port());
  }
  return "ring authentication failed between rank " + std::to_string(rank_) + " and rank " + std::to_string(peer) + " (" +
         peers_[peer] + from + "): " + why;
}

// The connector's half (wire format in ARCHITECTURE.md): hello with its nonce; the acceptor's
// nonce and proof; this side's verdict and proof; the acceptor's verdict. Each side checks
// the other's proof, so a refusal is reported on both, each naming the other.
void RingCollective::HandshakeAsConnector(Link& link, int peer, bool mesh, const std::array<uint8_t, 32>& context,
                                          Status* failure) {
  using namespace ring_handshake;
  auto fail = [this, &link, peer, failure](const std::string& why) {
    if (failure->ok()) *failure = InvalidArgumentError(AuthFailure(link, peer, false, why));
  };
  auto io_fail = [fail](const char* during, const boost::system::error_code& e) {
    fail(e == asio::error::eof ? std::string("it closed the connection during the handshake (") + during +
                                     "): a worker without --auth-dir, or one that refused this one"
                               : std::string(during) + ": " + e.message());
  };
  HandshakeState& h = link.handshake;
  auto& socket = link.socket;
  const uint32_t flags = security_.encrypt ? kFlagEncrypt : 0;
  h.hello = Hello{mesh ? kMeshHelloMagic : kHelloMagic, static_cast<uint32_t>(rank_), flags, kVersion, RandomNonce()};
  asio::async_write(socket, asio::buffer(&h.hello, sizeof(h.hello)), [=, this, &h, &socket, &link](const boost::system::error_code& e, size_t) {
    if (e) return io_fail("sending the hello", e);
    asio::async_read(socket, asio::buffer(&h.reply, sizeof(h.reply)), [=, this, &h, &socket, &link](const boost::system::error_code& e2, size_t) {
      if (e2) return io_fail("waiting for its proof", e2);
      if (h.reply.magic != kReplyMagic) return fail("it does not speak the ring handshake");
      uint32_t verdict = kAccepted;
      h.transcript = Transcript(context, h.hello, h.reply);
      if (h.reply.version != kVersion) verdict = kBadVersion;
      else if (h.reply.rank != static_cast<uint32_t>(peer)) verdict = kWrongRank;
      else if (h.reply.flags != flags) verdict = kFlagsDiffer;
      else if (!MacEqual(h.reply.mac, AcceptorMac(security_.key, h.transcript))) verdict = kBadProof;
      h.finish = Finish{kFinishMagic, verdict, verdict == kAccepted ? ConnectorMac(security_.key, h.transcript) : Mac{}};
      asio::async_write(socket, asio::buffer(&h.finish, sizeof(h.finish)), [=, this, &h, &socket, &link](const boost::system::error_code& e3, size_t) {
        if (verdict != kAccepted) return fail("this worker refused it: " + VerdictText(verdict));
        if (e3) return io_fail("sending this worker's proof", e3);
        asio::async_read(socket, asio::buffer(&h.verdict, sizeof(h.verdict)), [=, this, &h, &link](const boost::system::error_code& e4, size_t) {
          if (e4) return io_fail("waiting for its verdict", e4);
          if (h.verdict.magic != kVerdictMagic) return fail("it does not speak the ring handshake");
          if (h.verdict.verdict != kAccepted) return fail("it refused this worker: " + VerdictText(h.verdict.verdict));
          if (security_.encrypt) link.stream.Encrypt(DeriveSessionKeys(security_.key, h.transcript, /*connector=*/true));
          link.ready = true;
        });
      });
    });
  });
}

void RingCollective::HandshakeAsAcceptor(Link& link, int peer, bool mesh, const std::array<uint8_t, 32>& context,
                                         Status* failure) {
  using namespace ring_handshake;
  auto fail = [this, &link, peer, failure](const std::string& why) {
    if (failure->ok()) *failure = InvalidArgumentError(AuthFailure(link, peer, true, why));
  };
  auto io_fail = [fail](const char* during, const boost::system::error_code& e) {
    fail(e == asio::error::eof ? std::string("it closed the connection during the handshake (") + during +
                                     "): a worker with other keys, or one that refused this one"
                               : std::string(during) + ": " + e.message());
  };
  HandshakeState& h = link.handshake;
  auto& socket = link.socket;
  const uint32_t flags = security_.encrypt ? kFlagEncrypt : 0;
  // The first 8 bytes (where a plaintext ring's hello has its magic and rank) are in h.hello.
  if (h.hello.magic == kPlainHelloMagic || h.hello.magic == kPlainMeshHelloMagic) {
    return fail("it connected without authentication (no --auth-dir): every worker of the ring needs --auth-dir with "
                "the cluster's keys");
  }
  if (h.hello.magic != (mesh ? kMeshHelloMagic : kHelloMagic)) return fail("it is not a gradsync ring peer (unknown hello)");
  asio::async_read(socket, asio::buffer(reinterpret_cast<char*>(&h.hello) + 8, sizeof(h.hello) - 8),
                   [=, this, &h, &socket, &link](const boost::system::error_code& e2, size_t) {
    if (e2) return io_fail("waiting for its hello", e2);
    h.reply = Reply{kReplyMagic, static_cast<uint32_t>(rank_), flags, kVersion, RandomNonce(), Mac{}};
    h.transcript = Transcript(context, h.hello, h.reply);
    h.reply.mac = AcceptorMac(security_.key, h.transcript);
    asio::async_write(socket, asio::buffer(&h.reply, sizeof(h.reply)), [=, this, &h, &socket, &link](const boost::system::error_code& e3, size_t) {
      if (e3) return io_fail("sending this worker's proof", e3);
      asio::async_read(socket, asio::buffer(&h.finish, sizeof(h.finish)), [=, this, &h, &socket, &link](const boost::system::error_code& e4, size_t) {
        if (e4) return io_fail("waiting for its proof", e4);
        if (h.finish.magic != kFinishMagic) return fail("it does not speak the ring handshake");
        if (h.finish.verdict != kAccepted) return fail("it refused this worker: " + VerdictText(h.finish.verdict));
        uint32_t verdict = kAccepted;
        if (h.hello.version != kVersion) verdict = kBadVersion;
        else if (h.hello.rank != static_cast<uint32_t>(peer)) verdict = kWrongRank;
        else if (h.hello.flags != flags) verdict = kFlagsDiffer;
        else if (!MacEqual(h.finish.mac, ConnectorMac(security_.key, h.transcript))) verdict = kBadProof;
        h.verdict = VerdictMsg{kVerdictMagic, verdict};
        asio::async_write(socket, asio::buffer(&h.verdict, sizeof(h.verdict)), [=, this, &h, &link](const boost::system::error_code& e5, size_t) {
          if (verdict != kAccepted) return fail("this worker refused it: " + VerdictText(verdict));
          if (e5) return io_fail("sending this worker's verdict", e5);
          if (security_.encrypt) link.stream.Encrypt(DeriveSessionKeys(security_.key, h.transcript, /*connector=*/false));
          link.ready = true;
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
  return PeerExchange(op, step, send ? (rank_ + 1) % size_ : -1, send, send_bytes, recv ? (rank_ - 1 + size_) % size_ : -1,
                      recv, recv_bytes, on_segment, recv_reuse);
}

Status RingCollective::PeerExchange(OpKind op, uint32_t step, int to, const void* send, size_t send_bytes, int from,
                                    void* recv, size_t recv_bytes,
                                    const std::function<void(size_t, size_t)>& on_segment, bool recv_reuse) {
  const bool do_send = to >= 0, do_recv = from >= 0;
  const uint32_t algo = op == OpKind::kAllReduce ? static_cast<uint32_t>(algo_now_) : 0;
  StepHeader out{kStepMagic, static_cast<uint32_t>(op), seq_, step, algo, send_bytes};
  StepHeader in{};
  bool wdone = !do_send, rdone = !do_recv;
  Status failure;
  auto peer_error = [&](int peer, const boost::system::error_code& e) {
    if (failure.ok()) failure = PeerError(peer, e, Where(op, step));
  };
  // A swap with one peer goes in lockstep: segments of exchange_segment_bytes both ways, the
  // next one sent only once the peer's previous one has arrived (its reads are never held back,
  // so two ranks that both wait for the other's segment always have it on the way).
  const size_t lock_seg = options_.exchange_segment_bytes;
  const bool lockstep = lock_seg > 0 && do_send && do_recv && to == from && send_bytes > lock_seg;
  // Reads no larger than the lockstep segment (else both ranks could wait for a whole read
  // segment that the other holds back), nor than segment_bytes (ReceiveReducing's scratch).
  const size_t read_seg = lockstep ? std::min(lock_seg, options_.segment_bytes) : options_.segment_bytes;
  size_t sent = 0, received = 0;
  bool write_held = false;
  std::function<void()> write_next;
  auto may_write = [&] { return rdone || received + lock_seg >= sent; };
  if (do_send && !lockstep) {
    SendStream(to).AsyncWrite({asio::buffer(&out, sizeof(out)), asio::buffer(send ? send : empty_, send_bytes)},
                              [&](const boost::system::error_code& e, size_t n) {
      if (e) return peer_error(to, e);
      bytes_sent_ += n;
      wdone = true;
    });
  } else if (lockstep) {
    write_next = [&] {
      write_held = false;
      const size_t len = std::min(lock_seg, send_bytes - sent);
      std::vector<asio::const_buffer> buffers;
      if (sent == 0) buffers.push_back(asio::buffer(&out, sizeof(out)));
      buffers.push_back(asio::buffer(static_cast<const char*>(send) + sent, len));
      SendStream(to).AsyncWrite(std::move(buffers), [&, len](const boost::system::error_code& e, size_t n) {
        if (e) return peer_error(to, e);
        bytes_sent_ += n;
        sent += len;
        if (sent == send_bytes) {
          wdone = true;
        } else if (may_write()) {
          write_next();
        } else {
          write_held = true;
        }
      });
    };
    write_next();
  }
  // read_from(off, have): the segment at `off`, whose first `have` bytes are already in place.
  // (Everything the handlers use lives at this scope: they run inside this call.)
  auto segment_at = [&](size_t off) { return static_cast<char*>(recv) + (recv_reuse ? 0 : off); };
  std::function<void(size_t, size_t)> read_from;
  RingStream* const in_stream = do_recv ? &RecvStream(from) : nullptr;
  if (do_recv) {
    read_from = [&](size_t off, size_t have) {
      if (off == recv_bytes) {
        rdone = true;
        return;
      }
      const size_t len = std::min(read_seg, recv_bytes - off);
      in_stream->AsyncRead(asio::buffer(segment_at(off) + have, len - have),
                       [&, off, len](const boost::system::error_code& e, size_t n) {
                         if (e) return peer_error(from, e);
                         bytes_received_ += n;
                         if (on_segment) on_segment(off, len);
                         received = off + len;
                         read_from(off + len, 0);
                         if (write_held && may_write()) write_next();
                       });
    };
    // The header, and with it whatever of the first segment has arrived: a small step's data
    // comes in the same receive call.
    in_stream->AsyncReadHeader(asio::buffer(&in, sizeof(in)),
                           asio::buffer(segment_at(0), std::min(read_seg, recv_bytes)),
                           [&](const boost::system::error_code& e, size_t n) {
      if (e) return peer_error(from, e);
      bytes_received_ += n;
      if (Status s = CheckHeader(in, op, step, algo, recv_bytes, from); !s.ok()) {
        failure = s;
        return;
      }
      read_from(0, n - sizeof(in));
      if (write_held && may_write()) write_next();  // an empty receive is done at its header
    });
  }
  const auto deadline = Deadline(options_.timeout_s);
  io_.restart();
  while (!(wdone && rdone) && failure.ok()) {
    if (RunOne(deadline) == 0 && !(wdone && rdone) && failure.ok()) {
      failure = DeadlineExceededError(std::string("no progress for ") + SecondsText(options_.timeout_s) + " s during " +
                                      Where(op, step) + (rdone ? "" : " (waiting for rank " + std::to_string(from) + ")") +
                                      (wdone ? "" : " (sending to rank " + std::to_string(to) + ")"));
    }
  }
  if (!failure.ok()) return Fail(failure);
  return OkStatus();
}

Status RingCollective::CheckHeader(const StepHeader& in, OpKind op, uint32_t step, uint32_t algo, size_t bytes,
                                   int from) const {
  if (in.magic == kStepMagic && in.op == static_cast<uint32_t>(op) && in.seq == seq_ && in.algo != algo &&
      op == OpKind::kAllReduce) {
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

Status RingCollective::AllReduce(FloatSpan data, ReduceOp op) {
  RETURN_IF_ERROR(Begin(OpKind::kAllReduce));
  if (size_ == 1 || data.empty()) return OkStatus();
  RETURN_IF_ERROR(AllReduceWith(data.data(), data.size(), sizeof(float), AddFloats, SumFloats));
  if (op == ReduceOp::kAverage) Scale(data, 1.0f / static_cast<float>(size_));
  return OkStatus();
}

Status RingCollective::AllReduce16(std::span<uint16_t> data, Float16 format) {
  RETURN_IF_ERROR(Begin(OpKind::kAllReduce));
  if (size_ == 1 || data.empty()) return OkStatus();
  if (format == Float16::kBfloat16) {
    return AllReduceWith(data.data(), data.size(), sizeof(uint16_t), [](void* acc, const void* x, size_t k) {
      AddBf16s(static_cast<uint16_t*>(acc), static_cast<const uint16_t*>(x), k);
    });
  }
  return AllReduceWith(data.data(), data.size(), sizeof(uint16_t), [](void* acc, const void* x, size_t k) {
    AddHalves(static_cast<uint16_t*>(acc), static_cast<const uint16_t*>(x), k);
  });
}

Status RingCollective::AllReduceWith(void* data, size_t count, size_t elem, const Reducer& reduce, ShmGroup::Adder add) {
  // Shared memory when every rank is on this host; across hosts with several ranks on one, the
  // hierarchy; else the TCP algorithms (the simulator makes the same choice).
  const AllReduceAlgo algo = ResolveAllReduceAlgo(
      {options_.algorithm, static_cast<int>(host_groups_.size()), shm_ready_, oversubscribed_}, count * elem, size_);
  algo_now_ = last_algorithm_ = algo;
  if ((algo == AllReduceAlgo::kShm || algo == AllReduceAlgo::kHier) && !shm_ready_) {
    return Fail(FailedPreconditionError(std::string("--allreduce-algo=") + AllReduceAlgoName(algo) +
                                        " needs shared memory between this host's ranks: " + shm_why_not_));
  }
  switch (algo) {
    case AllReduceAlgo::kShm:
      if (host_groups_.size() != 1) {
        return Fail(FailedPreconditionError("--allreduce-algo=shm needs every rank on one host; these span " +
                                            std::to_string(host_groups_.size()) + " (use hier or auto)"));
      }
      if (Status s = shm_->AllReduce(data, count, elem, reduce, options_.timeout_s, add); !s.ok()) return Fail(s);
      return OkStatus();
    case AllReduceAlgo::kHier: return Hierarchical(data, count, elem, reduce, add);
    case AllReduceAlgo::kRing: return RingSteps(OpKind::kAllReduce, data, elem, reduce, RingAllReducePlan(rank_, size_, count));
    default: return RunPlan(AllReducePlan(algo, rank_, size_, count), data, elem, reduce);
  }
}

Status RingCollective::CheckBounds(std::span<const size_t> bounds, size_t count) const {
  if (bounds.empty()) return OkStatus();
  bool ok = bounds.size() == static_cast<size_t>(size_) + 1 && bounds.front() == 0 && bounds.back() == count;
  for (size_t i = 1; ok && i < bounds.size(); ++i) ok = bounds[i - 1] <= bounds[i];
  if (!ok) {
    return InvalidArgumentError("chunk bounds must be " + std::to_string(size_ + 1) + " non-decreasing offsets from 0 to " +
                                std::to_string(count));
  }
  return OkStatus();
}

// Across hosts: the host's ranks reduce into their leader through shared memory, the leaders
// all-reduce around their own ring over TCP, and each leader broadcasts the result back
// (HierarchicalPlan).
Status RingCollective::Hierarchical(void* data, size_t count, size_t elem, const Reducer& reduce, ShmGroup::Adder add) {
  const Plan plan = HierarchicalPlan(rank_, host_groups_, count);
  std::span<const PlanStep> ring(plan);
  if (!ring.empty() && ring.front().shm == PlanStep::Shm::kReduce) {
    if (Status s = shm_->Reduce(data, count, elem, reduce, options_.timeout_s, add); !s.ok()) return Fail(s);
    ring = ring.subspan(1);
  }
  const bool broadcast = !ring.empty() && ring.back().shm == PlanStep::Shm::kBroadcast;
  if (broadcast) ring = ring.first(ring.size() - 1);
  RETURN_IF_ERROR(RingSteps(OpKind::kAllReduce, data, elem, reduce, ring));
  if (broadcast) {
    if (Status s = shm_->Broadcast(data, count * elem, options_.timeout_s); !s.ok()) return Fail(s);
  }
  return OkStatus();
}

// Every host's leader creates its group's region; the ranks learn every leader's (name, nonce)
// over the ring, the others attach, and every rank learns every rank's verdict: shared memory is
// used only if every host that has several ranks could set it up, so that all ranks agree.
Status RingCollective::SetUpSharedMemory() {
  const auto& group = host_groups_[static_cast<size_t>(my_group_)];
  const int index = static_cast<int>(std::find(group.begin(), group.end(), rank_) - group.begin());
  const int members = static_cast<int>(group.size());
  uint64_t nonce = 0;
  std::string mine, failure;
  if (members > 1 && index == 0) {
    nonce = (static_cast<uint64_t>(std::random_device{}()) << 32) | std::random_device{}();
    auto g = ShmGroup::Create(members, options_.shm_block_bytes, nonce);
    if (g.ok()) {
      shm_ = std::move(g).value();
      mine = shm_->name() + " " + std::to_string(nonce);
    } else {
      failure = g.status().message();
    }
  }
  std::vector<std::vector<std::byte>> all;
  RETURN_IF_ERROR(AllGather(std::as_bytes(std::span<const char>(mine.data(), mine.size())), &all));
  if (members > 1 && index > 0) {
    const auto& offer = all[static_cast<size_t>(group.front())];
    std::istringstream in(std::string(reinterpret_cast<const char*>(offer.data()), offer.size()));
    std::string name;
    if (!(in >> name >> nonce)) {
      failure = "rank " + std::to_string(group.front()) + " offers no shared memory";
    } else if (auto g = ShmGroup::Attach(name, members, index, options_.shm_block_bytes, nonce); g.ok()) {
      shm_ = std::move(g).value();
    } else {
      failure = g.status().message();
    }
  }
  std::vector<std::vector<std::byte>> verdicts;
  RETURN_IF_ERROR(AllGather(std::as_bytes(std::span<const char>(failure.data(), failure.size())), &verdicts));
  if (shm_ && index == 0) shm_->Unpublish();  // every member has mapped it (or given up)
  shm_why_not_.clear();
  for (size_t r = 0; r < verdicts.size(); ++r) {
    if (!verdicts[r].empty()) {
      shm_why_not_ += (shm_why_not_.empty() ? "" : "; ") + std::string("rank ") + std::to_string(r) + ": " +
                      std::string(reinterpret_cast<const char*>(verdicts[r].data()), verdicts[r].size());
    }
  }
  bool any_shared = false;
  for (const auto& g : host_groups_) any_shared |= g.size() > 1;
  if (!any_shared && shm_why_not_.empty()) shm_why_not_ = "no host runs more than one rank";
  shm_ready_ = shm_why_not_.empty();
  if (!shm_ready_) {
    shm_.reset();
  } else if (shm_) {
    std::vector<std::string> names;
    for (int r : group) names.push_back("rank " + std::to_string(r));
    shm_->set_member_names(std::move(names));
  }
  return OkStatus();
}

Status RingCollective::ReduceScatter(FloatSpan data, ReduceOp op, std::span<const size_t> bounds) {
  RETURN_IF_ERROR(CheckBounds(bounds, data.size()));
  RETURN_IF_ERROR(Begin(OpKind::kReduceScatter));
  if (size_ == 1 || data.empty()) return OkStatus();
  RETURN_IF_ERROR(RingSteps(OpKind::kReduceScatter, data.data(), sizeof(float), AddFloats,
                            RingPlan(rank_, size_, data.size(), 0, size_ - 1, bounds)));
  if (op == ReduceOp::kAverage) {
    const size_t b = bounds.empty() ? ChunkBegin(data.size(), size_, rank_) : bounds[rank_];
    const size_t e = bounds.empty() ? ChunkBegin(data.size(), size_, rank_ + 1) : bounds[rank_ + 1];
    Scale(data.subspan(b, e - b), 1.0f / static_cast<float>(size_));
  }
  return OkStatus();
}

Status RingCollective::AllGatherChunks(FloatSpan data, std::span<const size_t> bounds) {
  RETURN_IF_ERROR(CheckBounds(bounds, data.size()));
  RETURN_IF_ERROR(Begin(OpKind::kAllGatherChunks));
  if (size_ == 1 || data.empty()) return OkStatus();
  return RingSteps(OpKind::kAllGatherChunks, data.data(), sizeof(float), nullptr,
                   RingPlan(rank_, size_, data.size(), size_ - 1, 2 * (size_ - 1), bounds));
}

// The ring steps run as one stream in each direction. Step t receives chunk recv(t) and sends
// chunk send(t), and send(t + 1) == recv(t): so each received segment, once reduced
// (reduce-scatter, steps < n - 1) or stored (all-gather), is queued at once as the next step's
// outgoing segment, while it is still in cache. The writer may lag the reader by at most one
// step (the reader waits before a new step until the writer has sent everything of the steps
// before), which keeps a chunk from being overwritten while it is still queued for sending. A
// reader that has to wait is resumed by the write that lets it go on: no polling.
Status RingCollective::RingSteps(OpKind op, void* data, size_t elem, const Reducer& reduce,
                                 std::span<const PlanStep> plan) {
  char* d = static_cast<char*>(data);
  const int steps = static_cast<int>(plan.size());
  if (steps == 0) return OkStatus();
  auto begin_of = [&](const ElementRange& c) { return c.begin * elem; };  // in bytes
  auto bytes_of = [&](const ElementRange& c) { return c.size() * elem; };
  auto tag = [&](int t) { return plan[static_cast<size_t>(t)].tag; };
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
  const int left = plan.front().from, right = plan.front().to;
  RingStream& to_right = SendStream(right);
  RingStream& from_left = RecvStream(left);
  const uint32_t algo = op == OpKind::kAllReduce ? static_cast<uint32_t>(algo_now_) : 0;
  auto peer_error = [&](int peer, const boost::system::error_code& e, int t) {
    if (failure.ok()) failure = PeerError(peer, e, Where(op, tag(t)));
  };
  std::function<void()> resume_reader;  // a read_step waiting for the writer
  int reader_waits_for = -1;
  auto advance_writer_mark = [&] {
    while (writer_done_through + 1 < steps && step_queued[writer_done_through + 1] &&
           pieces_left[writer_done_through + 1] == 0) {
      ++writer_done_through;
    }
    if (resume_reader && writer_done_through >= reader_waits_for) {
      auto go = std::move(resume_reader);
      resume_reader = nullptr;
      go();
    }
  };
  std::function<void()> pump = [&] {
    if (writing || queue.empty() || !failure.ok()) return;
    writing = true;
    Piece p = queue.front();
    to_right.AsyncWrite({asio::buffer(p.data, p.len)}, [&, p](const boost::system::error_code& e, size_t w) {
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
    const ElementRange& c = plan[static_cast<size_t>(t)].send;
    headers.push_back({kStepMagic, static_cast<uint32_t>(op), seq_, tag(t), algo, bytes_of(c)});
    enqueue(&headers.back(), sizeof(StepHeader), t);
  };
  // The first step sends this rank's starting chunk, whole; every later step sends what the step
  // before received (RingPlan), queued as it arrives.
  {
    const ElementRange& c = plan.front().send;
    start_step_send(0);
    if (bytes_of(c) > 0) enqueue(d + begin_of(c), bytes_of(c), 0);
    step_queued[0] = true;
  }

  StepHeader in{};
  int reading = 0;
  bool all_read = false;
  std::function<void()> read_step;
  std::function<void(size_t)> read_segment = [&](size_t off) {
    const int t = reading;
    const ElementRange& c = plan[static_cast<size_t>(t)].recv;
    const size_t total = bytes_of(c);
    if (off == total) {
      if (t + 1 < steps) step_queued[t + 1] = true;
      reading = t + 1;
      if (reading == steps) all_read = true;
      advance_writer_mark();
      if (!all_read) read_step();
      return;
    }
    const size_t len = std::min(seg, total - off);
    char* dst = d + begin_of(c) + off;
    const bool reducing = plan[static_cast<size_t>(t)].reduce;
    void* target = reducing ? static_cast<void*>(scratch_.data()) : static_cast<void*>(dst);
    from_left.AsyncRead(asio::buffer(target, len), [&, t, off, len, dst, reducing](const boost::system::error_code& e, size_t got) {
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
      reader_waits_for = t - 1;
      resume_reader = [&] { read_step(); };
      return;
    }
    from_left.AsyncRead(asio::buffer(&in, sizeof(in)), [&, t](const boost::system::error_code& e, size_t got) {
      if (e) return peer_error(left, e, t);
      bytes_received_ += got;
      if (Status s = CheckHeader(in, op, tag(t), algo, bytes_of(plan[static_cast<size_t>(t)].recv), left); !s.ok()) {
        failure = s;
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
    if (RunOne(deadline) == 0 && failure.ok()) {
      failure = DeadlineExceededError("no progress for " + SecondsText(options_.timeout_s) + " s during " +
                                      Where(op, tag(std::min(reading, steps - 1))) +
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
  // Forwarded segment by segment: a rank passes on each segment as soon as it has it.
  char* p = data.empty() ? reinterpret_cast<char*>(empty_) : reinterpret_cast<char*>(data.data());
  for (const PlanStep& s : BroadcastPlan(rank_, size_, root, data.size_bytes(), options_.segment_bytes)) {
    RETURN_IF_ERROR(PeerExchange(OpKind::kBroadcast, s.tag, s.to, p + s.send.begin, s.send.size(), s.from, p + s.recv.begin,
                                 s.recv.size(), nullptr));
  }
  return OkStatus();
}

Status RingCollective::AllGather(std::span<const std::byte> mine, std::vector<std::vector<std::byte>>* out) {
  RETURN_IF_ERROR(Begin(OpKind::kAllGather));
  const int n = size_, r = rank_;
  out->assign(static_cast<size_t>(n), {});
  (*out)[r].assign(mine.begin(), mine.end());
  if (n == 1) return OkStatus();
  // First every rank's size, around the ring; then the blocks themselves (AllGatherPlan).
  std::vector<uint64_t> sizes(static_cast<size_t>(n), 0);
  sizes[r] = mine.size();
  const Plan plan = AllGatherPlan(r, n);
  for (const PlanStep& s : plan) {
    const size_t send_idx = s.send.begin, recv_idx = s.recv.begin;
    if (s.tag < static_cast<uint32_t>(n - 1)) {
      RETURN_IF_ERROR(PeerExchange(OpKind::kAllGather, s.tag, s.to, &sizes[send_idx], sizeof(uint64_t), s.from,
                                   &sizes[recv_idx], sizeof(uint64_t), nullptr));
      continue;
    }
    if (s.tag == static_cast<uint32_t>(n - 1)) RETURN_IF_ERROR(SizeBlocks(sizes, out));
    auto& sb = (*out)[send_idx];
    auto& rb = (*out)[recv_idx];
    RETURN_IF_ERROR(PeerExchange(OpKind::kAllGather, s.tag, s.to, sb.empty() ? empty_ : sb.data(), sb.size(), s.from,
                                 rb.empty() ? empty_ : rb.data(), rb.size(), nullptr));
  }
  return OkStatus();
}

Status RingCollective::SizeBlocks(std::span<const uint64_t> sizes, std::vector<std::vector<std::byte>>* out) {
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] > (uint64_t{1} << 36)) return Fail(DataLossError("allgather: rank " + std::to_string(i) + " announces " + std::to_string(sizes[i]) + " bytes"));
    if (static_cast<int>(i) != rank_) (*out)[i].resize(sizes[i]);
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
