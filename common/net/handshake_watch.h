// HandshakeWatch: what ZeroMQ's socket monitor says of a connecting socket's handshakes, read by
// the socket's owner: whether the connection to the peer is up now (its handshake done and no
// disconnection since), and the handshake failure that will not go away, as one line naming the
// peer and the likely cause (kUnauthenticated): the peer refused this process's key, the peers
// disagree on --auth-dir, or with CURVE on a handshake broke off 3 times in a row without one
// succeeding. Socket::WatchHandshakes starts it; the Socket asks it (HandshakeStatus,
// PeerConnected).
//
// Threading: the socket's owner's.
#pragma once

#include <memory>
#include <string>
#include <zmq.hpp>

#include "common/base/status.h"

namespace gradsync {

class HandshakeWatch {
 public:
  // Monitors `socket`'s handshakes (`ctx`: the socket's context; `curve`: this process uses
  // CURVE). `peer_name` and `endpoint` name the peer in the failure's text.
  Status Start(zmq::context_t& ctx, zmq::socket_t& socket, bool curve, const std::string& peer_name,
               const std::string& endpoint);
  // Reads the monitor's events so far: OK, or the handshake failure (which stays).
  Status Read();
  // Whether the connection to the peer is up now (after Read).
  bool connected() const { return connected_; }

 private:
  // A failed handshake's event: `id`, `value` as the monitor gives them.
  void Failed(uint16_t id, uint32_t value);

  std::unique_ptr<zmq::socket_t> monitor_;  // the monitor's events (null: not watching)
  bool curve_ = false;
  std::string peer_name_;
  std::string where_;  // the peer's endpoint, without tcp://
  int broken_ = 0;     // handshakes broken off in a row
  bool connected_ = false;
  Status status_;
};

}  // namespace gradsync
