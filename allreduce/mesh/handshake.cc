// MeshHandshake: the two halves of the ring's handshake on one connection (wire format in
// ARCHITECTURE.md, "The ring's handshake"), run by MeshConnector where the ring authenticates.
#include "allreduce/mesh/connector.h"

namespace gradsync {
namespace asio = boost::asio;

std::string MeshHandshake::AuthFailure(const Link& link, int peer, bool accepted_side, const std::string& why) const {
  std::string from;
  if (accepted_side) {
    // The connection may not be from the rank the ring expects there: say where it came from.
    boost::system::error_code ec;
    const auto remote = link.socket.remote_endpoint(ec);
    if (!ec) from = ", connection from " + remote.address().to_string() + ":" + std::to_string(remote.port());
  }
  return "ring authentication failed between rank " + std::to_string(topology_.rank()) + " and rank " + std::to_string(peer) + " (" +
         topology_.address(peer) + from + "): " + why;
}

// The connector's half (wire format in ARCHITECTURE.md): hello with its nonce; the acceptor's
// nonce and proof; this side's verdict and proof; the acceptor's verdict. Each side checks
// the other's proof, so a refusal is reported on both, each naming the other.
void MeshHandshake::AsConnector(Link& link, int peer, bool mesh, const std::array<uint8_t, 32>& context,
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
  h.hello = Hello{mesh ? kMeshHelloMagic : kHelloMagic, static_cast<uint32_t>(topology_.rank()), flags, kVersion, RandomNonce()};
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

void MeshHandshake::AsAcceptor(Link& link, int peer, bool mesh, const std::array<uint8_t, 32>& context,
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
    h.reply = Reply{kReplyMagic, static_cast<uint32_t>(topology_.rank()), flags, kVersion, RandomNonce(), Mac{}};
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

}  // namespace gradsync
