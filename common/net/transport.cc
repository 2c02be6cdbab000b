#include "common/net/transport.h"

#include <malloc.h>

#include <chrono>
#include <cstring>
#include <cstdio>
#include <mutex>
#include <thread>

#include <google/protobuf/stubs/logging.h>

#include "common/base/logging.h"
#include "common/base/wait_policy.h"
#include "common/net/security.h"

namespace gradsync {
namespace {

// Protobuf logs a complaint for every string field with invalid UTF-8 it parses: a peer sending
// garbage could fill our stderr. Such a message is counted as malformed instead; protobuf's
// lines go to the debug log.
void QuietProtobufLog(google::protobuf::LogLevel level, const char* file, int line, const std::string& message) {
  if (level == google::protobuf::LOGLEVEL_FATAL) {
    std::fprintf(stderr, "[libprotobuf FATAL %s:%d] %s\n", file, line, message.c_str());
    return;
  }
  GRADSYNC_LOG(DEBUG) << "protobuf: " << message;
}
std::once_flag quiet_protobuf;

void ReleaseLent(void* /*data*/, void* hint) {
  auto* holder = static_cast<std::shared_ptr<InflightCounter>*>(hint);
  delete holder;
}

constexpr int kSendTimeoutMs = 5000;

}  // namespace

void InflightCounter::WaitForZero() const {
  while (n_.load(std::memory_order_acquire) > 0) YieldCore();
}

Frame Frame::Copy(const void* data, size_t size) {
  Frame f;
  f.msg_.rebuild(data, size);
  return f;
}

std::span<const uint64_t> Message::Keys(std::vector<uint64_t>* scratch) const {
  const size_t n = keys.size() / sizeof(uint64_t);
  if (n == 0) return {};
  if (reinterpret_cast<uintptr_t>(keys.data()) % alignof(uint64_t) == 0) {
    return {static_cast<const uint64_t*>(keys.data()), n};
  }
  scratch->resize(n);
  CopyKeys(scratch->data());
  return *scratch;
}

void Message::CopyKeys(uint64_t* dst) const { std::memcpy(dst, keys.data(), keys.size()); }

namespace {
Result<std::vector<size_t>> PollItems(std::vector<zmq::pollitem_t>& items, int timeout_ms) {
  std::vector<size_t> ready;
  try {
    if (zmq::poll(items.data(), items.size(), std::chrono::milliseconds(timeout_ms)) <= 0) return ready;
  } catch (const zmq::error_t& e) {
    if (e.num() == EINTR) return ready;  // a signal: as a timeout, the caller loops
    return UnavailableError(std::string("poll failed: ") + e.what());
  }
  for (size_t i = 0; i < items.size(); ++i)
    if (items[i].revents & ZMQ_POLLIN) ready.push_back(i);
  return ready;
}
}  // namespace

Result<std::vector<size_t>> PollReadable(std::span<Socket> sockets, int timeout_ms) {
  std::vector<zmq::pollitem_t> items;
  items.reserve(sockets.size());
  for (auto& s : sockets) items.push_back({static_cast<void*>(s.socket_), 0, ZMQ_POLLIN, 0});
  return PollItems(items, timeout_ms);
}

Result<std::vector<size_t>> PollReadable(std::span<Socket* const> sockets, int timeout_ms) {
  std::vector<zmq::pollitem_t> items;
  items.reserve(sockets.size());
  for (Socket* s : sockets) items.push_back({static_cast<void*>(s->socket_), 0, ZMQ_POLLIN, 0});
  return PollItems(items, timeout_ms);
}

LentBufferPool::Buffer* LentBufferPool::Acquire(size_t floats) {
  Buffer* best = nullptr;
  for (auto& b : buffers_) {
    if (b->inflight->count() != 0) continue;
    if (b->values.size() >= floats) return b.get();
    best = b.get();
  }
  if (!best) {
    if (buffers_.size() >= max_buffers_) return nullptr;  // all in flight: the caller builds a fresh frame
    buffers_.push_back(std::make_unique<Buffer>());
    best = buffers_.back().get();
  }
  best->values.resize(floats);
  return best;
}

void Message::CopyValues(float* dst, size_t first, size_t count) const {
  const size_t n = num_values();
  if (first >= n) return;
  count = std::min(count, n - first);
  std::memcpy(dst, static_cast<const char*>(values.data()) + first * sizeof(float), count * sizeof(float));
}

Result<uint64_t> ExpectedValueCount(const wire::Header& h) {
  if (h.num_keys() > (uint64_t{1} << 40)) return InvalidArgumentError("message describes too many keys");
  uint64_t total = h.num_keys();
  for (const auto& s : h.segments()) {
    if (s.length() > (uint64_t{1} << 40) || s.offset() > (uint64_t{1} << 40)) {
      return InvalidArgumentError("segment offset " + std::to_string(s.offset()) + " length " +
                                  std::to_string(s.length()) + " is out of range");
    }
    total += s.length();
  }
  if (total > (uint64_t{1} << 40)) return InvalidArgumentError("message describes too many values");
  return total;
}

Status CheckPlane(const wire::Header& h, wire::Header::PlaneCase plane) {
  if (h.plane_case() == plane || h.plane_case() == wire::Header::PLANE_NOT_SET) return OkStatus();
  auto name = [](wire::Header::PlaneCase c) {
    switch (c) {
      case wire::Header::kPs: return "PS";
      case wire::Header::kControl: return "control";
      case wire::Header::kReplica: return "replication";
      default: return "no";
    }
  };
  return InvalidArgumentError(std::string("a ") + name(plane) + " message (type " + std::to_string(h.type()) +
                              ") carries the " + name(h.plane_case()) + " plane's fields");
}

void TuneAllocatorForLargeMessages() {
  // glibc caps M_MMAP_THRESHOLD at 32 MiB, so mmap is switched off outright; freed memory stays
  // in the heap (trim threshold) for the next message of the same size.
  mallopt(M_MMAP_MAX, 0);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

Result<Socket> Socket::Bind(TransportContext& ctx, zmq::socket_type type, const std::string& bind_host,
                            uint16_t port, int64_t max_message_bytes) {
  try {
    zmq::socket_t s(ctx, type);
    s.set(zmq::sockopt::linger, 0);
    s.set(zmq::sockopt::maxmsgsize, max_message_bytes);
    s.set(zmq::sockopt::sndtimeo, kSendTimeoutMs);
    if (type == zmq::socket_type::router) s.set(zmq::sockopt::router_mandatory, 1);
    // --auth-dir: CURVE, only the cluster's key admitted.
    if (Status curve = ApplyCurveServer(ctx, s); !curve.ok()) return curve;
    std::string endpoint = bind_host.rfind("inproc://", 0) == 0
                               ? bind_host
                               : "tcp://" + bind_host + ":" + (port ? std::to_string(port) : "*");
    s.bind(endpoint);
    std::string last = s.get(zmq::sockopt::last_endpoint);
    uint16_t real_port = 0;
    auto colon = last.rfind(':');
    if (last.rfind("tcp://", 0) == 0 && colon != std::string::npos) {
      real_port = static_cast<uint16_t>(std::stoi(last.substr(colon + 1)));
    }
    Socket out(std::move(s), type, real_port, "");
    out.endpoint_ = last;
    out.max_message_bytes_ = max_message_bytes;
    return out;
  } catch (const zmq::error_t& e) {
    return UnavailableError("cannot bind " + bind_host + ":" + std::to_string(port) + ": " + e.what());
  }
}

Result<Socket> Socket::Connect(TransportContext& ctx, zmq::socket_type type, const std::string& endpoint,
                               const std::string& peer_name, int64_t max_message_bytes) {
  try {
    zmq::socket_t s(ctx, type);
    s.set(zmq::sockopt::linger, 0);
    s.set(zmq::sockopt::sndtimeo, kSendTimeoutMs);
    s.set(zmq::sockopt::maxmsgsize, max_message_bytes);
    ApplyCurveClient(ctx, s);
    s.connect(endpoint);
    Socket out(std::move(s), type, 0, peer_name);
    out.max_message_bytes_ = max_message_bytes;
    out.connected_to_ = endpoint;
    return out;
  } catch (const zmq::error_t& e) {
    return UnavailableError("cannot connect to " + endpoint + ": " + e.what());
  }
}

Status Socket::RaiseMaxMessageBytes(int64_t bytes) {
  if (bytes <= max_message_bytes_) return OkStatus();
  if (endpoint_.rfind("tcp://", 0) != 0) return FailedPreconditionError("only a bound TCP socket can be rebound");
  try {
    socket_.set(zmq::sockopt::maxmsgsize, bytes);
    socket_.unbind(endpoint_);
  } catch (const zmq::error_t& e) {
    return UnavailableError("cannot unbind " + endpoint_ + ": " + e.what());
  }
  // The old listener closes in ZeroMQ's I/O thread: the port may be busy for a moment.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (true) {
    try {
      socket_.bind(endpoint_);
      break;
    } catch (const zmq::error_t& e) {
      if (e.num() != EADDRINUSE || std::chrono::steady_clock::now() > deadline) {
        return UnavailableError("cannot bind " + endpoint_ + " again (to accept messages of " + std::to_string(bytes) +
                                " bytes): " + e.what());
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  max_message_bytes_ = bytes;
  return OkStatus();
}

Status Socket::WatchHandshakes(TransportContext& ctx) {
  return handshakes_.Start(static_cast<zmq::context_t&>(ctx), socket_, CurveEnabled(ctx), peer_name_, connected_to_);
}

bool Socket::PeerConnected() {
  (void)HandshakeStatus();
  return handshakes_.connected();
}

Status Socket::HandshakeStatus() { return handshakes_.Read(); }

TrafficCounters& Socket::PeerCounters(const std::string& peer) {
  auto it = by_peer_.find(peer);
  if (it != by_peer_.end()) return it->second;
  if (by_peer_.size() + 1 >= kMaxTrackedPeers) return by_peer_[kOtherPeers];
  return by_peer_[peer];
}

Status Socket::Send(const std::string& peer, const wire::Header& header, const Payload& payload) {
  wire::Header h = header;
  return Send(peer, std::move(h), payload);
}

Status Socket::Send(const std::string& peer, wire::Header&& header, const Payload& payload) {
  wire::Header& h = header;  // a temporary of the caller's (EncodeRequest, EncodeReply): set in place
  h.set_num_keys(payload.keys.size());
  h.set_has_values(payload.has_values || !payload.values.empty() || payload.values_frame);
  // Headers are small: serialized on the stack, then copied once into the frame.
  char stack[256];
  std::string heap;
  const size_t header_size = h.ByteSizeLong();
  char* at = stack;
  if (header_size > sizeof(stack)) {
    heap.resize(header_size);
    at = heap.data();
  }
  h.SerializeWithCachedSizesToArray(reinterpret_cast<uint8_t*>(at));  // the sizes ByteSizeLong cached
  const zmq::const_buffer bytes = zmq::buffer(static_cast<const void*>(at), header_size);
  const bool with_keys = !payload.keys.empty();
  const bool with_values = h.has_values();
  uint64_t total = bytes.size() + payload.keys.size_bytes() +
                   (payload.values_frame ? payload.values_frame->size() : payload.values.size_bytes());
  auto frame = [&](const void* data, size_t size) {
    if (payload.lent && size > 0) {
      payload.lent->n_.fetch_add(1, std::memory_order_relaxed);
      auto* hint = new std::shared_ptr<InflightCounter>(payload.lent);
      // The counter drops when ZeroMQ frees the frame; the holder keeps the counter alive.
      return zmq::message_t(const_cast<void*>(data), size,
                            [](void* d, void* hnt) {
                              auto* holder = static_cast<std::shared_ptr<InflightCounter>*>(hnt);
                              (*holder)->n_.fetch_sub(1, std::memory_order_release);
                              ReleaseLent(d, hnt);
                            },
                            hint);
    }
    if (payload.owner && size > 0) {
      auto* hint = new std::shared_ptr<const void>(payload.owner);
      return zmq::message_t(const_cast<void*>(data), size,
                            [](void*, void* hnt) { delete static_cast<std::shared_ptr<const void>*>(hnt); }, hint);
    }
    return zmq::message_t(data, size);
  };
  try {
    if (type_ == zmq::socket_type::router) {
      // A peer that does not read its replies must not stall the one loop that serves everyone
      // (a shard, the scheduler): when its queue is full the reply is dropped at once, not after
      // the send timeout. A real peer reads as it goes and never has that many replies queued.
      if (!socket_.send(zmq::buffer(peer), zmq::send_flags::sndmore | zmq::send_flags::dontwait)) {
        return UnavailableError("reply to " + peer + " dropped: its queue is full (it does not read)");
      }
    }
    auto more = [](bool m) { return m ? zmq::send_flags::sndmore : zmq::send_flags::none; };
    if (!socket_.send(bytes, more(with_keys || with_values))) {
      return UnavailableError("send timed out (peer gone or queue full)");
    }
    if (with_keys) socket_.send(frame(payload.keys.data(), payload.keys.size_bytes()), more(with_values));
    if (with_values) {
      if (payload.values_frame) socket_.send(payload.values_frame->msg_, zmq::send_flags::none);
      else socket_.send(frame(payload.values.data(), payload.values.size_bytes()), zmq::send_flags::none);
    }
  } catch (const zmq::error_t& e) {
    return UnavailableError(std::string("send failed: ") + e.what());
  }
  const std::string& who = type_ == zmq::socket_type::router ? peer : peer_name_;
  auto& p = PeerCounters(who);
  p.bytes_sent += total;
  p.messages_sent++;
  total_.bytes_sent += total;
  total_.messages_sent++;
  return OkStatus();
}

void Socket::CountReceived(const std::string& peer, uint64_t bytes, bool malformed) {
  auto& p = PeerCounters(peer);
  p.bytes_received += bytes;
  p.messages_received++;
  total_.bytes_received += bytes;
  total_.messages_received++;
  if (malformed) {
    p.malformed_received++;
    total_.malformed_received++;
  }
}

Status Socket::ReceiveParts(int timeout_ms, std::vector<zmq::message_t>* parts) {
  try {
    // A message that is there is taken at once, and an empty queue is waited on in ZeroMQ's own
    // blocking receive (one system call to sleep in). A zmq_poll in front of every receive cost
    // several system calls per message, and callers drain a socket with Recv(0).
    zmq::message_t part;
    bool got = false;
    if (timeout_ms == 0) {
      got = socket_.recv(part, zmq::recv_flags::dontwait).has_value();
    } else {
      if (timeout_ms != rcvtimeo_ms_) {
        socket_.set(zmq::sockopt::rcvtimeo, timeout_ms);
        rcvtimeo_ms_ = timeout_ms;
      }
      got = socket_.recv(part).has_value();
    }
    if (!got) return DeadlineExceededError("no message within " + std::to_string(timeout_ms) + " ms");
    parts->reserve(4);
    parts->push_back(std::move(part));
    while (parts->back().more()) {
      if (parts->size() > 16) {  // drain and drop anything absurdly long
        do {
          if (!socket_.recv(part, zmq::recv_flags::dontwait)) break;
        } while (part.more());
        break;
      }
      if (!socket_.recv(part, zmq::recv_flags::dontwait)) break;
      parts->push_back(std::move(part));
    }
  } catch (const zmq::error_t& e) {
    // A signal interrupted the wait: nothing arrived (the caller loops as on a timeout).
    if (e.num() == EINTR && parts->empty()) return DeadlineExceededError("interrupted");
    return UnavailableError(std::string("receive failed: ") + e.what());
  }
  return OkStatus();
}

Status Socket::TakeFrames(std::vector<zmq::message_t>& parts, size_t next, Message& m) {
  if (parts.size() > 16 + next) return InvalidArgumentError("too many frames");
  if (next >= parts.size()) return InvalidArgumentError("no header frame");
  std::call_once(quiet_protobuf, [] { google::protobuf::SetLogHandler(QuietProtobufLog); });
  if (!m.header.ParseFromArray(parts[next].data(), static_cast<int>(parts[next].size()))) {
    m.header.Clear();
    return InvalidArgumentError("header frame is not a valid protobuf Header");
  }
  ++next;
  if (m.header.type() == wire::TYPE_UNSPECIFIED || !wire::Type_IsValid(m.header.type())) {
    return InvalidArgumentError("unknown message type " + std::to_string(m.header.type()));
  }
  const size_t payload_frames = (m.header.num_keys() > 0 ? 1 : 0) + (m.header.has_values() ? 1 : 0);
  if (parts.size() - next != payload_frames) {
    return InvalidArgumentError("header announces " + std::to_string(payload_frames) + " payload frame(s) but " +
                                std::to_string(parts.size() - next) + " came");
  }
  if (m.header.num_keys() > 0) {
    m.keys.msg_ = std::move(parts[next++]);
    // Divided, not multiplied: a huge num_keys must not wrap around to the frame's size.
    if (m.keys.size() % sizeof(uint64_t) != 0 || m.keys.size() / sizeof(uint64_t) != m.header.num_keys()) {
      return InvalidArgumentError("keys frame has " + std::to_string(m.keys.size()) + " bytes, header says " +
                                  std::to_string(m.header.num_keys()) + " keys");
    }
  }
  // Segments and counts are bounded for every message, with values or not (a pull's segments
  // size its reply).
  auto want = ExpectedValueCount(m.header);
  if (!want.ok()) return InvalidArgumentError(want.status().message());
  if (m.header.has_values()) {
    m.values.msg_ = std::move(parts[next++]);
    // A compressed payload is checked by its codec's decoder; it is never larger than raw floats
    // plus a small header.
    // Table rows (ARCHITECTURE.md, "Tables"): a row of its table's dim floats per key, which the
    // receiver, knowing the tables, checks exactly; here: whole floats, 1 to 65536 per key.
    const bool rows = (m.header.has_ps() && m.header.ps().tables_size() > 0) ||
                      (m.header.has_replica() && m.header.replica().tables_size() > 0);
    if (!m.header.codec().empty()) {
      if (m.values.size() > *want * sizeof(float) + 64) {
        return InvalidArgumentError("compressed payload larger than its raw values");
      }
    } else if (rows) {
      const uint64_t floats = m.values.size() / sizeof(float);
      if (m.values.size() % sizeof(float) != 0 || floats < m.header.num_keys() ||
          floats / 65536 > m.header.num_keys() || !m.header.segments().empty()) {
        return InvalidArgumentError("values frame has " + std::to_string(m.values.size()) + " bytes for the rows of " +
                                    std::to_string(m.header.num_keys()) + " table ids");
      }
    } else if (m.values.size() != *want * sizeof(float)) {
      return InvalidArgumentError("values frame has " + std::to_string(m.values.size()) + " bytes, header says " +
                                  std::to_string(*want) + " floats");
    }
  }
  return OkStatus();
}

Result<Message> Socket::Recv(int timeout_ms) {
  std::vector<zmq::message_t> parts;
  if (Status s = ReceiveParts(timeout_ms, &parts); !s.ok()) return s;
  Message m;
  size_t next = 0;
  uint64_t bytes = 0;
  for (const auto& p : parts) bytes += p.size();
  if (type_ == zmq::socket_type::router) {
    if (parts.empty()) return DeadlineExceededError("empty receive");
    m.peer = parts[0].to_string();
    next = 1;
  }
  const std::string who = type_ == zmq::socket_type::router ? m.peer : peer_name_;
  if (Status malformed = TakeFrames(parts, next, m); !malformed.ok()) {
    m.malformed = std::move(malformed);
    CountReceived(who, bytes, true);
    return m;
  }
  CountReceived(who, bytes, false);
  return m;
}

}  // namespace gradsync
