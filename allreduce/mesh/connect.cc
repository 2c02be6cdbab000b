// MeshConnector: Listen, and Connect's wiring of the ring and mesh connections (connect out
// with retries, accept, tell each accepted connection's kind and rank from its hello, run the
// handshake where the ring authenticates).
#include <cstring>

#include "allreduce/mesh/connector.h"
#include "common/base/clock.h"
#include "common/base/host_port.h"
#include "common/base/logging.h"

namespace gradsync {
namespace asio = boost::asio;
using tcp = asio::ip::tcp;

struct MeshConnector::Outgoing {
  Link* link;
  int peer;
  bool mesh;
  tcp::resolver::results_type endpoints;
  ring_handshake::PlainHello hello;
  std::function<void()> attempt;
};

// Each accepted connection says who it is in its hello's first 8 bytes (magic, rank): the ring's
// left neighbor or a mesh peer below this rank.
struct MeshConnector::Incoming {
  tcp::socket socket;
  std::array<uint32_t, 2> first{};
  std::array<uint8_t, 8> token{};  // plaintext hellos: the rest of ring_handshake::PlainHello
};

struct MeshConnector::Wiring {
  MeshLoop::Clock::time_point deadline;
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

Status MeshConnector::Listen(const std::string& bind_host) {
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

Status MeshConnector::AddOutgoing(Wiring& w, Link* link, int peer, bool mesh) {
  std::string host;
  uint16_t port = 0;
  RETURN_IF_ERROR(ParseHostPort(topology_.address(peer), &host, &port).WithContext("peer " + std::to_string(peer)));
  boost::system::error_code ec;
  tcp::resolver resolver(loop_.io());
  auto endpoints = resolver.resolve(host, std::to_string(port), ec);
  if (ec) return UnavailableError("cannot resolve " + topology_.address(peer) + ": " + ec.message());
  auto o = std::make_unique<Outgoing>(Outgoing{link, peer, mesh, endpoints, {}, nullptr});
  o->hello = {mesh ? ring_handshake::kPlainMeshHelloMagic : ring_handshake::kPlainHelloMagic, static_cast<uint32_t>(topology_.rank()),
              w.token};
  Outgoing* out = o.get();
  out->attempt = [this, &w, out] {
    asio::async_connect(out->link->socket, out->endpoints, [this, &w, out](const boost::system::error_code& e, const tcp::endpoint&) {
      if (e) {
        if (MeshLoop::Clock::now() > w.deadline) {
          w.failure = UnavailableError("cannot connect to rank " + std::to_string(out->peer) + " at " + topology_.address(out->peer) + ": " + e.message());
          return;
        }
        boost::system::error_code ignore;
        out->link->socket.close(ignore);
        loop_.RetryAfter(std::chrono::milliseconds(20), [out] { out->attempt(); });
        return;
      }
      SetSocketOptions(out->link->socket);
      if (security_.authenticate) return handshake_.AsConnector(*out->link, out->peer, out->mesh, w.context, &w.failure);
      asio::async_write(out->link->socket, asio::buffer(&out->hello, sizeof(out->hello)), [&w, out](const boost::system::error_code& we, size_t) {
        if (we) w.failure = UnavailableError("hello to rank " + std::to_string(out->peer) + " failed: " + we.message());
        else out->link->ready = true;
      });
    });
  };
  w.outgoing.push_back(std::move(o));
  return OkStatus();
}

void MeshConnector::AcceptNext(Wiring& w) {
  if (w.accepts_left == 0) return;
  auto in = std::make_shared<Incoming>(Incoming{tcp::socket(loop_.io())});
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

void MeshConnector::ReadHello(Wiring& w, const std::shared_ptr<Incoming>& in) {
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
void MeshConnector::DropIncoming(Wiring& w, const std::shared_ptr<Incoming>& in, const std::string& why) {
  boost::system::error_code ignore;
  const auto remote = in->socket.remote_endpoint(ignore);
  GRADSYNC_LOG(WARNING) << "rank " << topology_.rank() << ": dropped a ring connection from "
                        << (ignore ? std::string("?") : remote.address().to_string() + ":" + std::to_string(remote.port()))
                        << ": " << why;
  in->socket.close(ignore);
  if (w.accepts_left++ == 0) AcceptNext(w);
}

// Where an accepted connection goes: the mesh link of the rank it claims to be, else the ring's left.
void MeshConnector::PlaceIncoming(Wiring& w, const std::shared_ptr<Incoming>& in, const boost::system::error_code& read_error) {
  const uint32_t magic = in->first[0], claimed = in->first[1];
  const bool mesh = magic == ring_handshake::kPlainMeshHelloMagic || magic == ring_handshake::kMeshHelloMagic;
  const bool authenticating = magic == ring_handshake::kHelloMagic || magic == ring_handshake::kMeshHelloMagic;
  Link* link = &links_.left();
  int peer = w.left;
  if (mesh) {
    if (claimed >= static_cast<uint32_t>(topology_.size()) || static_cast<int>(claimed) >= topology_.rank() ||
        !links_.mesh(static_cast<int>(claimed)) || links_.mesh(static_cast<int>(claimed))->ready ||
        links_.mesh(static_cast<int>(claimed))->socket.is_open()) {
      w.failure = InvalidArgumentError("rank " + std::to_string(topology_.rank()) + " got a mesh connection from a peer calling itself rank " +
                                       std::to_string(claimed) + ", which it does not pair with (or twice)");
      return;
    }
    link = links_.mesh(static_cast<int>(claimed));
    peer = static_cast<int>(claimed);
  } else if (links_.left().socket.is_open()) {
    w.failure = InvalidArgumentError("rank " + std::to_string(topology_.rank()) + " got a second connection claiming to be its left neighbor");
    return;
  }
  link->socket = std::move(in->socket);
  if (read_error) {
    w.failure = UnavailableError("hello from rank " + std::to_string(peer) + " failed: " + read_error.message());
    return;
  }
  if (security_.authenticate) {
    std::memcpy(&link->handshake.hello, in->first.data(), 8);
    return handshake_.AsAcceptor(*link, peer, mesh, w.context, &w.failure);
  }
  if (authenticating) {
    w.failure = InvalidArgumentError("ring authentication refused on rank " + std::to_string(topology_.rank()) + ": rank " +
                                     std::to_string(peer) + " (" + topology_.address(peer) +
                                     ") authenticates the ring (--auth-dir) but this worker has no --auth-dir; "
                                     "every worker of the job needs the same --auth-dir");
  } else if ((magic != ring_handshake::kPlainHelloMagic && !mesh) || static_cast<int>(claimed) != peer) {
    w.failure = InvalidArgumentError("the ring's left neighbor should be rank " + std::to_string(w.left) +
                                     " but a peer introduced itself as rank " + std::to_string(claimed));
  } else {
    link->ready = true;
  }
}

MeshConnector::MeshConnector(size_t socket_buffer_bytes, const RingSecurity& security, MeshLoop& loop,
                             const MeshTopology& topology, MeshLinks& links)
    : socket_buffer_bytes_(socket_buffer_bytes),
      security_(security),
      loop_(loop),
      topology_(topology),
      links_(links),
      handshake_(security, topology),
      acceptor_(loop.io()) {}

void MeshConnector::SetSocketOptions(tcp::socket& socket) const {
  boost::system::error_code ignore;  // a kernel that caps or refuses a size keeps its own
  socket.set_option(tcp::no_delay(true), ignore);
  if (socket_buffer_bytes_ > 0) {
    const int bytes = static_cast<int>(std::min<size_t>(socket_buffer_bytes_, size_t{1} << 30));
    socket.set_option(asio::socket_base::send_buffer_size(bytes), ignore);
    socket.set_option(asio::socket_base::receive_buffer_size(bytes), ignore);
  }
}

Status MeshConnector::Start(double timeout_s) {
  wiring_ = std::make_shared<Wiring>();
  Wiring& w = *wiring_;
  w.right = topology_.right();
  w.left = topology_.left();
  w.deadline = MeshLoop::Clock::now() + std::chrono::duration_cast<MeshLoop::Clock::duration>(std::chrono::duration<double>(timeout_s));
  w.context = ring_handshake::RingContext(topology_.peers());
  w.token = ring_handshake::RingToken(w.context);
  int mesh_down = 0;
  const std::vector<int> mesh_up = links_.Plan(topology_, &mesh_down);
  // Connect (retrying while the peer is not listening yet) and accept, all together.
  RETURN_IF_ERROR(AddOutgoing(w, &links_.right(), w.right, false));
  for (int p : mesh_up) RETURN_IF_ERROR(AddOutgoing(w, links_.mesh(p), p, true));
  for (auto& o : w.outgoing) o->attempt();
  w.accepts_left = 1 + mesh_down;
  AcceptNext(w);
  return OkStatus();
}

Status MeshConnector::Wait(double timeout_s) {
  Wiring& w = *wiring_;
  boost::asio::io_context& io = loop_.io();
  io.restart();
  while (!links_.AllReady() && w.failure.ok()) {
    if (io.run_one_until(w.deadline) == 0 || MeshLoop::Clock::now() > w.deadline) {
      if (links_.AllReady()) break;
      const std::string missing = links_.MissingMesh();
      w.failure = DeadlineExceededError("ring set-up on rank " + std::to_string(topology_.rank()) + " timed out after " +
                                        SecondsText(timeout_s) + " s (right " + topology_.address(w.right) +
                                        (links_.right().ready ? " ok" : " missing") + ", left " + topology_.address(w.left) +
                                        (links_.left().ready ? " ok" : " missing") +
                                        (missing.empty() ? "" : ", mesh peers" + missing + " missing") + ")");
    }
  }
  boost::system::error_code ignore;
  for (auto& in : w.incoming) in->socket.close(ignore);
  if (!w.failure.ok()) return w.failure;
  acceptor_.close(ignore);
  // Handlers that never ran (the accept loop's last async_accept) hold references to `w`.
  loop_.Drain();
  return OkStatus();
}

void MeshConnector::Close() {
  boost::system::error_code ignore;
  acceptor_.close(ignore);
}

}  // namespace gradsync
