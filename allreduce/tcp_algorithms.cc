// The all-reduce algorithms beside the ring (allreduce/algorithms.h): recursive halving-doubling,
// recursive doubling and the binomial tree, over the ring and mesh connections.
#include <bit>
#include <cstring>

#include "allreduce/tcp_ring.h"

namespace gradsync {
namespace {
// Header step numbers of the phases that every algorithm shares.
constexpr uint32_t kFoldStep = 0;            // the even rank of a fold pair hands its data over
constexpr uint32_t kUnfoldStep = 0xfff0;     // and gets the result back
constexpr uint32_t kBroadcastStep = 0x100;   // + level: the tree's broadcast
}  // namespace

Status RingCollective::ReceiveReducing(uint32_t step, int from, void* data, size_t bytes, size_t elem,
                                       const Reducer& reduce, int to, const void* send, size_t send_bytes) {
  scratch_.resize(std::max<size_t>(1, options_.segment_bytes / sizeof(float) + 1));
  char* d = static_cast<char*>(data);
  return PeerExchange(OpKind::kAllReduce, step, to, send, send_bytes, from, scratch_.data(), bytes,
                      [&](size_t off, size_t len) { reduce(d + off, scratch_.data(), len / elem); },
                      /*recv_reuse=*/true);
}

// Folds n down to a power of two: even rank 2i (i < rem) hands its buffer to 2i + 1, which
// reduces it; the even rank then sits out until Unfold.
Status RingCollective::Fold(void* data, size_t bytes, size_t elem, const Reducer& reduce) {
  const int rem = size_ - FloorPow2(size_);
  if (rank_ >= 2 * rem) return OkStatus();
  if (rank_ % 2 == 0) return PeerExchange(OpKind::kAllReduce, kFoldStep, rank_ + 1, data, bytes, -1, nullptr, 0, nullptr);
  return ReceiveReducing(kFoldStep, rank_ - 1, data, bytes, elem, reduce);
}

Status RingCollective::RecursiveDoubling(void* data, size_t count, size_t elem, const Reducer& reduce) {
  const size_t bytes = count * elem;
  RETURN_IF_ERROR(Fold(data, bytes, elem, reduce));
  const int p2 = FloorPow2(size_), v = FoldedRank(rank_, size_);
  if (v >= 0) {
    // Each step swaps whole buffers with the partner and adds: both get the same sum (a + b == b + a).
    whole_.resize(bytes);
    uint32_t step = 1;
    for (int mask = 1; mask < p2; mask <<= 1, ++step) {
      const int partner = UnfoldedRank(v ^ mask, size_);
      RETURN_IF_ERROR(PeerExchange(OpKind::kAllReduce, step, partner, data, bytes, partner, whole_.data(), bytes, nullptr));
      reduce(data, whole_.data(), count);
    }
  }
  return Unfold(data, bytes);
}

Status RingCollective::HalvingDoubling(void* data, size_t count, size_t elem, const Reducer& reduce) {
  const size_t bytes = count * elem;
  RETURN_IF_ERROR(Fold(data, bytes, elem, reduce));
  const int p2 = FloorPow2(size_), v = FoldedRank(rank_, size_);
  if (v >= 0) {
    char* d = static_cast<char*>(data);
    auto at = [&](int block) { return ChunkBegin(count, p2, block) * elem; };  // byte offset of a block
    int lo = 0, hi = p2;  // the blocks this rank is responsible for
    uint32_t step = 1;
    // Recursive halving: keep the half with this rank's block, send the other half to the
    // partner, which keeps it; reduce what arrives while sending.
    for (int mask = p2 / 2; mask >= 1; mask >>= 1, ++step) {
      const int partner = UnfoldedRank(v ^ mask, size_);
      const int mid = lo + (hi - lo) / 2;
      const bool lower = (v & mask) == 0;
      const int keep_lo = lower ? lo : mid, keep_hi = lower ? mid : hi;
      const int send_lo = lower ? mid : lo, send_hi = lower ? hi : mid;
      RETURN_IF_ERROR(ReceiveReducing(step, partner, d + at(keep_lo), at(keep_hi) - at(keep_lo), elem, reduce, partner,
                                      d + at(send_lo), at(send_hi) - at(send_lo)));
      lo = keep_lo;
      hi = keep_hi;
    }
    // Recursive doubling: swap the reduced ranges, each arriving where it belongs.
    for (int mask = 1; mask < p2; mask <<= 1, ++step) {
      const int partner = UnfoldedRank(v ^ mask, size_);
      const int width = hi - lo;
      const int plo = (v & mask) == 0 ? hi : lo - width, phi = plo + width;
      RETURN_IF_ERROR(PeerExchange(OpKind::kAllReduce, step, partner, d + at(lo), at(hi) - at(lo), partner, d + at(plo),
                                   at(phi) - at(plo), nullptr));
      lo = std::min(lo, plo);
      hi = std::max(hi, phi);
    }
  }
  return Unfold(data, bytes);
}

Status RingCollective::Unfold(void* data, size_t bytes) {
  const int rem = size_ - FloorPow2(size_);
  if (rank_ >= 2 * rem) return OkStatus();
  if (rank_ % 2 == 0) return PeerExchange(OpKind::kAllReduce, kUnfoldStep, -1, nullptr, 0, rank_ + 1, data, bytes, nullptr);
  return PeerExchange(OpKind::kAllReduce, kUnfoldStep, rank_ - 1, data, bytes, -1, nullptr, 0, nullptr);
}

// A binomial tree rooted at rank 0: at level k, a rank whose lowest set bit is 2^k sends its
// partial sum to rank - 2^k and drops out; rank 0 ends with the sum and it flows back down the
// same edges, parents sending to their farthest child first.
Status RingCollective::Tree(void* data, size_t count, size_t elem, const Reducer& reduce) {
  const size_t bytes = count * elem;
  const int n = size_, r = rank_;
  uint32_t level = 0;
  for (int mask = 1; mask < n; mask <<= 1, ++level) {
    if (r & mask) {
      RETURN_IF_ERROR(PeerExchange(OpKind::kAllReduce, level, r - mask, data, bytes, -1, nullptr, 0, nullptr));
      break;
    }
    if (r + mask < n) RETURN_IF_ERROR(ReceiveReducing(level, r + mask, data, bytes, elem, reduce));
  }
  // The broadcast: from the parent (the edge at this rank's lowest set bit), then to the children.
  int top = 1;  // children are r + mask for mask < top
  if (r > 0) {
    top = r & -r;
    RETURN_IF_ERROR(PeerExchange(OpKind::kAllReduce, kBroadcastStep + std::countr_zero(static_cast<unsigned>(top)), -1,
                                 nullptr, 0, r - top, data, bytes, nullptr));
  } else {
    while (top < n) top <<= 1;
  }
  for (int mask = top >> 1; mask >= 1; mask >>= 1) {
    if (r + mask >= n) continue;
    RETURN_IF_ERROR(PeerExchange(OpKind::kAllReduce, kBroadcastStep + std::countr_zero(static_cast<unsigned>(mask)),
                                 r + mask, data, bytes, -1, nullptr, 0, nullptr));
  }
  return OkStatus();
}

}  // namespace gradsync
