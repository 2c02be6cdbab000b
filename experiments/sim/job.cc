#include "experiments/sim/job.h"

#include "common/config/train_config.h"
#include "experiments/sim/inputs.h"

namespace gradsync::sim {

Job::Job(const RunPlan& p, const SimSettings& settings, int hosts, uint64_t share_seed) : plan(p), s(settings) {
  // usable_cores is what a message-driven job gets of the cores: its threads sleep for their
  // messages and start late once woken. The ring's ranks poll for their peers' messages first
  // (CollectiveOptions::mesh_wait, 1 ms) instead of sleeping: with no more ranks than cores, each
  // keeps its core and the job has all of them.
  const bool spinning = p.mode == config::ALLREDUCE && s.host_cores > 0 && p.workers <= s.host_cores;
  cpus = std::make_unique<Cpus>(engine, hosts, s.host_cores, spinning ? s.host_cores : s.usable_cores);
  const MessageCpu msg = p.mode != config::ALLREDUCE ? MessageCpu{s.msg_us, MessageCpu::Wakeups::kShared}
                                                     : MessageCpu{s.ring_msg_us, MessageCpu::Wakeups::kEach};
  net = std::make_unique<Network>(engine, *cpus, hosts, s, msg, share_seed);
  rec.resize(static_cast<size_t>(p.workers));
  stragglers.resize(static_cast<size_t>(p.workers));
  for (const auto& [w, st] : p.stragglers) {
    auto spec = ParseStraggler(st.spec);
    if (spec.ok()) stragglers[static_cast<size_t>(w)] = Straggler(*spec, st.seed);
  }
}

Status Job::Row(int w, int64_t step) {
  auto& r = rec[static_cast<size_t>(w)];
  const int64_t every = plan.run.train().log_every();
  if (every <= 0 || step % every != 0) return OkStatus();
  MetricsRow row;
  row.step = step;
  row.epoch = epoch_of(step);
  row.wall_s = engine.now() / 1e6;
  row.loss = NAN;
  row.traffic.bytes_sent = r.sent;
  row.traffic.bytes_received = r.received;
  row.traffic.shm_bytes_sent = r.shm_sent;
  row.traffic.shm_bytes_received = r.shm_received;
  row.times.compute_ms = r.compute_ms;
  row.times.comm_ms = r.comm_ms;
  row.times.wait_ms = r.wait_ms;
  row.times.delay_ms = r.delay_ms;
  row.times.hidden_ms = r.hidden_ms;
  row.staleness.version_lag = r.version_lag;
  row.staleness.clock_staleness = r.clock_staleness;
  r.rows.emplace_back(step, row.wall_s);
  return r.metrics->Write(row);
}

Status Job::EvalRow(int64_t step) {
  auto& r = rec[0];
  MetricsRow row;
  row.step = step;
  row.epoch = epoch_of(step);
  row.wall_s = engine.now() / 1e6;
  row.traffic.bytes_sent = r.sent;
  row.traffic.bytes_received = r.received;
  row.traffic.shm_bytes_sent = r.shm_sent;
  row.traffic.shm_bytes_received = r.shm_received;
  row.test.accuracy = s.accuracy.empty() ? NAN : AccuracyAt(s.accuracy, step);
  row.test.loss = NAN;
  return r.metrics->Write(row);
}

OverlapFacts Job::OverlapFactsOf(bool compressed) const {
  const auto& t = plan.run.train();
  return {.requested = OverlapOf(t, SimulatedAllReduceLayout(plan, s).setting.oversubscribed),
          .compressed = compressed,
          .sparse = t.model() == "sparse_logreg",
          .on_device = t.device() != "cpu",
          .per_tensor_params = t.model() == "mlp" || t.model() == "softmax",
          .straggles = false,
          .rounds = t.sync_every() > 0,
          .workers = plan.workers,
          .zero = t.zero()};
}

bool Job::EvalDue(int64_t step) const {
  if (step <= 0 || step >= s.steps) return false;
  if (step % s.steps_per_epoch == 0) return true;
  const int64_t every = plan.run.train().eval_every();
  return every > 0 && step % every == 0;
}

}  // namespace gradsync::sim
