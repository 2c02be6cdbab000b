#include "allreduce/shm/shm_path.h"

#include <random>
#include <sstream>

namespace gradsync {

void SharedMemoryPath::Off(std::string why) {
  ready_ = false;
  why_not_ = std::move(why);
}

Status SharedMemoryPath::SetUp(Collective& ring) {
  const MeshTopology& topology = mesh_.topology();
  const auto& group = topology.hosts()[static_cast<size_t>(topology.my_host())];
  const int index = static_cast<int>(std::find(group.begin(), group.end(), topology.rank()) - group.begin());
  const int members = static_cast<int>(group.size());
  uint64_t nonce = 0;
  std::string mine, failure;
  if (members > 1 && index == 0) {
    nonce = (static_cast<uint64_t>(std::random_device{}()) << 32) | std::random_device{}();
    auto g = ShmGroup::Create(members, options_.shm_block_bytes, nonce);
    if (g.ok()) {
      group_ = std::move(g).value();
      mine = group_->name() + " " + std::to_string(nonce);
    } else {
      failure = g.status().message();
    }
  }
  std::vector<std::vector<std::byte>> all;
  RETURN_IF_ERROR(ring.AllGather(std::as_bytes(std::span<const char>(mine.data(), mine.size())), &all));
  if (members > 1 && index > 0) {
    const auto& offer = all[static_cast<size_t>(group.front())];
    std::istringstream in(std::string(reinterpret_cast<const char*>(offer.data()), offer.size()));
    std::string name;
    if (!(in >> name >> nonce)) {
      failure = "rank " + std::to_string(group.front()) + " offers no shared memory";
    } else if (auto g = ShmGroup::Attach(name, members, index, options_.shm_block_bytes, nonce); g.ok()) {
      group_ = std::move(g).value();
    } else {
      failure = g.status().message();
    }
  }
  std::vector<std::vector<std::byte>> verdicts;
  RETURN_IF_ERROR(ring.AllGather(std::as_bytes(std::span<const char>(failure.data(), failure.size())), &verdicts));
  if (group_ && index == 0) group_->Unpublish();  // every member has mapped it (or given up)
  why_not_.clear();
  for (size_t r = 0; r < verdicts.size(); ++r) {
    if (!verdicts[r].empty()) {
      why_not_ += (why_not_.empty() ? "" : "; ") + std::string("rank ") + std::to_string(r) + ": " +
                  std::string(reinterpret_cast<const char*>(verdicts[r].data()), verdicts[r].size());
    }
  }
  bool any_shared = false;
  for (const auto& g : topology.hosts()) any_shared |= g.size() > 1;
  if (!any_shared && why_not_.empty()) why_not_ = "no host runs more than one rank";
  ready_ = why_not_.empty();
  if (!ready_) {
    group_.reset();
  } else if (group_) {
    std::vector<std::string> names;
    for (int r : group) names.push_back("rank " + std::to_string(r));
    group_->set_member_names(std::move(names));
    group_->set_wait_policy(options_.shm_wait);
  }
  return OkStatus();
}

Status ShmAllReduce::AllReduce(void* data, size_t count, size_t elem, const Reducer& reduce, ShmGroup::Adder add) {
  if (mesh_.topology().hosts().size() != 1) {
    return mesh_.Fail(FailedPreconditionError("--allreduce-algo=shm needs every rank on one host; these span " +
                                              std::to_string(mesh_.topology().hosts().size()) + " (use hier or auto)"));
  }
  if (Status s = path_.group().AllReduce(data, count, elem, reduce, timeout_s_, add); !s.ok()) return mesh_.Fail(s);
  return OkStatus();
}

Status HierarchicalAllReduce::AllReduce(void* data, size_t count, size_t elem, const Reducer& reduce, ShmGroup::Adder add) {
  const Plan plan = HierarchicalPlan(mesh_.rank(), mesh_.topology().hosts(), count);
  std::span<const PlanStep> steps(plan);
  if (!steps.empty() && steps.front().shm == PlanStep::Shm::kReduce) {
    if (Status s = path_.group().Reduce(data, count, elem, reduce, timeout_s_, add); !s.ok()) return mesh_.Fail(s);
    steps = steps.subspan(1);
  }
  const bool broadcast = !steps.empty() && steps.back().shm == PlanStep::Shm::kBroadcast;
  if (broadcast) steps = steps.first(steps.size() - 1);
  RETURN_IF_ERROR(ring_.Run(CollectiveOp::kAllReduce, data, elem, reduce, steps));
  if (broadcast) {
    if (Status s = path_.group().Broadcast(data, count * elem, timeout_s_); !s.ok()) return mesh_.Fail(s);
  }
  return OkStatus();
}

}  // namespace gradsync
