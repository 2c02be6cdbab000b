// Transport: ZeroMQ sockets that carry gradsync messages, with validation and byte counters.
//
// A message is multipart: [header: wire::Header protobuf] [keys: uint64 x num_keys, if any]
// [values: float32 x n, if has_values]. On a ROUTER socket the peer's identity frame comes first
// (Recv strips it into Message::peer, Send puts it back). Bulk frames are never serialized
// through protobuf; a sender may lend its buffer (zero-copy) and learns through an InflightCounter
// when ZeroMQ no longer needs it.
//
// Every received message is checked before anyone sees it: the header parses, the frame count
// matches num_keys/has_values, frame sizes match the header (keys 8 bytes each, values 4 bytes
// each and as many as the segments and keys ask for), segments do not overflow. A message that
// fails comes back with `malformed` set (and what is known of its header and peer), so that the
// caller can answer with an error; it is also counted. Semantic checks (ranges a shard owns,
// registered senders, clocks) belong to the receiver (server/), not here.
//
// This layer holds no registration, barrier or heartbeat logic. Not thread-safe: one thread
// owns a Socket (ZeroMQ sockets must not be shared between threads).
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>
#include <zmq.hpp>

#include "common/base/status.h"
#include "common/net/handshake_watch.h"
#include "gradsync.pb.h"

namespace gradsync {

// Message size limits (ZMQ_MAXMSGSIZE, per frame): a peer that announces a larger frame is
// disconnected by ZeroMQ before it allocates the frame, so what anyone who reaches a port can make
// a process hold is bounded (docs/security.md). Control messages (registration, barriers,
// heartbeats, every header) fit in kMaxControlMessageBytes: the scheduler's sockets and a shard's
// data socket before the job is known accept that much. A shard's data socket then takes the
// job's largest message (ClusterTable.max_message_bytes, from the workers' model layout: see
// MaxShardMessageBytes in common/ps/ps_protocol.h); a node's link to the scheduler accepts a
// gather's release, kMaxSchedulerReplyBytes.
inline constexpr int64_t kMaxControlMessageBytes = (int64_t{1} << 20) + (int64_t{64} << 10);
inline constexpr int64_t kMaxSchedulerReplyBytes = int64_t{256} << 20;
// A shard's job limit is sane below this: 2^34 parameters (the most INIT accepts) as keys.
inline constexpr int64_t kMaxJobMessageBytes = (int64_t{1} << 37) + (int64_t{1} << 20);

// The ZeroMQ context every socket of a process is made on (its I/O threads; --auth-dir's CURVE
// settings through common/net/security.h). One per process, declared before and so destroyed after
// its sockets. Outside common/ nothing touches ZeroMQ itself: code holds a TransportContext and
// Sockets; tests that speak raw ZeroMQ to a shard get the context through the conversion.
class TransportContext {
 public:
  explicit TransportContext(int io_threads = 1) : ctx_(io_threads) {}
  TransportContext(const TransportContext&) = delete;
  TransportContext& operator=(const TransportContext&) = delete;
  operator zmq::context_t&() { return ctx_; }

 private:
  zmq::context_t ctx_;
};

// One frame of a message: received bytes read in place, or bytes built to be sent. It moves
// without copying its bytes (ZeroMQ keeps a frame of up to 64 bytes inside the object itself,
// so those move with it: pointers into a small frame do not survive a move).
class Frame {
 public:
  Frame() = default;
  explicit Frame(size_t size) : msg_(size) {}
  static Frame Copy(const void* data, size_t size);
  void* data() { return msg_.data(); }
  const void* data() const { return msg_.data(); }
  size_t size() const { return msg_.size(); }
  std::span<const uint8_t> bytes() const { return {static_cast<const uint8_t*>(msg_.data()), msg_.size()}; }

 private:
  friend class Socket;
  zmq::message_t msg_;
};

// Counts frames lent to ZeroMQ that it has not released yet.
class InflightCounter {
 public:
  int count() const { return n_.load(std::memory_order_acquire); }
  // Blocks (spinning politely) until every lent frame has been released.
  void WaitForZero() const;

 private:
  friend class Socket;
  std::atomic<int> n_{0};
};

struct Payload {
  std::span<const uint64_t> keys;
  std::span<const float> values;
  bool has_values = false;
  // Zero-copy: when set, `keys` and `values` are lent to ZeroMQ and must stay unchanged until
  // lent->count() drops back; otherwise they are copied into the message.
  std::shared_ptr<InflightCounter> lent;
  // Or lent with an owner instead: `keys` and `values` live in memory `owner` keeps alive, and
  // ZeroMQ holds a reference to it until it has sent them (copy-on-write buffers: the owner's
  // other holders see use_count() > 1 while a frame is in flight).
  std::shared_ptr<const void> owner;
  // Alternatively a values frame already built (e.g. filled in place by the sender); it is
  // moved into the message and `values` is ignored.
  Frame* values_frame = nullptr;
};

struct Message {
  wire::Header header;
  Frame keys;
  Frame values;
  std::string peer;  // ROUTER sockets: the sender's identity
  Status malformed;  // OK for a valid message

  size_t num_values() const { return values.size() / sizeof(float); }
  // The keys, read in place where the frame is 8-byte aligned, else copied into *scratch (the
  // one place keys leave a frame). Valid while the message and *scratch are.
  std::span<const uint64_t> Keys(std::vector<uint64_t>* scratch) const;
  // Copies the keys / values out (frames need not be aligned).
  void CopyKeys(uint64_t* dst) const;
  void CopyValues(float* dst, size_t first = 0, size_t count = SIZE_MAX) const;
};

struct TrafficCounters {
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
  uint64_t messages_sent = 0;
  uint64_t messages_received = 0;
  uint64_t malformed_received = 0;

  TrafficCounters& operator+=(const TrafficCounters& o) {
    bytes_sent += o.bytes_sent;
    bytes_received += o.bytes_received;
    messages_sent += o.messages_sent;
    messages_received += o.messages_received;
    malformed_received += o.malformed_received;
    return *this;
  }
};

class Socket {
 public:
  // Binds `type` on tcp://bind_host:port (port 0 = ephemeral) or an inproc:// endpoint given as
  // bind_host with port 0; port() is the real port. Frames above max_message_bytes are refused
  // (the peer is disconnected).
  static Result<Socket> Bind(TransportContext& ctx, zmq::socket_type type, const std::string& bind_host,
                             uint16_t port, int64_t max_message_bytes = kMaxControlMessageBytes);
  // Connects to "tcp://host:port" (or inproc://...). `peer_name` labels the traffic counters.
  static Result<Socket> Connect(TransportContext& ctx, zmq::socket_type type, const std::string& endpoint,
                                const std::string& peer_name, int64_t max_message_bytes = kMaxControlMessageBytes);
  // The two kinds gradsync uses: a ROUTER that serves many peers (a shard, the scheduler) and a
  // DEALER that talks to one (a worker's link to a shard, a node's link to the scheduler).
  static Result<Socket> BindRouter(TransportContext& ctx, const std::string& bind_host, uint16_t port,
                                   int64_t max_message_bytes = kMaxControlMessageBytes) {
    return Bind(ctx, zmq::socket_type::router, bind_host, port, max_message_bytes);
  }
  static Result<Socket> ConnectDealer(TransportContext& ctx, const std::string& endpoint, const std::string& peer_name,
                                      int64_t max_message_bytes = kMaxControlMessageBytes) {
    return Connect(ctx, zmq::socket_type::dealer, endpoint, peer_name, max_message_bytes);
  }

  Socket(Socket&&) noexcept = default;
  Socket& operator=(Socket&&) noexcept = default;

  uint16_t port() const { return port_; }
  int64_t max_message_bytes() const { return max_message_bytes_; }

  // A bound TCP socket: from now on accept frames of up to `bytes`. ZeroMQ copies a socket's
  // options into its listener at bind time, so this unbinds and binds the same port again (a
  // connection the old listener accepted is closed: call it before peers connect). Retries while
  // the old listener is still closing; kUnavailable if the port cannot be had back.
  Status RaiseMaxMessageBytes(int64_t bytes);

  // Sends the header and the payload's frames. `peer` is the identity to route to on a ROUTER
  // socket (ignored otherwise). Never blocks longer than the socket's send timeout; a full queue
  // or a closed peer gives kUnavailable. On a ROUTER (a shard, the scheduler) it never blocks:
  // a reply to a peer whose queue is full is dropped at once, so one peer that does not read
  // cannot stall the loop that serves the others.
  Status Send(const std::string& peer, const wire::Header& header, const Payload& payload = {});
  // The same for a header the caller no longer needs (it is completed in place, not copied).
  Status Send(const std::string& peer, wire::Header&& header, const Payload& payload = {});

  // Receives one message, waiting at most timeout_ms (0: do not wait). kDeadlineExceeded when
  // nothing came. A malformed message is returned with `malformed` set (see the file comment).
  Result<Message> Recv(int timeout_ms);

  // A connecting socket: watches its handshakes (ZeroMQ's socket monitor), so that a peer that
  // refuses this process's key is reported as that, not as silence. HandshakeStatus() is OK until
  // a handshake failed for a reason that will not go away: the peer refused the key (it said
  // so), the peers disagree on --auth-dir, or with CURVE on a handshake broke off 3 times in a
  // row without one succeeding (the peer could not read our hello: another cluster's keys).
  // Then kUnauthenticated, naming the peer and the likely cause. Call from the owning thread.
  Status WatchHandshakes(TransportContext& ctx);
  Status HandshakeStatus();
  // With WatchHandshakes: whether the connection to the peer is up now (its handshake done and
  // no disconnection since). A peer process that died has its connection closed by its kernel;
  // one that is paused or starved keeps it.
  bool PeerConnected();

  const TrafficCounters& traffic() const { return total_; }
  // Bytes per peer (ROUTER: identity; DEALER: the name given at Connect). At most kMaxTrackedPeers
  // entries: a ROUTER sees a new identity for every connection, and strangers may open and close
  // as many as they like, so peers beyond that are counted together under kOtherPeers.
  static constexpr size_t kMaxTrackedPeers = 256;
  static constexpr const char* kOtherPeers = "(others)";
  const std::map<std::string, TrafficCounters>& traffic_by_peer() const { return by_peer_; }

 private:
  friend Result<std::vector<size_t>> PollReadable(std::span<Socket> sockets, int timeout_ms);
  friend Result<std::vector<size_t>> PollReadable(std::span<Socket* const> sockets, int timeout_ms);
// The same over sockets that live apart (a shard's own and its links to its backups).
Result<std::vector<size_t>> PollReadable(std::span<Socket* const> sockets, int timeout_ms);
  Socket(zmq::socket_t s, zmq::socket_type type, uint16_t port, std::string peer_name)
      : socket_(std::move(s)), type_(type), port_(port), peer_name_(std::move(peer_name)) {}
  // Recv's steps: the frames of one message (an error: none came), then its header and payload
  // checked and taken into `m` from frame `next` on (an error: why the message is malformed).
  Status ReceiveParts(int timeout_ms, std::vector<zmq::message_t>* parts);
  static Status TakeFrames(std::vector<zmq::message_t>& parts, size_t next, Message& m);
  void CountReceived(const std::string& peer, uint64_t bytes, bool malformed);
  TrafficCounters& PeerCounters(const std::string& peer);

  zmq::socket_t socket_;
  zmq::socket_type type_;
  uint16_t port_ = 0;
  std::string peer_name_;
  std::string endpoint_;  // bound sockets: what Bind bound (tcp with the real port)
  int64_t max_message_bytes_ = kMaxControlMessageBytes;
  int rcvtimeo_ms_ = -1;                    // ZMQ_RCVTIMEO as last set (Recv)
  std::string connected_to_;                // connected sockets: the endpoint
  HandshakeWatch handshakes_;               // WatchHandshakes (after socket_: it goes first)
  TrafficCounters total_;
  std::map<std::string, TrafficCounters> by_peer_;
};

// Waits at most timeout_ms for any of `sockets` to have a message; the indexes of those that do
// (empty after the timeout or a signal). kUnavailable if the poll itself fails.
Result<std::vector<size_t>> PollReadable(std::span<Socket> sockets, int timeout_ms);

// Buffers lent to ZeroMQ (zero-copy sends) and reused once it has released them, so that a
// reply costs one copy into memory that is already mapped. At most `max_buffers` exist; when
// all are in flight, Acquire returns null and the caller sends a fresh frame instead.
class LentBufferPool {
 public:
  struct Buffer {
    std::vector<float> values;
    std::vector<uint64_t> keys;
    std::shared_ptr<InflightCounter> inflight = std::make_shared<InflightCounter>();
  };
  explicit LentBufferPool(size_t max_buffers = 16) : max_buffers_(max_buffers) {}
  // A buffer no frame of which is in flight, with values.size() >= floats; or null.
  Buffer* Acquire(size_t floats);

 private:
  size_t max_buffers_;
  std::vector<std::unique_ptr<Buffer>> buffers_;
};

// The number of values a header's segments and keys describe: sum of lengths + num_keys.
// Fails on overflow.
Result<uint64_t> ExpectedValueCount(const wire::Header& h);

// A plane's decoders take a header only if it carries that plane's fields or none (an ERROR, or
// a message whose plane fields are all defaults): never another plane's.
Status CheckPlane(const wire::Header& h, wire::Header::PlaneCase plane);

// Keeps large buffers (ZeroMQ messages of megabytes) in the heap instead of fresh mmap()s, whose
// page faults and unmaps otherwise cost more than the copies. Binaries call it once at start.
void TuneAllocatorForLargeMessages();

}  // namespace gradsync
