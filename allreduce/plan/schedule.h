// Every step of the CPU collective's operations, per rank: the peers it sends to and receives
// from, the element ranges that travel, whether what arrives is summed in, and the step number
// its header carries. Pure (the standard library only): the collective runs these steps
// (allreduce/tcp_ring.h) and the simulator replays them on its network (experiments/sim/), so a
// simulated run moves the bytes, in the messages, that the real one does.
//
// Ranks and peers are ranks of the operation's group (for the hierarchy's leaders, positions
// mapped back to ranks). Ranges count elements; a step's wire bytes are its elements times the
// element size plus kStepHeaderBytes (StepWireBytes).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "allreduce/plan/algorithm.h"

namespace gradsync {

// Every step's header on the wire: magic, op, sequence number, step, algorithm, byte count.
inline constexpr size_t kStepHeaderBytes = 32;
// A broadcast's and a ring step's segment (CollectiveOptions::segment_bytes).
inline constexpr size_t kDefaultSegmentBytes = size_t{1} << 20;
// The block a shared-memory group copies and reduces at a time (CollectiveOptions::shm_block_bytes).
inline constexpr size_t kDefaultShmBlockBytes = size_t{256} << 10;

// Where chunk i of a count-element buffer cut in n chunks that differ in size by at most one
// element begins: chunk i is [ChunkBegin(i), ChunkBegin(i + 1)).
inline size_t ChunkBegin(size_t count, int n, int i) {
  const size_t base = count / static_cast<size_t>(n), extra = count % static_cast<size_t>(n);
  const size_t ui = static_cast<size_t>(i);
  return ui * base + (ui < extra ? ui : extra);
}

struct ElementRange {
  size_t begin = 0, end = 0;
  size_t size() const { return end - begin; }
  bool operator==(const ElementRange&) const = default;
};

// One step of one rank. A side whose peer is -1 is skipped (no header either); a side of zero
// elements still exchanges its header.
struct PlanStep {
  uint32_t tag = 0;      // the step number in the headers of both ends
  int to = -1;           // the rank it sends `send` to
  ElementRange send;
  int from = -1;         // the rank it receives `recv` from
  ElementRange recv;
  bool reduce = false;   // what arrives is summed into place (else stored there)
  // A shared-memory phase (no peers) among the ranks of one host: all of them all-reduce (shm),
  // they reduce into their leader, or the leader's result goes back to them (hier).
  enum class Shm : uint8_t { kNone, kAllReduce, kReduce, kBroadcast } shm = Shm::kNone;
  bool operator==(const PlanStep&) const = default;
};
using Plan = std::vector<PlanStep>;

// A step that only sends, and one that only receives.
inline PlanStep SendStep(uint32_t tag, int to, ElementRange range) {
  PlanStep s;
  s.tag = tag;
  s.to = to;
  s.send = range;
  return s;
}
inline PlanStep RecvStep(uint32_t tag, int from, ElementRange range, bool reduce = false) {
  PlanStep s;
  s.tag = tag;
  s.from = from;
  s.recv = range;
  s.reduce = reduce;
  return s;
}
// A swap with one peer.
inline PlanStep SwapStep(uint32_t tag, int peer, ElementRange send, ElementRange recv, bool reduce) {
  PlanStep s;
  s.tag = tag;
  s.to = s.from = peer;
  s.send = send;
  s.recv = recv;
  s.reduce = reduce;
  return s;
}

// Bytes that step `s` puts on the wire for elements of `elem` bytes (0 when it sends nothing).
inline uint64_t StepWireBytes(const PlanStep& s, size_t elem) {
  return s.to < 0 ? 0 : kStepHeaderBytes + s.send.size() * elem;
}

// Ring steps [first, last) of the 2(n-1) (tags first..last-1): [0, n-1) the reduce-scatter (rank
// r ends with chunk r reduced), [n-1, 2(n-1)) the all-gather (rank r starts from its chunk r).
// Each step sends to rank + 1 and receives from rank - 1, and what step t receives is what
// step t + 1 sends. `bounds` (n + 1 element offsets, non-decreasing from 0 to count) cut the
// chunks; empty: ChunkBegin.
Plan RingPlan(int rank, int n, size_t count, int first, int last, std::span<const size_t> bounds = {});
// The ring all-reduce: RingPlan's 2(n-1) steps.
Plan RingAllReducePlan(int rank, int n, size_t count);
// Recursive halving then doubling; folded first (tag 0) and unfolded last (tag kUnfoldTag) on n
// not a power of two. The halving steps send one half of the current range and reduce the other.
Plan HalvingDoublingPlan(int rank, int n, size_t count);
// Recursive doubling: log2 n swaps of the whole buffer, each summed in; folded like rhd.
Plan RecursiveDoublingPlan(int rank, int n, size_t count);
// The binomial tree rooted at rank 0: the reduce (tag: level), then the broadcast (tag
// kBroadcastTag + level), parents sending to their farthest child first.
Plan TreePlan(int rank, int n, size_t count);
// The hierarchy: `hosts` holds each host's ranks in rank order (its first is the leader). A
// shared-memory reduce, the leaders' ring all-reduce (ranks, not positions), a shared-memory
// broadcast; a host of one rank has no shared-memory steps, and a single leader no ring.
Plan HierarchicalPlan(int rank, const std::vector<std::vector<int>>& hosts, size_t count);
// Every rank on one host all-reducing through shared memory: one shared-memory phase.
Plan SharedMemoryPlan(size_t count);
// What a shared-memory phase moves through the region for member `index` of `members`, counted
// as the wire would (what it wrote that others read, times its readers; what it read that others
// wrote). One block of `block` bytes, of which this member sums `share` (a broadcast: none):
// ShmGroup counts each block with it.
struct ShmBytes {
  uint64_t sent = 0, received = 0;
};
ShmBytes SharedMemoryBlockBytes(PlanStep::Shm phase, int index, int members, uint64_t share, uint64_t block);
// The whole phase over `count` elements of `elem` bytes, block by block as ShmGroup cuts them.
ShmBytes SharedMemoryBytes(PlanStep::Shm phase, int index, int members, size_t count, size_t elem,
                           size_t block_bytes = kDefaultShmBlockBytes);
// The all-reduce by a resolved algorithm (not auto); shm has no network steps.
Plan AllReducePlan(AllReduceAlgo algo, int rank, int n, size_t count, const std::vector<std::vector<int>>& hosts = {});

// A broadcast from `root` along the ring, `bytes` cut in segments of `segment_bytes` (at least
// one, even when empty), each forwarded as soon as it arrives: tag k is segment k; ranges count bytes.
Plan BroadcastPlan(int rank, int n, int root, size_t bytes, size_t segment_bytes = kDefaultSegmentBytes);
// AllGather of one block per rank around the ring: n-1 steps passing the blocks' sizes (tags
// 0..n-2), then n-1 steps passing the blocks (tags n-1..2n-3). Ranges count blocks: step s sends
// block rank - s and receives block rank - s - 1 (mod n).
Plan AllGatherPlan(int rank, int n);
// A step of AllGatherPlan on the wire, for blocks of sizes[i] bytes.
uint64_t AllGatherWireBytes(const PlanStep& s, int n, std::span<const size_t> sizes);

// The step tags the fold, the unfold and the tree's broadcast use.
inline constexpr uint32_t kFoldTag = 0;
inline constexpr uint32_t kUnfoldTag = 0xfff0;
inline constexpr uint32_t kBroadcastTag = 0x100;

}  // namespace gradsync
