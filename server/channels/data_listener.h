// The shard's side of the data channel (common/net/data_channel.h): a listener that takes one
// connection per worker for a token the worker sent over ZeroMQ, and per connection a reader
// thread (push frames into buffers it keeps, so no received byte lands on a fresh page) and a
// writer thread (pull frames straight from the parameters the reply holds). The shard's own loop
// only takes finished frames and queues frames to send: it never waits on a socket, except for
// the last bytes of a push whose header has already come (the worker sends the frame first).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "common/base/status.h"
#include "common/net/data_channel.h"

namespace gradsync {

// One worker's connection to this shard.
class DataConn {
 public:
  // `max_floats`: the shard's range; no frame may be larger.
  DataConn(int worker, int64_t max_floats, DataStream stream);
  ~DataConn();
  DataConn(const DataConn&) = delete;
  DataConn& operator=(const DataConn&) = delete;
  // Starts reading and writing; the first bytes written are the acknowledgement (kDataAck).
  void Start();

  // Push frame `seq`, which must hold exactly `n` floats: waits up to `wait_s` for its last bytes.
  // The returned lease keeps the values (and their buffer) until it is dropped; frames older
  // than `seq` that no header claimed are dropped.
  Result<std::shared_ptr<const float>> TakePush(uint64_t seq, size_t n, double wait_s);
  // A push refused before its frame was taken: the frame is dropped (if it came).
  void DropPush(uint64_t seq);
  // Queues a pull frame of `values` (kept valid by `owner` until written); its number.
  Result<uint64_t> SendPull(std::vector<std::span<const float>> values, std::shared_ptr<const void> owner);

  Status health() const;
  uint64_t bytes_received() const { return stream_.bytes_read(); }
  uint64_t bytes_sent() const { return stream_.bytes_written(); }

 private:
  struct Pool;
  struct Outgoing {
    uint64_t seq = 0;
    std::vector<std::span<const float>> values;
    std::shared_ptr<const void> owner;
  };
  void ReadLoop();
  void WriteLoop();
  void Break(Status s);

  const int worker_;
  const int64_t max_floats_;
  DataStream stream_;
  std::shared_ptr<Pool> pool_;  // shared with the leases, which may outlive the connection
  uint64_t next_in_ = 1;        // the next push frame's number (reader thread)
  uint64_t next_out_ = 0;       // the last pull frame's number (shard's loop)
  std::mutex out_mu_;
  std::condition_variable out_cv_;
  std::deque<Outgoing> out_;
  bool stop_ = false;           // under out_mu_ and the pool's lock both
  std::thread reader_, writer_;
};

// The shard's listening socket and its connections, one per worker.
class DataListener {
 public:
  // Listens on bind_host, on a port the kernel picks.
  static Result<std::unique_ptr<DataListener>> Create(const std::string& bind_host);
  ~DataListener();
  DataListener(const DataListener&) = delete;
  DataListener& operator=(const DataListener&) = delete;

  int port() const { return port_; }
  // Worker `w` (range of `max_floats`) will connect and present `token` (once). A connection
  // taken for w replaces its previous one.
  void Expect(const std::string& token, int worker, int64_t max_floats);
  std::shared_ptr<DataConn> Find(int worker) const;
  void Drop(int worker);
  size_t size() const;
  uint64_t bytes_received() const;
  uint64_t bytes_sent() const;

 public:
  struct Pending;  // a connection accepted but not yet past its token (data_listener.cc)

 private:
  DataListener(int fd, int port);
  void AcceptLoop();
  void AcceptNew(std::vector<Pending>& pending, std::vector<Pending>& ready);
  void ClosePending(std::vector<Pending>& pending, size_t i);
  void Count(const Pending& p);  // its bytes, into those of connections done with
  // A connection that presented `token` (the descriptor, taken): the expected worker's new channel.
  void Take(int fd, const std::string& token);

  int fd_ = -1;
  int port_ = 0;
  mutable std::mutex mu_;
  struct Expected {
    int worker = 0;
    int64_t max_floats = 0;
  };
  std::map<std::string, Expected> expected_;
  std::map<int, std::shared_ptr<DataConn>> conns_;
  uint64_t retired_in_ = 0, retired_out_ = 0;  // bytes of connections already dropped
  bool stop_ = false;
  std::thread acceptor_;
};

}  // namespace gradsync
