// The all-reduce algorithms of the CPU collective, and which one `auto` runs. Pure: the standard
// library only, so that the collective (allreduce/) and the simulator (experiments/sim/) make the
// same choice from the same inputs.
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
//   shm   every rank on one host: through one shared-memory region (allreduce/shm/shm_group.h).
//   hier  across hosts: each host's ranks reduce into their leader through shared memory, the
//         leaders run the ring over TCP, each leader broadcasts the result back.
//
// Every algorithm gives bit-identical results on every rank (each element is summed in one order,
// then copied). Each one's steps are in allreduce/plan/schedule.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace gradsync {

enum class AllReduceAlgo : uint32_t { kAuto = 0, kRing = 1, kRhd = 2, kRd = 3, kTree = 4, kShm = 5, kHier = 6 };

// "auto", "ring", "rhd", "rd", "tree", "shm" or "hier".
const char* AllReduceAlgoName(AllReduceAlgo algo);
// The algorithm of that name; nothing for any other name.
std::optional<AllReduceAlgo> AllReduceAlgoNamed(const std::string& name);

// What auto runs over TCP for an all-reduce of `bytes` over n ranks (thresholds measured with
// bench/allreduce_compare.sh; see allreduce/README.md). `oversubscribed`: this host runs more
// ranks than it has cores.
AllReduceAlgo ChooseAllReduceAlgo(size_t bytes, int n, bool oversubscribed = false);

// What a collective knows, once connected, that auto's choice depends on.
struct AllReduceSetting {
  AllReduceAlgo requested = AllReduceAlgo::kAuto;  // --allreduce-algo
  int hosts = 1;                 // hosts, by the host part of the ranks' addresses
  bool shared_memory = false;    // every host with several ranks reduces through shared memory
  bool oversubscribed = false;   // this rank's host runs more ranks than it has cores
};
// The algorithm an all-reduce of `bytes` over n ranks runs: the requested one, or for auto shared
// memory when every rank is on one host, the hierarchy across hosts with shared memory, else
// ChooseAllReduceAlgo.
AllReduceAlgo ResolveAllReduceAlgo(const AllReduceSetting& setting, size_t bytes, int n);

// Whether a host of `ranks` ranks and `cores` cores (hardware threads) is oversubscribed.
inline bool Oversubscribed(size_t ranks, unsigned cores) { return ranks > (cores > 0 ? cores : 1u); }

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
