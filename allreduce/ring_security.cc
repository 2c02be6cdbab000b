#include "allreduce/ring_security.h"

#include <sodium.h>
#include <zmq.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>

#include "common/base/check.h"
#include "common/net/security.h"

namespace gradsync {
namespace asio = boost::asio;

namespace {

// sodium_init is idempotent and thread-safe; every entry point that draws randomness or may
// pick an implementation calls it first.
void InitSodium() {
  static const bool ok = sodium_init() >= 0;
  GRADSYNC_CHECK(ok) << "libsodium failed to initialize";
}

std::array<uint8_t, 32> Blake2b(std::span<const uint8_t> key, std::span<const uint8_t> message) {
  std::array<uint8_t, 32> out{};
  crypto_generichash(out.data(), out.size(), message.data(), message.size(), key.empty() ? nullptr : key.data(),
                     key.size());
  return out;
}

std::span<const uint8_t> Bytes(const std::string& s) { return {reinterpret_cast<const uint8_t*>(s.data()), s.size()}; }

ring_handshake::Mac Hmac(const RingKey& key, const std::string& label, const std::array<uint8_t, 32>& transcript) {
  static_assert(crypto_auth_hmacsha256_KEYBYTES == 32 && crypto_auth_hmacsha256_BYTES == 32);
  crypto_auth_hmacsha256_state st;
  crypto_auth_hmacsha256_init(&st, key.data(), key.size());
  crypto_auth_hmacsha256_update(&st, reinterpret_cast<const uint8_t*>(label.data()), label.size());
  crypto_auth_hmacsha256_update(&st, transcript.data(), transcript.size());
  ring_handshake::Mac mac{};
  crypto_auth_hmacsha256_final(&st, mac.data());
  return mac;
}

// Boost's error_category has a protected non-virtual destructor: categories are never deleted
// through it (this one is a function-local static).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wnon-virtual-dtor"
class FrameCategory final : public boost::system::error_category {
 public:
  const char* name() const noexcept override { return "gradsync.ring_frame"; }
  std::string message(int ev) const override {
    switch (static_cast<RingFrameError>(ev)) {
      case RingFrameError::kBadFrame:
        return "sent an encrypted ring frame that failed authentication (tampered, replayed, reordered or dropped bytes)";
      case RingFrameError::kFrameTooLong: return "sent an encrypted ring frame with an impossible length (corrupt stream)";
    }
    return "ring frame error";
  }
};
#pragma GCC diagnostic pop

boost::system::error_code FrameError(RingFrameError e) { return {static_cast<int>(e), RingFrameCategory()}; }

void PutU32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint32_t GetU32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 | static_cast<uint32_t>(p[2]) << 16 |
         static_cast<uint32_t>(p[3]) << 24;
}
void Nonce(uint64_t counter, uint8_t* out) {
  static_assert(crypto_aead_chacha20poly1305_IETF_NPUBBYTES == 12);
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(counter >> (8 * i));
  out[8] = out[9] = out[10] = out[11] = 0;
}

constexpr size_t kTag = crypto_aead_chacha20poly1305_IETF_ABYTES;  // 16
constexpr size_t kFrameHeader = 4;
// A write is encrypted into one buffer of at most this much plaintext, then written at once.
constexpr size_t kWriteBatch = size_t{1} << 20;

// Asio's transfer_all hands the socket at most 64 KiB per send or receive call, and every call
// of a loopback send runs the receiver's whole network path too: asking for all that is left
// made the 4-rank, 4 MiB all-reduce on 2 cores about 1.4x faster (bench/README.md).
size_t AllThatIsLeft(const boost::system::error_code& e, size_t) { return e ? 0 : std::numeric_limits<size_t>::max(); }
// Ciphertext is read in pieces of up to this much (whatever the kernel has).
constexpr size_t kReadBuffer = (size_t{1} << 20) + RingStream::kMaxFrame + kTag + kFrameHeader;

}  // namespace

// ---- Keys ----

RingKey DeriveRingKey(std::span<const uint8_t> secret) {
  InitSodium();
  return Blake2b(secret, Bytes("gradsync ring key v1"));
}

Result<RingKey> RingKeyFromAuthDir(const std::string& dir) {
  // The workers' client pair is the key every worker holds (whatever else the directory
  // holds); its secret never leaves the process, so the derived key is as private as it is.
  ASSIGN_OR_RETURN(Security sec, LoadSecurity(dir));
  std::array<uint8_t, 32> raw{};
  if (zmq_z85_decode(raw.data(), sec.client.secret_key.c_str()) == nullptr) {
    return InvalidArgumentError(dir + "/client.key: the secret key is not Z85");
  }
  RingKey key = DeriveRingKey(raw);
  sodium_memzero(raw.data(), raw.size());
  return key;
}

Result<RingSecurity> RingSecurityFromAuthDir(const std::string& dir, bool encrypt) {
  RingSecurity s;
  ASSIGN_OR_RETURN(s.key, RingKeyFromAuthDir(dir));
  s.authenticate = true;
  s.encrypt = encrypt;
  return s;
}

// ---- The handshake ----

namespace ring_handshake {

std::string VerdictText(uint32_t verdict) {
  switch (verdict) {
    case kAccepted: return "accepted";
    case kBadProof: return "the two workers' ring keys differ (another cluster's --auth-dir, or not a member of this one)";
    case kFlagsDiffer: return "--ring-encrypt differs between the two workers";
    case kWrongRank: return "it is not the rank the ring expects there";
    case kBadVersion: return "it speaks another version of the ring handshake";
  }
  return "refused (reason " + std::to_string(verdict) + ")";
}

Nonce RandomNonce() {
  InitSodium();
  Nonce n{};
  randombytes_buf(n.data(), n.size());
  return n;
}

std::array<uint8_t, 32> RingContext(const std::vector<std::string>& peers) {
  InitSodium();
  std::string text = "gradsync ring peers v1\n" + std::to_string(peers.size()) + "\n";
  for (const auto& p : peers) text += p + "\n";
  return Blake2b({}, Bytes(text));
}

std::array<uint8_t, 8> RingToken(const std::array<uint8_t, 32>& context) {
  std::array<uint8_t, 8> token;
  std::copy_n(context.begin(), token.size(), token.begin());
  return token;
}

std::array<uint8_t, 32> Transcript(const std::array<uint8_t, 32>& context, const Hello& hello, const Reply& reply) {
  InitSodium();
  crypto_generichash_state st;
  crypto_generichash_init(&st, nullptr, 0, 32);
  const std::string label = "gradsync ring v1";
  crypto_generichash_update(&st, reinterpret_cast<const uint8_t*>(label.data()), label.size());
  crypto_generichash_update(&st, context.data(), context.size());
  crypto_generichash_update(&st, reinterpret_cast<const uint8_t*>(&hello), sizeof(hello));
  crypto_generichash_update(&st, reinterpret_cast<const uint8_t*>(&reply), offsetof(Reply, mac));
  std::array<uint8_t, 32> t{};
  crypto_generichash_final(&st, t.data(), t.size());
  return t;
}

Mac AcceptorMac(const RingKey& key, const std::array<uint8_t, 32>& transcript) {
  return Hmac(key, "gradsync ring v1 acceptor", transcript);
}

Mac ConnectorMac(const RingKey& key, const std::array<uint8_t, 32>& transcript) {
  return Hmac(key, "gradsync ring v1 connector", transcript);
}

bool MacEqual(const Mac& a, const Mac& b) { return sodium_memcmp(a.data(), b.data(), a.size()) == 0; }

SessionKeys DeriveSessionKeys(const RingKey& key, const std::array<uint8_t, 32>& transcript, bool connector) {
  InitSodium();
  auto derive = [&](const std::string& label) {
    std::vector<uint8_t> m(label.begin(), label.end());
    m.insert(m.end(), transcript.begin(), transcript.end());
    return Blake2b(key, m);
  };
  const RingKey c2a = derive("gradsync ring v1 data connector->acceptor");
  const RingKey a2c = derive("gradsync ring v1 data acceptor->connector");
  return connector ? SessionKeys{c2a, a2c} : SessionKeys{a2c, c2a};
}

}  // namespace ring_handshake

// ---- The stream ----

const boost::system::error_category& RingFrameCategory() {
  static const FrameCategory category;
  return category;
}

void RingStream::Encrypt(const ring_handshake::SessionKeys& keys) {
  InitSodium();
  encrypted_ = true;
  keys_ = keys;
  w_.counter = r_.counter = 0;
  if (r_.in.size() < kReadBuffer) r_.in.resize(kReadBuffer);
  if (r_.plain.size() < kMaxFrame) r_.plain.resize(kMaxFrame);
}

void RingStream::Reset() {
  ++generation_;
  encrypted_ = false;
  sodium_memzero(&keys_, sizeof(keys_));
  r_.in_lo = r_.in_hi = r_.plain_lo = r_.plain_hi = 0;
  w_.bufs.clear();
  w_.handler = nullptr;
  r_.handler = nullptr;
}

void RingStream::Complete(Handler& slot, const boost::system::error_code& e, size_t n) {
  // Through the executor, so that a chain of reads served from buffered bytes does not recurse;
  // a Reset in between turns the completion into operation_aborted.
  Handler h = std::move(slot);
  slot = nullptr;
  asio::post(socket_.get_executor(), [this, h = std::move(h), e, n, gen = generation_] {
    if (gen != generation_) return h(asio::error::operation_aborted, 0);
    h(e, n);
  });
}

void RingStream::AsyncWrite(std::vector<asio::const_buffer> buffers, Handler handler) {
  if (!encrypted_) {
    asio::async_write(socket_, std::move(buffers), AllThatIsLeft, std::move(handler));
    return;
  }
  GRADSYNC_CHECK(!w_.handler) << "one write at a time on a ring stream";
  w_.bufs = std::move(buffers);
  w_.index = w_.offset = w_.total = 0;
  w_.handler = std::move(handler);
  WriteBatch();
}

void RingStream::WriteBatch() {
  // Encrypt up to kWriteBatch of plaintext into w_.out, as frames that never span two of the
  // caller's buffers (so each is encrypted straight from where it lies).
  size_t used = 0, plain = 0;
  while (w_.index < w_.bufs.size() && plain < kWriteBatch) {
    const asio::const_buffer& b = w_.bufs[w_.index];
    if (w_.offset == b.size()) {
      ++w_.index;
      w_.offset = 0;
      continue;
    }
    const size_t len = std::min({kMaxFrame, b.size() - w_.offset, kWriteBatch - plain});
    if (w_.out.size() < used + kFrameHeader + len + kTag) w_.out.resize(std::max(w_.out.size() * 2, used + kFrameHeader + len + kTag));
    uint8_t* frame = w_.out.data() + used;
    PutU32(frame, static_cast<uint32_t>(len));
    uint8_t nonce[12];
    Nonce(w_.counter++, nonce);
    unsigned long long maclen = 0;
    crypto_aead_chacha20poly1305_ietf_encrypt_detached(
        frame + kFrameHeader, frame + kFrameHeader + len, &maclen, static_cast<const uint8_t*>(b.data()) + w_.offset,
        len, frame, kFrameHeader, nullptr, nonce, keys_.send.data());
    used += kFrameHeader + len + kTag;
    plain += len;
    w_.offset += len;
  }
  if (used == 0) return Complete(w_.handler, {}, w_.total);
  asio::async_write(socket_, asio::buffer(w_.out.data(), used),
                    [this, plain, used, gen = generation_](const boost::system::error_code& e, size_t) {
                      if (gen != generation_) return;  // reset: Complete already reported nothing to anyone
                      if (e) return Complete(w_.handler, e, 0);
                      w_.total += plain;
                      w_.overhead += used - plain;
                      WriteBatch();
                    });
}

void RingStream::AsyncRead(asio::mutable_buffer buffer, Handler handler) {
  if (!encrypted_) {
    asio::async_read(socket_, buffer, AllThatIsLeft, std::move(handler));
    return;
  }
  GRADSYNC_CHECK(!r_.handler) << "one read at a time on a ring stream";
  r_.dst = static_cast<uint8_t*>(buffer.data());
  r_.need = buffer.size();
  r_.got = 0;
  r_.handler = std::move(handler);
  ReadStep();
}

void RingStream::AsyncReadHeader(asio::mutable_buffer header, asio::mutable_buffer more, Handler handler) {
  if (encrypted_ || more.size() == 0) return AsyncRead(header, std::move(handler));
  const size_t need = header.size();
  const std::array<asio::mutable_buffer, 2> both{header, more};
  asio::async_read(socket_, both, [need](const boost::system::error_code& e, size_t got) -> size_t {
    return e || got >= need ? 0 : std::numeric_limits<size_t>::max();
  }, std::move(handler));
}

void RingStream::ReadStep() {
  while (r_.got < r_.need) {
    if (r_.plain_lo < r_.plain_hi) {
      const size_t k = std::min(r_.plain_hi - r_.plain_lo, r_.need - r_.got);
      std::memcpy(r_.dst + r_.got, r_.plain.data() + r_.plain_lo, k);
      r_.plain_lo += k;
      r_.got += k;
      continue;
    }
    if (r_.in_hi - r_.in_lo >= kFrameHeader) {
      const uint8_t* frame = r_.in.data() + r_.in_lo;
      const size_t len = GetU32(frame);
      if (len == 0 || len > kMaxFrame) return Complete(r_.handler, FrameError(RingFrameError::kFrameTooLong), 0);
      if (r_.in_hi - r_.in_lo >= kFrameHeader + len + kTag) {
        // A whole frame: decrypt it into the caller's buffer when it fits there, else aside.
        const bool direct = r_.need - r_.got >= len;
        uint8_t* dst = direct ? r_.dst + r_.got : r_.plain.data();
        uint8_t nonce[12];
        Nonce(r_.counter, nonce);
        if (crypto_aead_chacha20poly1305_ietf_decrypt_detached(dst, nullptr, frame + kFrameHeader, len,
                                                               frame + kFrameHeader + len, frame, kFrameHeader, nonce,
                                                               keys_.recv.data()) != 0) {
          // Nothing of a frame that fails reaches the caller's data as trusted: the operation
          // fails, and the ring with it.
          return Complete(r_.handler, FrameError(RingFrameError::kBadFrame), 0);
        }
        ++r_.counter;
        r_.in_lo += kFrameHeader + len + kTag;
        r_.overhead += kFrameHeader + kTag;
        if (direct) {
          r_.got += len;
        } else {
          r_.plain_lo = 0;
          r_.plain_hi = len;
        }
        continue;
      }
    }
    // More ciphertext needed: move the partial frame to the front, then read what has arrived.
    if (r_.in_lo > 0) {
      std::memmove(r_.in.data(), r_.in.data() + r_.in_lo, r_.in_hi - r_.in_lo);
      r_.in_hi -= r_.in_lo;
      r_.in_lo = 0;
    }
    socket_.async_read_some(asio::buffer(r_.in.data() + r_.in_hi, r_.in.size() - r_.in_hi),
                            [this, gen = generation_](const boost::system::error_code& e, size_t n) {
                              if (gen != generation_) return;
                              if (e) return Complete(r_.handler, e, 0);
                              r_.in_hi += n;
                              ReadStep();
                            });
    return;
  }
  Complete(r_.handler, {}, r_.need);
}

}  // namespace gradsync
