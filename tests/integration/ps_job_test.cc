// Parameter-server jobs in one process (threads over 127.0.0.1): the modes' semantics.
#include <gtest/gtest.h>

#include <functional>

#include <chrono>
#include <cmath>
#include <thread>
#include <vector>

#include "common/base/numeric/rng.h"
#include "common/base/numeric/tensor.h"
#include "common/data/synthetic.h"
#include "tests/support/ps_job.h"

namespace gradsync::testing {
namespace {

// With one worker every mode is the local optimizer, step for step: SGD with momentum, or Adam
// on the shards (torch.optim.Adam on that worker's gradient).
struct OneWorkerCase {
  ConsistencyMode mode;
  int staleness;
  OptimizerKind optimizer;
};

class OneWorkerTest : public ::testing::TestWithParam<OneWorkerCase> {};

TEST_P(OneWorkerTest, EqualsLocalStepForStep) {
  Dataset data = SmallBlobs(1600);
  PsJobOptions o;
  o.mode = GetParam().mode;
  o.staleness = GetParam().staleness;
  o.num_servers = 2;
  o.num_workers = 1;
  o.model = SmallMlp();
  const bool adam = GetParam().optimizer == OptimizerKind::kAdam;
  o.train = SmallTrain(32, 200, adam ? 0.0f : 0.9f);
  o.train.lr.total_steps = 200;
  if (adam) {
    o.train.optimizer.kind = OptimizerKind::kAdam;
    o.train.lr.base = 0.005f;
  }
  PsJobResult r = RunPsJob(o, data, data);
  ASSERT_TRUE(r.status.ok()) << r.status;
  LocalTrainOptions local = o.train;
  std::vector<float> expect = RunLocal(o.model, local, 0, data);
  ASSERT_EQ(r.params.size(), expect.size());
  EXPECT_LE(MaxRelativeDiff(r.params, expect), 1e-6);
}

INSTANTIATE_TEST_SUITE_P(
    Modes, OneWorkerTest,
    ::testing::Values(OneWorkerCase{ConsistencyMode::kBsp, 0, OptimizerKind::kSgd},
                      OneWorkerCase{ConsistencyMode::kSsp, 3, OptimizerKind::kSgd},
                      OneWorkerCase{ConsistencyMode::kAsp, 0, OptimizerKind::kSgd},
                      OneWorkerCase{ConsistencyMode::kBsp, 0, OptimizerKind::kAdam},
                      OneWorkerCase{ConsistencyMode::kSsp, 3, OptimizerKind::kAdam},
                      OneWorkerCase{ConsistencyMode::kAsp, 0, OptimizerKind::kAdam}),
    [](const auto& p) {
      return ConsistencyModeName(p.param.mode) + std::to_string(p.param.staleness) +
             (p.param.optimizer == OptimizerKind::kAdam ? "Adam" : "");
    });

// LARS and LAMB over the wire: one server holds every layer whole, so one worker equals local
// training in every mode (ssp/asp: one step per push at lr / 1); in asp also with overlapped
// pushes in parts of 100 floats, which cut layers (the shard applies a push at its last part).
TEST(PsJobTest, LarsAndLambOnOneWorkerEqualLocalInEveryMode) {
  Dataset data = SmallBlobs(1600);
  struct Case {
    ConsistencyMode mode;
    int staleness;
    bool overlap;
  };
  for (OptimizerKind kind : {OptimizerKind::kLars, OptimizerKind::kLamb}) {
    for (const Case& c : {Case{ConsistencyMode::kBsp, 0, false}, Case{ConsistencyMode::kSsp, 3, false},
                          Case{ConsistencyMode::kAsp, 0, false}, Case{ConsistencyMode::kAsp, 0, true}}) {
      SCOPED_TRACE(std::string(OptimizerKindName(kind)) + " " + ConsistencyModeName(c.mode) + (c.overlap ? " overlap" : ""));
      PsJobOptions o;
      o.mode = c.mode;
      o.staleness = c.staleness;
      o.num_servers = 1;
      o.num_workers = 1;
      o.model = SmallMlp();
      o.train = SmallTrain(32, 100, kind == OptimizerKind::kLars ? 0.9f : 0.0f);
      o.train.lr.total_steps = 100;
      o.train.lr.base = kind == OptimizerKind::kLars ? 1.0f : 0.01f;
      o.train.optimizer.kind = kind;
      o.train.optimizer.weight_decay = 1e-3f;
      o.train.optimizer.trust_coefficient = 0.01;
      o.overlap = c.overlap;
      o.push_part_floats = 100;
      PsJobResult r = RunPsJob(o, data, data);
      ASSERT_TRUE(r.status.ok()) << r.status;
      std::vector<float> expect = RunLocal(o.model, o.train, 0, data);
      ASSERT_EQ(r.params.size(), expect.size());
      EXPECT_LE(MaxRelativeDiff(r.params, expect), 1e-6);
    }
  }
}

// A bsp job of the small MLP on 2 servers.
PsJobOptions BspJob(int workers, int64_t batch, int64_t steps) {
  PsJobOptions o;
  o.mode = ConsistencyMode::kBsp;
  o.num_servers = 2;
  o.num_workers = workers;
  o.model = SmallMlp();
  o.train = SmallTrain(batch, steps, 0.9f);
  return o;
}

TEST(PsJobTest, BspWithFourWorkersEqualsLocalSgdWithTheGlobalBatch) {
  Dataset data = SmallBlobs(1600);
  PsJobOptions o = BspJob(4, 8, 200);  // 4 x 8 = 32 per step; 1600 / 32 = 50 steps per epoch
  o.train.lr.total_steps = 200;
  PsJobResult r = RunPsJob(o, data, data);
  ASSERT_TRUE(r.status.ok()) << r.status;
  LocalTrainOptions local = o.train;
  local.batch = 32;
  std::vector<float> expect = RunLocal(o.model, local, 0, data);
  const double diff = MaxRelativeDiff(r.params, expect, 1e-3);
  const double noise = SummationNoise(o.model, local, 8, data);
  RecordProperty("max_relative_diff", std::to_string(diff));
  RecordProperty("summation_noise", std::to_string(noise));
  EXPECT_LE(diff, EquivalenceTolerance(noise)) << "this CPU's summation noise: " << noise;
  for (const auto& st : r.server_stats) {
    EXPECT_EQ(st.requests.pushes, 4 * 200);
    ASSERT_EQ(st.requests.version_lag.size(), 1u);
    EXPECT_EQ(st.requests.version_lag.begin()->first, 0);  // bsp: every gradient applied on its own version
  }
}

TEST(PsJobTest, BspWithAccumulationAndWarmUpEqualsLocalSgdWithTheGlobalBatch) {
  // 2 workers x 4 micro-batches of 4 = one local batch of 32; the warm-up schedule reaches the
  // servers through the job config.
  Dataset data = SmallBlobs(1600);
  PsJobOptions o = BspJob(2, 16, 120);
  o.train.micro_batch = 4;
  o.train.warmup_epochs = 0.5;  // 25 steps of the 50 per epoch
  o.train.lr.warmup_start = 0.01f;
  o.train.lr.kind = LrSchedule::Kind::kCosine;
  PsJobResult r = RunPsJob(o, data, data);
  ASSERT_TRUE(r.status.ok()) << r.status;
  LocalTrainOptions local = o.train;
  local.batch = 32;
  local.micro_batch = 0;
  std::vector<float> expect = RunLocal(o.model, local, 0, data);
  const double diff = MaxRelativeDiff(r.params, expect, 1e-3);
  const double noise = SummationNoise(o.model, local, 4, data);
  RecordProperty("max_relative_diff", std::to_string(diff));
  RecordProperty("summation_noise", std::to_string(noise));
  EXPECT_LE(diff, EquivalenceTolerance(noise)) << "this CPU's summation noise: " << noise;
  // Without the warm-up the parameters differ: the schedule really reached the shards.
  LocalTrainOptions no_warmup = local;
  no_warmup.warmup_epochs = 0;
  EXPECT_GT(MaxRelativeDiff(r.params, RunLocal(o.model, no_warmup, 0, data), 1e-3), 1e-3);
}

// Job `o` without overlap, then with it (parts of 37 floats: every tensor cut into many, across
// both shards' boundary).
std::pair<PsJobResult, PsJobResult> WithoutAndWithOverlap(PsJobOptions o, const Dataset& data) {
  PsJobResult plain = RunPsJob(o, data, data);
  o.overlap = true;
  o.push_part_floats = 37;
  return {std::move(plain), RunPsJob(o, data, data)};
}

// Overlap: pushes in parts as backward produces them, pulls per tensor waited for layer by layer.
TEST(PsJobTest, BspWithOverlapIsBspWithoutBitForBitAndLocalSgdWithTheGlobalBatch) {
  Dataset data = SmallBlobs(1600);
  PsJobOptions o = BspJob(4, 8, 200);
  o.train.lr.total_steps = 200;
  auto [plain, r] = WithoutAndWithOverlap(o, data);
  ASSERT_TRUE(plain.status.ok()) << plain.status;
  ASSERT_TRUE(r.status.ok()) << r.status;
  // The same gradients summed in the same (rank) order per element: the same bits.
  EXPECT_EQ(r.params, plain.params);
  LocalTrainOptions local = o.train;
  local.batch = 32;
  const double diff = MaxRelativeDiff(r.params, RunLocal(o.model, local, 0, data), 1e-3);
  const double noise = SummationNoise(o.model, local, 8, data);
  RecordProperty("max_relative_diff", std::to_string(diff));
  EXPECT_LE(diff, EquivalenceTolerance(noise)) << "this CPU's summation noise: " << noise;
  // With accumulation the gradient is final only after the last micro-batch: every part goes
  // then, and the run is still bsp's, bit for bit.
  PsJobOptions acc = BspJob(2, 16, 50);
  acc.train.micro_batch = 4;
  auto [acc_plain, acc_overlap] = WithoutAndWithOverlap(acc, data);
  ASSERT_TRUE(acc_plain.status.ok()) << acc_plain.status;
  ASSERT_TRUE(acc_overlap.status.ok()) << acc_overlap.status;
  EXPECT_EQ(acc_overlap.params, acc_plain.params);
  for (const auto& st : r.server_stats) {
    EXPECT_EQ(st.requests.pushes, 4 * 200);  // a push in parts counts once
    EXPECT_EQ(st.requests.rejected, 0);
    ASSERT_EQ(st.requests.version_lag.size(), 1u);
    EXPECT_EQ(st.requests.version_lag.begin()->first, 0);
  }
}

// Shared-memory lanes and data channels carry the same values as ZeroMQ: a bsp run is the same
// bits every way, sequential and overlapped, and only the lanes' run answers pulls through them,
// only the data channels' run over them.
TEST(PsJobTest, BspThroughSharedMemoryIsBspOverTcpBitForBit) {
  Dataset data = SmallBlobs(960);
  for (bool overlap : {false, true}) {
    PsJobOptions o = BspJob(2, 8, 60);
    o.train.lr.total_steps = 60;
    o.overlap = overlap;
    o.push_part_floats = 64;  // overlapped: several parts per tensor
    o.shm = false;
    o.data_channel = false;
    PsJobResult tcp = RunPsJob(o, data, data);
    o.data_channel = true;
    o.data_min_floats = 1;  // every request of this small model
    PsJobResult data_channel = RunPsJob(o, data, data);
    o.shm = true;
    PsJobResult shm = RunPsJob(o, data, data);
    ASSERT_TRUE(tcp.status.ok()) << tcp.status;
    ASSERT_TRUE(data_channel.status.ok()) << data_channel.status;
    ASSERT_TRUE(shm.status.ok()) << shm.status;
    EXPECT_EQ(shm.params, tcp.params) << "overlap " << overlap;
    EXPECT_EQ(data_channel.params, tcp.params) << "overlap " << overlap;
    for (size_t i = 0; i < shm.server_stats.size(); ++i) {
      EXPECT_EQ(tcp.server_stats[i].channels.shm_pulls, 0);
      EXPECT_EQ(tcp.server_stats[i].channels.data_pulls, 0);
      EXPECT_GT(shm.server_stats[i].channels.shm_pulls, 0) << "server " << i;
      EXPECT_EQ(shm.server_stats[i].channels.shm_lanes, 2) << "server " << i;
      EXPECT_EQ(shm.server_stats[i].channels.data_pulls, 0) << "a lane, not a data channel, where both could be";
      EXPECT_EQ(shm.server_stats[i].requests.pushes, tcp.server_stats[i].requests.pushes);
      EXPECT_EQ(shm.server_stats[i].requests.rejected, 0);
      EXPECT_GT(data_channel.server_stats[i].channels.data_pulls, 0) << "server " << i;
      EXPECT_EQ(data_channel.server_stats[i].channels.data_channels, 2) << "server " << i;
      EXPECT_EQ(data_channel.server_stats[i].requests.pushes, tcp.server_stats[i].requests.pushes);
      EXPECT_EQ(data_channel.server_stats[i].requests.rejected, 0);
      // The values cross the wire either way: the byte counts are the ZeroMQ run's, give or take
      // the frames' heads and headers' flags.
      EXPECT_GT(data_channel.server_stats[i].traffic.bytes_received, tcp.server_stats[i].traffic.bytes_received * 9 / 10);
    }
  }
}

// A 2x2 bsp job over ZeroMQ, and the same job over data channels broken by `breakage` (a test
// option of the servers): the second must be the first bit for bit.
void ExpectDataChannelFallback(const std::function<void(PsJobOptions&)>& breakage, PsJobResult* zmq,
                               PsJobResult* broken) {
  Dataset data = SmallBlobs(960);
  PsJobOptions o = BspJob(2, 8, 40);
  o.train.lr.total_steps = 40;
  o.shm = false;
  o.data_channel = false;
  *zmq = RunPsJob(o, data, data);
  ASSERT_TRUE(zmq->status.ok()) << zmq->status;
  o.data_channel = true;
  o.data_min_floats = 1;
  breakage(o);
  *broken = RunPsJob(o, data, data);
  ASSERT_TRUE(broken->status.ok()) << broken->status;
  EXPECT_EQ(broken->params, zmq->params);
  for (const auto& st : broken->server_stats) {
    EXPECT_LT(st.channels.data_pulls, 2 * 40) << "the dropped worker went on over ZeroMQ";
    EXPECT_EQ(st.channels.data_channels, 1);
    EXPECT_EQ(st.requests.rejected, 0);
  }
}

// A data channel that breaks under a worker while its shard lives (here: dropped by the shard
// with a pull's frame unsent): that pull goes again over ZeroMQ, and so does everything after;
// the run is the ZeroMQ run bit for bit.
TEST(PsJobTest, ADataChannelThatBreaksFallsBackToZeroMq) {
  PsJobResult zmq, broken;
  ASSERT_NO_FATAL_FAILURE(ExpectDataChannelFallback(
      [](PsJobOptions& o) { o.drop_data_channel_after_pulls = 10; }, &zmq, &broken));
  for (const auto& st : broken.server_stats) EXPECT_GE(st.channels.data_pulls, 10);
}

// A data channel that ends between a worker's pushes (here: dropped by the shard once it took a
// push's frame, as a frame that breaks the channel would): the worker sees the shard's close
// before it writes the next push's frame, drops the channel, and that push and everything after
// go over ZeroMQ. The run is the ZeroMQ run bit for bit, and no request is refused.
TEST(PsJobTest, ADataChannelThatEndsBetweenPushesFallsBackToZeroMq) {
  PsJobResult zmq, broken;
  ASSERT_NO_FATAL_FAILURE(ExpectDataChannelFallback(
      // each server: the worker of its 10th data push
      [](PsJobOptions& o) { o.drop_data_channel_after_pushes = 10; }, &zmq, &broken));
  for (const auto& st : broken.server_stats) {
    EXPECT_EQ(st.requests.pushes, zmq.server_stats[0].requests.pushes);
    EXPECT_GE(st.channels.data_pulls, 4);
  }
}

// A caller that sets each step's rate itself (a frontend's LR scheduler): the pushes carry it
// and the shards apply it instead of their schedule. The job's schedule says constant 0.5 (it
// would diverge); the steps' own rates are the cosine a scheduled run computes, so the run is
// that run bit for bit, sequential or overlapped (pushes in parts).
TEST(PsJobTest, EachPushAppliesItsStepsOwnRate) {
  Dataset data = SmallBlobs(1600);
  PsJobOptions scheduled = BspJob(2, 16, 60);
  scheduled.train.lr = {LrSchedule::Kind::kCosine, 0.05f, 60, 0.0f};
  PsJobResult expect = RunPsJob(scheduled, data, data);
  ASSERT_TRUE(expect.status.ok()) << expect.status;
  for (bool overlap : {false, true}) {
    PsJobOptions own = scheduled;
    own.train.lr = {LrSchedule::Kind::kConstant, 0.5f, 0, 0.0f};
    own.step_lr = [cosine = scheduled.train.lr](int64_t step) { return cosine.At(step); };
    own.overlap = overlap;
    own.push_part_floats = 50;  // several parts per push
    PsJobResult r = RunPsJob(own, data, data);
    ASSERT_TRUE(r.status.ok()) << r.status;
    EXPECT_EQ(r.params, expect.params) << "overlap " << overlap;
  }
}

TEST(PsJobTest, AspAndSspWithOverlapApplyEachPushOnce) {
  Dataset data = SmallBlobs(1600);
  // One worker: every mode is local SGD step for step, parts or not.
  for (auto [mode, s] : {std::pair{ConsistencyMode::kAsp, 0}, std::pair{ConsistencyMode::kSsp, 2}}) {
    PsJobOptions o;
    o.mode = mode;
    o.staleness = s;
    o.num_servers = 2;
    o.num_workers = 1;
    o.model = SmallMlp();
    o.train = SmallTrain(32, 150, 0.9f);
    o.train.lr.total_steps = 150;
    o.overlap = true;
    o.push_part_floats = 23;
    PsJobResult r = RunPsJob(o, data, data);
    ASSERT_TRUE(r.status.ok()) << r.status;
    EXPECT_LE(MaxRelativeDiff(r.params, RunLocal(o.model, o.train, 0, data)), 1e-6) << ConsistencyModeName(mode);
    for (const auto& st : r.server_stats) {
      EXPECT_EQ(st.requests.pushes, 150);
      EXPECT_EQ(st.requests.version_lag.begin()->first, 0);  // one worker: every push on the latest version
    }
  }
  // Four asp workers with overlap train (no equality to hold them to): every push counted once.
  PsJobOptions o = BspJob(4, 8, 100);
  o.mode = ConsistencyMode::kAsp;
  o.overlap = true;
  o.push_part_floats = 50;
  PsJobResult r = RunPsJob(o, data, data);
  ASSERT_TRUE(r.status.ok()) << r.status;
  for (const auto& st : r.server_stats) {
    EXPECT_EQ(st.requests.pushes, 4 * 100);
    EXPECT_EQ(st.requests.rejected, 0);
  }
}

// A diverged step stops the run before its push counts anywhere: the parts backward sent are
// never completed, so the shards applied exactly the steps before it.
TEST(PsJobTest, ADivergedOverlappedStepIsNeverApplied) {
  Dataset data = SmallBlobs(1600);
  PsJobOptions o;
  o.mode = ConsistencyMode::kAsp;
  o.num_servers = 2;
  o.num_workers = 1;
  o.model = SmallMlp();
  o.train = SmallTrain(32, 200, 0.0f);
  o.train.lr = {LrSchedule::Kind::kConstant, 1e4f, 0, 0.0f};
  o.overlap = true;
  o.push_part_floats = 23;
  PsJobResult r = RunPsJob(o, data, data);
  ASSERT_EQ(r.status.code(), StatusCode::kAborted) << r.status;
  const std::string& msg = r.status.message();
  const size_t at = msg.find("at step ");
  ASSERT_NE(at, std::string::npos) << msg;
  const int64_t step = std::stoll(msg.substr(at + 8));
  for (const auto& st : r.server_stats) EXPECT_EQ(st.requests.pushes, step) << msg;
}

// The bound, and whether values go through shared-memory lanes (else over TCP).
class SspBoundTest : public ::testing::TestWithParam<std::tuple<int, const char*>> {};

TEST_P(SspBoundTest, EveryAnsweredPullRespectsTheBound) {
  const int s = std::get<0>(GetParam());
  Dataset data = SmallBlobs(960);
  PsJobOptions o;
  o.mode = ConsistencyMode::kSsp;
  o.staleness = s;
  o.num_servers = 2;
  o.num_workers = 3;
  o.model = SmallMlp();
  o.train = SmallTrain(8, 60, 0.0f);
  o.train.lr.total_steps = 60;
  const std::string path = std::get<1>(GetParam());
  o.shm = path == "shm";
  o.data_channel = path == "data";
  o.data_min_floats = 1;
  // Seeded random delays, heavier on worker 2, so that the fast ones run into the bound.
  // The workers' own clock, independent of the shards: when each began computing step c (its
  // pull of clock c had landed) and the earliest its delay let that compute end (its push of c
  // leaves later still).
  constexpr int kWorkers = 3, kSteps = 60;
  std::vector<std::vector<double>> began(kWorkers, std::vector<double>(kSteps, -1)), done = began;
  const auto t0 = std::chrono::steady_clock::now();
  o.delay_ms = [&](int w, int64_t step) {
    Rng rng(Rng::Derive(11, static_cast<uint64_t>(w), static_cast<uint64_t>(step)));
    const double d = (w == 2 ? 4.0 : 0.5) * rng.UniformDouble();
    const double now = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (step < kSteps) {
      began[static_cast<size_t>(w)][static_cast<size_t>(step)] = now;
      done[static_cast<size_t>(w)][static_cast<size_t>(step)] = now + d;
    }
    return d;
  };
  PsJobResult r = RunPsJob(o, data, data);
  ASSERT_TRUE(r.status.ok()) << r.status;
  // Ho et al.'s bound seen from the workers alone: worker w begins step c only once every other
  // worker has pushed c - s gradients, so after each of them ended computing step c - s - 1.
  int violations = 0;
  for (int w = 0; w < kWorkers; ++w) {
    for (int c = s + 1; c < kSteps; ++c) {
      for (int v = 0; v < kWorkers; ++v) {
        if (v == w) continue;
        const double mine = began[static_cast<size_t>(w)][static_cast<size_t>(c)];
        const double theirs = done[static_cast<size_t>(v)][static_cast<size_t>(c - s - 1)];
        ASSERT_GE(mine, 0) << "worker " << w << " step " << c << " not seen";
        if (theirs >= mine && ++violations <= 5) {
          ADD_FAILURE() << "worker " << w << " began step " << c << " at " << mine << " ms, while worker " << v
                        << " was still computing step " << c - s - 1 << " (until " << theirs << " ms)";
        }
      }
    }
  }
  EXPECT_EQ(violations, 0);
  int64_t checked = 0, held_back_possible = 0;
  for (const auto& log : r.pulls) {
    for (const PullRecord& p : log) {
      // Ho et al.: a read at clock c sees every update of clocks <= c - s - 1, i.e. every live
      // worker has pushed >= c - s gradients when the pull is answered.
      if (s == 0) {
        EXPECT_GE(p.rounds_applied, p.clock) << "worker " << p.worker << " clock " << p.clock;
      } else {
        EXPECT_GE(p.min_live_clock, p.clock - s) << "worker " << p.worker << " clock " << p.clock;
      }
      // The clock staleness the reply carried is that lag, and ssp bounds it by s.
      const int64_t complete = s == 0 ? p.rounds_applied : p.min_live_clock;
      EXPECT_EQ(p.clock_staleness, std::max<int64_t>(0, p.clock - complete)) << "worker " << p.worker;
      EXPECT_LE(p.clock_staleness, s) << "worker " << p.worker << " clock " << p.clock;
      // The same bound against the shard's own count of applied gradients (KvShard's version,
      // not the controller's bookkeeping that decided to answer): every one of the 3 workers'
      // first c - s gradients was applied, so at least 3 (c - s) (a bsp round counts each
      // contribution). A miscounted push that let the controller answer early fails here.
      EXPECT_GE(p.version, 3 * std::max<int64_t>(0, p.clock - s))
          << "worker " << p.worker << "'s pull at clock " << p.clock << " was answered with only " << p.version
          << " gradients applied";
      held_back_possible += p.clock - p.min_live_clock > 0;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 2 * 3 * 60);  // every pull of every step (no evaluation pulls here)
  int64_t counted = 0, max_clock_staleness = 0;
  for (const auto& st : r.server_stats) {
    for (const auto& [k, v] : st.requests.clock_staleness) {
      counted += v;
      max_clock_staleness = std::max(max_clock_staleness, k);
    }
  }
  EXPECT_EQ(counted, checked);  // the shards' histogram counts every answered pull
  for (const auto& st : r.server_stats) {
    EXPECT_EQ(st.channels.shm_pulls, path == "shm" ? 3 * 60 : 0) << "every pull through the lanes, or none";
    EXPECT_EQ(st.channels.data_pulls, path == "data" ? 3 * 60 : 0) << "every pull over the data channels, or none";
  }
  EXPECT_LE(max_clock_staleness, s);
  if (s > 0) {
    EXPECT_GT(held_back_possible, 0) << "the delays never let a worker run ahead";
    EXPECT_GT(max_clock_staleness, 0) << "no answered pull was stale";
  }
  if (s == 0) {
    // ssp(0) gives the bsp result.
    PsJobOptions b = o;
    b.mode = ConsistencyMode::kBsp;
    b.staleness = 0;
    PsJobResult rb = RunPsJob(b, data, data);
    ASSERT_TRUE(rb.status.ok()) << rb.status;
    EXPECT_LE(MaxRelativeDiff(r.params, rb.params, 1e-3), 1e-6);
  }
}

INSTANTIATE_TEST_SUITE_P(Bounds, SspBoundTest,
                         ::testing::Combine(::testing::Values(0, 1, 3), ::testing::Values("zmq", "data", "shm")),
                         [](const auto& param_info) {
                           return "s" + std::to_string(std::get<0>(param_info.param)) + "_" +
                                  std::string(std::get<1>(param_info.param));
                         });

class AspSlowWorkerTest : public ::testing::TestWithParam<bool> {};

// With and without the staleness-aware rate (Zhang et al. 2016).
TEST_P(AspSlowWorkerTest, SeesStalenessAndStillConverges) {
  Dataset data = SmallBlobs(1200, 3);
  PsJobOptions o;
  o.mode = ConsistencyMode::kAsp;
  o.num_servers = 2;
  o.num_workers = 3;
  o.model.name = "softmax";  // convex
  o.model.input_dim = 12;
  o.model.num_classes = 3;
  o.train = SmallTrain(16, 120, 0.0f);
  o.train.lr = {LrSchedule::Kind::kConstant, 0.1f, 0, 0.0f};
  o.delay_ms = [](int w, int64_t) { return w == 0 ? 3.0 : 0.0; };
  o.staleness_aware_lr = GetParam();
  PsJobResult r = RunPsJob(o, data, data);
  ASSERT_TRUE(r.status.ok()) << r.status;
  int64_t stale = 0, max_stale = 0;
  for (const auto& st : r.server_stats) {
    for (const auto& [k, v] : st.requests.version_lag) {
      if (k > 0) stale += v;
      max_stale = std::max(max_stale, k);
    }
  }
  EXPECT_GT(stale, 0);
  EXPECT_GE(max_stale, 2);
  auto model = std::move(CreateModel(o.model)).value();
  std::copy(r.params.begin(), r.params.end(), model->params().begin());
  EvalResult after = Evaluate(*model, data);
  model->Initialize(0);
  EvalResult before = Evaluate(*model, data);
  EXPECT_LT(after.loss, 0.5 * before.loss);
  EXPECT_GT(after.accuracy, 0.9);
}

INSTANTIATE_TEST_SUITE_P(Rates, AspSlowWorkerTest, ::testing::Bool(),
                         [](const auto& p) { return std::string(p.param ? "StalenessAware" : "Plain"); });

TEST(PsJobTest, SparseModelTrainsOverTheServers) {
  SparseLogisticOptions so;
  so.n = 4000;
  so.feature_bits = 16;
  so.nnz = 10;
  Dataset data = MakeSparseLogistic(so);
  PsJobOptions o;
  o.mode = ConsistencyMode::kBsp;
  o.num_servers = 2;
  o.num_workers = 2;
  o.model.name = "sparse_logreg";
  o.model.feature_bits = 16;
  o.train = SmallTrain(25, 160, 0.0f);
  o.train.lr = {LrSchedule::Kind::kConstant, 4.0f, 0, 0.0f};
  o.train.optimizer.weight_decay = 0;
  PsJobResult r = RunPsJob(o, data, data);
  ASSERT_TRUE(r.status.ok()) << r.status;
  LocalTrainOptions local = o.train;
  local.batch = 50;
  std::vector<float> expect = RunLocal(o.model, local, 0, data);
  EXPECT_LE(MaxRelativeDiff(r.params, expect, 1e-3), 1e-5);
}

TEST(PsJobTest, ADeadServerIsReportedByNameWithinTheTimeout) {
  Dataset data = SmallBlobs(1600);
  PsJobOptions o;
  o.mode = ConsistencyMode::kBsp;
  o.num_servers = 2;
  o.num_workers = 2;
  o.model = SmallMlp();
  o.train = SmallTrain(8, 100000, 0.0f);  // would run for minutes
  o.heartbeat_timeout_s = 1.0;
  o.kill_server = 1;
  o.kill_after_s = 0.3;
  o.timeout_s = 30;
  PsJobResult r = RunPsJob(o, data, data);
  ASSERT_FALSE(r.status.ok());
  // No backup and no checkpoint: nothing can bring the shard back, and the scheduler says so.
  EXPECT_EQ(r.status.code(), StatusCode::kDataLoss) << r.status;
  EXPECT_NE(r.status.message().find("shard 1 is lost: server 1"), std::string::npos) << r.status;
  EXPECT_NE(r.status.message().find("dead"), std::string::npos) << r.status;
  ASSERT_GE(r.kill_to_failure_s, 0);
  EXPECT_LT(r.kill_to_failure_s, 2 * o.heartbeat_timeout_s + 0.5);
}

}  // namespace
}  // namespace gradsync::testing
