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
// rank's address is known. The connections, their handshake and every step's header are the
// transport's (allreduce/mesh/peer_mesh.h); the algorithms' steps come from allreduce/plan/.
//
// RingCollective is the face that picks and runs the parts: the transport (PeerMesh), one
// AllReduceAlgorithm per all-reduce algorithm (allreduce/allreduce_algorithm.h: the ring's
// RingAlgorithm, rhd, rd and the tree as PlanAlgorithm, shm and hier as ShmAllReduce and
// HierarchicalAllReduce) and this host's shared memory (SharedMemoryPath). It resolves the
// all-reduce algorithm (ResolveAllReduceAlgo) and runs broadcast, all-gather and barrier by
// their plans.
//
// With a RingSecurity that authenticates (--auth-dir), Connect() runs the ring handshake
// (allreduce/ring_security.h) on both connections and refuses a peer that cannot prove the
// ring key, naming it; with encrypt (--ring-encrypt) every byte after it is AEAD-framed, and a
// frame that fails authentication fails the operation with kDataLoss.
#pragma once

#include <array>
#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "allreduce/algorithms.h"
#include "allreduce/allreduce_algorithm.h"
#include "allreduce/collective.h"
#include "allreduce/mesh/peer_mesh.h"
#include "allreduce/plan/schedule.h"
#include "allreduce/plan_runner.h"
#include "allreduce/ring_algorithm.h"
#include "allreduce/ring_security.h"
#include "allreduce/shm/shm_path.h"

namespace gradsync {

// acc[i] += x[i] for k floats (the float all-reduce's reducer).
void AddFloats(void* acc, const void* x, size_t k);
// out[i] = a[i] + b[i] for k floats.
void SumFloats(void* out, const void* a, const void* b, size_t k);

class RingCollective final : public Collective {
 public:
  static Result<std::unique_ptr<RingCollective>> Listen(const std::string& bind_host,
                                                        const CollectiveOptions& options,
                                                        const RingSecurity& security = RingSecurity());
  ~RingCollective() override;

  uint16_t port() const { return mesh_.port(); }
  // peers[i] = "host:port" of rank i. Waits at most timeout_s for the neighbors.
  Status Connect(int rank, const std::vector<std::string>& peers, double timeout_s);

  int rank() const override { return mesh_.rank(); }
  int size() const override { return mesh_.size(); }
  Status AllReduce(FloatSpan data, ReduceOp op) override;
  Status AllReduce16(std::span<uint16_t> data, Float16 format) override;
  Status ReduceScatter(FloatSpan data, ReduceOp op, std::span<const size_t> bounds = std::span<const size_t>()) override;
  Status AllGatherChunks(FloatSpan data, std::span<const size_t> bounds = std::span<const size_t>()) override;
  Status Broadcast(FloatSpan data, int root) override;
  Status AllGather(std::span<const std::byte> mine, std::vector<std::vector<std::byte>>* out) override;
  Status Barrier() override;
  // Wire bytes: with encryption, frame headers and tags included.
  uint64_t bytes_sent() const override { return mesh_.bytes_sent(); }
  uint64_t bytes_received() const override { return mesh_.bytes_received(); }
  uint64_t shm_bytes_sent() const override { return shm_.bytes_sent(); }
  uint64_t shm_bytes_received() const override { return shm_.bytes_received(); }
  // Whether the ranks of each host reduce through shared memory (CollectiveOptions::shm), and
  // if not, why.
  bool shared_memory() const { return shm_.ready(); }
  const std::string& shared_memory_off_reason() const { return shm_.off_reason(); }
  // The hosts (by the ranks' addresses), the ranks on this rank's host, and whether they
  // outnumber its cores (auto's choice, and --overlap's default).
  const MeshTopology& topology() const { return mesh_.topology(); }
  // The algorithm the last AllReduce / AllReduce16 ran (auto resolved).
  AllReduceAlgo last_algorithm() const { return last_algorithm_; }

  // Closes both connections at once (tests use it to play a rank that dies).
  void Abort() { mesh_.Abort(); }
  // From any thread (the scheduler's client, when it declares a rank dead): the collective in
  // progress, and every later one, fails at once with kAborted and `why`, instead of waiting out
  // the timeout for a rank that will never come. Call it only once Connect has returned.
  void Cancel(const std::string& why);

 private:
  using Reducer = AllReduceAlgorithm::Reducer;

  RingCollective(const CollectiveOptions& options, const RingSecurity& security);

  // The all-reduce algorithms over `count` elements of `elem` bytes: picks one and runs it.
  // `add` (optional): out = a + b in one pass, for shared memory's first addition.
  Status AllReduceWith(void* data, size_t count, size_t elem, const Reducer& reduce, ShmGroup::Adder add = nullptr);

  const CollectiveOptions options_;
  PeerMesh mesh_;
  std::vector<float> scratch_;  // a reduce's incoming segment (the ring's and the plans')
  RingAlgorithm ring_;
  PlanAlgorithm rhd_;
  PlanAlgorithm rd_;
  PlanAlgorithm tree_;
  SharedMemoryPath shm_;
  ShmAllReduce shm_all_reduce_;
  HierarchicalAllReduce hier_;
  // By AllReduceAlgo: the algorithm that runs it (null for auto, which is always resolved).
  const std::array<AllReduceAlgorithm*, 7> algorithms_;
  AllReduceAlgo last_algorithm_ = AllReduceAlgo::kRing;
};

}  // namespace gradsync
