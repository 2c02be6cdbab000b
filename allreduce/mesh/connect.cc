// PeerMesh's set-up: Listen, and Connect's wiring of the ring and mesh connections (connect out
// with retries, accept, tell each accepted connection's kind and rank from its hello, run the
// handshake where the ring authenticates).
#include <cstring>
#include <thread>

#include "allreduce/mesh/peer_mesh.h"
#include "common/base/clock.h"
#include "common/base/host_port.h"
#include "common/base/logging.h"

namespace gradsync {
namespace asio = boost::asio;
using tcp = asio::ip::tcp;

struct PeerMesh::Outgoing {
  Link* link;
  int peer;
  bool mesh;
  tcp::resolver::results_type endpoints;
  ring_handshake::PlainHello hello;
  std::function<void()> attempt;
};

// Each accepted connection says who it is in its hello's first 8 bytes (magic, rank): the ring's
// left neighbor or a mesh peer below this rank.
struct PeerMesh::Incoming {
  tcp::socket socket;
  std::array<uint32_t, 2> first{};
  std::array<uint8_t, 8> token{};  // plaintext hellos: the rest of ring_handshake::PlainHello
};

struct PeerMesh::Wiring {
  Clock::time_point deadline;
  std::array<uint8_t, 32> context{};
  std::array<uint8_t, 8> token{};
  int left = 0, right = 0;
  Status failure;
  std::vector<std::unique_ptr<Outgoing>> outgoing;
  int accepts_left = 0;
  // Every accepted connection still reading its hello: closed before Connect returns, so that no
  // handler of Connect's runs after it (Abort does not know these sockets).
  std::vector<std::shared_ptr<Incoming>> incoming;
};

Status PeerMesh::Listen(const std::string& bind_host) {
  if (security_.encrypt && !security_.authenticate) {
    return InvalidArgumentError("an encrypted ring needs the ring key (--ring-encrypt needs --auth-dir)");
  }
  boost::system::error_code ec;
  auto address = asio::ip::make_address(bind_host, ec);
  if (ec) return InvalidArgumentError("bad bind address '" + bind_host + "': " + ec.message());
  tcp::endpoint ep(address, 0);
  acceptor_.open(ep.protocol(), ec);
  if (!ec) acceptor_.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) acceptor_.bind(ep, ec);
  if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return UnavailableError("cannot listen on " + bind_host + ": " + ec.message());
  port_ = acceptor_.local_endpoint().port();
  return OkStatus();
}

// The hosts, by the host part of the ranks' addresses: each host's ranks in rank order (its
// leader first). Auto's choice looks at this host's ranks against its cores.
void PeerMesh::GroupHosts(const std::vector<std::string>& peers) {
  hosts_.clear();
  std::vector<std::string> names;
  std::string host;
  uint16_t port = 0;
  for (int i = 0; i < size_; ++i) {
    if (!ParseHostPort(peers[i], &host, &port).ok()) host = peers[i];
    auto at = std::find(names.begin(), names.end(), host);
    if (at == names.end()) {
      names.push_back(host);
      hosts_.push_back({i});
    } else {
      hosts_[static_cast<size_t>(at - names.begin())].push_back(i);
    }
  }
  for (size_t g = 0; g < hosts_.size(); ++g) {
    if (std::find(hosts_[g].begin(), hosts_[g].end(), rank_) != hosts_[g].end()) my_host_ = static_cast<int>(g);
  }
  oversubscribed_ = Oversubscribed(hosts_[static_cast<size_t>(my_host_)].size(), std::thread::hardware_concurrency());
}

// This rank connects to its right neighbor and to its mesh peers above it, and accepts its left
// neighbor and its mesh peers below it.
std::vector<int> PeerMesh::PlanMeshLinks(int* mesh_down) {
  std::vector<int> mesh_up;
  *mesh_down = 0;
  mesh_.clear();
  mesh_.resize(static_cast<size_t>(size_));
  if (size_ <= 2) return mesh_up;
  std::vector<int> pairs = MeshPeers(rank_, size_);
  // Spanning hosts with several ranks on one: the leaders' ring of the hierarchical all-reduce.
  std::vector<int> leaders;
  for (const auto& h : hosts_) leaders.push_back(h.front());
  const bool may_nest = leaders.size() > 1 && leaders.size() < static_cast<size_t>(size_);
  if (auto at = std::find(leaders.begin(), leaders.end(), rank_); may_nest && at != leaders.end()) {
    const size_t i = static_cast<size_t>(at - leaders.begin()), l = leaders.size();
    for (int p : {leaders[(i + 1) % l], leaders[(i + l - 1) % l]}) {
      if (std::find(pairs.begin(), pairs.end(), p) == pairs.end()) pairs.push_back(p);
    }
  }
  for (int p : pairs) {
    mesh_[static_cast<size_t>(p)] = std::make_unique<Link>(io_);
    if (p > rank_) mesh_up.push_back(p);
    else ++*mesh_down;
  }
  return mesh_up;
}

Status PeerMesh::AddOutgoing(Wiring& w, Link* link, int peer, bool mesh) {
  std::string host;
  uint16_t port = 0;
  RETURN_IF_ERROR(ParseHostPort(peers_[peer], &host, &port).WithContext("peer " + std::to_string(peer)));
  boost::system::error_code ec;
  tcp::resolver resolver(io_);
  auto endpoints = resolver.resolve(host, std::to_string(port), ec);
  if (ec) return UnavailableError("cannot resolve " + peers_[peer] + ": " + ec.message());
  auto o = std::make_unique<Outgoing>(Outgoing{link, peer, mesh, endpoints, {}, nullptr});
  o->hello = {mesh ? ring_handshake::kPlainMeshHelloMagic : ring_handshake::kPlainHelloMagic, static_cast<uint32_t>(rank_),
              w.token};
  Outgoing* out = o.get();
  out->attempt = [this, &w, out] {
    asio::async_connect(out->link->socket, out->endpoints, [this, &w, out](const boost::system::error_code& e, const tcp::endpoint&) {
      if (e) {
        if (Clock::now() > w.deadline) {
          w.failure = UnavailableError("cannot connect to rank " + std::to_string(out->peer) + " at " + peers_[out->peer] + ": " + e.message());
          return;
        }
        boost::system::error_code ignore;
        out->link->socket.close(ignore);
        RetryAfter(std::chrono::milliseconds(20), [out] { out->attempt(); });
        return;
      }
      SetSocketOptions(out->link->socket);
      if (security_.authenticate) return HandshakeAsConnector(*out->link, out->peer, out->mesh, w.context, &w.failure);
      asio::async_write(out->link->socket, asio::buffer(&out->hello, sizeof(out->hello)), [&w, out](const boost::system::error_code& we, size_t) {
        if (we) w.failure = UnavailableError("hello to rank " + std::to_string(out->peer) + " failed: " + we.message());
        else out->link->ready = true;
      });
    });
  };
  w.outgoing.push_back(std::move(o));
  return OkStatus();
}

void PeerMesh::AcceptNext(Wiring& w) {
  if (w.accepts_left == 0) return;
  auto in = std::make_shared<Incoming>(Incoming{tcp::socket(io_)});
  w.incoming.push_back(in);
  acceptor_.async_accept(in->socket, [this, &w, in](const boost::system::error_code& e) {
    if (e) {
      w.failure = UnavailableError("accepting a ring connection failed: " + e.message());
      return;
    }
    --w.accepts_left;
    AcceptNext(w);
    SetSocketOptions(in->socket);
    ReadHello(w, in);
  });
}

void PeerMesh::ReadHello(Wiring& w, const std::shared_ptr<Incoming>& in) {
  asio::async_read(in->socket, asio::buffer(in->first), [this, &w, in](const boost::system::error_code& re, size_t) {
    if (re == asio::error::operation_aborted) return;  // Connect is giving up on it
    const uint32_t magic = in->first[0];
    const bool plain = ring_handshake::IsPlainHelloMagic(magic);
    // (An authenticating ring refuses what does not authenticate in its handshake, naming it.)
    if (!security_.authenticate && (re || (!plain && magic != ring_handshake::kHelloMagic && magic != ring_handshake::kMeshHelloMagic))) {
      return DropIncoming(w, in, re ? "no hello (" + re.message() + ")" : "not a ring hello");
    }
    if (!plain || security_.authenticate) return PlaceIncoming(w, in, re);  // refused there, saying why
    asio::async_read(in->socket, asio::buffer(in->token), [this, &w, in](const boost::system::error_code& te, size_t) {
      if (te == asio::error::operation_aborted) return;
      if (te) return DropIncoming(w, in, "no ring token (" + te.message() + ")");
      if (in->token != w.token) return DropIncoming(w, in, "another ring's hello (not this job's members)");
      PlaceIncoming(w, in, te);
    });
  });
}

// A connection that is not of this ring (another job's rank on a reused port, a port scanner)
// is closed and another is awaited, instead of failing the ring.
void PeerMesh::DropIncoming(Wiring& w, const std::shared_ptr<Incoming>& in, const std::string& why) {
  boost::system::error_code ignore;
  const auto remote = in->socket.remote_endpoint(ignore);
  GRADSYNC_LOG(WARNING) << "rank " << rank_ << ": dropped a ring connection from "
                        << (ignore ? std::string("?") : remote.address().to_string() + ":" + std::to_string(remote.port()))
                        << ": " << why;
  in->socket.close(ignore);
  if (w.accepts_left++ == 0) AcceptNext(w);
}

// Where an accepted connection goes: the mesh link of the rank it claims to be, else the ring's left.
void PeerMesh::PlaceIncoming(Wiring& w, const std::shared_ptr<Incoming>& in, const boost::system::error_code& read_error) {
  const uint32_t magic = in->first[0], claimed = in->first[1];
  const bool mesh = magic == ring_handshake::kPlainMeshHelloMagic || magic == ring_handshake::kMeshHelloMagic;
  const bool authenticating = magic == ring_handshake::kHelloMagic || magic == ring_handshake::kMeshHelloMagic;
  Link* link = &left_;
  int peer = w.left;
  if (mesh) {
    if (claimed >= static_cast<uint32_t>(size_) || static_cast<int>(claimed) >= rank_ || !mesh_[claimed] ||
        mesh_[claimed]->ready || mesh_[claimed]->socket.is_open()) {
      w.failure = InvalidArgumentError("rank " + std::to_string(rank_) + " got a mesh connection from a peer calling itself rank " +
                                       std::to_string(claimed) + ", which it does not pair with (or twice)");
      return;
    }
    link = mesh_[claimed].get();
    peer = static_cast<int>(claimed);
  } else if (left_.socket.is_open()) {
    w.failure = InvalidArgumentError("rank " + std::to_string(rank_) + " got a second connection claiming to be its left neighbor");
    return;
  }
  link->socket = std::move(in->socket);
  if (read_error) {
    w.failure = UnavailableError("hello from rank " + std::to_string(peer) + " failed: " + read_error.message());
    return;
  }
  if (security_.authenticate) {
    std::memcpy(&link->handshake.hello, in->first.data(), 8);
    return HandshakeAsAcceptor(*link, peer, mesh, w.context, &w.failure);
  }
  if (authenticating) {
    w.failure = InvalidArgumentError("ring authentication refused on rank " + std::to_string(rank_) + ": rank " +
                                     std::to_string(peer) + " (" + peers_[peer] +
                                     ") authenticates the ring (--auth-dir) but this worker has no --auth-dir; "
                                     "every worker of the job needs the same --auth-dir");
  } else if ((magic != ring_handshake::kPlainHelloMagic && !mesh) || static_cast<int>(claimed) != peer) {
    w.failure = InvalidArgumentError("the ring's left neighbor should be rank " + std::to_string(w.left) +
                                     " but a peer introduced itself as rank " + std::to_string(claimed));
  } else {
    link->ready = true;
  }
}

bool PeerMesh::AllLinksReady() const {
  if (!left_.ready || !right_.ready) return false;
  for (const auto& link : mesh_) {
    if (link && !link->ready) return false;
  }
  return true;
}

Status PeerMesh::WaitForLinks(Wiring& w, double timeout_s) {
  io_.restart();
  while (!AllLinksReady() && w.failure.ok()) {
    if (io_.run_one_until(w.deadline) == 0 || Clock::now() > w.deadline) {
      if (AllLinksReady()) break;
      std::string missing;
      for (int p = 0; p < size_; ++p) {
        if (mesh_[static_cast<size_t>(p)] && !mesh_[static_cast<size_t>(p)]->ready) missing += " " + std::to_string(p);
      }
      w.failure = DeadlineExceededError("ring set-up on rank " + std::to_string(rank_) + " timed out after " +
                                        SecondsText(timeout_s) + " s (right " + peers_[w.right] + (right_.ready ? " ok" : " missing") +
                                        ", left " + peers_[w.left] + (left_.ready ? " ok" : " missing") +
                                        (missing.empty() ? "" : ", mesh peers" + missing + " missing") + ")");
    }
  }
  return w.failure;
}

Status PeerMesh::Connect(int rank, const std::vector<std::string>& peers, double timeout_s) {
  rank_ = rank;
  size_ = static_cast<int>(peers.size());
  peers_ = peers;
  if (size_ < 1 || rank < 0 || rank >= size_) return InvalidArgumentError("rank " + std::to_string(rank) + " of " + std::to_string(size_));
  if (size_ == 1) return OkStatus();
  GroupHosts(peers);
  wiring_ = std::make_shared<Wiring>();
  Wiring& w = *wiring_;
  w.right = (rank + 1) % size_;
  w.left = (rank - 1 + size_) % size_;
  w.deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
  w.context = ring_handshake::RingContext(peers);
  w.token = ring_handshake::RingToken(w.context);
  int mesh_down = 0;
  const std::vector<int> mesh_up = PlanMeshLinks(&mesh_down);
  // Connect (retrying while the peer is not listening yet) and accept, all together.
  RETURN_IF_ERROR(AddOutgoing(w, &right_, w.right, false));
  for (int p : mesh_up) RETURN_IF_ERROR(AddOutgoing(w, mesh_[static_cast<size_t>(p)].get(), p, true));
  for (auto& o : w.outgoing) o->attempt();
  w.accepts_left = 1 + mesh_down;
  AcceptNext(w);
  const Status waited = WaitForLinks(w, timeout_s);
  boost::system::error_code ignore;
  for (auto& in : w.incoming) in->socket.close(ignore);
  if (!waited.ok()) return Fail(waited);
  acceptor_.close(ignore);
  // Handlers that never ran (the accept loop's last async_accept) hold references to `w`.
  io_.restart();
  io_.poll();
  return OkStatus();
}

}  // namespace gradsync
