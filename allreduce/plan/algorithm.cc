#include "allreduce/plan/algorithm.h"

#include <algorithm>

namespace gradsync {

const char* AllReduceAlgoName(AllReduceAlgo algo) {
  switch (algo) {
    case AllReduceAlgo::kAuto: return "auto";
    case AllReduceAlgo::kRing: return "ring";
    case AllReduceAlgo::kRhd: return "rhd";
    case AllReduceAlgo::kRd: return "rd";
    case AllReduceAlgo::kTree: return "tree";
    case AllReduceAlgo::kShm: return "shm";
    case AllReduceAlgo::kHier: return "hier";
  }
  return "unknown";
}

std::optional<AllReduceAlgo> AllReduceAlgoNamed(const std::string& name) {
  for (auto a : {AllReduceAlgo::kAuto, AllReduceAlgo::kRing, AllReduceAlgo::kRhd, AllReduceAlgo::kRd, AllReduceAlgo::kTree,
                 AllReduceAlgo::kShm, AllReduceAlgo::kHier}) {
    if (name == AllReduceAlgoName(a)) return a;
  }
  return std::nullopt;
}

AllReduceAlgo ChooseAllReduceAlgo(size_t bytes, int n, bool oversubscribed) {
  constexpr size_t kKiB = 1024, kMiB = kKiB * kKiB;
  const bool pow2 = (n & (n - 1)) == 0;
  if (bytes <= 64 * kKiB) {
    // Latency: recursive doubling takes the fewest steps; with more ranks than cores the tree,
    // which keeps at most half of them busy at once, was faster (4 ranks on 2 cores, 64 KiB:
    // 50 us against 81).
    return oversubscribed && n > 2 ? AllReduceAlgo::kTree : AllReduceAlgo::kRd;
  }
  // Bandwidth: halving-doubling moves the ring's bytes in 2 log2(n) steps, each a swap between
  // two ranks that goes in lockstep (CollectiveOptions::exchange_segment_bytes): 1.4-2.2x the
  // ring's busbw from 1 MiB on 2 and 4 ranks. A rank count that is not a power of two must
  // first fold whole buffers, which the ring does not (3 ranks, 16 MiB: the ring 1.33 GB/s,
  // halving-doubling 1.11); there the tree still leads up to 1 MiB on an oversubscribed host.
  if (pow2) return AllReduceAlgo::kRhd;
  if (oversubscribed && bytes <= 1 * kMiB) return AllReduceAlgo::kTree;
  return AllReduceAlgo::kRing;
}

AllReduceAlgo ResolveAllReduceAlgo(const AllReduceSetting& setting, size_t bytes, int n) {
  if (setting.requested != AllReduceAlgo::kAuto) return setting.requested;
  if (!setting.shared_memory) return ChooseAllReduceAlgo(bytes, n, setting.oversubscribed);
  return setting.hosts == 1 ? AllReduceAlgo::kShm : AllReduceAlgo::kHier;
}

int FloorPow2(int n) {
  int p = 1;
  while (p * 2 <= n) p *= 2;
  return p;
}

int FoldedRank(int rank, int n) {
  const int rem = n - FloorPow2(n);
  if (rank < 2 * rem) return rank % 2 == 0 ? -1 : rank / 2;
  return rank - rem;
}

int UnfoldedRank(int vrank, int n) {
  const int rem = n - FloorPow2(n);
  return vrank < rem ? 2 * vrank + 1 : vrank + rem;
}

std::vector<int> MeshPeers(int rank, int n) {
  std::vector<int> peers;
  // The fold pair.
  const int rem = n - FloorPow2(n);
  if (rank < 2 * rem) peers.push_back(rank % 2 == 0 ? rank + 1 : rank - 1);
  // The recursive-doubling partners among the folded ranks.
  if (const int v = FoldedRank(rank, n); v >= 0) {
    for (int mask = 1; mask < FloorPow2(n); mask <<= 1) peers.push_back(UnfoldedRank(v ^ mask, n));
  }
  // The binomial tree: the parent (rank without its lowest set bit) and the children.
  if (rank > 0) peers.push_back(rank & (rank - 1));
  for (int mask = 1; mask < n; mask <<= 1) {
    if (rank & mask) break;
    if (rank + mask < n) peers.push_back(rank + mask);
  }
  std::sort(peers.begin(), peers.end());
  peers.erase(std::unique(peers.begin(), peers.end()), peers.end());
  return peers;
}

}  // namespace gradsync
