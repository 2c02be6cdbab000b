// PlanAlgorithm: the collective's steps that are not the ring's pipeline: recursive
// halving-doubling, recursive doubling and the binomial tree (and their fold), one PlanStep at a
// time over the ring and mesh connections. Their steps come from allreduce/plan/.
#include "allreduce/plan_runner.h"

namespace gradsync {

Status PlanAlgorithm::ReceiveReducing(uint32_t step, int from, void* data, size_t bytes, size_t elem,
                                      const Reducer& reduce, int to, const void* send, size_t send_bytes) {
  scratch_.resize(std::max<size_t>(1, segment_bytes_ / sizeof(float) + 1));
  char* d = static_cast<char*>(data);
  return mesh_.Exchange(CollectiveOp::kAllReduce, step, to, send, send_bytes, from, scratch_.data(), bytes,
                        [&](size_t off, size_t len) { reduce(d + off, scratch_.data(), len / elem); },
                        /*recv_reuse=*/true);
}

Status PlanAlgorithm::AllReduce(void* data, size_t count, size_t elem, const Reducer& reduce, ShmGroup::Adder) {
  return Run(AllReducePlan(algo_, mesh_.rank(), mesh_.size(), count), data, elem, reduce);
}

Status PlanAlgorithm::Run(const Plan& plan, void* data, size_t elem, const Reducer& reduce) {
  char* d = static_cast<char*>(data);
  for (const PlanStep& s : plan) {
    char* send = d + s.send.begin * elem;
    char* recv = d + s.recv.begin * elem;
    const size_t send_bytes = s.send.size() * elem, recv_bytes = s.recv.size() * elem;
    const bool overlap = s.to >= 0 && s.from >= 0 && s.send.begin < s.recv.end && s.recv.begin < s.send.end;
    if (s.reduce && overlap) {
      // A swap of the same range (recursive doubling): the whole incoming buffer first, then the sum.
      whole_.resize(recv_bytes);
      RETURN_IF_ERROR(mesh_.Exchange(CollectiveOp::kAllReduce, s.tag, s.to, send, send_bytes, s.from, whole_.data(), recv_bytes, nullptr));
      reduce(recv, whole_.data(), s.recv.size());
    } else if (s.reduce) {
      RETURN_IF_ERROR(ReceiveReducing(s.tag, s.from, recv, recv_bytes, elem, reduce, s.to, send, send_bytes));
    } else {
      RETURN_IF_ERROR(mesh_.Exchange(CollectiveOp::kAllReduce, s.tag, s.to, send, send_bytes, s.from, recv, recv_bytes, nullptr));
    }
  }
  return OkStatus();
}

}  // namespace gradsync
