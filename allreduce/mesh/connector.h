// MeshConnector: wiring one rank's connections at Connect. It listens (an ephemeral port, told to
// the others through the scheduler or directly in tests); connects out to the right neighbour
// and the mesh peers above (retrying while a peer is not listening yet); accepts the left
// neighbour and the mesh peers below, placing each accepted connection by its hello and dropping
// what is not of this ring; runs the handshake where the ring authenticates (MeshHandshake);
// and waits until every link is ready or the deadline passes.
//
// MeshHandshake: the two halves of the ring's authenticated handshake on one connection (wire
// format in ARCHITECTURE.md, "The ring's handshake"): each side proves the ring key over a
// transcript of both hellos and the peer list, checks the other's proof, and tells it the
// verdict; with encryption it derives the connection's session keys.
#pragma once

#include <utility>  // before Boost.Asio 1.74, whose awaitable.hpp forgets it under C++20

#include <array>
#include <boost/asio.hpp>
#include <memory>
#include <string>

#include "allreduce/mesh/links.h"
#include "allreduce/mesh/loop.h"
#include "allreduce/mesh/topology.h"
#include "allreduce/ring_security.h"
#include "common/base/status.h"

namespace gradsync {

class MeshHandshake {
 public:
  MeshHandshake(const RingSecurity& security, const MeshTopology& topology) : security_(security), topology_(topology) {}

  // The two halves on `link` (set `link.ready` or `*failure`); `mesh` says which kind of
  // connection it is (a ring or a mesh hello). The acceptor's half starts after the hello's
  // first 8 bytes, which Connect read to tell the kinds apart.
  void AsConnector(Link& link, int peer, bool mesh, const std::array<uint8_t, 32>& context, Status* failure);
  void AsAcceptor(Link& link, int peer, bool mesh, const std::array<uint8_t, 32>& context, Status* failure);

 private:
  std::string AuthFailure(const Link& link, int peer, bool accepted_side, const std::string& why) const;

  const RingSecurity& security_;
  const MeshTopology& topology_;
};

class MeshConnector {
 public:
  MeshConnector(size_t socket_buffer_bytes, const RingSecurity& security, MeshLoop& loop, const MeshTopology& topology,
                MeshLinks& links);

  Status Listen(const std::string& bind_host);
  uint16_t port() const { return port_; }
  // Starts connecting out and accepting (the topology set, more than one rank); errors here
  // (a peer's address) leave the mesh as it was.
  Status Start(double timeout_s);
  // Waits for every link until the deadline; a failure is the caller's to break the mesh with.
  Status Wait(double timeout_s);
  // Stops accepting.
  void Close();

 private:
  struct Outgoing;
  struct Incoming;
  // What Connect is doing, alive while it runs (its handlers refer to it).
  struct Wiring;

  Status AddOutgoing(Wiring& w, Link* link, int peer, bool mesh);
  void AcceptNext(Wiring& w);
  void ReadHello(Wiring& w, const std::shared_ptr<Incoming>& in);
  void DropIncoming(Wiring& w, const std::shared_ptr<Incoming>& in, const std::string& why);
  void PlaceIncoming(Wiring& w, const std::shared_ptr<Incoming>& in, const boost::system::error_code& read_error);
  // TCP_NODELAY and CollectiveOptions::socket_buffer_bytes on a ring or mesh socket.
  void SetSocketOptions(boost::asio::ip::tcp::socket& socket) const;

  const size_t socket_buffer_bytes_;
  const RingSecurity& security_;
  MeshLoop& loop_;
  const MeshTopology& topology_;
  MeshLinks& links_;
  MeshHandshake handshake_;
  boost::asio::ip::tcp::acceptor acceptor_;
  uint16_t port_ = 0;
  // Connect's wiring (its deadline, failure, connections in flight). Handlers of a connection's
  // handshake hold references into it and may still be queued when Connect returns on a
  // failure (one whose socket was handed on while Fail aborted the others): it lives as long as
  // the mesh, so that Abort's last poll (the destructor's) runs them against a live object.
  std::shared_ptr<Wiring> wiring_;
};

}  // namespace gradsync
