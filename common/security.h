// Authentication and encryption of every ZeroMQ socket: CURVE (CurveZMQ, RFC 26) with a ZAP
// handler (RFC 27) that admits only the cluster's key.
//
// A cluster has two key pairs, written by gradsync-keygen into one directory (--auth-dir):
//   server.key       the pair of every binding socket (scheduler, server shards)
//   client.key       the pair of every connecting socket (workers, and the shards' link to the
//                    scheduler)
//   authorized_keys  the client public keys the binding sockets admit, one Z85 key a line
// Each .key file holds "public <z85>" and "secret <z85>" lines; secret files are 0600.
//
// EnableCurve(ctx, security) makes every Socket::Bind/Connect on that context use CURVE, and
// serves ZAP on it: a connection whose client key is not authorized is refused during the
// handshake (nothing it sends reaches the process), and counted. A peer without CURVE cannot
// even complete the handshake. Clients check the server's public key, so a stranger cannot pose
// as a shard or the scheduler. Contexts without EnableCurve stay plaintext (NULL mechanism).
//
//   ASSIGN_OR_RETURN(Security sec, LoadSecurity(dir));
//   zmq::context_t ctx(1);
//   ASSIGN_OR_RETURN(auto auth, EnableCurve(ctx, sec));   // keep `auth` alive until the sockets close
#pragma once

#include <atomic>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <zmq.hpp>

#include "common/status.h"

namespace gradsync {

struct CurveKeyPair {
  std::string public_key;  // Z85, 40 characters
  std::string secret_key;
};

struct Security {
  CurveKeyPair server;
  CurveKeyPair client;
  std::set<std::string> authorized;  // client public keys (Z85)
};

// A fresh key pair (libzmq's zmq_curve_keypair; needs libzmq built with CURVE).
Result<CurveKeyPair> GenerateKeyPair();
// Writes a new cluster (two pairs and authorized_keys) into `dir` (created if needed); refuses
// to overwrite existing keys unless `overwrite`.
Status WriteClusterKeys(const std::string& dir, bool overwrite);
// Reads a directory written by WriteClusterKeys; every problem is one clear line.
Result<Security> LoadSecurity(const std::string& dir);

// Serves ZAP on one context for as long as it lives; its destructor stops the thread (before
// the context is destroyed, so declare it after the context).
class CurveAuthenticator {
 public:
  ~CurveAuthenticator();
  CurveAuthenticator(const CurveAuthenticator&) = delete;
  CurveAuthenticator& operator=(const CurveAuthenticator&) = delete;

  // Handshakes refused (unauthorized client key) and admitted so far.
  int64_t refused() const { return refused_.load(); }
  int64_t admitted() const { return admitted_.load(); }

 private:
  friend Result<std::unique_ptr<CurveAuthenticator>> EnableCurve(zmq::context_t& ctx, const Security& security);
  CurveAuthenticator(zmq::context_t& ctx, const Security& security);
  void Loop(std::stop_token stop);

  zmq::context_t& ctx_;
  void* ctx_handle_;
  std::set<std::string> authorized_;  // raw 32-byte keys
  zmq::socket_t socket_;
  std::atomic<int64_t> refused_{0}, admitted_{0};
  std::jthread thread_;
};

// Turns CURVE on for every socket made on `ctx` from now on (see above).
Result<std::unique_ptr<CurveAuthenticator>> EnableCurve(zmq::context_t& ctx, const Security& security);

// LoadSecurity(dir) then EnableCurve: what a binary's --auth-dir does. Errors name the problem.
Result<std::unique_ptr<CurveAuthenticator>> EnableCurveFromDir(zmq::context_t& ctx, const std::string& dir);

// Used by Socket::Bind / Socket::Connect: the CURVE options for a socket on `ctx`, if any.
void ApplyCurveServer(zmq::context_t& ctx, zmq::socket_t& socket);
void ApplyCurveClient(zmq::context_t& ctx, zmq::socket_t& socket);

}  // namespace gradsync
