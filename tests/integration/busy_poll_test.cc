// A worker that polls for its replies before sleeping (PsClient::set_wait_policy, --busy-poll-ms)
// polls (its count of polls grows; a worker that does not poll counts none), still keeps its
// request timeout, polling longer than the timeout included, and takes a reply that comes while
// it polls. A bsp job of 1 server and 2 workers over 127.0.0.1: worker 0's pull of clock 1 is
// held until worker 1 pushes clock 0. The shared-memory all-reduce's barrier likewise polls only
// when asked (ShmGroup::set_wait_policy).
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "allreduce/shm/shm_group.h"
#include "common/net/control/client/scheduler_client.h"
#include "common/ps/ps_protocol.h"
#include "tests/support/ps_job.h"
#include "worker/ps/client/ps_client.h"

namespace gradsync {
namespace {

constexpr int64_t kParams = 1000;

std::vector<TensorInfo> Layout() { return {{"w", {kParams}, 0, kParams, false}}; }

double SecondsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

TEST(BusyPollTest, AWaitThatPollsKeepsItsTimeoutAndTakesTheReplyWhenItComes) {
  TransportContext ctx(2);
  testing::OneShardJob job(ctx);
  ASSERT_TRUE(job.Start().ok());
  auto w0 = std::move(PsClient::Create(ctx, job.table(), 0, Layout(), &job.worker(0))).value();
  auto w1 = std::move(PsClient::Create(ctx, job.table(), 1, Layout(), &job.worker(1))).value();
  w0->set_wait_policy({.busy_poll_ms = 1000, .pause_spins = 0, .min_polls = 0});  // longer than the timeouts below
  std::vector<float> p0(kParams, 1.0f), p1(kParams, 1.0f), g0(kParams, 1.0f), g1(kParams, 3.0f);
  const Status init = w0->Init(testing::OneTensorJob(kParams, 2, 0.1f), p0, 30);
  ASSERT_TRUE(init.ok()) << init;
  ASSERT_TRUE(job.InitBarrier().ok());

  auto push0 = w0->Push(0, g0, {}, {});
  ASSERT_TRUE(push0.ok()) << push0.status();
  ASSERT_TRUE(w0->Wait(*push0, 10).ok());
  auto pull = w0->Pull(1, p0, {});
  ASSERT_TRUE(pull.ok()) << pull.status();
  // Held by the round (worker 1 has not pushed): the wait ends at its timeout, not at the poll's end.
  auto start = std::chrono::steady_clock::now();
  Status held = w0->Wait(*pull, 0.3);
  EXPECT_EQ(held.code(), StatusCode::kDeadlineExceeded) << held;
  EXPECT_GE(SecondsSince(start), 0.29);
  EXPECT_LT(SecondsSince(start), 0.9);
  // It polled the whole 0.3 s rather than sleeping on the sockets.
  EXPECT_GT(w0->busy_polls(), 0) << "worker 0 polls for 1000 ms but its waits never polled";

  // The round completes while worker 0 polls: its pull is answered with the round's mean.
  auto again = w0->Pull(1, p0, {});
  ASSERT_TRUE(again.ok()) << again.status();
  std::thread pusher([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    auto push1 = w1->Push(0, g1, {}, {});
    EXPECT_TRUE(push1.ok() && w1->Wait(*push1, 10).ok());
  });
  start = std::chrono::steady_clock::now();
  Status answered = w0->Wait(*again, 10);
  pusher.join();
  EXPECT_TRUE(answered.ok()) << answered;
  EXPECT_LT(SecondsSince(start), 5.0);
  for (float v : p0) ASSERT_FLOAT_EQ(v, 1.0f - 0.1f * 2.0f);  // the mean of 1 and 3, at rate 0.1
  // Worker 1 was never asked to poll: its wait slept on the sockets at once.
  EXPECT_EQ(w1->busy_polls(), 0);

  const Status finished = job.Finish();
  EXPECT_TRUE(finished.ok()) << finished;
}

// Two members of a shared-memory group (threads of this process): member 1 reaches the
// all-reduce 50 ms after member 0, whose barrier waits for it. Asked to poll for longer than
// that, member 0 polls (yields in a loop) until member 1 is in; not asked, it takes its few
// yields and sleeps on the futex, and counts no poll. Both get the sum either way.
TEST(BusyPollTest, ASharedMemoryBarrierPollsOnlyWhenAsked) {
  for (double poll_ms : {0.0, 1000.0}) {
    SCOPED_TRACE("busy poll " + std::to_string(poll_ms) + " ms");
    auto created = ShmGroup::Create(2, 4096, 42);
    ASSERT_TRUE(created.ok()) << created.status();
    std::unique_ptr<ShmGroup> g0 = std::move(created).value();
    auto attached = ShmGroup::Attach(g0->name(), 2, 1, 4096, 42);
    ASSERT_TRUE(attached.ok()) << attached.status();
    std::unique_ptr<ShmGroup> g1 = std::move(attached).value();
    g0->Unpublish();
    g0->set_wait_policy({.busy_poll_ms = poll_ms, .pause_spins = 0, .min_polls = 0});
    const ShmGroup::Reducer sum = [](void* out, const void* in, size_t k) {
      for (size_t i = 0; i < k; ++i) static_cast<float*>(out)[i] += static_cast<const float*>(in)[i];
    };
    std::vector<float> a(100, 1.0f), b(100, 2.0f);
    Status late;
    std::thread member1([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      late = g1->AllReduce(b.data(), b.size(), sizeof(float), sum, 10);
    });
    const Status early = g0->AllReduce(a.data(), a.size(), sizeof(float), sum, 10);
    member1.join();
    ASSERT_TRUE(early.ok()) << early;
    ASSERT_TRUE(late.ok()) << late;
    for (size_t i = 0; i < a.size(); ++i) {
      ASSERT_EQ(a[i], 3.0f);
      ASSERT_EQ(b[i], 3.0f);
    }
    if (poll_ms > 0) {
      EXPECT_GT(g0->busy_polls(), 0u) << "member 0 polls for 1000 ms but its barrier never polled";
    } else {
      EXPECT_EQ(g0->busy_polls(), 0u);
    }
  }
}

}  // namespace
}  // namespace gradsync
