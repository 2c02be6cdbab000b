#include "common/net/data_channel.h"
#include "common/base/clock.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <boost/asio.hpp>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <vector>

namespace gradsync {

static_assert(std::endian::native == std::endian::little, "frames are little-endian, as the values are sent raw");

DataStream::DataStream(int fd) : fd_(fd) {
  if (fd_ < 0) return;
  // Blocking, with a timeout per call (SO_RCVTIMEO / SO_SNDTIMEO): a large frame moves in one
  // system call that sleeps in the kernel until it is done, not in a wake-up per buffer's worth.
  const int flags = fcntl(fd_, F_GETFL, 0);
  if (flags >= 0) (void)fcntl(fd_, F_SETFL, flags & ~O_NONBLOCK);
  int one = 1;
  (void)setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

DataStream::DataStream(DataStream&& o) noexcept
    : fd_(o.fd_), read_(o.read_.load()), written_(o.written_.load()) {
  o.fd_ = -1;
}

DataStream& DataStream::operator=(DataStream&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.fd_;
    read_ = o.read_.load();
    written_ = o.written_.load();
    o.fd_ = -1;
  }
  return *this;
}

DataStream::~DataStream() {
  if (fd_ >= 0) ::close(fd_);
}

Result<DataStream> DataStream::Connect(const std::string& host, int port, double timeout_s) {
  namespace asio = boost::asio;
  using asio::ip::tcp;
  asio::io_context io;
  tcp::socket sock(io);
  boost::system::error_code resolved;
  tcp::resolver resolver(io);
  auto endpoints = resolver.resolve(host, std::to_string(port), resolved);
  if (resolved) return UnavailableError("data channel: cannot resolve " + host + ": " + resolved.message());
  boost::system::error_code result = asio::error::timed_out;
  asio::async_connect(sock, endpoints, [&](const boost::system::error_code& e, const tcp::endpoint&) { result = e; });
  io.run_for(std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::duration<double>(timeout_s)));
  if (result) {
    return UnavailableError("data channel: cannot connect to " + host + ":" + std::to_string(port) + ": " +
                            result.message());
  }
  const int fd = ::dup(sock.native_handle());
  if (fd < 0) return UnavailableError(ErrnoMessage("data channel: dup"));
  return DataStream(fd);
}

void DataStream::SetTimeout(int option, double idle_s, double* current) {
  if (*current == idle_s) return;
  const double clamped = std::clamp(idle_s, 0.001, 1e6);
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(clamped);
  tv.tv_usec = static_cast<suseconds_t>((clamped - static_cast<double>(tv.tv_sec)) * 1e6);
  (void)setsockopt(fd_, SOL_SOCKET, option, &tv, sizeof(tv));
  *current = idle_s;
}

namespace {
Status NoProgress(double idle_s) {
  return DeadlineExceededError("data channel: nothing moved in " + SecondsText(idle_s) + " s");
}
}  // namespace

bool DataStream::WaitReadable(int timeout_ms) const {
  pollfd p{fd_, POLLIN, 0};
  return ::poll(&p, 1, timeout_ms) > 0;
}

bool DataStream::PeerClosed() const {
  if (fd_ < 0) return true;
  pollfd p{fd_, POLLRDHUP, 0};
  return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

void DataStream::Shutdown() {
  if (fd_ >= 0) (void)::shutdown(fd_, SHUT_RDWR);
}

Status DataStream::Read(void* dst, size_t n, double idle_s) {
  if (fd_ < 0) return FailedPreconditionError("data channel: not connected");
  SetTimeout(SO_RCVTIMEO, idle_s, &rcv_timeout_);
  auto* p = static_cast<uint8_t*>(dst);
  while (n > 0) {
    const ssize_t got = ::recv(fd_, p, n, MSG_WAITALL);
    if (got > 0) {
      p += got;
      n -= static_cast<size_t>(got);
      read_.fetch_add(static_cast<uint64_t>(got), std::memory_order_relaxed);
      continue;
    }
    if (got == 0) return UnavailableError("data channel: the peer closed the connection");
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return NoProgress(idle_s);
    return UnavailableError(ErrnoMessage("data channel: receive"));
  }
  return OkStatus();
}

Status DataStream::Discard(uint64_t n, double idle_s) {
  std::vector<uint8_t> sink(static_cast<size_t>(std::min<uint64_t>(n, uint64_t{1} << 20)));
  while (n > 0) {
    const size_t k = static_cast<size_t>(std::min<uint64_t>(n, sink.size()));
    RETURN_IF_ERROR(Read(sink.data(), k, idle_s));
    n -= k;
  }
  return OkStatus();
}

Status DataStream::Write(std::span<const iovec> parts, double idle_s) {
  if (fd_ < 0) return FailedPreconditionError("data channel: not connected");
  SetTimeout(SO_SNDTIMEO, idle_s, &snd_timeout_);
  std::vector<iovec> left(parts.begin(), parts.end());
  size_t first = 0;
  while (first < left.size()) {
    if (left[first].iov_len == 0) {
      ++first;
      continue;
    }
    msghdr msg{};
    msg.msg_iov = left.data() + first;
    msg.msg_iovlen = std::min<size_t>(left.size() - first, IOV_MAX);
    const ssize_t sent = ::sendmsg(fd_, &msg, MSG_NOSIGNAL);
    if (sent < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return NoProgress(idle_s);
      return UnavailableError(ErrnoMessage("data channel: send"));
    }
    written_.fetch_add(static_cast<uint64_t>(sent), std::memory_order_relaxed);
    size_t k = static_cast<size_t>(sent);
    while (k > 0 && first < left.size()) {
      const size_t take = std::min(k, left[first].iov_len);
      left[first].iov_base = static_cast<uint8_t*>(left[first].iov_base) + take;
      left[first].iov_len -= take;
      k -= take;
      if (left[first].iov_len == 0) ++first;
    }
  }
  return OkStatus();
}

Result<DataFrameHead> DataStream::ReadHead(double idle_s) {
  uint8_t raw[kDataFrameHeadBytes];
  RETURN_IF_ERROR(Read(raw, sizeof(raw), idle_s));
  DataFrameHead h;
  std::memcpy(&h.seq, raw, 8);
  std::memcpy(&h.bytes, raw + 8, 8);
  return h;
}

Status DataStream::WriteFrame(uint64_t seq, std::span<const std::span<const float>> values, double idle_s) {
  // A frame written into a connection the peer closed would be taken by the kernel and read by
  // nobody: the writer learns it now, not from the request the frame belongs to.
  if (PeerClosed()) return UnavailableError("data channel: the peer closed the connection");
  uint64_t head[2] = {seq, 0};
  for (const auto& v : values) head[1] += v.size_bytes();
  std::vector<iovec> parts;
  parts.reserve(values.size() + 1);
  parts.push_back({head, sizeof(head)});
  for (const auto& v : values) parts.push_back({const_cast<float*>(v.data()), v.size_bytes()});
  return Write(parts, idle_s);
}

}  // namespace gradsync
