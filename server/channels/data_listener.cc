#include "server/channels/data_listener.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio.hpp>
#include <chrono>

#include "common/base/clock.h"
#include "common/base/logging.h"
#include "common/ps/ps_protocol.h"

namespace gradsync {

namespace {
// How long a frame may stall (no byte moving either way) before its connection is given up.
constexpr double kIdleSeconds = 60.0;
// How long the acknowledgement to a new connection may take to write.
constexpr double kTokenSeconds = 5.0;
// A connection that has not presented its token within this long is closed; at most this many
// wait per host, and in all (DataListener::AcceptLoop).
constexpr double kPendingSeconds = 1.0;
constexpr long kPendingPerHost = 16;
constexpr size_t kPendingTotal = 256;
}  // namespace

struct DataConn::Pool {
  struct Buffer {
    std::vector<float> values;  // its capacity: touched once when made, so it stays mapped
    uint64_t seq = 0;
    size_t n = 0;
    enum State { kFree, kFilling, kReady, kLeased } state = kFree;
  };
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::unique_ptr<Buffer>> buffers;
  uint64_t bytes = 0;  // of all buffers
  uint64_t cap = 0;
  uint64_t next_in = 1;
  bool stop = false;
  Status broken;

  // A buffer of at least n floats to fill (the reader), or null once stopped or broken.
  Buffer* Acquire(size_t n) {
    std::unique_lock lk(mu);
    while (true) {
      if (stop || !broken.ok()) return nullptr;
      Buffer* best = nullptr;
      for (auto& b : buffers) {
        if (b->state == Buffer::kFree && b->values.size() >= n && (!best || b->values.size() < best->values.size())) {
          best = b.get();
        }
      }
      if (best) {
        best->state = Buffer::kFilling;
        return best;
      }
      const uint64_t want = n * sizeof(float);
      // Room for a new one, after dropping free buffers too small to use.
      for (auto it = buffers.begin(); bytes + want > cap && it != buffers.end();) {
        if ((*it)->state == Buffer::kFree) {
          bytes -= (*it)->values.size() * sizeof(float);
          it = buffers.erase(it);
        } else {
          ++it;
        }
      }
      if (bytes + want <= cap || buffers.empty()) {
        auto b = std::make_unique<Buffer>();
        b->values.resize(n);
        b->state = Buffer::kFilling;
        bytes += want;
        buffers.push_back(std::move(b));
        return buffers.back().get();
      }
      cv.wait(lk);  // every buffer is held (a bsp round): wait for one to come back
    }
  }
  void Free(Buffer* b) {
    {
      std::lock_guard lk(mu);
      b->state = Buffer::kFree;
    }
    cv.notify_all();
  }
};

DataConn::DataConn(int worker, int64_t max_floats, DataStream stream)
    : worker_(worker), max_floats_(max_floats), stream_(std::move(stream)), pool_(std::make_shared<Pool>()) {
  // Every held push of a worker is part of the range (a round holds one push), and the next
  // one may be arriving: room for two ranges.
  pool_->cap = 2 * static_cast<uint64_t>(std::max<int64_t>(1, max_floats_)) * sizeof(float);
}

void DataConn::Start() {
  reader_ = std::thread([this] { ReadLoop(); });
  writer_ = std::thread([this] { WriteLoop(); });
}

DataConn::~DataConn() {
  {
    std::lock_guard lk(out_mu_);
    stop_ = true;
  }
  out_cv_.notify_all();
  {
    std::lock_guard lk(pool_->mu);
    pool_->stop = true;
  }
  pool_->cv.notify_all();
  stream_.Shutdown();
  if (reader_.joinable()) reader_.join();
  if (writer_.joinable()) writer_.join();
}

void DataConn::Break(Status s) {
  {
    std::lock_guard lk(pool_->mu);
    if (pool_->stop || !pool_->broken.ok()) return;
    pool_->broken = std::move(s);
  }
  GRADSYNC_LOG(DEBUG) << "data channel of worker " << worker_ << ": " << pool_->broken;
  pool_->cv.notify_all();
  out_cv_.notify_all();
  stream_.Shutdown();
}

Status DataConn::health() const {
  std::lock_guard lk(pool_->mu);
  return pool_->broken;
}

void DataConn::ReadLoop() {
  while (true) {
    {
      std::lock_guard lk(pool_->mu);
      if (pool_->stop || !pool_->broken.ok()) return;
    }
    if (!stream_.WaitReadable(200)) continue;
    auto head = stream_.ReadHead(kIdleSeconds);
    if (!head.ok()) return Break(head.status());
    uint64_t expected;
    {
      std::lock_guard lk(pool_->mu);
      expected = pool_->next_in;
    }
    if (head->seq != expected) {
      return Break(DataLossError("push frame " + std::to_string(head->seq) + " where " + std::to_string(expected) +
                                 " was next"));
    }
    if (head->bytes == 0 || head->bytes % sizeof(float) != 0 ||
        head->bytes / sizeof(float) > static_cast<uint64_t>(max_floats_)) {
      return Break(InvalidArgumentError("a push frame of " + std::to_string(head->bytes) + " bytes (the range holds " +
                                        std::to_string(max_floats_) + " floats)"));
    }
    const size_t n = static_cast<size_t>(head->bytes / sizeof(float));
    Pool::Buffer* b = pool_->Acquire(n);
    if (b == nullptr) return;
    if (Status s = stream_.Read(b->values.data(), head->bytes, kIdleSeconds); !s.ok()) {
      pool_->Free(b);
      return Break(s);
    }
    {
      std::lock_guard lk(pool_->mu);
      b->seq = head->seq;
      b->n = n;
      b->state = Pool::Buffer::kReady;
      pool_->next_in++;
    }
    pool_->cv.notify_all();
  }
}

void DataConn::WriteLoop() {
  if (Status s = stream_.Write(std::vector<iovec>{{const_cast<char*>(kDataAck), kDataAckBytes}}, kTokenSeconds);
      !s.ok()) {
    return Break(s);
  }
  while (true) {
    Outgoing o;
    {
      std::unique_lock lk(out_mu_);
      out_cv_.wait(lk, [&] { return stop_ || !out_.empty(); });
      if (stop_) return;
      o = std::move(out_.front());
      out_.pop_front();
    }
    Status s = stream_.WriteFrame(o.seq, o.values, kIdleSeconds);
    o.owner.reset();
    if (!s.ok()) {
      Break(s);
      std::lock_guard lk(out_mu_);
      out_.clear();
      return;
    }
  }
}

Result<std::shared_ptr<const float>> DataConn::TakePush(uint64_t seq, size_t n, double wait_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(wait_s);
  std::unique_lock lk(pool_->mu);
  while (true) {
    bool freed = false;
    for (auto& b : pool_->buffers) {
      if (b->state != Pool::Buffer::kReady) continue;
      if (b->seq < seq) {  // a frame whose header never came (or was refused): nothing reads it
        b->state = Pool::Buffer::kFree;
        freed = true;
        continue;
      }
      if (b->seq != seq) continue;
      if (b->n != n) {
        b->state = Pool::Buffer::kFree;
        pool_->cv.notify_all();
        return InvalidArgumentError("data frame " + std::to_string(seq) + " holds " + std::to_string(b->n) +
                                    " floats but the push names " + std::to_string(n));
      }
      b->state = Pool::Buffer::kLeased;
      if (freed) pool_->cv.notify_all();
      std::shared_ptr<Pool> pool = pool_;
      Pool::Buffer* held = b.get();
      return std::shared_ptr<const float>(held->values.data(), [pool, held](const float*) { pool->Free(held); });
    }
    if (freed) pool_->cv.notify_all();
    if (!pool_->broken.ok()) {
      return FailedPreconditionError("the data channel of worker " + std::to_string(worker_) +
                                     " is down: " + pool_->broken.message());
    }
    if (seq < pool_->next_in) {
      return InvalidArgumentError("data frame " + std::to_string(seq) + " was already taken or dropped");
    }
    if (pool_->cv.wait_until(lk, deadline) == std::cv_status::timeout && std::chrono::steady_clock::now() >= deadline) {
      return DeadlineExceededError("data frame " + std::to_string(seq) + " of worker " + std::to_string(worker_) +
                                   " did not arrive within " + SecondsText(wait_s) + " s of its header");
    }
  }
}

void DataConn::DropPush(uint64_t seq) {
  std::lock_guard lk(pool_->mu);
  for (auto& b : pool_->buffers) {
    if (b->state == Pool::Buffer::kReady && b->seq == seq) {
      b->state = Pool::Buffer::kFree;
      pool_->cv.notify_all();
    }
  }
}

Result<uint64_t> DataConn::SendPull(std::vector<std::span<const float>> values, std::shared_ptr<const void> owner) {
  RETURN_IF_ERROR(health());
  uint64_t seq;
  {
    std::lock_guard lk(out_mu_);
    if (stop_) return FailedPreconditionError("the data channel is closing");
    seq = ++next_out_;
    out_.push_back({seq, std::move(values), std::move(owner)});
  }
  out_cv_.notify_one();
  return seq;
}

// The listener.

DataListener::DataListener(int fd, int port) : fd_(fd), port_(port) {
  acceptor_ = std::thread([this] { AcceptLoop(); });
}

Result<std::unique_ptr<DataListener>> DataListener::Create(const std::string& bind_host) {
  namespace asio = boost::asio;
  using asio::ip::tcp;
  asio::io_context io;
  boost::system::error_code ec;
  tcp::resolver resolver(io);
  auto endpoints = resolver.resolve(bind_host, "0", ec);
  if (ec || endpoints.empty()) return InvalidArgumentError("data channel: cannot resolve " + bind_host + ": " + ec.message());
  tcp::acceptor acceptor(io);
  const tcp::endpoint ep = *endpoints.begin();
  acceptor.open(ep.protocol(), ec);
  if (!ec) acceptor.bind(ep, ec);
  if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return UnavailableError("data channel: cannot listen on " + bind_host + ": " + ec.message());
  const int port = acceptor.local_endpoint().port();
  const int fd = ::dup(acceptor.native_handle());
  if (fd < 0) return UnavailableError("data channel: dup failed");
  return std::unique_ptr<DataListener>(new DataListener(fd, port));
}

DataListener::~DataListener() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  if (acceptor_.joinable()) acceptor_.join();
  ::close(fd_);
  std::map<int, std::shared_ptr<DataConn>> conns;
  {
    std::lock_guard lk(mu_);
    conns.swap(conns_);
  }
}

// A connection accepted but not yet past its token: its bytes so far, when it came, from where.
struct DataListener::Pending {
  int fd = -1;
  std::string token;
  std::chrono::steady_clock::time_point since;
  std::string peer;  // its address (the host part): the bound on pending connections is per host
  uint64_t received = 0;  // bytes read from it (counted, strangers' too, once they are done with)
};

namespace {
using Pending = DataListener::Pending;

std::string PeerHost(const sockaddr_storage& a) {
  char text[INET6_ADDRSTRLEN] = "";
  if (a.ss_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in&>(a).sin_addr, text, sizeof text);
  } else if (a.ss_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6&>(a).sin6_addr, text, sizeof text);
  }
  return text;
}

// Reads what has come of p's token without waiting; true once all of it is there, false while
// more may come; an error (the peer closed) is `*gone`.
bool ReadToken(Pending& p, bool* gone) {
  while (p.token.size() < kDataTokenBytes) {
    char buf[kDataTokenBytes];
    const ssize_t n = ::recv(p.fd, buf, kDataTokenBytes - p.token.size(), MSG_DONTWAIT);
    if (n > 0) {
      p.token.append(buf, static_cast<size_t>(n));
      p.received += static_cast<uint64_t>(n);
      continue;
    }
    *gone = n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
    return false;
  }
  return true;
}
}  // namespace

void DataListener::AcceptLoop() {
  // Every connection that has not presented its token yet is read from at once, without
  // blocking: a stranger that stays silent holds no one up. It is closed after kPendingSeconds,
  // or when its host has kPendingPerHost others pending (the oldest goes), or kPendingTotal in all:
  // a worker, which sends its token the moment it connects, gets through whatever strangers do.
  std::vector<Pending> pending;
  ::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) | O_NONBLOCK);  // accept until none waits, never block
  while (true) {
    {
      std::lock_guard lk(mu_);
      if (stop_) break;
    }
    std::vector<pollfd> fds{{fd_, POLLIN, 0}};
    for (const Pending& p : pending) fds.push_back({p.fd, POLLIN, 0});
    if (::poll(fds.data(), fds.size(), 100) < 0) continue;
    std::vector<Pending> ready;  // past their token, in the order they came
    // The pending connections that may have more of their token.
    for (size_t i = pending.size(); i-- > 0;) {
      if (fds[i + 1].revents == 0) continue;
      bool gone = false;
      if (ReadToken(pending[i], &gone)) {
        ready.push_back(pending[i]);
        pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(i));
      } else if (gone) {
        ClosePending(pending, i);
      }
    }
    if (fds[0].revents & POLLIN) AcceptNew(pending, ready);
    // Silent too long: closed without a word.
    const auto now = std::chrono::steady_clock::now();
    for (size_t i = pending.size(); i-- > 0;) {
      if (now - pending[i].since > std::chrono::duration<double>(kPendingSeconds)) ClosePending(pending, i);
    }
    for (Pending& p : ready) {
      Count(p);
      Take(p.fd, p.token);
    }
  }
  for (const Pending& p : pending) ::close(p.fd);
}

void DataListener::Count(const Pending& p) {
  std::lock_guard lk(mu_);
  retired_in_ += p.received;  // every byte that came in, a stranger's too
}

void DataListener::ClosePending(std::vector<Pending>& pending, size_t i) {
  Count(pending[i]);
  ::close(pending[i].fd);
  pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(i));
}

void DataListener::AcceptNew(std::vector<Pending>& pending, std::vector<Pending>& ready) {
  // New connections, each read at once (a worker's token is usually there already).
  for (int k = 0; k < 64; ++k) {
    sockaddr_storage addr{};
    socklen_t len = sizeof addr;
    const int c = ::accept4(fd_, reinterpret_cast<sockaddr*>(&addr), &len, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (c < 0) break;
    Pending p{c, "", std::chrono::steady_clock::now(), PeerHost(addr)};
    bool gone = false;
    if (ReadToken(p, &gone)) {
      ready.push_back(std::move(p));
      continue;
    }
    if (gone) {
      Count(p);
      ::close(c);
      continue;
    }
    const auto same_host = [&](const Pending& q) { return q.peer == p.peer; };
    while (std::count_if(pending.begin(), pending.end(), same_host) >= kPendingPerHost) {
      ClosePending(pending, static_cast<size_t>(std::find_if(pending.begin(), pending.end(), same_host) - pending.begin()));
    }
    if (pending.size() >= kPendingTotal) ClosePending(pending, 0);
    pending.push_back(std::move(p));
  }
}

void DataListener::Take(int fd, const std::string& token) {
  DataStream stream(fd);  // takes the descriptor, closed with it
  Expected e;
  {
    std::lock_guard lk(mu_);
    auto it = expected_.find(token);
    if (it == expected_.end()) return;  // no such token: closed without a word
    e = it->second;
    expected_.erase(it);
  }
  {
    auto conn = std::make_shared<DataConn>(e.worker, e.max_floats, std::move(stream));
    std::shared_ptr<DataConn> old;
    {
      std::lock_guard lk(mu_);
      auto& slot = conns_[e.worker];
      old = std::move(slot);
      if (old) {
        retired_in_ += old->bytes_received();
        retired_out_ += old->bytes_sent();
      }
      slot = conn;
    }
    // Findable before the worker hears it may send: its first header finds the connection.
    conn->Start();
    old.reset();  // outside the lock: joins its threads
  }
}

void DataListener::Expect(const std::string& token, int worker, int64_t max_floats) {
  std::lock_guard lk(mu_);
  for (auto it = expected_.begin(); it != expected_.end();) {  // one outstanding token per worker
    it = it->second.worker == worker ? expected_.erase(it) : std::next(it);
  }
  expected_[token] = {worker, max_floats};
}

std::shared_ptr<DataConn> DataListener::Find(int worker) const {
  std::lock_guard lk(mu_);
  auto it = conns_.find(worker);
  return it == conns_.end() ? nullptr : it->second;
}

void DataListener::Drop(int worker) {
  std::shared_ptr<DataConn> old;
  {
    std::lock_guard lk(mu_);
    auto it = conns_.find(worker);
    if (it == conns_.end()) return;
    old = std::move(it->second);
    conns_.erase(it);
    retired_in_ += old->bytes_received();
    retired_out_ += old->bytes_sent();
  }
}

size_t DataListener::size() const {
  std::lock_guard lk(mu_);
  return conns_.size();
}

uint64_t DataListener::bytes_received() const {
  std::lock_guard lk(mu_);
  uint64_t n = retired_in_;
  for (const auto& [w, c] : conns_) n += c->bytes_received();
  return n;
}

uint64_t DataListener::bytes_sent() const {
  std::lock_guard lk(mu_);
  uint64_t n = retired_out_;
  for (const auto& [w, c] : conns_) n += c->bytes_sent();
  return n;
}

}  // namespace gradsync
