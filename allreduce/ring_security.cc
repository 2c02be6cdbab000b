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
  send_counter_ = recv_counter_ = 0;
  if (in_.size() < kReadBuffer) in_.resize(kReadBuffer);
  if (plain_.size() < kMaxFrame) plain_.resize(kMaxFrame);
}

void RingStream::Reset() {
  ++generation_;
  encrypted_ = false;
  sodium_memzero(&keys_, sizeof(keys_));
  in_lo_ = in_hi_ = plain_lo_ = plain_hi_ = 0;
  wbufs_.clear();
  whandler_ = nullptr;
  rhandler_ = nullptr;
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
  GRADSYNC_CHECK(!whandler_) << "one write at a time on a ring stream";
  wbufs_ = std::move(buffers);
  wbuf_index_ = wbuf_offset_ = wtotal_ = 0;
  whandler_ = std::move(handler);
  WriteBatch();
}

void RingStream::WriteBatch() {
  // Encrypt up to kWriteBatch of plaintext into out_, as frames that never span two of the
  // caller's buffers (so each is encrypted straight from where it lies).
  size_t used = 0, plain = 0;
  while (wbuf_index_ < wbufs_.size() && plain < kWriteBatch) {
    const asio::const_buffer& b = wbufs_[wbuf_index_];
    if (wbuf_offset_ == b.size()) {
      ++wbuf_index_;
      wbuf_offset_ = 0;
      continue;
    }
    const size_t len = std::min({kMaxFrame, b.size() - wbuf_offset_, kWriteBatch - plain});
    if (out_.size() < used + kFrameHeader + len + kTag) out_.resize(std::max(out_.size() * 2, used + kFrameHeader + len + kTag));
    uint8_t* frame = out_.data() + used;
    PutU32(frame, static_cast<uint32_t>(len));
    uint8_t nonce[12];
    Nonce(send_counter_++, nonce);
    unsigned long long maclen = 0;
    crypto_aead_chacha20poly1305_ietf_encrypt_detached(
        frame + kFrameHeader, frame + kFrameHeader + len, &maclen, static_cast<const uint8_t*>(b.data()) + wbuf_offset_,
        len, frame, kFrameHeader, nullptr, nonce, keys_.send.data());
    used += kFrameHeader + len + kTag;
    plain += len;
    wbuf_offset_ += len;
  }
  if (used == 0) return Complete(whandler_, {}, wtotal_);
  asio::async_write(socket_, asio::buffer(out_.data(), used),
                    [this, plain, used, gen = generation_](const boost::system::error_code& e, size_t) {
                      if (gen != generation_) return;  // reset: Complete already reported nothing to anyone
                      if (e) return Complete(whandler_, e, 0);
                      wtotal_ += plain;
                      overhead_sent_ += used - plain;
                      WriteBatch();
                    });
}

void RingStream::AsyncRead(asio::mutable_buffer buffer, Handler handler) {
  if (!encrypted_) {
    asio::async_read(socket_, buffer, AllThatIsLeft, std::move(handler));
    return;
  }
  GRADSYNC_CHECK(!rhandler_) << "one read at a time on a ring stream";
  rdst_ = static_cast<uint8_t*>(buffer.data());
  rneed_ = buffer.size();
  rgot_ = 0;
  rhandler_ = std::move(handler);
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
  while (rgot_ < rneed_) {
    if (plain_lo_ < plain_hi_) {
      const size_t k = std::min(plain_hi_ - plain_lo_, rneed_ - rgot_);
      std::memcpy(rdst_ + rgot_, plain_.data() + plain_lo_, k);
      plain_lo_ += k;
      rgot_ += k;
      continue;
    }
    if (in_hi_ - in_lo_ >= kFrameHeader) {
      const uint8_t* frame = in_.data() + in_lo_;
      const size_t len = GetU32(frame);
      if (len == 0 || len > kMaxFrame) return Complete(rhandler_, FrameError(RingFrameError::kFrameTooLong), 0);
      if (in_hi_ - in_lo_ >= kFrameHeader + len + kTag) {
        // A whole frame: decrypt it into the caller's buffer when it fits there, else aside.
        const bool direct = rneed_ - rgot_ >= len;
        uint8_t* dst = direct ? rdst_ + rgot_ : plain_.data();
        uint8_t nonce[12];
        Nonce(recv_counter_, nonce);
        if (crypto_aead_chacha20poly1305_ietf_decrypt_detached(dst, nullptr, frame + kFrameHeader, len,
                                                               frame + kFrameHeader + len, frame, kFrameHeader, nonce,
                                                               keys_.recv.data()) != 0) {
          // Nothing of a frame that fails reaches the caller's data as trusted: the operation
          // fails, and the ring with it.
          return Complete(rhandler_, FrameError(RingFrameError::kBadFrame), 0);
        }
        ++recv_counter_;
        in_lo_ += kFrameHeader + len + kTag;
        overhead_received_ += kFrameHeader + kTag;
        if (direct) {
          rgot_ += len;
        } else {
          plain_lo_ = 0;
          plain_hi_ = len;
        }
        continue;
      }
    }
    // More ciphertext needed: move the partial frame to the front, then read what has arrived.
    if (in_lo_ > 0) {
      std::memmove(in_.data(), in_.data() + in_lo_, in_hi_ - in_lo_);
      in_hi_ -= in_lo_;
      in_lo_ = 0;
    }
    socket_.async_read_some(asio::buffer(in_.data() + in_hi_, in_.size() - in_hi_),
                            [this, gen = generation_](const boost::system::error_code& e, size_t n) {
                              if (gen != generation_) return;
                              if (e) return Complete(rhandler_, e, 0);
                              in_hi_ += n;
                              ReadStep();
                            });
    return;
  }
  Complete(rhandler_, {}, rneed_);
}

}  // namespace gradsync
