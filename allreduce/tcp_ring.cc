#include "allreduce/tcp_ring.h"

#include "common/base/numeric/half.h"

namespace gradsync {

void AddFloats(void* acc, const void* x, size_t k) {
  float* __restrict a = static_cast<float*>(acc);
  const float* __restrict b = static_cast<const float*>(x);
  for (size_t i = 0; i < k; ++i) a[i] += b[i];
}

void SumFloats(void* out, const void* a, const void* b, size_t k) {
  float* __restrict o = static_cast<float*>(out);
  const float* __restrict x = static_cast<const float*>(a);
  const float* __restrict y = static_cast<const float*>(b);
  for (size_t i = 0; i < k; ++i) o[i] = x[i] + y[i];
}

namespace {
// Segments of whole floats.
CollectiveOptions Normalized(CollectiveOptions o) {
  o.segment_bytes = std::max<size_t>(4, o.segment_bytes / 4 * 4);
  if (o.exchange_segment_bytes > 0) o.exchange_segment_bytes = std::max<size_t>(4, o.exchange_segment_bytes / 4 * 4);
  return o;
}

// A valid address for empty buffers (a zero-length side is not a skipped side).
std::byte empty_buffer[1];

// Caller-given chunk bounds (kInvalidArgument, before anything moves).
Status CheckBounds(std::span<const size_t> bounds, size_t count, int n) {
  if (bounds.empty()) return OkStatus();
  bool ok = bounds.size() == static_cast<size_t>(n) + 1 && bounds.front() == 0 && bounds.back() == count;
  for (size_t i = 1; ok && i < bounds.size(); ++i) ok = bounds[i - 1] <= bounds[i];
  if (!ok) {
    return InvalidArgumentError("chunk bounds must be " + std::to_string(n + 1) + " non-decreasing offsets from 0 to " +
                                std::to_string(count));
  }
  return OkStatus();
}

// AllGather: checks the announced sizes and sizes the blocks.
Status SizeBlocks(std::span<const uint64_t> sizes, int rank, std::vector<std::vector<std::byte>>* out) {
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] > (uint64_t{1} << 36)) return DataLossError("allgather: rank " + std::to_string(i) + " announces " + std::to_string(sizes[i]) + " bytes");
    if (static_cast<int>(i) != rank) (*out)[i].resize(sizes[i]);
  }
  return OkStatus();
}
}  // namespace

RingCollective::RingCollective(const CollectiveOptions& options, const RingSecurity& security)
    : options_(Normalized(options)),
      mesh_(options_, security),
      ring_(mesh_, options_.segment_bytes, scratch_),
      rhd_(AllReduceAlgo::kRhd, mesh_, options_.segment_bytes, scratch_),
      rd_(AllReduceAlgo::kRd, mesh_, options_.segment_bytes, scratch_),
      tree_(AllReduceAlgo::kTree, mesh_, options_.segment_bytes, scratch_),
      shm_(mesh_, options_),
      shm_all_reduce_(shm_, mesh_, options_.timeout_s),
      hier_(shm_, ring_, mesh_, options_.timeout_s),
      algorithms_{nullptr, &ring_, &rhd_, &rd_, &tree_, &shm_all_reduce_, &hier_} {
  static_assert(static_cast<size_t>(AllReduceAlgo::kRing) == 1 && static_cast<size_t>(AllReduceAlgo::kRhd) == 2 &&
                static_cast<size_t>(AllReduceAlgo::kRd) == 3 && static_cast<size_t>(AllReduceAlgo::kTree) == 4 &&
                static_cast<size_t>(AllReduceAlgo::kShm) == 5 && static_cast<size_t>(AllReduceAlgo::kHier) == 6);
}

RingCollective::~RingCollective() { Abort(); }

Result<std::unique_ptr<RingCollective>> RingCollective::Listen(const std::string& bind_host,
                                                               const CollectiveOptions& options,
                                                               const RingSecurity& security) {
  auto ring = std::unique_ptr<RingCollective>(new RingCollective(options, security));
  RETURN_IF_ERROR(ring->mesh_.Listen(bind_host));
  return ring;
}

Status RingCollective::Connect(int rank, const std::vector<std::string>& peers, double timeout_s) {
  RETURN_IF_ERROR(mesh_.Connect(rank, peers, timeout_s));
  if (mesh_.size() == 1) return OkStatus();
  shm_.Off(options_.shm ? "the ring is encrypted (--ring-encrypt keeps every byte on encrypted TCP)" : "off (--allreduce-shm=false)");
  if (options_.shm && !mesh_.encrypted()) RETURN_IF_ERROR(shm_.SetUp(*this).WithContext("shared-memory set-up"));
  return OkStatus();
}

void RingCollective::Cancel(const std::string& why) {
  if (!mesh_.Cancel(why)) return;
  shm_.Cancel();
}

Status RingCollective::AllReduce(FloatSpan data, ReduceOp op) {
  RETURN_IF_ERROR(mesh_.Begin());
  if (mesh_.size() == 1 || data.empty()) return OkStatus();
  RETURN_IF_ERROR(AllReduceWith(data.data(), data.size(), sizeof(float), AddFloats, SumFloats));
  if (op == ReduceOp::kAverage) Scale(data, 1.0f / static_cast<float>(mesh_.size()));
  return OkStatus();
}

Status RingCollective::AllReduce16(std::span<uint16_t> data, Float16 format) {
  RETURN_IF_ERROR(mesh_.Begin());
  if (mesh_.size() == 1 || data.empty()) return OkStatus();
  if (format == Float16::kBfloat16) {
    return AllReduceWith(data.data(), data.size(), sizeof(uint16_t), [](void* acc, const void* x, size_t k) {
      AddBf16s(static_cast<uint16_t*>(acc), static_cast<const uint16_t*>(x), k);
    });
  }
  return AllReduceWith(data.data(), data.size(), sizeof(uint16_t), [](void* acc, const void* x, size_t k) {
    AddHalves(static_cast<uint16_t*>(acc), static_cast<const uint16_t*>(x), k);
  });
}

Status RingCollective::AllReduceWith(void* data, size_t count, size_t elem, const Reducer& reduce, ShmGroup::Adder add) {
  // Shared memory when every rank is on this host; across hosts with several ranks on one, the
  // hierarchy; else the TCP algorithms (the simulator makes the same choice).
  const MeshTopology& topology = mesh_.topology();
  const AllReduceAlgo algo = ResolveAllReduceAlgo(
      {options_.algorithm, topology.host_count(), shm_.ready(), topology.oversubscribed()}, count * elem, mesh_.size());
  mesh_.headers().set_algorithm(algo);
  last_algorithm_ = algo;
  if ((algo == AllReduceAlgo::kShm || algo == AllReduceAlgo::kHier) && !shm_.ready()) {
    return mesh_.Fail(FailedPreconditionError(std::string("--allreduce-algo=") + AllReduceAlgoName(algo) +
                                              " needs shared memory between this host's ranks: " + shm_.off_reason()));
  }
  return algorithms_[static_cast<size_t>(algo)]->AllReduce(data, count, elem, reduce, add);
}

Status RingCollective::ReduceScatter(FloatSpan data, ReduceOp op, std::span<const size_t> bounds) {
  RETURN_IF_ERROR(CheckBounds(bounds, data.size(), mesh_.size()));
  RETURN_IF_ERROR(mesh_.Begin());
  if (mesh_.size() == 1 || data.empty()) return OkStatus();
  RETURN_IF_ERROR(ring_.Run(CollectiveOp::kReduceScatter, data.data(), sizeof(float), AddFloats,
                            RingPlan(mesh_.rank(), mesh_.size(), data.size(), 0, mesh_.size() - 1, bounds)));
  if (op == ReduceOp::kAverage) {
    const size_t b = bounds.empty() ? ChunkBegin(data.size(), mesh_.size(), mesh_.rank()) : bounds[mesh_.rank()];
    const size_t e = bounds.empty() ? ChunkBegin(data.size(), mesh_.size(), mesh_.rank() + 1) : bounds[mesh_.rank() + 1];
    Scale(data.subspan(b, e - b), 1.0f / static_cast<float>(mesh_.size()));
  }
  return OkStatus();
}

Status RingCollective::AllGatherChunks(FloatSpan data, std::span<const size_t> bounds) {
  RETURN_IF_ERROR(CheckBounds(bounds, data.size(), mesh_.size()));
  RETURN_IF_ERROR(mesh_.Begin());
  if (mesh_.size() == 1 || data.empty()) return OkStatus();
  return ring_.Run(CollectiveOp::kAllGatherChunks, data.data(), sizeof(float), nullptr,
                   RingPlan(mesh_.rank(), mesh_.size(), data.size(), mesh_.size() - 1, 2 * (mesh_.size() - 1), bounds));
}

Status RingCollective::Broadcast(FloatSpan data, int root) {
  RETURN_IF_ERROR(mesh_.Begin());
  if (root < 0 || root >= mesh_.size()) return mesh_.Fail(InvalidArgumentError("broadcast root " + std::to_string(root) + " out of range"));
  if (mesh_.size() == 1) return OkStatus();
  // Forwarded segment by segment: a rank passes on each segment as soon as it has it.
  char* p = data.empty() ? reinterpret_cast<char*>(empty_buffer) : reinterpret_cast<char*>(data.data());
  for (const PlanStep& s : BroadcastPlan(mesh_.rank(), mesh_.size(), root, data.size_bytes(), options_.segment_bytes)) {
    RETURN_IF_ERROR(mesh_.Exchange(CollectiveOp::kBroadcast, s.tag, s.to, p + s.send.begin, s.send.size(), s.from, p + s.recv.begin,
                                 s.recv.size(), nullptr));
  }
  return OkStatus();
}

Status RingCollective::AllGather(std::span<const std::byte> mine, std::vector<std::vector<std::byte>>* out) {
  RETURN_IF_ERROR(mesh_.Begin());
  const int n = mesh_.size(), r = mesh_.rank();
  out->assign(static_cast<size_t>(n), {});
  (*out)[r].assign(mine.begin(), mine.end());
  if (n == 1) return OkStatus();
  // First every rank's size, around the ring; then the blocks themselves (AllGatherPlan).
  std::vector<uint64_t> sizes(static_cast<size_t>(n), 0);
  sizes[r] = mine.size();
  const Plan plan = AllGatherPlan(r, n);
  for (const PlanStep& s : plan) {
    const size_t send_idx = s.send.begin, recv_idx = s.recv.begin;
    if (s.tag < static_cast<uint32_t>(n - 1)) {
      RETURN_IF_ERROR(mesh_.Exchange(CollectiveOp::kAllGather, s.tag, s.to, &sizes[send_idx], sizeof(uint64_t), s.from,
                                   &sizes[recv_idx], sizeof(uint64_t), nullptr));
      continue;
    }
    if (s.tag == static_cast<uint32_t>(n - 1)) {
      if (Status bad = SizeBlocks(sizes, r, out); !bad.ok()) return mesh_.Fail(bad);
    }
    auto& sb = (*out)[send_idx];
    auto& rb = (*out)[recv_idx];
    RETURN_IF_ERROR(mesh_.Exchange(CollectiveOp::kAllGather, s.tag, s.to, sb.empty() ? empty_buffer : sb.data(), sb.size(), s.from,
                                 rb.empty() ? empty_buffer : rb.data(), rb.size(), nullptr));
  }
  return OkStatus();
}

Status RingCollective::Barrier() {
  RETURN_IF_ERROR(mesh_.Begin());
  // After n - 1 steps every rank has (transitively) heard from every other.
  for (int s = 0; s < mesh_.size() - 1; ++s) {
    RETURN_IF_ERROR(mesh_.Exchange(CollectiveOp::kBarrier, static_cast<uint32_t>(s), (mesh_.rank() + 1) % mesh_.size(), empty_buffer, 0,
                                   (mesh_.rank() - 1 + mesh_.size()) % mesh_.size(), empty_buffer, 0, nullptr));
  }
  return OkStatus();
}

}  // namespace gradsync
