// Delay-compensated ASGD in a job (threads over 127.0.0.1): with a straggler in asp and ssp, every
// push after a worker's first pull is corrected on every shard (the corrections change the
// gradients, less than the gradients themselves), and the run trains; on a real shard with two
// workers driven push by push, the parameters a pull reads are those of the optimizer applying
// g + lambda * g * g * (w_now - w_pulled) to each push (constant lambda, and the adaptive one),
// as the test computes them from what it pulled and pushed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "common/data/synthetic.h"
#include "common/ps/ps_protocol.h"
#include "tests/support/ps_job.h"
#include "worker/ps/client/ps_client.h"

namespace gradsync::testing {
namespace {

TEST(DelayCompensationTrainTest, EveryPushIsCorrectedAndTheRunTrains) {
  const Dataset data = SmallBlobs();
  for (bool adaptive : {false, true}) {
    for (ConsistencyMode mode : {ConsistencyMode::kAsp, ConsistencyMode::kSsp}) {
      SCOPED_TRACE(std::string(adaptive ? "adaptive " : "") + (mode == ConsistencyMode::kAsp ? "asp" : "ssp"));
      PsJobOptions ps;
      ps.mode = mode;
      ps.staleness = 2;
      ps.num_servers = 2;
      ps.num_workers = 3;
      ps.model = SmallMlp();
      ps.train = SmallTrain(8, 40, 0.0f);
      ps.delay_compensation = adaptive ? 0.05f : 0.5f;
      ps.delay_compensation_adaptive = adaptive;
      ps.delay_ms = [](int worker, int64_t) { return worker == 2 ? 3.0 : 0.0; };
      PsJobResult r = RunPsJob(ps, data, data);
      ASSERT_TRUE(r.status.ok()) << r.status;
      ASSERT_EQ(r.compensated_pushes.size(), 2u);
      for (size_t k = 0; k < 2; ++k) {
        // Each worker pulls before each push: all 3 x 40 pushes were corrected.
        EXPECT_EQ(r.compensated_pushes[k], 3 * 40);
        EXPECT_EQ(r.uncompensated_pushes[k], 0);
        // The straggler's pushes are stale: the corrections changed the gradients, by little.
        EXPECT_GT(r.relative_correction[k], 0);
        EXPECT_LT(r.relative_correction[k], 1);
      }
      for (float p : r.params) ASSERT_TRUE(std::isfinite(p));
    }
  }
}

// One asp shard of kParams floats, two workers (OneShardJob), SGD at rate 0.1 without momentum:
// the shard applies lr * g' / 2 (a push is one of the two workers'). The test drives the pushes
// and pulls in a fixed order, so it knows every w_pulled and w_now:
//   both pull v0; worker 0 pushes g0 (w_now = w_pulled: g0' = g0) -> v1; worker 0 pulls v1;
//   worker 1 pushes g1 computed on v0 (w_now = v1) -> v2; worker 0 pushes g2 computed on v1
//   (w_now = v2) -> v3; worker 1 pulls v3.
// What the pulls read is checked against the formula computed here in double. The corrections move the
// parameters by about 5e-3 (constant) and 1e-2 (adaptive); a correction of the wrong sign, or
// none, ends that far from the formula; the tolerance is float rounding (1e-6).
constexpr int64_t kParams = 64;
constexpr double kLr = 0.1;

wire::JobConfig DcJob(float lambda, bool adaptive) {
  wire::JobConfig job = testing::OneTensorJob(kParams, 2, static_cast<float>(kLr));
  job.set_delay_compensation(lambda);
  job.set_delay_compensation_adaptive(adaptive);
  return job;
}

// The shard's side, in double: the adaptive variant's mean square per element, and each push.
struct DcReference {
  double lambda;
  bool adaptive;
  std::vector<double> mean_square = std::vector<double>(kParams, 0.0);

  // w <- w - lr * g' / 2, g' = g + lambda_i * g * g * (w - pulled).
  void Push(const std::vector<float>& g, const std::vector<double>& pulled, std::vector<double>* w) {
    for (int64_t i = 0; i < kParams; ++i) {
      double l = lambda;
      if (adaptive) {
        mean_square[i] = 0.95 * mean_square[i] + 0.05 * g[i] * g[i];
        l = lambda / std::sqrt(mean_square[i] + 1e-7);
      }
      const double corrected = g[i] + l * g[i] * g[i] * ((*w)[i] - pulled[i]);
      (*w)[i] -= kLr * corrected / 2;
    }
  }
};

// The largest |a - b| element by element.
double MaxAbsDiff(const std::vector<float>& a, const std::vector<double>& b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::abs(a[i] - b[i]));
  return d;
}

std::vector<float> Values(double base, double step) {
  std::vector<float> v(kParams);
  for (int64_t i = 0; i < kParams; ++i) v[i] = static_cast<float>(base + step * static_cast<double>(i % 16));
  return v;
}

TEST(DelayCompensationTrainTest, TheShardAppliesTheCorrectedGradientOfTheFormula) {
  for (bool adaptive : {false, true}) {
    SCOPED_TRACE(adaptive ? "adaptive, lambda0 0.05" : "constant, lambda 0.5");
    const float lambda = adaptive ? 0.05f : 0.5f;
    TransportContext ctx(2);
    OneShardJob job(ctx, ConsistencyMode::kAsp);
    ASSERT_TRUE(job.Start().ok());
    const std::vector<TensorInfo> layout = {{"w", {kParams}, 0, kParams, false}};
    auto w0 = std::move(PsClient::Create(ctx, job.table(), 0, layout, &job.worker(0))).value();
    auto w1 = std::move(PsClient::Create(ctx, job.table(), 1, layout, &job.worker(1))).value();
    const std::vector<float> init = Values(0.5, -0.05);
    const Status inited = w0->Init(DcJob(lambda, adaptive), init, 30);
    ASSERT_TRUE(inited.ok()) << inited;
    ASSERT_TRUE(job.InitBarrier().ok());
    auto pull = [](PsClient& c, int64_t clock, std::vector<float>* into) {
      auto id = c.Pull(clock, *into, {});
      return id.ok() ? c.Wait(*id, 30) : id.status();
    };
    auto push = [](PsClient& c, int64_t clock, const std::vector<float>& g) {
      auto id = c.Push(clock, g, {}, {});
      return id.ok() ? c.Wait(*id, 30) : id.status();
    };
    const std::vector<float> g0 = Values(1.0, 0.1), g1 = Values(2.0, -0.08), g2 = Values(-1.5, 0.05);
    DcReference ref{lambda, adaptive};
    std::vector<double> w(init.begin(), init.end());
    std::vector<float> p0(kParams), p1(kParams);

    ASSERT_TRUE(pull(*w0, 0, &p0).ok());
    ASSERT_TRUE(pull(*w1, 0, &p1).ok());
    const std::vector<double> pulled0(w);  // both workers' w_pulled
    ASSERT_EQ(p0, init);
    ASSERT_EQ(p1, init);

    ASSERT_TRUE(push(*w0, 0, g0).ok());
    ref.Push(g0, pulled0, &w);  // nothing to correct yet: w_now = w_pulled
    ASSERT_TRUE(pull(*w0, 1, &p0).ok());
    EXPECT_LE(MaxAbsDiff(p0, w), 1e-6) << "worker 0's own push, uncorrected";
    const std::vector<double> pulled1(w);  // worker 0's w_pulled from now on

    ASSERT_TRUE(push(*w1, 0, g1).ok());  // computed on v0, applied on v1
    ref.Push(g1, pulled0, &w);
    ASSERT_TRUE(push(*w0, 1, g2).ok());  // computed on v1, applied on v2
    ref.Push(g2, pulled1, &w);
    ASSERT_TRUE(pull(*w1, 1, &p1).ok());
    const double diff = MaxAbsDiff(p1, w);
    EXPECT_LE(diff, 1e-6) << "the shard did not apply g + lambda * g * g * (w_now - w_pulled): its parameters are "
                          << diff << " away from the formula's";
    // The corrections mattered: without them the parameters would be this far from the formula's.
    std::vector<double> plain(init.begin(), init.end());
    for (const auto* g : {&g0, &g1, &g2})
      for (int64_t i = 0; i < kParams; ++i) plain[i] -= kLr * (*g)[i] / 2;
    EXPECT_GT(MaxAbsDiff(p1, plain), 1e-3);

    const Status finished = job.Finish();
    EXPECT_TRUE(finished.ok()) << finished;
    const DelayCompensation* dc = job.server().delay_compensation();
    ASSERT_NE(dc, nullptr);
    EXPECT_EQ(dc->corrected(), 3);
    EXPECT_EQ(dc->uncorrected(), 0);
  }
}

}  // namespace
}  // namespace gradsync::testing
