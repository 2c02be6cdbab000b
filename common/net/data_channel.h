// The data channel: one TCP connection per worker and shard beside ZeroMQ, carrying only bulk
// values. ZeroMQ still carries every header (and so every check, consistency rule and error
// reply); a header with `data` names the frame that holds its values. What it saves, for large
// dense pushes and pulls: the receiver reads straight into a buffer it keeps mapped (the shard)
// or into the destination itself (the worker's parameters), where ZeroMQ allocates every
// received message on its I/O thread (page faults on every large one) and the worker copies the
// values out of it once more.
//
// Frames, in each direction in order: {seq: u64, bytes: u64, values: `bytes` bytes}, little-endian,
// seq counting 1, 2, ... per direction. A worker writes a push's frame before it sends the push's
// header, so the header finds its values there; a shard queues a pull's frame as it sends the
// header, and the worker reads the frame when the header arrives.
//
// Setting up (worker): CHANNEL_ATTACH (CHANNEL_DATA) over ZeroMQ with a fresh random token; the reply names the
// port; the worker connects, sends the token and reads an 8-byte acknowledgement. The shard takes
// a connection only for a token it was given (once) over the ZeroMQ connection of that worker.
// The channel is neither authenticated nor encrypted beyond that, so jobs with --auth-dir (CURVE)
// keep all values on ZeroMQ.
#pragma once

#include <sys/uio.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "common/base/status.h"

namespace gradsync {

inline constexpr size_t kDataFrameHeadBytes = 16;
inline constexpr size_t kDataAckBytes = 8;
inline constexpr char kDataAck[kDataAckBytes + 1] = "GSDATA01";

struct DataFrameHead {
  uint64_t seq = 0;
  uint64_t bytes = 0;
};

// A connected TCP socket with bounded reads and writes. Every call gives up after
// `idle_s` seconds in which no byte moved (kDeadlineExceeded); a closed peer is kUnavailable.
class DataStream {
 public:
  DataStream() = default;
  explicit DataStream(int fd);  // takes the descriptor (made non-blocking, TCP_NODELAY)
  DataStream(DataStream&& o) noexcept;
  DataStream& operator=(DataStream&& o) noexcept;
  DataStream(const DataStream&) = delete;
  DataStream& operator=(const DataStream&) = delete;
  ~DataStream();

  // Connects to host:port within timeout_s (Boost.Asio: the host may be a name).
  static Result<DataStream> Connect(const std::string& host, int port, double timeout_s);

  bool valid() const { return fd_ >= 0; }
  int fd() const { return fd_; }

  Status Read(void* dst, size_t n, double idle_s);
  Status Discard(uint64_t n, double idle_s);
  Status Write(std::span<const iovec> parts, double idle_s);
  Result<DataFrameHead> ReadHead(double idle_s);
  // One frame: the head, then `values` in order, gathered (no copy). kUnavailable without
  // writing anything when the peer has closed the connection.
  Status WriteFrame(uint64_t seq, std::span<const std::span<const float>> values, double idle_s);
  // Waits up to timeout_ms for a byte (or the peer's close) to read. False on timeout.
  bool WaitReadable(int timeout_ms) const;
  // The peer closed the connection (or it failed): nothing written now would be read.
  bool PeerClosed() const;
  // Stops the connection in both directions: a read or write blocked in another thread returns.
  void Shutdown();

  // Bytes moved so far (read from any thread: each direction is counted by the one that moves it).
  uint64_t bytes_read() const { return read_.load(std::memory_order_relaxed); }
  uint64_t bytes_written() const { return written_.load(std::memory_order_relaxed); }

 private:
  void SetTimeout(int option, double idle_s, double* current);
  int fd_ = -1;
  double rcv_timeout_ = -1, snd_timeout_ = -1;  // as set on the socket (each by its direction's thread)
  std::atomic<uint64_t> read_{0}, written_{0};
};

}  // namespace gradsync
