// PeerMesh: the CPU collective's transport. Every rank of a job holds TCP connections to its two
// ring neighbours and to the ranks its algorithms pair it with (MeshPeers, and the hierarchy's
// neighbouring leaders), each one plain, authenticated or encrypted (allreduce/ring_security.h:
// the handshake and RingStream); every exchange starts with a step header that the receiver
// checks. The algorithms (allreduce/ring_pipeline.cc, plan_runner.cc, tcp_ring.cc) move their
// bytes only through it.
//
// Set-up is two-phase so that ports can be ephemeral: Listen() binds and tells the port to
// advertise (through the scheduler, or directly in tests); Connect() wires the connections once
// every rank's address is known. One io_context, driven by the calling thread: no background
// threads. A failure breaks the mesh: every later operation fails with the first failure.
//
// Why shared memory is not a PeerMesh: the ranks of a host do not exchange byte streams there,
// they sum in place in one region (allreduce/shm_group.h); a stream over shared memory would
// copy every byte once more and lose the in-place sum that makes it fast.
#pragma once

#include <utility>  // before Boost.Asio 1.74, whose awaitable.hpp forgets it under C++20

#include <array>
#include <atomic>
#include <boost/asio.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "allreduce/collective.h"
#include "allreduce/ring_security.h"

namespace gradsync {

// The operation a step belongs to (in every step header).
enum class CollectiveOp : uint32_t {
  kAllReduce = 1, kBroadcast = 2, kAllGather = 3, kBarrier = 4, kReduceScatter = 5, kAllGatherChunks = 6
};

// Every step's header on the wire (kStepHeaderBytes, allreduce/plan/schedule.h).
struct StepHeader {
  uint32_t magic;
  uint32_t op;
  uint64_t seq;
  uint32_t step;
  uint32_t algo;  // AllReduceAlgo for all-reduces (ranks that disagree fail, naming both), else 0
  uint64_t bytes;
};
static_assert(sizeof(StepHeader) == kStepHeaderBytes);

class PeerMesh {
 public:
  using Clock = std::chrono::steady_clock;
  // on_segment(offset, length) runs as each received segment lands.
  using OnSegment = std::function<void(size_t, size_t)>;

  PeerMesh(const CollectiveOptions& options, const RingSecurity& security);
  ~PeerMesh();

  Status Listen(const std::string& bind_host);
  uint16_t port() const { return port_; }
  // peers[i] = "host:port" of rank i. Connects to the ring neighbours and to the ranks of
  // MeshPeers (and the neighbouring hosts' leaders); waits at most timeout_s for them.
  Status Connect(int rank, const std::vector<std::string>& peers, double timeout_s);

  bool encrypted() const { return security_.encrypt; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  // Each host's ranks in rank order (by the host part of the ranks' addresses), this rank's
  // host, and whether this host runs more ranks than it has cores.
  const std::vector<std::vector<int>>& hosts() const { return hosts_; }
  int my_host() const { return my_host_; }
  bool oversubscribed() const { return oversubscribed_; }

  // A new operation: kFailedPrecondition on a broken mesh or before Connect.
  Status Begin();
  // The algorithm the all-reduce steps' headers carry.
  void set_algorithm(AllReduceAlgo algo) { algo_ = algo; }

  // One step with any two peers: sends `send_bytes` from `send` to `to` while receiving
  // `recv_bytes` from `from` into `recv` (-1 skips a side: no header either; a side of 0 bytes
  // still exchanges its header). With recv_reuse every segment lands at `recv` itself (a
  // segment-sized buffer that stays in cache) and on_segment consumes it before the next read.
  // A swap with one peer goes in lockstep (CollectiveOptions::exchange_segment_bytes).
  Status Exchange(CollectiveOp op, uint32_t step, int to, const void* send, size_t send_bytes, int from, void* recv,
                  size_t recv_bytes, const OnSegment& on_segment, bool recv_reuse = false);

  // For the ring's pipeline (allreduce/ring_pipeline.cc), which drives the streams itself.
  // The stream that carries data to / from `peer` (a ring connection where the peer is that
  // neighbor, else the mesh connection).
  RingStream& SendStream(int peer);
  RingStream& RecvStream(int peer);
  StepHeader Header(CollectiveOp op, uint32_t step, uint64_t bytes) const;
  // A received step header against the one expected (kInternal "mismatched collectives", or
  // kInvalidArgument when two ranks run different all-reduce algorithms).
  Status CheckHeader(const StepHeader& in, CollectiveOp op, uint32_t step, size_t bytes, int from) const;
  // A failed read or write: kDataLoss for an encrypted frame that fails authentication,
  // kUnavailable for a lost peer.
  Status PeerError(int peer, const boost::system::error_code& e, const std::string& where) const;
  std::string Where(CollectiveOp op, uint32_t step) const;
  void CountSent(size_t n) { bytes_sent_ += n; }
  void CountReceived(size_t n) { bytes_received_ += n; }
  uint64_t moved() const { return bytes_sent_ + bytes_received_; }
  // Runs one handler: polls for up to options.mesh_wait.busy_poll_ms, then blocks until `deadline`. Returns
  // how many ran (0: the deadline passed, or the mesh was cancelled).
  size_t RunOne(Clock::time_point deadline);
  // Before a loop of RunOne.
  void Restart() { io_.restart(); }
  Clock::time_point Deadline() const;
  double timeout_s() const { return options_.timeout_s; }

  // Breaks the mesh with `s` (or Cancel's reason), closes every connection, returns the status.
  Status Fail(Status s);
  // Closes every connection at once (tests use it to play a rank that dies).
  void Abort();
  // From any thread: the operation in progress, and every later one, fails at once with
  // kAborted and `why`. Returns false if it was cancelled already.
  bool Cancel(const std::string& why);

  // Wire bytes: with encryption, frame headers and tags included.
  uint64_t bytes_sent() const;
  uint64_t bytes_received() const;

 private:
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
  struct Outgoing;
  struct Incoming;
  // What Connect is doing, alive while it runs (its handlers refer to it).
  struct Wiring;

  // Connect's parts: the hosts by address; which mesh links to open (returns the ranks above
  // this one to connect to, and counts the ones below that will connect here); connecting out
  // (retrying while the peer is not listening yet); accepting and placing what comes in; waiting.
  void GroupHosts(const std::vector<std::string>& peers);
  std::vector<int> PlanMeshLinks(int* mesh_down);
  Status AddOutgoing(Wiring& w, Link* link, int peer, bool mesh);
  void AcceptNext(Wiring& w);
  void ReadHello(Wiring& w, const std::shared_ptr<Incoming>& in);
  void DropIncoming(Wiring& w, const std::shared_ptr<Incoming>& in, const std::string& why);
  void PlaceIncoming(Wiring& w, const std::shared_ptr<Incoming>& in, const boost::system::error_code& read_error);
  bool AllLinksReady() const;
  Status WaitForLinks(Wiring& w, double timeout_s);
  // The two halves of Connect's handshake on one connection (set `link.ready` or `*failure`);
  // `mesh` says which kind of connection it is (a ring or a mesh hello). The acceptor's half
  // starts after the hello's first 8 bytes, which Connect read to tell the kinds apart.
  void HandshakeAsConnector(Link& link, int peer, bool mesh, const std::array<uint8_t, 32>& context, Status* failure);
  void HandshakeAsAcceptor(Link& link, int peer, bool mesh, const std::array<uint8_t, 32>& context, Status* failure);
  std::string AuthFailure(const Link& link, int peer, bool accepted_side, const std::string& why) const;
  // Runs `fn` on the I/O loop after `delay`, unless the mesh is aborted first: Abort cancels
  // every pending retry, so that no handler outlives the operation whose locals it refers to.
  void RetryAfter(std::chrono::microseconds delay, std::function<void()> fn);
  // TCP_NODELAY and CollectiveOptions::socket_buffer_bytes on a ring or mesh socket.
  void SetSocketOptions(boost::asio::ip::tcp::socket& socket) const;
  // Exchange's parts.
  struct Step;
  void StartWrite(Step& st);
  void WriteLockstep(Step& st);
  void StartRead(Step& st);
  void ReadFrom(Step& st, size_t off, size_t have);
  Status Drive(Step& st);

  CollectiveOptions options_;
  RingSecurity security_;
  boost::asio::io_context io_;
  boost::asio::ip::tcp::acceptor acceptor_;
  // The ring: this rank sends to the right and receives from the left.
  Link left_{io_};
  Link right_{io_};
  // By peer rank: the mesh connections (null where there is none).
  std::vector<std::unique_ptr<Link>> mesh_;
  uint16_t port_ = 0;
  int rank_ = -1;
  int size_ = 0;
  std::vector<std::string> peers_;
  std::vector<std::vector<int>> hosts_;  // each host's ranks, in rank order
  int my_host_ = 0;
  bool oversubscribed_ = false;  // more ranks on this host than cores (auto's choice)
  uint64_t seq_ = 0;
  AllReduceAlgo algo_ = AllReduceAlgo::kRing;
  Status broken_;
  bool aborted_ = false;
  std::atomic<bool> cancelled_{false};  // Cancel: set from any thread
  std::mutex cancel_mu_;
  std::string cancel_why_;  // under cancel_mu_
  std::vector<std::weak_ptr<boost::asio::steady_timer>> retries_;
  uint64_t bytes_sent_ = 0;
  uint64_t bytes_received_ = 0;
  // Connect's wiring (its deadline, failure, connections in flight). Handlers of a connection's
  // handshake hold references into it and may still be queued when Connect returns on a
  // failure (one whose socket was handed on while Fail aborted the others): it lives as long as
  // the mesh, so that Abort's last poll (the destructor's) runs them against a live object.
  std::shared_ptr<Wiring> wiring_;
};

}  // namespace gradsync
