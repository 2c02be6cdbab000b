// Ring security: the handshake that proves ring membership, and the encrypted byte stream.
//
// With --auth-dir every ring connection starts with a handshake over the ring key (a key
// derived from the cluster's client secret key, RingKeyFromAuthDir): each side sends a fresh
// random nonce and answers with HMAC-SHA256(ring key, role || transcript), where the transcript
// binds both nonces, both ranks, both sides' flags, the ring size and the whole peer list (the
// job's addresses). A peer without the key cannot answer; a recorded handshake replayed later
// fails against the other side's fresh nonce; a connector's proof cannot be reflected back as
// an acceptor's (the role is in the MAC). Wire format: ARCHITECTURE.md, "The ring's handshake".
//
// With --ring-encrypt too, every byte after the handshake travels in AEAD frames
// (ChaCha20-Poly1305-IETF, libsodium) under a session key derived from the ring key and the
// handshake transcript, one per direction, with a frame counter as the nonce: a tampered,
// replayed, reordered or dropped frame fails authentication at the receiver, which fails the
// collective with kDataLoss instead of using the bytes.
//
//   ASSIGN_OR_RETURN(RingSecurity sec, RingSecurityFromAuthDir(dir, /*encrypt=*/true));
//   ASSIGN_OR_RETURN(auto ring, RingCollective::Listen("127.0.0.1", options, sec));
#pragma once

#include <utility>  // before Boost.Asio 1.74, whose awaitable.hpp forgets it under C++20

#include <array>
#include <boost/asio.hpp>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "common/base/status.h"

namespace gradsync {

using RingKey = std::array<uint8_t, 32>;

struct RingSecurity {
  bool authenticate = false;  // the handshake on every ring connection
  bool encrypt = false;       // AEAD frames after it (needs authenticate)
  RingKey key{};
};

// The ring key from an --auth-dir: the one place that knows which of the cluster's keys it
// comes from (the client pair's secret, which every worker holds).
Result<RingKey> RingKeyFromAuthDir(const std::string& dir);
// RingKeyFromAuthDir, then a RingSecurity that authenticates (and encrypts if asked).
Result<RingSecurity> RingSecurityFromAuthDir(const std::string& dir, bool encrypt);
// BLAKE2b-256 keyed with the secret, over a fixed label: the ring key never equals the CURVE
// secret itself, so the ring's MACs reveal nothing usable against CurveZMQ.
RingKey DeriveRingKey(std::span<const uint8_t> secret);

// ---- The handshake (wire format in ARCHITECTURE.md). ----
namespace ring_handshake {

constexpr uint32_t kVersion = 1;
constexpr uint32_t kFlagEncrypt = 1;
constexpr uint32_t kPlainHelloMagic = 0x47534849;  // a plaintext ring's hello (tcp_ring.cc)
constexpr uint32_t kHelloMagic = 0x31415247;    // "GRA1": an authenticating connector's hello
// A mesh connection's hellos (beside the ring, for rhd / rd / tree; tcp_ring.h): the same
// handshake, told apart by the magic, which the transcript covers.
constexpr uint32_t kPlainMeshHelloMagic = 0x4d534849;  // "IHSM"
constexpr uint32_t kMeshHelloMagic = 0x314d5247;       // "GRM1"
constexpr uint32_t kReplyMagic = 0x32415247;    // "GRA2": the acceptor's nonce and proof
constexpr uint32_t kFinishMagic = 0x33415247;   // "GRA3": the connector's verdict and proof
constexpr uint32_t kVerdictMagic = 0x34415247;  // "GRA4": the acceptor's verdict

// Why a side refuses the other (the verdict fields); 0 accepts.
enum Verdict : uint32_t { kAccepted = 0, kBadProof = 1, kFlagsDiffer = 2, kWrongRank = 3, kBadVersion = 4 };
std::string VerdictText(uint32_t verdict);

using Nonce = std::array<uint8_t, 32>;
using Mac = std::array<uint8_t, 32>;

// Every field little-endian (as the step headers, native on the x86-64 and ARM64 hosts).
struct Hello {  // connector -> acceptor, 48 bytes; the first 8 (magic, rank) are where a
                // plaintext ring's hello has its own magic, so each side tells the other kind
  uint32_t magic;
  uint32_t rank;
  uint32_t flags;
  uint32_t version;
  Nonce nonce;
};
struct Reply {  // acceptor -> connector, 80 bytes
  uint32_t magic;
  uint32_t rank;
  uint32_t flags;
  uint32_t version;
  Nonce nonce;
  Mac mac;  // HMAC(key, "gradsync ring v1 acceptor" || T)
};
struct Finish {  // connector -> acceptor, 40 bytes
  uint32_t magic;
  uint32_t verdict;
  Mac mac;  // HMAC(key, "gradsync ring v1 connector" || T); zero when refusing
};
struct VerdictMsg {  // acceptor -> connector, 8 bytes
  uint32_t magic;
  uint32_t verdict;
};
static_assert(sizeof(Hello) == 48 && sizeof(Reply) == 80 && sizeof(Finish) == 40 && sizeof(VerdictMsg) == 8);

// A plaintext ring's hello (tcp_ring.cc): magic (kPlainHelloMagic or kPlainMeshHelloMagic), the
// sender's rank, then the ring's token, the context's first 8 bytes, so that an acceptor can tell
// a member of its ring from another ring's rank on a reused port. The first 8 bytes are where an
// authenticating hello has its own magic and rank.
struct PlainHello {
  uint32_t magic;
  uint32_t rank;
  std::array<uint8_t, 8> token;
};
static_assert(sizeof(PlainHello) == 16);
inline bool IsPlainHelloMagic(uint32_t magic) { return magic == kPlainHelloMagic || magic == kPlainMeshHelloMagic; }
std::array<uint8_t, 8> RingToken(const std::array<uint8_t, 32>& context);

Nonce RandomNonce();
// BLAKE2b-256 of the ring size and every rank's address: the same on every rank of one ring,
// different for another job's ring (ephemeral ports), so a handshake is bound to its job.
std::array<uint8_t, 32> RingContext(const std::vector<std::string>& peers);
// T = BLAKE2b-256("gradsync ring v1" || context || hello || the reply's first 48 bytes).
std::array<uint8_t, 32> Transcript(const std::array<uint8_t, 32>& context, const Hello& hello, const Reply& reply);
Mac AcceptorMac(const RingKey& key, const std::array<uint8_t, 32>& transcript);
Mac ConnectorMac(const RingKey& key, const std::array<uint8_t, 32>& transcript);
// Constant time.
bool MacEqual(const Mac& a, const Mac& b);

struct SessionKeys {
  RingKey send;
  RingKey recv;
};
// The data keys of one connection: BLAKE2b keyed with the ring key over a direction label and
// T, so each connection and direction has its own key and the frame counters never repeat a
// (key, nonce) pair.
SessionKeys DeriveSessionKeys(const RingKey& key, const std::array<uint8_t, 32>& transcript, bool connector);

}  // namespace ring_handshake

// The error category of encrypted ring frames: a frame that fails authentication, or whose
// length is out of range, completes the read with one of these (RingCollective turns them
// into kDataLoss).
const boost::system::error_category& RingFrameCategory();
enum class RingFrameError { kBadFrame = 1, kFrameTooLong = 2 };

// One direction-agnostic byte stream over a ring socket. Plain: AsyncWrite / AsyncRead are
// asio::async_write / async_read. Encrypted (Encrypt()): writes are cut into frames
//   u32 length L (1..kMaxFrame) | L bytes of ChaCha20-Poly1305-IETF ciphertext | 16-byte tag
// with the 4 length bytes as associated data and nonce = u64 frame counter (little-endian) ||
// 4 zero bytes, and reads decrypt frames as they arrive (straight into the caller's buffer when
// a whole frame fits). At most one write and one read outstanding (the ring's pattern);
// handlers of an encrypted stream run through the executor, never inside the call.
class RingStream {
 public:
  using Handler = std::function<void(const boost::system::error_code&, size_t)>;
  static constexpr size_t kMaxFrame = size_t{64} << 10;

  explicit RingStream(boost::asio::ip::tcp::socket& socket) : socket_(socket) {}

  void Encrypt(const ring_handshake::SessionKeys& keys);
  bool encrypted() const { return encrypted_; }
  // Forgets keys, counters and buffered bytes (the socket closed); completions still queued
  // report operation_aborted.
  void Reset();

  void AsyncWrite(std::vector<boost::asio::const_buffer> buffers, Handler handler);
  void AsyncRead(boost::asio::mutable_buffer buffer, Handler handler);
  // Reads all of `header`, and on a plain stream as much of `more` as has already arrived (in
  // the same receive call); the handler gets the bytes read into both together.
  void AsyncReadHeader(boost::asio::mutable_buffer header, boost::asio::mutable_buffer more, Handler handler);

  // Bytes on the wire beyond the plaintext (frame headers and tags).
  uint64_t overhead_sent() const { return w_.overhead; }
  uint64_t overhead_received() const { return r_.overhead; }

 private:
  void WriteBatch();
  void ReadStep();
  void Complete(Handler& slot, const boost::system::error_code& e, size_t n);

  // The write in progress, and the sending direction's frame counter and overhead.
  struct WriteState {
    std::vector<boost::asio::const_buffer> bufs;
    size_t index = 0, offset = 0, total = 0;
    std::vector<uint8_t> out;  // the batch of sealed frames being written
    Handler handler;
    uint64_t counter = 0;
    uint64_t overhead = 0;
  };
  // The read in progress, the ciphertext received and the decrypted bytes not yet read, and the
  // receiving direction's frame counter and overhead.
  struct ReadState {
    uint8_t* dst = nullptr;
    size_t need = 0, got = 0;
    Handler handler;
    std::vector<uint8_t> in;  // ciphertext received, [in_lo, in_hi) not yet decrypted
    size_t in_lo = 0, in_hi = 0;
    std::vector<uint8_t> plain;  // a decrypted frame's bytes not yet read, [plain_lo, plain_hi)
    size_t plain_lo = 0, plain_hi = 0;
    uint64_t counter = 0;
    uint64_t overhead = 0;
  };

  boost::asio::ip::tcp::socket& socket_;
  bool encrypted_ = false;
  ring_handshake::SessionKeys keys_{};
  uint64_t generation_ = 0;  // bumped by Reset: stale completions see operation_aborted
  WriteState w_;
  ReadState r_;
};

}  // namespace gradsync
