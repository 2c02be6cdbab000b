// MeshLinks: the connections of one rank: the ring's two (to the right neighbour, from the left)
// and the mesh connections by peer rank (MeshPeers, and the hierarchy's neighbouring leaders).
// It knows which links to open, which stream carries data to or from a peer, whether every link
// is ready, and closes them all; each link's handshake state lives with it while Connect runs.
#pragma once

#include <utility>  // before Boost.Asio 1.74, whose awaitable.hpp forgets it under C++20

#include <array>
#include <boost/asio.hpp>
#include <memory>
#include <string>
#include <vector>

#include "allreduce/ring_security.h"

namespace gradsync {

class MeshTopology;

// The handshake's messages on one connection, alive while Connect runs.
struct HandshakeState {
  ring_handshake::Hello hello{};
  ring_handshake::Reply reply{};
  ring_handshake::Finish finish{};
  ring_handshake::VerdictMsg verdict{};
  std::array<uint8_t, 32> transcript{};
};

// One connection: its socket, the stream every read and write goes through (plain or
// encrypted), and its handshake.
struct Link {
  explicit Link(boost::asio::io_context& io) : socket(io) {}
  boost::asio::ip::tcp::socket socket;
  RingStream stream{socket};
  HandshakeState handshake;
  bool ready = false;
};

class MeshLinks {
 public:
  explicit MeshLinks(boost::asio::io_context& io) : io_(io), left_(io), right_(io) {}

  // Which mesh links to open: this rank connects to its right neighbour and to its mesh peers
  // above it, and accepts its left neighbour and its mesh peers below it. Returns the ranks
  // above to connect to; *mesh_down counts the ones below that will connect here.
  std::vector<int> Plan(const MeshTopology& topology, int* mesh_down);

  Link& left() { return left_; }
  Link& right() { return right_; }
  // The mesh link to `peer` (null where there is none).
  Link* mesh(int peer) { return mesh_[static_cast<size_t>(peer)].get(); }
  // The stream that carries data to / from `peer` (a ring connection where the peer is that
  // neighbour, else the mesh connection).
  RingStream& SendStream(int peer) { return peer == right_peer_ ? right_.stream : mesh_[static_cast<size_t>(peer)]->stream; }
  RingStream& RecvStream(int peer) { return peer == left_peer_ ? left_.stream : mesh_[static_cast<size_t>(peer)]->stream; }

  bool AllReady() const;
  // The mesh peers whose link is not ready, each after a space.
  std::string MissingMesh() const;
  // Closes every connection and forgets its stream's keys and buffers.
  void CloseAll();
  // Wire bytes beyond the plaintext (encrypted frames' headers and tags), each way.
  uint64_t overhead_sent() const;
  uint64_t overhead_received() const;

 private:
  boost::asio::io_context& io_;
  // The ring: this rank sends to the right and receives from the left.
  Link left_;
  Link right_;
  int left_peer_ = -1, right_peer_ = -1;
  // By peer rank: the mesh connections (null where there is none).
  std::vector<std::unique_ptr<Link>> mesh_;
};

}  // namespace gradsync
