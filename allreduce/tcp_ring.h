// RingCollective: the CPU collective over TCP (Boost.Asio): a bandwidth-optimal ring, and the
// latency-optimal algorithms beside it for small messages.
//
// Rank r holds two ring connections: to its right neighbor (r+1 mod n), where it sends, and from
// its left neighbor (r-1 mod n), where it receives. The ring AllReduce is reduce-scatter then
// all-gather (Patarasuk and Yuan 2009, bandwidth-optimal all-reduce): 2(n-1) steps, each rank
// sending 2(n-1)/n of the buffer. Within a step the chunk is sent while the incoming chunk is
// received and reduced segment by segment (CollectiveOptions::segment_bytes), so the three
// overlap. Every step starts with a small header (magic, sequence number, op, algorithm, step,
// byte count) that the receiver checks.
//
// With n > 2, rank r also holds one "mesh" connection to each rank that recursive halving-doubling,
// recursive doubling or the binomial tree pair it with (MeshPeers in allreduce/algorithms.h:
// O(log n) of them, not n - 1); with n = 2 the two ring connections serve both directions.
// CollectiveOptions::algorithm picks the all-reduce algorithm (auto: by size and rank count).
//
// Set-up is two-phase so that ports can be ephemeral: Listen() binds and tells the port to
// advertise (through the scheduler, or directly in tests); Connect() wires the ring once every
// rank's address is known. One io_context, driven by the calling thread: no background threads.
//
// With a RingSecurity that authenticates (--auth-dir), Connect() runs the ring handshake
// (allreduce/ring_security.h) on both connections and refuses a peer that cannot prove the
// ring key, naming it; with encrypt (--ring-encrypt) every byte after it is AEAD-framed, and a
// frame that fails authentication fails the operation with kDataLoss.
#pragma once

#include <utility>  // before Boost.Asio 1.74, whose awaitable.hpp forgets it under C++20

#include <boost/asio.hpp>
#include <functional>
#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "allreduce/algorithms.h"
#include "allreduce/plan/schedule.h"
#include "allreduce/collective.h"
#include "allreduce/ring_security.h"
#include "allreduce/shm_group.h"

namespace gradsync {

// acc[i] += x[i] for k floats (the float all-reduce's reducer).
void AddFloats(void* acc, const void* x, size_t k);
// out[i] = a[i] + b[i] for k floats.
void SumFloats(void* out, const void* a, const void* b, size_t k);

class RingCollective final : public Collective {
 public:
  static Result<std::unique_ptr<RingCollective>> Listen(const std::string& bind_host,
                                                        const CollectiveOptions& options,
                                                        const RingSecurity& security = {});
  ~RingCollective() override;

  uint16_t port() const { return port_; }
  // peers[i] = "host:port" of rank i. Waits at most timeout_s for the neighbors.
  Status Connect(int rank, const std::vector<std::string>& peers, double timeout_s);

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Status AllReduce(FloatSpan data, ReduceOp op) override;
  Status AllReduce16(std::span<uint16_t> data, Float16 format) override;
  Status ReduceScatter(FloatSpan data, ReduceOp op, std::span<const size_t> bounds = {}) override;
  Status AllGatherChunks(FloatSpan data, std::span<const size_t> bounds = {}) override;
  Status Broadcast(FloatSpan data, int root) override;
  Status AllGather(std::span<const std::byte> mine, std::vector<std::vector<std::byte>>* out) override;
  Status Barrier() override;
  // Wire bytes: with encryption, frame headers and tags included.
  uint64_t bytes_sent() const override;
  uint64_t bytes_received() const override;
  uint64_t shm_bytes_sent() const override { return shm_ ? shm_->bytes_sent() : 0; }
  uint64_t shm_bytes_received() const override { return shm_ ? shm_->bytes_received() : 0; }
  // Whether the ranks of each host reduce through shared memory (CollectiveOptions::shm), and
  // if not, why; the number of hosts (by the ranks' addresses).
  bool shared_memory() const { return shm_ready_; }
  const std::string& shared_memory_off_reason() const { return shm_why_not_; }
  int hosts() const { return static_cast<int>(host_groups_.size()); }
  // The algorithm the last AllReduce / AllReduce16 ran (auto resolved).
  AllReduceAlgo last_algorithm() const { return last_algorithm_; }

  // Closes both connections at once (tests use it to play a rank that dies).
  void Abort();
  // From any thread (the scheduler's client, when it declares a rank dead): the collective in
  // progress, and every later one, fails at once with kAborted and `why`, instead of waiting out
  // the timeout for a rank that will never come. Call it only once Connect has returned.
  void Cancel(const std::string& why);

 private:
  enum class OpKind : uint32_t {
    kAllReduce = 1, kBroadcast = 2, kAllGather = 3, kBarrier = 4, kReduceScatter = 5, kAllGatherChunks = 6
  };
  struct StepHeader {
    uint32_t magic;
    uint32_t op;
    uint64_t seq;
    uint32_t step;
    uint32_t algo;  // AllReduceAlgo for all-reduces (ranks that disagree fail, naming both), else 0
    uint64_t bytes;
  };
  // The handshakes' messages on one connection, alive while Connect runs.
  struct HandshakeState {
    ring_handshake::Hello hello{};
    ring_handshake::Reply reply{};
    ring_handshake::Finish finish{};
    ring_handshake::VerdictMsg verdict{};
    std::array<uint8_t, 32> transcript{};
  };
  // One connection: its socket, the stream every read and write goes through (plain or
  // encrypted), and its handshake.
  struct Link {
    explicit Link(boost::asio::io_context& io) : socket(io) {}
    boost::asio::ip::tcp::socket socket;
    RingStream stream{socket};
    HandshakeState handshake;
    bool ready = false;
  };

  RingCollective(const CollectiveOptions& options, const RingSecurity& security);

  // The two halves of Connect's handshake on one connection (set `link.ready` or `*failure`);
  // `mesh` says which kind of connection it is (a ring or a mesh hello). The acceptor's half
  // starts after the hello's first 8 bytes, which Connect read to tell the kinds apart.
  void HandshakeAsConnector(Link& link, int peer, bool mesh, const std::array<uint8_t, 32>& context, Status* failure);
  void HandshakeAsAcceptor(Link& link, int peer, bool mesh, const std::array<uint8_t, 32>& context, Status* failure);
  std::string AuthFailure(const Link& link, int peer, bool accepted_side, const std::string& why) const;
  // The stream that carries data to / from `peer` (a ring connection where the peer is that
  // neighbor, else the mesh connection).
  RingStream& SendStream(int peer);
  RingStream& RecvStream(int peer);
  // A failed read or write: kDataLoss for an encrypted frame that fails authentication,
  // kUnavailable for a lost peer.
  Status PeerError(int peer, const boost::system::error_code& e, const std::string& where) const;

  // One ring step: send `send_bytes` from `send` to the right while receiving `recv_bytes` from
  // the left into `recv`; on_segment(offset, length) runs as each received segment lands.
  // A side given as nullptr is skipped (no header either); a non-null side of 0 bytes still
  // exchanges the header.
  // With recv_reuse, every segment lands at `recv` itself (a segment-sized buffer that stays in
  // cache) and on_segment consumes it before the next read.
  Status Exchange(OpKind op, uint32_t step, const void* send, size_t send_bytes, void* recv,
                  size_t recv_bytes, const std::function<void(size_t, size_t)>& on_segment,
                  bool recv_reuse = false);
  // Exchange with any two peers: send to `to`, receive from `from` (-1 skips a side).
  Status PeerExchange(OpKind op, uint32_t step, int to, const void* send, size_t send_bytes, int from, void* recv,
                      size_t recv_bytes, const std::function<void(size_t, size_t)>& on_segment,
                      bool recv_reuse = false);
  // A received step header against the one expected (kInternal "mismatched collectives", or
  // kInvalidArgument when two ranks run different all-reduce algorithms).
  Status CheckHeader(const StepHeader& in, OpKind op, uint32_t step, uint32_t algo, size_t bytes, int from) const;
  // reduce(acc, x, k) folds k received elements into acc.
  using Reducer = std::function<void(void*, const void*, size_t)>;
  // The all-reduce algorithms over `count` elements of `elem` bytes.
  // `add` (optional): out = a + b in one pass, for shared memory's first addition.
  Status AllReduceWith(void* data, size_t count, size_t elem, const Reducer& reduce, ShmGroup::Adder add = nullptr);
  // Ring steps (RingPlan, or the leaders' part of HierarchicalPlan: every step sends to one
  // neighbour what the step before received from the other), run as one pipeline each way.
  Status RingSteps(OpKind op, void* data, size_t elem, const Reducer& reduce, std::span<const PlanStep> plan);
  Status Hierarchical(void* data, size_t count, size_t elem, const Reducer& reduce, ShmGroup::Adder add);
  Status SetUpSharedMemory();
  // Checks caller-given chunk bounds (kInvalidArgument, before anything moves).
  Status CheckBounds(std::span<const size_t> bounds, size_t count) const;
  // The steps of rhd, rd or the tree (allreduce/plan/schedule.h), one at a time: a step that
  // sums in the range it also sends receives it whole first.
  Status RunPlan(const Plan& plan, void* data, size_t elem, const Reducer& reduce);
  // AllGather: checks the announced sizes and sizes the blocks.
  Status SizeBlocks(std::span<const uint64_t> sizes, std::vector<std::vector<std::byte>>* out);
  // Receives `bytes` from `from` and reduces them into `data` segment by segment (through the
  // segment scratch), while optionally sending `send_bytes` from `send` to `to`.
  Status ReceiveReducing(uint32_t step, int from, void* data, size_t bytes, size_t elem, const Reducer& reduce,
                         int to = -1, const void* send = nullptr, size_t send_bytes = 0);
  // A valid address for empty buffers (a zero-length side is not a skipped side).
  static std::byte empty_[1];
  Status Begin(OpKind op);
  Status Fail(Status s);
  // Runs `fn` on the I/O loop after `delay`, unless the ring is aborted first: Abort cancels
  // every pending retry, so that no handler outlives the operation whose locals it refers to.
  void RetryAfter(std::chrono::microseconds delay, std::function<void()> fn);
  std::string Where(OpKind op, uint32_t step) const;
  // TCP_NODELAY and CollectiveOptions::socket_buffer_bytes on a ring or mesh socket.
  void SetSocketOptions(boost::asio::ip::tcp::socket& socket) const;
  // Runs one handler: polls for up to options_.spin_us, then blocks until `deadline`. Returns
  // how many ran (0: the deadline passed).
  size_t RunOne(std::chrono::steady_clock::time_point deadline);

  CollectiveOptions options_;
  boost::asio::io_context io_;
  boost::asio::ip::tcp::acceptor acceptor_;
  // The ring: this rank sends to the right and receives from the left.
  Link left_{io_};
  Link right_{io_};
  // By peer rank: the mesh connections (null where there is none).
  std::vector<std::unique_ptr<Link>> mesh_;
  RingSecurity security_;
  uint16_t port_ = 0;
  int rank_ = -1;
  int size_ = 0;
  std::vector<std::string> peers_;
  uint64_t seq_ = 0;
  Status broken_;
  bool aborted_ = false;
  std::atomic<bool> cancelled_{false};  // Cancel: set from any thread
  std::mutex cancel_mu_;
  std::string cancel_why_;  // under cancel_mu_
  std::vector<std::weak_ptr<boost::asio::steady_timer>> retries_;
  std::vector<float> scratch_;
  std::vector<std::byte> whole_;  // a whole incoming buffer (recursive doubling, tree)
  bool oversubscribed_ = false;  // more ranks on this host than cores (auto's choice)
  std::vector<std::vector<int>> host_groups_;  // each host's ranks, in rank order
  std::vector<int> leaders_;                   // each host's first rank
  int my_group_ = 0;
  std::unique_ptr<ShmGroup> shm_;  // this host's shared-memory group (null: alone on the host, or off)
  bool shm_ready_ = false;         // every host with several ranks has its group
  std::string shm_why_not_;
  AllReduceAlgo algo_now_ = AllReduceAlgo::kRing;  // stamped on the all-reduce's step headers
  AllReduceAlgo last_algorithm_ = AllReduceAlgo::kRing;
  uint64_t bytes_sent_ = 0;
  uint64_t bytes_received_ = 0;
};

}  // namespace gradsync
