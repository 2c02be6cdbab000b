// gradsync-sim: a discrete-event simulation of a spec's runs at any worker and server count.
//
//   ASSIGN_OR_RETURN(SimSettings s, ResolveSim(plan));          // the run's `sim { }` and its defaults
//   ASSIGN_OR_RETURN(SimStats st, SimulateRun(plan, s, dir));   // writes the files a real run writes
//
// What is simulated (docs/simulator.md says it whole):
// - hosts: one per process (scheduler left out), each with a full-duplex link of the run's rate to
//   a switch (flat), or to its rack's switch whose uplink carries rack_size x rate / oversubscription;
//   a message crosses the sender's link, the racks' uplinks when it leaves its rack, and the
//   receiver's link, in chunks of nic_quantum_kb (16 KiB; a link serves its chunks first come, first served; a
//   sender's NIC takes turns between its messages, each connection's turn its own size with
//   flow_share_spread, the run simulated share_draws times and the median draw reported), each
//   link moving `wire_efficiency` of its rate
//   as payload, plus `latency_us` per message;
// - CPUs: a core per process, or `host_cores` shared by every process (a job on one machine);
// - PS workers: pull (every shard, or per tensor with overlap), forward, backward (pushing each
//   tensor as backward produces it with overlap), the straggler's delay (common/config/straggler.h, the
//   same draws as the worker's), encode, push, the next pull; worker 0 sends INIT and pulls once
//   more for its final evaluation;
// - shards: the consistency rule is common/ps/consistency.h's ConsistencyController, the code the
//   servers run: it decides when a push is applied and a pull answered; apply costs
//   apply_ns_per_byte; compressed pushes cost the codec's decode, compressed pulls its encode;
// - all-reduce: rank 0's broadcast, then buckets (readiness order with overlap) reduced one after
//   another by ring, recursive halving-doubling (rhd, folded when n is not a power of two) or
//   hierarchical (reduce-scatter in a group, all-reduce across groups, all-gather in the group);
//   gather codecs (top-k, ...) all-gather every rank's payload; PowerSGD's factors in two
//   all-reduces after backward, its passes timed on the real PowerSgd for the model's shapes;
// - message sizes: the PS headers are the real protocol's (common/ps/ps_protocol.h's encoders), the
//   payloads the real codecs' (compression/), the ring's step header its 32 bytes; codec times are
//   measured here, on this machine, by encoding and decoding buffers of each size.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "allreduce/plan/algorithm.h"
#include "common/base/status.h"
#include "experiments/spec/spec.h"

namespace gradsync {

struct AccuracyPoint {
  int64_t step = 0;
  double accuracy = 0;  // fraction
};

struct SimSettings {
  double compute_ms = 0;
  std::string compute_source;     // "given", or the metrics file it came from
  double forward_fraction = 0.33;
  std::string link;               // the rate's name ("100mbit"; "loopback" = loopback_rate)
  double link_bits_per_s = 0;
  double burst_bytes = 0;         // an emulated link's tbf bucket (0: none)
  double peak_bits_per_s = 0;     // what a host moves with the bucket full (loopback_rate)
  double latency_us = 30;
  int rack_size = 0;
  double oversubscription = 1;
  int host_cores = 0;
  double usable_cores = 0;        // of host_cores, when every core is wanted (0: all)
  double net_ns_per_byte = 0;     // CPU per byte moved, both ends together, on the shared cores
  double msg_us = 0;              // CPU per PS message, both ends together, on the shared cores; the messages
                                  // waiting for one wake-up of a host's I/O thread share its half
  double ring_msg_us = 0;         // CPU per all-reduce message, both ends together, on the shared cores; each
                                  // message pays its own (the rank's thread sends it and wakes for it)
  double apply_ns_per_byte = 0.25;
  double wire_efficiency = 1448.0 / 1514.0;
  double quantum_bytes = 16384;   // a sender's connections take turns on its link, this much each
  double flow_share_spread = 0;   // ... each connection's turn x (1 ± this), drawn once per connection (TCP's uneven shares)
  int share_draws = 1;            // ... simulated this many times, the median draw by step time reported
  int64_t steps = 0;              // per worker
  int64_t steps_per_epoch = 0;
  int hier_group = 8;              // hier: the ranks of each simulated host
  AllReduceAlgo algorithm = AllReduceAlgo::kAuto;  // --allreduce-algo (auto: chosen per bucket as the real one)
  bool allreduce_shm = true;      // --allreduce-shm, and no --ring-encrypt
  std::vector<int64_t> tensors;   // floats, forward order
  std::vector<std::vector<int64_t>> shapes;  // ... their shapes, where known (sim.tensor_shapes, train's model)
  int64_t params = 0;             // their sum
  // From codec_from: encode time per float of a push (worker) and of a compressed pull (shard),
  // and an all-reduce worker's decode and sum of an all-gathered bucket per payload and float,
  // medians of a real run's spans; < 0: timed here.
  double encode_us_per_float = -1, pull_encode_us_per_float = -1, gather_decode_us_per_float = -1;
  std::string codec_source;
  // Local SGD / DiLoCo: a worker's update of its own model, in microseconds (its optimizer's
  // step over the model, timed here: InnerOptimizerUs).
  double inner_optimizer_us = 0;
  std::vector<AccuracyPoint> accuracy;  // measured accuracy vs step (empty: none)
  std::string accuracy_source;
};

// The run's settings for the simulation: its sim { } (merged with the defaults'), its train and
// link. compute_from and accuracy_from files are read here (paths relative to the current
// directory); an unreadable or empty one is an error naming it.
Result<SimSettings> ResolveSim(const RunPlan& plan);

// One line saying what the simulation assumed (for summary.md and the table).
std::string DescribeSim(const RunPlan& plan, const SimSettings& s);

struct SimStats {
  int64_t events = 0;
  int64_t worker_steps = 0;
  double simulated_s = 0;   // the simulated job's length
  double elapsed_s = 0;     // how long the simulation took
  std::string codecs;       // the codec costs measured for it ("" without compression)
  std::string draws;        // with share_draws > 1: each draw's step time and the one reported
  std::vector<double> draw_step_ms;  // ... each draw's step time (NaN: none), and which was reported
  int reported_draw = 0;
  int64_t simulated_worker_steps = 0;  // over every draw (for the simulator's speed)
  // The CPU time the run modelled: the workers' and the servers' own threads, and the kernel's
  // copies (net_ns_per_byte, with host_cores only).
  double worker_cpu_s = 0, server_cpu_s = 0, kernel_cpu_s = 0;
};

// Simulates the run and writes what its processes would: run_dir/worker-<r>.csv (the metrics
// rows; evaluation rows carry the accuracy of `accuracy` at their step), worker-<r>.json and
// server-<k>.json (histograms from the consistency rule), commands.txt (saying it was simulated).
// With share_draws > 1 (and flow_share_spread), it simulates each draw of the shares and writes the
// median draw's files; the stats are that draw's, but for elapsed_s and simulated_worker_steps.
// The hosts a simulated all-reduce job puts its ranks on, as the real job's addresses would group
// them: with no link at all (loopback) every rank on one host; with hier, hosts of hier_group
// ranks (the layout hier needs); else a host per rank (network namespaces, or a cluster). And
// what the real collective's auto sees there: the hosts, shared memory (allreduce_shm, on a
// host of several ranks), oversubscription (a host's ranks against host_cores, when shared).
struct SimAllReduceLayout {
  AllReduceSetting setting;
  std::vector<std::vector<int>> hosts;  // each host's ranks, in rank order
};
SimAllReduceLayout SimulatedAllReduceLayout(const RunPlan& plan, const SimSettings& s);
// The algorithm the simulated run (and the real one) runs for an all-reduce of `bytes`.
AllReduceAlgo SimulatedAllReduceAlgo(const RunPlan& plan, const SimSettings& s, size_t bytes);

Result<SimStats> SimulateRun(const RunPlan& plan, const SimSettings& s, const std::string& run_dir);

}  // namespace gradsync
