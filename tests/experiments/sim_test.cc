// gradsync-sim's simulation (experiments/sim/sim.h) against what its model says must happen: the
// protocol's bytes, a bsp step on a known link, the CPU it models and a PS message's, the ssp
// bound and its waits, the workers' own straggler draws, the all-reduce algorithms, racks, codec
// payloads, the accuracy join, bad settings, and the same output for the same spec.
#include "experiments/sim/sim.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <set>
#include <sstream>

#include "common/base/numeric/tensor.h"
#include "common/config/straggler.h"
#include "common/obs/metrics.h"
#include "compression/compressor.h"
#include "compression/powersgd.h"
#include "experiments/spec/report.h"
#include "tests/support/temp_dir.h"

namespace gradsync {
namespace {

using ::gradsync::testing::TempDir;

constexpr int64_t kMlpParams = 235146;  // 784-256-128-10

struct Simulated {
  RunReport report;
  SimStats stats;
  std::string dir;
};

Result<RunPlan> Plan(const std::string& run) {
  ASSIGN_OR_RETURN(Experiment e, ParseExperiment("name: \"t\"\n" + run, "t.textproto"));
  return e.runs.at(0);
}

Simulated Simulate(const TempDir& tmp, const std::string& run, const std::string& name = "r") {
  auto plan = Plan(run);
  EXPECT_TRUE(plan.ok()) << plan.status().message();
  auto settings = ResolveSim(*plan);
  EXPECT_TRUE(settings.ok()) << settings.status().message();
  Simulated s;
  s.dir = tmp.File(name);
  auto stats = SimulateRun(*plan, *settings, s.dir);
  EXPECT_TRUE(stats.ok()) << stats.status().message();
  s.stats = *stats;
  auto report = SummarizeRun(*plan, s.dir, 0.85, OkStatus());
  EXPECT_TRUE(report.ok()) << report.status().message();
  s.report = *report;
  return s;
}

// Simulate() of `run` with its placeholder `key` replaced by `value`.
Simulated SimulateWith(const TempDir& tmp, std::string run, const std::string& key, const std::string& value, const std::string& name) {
  run.replace(run.find(key), key.size(), value);
  return Simulate(tmp, run, name);
}

// Every worker's delay_ms column, by worker.
std::map<int, std::vector<double>> Delays(const std::string& dir, int workers) {
  std::map<int, std::vector<double>> out;
  for (int w = 0; w < workers; ++w) {
    std::ifstream f(dir + "/worker-" + std::to_string(w) + ".csv");
    std::string line;
    std::getline(f, line);
    while (std::getline(f, line)) {
      auto v = SplitCsv(line);
      if (v[kColTestAccuracy].empty()) out[w].push_back(std::stod(v[kColDelay]));
    }
  }
  return out;
}

TEST(SimTest, DenseBytesPerStepAreTheModelEachWayPlusTheProtocolsOwn) {
  TempDir tmp;
  // 4 workers, 2 servers, 20 steps: per worker and step a push and a pull of the model, and once
  // per run worker 0's INIT and final evaluation pull (the model each), and the headers.
  auto s = Simulate(tmp, R"(run { name: "bsp" workers: 4 servers: 2 train { mode: BSP batch: 32 max_steps: 20 log_every: 1 }
                             sim { compute_ms: 1 } })");
  const double formula = 2.0 * 4 * kMlpParams;
  ASSERT_TRUE(s.report.summary.has_bytes_per_step());
  const double once = 2.0 * 4 * kMlpParams / (4 * 20);
  EXPECT_GT(s.report.summary.bytes_per_step(), formula + once);
  EXPECT_LT(s.report.summary.bytes_per_step(), formula + once + 1000);  // headers: some hundred bytes a step
  EXPECT_EQ(s.report.summary.steps(), 20);
  EXPECT_EQ(s.report.summary.params(), kMlpParams);
  // The ring: 2(n-1)/n of the model each way, and rank 0's broadcast down the ring once.
  auto ar = Simulate(tmp, R"(run { name: "ar" workers: 4 train { mode: ALLREDUCE batch: 32 max_steps: 20 log_every: 1 }
                              sim { compute_ms: 1 } })", "ar");
  const double ring = 2 * 2 * 3.0 / 4 * 4 * kMlpParams;
  const double broadcast = 2.0 * 3 * 4 * kMlpParams / (4 * 20);  // 3 hops, sent and received
  EXPECT_NEAR(ar.report.summary.bytes_per_step(), ring + broadcast, 0.002 * ring);
}

// Local SGD / DiLoCo: an exchange every H steps (and at the run's end), the mode's own bytes
// each time; the summary's formula divides likewise. 20 steps of rounds of 6: 4 exchanges. The
// worker's own update is given (inner_optimizer_us), not timed here, so that a slow build (the
// sanitizers') does not change what is asserted.
TEST(SimTest, RoundsOfLocalStepsExchangeOnceARound) {
  TempDir tmp;
  for (const std::string mode : {"BSP", "ASP", "ALLREDUCE"}) {
    SCOPED_TRACE(mode);
    const std::string servers = mode == "ALLREDUCE" ? "" : " servers: 2";
    auto every = Simulate(tmp, "run { name: \"e\" workers: 4" + servers + " train { mode: " + mode +
                                   " batch: 32 max_steps: 20 log_every: 1 } sim { compute_ms: 1 } }", "e" + mode);
    auto rounds = Simulate(tmp, "run { name: \"r\" workers: 4" + servers + " train { mode: " + mode +
                                    " batch: 32 max_steps: 20 log_every: 1 sync_every: 6 } sim { compute_ms: 1 inner_optimizer_us: 50 } }",
                           "r" + mode);
    ASSERT_TRUE(rounds.report.summary.has_bytes_per_step());
    EXPECT_EQ(rounds.report.summary.steps(), 20);
    EXPECT_EQ(rounds.report.summary.sync_every(), 6);
    // The run's own INIT or broadcast and the final evaluation pull come once either way.
    const double once = mode == "ALLREDUCE" ? 2.0 * 3 * 4 * kMlpParams / (4 * 20) : 2.0 * 4 * kMlpParams / (4 * 20);
    const double per_exchange = every.report.summary.bytes_per_step() - once;
    EXPECT_NEAR(rounds.report.summary.bytes_per_step() - once, per_exchange * 4 / 20, 0.002 * per_exchange);
    EXPECT_NEAR(rounds.report.summary.formula_bytes_per_step(), every.report.summary.formula_bytes_per_step() * 4 / 20,
                1);
    // Steps without an exchange are the compute and the worker's own update: faster.
    EXPECT_LT(rounds.report.summary.step_ms(), every.report.summary.step_ms());
  }
}

// --overlap unset: off where the job's host runs more workers than host_cores, on otherwise, as
// OverlapOf decides in the real job (loopback: every worker on one host).
TEST(SimTest, OverlapIsOffByDefaultWhereTheHostRunsMoreWorkersThanCores) {
  TempDir tmp;
  for (const std::string mode : {"BSP", "ALLREDUCE"}) {
    for (int cores : {2, 4}) {
      SCOPED_TRACE(mode + " on " + std::to_string(cores) + " cores");
      const std::string run = "run { name: \"o\" workers: 4" + std::string(mode == "BSP" ? " servers: 2" : "") +
                              " train { mode: " + mode + " batch: 32 max_steps: 20 log_every: 1 OVERLAP" +
                              // small buckets over TCP, so that overlap has something to hide
                              std::string(mode == "ALLREDUCE" ? " first_bucket_mib: 0.05 bucket_mib: 0.05 allreduce_shm: false" : "") +
                              " } sim { compute_ms: 2 "
                              "host_cores: " + std::to_string(cores) + " } }";
      const std::string tag = mode + std::to_string(cores);
      auto unset = SimulateWith(tmp, run, "OVERLAP", "", "unset" + tag);
      auto on = SimulateWith(tmp, run, "OVERLAP", "overlap: true", "on" + tag);
      auto off = SimulateWith(tmp, run, "OVERLAP", "overlap: false", "off" + tag);
      ASSERT_NE(on.report.summary.step_ms(), off.report.summary.step_ms());  // the setting shows
      EXPECT_EQ(unset.report.summary.step_ms(), (cores < 4 ? off : on).report.summary.step_ms());
    }
  }
}

TEST(SimTest, ABspStepOnAKnownLinkIsTheServersLinkTwice) {
  TempDir tmp;
  // One server: every push crosses its link in, every pull out, one after the other (bsp).
  // 4 workers x 940,584 bytes at 1 Gbit/s x 1448/1514: 31.5 ms; no compute, no latency.
  auto s = Simulate(tmp, R"(run { name: "bsp" workers: 4 servers: 1 train { mode: BSP batch: 32 max_steps: 30 log_every: 1 }
                             sim { compute_ms: 0 latency_us: 0 link_rate: "1gbit" apply_ns_per_byte: 0 } })");
  const double expect_ms = 2 * 4 * 4.0 * kMlpParams / (1e9 / 8 * 1448 / 1514) * 1e3;
  ASSERT_TRUE(s.report.summary.has_step_ms());
  EXPECT_NEAR(s.report.summary.step_ms(), expect_ms, 0.03 * expect_ms);
  // asp: nobody waits for a round, so pushes and pulls of different workers share the two
  // directions of the link: faster.
  auto a = Simulate(tmp, R"(run { name: "asp" workers: 4 servers: 1 train { mode: ASP batch: 32 max_steps: 30 log_every: 1 }
                             sim { compute_ms: 0 latency_us: 0 link_rate: "1gbit" apply_ns_per_byte: 0 } })", "asp");
  EXPECT_LT(a.report.summary.step_ms(), 0.8 * s.report.summary.step_ms());
}

TEST(SimTest, TheCpuItModelsIsTheComputeTheApplyAndTheKernelsCopies) {
  TempDir tmp;
  // Dense bsp on a shared machine: the workers' CPU is their compute alone, the servers' the sum
  // of every push and each round's apply, the kernel's 1.5 ns per byte moved (both ends together).
  auto s = Simulate(tmp, R"(run { name: "bsp" workers: 4 servers: 2 train { mode: BSP batch: 32 max_steps: 20 log_every: 1 }
                             sim { compute_ms: 2 host_cores: 2 net_ns_per_byte: 1.5 apply_ns_per_byte: 0.25 } })");
  EXPECT_NEAR(s.stats.worker_cpu_s, 4 * 20 * 2e-3, 1e-9);
  const double applies = 0.25e-9 * 4 * kMlpParams * (4 * 20 + 20);
  EXPECT_GE(s.stats.server_cpu_s, applies);
  EXPECT_LT(s.stats.server_cpu_s, 1.02 * applies);  // and worker 0's INIT
  const double moved = s.report.summary.bytes_per_step() * 4 * 20;  // every byte sent once, received once
  EXPECT_NEAR(s.stats.kernel_cpu_s, 1.5e-9 * moved, 0.01 * 1.5e-9 * moved);
  // Without shared cores the kernel's copies cost nothing.
  auto own = Simulate(tmp, R"(run { name: "bsp" workers: 4 servers: 2 train { mode: BSP batch: 32 max_steps: 20 log_every: 1 }
                               sim { compute_ms: 2 net_ns_per_byte: 1.5 } })", "own");
  EXPECT_EQ(own.stats.kernel_cpu_s, 0);
  EXPECT_NEAR(own.stats.worker_cpu_s, 4 * 20 * 2e-3, 1e-9);
}

TEST(SimTest, APsMessageCostsItsCpuAndTheRingsDoNot) {
  TempDir tmp;
  // One worker, one server, no overlap (a push and a pull of the whole model a step), no compute,
  // a fast link: a step's push, push reply, pull and pull reply cost msg_us on the shared cores,
  // half at each end, one wake-up of a host's I/O thread taking every message that waits for it;
  // the pull and its reply wait for theirs.
  const std::string ps = R"(run { name: "ps" workers: 1 servers: 1 train { mode: BSP overlap: false batch: 32 max_steps: 20 log_every: 1 }
                             sim { compute_ms: 0 latency_us: 0 link_rate: "100gbit" apply_ns_per_byte: 0 host_cores: 2 MSG } })";
  auto none = SimulateWith(tmp, ps, "MSG", "", "none");
  auto costly = SimulateWith(tmp, ps, "MSG", "msg_us: 100", "costly");
  EXPECT_EQ(none.stats.kernel_cpu_s, 0);
  // Each of the four alone would cost 4 x 100 us a step. The worker sends the push and the next
  // pull together, one wake-up for both, and the server's replies share some: less.
  EXPECT_GE(costly.stats.kernel_cpu_s, 2.5 * 20 * 100e-6);
  EXPECT_LT(costly.stats.kernel_cpu_s, 3.6 * 20 * 100e-6);
  // On the step's path: the push's two ends and the pull reply's two ends, 200 us.
  EXPECT_NEAR(costly.report.summary.step_ms(), none.report.summary.step_ms() + 0.2, 0.02);
  // The ring's messages are plain TCP, moved by its communication thread: no such cost.
  auto ring = Simulate(tmp, R"(run { name: "ring" workers: 2 train { mode: ALLREDUCE batch: 32 max_steps: 20 log_every: 1 }
                                sim { compute_ms: 1 host_cores: 2 msg_us: 100 } })", "ring");
  EXPECT_EQ(ring.stats.kernel_cpu_s, 0);
}

TEST(SimTest, ARingMessageCostsRingMsgUsAndAPsMessageDoesNot) {
  TempDir tmp;
  // 2 ranks, one tensor in one bucket, the ring all-reduce: each rank sends one chunk and receives
  // one per step of the reduce-scatter and of the all-gather, 2 x (2 - 1) = 2 a step each.
  const std::string ring = R"(run { name: "ring" workers: 2 train { mode: ALLREDUCE allreduce_algo: "ring" batch: 32 max_steps: 20 log_every: 1 }
                               sim { compute_ms: 1 latency_us: 0 link_rate: "100gbit" apply_ns_per_byte: 0 host_cores: 2 tensors: 4096 MSG } })";
  auto none = SimulateWith(tmp, ring, "MSG", "", "none");
  auto costly = SimulateWith(tmp, ring, "MSG", "ring_msg_us: 100", "costly");
  EXPECT_EQ(none.stats.kernel_cpu_s, 0);
  // 2 ranks x 2 messages x 100 us (half at each end) a step, every message its own send and its
  // own wake-up (the rank's thread, no I/O thread taking several at once), and the start's
  // broadcast of the parameters, rank 0 to rank 1, one message more.
  EXPECT_NEAR(costly.stats.kernel_cpu_s, (2 * 2 * 20 + 1) * 100e-6, 1e-9);
  EXPECT_GT(costly.report.summary.step_ms(), none.report.summary.step_ms());
  // A PS job's messages cost msg_us, not ring_msg_us.
  auto ps = Simulate(tmp, R"(run { name: "ps" workers: 1 servers: 1 train { mode: BSP batch: 32 max_steps: 20 log_every: 1 }
                              sim { compute_ms: 1 host_cores: 2 ring_msg_us: 100 } })", "ps");
  EXPECT_EQ(ps.stats.kernel_cpu_s, 0);
}

TEST(SimTest, WorkOnSharedCoresSharesThem) {
  TempDir tmp;
  // 4 ranks computing 2 ms a step on 2 shared cores, on a link that costs next to nothing: each
  // step takes 4 ms (every rank at half speed), and 5 ms when the work gets 1.6 of the 2 cores.
  const std::string ring = R"(run { name: "ring" workers: 4 train { mode: ALLREDUCE batch: 32 max_steps: 20 log_every: 1 }
                               sim { compute_ms: 2 latency_us: 0 link_rate: "1000gbit" apply_ns_per_byte: 0 host_cores: 2 USABLE } })";
  auto all = SimulateWith(tmp, ring, "USABLE", "", "all");
  auto part = SimulateWith(tmp, ring, "USABLE", "usable_cores: 1.6", "part");
  EXPECT_NEAR(all.report.summary.step_ms(), 4, 0.1);
  EXPECT_NEAR(part.report.summary.step_ms(), 5, 0.12);
  EXPECT_NEAR(all.stats.worker_cpu_s, part.stats.worker_cpu_s, 1e-9);  // the same work, slower
}

TEST(SimTest, RingRanksNoMoreThanTheCoresKeepThem) {
  TempDir tmp;
  // usable_cores is for work whose threads sleep for their messages. The ring's ranks poll for
  // their peers instead: 2 ranks on 2 cores each keep a core (a 2 ms step takes 2 ms, not 2.5);
  // 4 ranks share them, 1.6 usable; a PS job's processes sleep in ZeroMQ whatever their number.
  const std::string ring = R"(run { name: "ring" workers: N train { mode: ALLREDUCE batch: 32 max_steps: 20 log_every: 1 }
                               sim { compute_ms: 2 latency_us: 0 link_rate: "1000gbit" apply_ns_per_byte: 0 host_cores: 2 usable_cores: 1.6 } })";
  EXPECT_NEAR(SimulateWith(tmp, ring, "N", "2", "two").report.summary.step_ms(), 2, 0.05);
  EXPECT_NEAR(SimulateWith(tmp, ring, "N", "4", "four").report.summary.step_ms(), 5, 0.12);
  auto ps = Simulate(tmp, R"(run { name: "ps" workers: 2 servers: 1 train { mode: BSP batch: 32 max_steps: 20 log_every: 1 }
                              sim { compute_ms: 2 latency_us: 0 link_rate: "1000gbit" apply_ns_per_byte: 0 host_cores: 2 usable_cores: 1.6 } })", "ps");
  EXPECT_GT(ps.report.summary.step_ms(), 2.45);  // the two workers' computes share 1.6 cores: 2.5 ms
}

TEST(SimTest, SspKeepsItsBoundAndTheFastWorkersWaitForTheStraggler) {
  TempDir tmp;
  const std::string common = R"( workers: 4 servers: 2 straggler { worker: 1 fixed_ms: 40 }
      sim { compute_ms: 1 link_rate: "10gbit" } train { batch: 32 max_steps: 60 log_every: 1 )";
  auto ssp = Simulate(tmp, "run { name: \"ssp\"" + common + "mode: SSP staleness: 2 } }", "ssp");
  ASSERT_TRUE(ssp.report.summary.has_clock_staleness_max());
  EXPECT_LE(ssp.report.summary.clock_staleness_max(), 2);
  EXPECT_EQ(ssp.report.summary.clock_staleness_max(), 2);  // the fast ones run ahead as far as allowed
  // Every worker goes at the straggler's pace: about 41 ms a step.
  EXPECT_NEAR(ssp.report.summary.step_ms(), 41, 3);
  auto asp = Simulate(tmp, "run { name: \"asp\"" + common + "mode: ASP } }", "asp");
  // asp: the three fast workers (the median) never wait.
  EXPECT_LT(asp.report.summary.step_ms(), 10);
  EXPECT_GT(asp.report.summary.clock_staleness_max(), 2);
}

TEST(SimTest, StragglerDelaysAreTheWorkersOwnDraws) {
  TempDir tmp;
  auto s = Simulate(tmp, R"(run { name: "ssp" workers: 2 servers: 1 straggler { worker: 1 exp_mean_ms: 20 seed: 7 }
                             train { mode: SSP staleness: 3 batch: 32 max_steps: 25 log_every: 1 } sim { compute_ms: 2 } })");
  Straggler worker(*ParseStraggler("exp:20"), 7);
  const auto delays = Delays(s.dir, 2);
  ASSERT_EQ(delays.at(1).size(), 25u);
  for (double d : delays.at(1)) EXPECT_NEAR(d, worker.DelayMs(2), 1e-3);
  for (double d : delays.at(0)) EXPECT_EQ(d, 0);
}

// Every worker's bytes sent per step (its last row's count over its steps) and its last step.
struct Sent {
  double per_step = 0;
  int64_t last_step = 0;
};
std::map<int, Sent> SentPerStep(const std::string& dir, int workers) {
  std::map<int, Sent> out;
  for (int w = 0; w < workers; ++w) {
    std::ifstream f(dir + "/worker-" + std::to_string(w) + ".csv");
    std::string line, last;
    std::getline(f, line);
    while (std::getline(f, line)) {
      if (SplitCsv(line)[kColTestAccuracy].empty()) last = line;
    }
    const auto v = SplitCsv(last);
    out[w].last_step = std::stoll(v[kColStep]);
    out[w].per_step = std::stod(v[kColBytesSent]) / static_cast<double>(out[w].last_step);
  }
  return out;
}

TEST(SimTest, OnlyTheStragglerGivesUpOverlap) {
  TempDir tmp;
  // As PsTrainer decides per worker: the straggling worker pushes a part per shard after its
  // backward, the others a part per tensor and shard during it, each with its own header.
  // (Worker 0 also initializes the servers.)
  auto s = Simulate(tmp, R"(run { name: "ssp" workers: 4 servers: 2 straggler { worker: 1 fixed_ms: 5 }
                             train { mode: SSP staleness: 2 batch: 32 max_steps: 30 log_every: 1 } sim { compute_ms: 1 } })");
  const auto sent = SentPerStep(s.dir, 4);
  EXPECT_GT(sent.at(2).per_step, sent.at(1).per_step + 100);
  EXPECT_NEAR(sent.at(2).per_step, sent.at(3).per_step, 1);
}

TEST(SimTest, MessagesOnASharedMachineArriveInTheirConnectionsOrder) {
  TempDir tmp;
  // 8 workers and 2 servers on 2 shared cores, a straggler: the others push a tensor's small
  // part right behind the large one of the step before, and the kernel's copies would let the
  // small one be taken in first. The servers' rule refuses a push from the future, so a message
  // out of order would stall the run; every worker ends its 150 steps.
  auto s = Simulate(tmp, R"(run { name: "ssp" workers: 8 servers: 2 straggler { worker: 1 exp_mean_ms: 30 seed: 7 }
                             train { model: "mlp" dataset: "fashion-mnist" mode: SSP staleness: 3 batch: 32 max_steps: 150 log_every: 1 } link { rate: "1gbit" }
                             sim { compute_ms: 0.45 host_cores: 2 loopback_rate: "10gbit" net_ns_per_byte: 1 msg_us: 100 usable_cores: 1.8 } })");
  const auto sent = SentPerStep(s.dir, 8);
  for (const auto& [w, st] : sent) EXPECT_EQ(st.last_step, 150) << "worker " << w;
}

// Every worker's training rows (step, wall_s); a second row of a step (a simulated evaluation
// without accuracy) keeps the first's time, as the report does.
std::vector<std::vector<std::pair<int64_t, double>>> TrainingRows(const std::string& dir, int workers) {
  std::vector<std::vector<std::pair<int64_t, double>>> out(static_cast<size_t>(workers));
  for (int w = 0; w < workers; ++w) {
    std::ifstream f(dir + "/worker-" + std::to_string(w) + ".csv");
    std::string line;
    std::getline(f, line);
    auto& rows = out[static_cast<size_t>(w)];
    while (std::getline(f, line)) {
      const auto v = SplitCsv(line);
      const int64_t step = std::stoll(v[kColStep]);
      if (v[kColTestAccuracy].empty() && (rows.empty() || rows.back().first != step)) rows.emplace_back(step, std::stod(v[kColWall]));
    }
  }
  return out;
}

// Every worker's time per step, as the report counts it (report.h's StepMs).
std::vector<double> StepMsPerWorker(const std::string& dir, int workers) {
  std::vector<double> out;
  for (const auto& rows : TrainingRows(dir, workers)) out.push_back(StepMs(rows));
  return out;
}

// The job's steps a second while every worker is training: all workers' steps between the last
// worker's tenth step and the first worker's end, over that time.
double JobStepsPerS(const std::string& dir, int workers) {
  const auto all = TrainingRows(dir, workers);
  double from = 0, to = INFINITY;
  for (const auto& rows : all) {
    from = std::max(from, rows.at(10).second);
    to = std::min(to, rows.back().second);
  }
  double steps = 0;
  for (const auto& rows : all) {
    for (const auto& [step, wall] : rows) steps += wall > from && wall <= to;
  }
  return steps / (to - from);
}

// 8 asp workers, one server, no compute, 1 Gbit/s: the server's link is the bottleneck. SETTINGS:
// the sim { } settings under test.
const char kAspOnOneServer[] = R"(run { name: "asp" workers: 8 servers: 1 train { mode: ASP batch: 32 max_steps: 100 log_every: 1 }
                                 sim { compute_ms: 0 latency_us: 0 link_rate: "1gbit" apply_ns_per_byte: 0 SETTINGS } })";

TEST(SimTest, UnevenFlowSharesSpreadAspWorkersAndHoldSspToTheSlowest) {
  TempDir tmp;
  // Evenly shared, the server's pull answers leave together and every asp worker steps at the
  // same pace; with each connection's share drawn once (x (1 ± 0.6)), the workers whose answers
  // get more step faster.
  auto even = SimulateWith(tmp, kAspOnOneServer, "SETTINGS", "", "even");
  auto uneven = SimulateWith(tmp, kAspOnOneServer, "SETTINGS", "flow_share_spread: 0.6", "uneven");
  auto spread = [](const std::vector<double>& ms) { return *std::max_element(ms.begin(), ms.end()) / *std::min_element(ms.begin(), ms.end()); };
  const auto even_ms = StepMsPerWorker(even.dir, 8), uneven_ms = StepMsPerWorker(uneven.dir, 8);
  EXPECT_LT(spread(even_ms), 1.03);  // worker 0 also initializes the server
  EXPECT_GT(spread(uneven_ms), 1.1);
  EXPECT_NEAR(uneven.report.summary.bytes_per_step(), even.report.summary.bytes_per_step(), 1);
  // The job's steps a second never pass the link's: a push of the model in and a pull out per
  // step, the two directions at once.
  const double link_steps_per_s = 1e9 / 8 * 1448 / 1514 / (4.0 * kMlpParams);
  EXPECT_LE(JobStepsPerS(uneven.dir, 8), 1.01 * link_steps_per_s);
  EXPECT_LE(JobStepsPerS(even.dir, 8), 1.01 * link_steps_per_s);
  // ssp (s=1) holds every worker to the slowest: with the same shares the fast ones wait for it,
  // pushes and pulls no longer overlap, and every worker steps at a slower pace (evenly shared:
  // 63 ms, the link's; unevenly: 111 ms).
  const std::string ssp = R"(run { name: "ssp" workers: 8 servers: 1 train { mode: SSP staleness: 1 batch: 32 max_steps: 100 log_every: 1 }
                              sim { compute_ms: 0 latency_us: 0 link_rate: "1gbit" apply_ns_per_byte: 0 SPREAD } })";
  auto ssp_even = SimulateWith(tmp, ssp, "SPREAD", "", "ssp_even");
  auto ssp_uneven = SimulateWith(tmp, ssp, "SPREAD", "flow_share_spread: 0.6", "ssp_uneven");
  const auto ssp_uneven_ms = StepMsPerWorker(ssp_uneven.dir, 8);
  EXPECT_LT(spread(ssp_uneven_ms), 1.05);
  EXPECT_GT(ssp_uneven.report.summary.step_ms(), 1.3 * ssp_even.report.summary.step_ms());
}

TEST(SimTest, ShareDrawsReportTheRunOfTheMedianDraw) {
  TempDir tmp;
  auto one = SimulateWith(tmp, kAspOnOneServer, "SETTINGS", "flow_share_spread: 0.6", "one");
  auto five = SimulateWith(tmp, kAspOnOneServer, "SETTINGS", "flow_share_spread: 0.6 share_draws: 5", "five");
  const auto& ms = five.stats.draw_step_ms;
  ASSERT_EQ(ms.size(), 5u);
  // The first draw is the one a single simulation makes; the others are draws of their own.
  EXPECT_NEAR(ms[0], one.report.summary.step_ms(), 0.01 * ms[0]);
  EXPECT_GE(std::set<double>(ms.begin(), ms.end()).size(), 3u);
  // The files written are the median draw's: two draws at or below its step time, two at or above.
  const double reported = ms.at(static_cast<size_t>(five.stats.reported_draw));
  EXPECT_NEAR(five.report.summary.step_ms(), reported, 0.01 * reported);
  EXPECT_GE(std::count_if(ms.begin(), ms.end(), [&](double v) { return v <= reported; }), 3);
  EXPECT_GE(std::count_if(ms.begin(), ms.end(), [&](double v) { return v >= reported; }), 3);
  EXPECT_NEAR(five.report.summary.bytes_per_step(), one.report.summary.bytes_per_step(), 1);
  EXPECT_EQ(five.stats.simulated_worker_steps, 6 * five.stats.worker_steps);  // five draws and the median's again
  EXPECT_NE(five.report.summary.commands(0).find("the median"), std::string::npos) << five.report.summary.commands(0);
  // Shares that are even need no draws: one simulation.
  auto even = SimulateWith(tmp, kAspOnOneServer, "SETTINGS", "share_draws: 5", "even");
  EXPECT_TRUE(even.stats.draw_step_ms.empty());
  EXPECT_EQ(even.stats.simulated_worker_steps, even.stats.worker_steps);
}

TEST(SimTest, AllreduceAlgorithmsMoveTheRingsBytesAndRhdWinsWhenLatencyDominates) {
  TempDir tmp;
  auto run = [&](const std::string& algo, int workers, double latency_us) {
    return Simulate(tmp,
                    "run { name: \"" + algo + std::to_string(workers) + "\" workers: " + std::to_string(workers) +
                        " train { mode: ALLREDUCE allreduce_algo: \"" + algo +
                        "\" batch: 32 max_steps: 10 log_every: 1 } sim { compute_ms: 1 link_rate: \"10gbit\" latency_us: " +
                        std::to_string(latency_us) + " } }",
                    algo + std::to_string(workers) + "-" + std::to_string(static_cast<int>(latency_us)));
  };
  auto ring = run("ring", 16, 500), rhd = run("rhd", 16, 500), hier = run("hier", 16, 500);
  // The same bytes (2(n-1)/n of the model each way).
  EXPECT_NEAR(rhd.report.summary.bytes_per_step(), ring.report.summary.bytes_per_step(), 0.001 * ring.report.summary.bytes_per_step());
  // hier, as the real collective runs it on 2 hosts of 8 ranks: each host's ranks reduce into
  // their leader through shared memory and the leader hands the result back (counted as the
  // wire would, as ShmGroup counts it: 2 x (7 + 7/8) + 14 models a host, 29.75 / 8 a rank), and
  // only the 2 leaders' ring crosses the network (2 models a leader, 0.25 a rank, and rank 0's
  // broadcast, 2 x 15/16 of a model over 10 steps).
  const double model = 4.0 * kMlpParams;
  ASSERT_TRUE(hier.report.summary.has_shm_bytes_per_step());
  EXPECT_NEAR(hier.report.summary.shm_bytes_per_step(), 29.75 / 8 * model, 0.001 * model);
  EXPECT_NEAR(hier.report.summary.bytes_per_step() - hier.report.summary.shm_bytes_per_step(), (0.25 + 30.0 / 160) * model,
              0.001 * model);
  // 30 steps of 0.5 ms latency against 8 (rhd) and 2 (hier: the leaders' ring of 2).
  EXPECT_LT(rhd.report.summary.step_ms(), 0.5 * ring.report.summary.step_ms());
  EXPECT_LT(hier.report.summary.step_ms(), 0.75 * ring.report.summary.step_ms());
  // Not a power of two: the fold's two extra whole-model steps, and it finishes.
  // Not a power of two: 4 ranks hand their buffer to a partner and get the result back, 8 run
  // rhd: 8 x 2(7/8) + 8 whole buffers = 22 buffers, as the ring's 12 x 2(11/12).
  auto rhd12 = run("rhd", 12, 30);
  EXPECT_EQ(rhd12.report.summary.steps(), 10);
  const double ring12 = run("ring", 12, 30).report.summary.bytes_per_step();
  EXPECT_NEAR(rhd12.report.summary.bytes_per_step(), ring12, 0.001 * ring12);
}

TEST(SimTest, AnOversubscribedRackUplinkSlowsRhdAcrossRacks) {
  TempDir tmp;
  auto run = [&](double over) {
    return Simulate(tmp,
                    "run { name: \"ar\" workers: 16 train { mode: ALLREDUCE allreduce_algo: \"rhd\" batch: 32 max_steps: 10 log_every: 1 }"
                    " sim { compute_ms: 0 link_rate: \"1gbit\" rack_size: 4 oversubscription: " + std::to_string(over) + " } }",
                    "over" + std::to_string(static_cast<int>(over)));
  };
  // rhd's last two halvings cross racks: 4 ranks of a rack then share an uplink of 4 x 1 / 8 Gbit/s.
  auto flat = run(1), over = run(8);
  EXPECT_GT(over.report.summary.step_ms(), 1.5 * flat.report.summary.step_ms());
  EXPECT_EQ(over.report.summary.bytes_per_step(), flat.report.summary.bytes_per_step());
}

TEST(SimTest, CompressedPushesAndPullsCarryTheCodecsPayload) {
  TempDir tmp;
  auto s = Simulate(tmp, R"(run { name: "topk" workers: 2 servers: 1 train { mode: ASP compress: "topk:0.01" error_feedback: true
                             compress_pull: true batch: 32 max_steps: 40 log_every: 1 } sim { compute_ms: 1 } })");
  auto codec = CreateCompressor("topk:0.01", 1);
  ASSERT_TRUE(codec.ok());
  const double payload = static_cast<double>((*codec)->PayloadBytes(kMlpParams));
  // Per worker 40 compressed pushes and 39 compressed pulls (the pulls of steps 1-39); raw: each
  // worker's first pull, worker 0's INIT and its final evaluation pull (4 models); plus headers.
  const double expect = (2 * (40 + 39) * payload + 4.0 * 4 * kMlpParams) / 80;
  EXPECT_GT(s.report.summary.bytes_per_step(), expect);
  EXPECT_LT(s.report.summary.bytes_per_step(), expect + 1000);
}

// PowerSGD: its LowRankAverager's two all-reduces of plain floats a step, the P factors with the
// whole tensors and then the Q factors, as many floats as the real PowerSgd exchanges for the
// model's shapes (given, or the MLP's own); after backward, never overlapped.
TEST(SimTest, PowerSgdAllReducesTheRealFactorsTwiceAStep) {
  TempDir tmp;
  const std::string mlp_shapes = R"(tensor_shapes: ["784x256", "256", "256x128", "128", "128x10", "10"])";
  auto run = [&](const std::string& compress, const std::string& sim, const std::string& name) {
    return Simulate(tmp,
                    "run { name: \"" + name + "\" workers: 4 train { mode: ALLREDUCE allreduce_algo: \"ring\" " +
                        compress + " batch: 32 max_steps: 20 log_every: 1 } sim { compute_ms: 1 "
                        "link_rate: \"100mbit\" " + sim + " } }",
                    name);
  };
  const std::string powersgd = R"(compress: "powersgd:4" error_feedback: true)";
  auto low = run(powersgd, "", "low");
  auto given = run(powersgd, mlp_shapes, "given");
  auto dense = run("", "", "dense");
  const std::vector<TensorInfo> layout = PackedLayout({{784, 256}, {256}, {256, 128}, {128}, {128, 10}, {10}});
  ASSERT_EQ(LayoutSize(layout), kMlpParams);
  const double payload = 4.0 * static_cast<double>(PowerSgd(layout, 4, 1, true).PayloadFloats());
  EXPECT_EQ(PowerSgd(layout, 4, 1, true).PayloadFloats(), 4u * (784 + 256 + 256 + 128 + 128 + 10) + 256 + 128 + 10);
  // The ring: 2(n-1)/n of each all-reduce's floats each way (a few chunk headers more), and rank
  // 0's broadcast of the model once.
  const double broadcast = 2.0 * 3 * 4 * kMlpParams / (4 * 20);
  const double ring = 2 * 2 * 3.0 / 4 * payload;
  EXPECT_NEAR(low.report.summary.bytes_per_step() - broadcast, ring, 0.02 * ring);
  EXPECT_EQ(given.report.summary.bytes_per_step(), low.report.summary.bytes_per_step());
  EXPECT_LT(low.report.summary.bytes_per_step() - broadcast, 0.05 * (dense.report.summary.bytes_per_step() - broadcast));
  // At 100 Mbit/s the factors are much faster than the model.
  EXPECT_LT(low.report.summary.step_ms(), 0.5 * dense.report.summary.step_ms());
  EXPECT_NE(low.stats.codecs.find("powersgd:4+ef: 5066 + 1576 floats a step"), std::string::npos) << low.stats.codecs;
  // Nothing of a compressed exchange is hidden behind backward (overlap is on by default).
  std::ifstream f(low.dir + "/worker-1.csv");
  std::string line;
  std::getline(f, line);
  int rows = 0;
  while (std::getline(f, line)) {
    auto v = SplitCsv(line);
    if (!v[kColTestAccuracy].empty()) continue;
    EXPECT_EQ(std::stod(v[kColHidden]), 0) << line;
    rows++;
  }
  EXPECT_EQ(rows, 20);
}

TEST(SimTest, AccuracyIsTheMeasuredCurveAtTheSimulatedStep) {
  TempDir tmp;
  {
    auto m = MetricsWriter::Open(tmp.File("measured.csv"), "m", 0);
    ASSERT_TRUE(m.ok());
    MetricsRow row;
    row.step = 0;
    row.test.accuracy = 0.10;
    ASSERT_TRUE(m->Write(row).ok());
    row.step = 100;
    row.test.accuracy = 0.70;
    ASSERT_TRUE(m->Write(row).ok());
    ASSERT_TRUE(m->Flush().ok());
  }
  // 60 steps of 4 workers x 32 examples of 7,680: 60 steps an epoch, evaluations at 30 and 60.
  auto s = Simulate(tmp, "run { name: \"bsp\" workers: 4 servers: 1 train { mode: BSP batch: 32 max_steps: 60 eval_every: 30 }"
                         " sim { compute_ms: 1 train_examples: 7680 accuracy_from: \"" + tmp.File("measured.csv") + "\" } }");
  ASSERT_EQ(s.report.evals.size(), 2u);
  EXPECT_EQ(s.report.evals[0].step, 30);
  EXPECT_NEAR(s.report.evals[0].accuracy, 0.28, 1e-9);
  EXPECT_NEAR(s.report.summary.final_test_accuracy(), 0.46, 1e-9);
  EXPECT_GT(s.report.evals[1].wall_s, s.report.evals[0].wall_s);
}

TEST(SimTest, TheSameSpecSimulatesToTheSameFiles) {
  TempDir tmp;
  const std::string run = R"(run { name: "ssp" workers: 3 servers: 2 straggler { worker: 2 uniform { low_ms: 1 high_ms: 9 } seed: 3 }
                               train { mode: SSP staleness: 1 batch: 32 max_steps: 30 log_every: 1 } sim { compute_ms: 1 } })";
  auto a = Simulate(tmp, run, "a");
  auto b = Simulate(tmp, run, "b");
  auto read = [](const std::string& p) {
    std::ifstream f(p);
    std::stringstream s;
    s << f.rdbuf();
    return s.str();
  };
  EXPECT_EQ(read(a.dir + "/metrics.csv"), read(b.dir + "/metrics.csv"));
  EXPECT_GT(a.stats.events, 0);
  EXPECT_EQ(a.stats.events, b.stats.events);
  EXPECT_EQ(a.stats.worker_steps, 90);
}

TEST(SimTest, SettingsItCannotSimulateAreRefusedByName) {
  auto refused = [](const std::string& run) -> std::string {
    auto plan = Plan(run);
    if (!plan.ok()) return plan.status().message();
    auto s = ResolveSim(*plan);
    return s.ok() ? "" : s.status().message();
  };
  EXPECT_NE(refused(R"(run { name: "a" workers: 2 servers: 1 train { mode: BSP } })").find("compute_ms"), std::string::npos);
  EXPECT_NE(refused(R"(run { name: "a" workers: 2 servers: 1 train { mode: BSP } sim { compute_ms: 1 latency_us: -1 } })").find("latency_us"),
            std::string::npos);
  EXPECT_NE(refused(R"(run { name: "a" workers: 2 servers: 1 train { mode: BSP } sim { compute_ms: 1 link_rate: "fast" } })").find("tc rate"),
            std::string::npos);
  EXPECT_NE(refused(R"(run { name: "a" workers: 2 servers: 1 train { mode: BSP } sim { compute_from: "/nonexistent.csv" } })")
                .find("/nonexistent.csv"),
            std::string::npos);
  EXPECT_NE(refused(R"(run { name: "a" workers: 2 servers: 1 train { mode: BSP model: "sparse_logreg" } sim { compute_ms: 1 } })")
                .find("tensors"),
            std::string::npos);
  // What the real collective refuses: shared memory between ranks that are each on a host of their own.
  EXPECT_NE(refused(R"(run { name: "a" workers: 2 train { mode: ALLREDUCE allreduce_algo: "shm" } link { rate: "1gbit" } sim { compute_ms: 1 } })")
                .find("needs shared memory"),
            std::string::npos);
  // PowerSGD compresses each tensor as a matrix: floats alone do not say which.
  EXPECT_NE(refused(R"(run { name: "a" workers: 2 train { mode: ALLREDUCE compress: "powersgd:2" } sim { compute_ms: 1 tensors: [100, 10] } })")
                .find("tensor_shapes"),
            std::string::npos);
  EXPECT_EQ(refused(R"(run { name: "a" workers: 2 train { mode: ALLREDUCE compress: "powersgd:2" } sim { compute_ms: 1 } })"), "");
  EXPECT_NE(refused(R"(run { name: "a" workers: 2 train { mode: ALLREDUCE } sim { compute_ms: 1 tensors: [10] tensor_shapes: ["10"] } })")
                .find("not both"),
            std::string::npos);
  for (const char* shape : {"", "32x", "32x0x5", "x4", "3 x4", "-3", "4x4y"}) {
    EXPECT_NE(refused(std::string(R"(run { name: "a" workers: 2 train { mode: ALLREDUCE } sim { compute_ms: 1 tensor_shapes: [")") +
                      shape + "\"] } }")
                  .find("is not a shape"),
              std::string::npos)
        << shape;
  }
  EXPECT_NE(refused(R"(run { name: "a" workers: 2 train { mode: ALLREDUCE } sim { compute_ms: 1 host_cores: 2 usable_cores: 3 } })")
                .find("usable_cores"),
            std::string::npos);
  EXPECT_NE(refused(R"(run { name: "a" workers: 2 train { mode: ALLREDUCE } sim { compute_ms: 1 msg_us: -1 } })").find("msg_us"),
            std::string::npos);
  EXPECT_NE(refused(R"(run { name: "a" workers: 2 train { mode: ALLREDUCE } sim { compute_ms: 1 ring_msg_us: -1 } })").find("ring_msg_us"),
            std::string::npos);
  EXPECT_NE(refused(R"(run { name: "a" workers: 2 servers: 1 train { mode: ASP } sim { compute_ms: 1 flow_share_spread: 1 } })").find("flow_share_spread"),
            std::string::npos);
  for (const char* draws : {"0", "100"}) {
    EXPECT_NE(refused(std::string(R"(run { name: "a" workers: 2 servers: 1 train { mode: ASP } sim { compute_ms: 1 share_draws: )") + draws + " } }")
                  .find("share_draws"),
              std::string::npos);
  }
  // Given tensors, any model: the CNN of examples/pytorch (454,922 parameters).
  EXPECT_EQ(refused(R"(run { name: "a" workers: 2 command: "python3 x.py" train { mode: ALLREDUCE }
                         sim { compute_ms: 11 tensors: [800, 32, 51200, 64, 401408, 128, 1280, 10] } })"),
            "");
}

}  // namespace
}  // namespace gradsync
