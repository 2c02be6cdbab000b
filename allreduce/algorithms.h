// The all-reduce algorithms of the CPU collective, and which one `auto` runs.
//
//   ring  reduce-scatter + all-gather around the ring: 2(n-1) steps of 1/n of the buffer each.
//         Bandwidth-optimal, pipelined segment by segment; its latency grows with n.
//   rhd   recursive halving (reduce-scatter) then recursive doubling (all-gather), Rabenseifner:
//         2 log2(n) steps, the same bytes as the ring. Not a power of two: the first 2r ranks
//         (r = n - 2^floor(log2 n)) fold in pairs first and get the result back at the end,
//         two extra whole-buffer steps for those ranks.
//   rd    recursive doubling: log2(n) steps, each exchanging the whole buffer (plus the fold for
//         n not a power of two). The fewest steps; the most bytes.
//   tree  a binomial tree: reduce to rank 0, broadcast back; 2 ceil(log2 n) steps of the whole
//         buffer. Any n without a fold.
//
// Every algorithm gives bit-identical results on every rank (each element is summed in one order,
// then copied).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace gradsync {

// shm and hier need CollectiveOptions::shm: all ranks on one host reducing through shared memory;
// across hosts, each host's ranks reducing into their leader through it, the leaders' ring over
// TCP, and the leader's result broadcast back through it.
enum class AllReduceAlgo : uint32_t { kAuto = 0, kRing = 1, kRhd = 2, kRd = 3, kTree = 4, kShm = 5, kHier = 6 };

const char* AllReduceAlgoName(AllReduceAlgo algo);
// "auto", "ring", "rhd", "rd", "tree", "shm" or "hier"; anything else is an error naming them.
Result<AllReduceAlgo> ParseAllReduceAlgo(const std::string& name);

// What auto runs for an all-reduce of `bytes` over n ranks (thresholds measured with
// bench/allreduce_compare.sh; see allreduce/README.md). `oversubscribed`: this host runs more
// ranks than it has cores.
AllReduceAlgo ChooseAllReduceAlgo(size_t bytes, int n, bool oversubscribed = false);

// The largest power of two <= n (n >= 1).
int FloorPow2(int n);
// Recursive doubling and halving-doubling on n ranks, n not a power of two: the first 2r ranks
// (r = n - FloorPow2(n)) pair up, the even one handing its data to the odd one. Virtual rank of
// `rank` among the FloorPow2(n) that take part (-1 for the even ranks that sit out), and back.
int FoldedRank(int rank, int n);
int UnfoldedRank(int vrank, int n);

// The ranks that rhd, rd or the tree pair `rank` with (sorted, without rank itself). Symmetric:
// p is in MeshPeers(r, n) exactly when r is in MeshPeers(p, n).
std::vector<int> MeshPeers(int rank, int n);

}  // namespace gradsync
