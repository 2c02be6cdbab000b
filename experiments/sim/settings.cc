// The simulation's settings (ResolveSim), the hosts and algorithm of a simulated all-reduce, and
// the line that says what the simulation assumed (DescribeSim).
#include <algorithm>
#include <cstdint>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "allreduce/plan/algorithm.h"
#include "common/base/status.h"
#include "common/base/numeric/tensor.h"
#include "common/config/train_config.h"
#include "experiments/sim/inputs.h"
#include "experiments/sim/optimizer_cost.h"
#include "experiments/sim/sim.h"
#include "experiments/spec/link.h"
#include "experiments/spec/spec.h"

namespace gradsync {
namespace {

using sim::AccuracyCurve;
using sim::CodecTimesFromTrace;
using sim::MedianComputeMs;
using sim::ModelShapes;
using sim::ParseTensorShape;

Result<double> RateBits(const std::string& rate, const std::string& what) {
  auto bits = TcRateBitsPerSecond(rate);
  if (!bits.ok()) return InvalidArgumentError(what + ": " + bits.status().message());
  return *bits;
}

// The compute time per step (given, or a real run's median) and its forward fraction.
Status ResolveCompute(const spec::Sim& sim, SimSettings* out) {
  SimSettings& s = *out;
  if (sim.has_compute_ms()) {
    if (!(sim.compute_ms() >= 0)) return InvalidArgumentError("sim.compute_ms must be >= 0");
    s.compute_ms = sim.compute_ms();
    s.compute_source = "given";
  } else if (sim.has_compute_from()) {
    ASSIGN_OR_RETURN(s.compute_ms, MedianComputeMs(sim.compute_from()));
    s.compute_source = sim.compute_from();
  } else {
    return InvalidArgumentError(
        "the simulation needs the compute time per step: --compute-ms=MS, or in the spec sim { compute_ms: MS } or "
        "sim { compute_from: \"<a real run's metrics.csv>\" }");
  }
  if (sim.has_forward_fraction()) {
    if (!(sim.forward_fraction() > 0 && sim.forward_fraction() < 1))
      return InvalidArgumentError("sim.forward_fraction must be in (0, 1)");
    s.forward_fraction = sim.forward_fraction();
  }
  return OkStatus();
}

// The links: their rate (sim's, the run's emulated link with its bucket, or unshaped), latency,
// racks and the racks' oversubscription.
Status ResolveLinks(const RunPlan& plan, SimSettings* out) {
  const spec::Sim& sim = plan.run.sim();
  SimSettings& s = *out;
  // What a host moves over its own veth or loopback, unshaped.
  ASSIGN_OR_RETURN(s.peak_bits_per_s,
                   RateBits(sim.has_loopback_rate() ? sim.loopback_rate() : "20gbit", "sim.loopback_rate"));
  if (sim.has_link_rate()) {
    s.link = sim.link_rate();
    ASSIGN_OR_RETURN(s.link_bits_per_s, RateBits(s.link, "sim.link_rate"));
  } else if (plan.run.has_link() && !plan.run.link().rate().empty()) {
    // An emulated link is tc tbf with netns.h's bucket: what the bucket holds passes at the
    // host's own speed.
    s.link = plan.run.link().rate();
    ASSIGN_OR_RETURN(s.link_bits_per_s, RateBits(s.link, "link.rate"));
    s.burst_bytes = TbfBurstBytes(s.link_bits_per_s);
  } else {
    s.link = plan.run.has_link() ? "unshaped" : "loopback";
    s.link_bits_per_s = s.peak_bits_per_s;
  }
  if (!sim.has_link_rate() && plan.run.has_link()) s.latency_us += 1e3 * plan.run.link().delay_ms();
  if (sim.has_latency_us()) {
    if (!(sim.latency_us() >= 0)) return InvalidArgumentError("sim.latency_us must be >= 0");
    s.latency_us =
        sim.latency_us() + (plan.run.has_link() && !sim.has_link_rate() ? 1e3 * plan.run.link().delay_ms() : 0);
  }
  if (sim.rack_size() < 0) return InvalidArgumentError("sim.rack_size must be >= 0");
  s.rack_size = sim.rack_size();
  if (sim.has_oversubscription()) {
    if (!(sim.oversubscription() >= 1)) return InvalidArgumentError("sim.oversubscription must be >= 1");
    s.oversubscription = sim.oversubscription();
  }
  return OkStatus();
}

// The CPUs: shared cores, what moving a byte and a PS message costs on them, and applying a byte.
Status ResolveCpus(const spec::Sim& sim, SimSettings* out) {
  SimSettings& s = *out;
  if (sim.host_cores() < 0) return InvalidArgumentError("sim.host_cores must be >= 0");
  s.host_cores = sim.host_cores();
  if (sim.has_usable_cores()) {
    if (!(sim.usable_cores() > 0 && sim.usable_cores() <= s.host_cores))
      return InvalidArgumentError("sim.usable_cores must be > 0 and at most host_cores");
    s.usable_cores = sim.usable_cores();
  }
  if (!(sim.net_ns_per_byte() >= 0)) return InvalidArgumentError("sim.net_ns_per_byte must be >= 0");
  s.net_ns_per_byte = sim.net_ns_per_byte();
  if (!(sim.msg_us() >= 0)) return InvalidArgumentError("sim.msg_us must be >= 0");
  s.msg_us = sim.msg_us();
  if (!(sim.ring_msg_us() >= 0)) return InvalidArgumentError("sim.ring_msg_us must be >= 0");
  s.ring_msg_us = sim.ring_msg_us();
  if (sim.has_apply_ns_per_byte()) {
    if (!(sim.apply_ns_per_byte() >= 0)) return InvalidArgumentError("sim.apply_ns_per_byte must be >= 0");
    s.apply_ns_per_byte = sim.apply_ns_per_byte();
  }
  return OkStatus();
}

// A sender's NIC: its connections' turns, how unevenly they share it (and how many draws of the
// shares), and the payload's part of the wire.
Status ResolveNic(const spec::Sim& sim, SimSettings* out) {
  SimSettings& s = *out;
  // A sender's connections take turns on its link, finely (TCP flows sharing a link).
  if (sim.has_nic_quantum_kb()) {
    if (!(sim.nic_quantum_kb() >= 1.5)) return InvalidArgumentError("sim.nic_quantum_kb must be >= 1.5");
    s.quantum_bytes = sim.nic_quantum_kb() * 1024;
  }
  if (!(sim.flow_share_spread() >= 0 && sim.flow_share_spread() < 1))
    return InvalidArgumentError("sim.flow_share_spread must be in [0, 1)");
  s.flow_share_spread = sim.flow_share_spread();
  if (sim.has_share_draws()) {
    if (sim.share_draws() < 1 || sim.share_draws() > 99) return InvalidArgumentError("sim.share_draws must be 1 to 99");
    s.share_draws = sim.share_draws();
  }
  if (sim.has_wire_efficiency()) {
    if (!(sim.wire_efficiency() > 0 && sim.wire_efficiency() <= 1))
      return InvalidArgumentError("sim.wire_efficiency must be in (0, 1]");
    s.wire_efficiency = sim.wire_efficiency();
  }
  return OkStatus();
}

// The model's tensors and the run's steps (per worker, and per epoch of train_examples).
Status ResolveModel(const RunPlan& plan, SimSettings* out) {
  const spec::Sim& sim = plan.run.sim();
  const config::TrainConfig& t = plan.run.train();
  SimSettings& s = *out;
  if (sim.tensors_size() > 0 && sim.tensor_shapes_size() > 0) {
    return InvalidArgumentError("sim: give the model's tensors or their tensor_shapes, not both");
  }
  if (sim.tensors_size() > 0) {
    for (int64_t n : sim.tensors()) {
      if (n <= 0) return InvalidArgumentError("sim.tensors: every tensor needs > 0 floats");
      s.tensors.push_back(n);
    }
  } else {
    if (sim.tensor_shapes_size() > 0) {
      for (const std::string& text : sim.tensor_shapes()) {
        ASSIGN_OR_RETURN(std::vector<int64_t> shape, ParseTensorShape(text));
        s.shapes.push_back(std::move(shape));
      }
    } else {
      ASSIGN_OR_RETURN(s.shapes, ModelShapes(t));
    }
    for (const auto& shape : s.shapes) s.tensors.push_back(ShapeSize(shape));
  }
  for (int64_t n : s.tensors) s.params += n;
  const int64_t examples = sim.has_train_examples() ? sim.train_examples() : 60000;
  if (examples <= 0) return InvalidArgumentError("sim.train_examples must be > 0");
  const int64_t batch = t.batch() * std::max<int64_t>(1, t.accumulate());
  s.steps_per_epoch = std::max<int64_t>(1, (examples / plan.workers + batch - 1) / batch);
  s.steps = sim.has_steps() ? sim.steps() : s.steps_per_epoch * t.epochs();
  if (!sim.has_steps() && t.max_steps() > 0) s.steps = std::min(s.steps, t.max_steps());
  if (s.steps <= 0) return InvalidArgumentError("sim.steps must be > 0");
  return OkStatus();
}

// The all-reduce: hier's group, the algorithm and shared memory, and what the real collective
// refuses.
Status ResolveAllReduce(const RunPlan& plan, SimSettings* out) {
  const spec::Sim& sim = plan.run.sim();
  const config::TrainConfig& t = plan.run.train();
  SimSettings& s = *out;
  s.hier_group = sim.has_hier_group() ? sim.hier_group() : s.rack_size > 0 ? s.rack_size : 8;
  if (s.hier_group < 1) return InvalidArgumentError("sim.hier_group must be >= 1");
  const auto algo = AllReduceAlgoNamed(t.allreduce_algo());
  if (!algo) return InvalidArgumentError("allreduce_algo '" + t.allreduce_algo() + "' is not an all-reduce algorithm");
  s.algorithm = *algo;
  s.allreduce_shm = t.allreduce_shm() && !t.ring_encrypt();
  if (plan.mode == config::ALLREDUCE && plan.workers > 1) {
    // What the real collective refuses, so does the simulation (RingCollective::AllReduceWith).
    const auto layout = SimulatedAllReduceLayout(plan, s);
    if ((s.algorithm == AllReduceAlgo::kShm || s.algorithm == AllReduceAlgo::kHier) && !layout.setting.shared_memory) {
      return InvalidArgumentError(
          std::string("allreduce_algo '") + AllReduceAlgoName(s.algorithm) +
          "' needs shared memory between a host's ranks: allreduce_shm on, no ring_encrypt" +
          (s.algorithm == AllReduceAlgo::kShm ? ", and every rank on one host (a run without link)" : ""));
    }
    if (s.algorithm == AllReduceAlgo::kShm && layout.hosts.size() != 1) {
      return InvalidArgumentError("allreduce_algo 'shm' needs every rank on one host (a run without link)");
    }
  }
  return OkStatus();
}

}  // namespace

// Each part's checks run in the order they always have, so a spec with several mistakes is told
// of the same one first.
Result<SimSettings> ResolveSim(const RunPlan& plan) {
  const spec::Sim& sim = plan.run.sim();
  const config::TrainConfig& t = plan.run.train();
  SimSettings s;
  RETURN_IF_ERROR(ResolveCompute(sim, &s));
  RETURN_IF_ERROR(ResolveLinks(plan, &s));
  RETURN_IF_ERROR(ResolveCpus(sim, &s));
  RETURN_IF_ERROR(ResolveNic(sim, &s));
  RETURN_IF_ERROR(ResolveModel(plan, &s));
  RETURN_IF_ERROR(ResolveAllReduce(plan, &s));
  if (sim.has_codec_from()) RETURN_IF_ERROR(CodecTimesFromTrace(sim.codec_from(), &s));
  if (sim.has_inner_optimizer_us()) {
    if (!(sim.inner_optimizer_us() >= 0)) return InvalidArgumentError("sim.inner_optimizer_us must be >= 0");
    s.inner_optimizer_us = sim.inner_optimizer_us();
  } else if (t.sync_every() > 0) {
    ASSIGN_OR_RETURN(s.inner_optimizer_us, sim::InnerOptimizerUs(t, s.params));
  }
  if (sim.has_accuracy_from()) {
    ASSIGN_OR_RETURN(s.accuracy, AccuracyCurve(sim.accuracy_from()));
    s.accuracy_source = sim.accuracy_from();
  }
  if (t.precision() != "fp32")
    return InvalidArgumentError("precision '" + t.precision() + "': the simulation has fp32 only");
  if (const auto codec = ParseCodecSpec(t.compress()); codec.ok() && codec->needs_shapes() && s.shapes.empty()) {
    return InvalidArgumentError("compress '" + t.compress() +
                                "': PowerSGD compresses each tensor as a matrix; give the model's "
                                "sim { tensor_shapes: [...] } instead of its tensors");
  }
  return s;
}

SimAllReduceLayout SimulatedAllReduceLayout(const RunPlan& plan, const SimSettings& s) {
  SimAllReduceLayout l;
  const int n = std::max(1, plan.workers);
  const bool loopback = !plan.run.has_link() && plan.run.sim().link_rate().empty();
  const int per_host = loopback ? n : s.algorithm == AllReduceAlgo::kHier ? std::max(1, s.hier_group) : 1;
  for (int r = 0; r < n; ++r) {
    if (r % per_host == 0) l.hosts.emplace_back();
    l.hosts.back().push_back(r);
  }
  l.setting.requested = s.algorithm;
  l.setting.hosts = static_cast<int>(l.hosts.size());
  l.setting.shared_memory = s.allreduce_shm && per_host > 1;
  // Rank 0's host (the first is the largest); a core per process unless host_cores are shared.
  l.setting.oversubscribed =
      s.host_cores > 0 && Oversubscribed(l.hosts.front().size(), static_cast<unsigned>(s.host_cores));
  return l;
}

AllReduceAlgo SimulatedAllReduceAlgo(const RunPlan& plan, const SimSettings& s, size_t bytes) {
  return ResolveAllReduceAlgo(SimulatedAllReduceLayout(plan, s).setting, bytes, std::max(1, plan.workers));
}

std::string DescribeSim(const RunPlan& plan, const SimSettings& s) {
  std::ostringstream o;
  o.precision(4);
  o << "compute " << s.compute_ms << " ms/step (" << s.compute_source << "), links " << s.link << ", latency "
    << s.latency_us << " us";
  if (s.rack_size > 0) o << ", racks of " << s.rack_size << " (uplink oversubscribed " << s.oversubscription << ":1)";
  if (s.host_cores > 0) {
    o << ", all processes on " << s.host_cores << " cores (";
    if (s.usable_cores > 0) o << s.usable_cores << " of them usable, ";
    o << s.net_ns_per_byte << " ns of CPU per byte moved";
    if (plan.mode != config::ALLREDUCE && s.msg_us > 0)
      o << ", " << s.msg_us << " us per PS message, shared by those that wait for the same wake-up";
    if (plan.mode == config::ALLREDUCE && s.ring_msg_us > 0)
      o << ", " << s.ring_msg_us << " us per all-reduce message, each its own send and wake-up";
    o << ")";
  }
  if (plan.mode == config::ALLREDUCE) {
    const auto layout = SimulatedAllReduceLayout(plan, s);
    o << ", all-reduce " << AllReduceAlgoName(s.algorithm) << " on " << layout.hosts.size() << " host"
      << (layout.hosts.size() == 1 ? "" : "s") << (layout.setting.shared_memory ? " (shared memory)" : "")
      << (layout.setting.oversubscribed ? " (oversubscribed)" : "");
  }
  if (s.flow_share_spread > 0) {
    o << ", a connection's share of its sender's link x (1 ± " << s.flow_share_spread << "), drawn per connection";
    if (s.share_draws > 1) o << " (" << s.share_draws << " draws, the median by step time reported)";
  }
  if (plan.run.has_link() && !plan.run.link().congestion_control().empty())
    o << ", TCP's congestion control (" << plan.run.link().congestion_control() << ") not modelled"
      << (s.flow_share_spread > 0 ? "" : ": flows share a link evenly");
  if (plan.run.train().sync_every() > 0) {
    o << ", rounds of " << plan.run.train().sync_every() << " steps (a worker's own update " << s.inner_optimizer_us
      << " us, its optimizer timed here)";
  }
  o << ", " << s.steps << " steps";
  if (!s.codec_source.empty()) o << ", codec encode"
                                 << (s.gather_decode_us_per_float >= 0 ? " and gather decode" : "") << " times from "
                                 << s.codec_source;
  if (!s.accuracy_source.empty()) o << ", accuracy vs step from " << s.accuracy_source;
  return o.str();
}

}  // namespace gradsync
