// Authentication and encryption of every ZeroMQ socket: CURVE (CurveZMQ, RFC 26) with a ZAP
// handler (RFC 27) that admits only the cluster's keys.
//
// gradsync-keygen writes a cluster's keys into one directory (--auth-dir); each process reads
// what its role needs and nothing more:
//   server.key       secret  the pair of every binding socket       scheduler, servers
//   server.pub               its public key alone                    workers
//   client.key       secret  the pair of every connecting socket    workers; servers (their link
//                                                                    to the scheduler)
//   authorized_keys          the client public keys binding sockets admit, one Z85 key a line
//                                                                    scheduler, servers
// A worker never holds server.key, so a stolen worker directory cannot pose as a shard or the
// scheduler. Each .key file holds "public <z85>" and "secret <z85>" lines. Secret files must be
// private (no group or other permission bits) and the directory not writable by group or others;
// otherwise LoadSecurity refuses, as ssh does (the binaries exit 2 with one line).
//
// EnableCurve(ctx, security) makes every Socket::Bind/Connect on that context use CURVE, and
// serves ZAP on it: a connection whose client key is not authorized is refused during the
// handshake (nothing it sends reaches the process), counted, and logged with the key's
// fingerprint (its first 8 Z85 characters), at most once per key per 10 s. A peer without CURVE
// cannot even complete the handshake. Clients check the server's public key, so a stranger cannot
// pose as a shard or the scheduler; a client whose key is refused hears so (Socket::
// HandshakeStatus). Contexts without EnableCurve stay plaintext (NULL mechanism).
//
//   ASSIGN_OR_RETURN(Security sec, LoadSecurity(dir, KeyRole::kWorker));
//   zmq::context_t ctx(1);
//   ASSIGN_OR_RETURN(auto auth, EnableCurve(ctx, sec));   // keep `auth` alive until the sockets close
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <zmq.hpp>

#include "common/base/status.h"

namespace gradsync {

struct CurveKeyPair {
  std::string public_key;  // Z85, 40 characters
  std::string secret_key;
};

// What a process reads from --auth-dir (see the file comment).
enum class KeyRole {
  kServer,  // the scheduler and servers: server.key, client.key, authorized_keys
  kWorker,  // workers: server.pub, client.key
};

struct Security {
  CurveKeyPair server;               // a worker's has no secret key
  CurveKeyPair client;
  std::set<std::string> authorized;  // client public keys (Z85); empty for a worker
};

// A fresh key pair (libzmq's zmq_curve_keypair; needs libzmq built with CURVE).
Result<CurveKeyPair> GenerateKeyPair();
// Writes a new cluster (two pairs, server.pub and authorized_keys) into `dir` (created 0700 if
// needed); refuses to overwrite existing keys unless `overwrite`.
Status WriteClusterKeys(const std::string& dir, bool overwrite);
// Reads what `role` needs from a directory written by WriteClusterKeys; every problem is one
// clear line (kInvalidArgument for a file or directory that is not private enough).
Result<Security> LoadSecurity(const std::string& dir, KeyRole role = KeyRole::kServer);
// The fingerprint logs name a key by: its first 8 Z85 characters.
std::string KeyFingerprint(const std::string& z85_public_key);

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
  // Log lines about refused keys: at most one per key per this many seconds (the rest counted).
  static constexpr double kLogIntervalS = 10.0;
  // Keys remembered for that; refusals of keys beyond them are logged together.
  static constexpr size_t kMaxLoggedKeys = 64;

 private:
  friend Result<std::unique_ptr<CurveAuthenticator>> EnableCurve(zmq::context_t& ctx, const Security& security);
  CurveAuthenticator(zmq::context_t& ctx, const Security& security);
  void Loop(std::stop_token stop);
  void LogRefusal(const std::string& address, const std::string& mechanism, const std::string& raw_key);

  zmq::context_t& ctx_;
  void* ctx_handle_;
  std::set<std::string> authorized_;  // raw 32-byte keys
  zmq::socket_t socket_;
  std::atomic<int64_t> refused_{0}, admitted_{0};
  struct Refusals {
    double logged_at = -1e300;
    int64_t unlogged = 0;  // refusals since that line
  };
  std::map<std::string, Refusals> refusals_;  // by fingerprint (ZAP thread only)
  std::jthread thread_;
};

// Turns CURVE on for every socket made on `ctx` from now on (see above).
Result<std::unique_ptr<CurveAuthenticator>> EnableCurve(zmq::context_t& ctx, const Security& security);

// LoadSecurity(dir, role) then EnableCurve: what a binary's --auth-dir does. Errors name the problem.
Result<std::unique_ptr<CurveAuthenticator>> EnableCurveFromDir(zmq::context_t& ctx, const std::string& dir,
                                                               KeyRole role);

// Used by Socket::Bind / Socket::Connect: the CURVE options for a socket on `ctx`, if any.
// ApplyCurveServer fails (kFailedPrecondition) in a process that holds no server.key (a worker).
Status ApplyCurveServer(zmq::context_t& ctx, zmq::socket_t& socket);
void ApplyCurveClient(zmq::context_t& ctx, zmq::socket_t& socket);
// Whether EnableCurve is in force on `ctx`.
bool CurveEnabled(zmq::context_t& ctx);

}  // namespace gradsync
