// The simulation of a run (SimulateDraw, one draw of the connections' shares) and of its draws
// (SimulateRun): the job built and run, its files written.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "common/base/numeric/rng.h"
#include "common/base/status.h"
#include "common/config/train_config.h"
#include "common/obs/metrics.h"
#include "common/obs/process_summary.h"
#include "experiments/sim/allreduce_job.h"
#include "experiments/sim/codec_costs.h"
#include "experiments/sim/job.h"
#include "experiments/sim/ps_job.h"
#include "experiments/sim/sim.h"
#include "experiments/spec/report.h"
#include "experiments/spec/spec.h"

namespace gradsync {
namespace {

namespace fs = std::filesystem;
using sim::AllreduceJob;
using sim::Codecs;
using sim::Job;
using sim::PsJob;

// One simulation of the run with this draw of the shares; `step_ms` gets its step time as the
// report counts it (the median over the workers of report.h's StepMs), NaN without one.
Result<SimStats> SimulateDraw(const RunPlan& plan, const SimSettings& s, const std::string& run_dir,
                              uint64_t share_seed, const std::string& note, double* step_ms) {
  const auto started = std::chrono::steady_clock::now();
  std::error_code ec;
  fs::create_directories(run_dir, ec);
  if (ec) return UnavailableError(run_dir + ": cannot create: " + ec.message());
  const bool ps = plan.mode != config::ALLREDUCE;
  if (ps && plan.servers < 1) return InvalidArgumentError("a PS run needs servers");
  const int hosts = (ps ? plan.servers : 0) + plan.workers;
  Job job(plan, s, hosts, share_seed);
  for (int w = 0; w < plan.workers; ++w) {
    ASSIGN_OR_RETURN(MetricsWriter m,
                     MetricsWriter::Open(run_dir + "/worker-" + std::to_string(w) + ".csv", plan.name, w));
    job.rec[static_cast<size_t>(w)].metrics = std::make_unique<MetricsWriter>(std::move(m));
  }
  const auto& t = plan.run.train();
  Codecs codecs(t.compress(), t.error_feedback(), t.momentum_correction() ? t.momentum() : 0.0f, s.encode_us_per_float,
                s.pull_encode_us_per_float, s.gather_decode_us_per_float);
  std::unique_ptr<PsJob> ps_job;
  std::unique_ptr<AllreduceJob> ar_job;
  if (ps) {
    ps_job = std::make_unique<PsJob>(job, codecs);
    RETURN_IF_ERROR(ps_job->Build());
    ps_job->Start();
  } else {
    ar_job = std::make_unique<AllreduceJob>(job, codecs);
    RETURN_IF_ERROR(ar_job->Build());
    ar_job->Start();
  }
  job.engine.Run();
  for (auto& r : job.rec) RETURN_IF_ERROR(r.metrics->Flush());
  if (ps_job) RETURN_IF_ERROR(ps_job->WriteSummaries(run_dir));
  for (int w = 0; w < plan.workers; ++w) {
    summary::ProcessSummary ws;
    ws.set_role("worker");
    ws.set_rank(w);
    ws.set_mode(ModeName(plan.mode));
    ws.set_ok(true);
    ws.set_wall_s(job.engine.now() / 1e6);
    ws.set_params(s.params);
    ws.set_steps(s.steps);
    ws.set_bytes_sent(static_cast<int64_t>(job.rec[static_cast<size_t>(w)].sent));
    ws.set_bytes_received(static_cast<int64_t>(job.rec[static_cast<size_t>(w)].received));
    RETURN_IF_ERROR(WriteProcessSummary(run_dir, ws));
  }
  std::ofstream(run_dir + "/commands.txt") << "# simulated by gradsync-sim: " << DescribeSim(plan, s) << note << "\n";
  SimStats st;
  st.codecs = codecs.Describe();
  st.events = job.engine.events();
  st.worker_steps = job.worker_steps;
  st.simulated_worker_steps = job.worker_steps;
  st.simulated_s = job.engine.now() / 1e6;
  for (int h = 0; h < hosts; ++h)
    (h < hosts - plan.workers ? st.server_cpu_s : st.worker_cpu_s) += job.cpus->busy_us(h) / 1e6;
  st.kernel_cpu_s = job.cpus->kernel_us() / 1e6;
  st.elapsed_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  std::vector<double> per_worker;
  for (const auto& r : job.rec) {
    if (const double ms = StepMs(r.rows); !std::isnan(ms)) per_worker.push_back(ms);
  }
  *step_ms = per_worker.empty() ? NAN : Median(std::move(per_worker));
  return st;
}

}  // namespace

Result<SimStats> SimulateRun(const RunPlan& plan, const SimSettings& s, const std::string& run_dir) {
  const uint64_t seed = plan.run.train().seed();
  double step_ms = NAN;
  const int draws = s.flow_share_spread > 0 ? s.share_draws : 1;
  if (draws == 1) return SimulateDraw(plan, s, run_dir, seed, "", &step_ms);
  // Draw d's shares: train.seed's for the first, as a single draw has them.
  auto seed_of = [seed](int d) { return d == 0 ? seed : Rng::Derive(seed, kShareStream, static_cast<uint64_t>(d)); };
  std::vector<double> ms(static_cast<size_t>(draws));
  double elapsed = 0;
  int64_t worker_steps = 0;
  for (int d = 0; d < draws; ++d) {
    ASSIGN_OR_RETURN(SimStats st, SimulateDraw(plan, s, run_dir, seed_of(d), "", &ms[static_cast<size_t>(d)]));
    elapsed += st.elapsed_s;
    worker_steps += st.simulated_worker_steps;
  }
  // The median draw (the lower of the middle two for an even count; a draw without a step time
  // sorts last) is simulated again to write its files.
  std::vector<int> order(static_cast<size_t>(draws));
  for (int d = 0; d < draws; ++d) order[static_cast<size_t>(d)] = d;
  auto key = [&ms](int d) { return std::isnan(ms[static_cast<size_t>(d)]) ? INFINITY : ms[static_cast<size_t>(d)]; };
  std::stable_sort(order.begin(), order.end(), [&key](int a, int b) { return key(a) < key(b); });
  const int median = order[static_cast<size_t>((draws - 1) / 2)];
  std::ostringstream described;
  described << "shares drawn " << draws << " times, step ms";
  for (int d = 0; d < draws; ++d)
    described << (d ? ", " : " ")
              << (std::isnan(ms[static_cast<size_t>(d)]) ? std::string("-") : Fixed(ms[static_cast<size_t>(d)], 2));
  described << "; draw " << median + 1 << " (the median) reported";
  ASSIGN_OR_RETURN(SimStats st, SimulateDraw(plan, s, run_dir, seed_of(median), "; " + described.str(), &step_ms));
  st.draws = described.str();
  st.draw_step_ms = ms;
  st.reported_draw = median;
  st.elapsed_s += elapsed;
  st.simulated_worker_steps += worker_steps;
  return st;
}

}  // namespace gradsync
