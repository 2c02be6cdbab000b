// Uneven inputs: PS workers that run different numbers of steps (scheduler, shards and PsSync
// workers as threads over 127.0.0.1). A worker that ends early without leaving makes the pulls
// that need its pushes fail at once, naming it (not a hang); one that leaves (GradientSync::Leave,
// a frontend's join()) lets the others go on, bsp averaging each round over the pushes it got.
// Every worker pushes the constant gradient rank + 1, so the final parameters say exactly which
// pushes were applied and how.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <functional>
#include <optional>
#include <thread>
#include <vector>

#include "common/net/control/client/scheduler_client.h"
#include "common/net/transport.h"
#include "server/scheduler/scheduler.h"
#include "server/server.h"
#include "tests/support/ps_job.h"
#include "worker/ps/client/ps_client.h"
#include "worker/ps/ps_sync.h"

namespace gradsync::testing {
namespace {

using Clock = std::chrono::steady_clock;

struct WorkerPlan {
  int64_t steps = 0;
  bool leave = false;  // Leave instead of EndTraining
};

struct WorkerOutcome {
  Status status;               // the first failure (a step's, or the end's)
  int64_t failed_step = -1;    // the step whose BeginStep failed; -1: none did
  std::vector<float> params;   // after the end (evaluate: the final pull)
  Clock::time_point ended_at;  // when it called EndTraining / Leave
  Clock::time_point failed_at;
};

struct UnevenResult {
  std::vector<float> initial;
  std::vector<WorkerOutcome> workers;
  std::vector<float> shards;  // every shard's parameters, concatenated
  Status scheduler;
};

// before_end: called on each worker after its steps, before it ends (its error fails it).
using BeforeEnd = std::function<Status(int worker, PsClient* client, int64_t clock)>;

UnevenResult RunUneven(ConsistencyMode mode, int staleness, const std::vector<WorkerPlan>& plans, bool evaluate,
                       int num_servers = 2, const BeforeEnd& before_end = {}) {
  const int n = static_cast<int>(plans.size());
  UnevenResult result;
  result.workers.resize(plans.size());
  TransportContext ctx(2);
  SchedulerOptions so;
  so.num_servers = num_servers;
  so.num_workers = n;
  so.heartbeat_timeout_s = 10;
  so.register_timeout_s = 30;
  auto sched = std::move(Scheduler::Create(ctx, so)).value();
  const std::string endpoint = "tcp://127.0.0.1:" + std::to_string(sched->port());
  std::vector<std::unique_ptr<Server>> servers;
  for (int i = 0; i < num_servers; ++i) {
    ServerOptions opt;
    opt.link.scheduler_endpoint = endpoint;
    opt.rule.mode = mode;
    opt.rule.staleness = staleness;
    opt.link.requested_rank = i;
    opt.link.heartbeat_interval_s = 0.2;
    servers.push_back(std::move(Server::Create(ctx, opt)).value());
  }
  std::vector<std::thread> threads;
  threads.emplace_back([&] { result.scheduler = sched->Run(); });
  for (auto& s : servers) threads.emplace_back([srv = s.get()] { (void)srv->Run(); });
  ModelOptions mo = SmallMlp();
  {
    auto model = MakeTestModel(mo, false);
    model->Initialize(0);
    result.initial.assign(model->params().begin(), model->params().end());
  }
  for (int w = 0; w < n; ++w) {
    threads.emplace_back([&, w] {
      WorkerOutcome& out = result.workers[static_cast<size_t>(w)];
      SchedulerClientOptions sc = LoopbackClient(endpoint, wire::WORKER, w, ConsistencyModeName(mode),
                                                 mode == ConsistencyMode::kSsp ? staleness : 0);
      SchedulerClient client(ctx, sc);
      auto table = client.Register(30);
      if (!table.ok()) {
        out.status = table.status();
        return;
      }
      auto model = MakeTestModel(mo, false);
      model->Initialize(0);
      auto ps = std::move(PsClient::Create(ctx, *table, client.rank(), model->layout(), &client)).value();
      PsTrainOptions o;
      o.rank = client.rank();
      o.num_workers = n;
      o.request_timeout_s = 20;  // a regression that hangs fails in bounded time
      o.barrier_timeout_s = 30;
      o.evaluate = evaluate;
      PsSync sync(o, model.get(), ps.get(), &client);
      const WorkerPlan& plan = plans[static_cast<size_t>(w)];
      out.status = [&]() -> Status {
        ASSIGN_OR_RETURN(int64_t first, sync.Start({plan.steps, 1}));
        for (int64_t s = first; s < plan.steps; ++s) {
          StepPlan step;
          step.step = s;
          if (Status b = sync.BeginStep(step); !b.ok()) {
            out.failed_step = s;
            return b;
          }
          std::fill(model->grads().begin(), model->grads().end(), static_cast<float>(w + 1));
          RETURN_IF_ERROR(sync.FinishStep().status());
        }
        if (before_end) RETURN_IF_ERROR(before_end(w, ps.get(), plan.steps));
        out.ended_at = Clock::now();
        return plan.leave ? sync.Leave(evaluate) : sync.EndTraining(evaluate);
      }();
      if (!out.status.ok()) out.failed_at = Clock::now();
      out.params.assign(model->params().begin(), model->params().end());
      client.Finished(out.status);
      client.Flush(1);
    });
  }
  std::atomic<bool> done{false};
  std::thread watchdog([&] {
    const auto deadline = Clock::now() + std::chrono::seconds(90);
    while (!done.load() && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (!done.load()) {
      ADD_FAILURE() << "the job ran past its time bound";
      sched->Stop();
      for (auto& s : servers) s->Stop();
    }
  });
  for (auto& t : threads) t.join();
  done = true;
  watchdog.join();
  for (auto& s : servers) {
    auto p = s->params();
    result.shards.insert(result.shards.end(), p.begin(), p.end());
  }
  return result;
}

// Every parameter moved by exactly -lr * `sum` (the job's rate 0.1, constant).
void ExpectMovedBy(const std::vector<float>& params, const std::vector<float>& initial, double sum) {
  ASSERT_EQ(params.size(), initial.size());
  double worst = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    worst = std::max(worst, std::abs(static_cast<double>(params[i]) - (initial[i] - 0.1 * sum)));
  }
  EXPECT_LT(worst, 1e-4) << "expected every parameter moved by " << -0.1 * sum;
}

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

TEST(UnevenStepsTest, BspWithoutJoinTheWaitingWorkerFailsAtOnceNamingTheEarlyOne) {
  UnevenResult r = RunUneven(ConsistencyMode::kBsp, 0, {{6, false}, {4, false}}, /*evaluate=*/true);
  const WorkerOutcome& w0 = r.workers[0];
  ASSERT_FALSE(w0.status.ok());
  EXPECT_EQ(w0.status.code(), StatusCode::kFailedPrecondition) << w0.status;  // not recovered from
  EXPECT_EQ(w0.failed_step, 5);  // step 5 needs round 4, which needs worker 1's push of step 4
  const std::string& m = w0.status.message();
  EXPECT_NE(m.find("worker 1 ended training after 4 steps, but this worker's step 5 needs its push of step 4 (bsp)"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("call gradsync.torch.join() on a worker that runs out of data"), std::string::npos) << m;
  EXPECT_LT(Seconds(w0.failed_at - r.workers[1].ended_at), 5.0);  // the news is pushed, not timed out
  // Worker 1's pushes were all applied; it ends normally once worker 0 has failed.
  EXPECT_TRUE(r.workers[1].status.ok()) << r.workers[1].status;
  EXPECT_FALSE(r.scheduler.ok());  // the job failed (worker 0)
}

TEST(UnevenStepsTest, BspOneStepMoreFailsAtTheEndEvenWithoutEvaluation) {
  // Worker 0's last push (step 4) waits for worker 1's in its round, which never comes: it is
  // not applied, and worker 0 says so instead of ending as if it had been.
  UnevenResult r = RunUneven(ConsistencyMode::kBsp, 0, {{5, false}, {4, false}}, /*evaluate=*/false);
  const WorkerOutcome& w0 = r.workers[0];
  ASSERT_FALSE(w0.status.ok());
  EXPECT_EQ(w0.status.code(), StatusCode::kFailedPrecondition) << w0.status;
  EXPECT_EQ(w0.failed_step, -1);
  EXPECT_NE(w0.status.message().find("worker 1 ended training after 4 steps, but this worker ran 5: its push of step 4 "
                                     "waits for worker 1's in the same round (bsp) and can never be applied"),
            std::string::npos)
      << w0.status;
  EXPECT_NE(w0.status.message().find("gradsync.torch.join()"), std::string::npos);
  EXPECT_TRUE(r.workers[1].status.ok()) << r.workers[1].status;
}

TEST(UnevenStepsTest, SspZeroIsBspHere) {
  UnevenResult r = RunUneven(ConsistencyMode::kSsp, 0, {{5, false}, {3, false}}, /*evaluate=*/false);
  const WorkerOutcome& w0 = r.workers[0];
  ASSERT_FALSE(w0.status.ok());
  EXPECT_EQ(w0.failed_step, 4);  // step 4 needs round 3
  EXPECT_NE(w0.status.message().find("step 4 needs its push of step 3 (ssp with staleness 0)"), std::string::npos)
      << w0.status;
  r = RunUneven(ConsistencyMode::kSsp, 0, {{4, false}, {3, false}}, /*evaluate=*/false);
  EXPECT_NE(r.workers[0].status.message().find("its push of step 3 waits for worker 1's in the same round (ssp with "
                                               "staleness 0)"),
            std::string::npos)
      << r.workers[0].status;
}

TEST(UnevenStepsTest, OptimizerStateRequestsThatCanNeverBeServedFailToo) {
  // Worker 0 ran 5 steps, worker 1 4 without joining: reading or setting the optimizer state at
  // clock 5 waits for round 4, which never completes.
  Status read, set;
  auto before_end = [&](int w, PsClient* client, int64_t clock) -> Status {
    if (w != 0) return OkStatus();
    read = client->state().PullOptimizerState(clock, 20).status();
    OptimizerStateParts none;
    none.kind = "sgd";  // no momentum: no state vectors
    set = client->state().PushOptimizerState(clock, none, 20);
    return OkStatus();
  };
  UnevenResult r = RunUneven(ConsistencyMode::kBsp, 0, {{5, false}, {4, false}}, /*evaluate=*/false, 2, before_end);
  for (const Status& s : {read, set}) {
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s;
    EXPECT_NE(s.message().find("worker 1 ended training after 4 steps, but this worker's step 5 needs its push of step 4"),
              std::string::npos)
        << s;
  }
  EXPECT_FALSE(r.workers[0].status.ok());  // and its end says its last push was never applied
}

TEST(UnevenStepsTest, BspWithJoinTheOthersGoOnAndEveryRoundIsAveragedOverItsPushes) {
  UnevenResult r = RunUneven(ConsistencyMode::kBsp, 0, {{6, false}, {4, true}}, /*evaluate=*/true);
  for (const auto& w : r.workers) ASSERT_TRUE(w.status.ok()) << w.status;
  EXPECT_TRUE(r.scheduler.ok()) << r.scheduler;
  // Rounds 0-3: the mean of 1 and 2; rounds 4 and 5: worker 0's 1 alone.
  ExpectMovedBy(r.shards, r.initial, 4 * 1.5 + 2 * 1.0);
  // Both evaluate the final parameters: worker 1's final pull comes after worker 0's last round.
  EXPECT_EQ(r.workers[0].params, r.shards);
  EXPECT_EQ(r.workers[1].params, r.shards);
}

TEST(UnevenStepsTest, BspEveryWorkerMayJoin) {
  // Worker 0 leaves first with its push of the open round possibly still held: it is applied in
  // that round all the same.
  UnevenResult r = RunUneven(ConsistencyMode::kBsp, 0, {{3, true}, {5, true}}, /*evaluate=*/true);
  for (const auto& w : r.workers) ASSERT_TRUE(w.status.ok()) << w.status;
  ExpectMovedBy(r.shards, r.initial, 3 * 1.5 + 2 * 2.0);
  EXPECT_EQ(r.workers[0].params, r.shards);
  EXPECT_EQ(r.workers[1].params, r.shards);
}

TEST(UnevenStepsTest, SspWithoutJoinFailsOnlyPastTheBound) {
  UnevenResult r = RunUneven(ConsistencyMode::kSsp, 1, {{6, false}, {3, false}}, /*evaluate=*/true);
  const WorkerOutcome& w0 = r.workers[0];
  ASSERT_FALSE(w0.status.ok());
  EXPECT_EQ(w0.status.code(), StatusCode::kFailedPrecondition) << w0.status;
  EXPECT_EQ(w0.failed_step, 5);  // step 5 needs every worker at >= 4 pushes; worker 1 made 3
  EXPECT_NE(w0.status.message().find("worker 1 ended training after 3 steps, but this worker's step 5 needs its push "
                                     "of step 3 (ssp with staleness 1)"),
            std::string::npos)
      << w0.status;
  EXPECT_LT(Seconds(w0.failed_at - r.workers[1].ended_at), 5.0);
  EXPECT_TRUE(r.workers[1].status.ok()) << r.workers[1].status;
}

TEST(UnevenStepsTest, SspWithJoinEveryPushIsApplied) {
  UnevenResult r = RunUneven(ConsistencyMode::kSsp, 1, {{6, false}, {3, true}}, /*evaluate=*/true);
  for (const auto& w : r.workers) ASSERT_TRUE(w.status.ok()) << w.status;
  // ssp applies each push as g / N (N = 2 workers): 3 pushes of 2 and 6 of 1.
  ExpectMovedBy(r.shards, r.initial, (3 * 2.0 + 6 * 1.0) / 2);
  EXPECT_EQ(r.workers[0].params, r.shards);
  EXPECT_EQ(r.workers[1].params, r.shards);
}

TEST(UnevenStepsTest, AspNeverWaits) {
  UnevenResult r = RunUneven(ConsistencyMode::kAsp, 0, {{6, false}, {3, false}}, /*evaluate=*/true);
  for (const auto& w : r.workers) ASSERT_TRUE(w.status.ok()) << w.status;
  ExpectMovedBy(r.shards, r.initial, (3 * 2.0 + 6 * 1.0) / 2);
}

TEST(UnevenStepsTest, EvenStepsChangeNothing) {
  UnevenResult r = RunUneven(ConsistencyMode::kBsp, 0, {{4, false}, {4, false}, {4, false}}, /*evaluate=*/true, 1);
  for (const auto& w : r.workers) ASSERT_TRUE(w.status.ok()) << w.status;
  ExpectMovedBy(r.shards, r.initial, 4 * 2.0);
  EXPECT_TRUE(r.scheduler.ok()) << r.scheduler;
}

// A raw worker on the scheduler's socket (to see its ERROR replies), heartbeating while it waits.
class RawNode {
 public:
  RawNode(TransportContext& ctx, const std::string& endpoint)
      : socket_(std::move(Socket::ConnectDealer(ctx, endpoint, "scheduler")).value()) {}

  void Send(wire::Header h) {
    h.set_sender_role(wire::WORKER);
    ASSERT_TRUE(socket_.Send("", h).ok());
  }
  // The next message of `type` (others are skipped), or nullopt after timeout_s.
  std::optional<wire::Header> Await(wire::Type type, double timeout_s) {
    const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
    auto beat = Clock::now();
    while (Clock::now() < deadline) {
      if (Clock::now() >= beat) {
        wire::Header hb;
        hb.set_type(wire::HEARTBEAT);
        Send(hb);
        beat = Clock::now() + std::chrono::milliseconds(200);
      }
      auto m = socket_.Recv(20);
      if (m.ok() && m->malformed.ok() && m->header.type() == type) return m->header;
    }
    return std::nullopt;
  }

 private:
  Socket socket_;
};

bool Heard(const SchedulerClient& c, int rank, int64_t clock, bool joined, double timeout_s) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
  while (Clock::now() < deadline) {
    for (const EndedWorker& e : c.news().ended_workers()) {
      if (e.rank == rank && e.clock == clock && e.joined == joined) return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

TEST(UnevenStepsTest, TheSchedulerChecksRecordsAndRelaysTrainingEnded) {
  TransportContext ctx(1);
  SchedulerOptions so;
  so.num_servers = 1;
  so.num_workers = 2;
  so.heartbeat_timeout_s = 1.5;
  so.register_timeout_s = 20;
  auto sched = std::move(Scheduler::Create(ctx, so)).value();
  const std::string endpoint = "tcp://127.0.0.1:" + std::to_string(sched->port());
  std::thread st([&] { (void)sched->Run(); });
  auto options = [&](wire::Role role, int rank) {
    SchedulerClientOptions c = LoopbackClient(endpoint, role, rank, "bsp");
    c.self.set_port(role == wire::SERVER ? 1 : 0);
    return c;
  };
  // A stranger is refused before it registers.
  RawNode stranger(ctx, endpoint);
  wire::Header ended;
  ended.set_type(wire::TRAINING_ENDED);
  ended.mutable_control()->set_clock(3);
  stranger.Send(ended);
  auto refused = stranger.Await(wire::ERROR, 5);
  ASSERT_TRUE(refused.has_value());
  EXPECT_EQ(refused->error_code(), static_cast<int>(StatusCode::kFailedPrecondition)) << refused->error_message();

  auto server = std::make_unique<SchedulerClient>(ctx, options(wire::SERVER, 0));
  auto worker0 = std::make_unique<SchedulerClient>(ctx, options(wire::WORKER, 0));
  RawNode worker1(ctx, endpoint);
  wire::Header reg;
  reg.set_type(wire::REGISTER);
  reg.mutable_control()->mutable_node()->set_role(wire::WORKER);
  reg.mutable_control()->mutable_node()->set_host("127.0.0.1");
  reg.mutable_control()->mutable_node()->set_requested_rank(1);
  reg.mutable_control()->set_mode("bsp");
  worker1.Send(reg);
  std::thread reg_server([&] { ASSERT_TRUE(server->Register(20).ok()); });
  std::thread reg_worker([&] { ASSERT_TRUE(worker0->Register(20).ok()); });
  ASSERT_TRUE(worker1.Await(wire::REGISTER_REPLY, 20).has_value());
  reg_server.join();
  reg_worker.join();

  // A negative clock is refused; so is a server's TRAINING_ENDED. Neither is relayed.
  ended.mutable_control()->set_clock(-1);
  worker1.Send(ended);
  refused = worker1.Await(wire::ERROR, 5);
  ASSERT_TRUE(refused.has_value());
  EXPECT_EQ(refused->error_code(), static_cast<int>(StatusCode::kInvalidArgument)) << refused->error_message();
  server->TrainingEnded(2, false);
  // Worker 1 leaves after 7 steps: every node hears it (the sender too).
  ended.mutable_control()->set_clock(7);
  ended.mutable_control()->set_joined(true);
  worker1.Send(ended);
  auto relayed = worker1.Await(wire::TRAINING_ENDED, 5);
  ASSERT_TRUE(relayed.has_value());
  EXPECT_EQ(relayed->control().node().rank(), 1);
  EXPECT_EQ(relayed->control().clock(), 7);
  EXPECT_TRUE(relayed->control().joined());
  EXPECT_TRUE(Heard(*worker0, 1, 7, true, 5));
  EXPECT_TRUE(Heard(*server, 1, 7, true, 5));
  EXPECT_EQ(worker0->news().ended_workers().size(), 1u);  // the server's was refused
  EXPECT_EQ(server->news().ended_workers().size(), 1u);

  // A node that rejoins later hears it too: worker 0 goes silent, is declared dead, and a
  // restarted worker 0 takes its rank.
  worker0.reset();
  ASSERT_TRUE(worker1.Await(wire::NODE_DEAD, 10).has_value());
  SchedulerClient again(ctx, options(wire::WORKER, 0));
  ASSERT_TRUE(again.Register(20).ok());
  EXPECT_TRUE(again.rejoined());
  EXPECT_TRUE(Heard(again, 1, 7, true, 5));
  sched->Stop();
  st.join();
}

}  // namespace
}  // namespace gradsync::testing
