#include "common/net/handshake_watch.h"

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "common/base/logging.h"

namespace gradsync {

Status HandshakeWatch::Start(zmq::context_t& ctx, zmq::socket_t& socket, bool curve, const std::string& peer_name,
                             const std::string& endpoint) {
  static std::atomic<uint64_t> next{0};
  const std::string inproc = "inproc://gradsync-handshakes-" + std::to_string(next.fetch_add(1));
  curve_ = curve;
  peer_name_ = peer_name;
  where_ = endpoint.rfind("tcp://", 0) == 0 ? endpoint.substr(6) : endpoint;
  constexpr int kEvents = ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH |
                          ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |
                          ZMQ_EVENT_DISCONNECTED;
  if (zmq_socket_monitor(socket.handle(), inproc.c_str(), kEvents) != 0) {
    return UnavailableError(std::string("cannot monitor a socket: ") + zmq_strerror(zmq_errno()));
  }
  try {
    auto pair = std::make_unique<zmq::socket_t>(ctx, zmq::socket_type::pair);
    pair->set(zmq::sockopt::linger, 0);
    pair->connect(inproc);
    monitor_ = std::move(pair);
  } catch (const zmq::error_t& e) {
    return UnavailableError(std::string("cannot monitor a socket: ") + e.what());
  }
  return OkStatus();
}

Status HandshakeWatch::Read() {
  if (!monitor_ || !status_.ok()) return status_;
  try {
    zmq::message_t event, address;
    while (monitor_->recv(event, zmq::recv_flags::dontwait)) {
      if (event.more()) (void)monitor_->recv(address, zmq::recv_flags::dontwait);
      if (event.size() < 6) continue;
      uint16_t id = 0;
      uint32_t value = 0;
      std::memcpy(&id, event.data(), 2);
      std::memcpy(&value, static_cast<const char*>(event.data()) + 2, 4);
      switch (id) {
        case ZMQ_EVENT_HANDSHAKE_SUCCEEDED:
          broken_ = 0;
          connected_ = true;
          break;
        case ZMQ_EVENT_DISCONNECTED:
          connected_ = false;
          break;
        default:
          Failed(id, value);
          break;
      }
      if (!status_.ok()) break;
    }
  } catch (const zmq::error_t& e) {
    if (e.num() != ETERM) GRADSYNC_LOG(DEBUG) << "socket monitor: " << e.what();
  }
  return status_;
}

void HandshakeWatch::Failed(uint16_t id, uint32_t value) {
  const std::string peer = "authentication failed with the " + peer_name_ + " at " + where_ + ": ";
  switch (id) {
    case ZMQ_EVENT_HANDSHAKE_FAILED_AUTH:
      // The peer's ZAP handler said no (CURVE: our client key is not in its authorized_keys).
      status_ = UnauthenticatedError(peer + "it refused this process's key (wrong --auth-dir?)");
      break;
    case ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL:
      if (value == ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH) {
        status_ = UnauthenticatedError(
            peer + (curve_ ? "it does not use CURVE, this process does (--auth-dir on one side only?)"
                           : "it uses CURVE and this process does not (start it with --auth-dir)"));
      } else {
        char code[16];
        std::snprintf(code, sizeof code, "0x%x", value);
        status_ = UnauthenticatedError(peer + "the handshake broke ZMTP's rules (protocol error " + code +
                                       "; is it a gradsync " + peer_name_ + "?)");
      }
      break;
    case ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL:
      // The peer hung up mid-handshake. With CURVE that is what a server does with a hello it
      // cannot open (we hold another cluster's server.pub); once could be a restart, three
      // times in a row is not.
      if (++broken_ >= 3) {
        status_ = UnauthenticatedError(
            peer + (curve_ ? "it closed every handshake (it does not hold the server key this process's "
                             "server.pub names: another cluster's keys? wrong --auth-dir?)"
                           : "it closed every handshake (does it use --auth-dir? then so must this process)"));
      }
      break;
    default:
      break;
  }
}

}  // namespace gradsync
