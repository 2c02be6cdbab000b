// What every simulated job shares: the engine, the CPUs and the network, what each worker
// records (its metrics rows), and the stragglers' draws.
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "common/base/status.h"
#include "common/config/straggler.h"
#include "common/config/sync_decisions.h"
#include "common/obs/metrics.h"
#include "experiments/sim/engine/cpus.h"
#include "experiments/sim/engine/engine.h"
#include "experiments/sim/engine/network.h"
#include "experiments/sim/sim.h"
#include "experiments/spec/spec.h"

namespace gradsync::sim {

struct WorkerRecord {
  uint64_t sent = 0, received = 0;
  uint64_t shm_sent = 0, shm_received = 0;  // through shared memory, counted as the wire would
  double compute_ms = 0, comm_ms = 0, wait_ms = 0, delay_ms = 0, hidden_ms = 0;
  double version_lag = NAN, clock_staleness = NAN;
  std::unique_ptr<MetricsWriter> metrics;
  std::vector<std::pair<int64_t, double>> rows;  // training rows written: step, wall_s
};

struct Job {
  const RunPlan& plan;
  const SimSettings& s;
  Engine engine;
  std::unique_ptr<Cpus> cpus;
  std::unique_ptr<Network> net;
  std::vector<WorkerRecord> rec;
  std::vector<Straggler> stragglers;
  int64_t worker_steps = 0;

  // `share_seed`: the draw of the connections' shares of a link (flow_share_spread).
  Job(const RunPlan& p, const SimSettings& settings, int hosts, uint64_t share_seed);
  double epoch_of(int64_t step) const { return static_cast<double>(step) / static_cast<double>(s.steps_per_epoch); }

  // A training row of worker w after `step` steps (every log_every steps).
  Status Row(int w, int64_t step);
  // An evaluation row of worker 0 after `step` steps: the measured curve's accuracy there. Without
  // a curve its accuracy is empty (the report reads it as a training row of the same step: its
  // bytes, the evaluation's pull included, count, its time does not).
  Status EvalRow(int64_t step);
  bool EvalDue(int64_t step) const;
  // What the real worker's overlap decisions read (common/config/sync_decisions.h), of this run:
  // --overlap or its default on the hosts the real job would make (OverlapOf), the model (the
  // dense CPU models' forward waits for each layer), the device, rounds, workers and ZeRO; no
  // straggler (the PS job sets it per worker).
  OverlapFacts OverlapFactsOf(bool compressed) const;
};

}  // namespace gradsync::sim
