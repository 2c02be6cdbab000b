#include "allreduce/tcp_ring.h"

#include <random>
#include <sstream>

#include "allreduce/ring_pipeline.h"
#include "common/base/numeric/half.h"

namespace gradsync {

std::byte RingCollective::empty_[1];

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
}  // namespace

RingCollective::RingCollective(const CollectiveOptions& options, const RingSecurity& security)
    : options_(Normalized(options)), mesh_(options_, security) {}

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
  shm_ready_ = false;
  shm_why_not_ = options_.shm ? "the ring is encrypted (--ring-encrypt keeps every byte on encrypted TCP)" : "off (--allreduce-shm=false)";
  if (options_.shm && !mesh_.encrypted()) RETURN_IF_ERROR(SetUpSharedMemory().WithContext("shared-memory set-up"));
  return OkStatus();
}

void RingCollective::Cancel(const std::string& why) {
  if (!mesh_.Cancel(why)) return;
  if (shm_) shm_->Cancel();
}

Status RingCollective::RingSteps(CollectiveOp op, void* data, size_t elem, const Reducer& reduce,
                                 std::span<const PlanStep> plan) {
  return RingPipeline(mesh_, op, data, elem, reduce, plan, options_.segment_bytes, scratch_).Run();
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
  const AllReduceAlgo algo = ResolveAllReduceAlgo(
      {options_.algorithm, static_cast<int>(mesh_.hosts().size()), shm_ready_, mesh_.oversubscribed()}, count * elem, mesh_.size());
  mesh_.set_algorithm(algo);
  last_algorithm_ = algo;
  if ((algo == AllReduceAlgo::kShm || algo == AllReduceAlgo::kHier) && !shm_ready_) {
    return Fail(FailedPreconditionError(std::string("--allreduce-algo=") + AllReduceAlgoName(algo) +
                                        " needs shared memory between this host's ranks: " + shm_why_not_));
  }
  switch (algo) {
    case AllReduceAlgo::kShm:
      if (mesh_.hosts().size() != 1) {
        return Fail(FailedPreconditionError("--allreduce-algo=shm needs every rank on one host; these span " +
                                            std::to_string(mesh_.hosts().size()) + " (use hier or auto)"));
      }
      if (Status s = shm_->AllReduce(data, count, elem, reduce, options_.timeout_s, add); !s.ok()) return Fail(s);
      return OkStatus();
    case AllReduceAlgo::kHier: return Hierarchical(data, count, elem, reduce, add);
    case AllReduceAlgo::kRing: return RingSteps(CollectiveOp::kAllReduce, data, elem, reduce, RingAllReducePlan(mesh_.rank(), mesh_.size(), count));
    default: return RunPlan(AllReducePlan(algo, mesh_.rank(), mesh_.size(), count), data, elem, reduce);
  }
}

Status RingCollective::CheckBounds(std::span<const size_t> bounds, size_t count) const {
  if (bounds.empty()) return OkStatus();
  bool ok = bounds.size() == static_cast<size_t>(mesh_.size()) + 1 && bounds.front() == 0 && bounds.back() == count;
  for (size_t i = 1; ok && i < bounds.size(); ++i) ok = bounds[i - 1] <= bounds[i];
  if (!ok) {
    return InvalidArgumentError("chunk bounds must be " + std::to_string(mesh_.size() + 1) + " non-decreasing offsets from 0 to " +
                                std::to_string(count));
  }
  return OkStatus();
}

// Across hosts: the host's ranks reduce into their leader through shared memory, the leaders
// all-reduce around their own ring over TCP, and each leader broadcasts the result back
// (HierarchicalPlan).
Status RingCollective::Hierarchical(void* data, size_t count, size_t elem, const Reducer& reduce, ShmGroup::Adder add) {
  const Plan plan = HierarchicalPlan(mesh_.rank(), mesh_.hosts(), count);
  std::span<const PlanStep> ring(plan);
  if (!ring.empty() && ring.front().shm == PlanStep::Shm::kReduce) {
    if (Status s = shm_->Reduce(data, count, elem, reduce, options_.timeout_s, add); !s.ok()) return Fail(s);
    ring = ring.subspan(1);
  }
  const bool broadcast = !ring.empty() && ring.back().shm == PlanStep::Shm::kBroadcast;
  if (broadcast) ring = ring.first(ring.size() - 1);
  RETURN_IF_ERROR(RingSteps(CollectiveOp::kAllReduce, data, elem, reduce, ring));
  if (broadcast) {
    if (Status s = shm_->Broadcast(data, count * elem, options_.timeout_s); !s.ok()) return Fail(s);
  }
  return OkStatus();
}

// Every host's leader creates its group's region; the ranks learn every leader's (name, nonce)
// over the ring, the others attach, and every rank learns every rank's verdict: shared memory is
// used only if every host that has several ranks could set it up, so that all ranks agree.
Status RingCollective::SetUpSharedMemory() {
  const auto& group = mesh_.hosts()[static_cast<size_t>(mesh_.my_host())];
  const int index = static_cast<int>(std::find(group.begin(), group.end(), mesh_.rank()) - group.begin());
  const int members = static_cast<int>(group.size());
  uint64_t nonce = 0;
  std::string mine, failure;
  if (members > 1 && index == 0) {
    nonce = (static_cast<uint64_t>(std::random_device{}()) << 32) | std::random_device{}();
    auto g = ShmGroup::Create(members, options_.shm_block_bytes, nonce);
    if (g.ok()) {
      shm_ = std::move(g).value();
      mine = shm_->name() + " " + std::to_string(nonce);
    } else {
      failure = g.status().message();
    }
  }
  std::vector<std::vector<std::byte>> all;
  RETURN_IF_ERROR(AllGather(std::as_bytes(std::span<const char>(mine.data(), mine.size())), &all));
  if (members > 1 && index > 0) {
    const auto& offer = all[static_cast<size_t>(group.front())];
    std::istringstream in(std::string(reinterpret_cast<const char*>(offer.data()), offer.size()));
    std::string name;
    if (!(in >> name >> nonce)) {
      failure = "rank " + std::to_string(group.front()) + " offers no shared memory";
    } else if (auto g = ShmGroup::Attach(name, members, index, options_.shm_block_bytes, nonce); g.ok()) {
      shm_ = std::move(g).value();
    } else {
      failure = g.status().message();
    }
  }
  std::vector<std::vector<std::byte>> verdicts;
  RETURN_IF_ERROR(AllGather(std::as_bytes(std::span<const char>(failure.data(), failure.size())), &verdicts));
  if (shm_ && index == 0) shm_->Unpublish();  // every member has mapped it (or given up)
  shm_why_not_.clear();
  for (size_t r = 0; r < verdicts.size(); ++r) {
    if (!verdicts[r].empty()) {
      shm_why_not_ += (shm_why_not_.empty() ? "" : "; ") + std::string("rank ") + std::to_string(r) + ": " +
                      std::string(reinterpret_cast<const char*>(verdicts[r].data()), verdicts[r].size());
    }
  }
  bool any_shared = false;
  for (const auto& g : mesh_.hosts()) any_shared |= g.size() > 1;
  if (!any_shared && shm_why_not_.empty()) shm_why_not_ = "no host runs more than one rank";
  shm_ready_ = shm_why_not_.empty();
  if (!shm_ready_) {
    shm_.reset();
  } else if (shm_) {
    std::vector<std::string> names;
    for (int r : group) names.push_back("rank " + std::to_string(r));
    shm_->set_member_names(std::move(names));
    shm_->set_wait_policy(options_.shm_wait);
  }
  return OkStatus();
}

Status RingCollective::ReduceScatter(FloatSpan data, ReduceOp op, std::span<const size_t> bounds) {
  RETURN_IF_ERROR(CheckBounds(bounds, data.size()));
  RETURN_IF_ERROR(mesh_.Begin());
  if (mesh_.size() == 1 || data.empty()) return OkStatus();
  RETURN_IF_ERROR(RingSteps(CollectiveOp::kReduceScatter, data.data(), sizeof(float), AddFloats,
                            RingPlan(mesh_.rank(), mesh_.size(), data.size(), 0, mesh_.size() - 1, bounds)));
  if (op == ReduceOp::kAverage) {
    const size_t b = bounds.empty() ? ChunkBegin(data.size(), mesh_.size(), mesh_.rank()) : bounds[mesh_.rank()];
    const size_t e = bounds.empty() ? ChunkBegin(data.size(), mesh_.size(), mesh_.rank() + 1) : bounds[mesh_.rank() + 1];
    Scale(data.subspan(b, e - b), 1.0f / static_cast<float>(mesh_.size()));
  }
  return OkStatus();
}

Status RingCollective::AllGatherChunks(FloatSpan data, std::span<const size_t> bounds) {
  RETURN_IF_ERROR(CheckBounds(bounds, data.size()));
  RETURN_IF_ERROR(mesh_.Begin());
  if (mesh_.size() == 1 || data.empty()) return OkStatus();
  return RingSteps(CollectiveOp::kAllGatherChunks, data.data(), sizeof(float), nullptr,
                   RingPlan(mesh_.rank(), mesh_.size(), data.size(), mesh_.size() - 1, 2 * (mesh_.size() - 1), bounds));
}

Status RingCollective::Broadcast(FloatSpan data, int root) {
  RETURN_IF_ERROR(mesh_.Begin());
  if (root < 0 || root >= mesh_.size()) return Fail(InvalidArgumentError("broadcast root " + std::to_string(root) + " out of range"));
  if (mesh_.size() == 1) return OkStatus();
  // Forwarded segment by segment: a rank passes on each segment as soon as it has it.
  char* p = data.empty() ? reinterpret_cast<char*>(empty_) : reinterpret_cast<char*>(data.data());
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
    if (s.tag == static_cast<uint32_t>(n - 1)) RETURN_IF_ERROR(SizeBlocks(sizes, out));
    auto& sb = (*out)[send_idx];
    auto& rb = (*out)[recv_idx];
    RETURN_IF_ERROR(mesh_.Exchange(CollectiveOp::kAllGather, s.tag, s.to, sb.empty() ? empty_ : sb.data(), sb.size(), s.from,
                                 rb.empty() ? empty_ : rb.data(), rb.size(), nullptr));
  }
  return OkStatus();
}

Status RingCollective::SizeBlocks(std::span<const uint64_t> sizes, std::vector<std::vector<std::byte>>* out) {
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] > (uint64_t{1} << 36)) return Fail(DataLossError("allgather: rank " + std::to_string(i) + " announces " + std::to_string(sizes[i]) + " bytes"));
    if (static_cast<int>(i) != mesh_.rank()) (*out)[i].resize(sizes[i]);
  }
  return OkStatus();
}

Status RingCollective::Barrier() {
  RETURN_IF_ERROR(mesh_.Begin());
  // After n - 1 steps every rank has (transitively) heard from every other.
  for (int s = 0; s < mesh_.size() - 1; ++s) {
    RETURN_IF_ERROR(mesh_.Exchange(CollectiveOp::kBarrier, static_cast<uint32_t>(s), (mesh_.rank() + 1) % mesh_.size(), empty_, 0,
                                   (mesh_.rank() - 1 + mesh_.size()) % mesh_.size(), empty_, 0, nullptr));
  }
  return OkStatus();
}

}  // namespace gradsync
