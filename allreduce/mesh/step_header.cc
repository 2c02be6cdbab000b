#include "allreduce/mesh/step_header.h"

#include "allreduce/mesh/topology.h"

namespace gradsync {
namespace {
constexpr uint32_t kStepMagic = 0x47535247;  // "GRSG"

const char* OpName(uint32_t op) {
  switch (op) {
    case 1: return "allreduce";
    case 2: return "broadcast";
    case 3: return "allgather";
    case 4: return "barrier";
    case 5: return "reduce-scatter";
    case 6: return "allgather (chunks)";
    default: return "unknown op";
  }
}
}  // namespace

std::string StepHeaders::Where(CollectiveOp op, uint32_t step) const {
  return std::string(OpName(static_cast<uint32_t>(op))) + " #" + std::to_string(seq_) + " step " + std::to_string(step) +
         " on rank " + std::to_string(topology_.rank());
}

StepHeader StepHeaders::Header(CollectiveOp op, uint32_t step, uint64_t bytes) const {
  const uint32_t algo = op == CollectiveOp::kAllReduce ? static_cast<uint32_t>(algo_) : 0;
  return {kStepMagic, static_cast<uint32_t>(op), seq_, step, algo, bytes};
}

Status StepHeaders::Check(const StepHeader& in, CollectiveOp op, uint32_t step, size_t bytes, int from) const {
  const uint32_t algo = op == CollectiveOp::kAllReduce ? static_cast<uint32_t>(algo_) : 0;
  if (in.magic == kStepMagic && in.op == static_cast<uint32_t>(op) && in.seq == seq_ && in.algo != algo &&
      op == CollectiveOp::kAllReduce) {
    return InvalidArgumentError("rank " + std::to_string(from) + " runs all-reduce #" + std::to_string(seq_) + " with " +
                                AllReduceAlgoName(static_cast<AllReduceAlgo>(in.algo)) + " but rank " +
                                std::to_string(topology_.rank()) + " with " + AllReduceAlgoName(static_cast<AllReduceAlgo>(algo)) +
                                ": every worker needs the same --allreduce-algo");
  }
  if (in.magic != kStepMagic || in.op != static_cast<uint32_t>(op) || in.seq != seq_ || in.step != step ||
      in.bytes != bytes || in.algo != algo) {
    return InternalError("mismatched collectives: rank " + std::to_string(from) + " sent " + OpName(in.op) + " #" +
                         std::to_string(in.seq) + " step " + std::to_string(in.step) + " (" + std::to_string(in.bytes) +
                         " bytes) but " + Where(op, step) + " expects " + std::to_string(bytes) +
                         " bytes: every rank must call the same operations in the same order");
  }
  return OkStatus();
}

}  // namespace gradsync
