// The shards' optimizer state over the wire (STATE_PULL / STATE_PUSH; ARCHITECTURE.md, "Optimizer
// state"): a bsp job of 2 servers and 2 workers (PsClients driven step by step, threads over
// 127.0.0.1) read at a step and set in a fresh job goes on bit for bit as the uninterrupted job;
// a set is held to its quiescent point; the parameters set the same way (Horovod's resume order)
// resume bit for bit; state and parameter messages that cannot be right are refused one by one
// and change nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <mutex>
#include <optional>
#include <thread>

#include "common/net/control/client/scheduler_client.h"
#include "common/ps/ps_protocol.h"
#include "server/scheduler/scheduler.h"
#include "server/server.h"
#include "tests/support/ps_job.h"
#include "tests/support/wire_request.h"
#include "worker/ps/client/ps_client.h"

namespace gradsync {
namespace {

// Three tensors; with 2 shards the middle one spans both.
std::vector<TensorInfo> Layout() {
  return {{"a.weight", {40, 30}, 0, 1200, false}, {"b.weight", {1300}, 1200, 1300, false}, {"c.bias", {500}, 2500, 500, false}};
}
constexpr int64_t kParams = 3000;
constexpr float kLr = 0.05f;

std::vector<float> InitialParams() {
  std::vector<float> p(kParams);
  for (int64_t i = 0; i < kParams; ++i) p[static_cast<size_t>(i)] = std::cos(0.37f * static_cast<float>(i)) * 0.5f;
  return p;
}

// Worker w's gradient at global step `step` (a job resumed at step K calls its clock 0 step K):
// a quadratic pull toward 0 plus a worker- and step-dependent term, so every step depends on the
// parameters it was computed on.
void Gradient(int w, int64_t step, std::span<const float> params, std::vector<float>* g) {
  g->resize(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    (*g)[i] = 0.5f * params[i] + std::sin(0.001f * static_cast<float>(i) + 0.37f * static_cast<float>(step) +
                                          1.3f * static_cast<float>(w));
  }
}

wire::JobConfig Job(const OptimizerOptions& optimizer) {
  wire::JobConfig job;
  for (const auto& t : Layout()) {
    auto* spec = job.add_tensors();
    spec->set_name(t.name);
    spec->set_offset(static_cast<uint64_t>(t.offset));
    spec->set_size(static_cast<uint64_t>(t.size));
    for (const int64_t d : t.shape) spec->add_shape(d);
  }
  job.set_num_params(kParams);
  job.set_num_workers(2);
  job.set_lr(kLr);
  job.set_lr_schedule("constant");
  SetJobOptimizer(optimizer, &job);
  return job;
}

struct StateJob {
  OptimizerOptions optimizer;
  int replicas = 1;
  std::vector<float> init = InitialParams();
  int64_t steps = 0;       // each worker's pushes
  int64_t first_step = 0;  // the global step of clock 0
  // Worker 0 sets this state at clock set_at (before that clock's pull), if any.
  std::optional<OptimizerStateParts> set_state;
  int64_t set_at = 0;
  // Worker 0 sets the shards' parameters to these at clock set_at (after the state), if any.
  std::optional<std::vector<float>> set_params;
  // Worker 0 reads the state at this clock (before that clock's pull; `steps`: after the last
  // push), -1: never.
  int64_t read_at = -1;
  // Worker 1 sleeps this long before its push of clock delay_at (the shards' round waits for it).
  double delay_ms = 0;
  int64_t delay_at = -1;
};

struct StateJobResult {
  Status status;
  std::vector<float> params;      // worker 0's pull at clock `steps`
  std::vector<float> read_params;  // worker 0's pull at clock read_at
  std::optional<OptimizerStateParts> state;
  std::vector<ServerStats> stats;
};

StateJobResult RunStateJob(const StateJob& o) {
  StateJobResult result;
  std::mutex mu;
  auto fail = [&](const Status& s) {
    std::lock_guard lock(mu);
    if (result.status.ok() && !s.ok()) result.status = s;
  };
  TransportContext ctx(2);
  SchedulerOptions so;
  so.num_servers = 2;
  so.num_workers = 2;
  so.heartbeat_timeout_s = 5;
  so.register_timeout_s = 30;
  so.replicas = o.replicas;
  auto sched = std::move(Scheduler::Create(ctx, so)).value();
  const std::string endpoint = "tcp://127.0.0.1:" + std::to_string(sched->port());
  std::vector<std::unique_ptr<Server>> servers;
  for (int i = 0; i < 2; ++i) {
    ServerOptions opt;
    opt.link.scheduler_endpoint = endpoint;
    opt.rule.mode = ConsistencyMode::kBsp;
    opt.link.requested_rank = i;
    opt.link.heartbeat_interval_s = 0.2;
    opt.link.scheduler_timeout_s = 5;
    servers.push_back(std::move(Server::Create(ctx, opt)).value());
  }
  std::vector<std::thread> threads;
  threads.emplace_back([&] { fail(sched->Run().WithContext("scheduler")); });
  for (auto& s : servers) threads.emplace_back([&, srv = s.get()] { fail(srv->Run().WithContext("server")); });
  for (int w = 0; w < 2; ++w) {
    threads.emplace_back([&, w] {
      SchedulerClientOptions sc = testing::LoopbackClient(endpoint, wire::WORKER, w, "bsp");
      sc.scheduler_timeout_s = 5;
      SchedulerClient client(ctx, sc);
      Status st = [&]() -> Status {
        ASSIGN_OR_RETURN(wire::ClusterTable table, client.Register(30));
        ASSIGN_OR_RETURN(auto ps, PsClient::Create(ctx, table, w, Layout(), &client));
        if (w == 0) RETURN_IF_ERROR(ps->Init(Job(o.optimizer), o.init, 30));
        RETURN_IF_ERROR(client.Barrier("init", "workers", 30));
        std::vector<float> params(kParams), grads;
        for (int64_t c = 0; c <= o.steps; ++c) {
          // Both before this clock's pull: the shards hold them as they would hold that pull.
          if (w == 0 && o.set_state && c == o.set_at) RETURN_IF_ERROR(ps->state().PushOptimizerState(c, *o.set_state, 30));
          if (o.set_params && c == o.set_at) {
            // As broadcast_parameters does: no worker pulls (or pushes) before the shards hold them.
            if (w == 0) RETURN_IF_ERROR(ps->state().PushParameters(c, *o.set_params, 30));
            RETURN_IF_ERROR(client.Barrier("parameters set", "workers", 30));
          }
          std::optional<OptimizerStateParts> state;
          if (w == 0 && c == o.read_at) {
            ASSIGN_OR_RETURN(state, ps->state().PullOptimizerState(c, 30, OptimizerKindName(o.optimizer.kind)));
          }
          ASSIGN_OR_RETURN(PsClient::RequestId pull, ps->Pull(c, params, {}));
          RETURN_IF_ERROR(ps->Wait(pull, 30));
          if (state) {
            std::lock_guard lock(mu);
            result.state = std::move(state);
            result.read_params = params;
          }
          if (c == o.steps) break;
          Gradient(w, o.first_step + c, params, &grads);
          if (w == 1 && c == o.delay_at) std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(o.delay_ms));
          ASSIGN_OR_RETURN(PsClient::RequestId push, ps->Push(c, grads, {}, {}, kLr));
          RETURN_IF_ERROR(ps->Wait(push, 30));
        }
        if (w == 0) {
          std::lock_guard lock(mu);
          result.params = params;
        }
        return client.Barrier("trained", "workers", 30);
      }();
      fail(st.WithContext("worker " + std::to_string(w)));
      client.Finished(st);
      client.Flush(1);
    });
  }
  std::atomic<bool> done{false};
  std::thread watchdog([&] {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(90);
    while (!done.load() && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (!done.load()) {
      fail(DeadlineExceededError("the test job ran past its time bound"));
      sched->Stop();
      for (auto& s : servers) s->Stop();
    }
  });
  for (auto& t : threads) t.join();
  done = true;
  watchdog.join();
  for (auto& s : servers) result.stats.push_back(s->stats());
  return result;
}

// A job of `steps` steps that reads the shards' state (and worker 0's parameters) at clock `at`.
StateJob Uninterrupted(const OptimizerOptions& optimizer, int64_t steps, int64_t at) {
  StateJob job;
  job.optimizer = optimizer;
  job.steps = steps;
  job.read_at = at;
  return job;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

bool SameState(const OptimizerStateParts& a, const OptimizerStateParts& b) {
  if (a.kind != b.kind || a.steps != b.steps || a.slots.size() != b.slots.size()) return false;
  for (size_t k = 0; k < a.slots.size(); ++k) {
    if (a.slots[k].size() != b.slots[k].size()) return false;
    for (size_t t = 0; t < a.slots[k].size(); ++t)
      if (!SameBits(a.slots[k][t], b.slots[k][t])) return false;
  }
  return true;
}

struct Case {
  std::string name;
  OptimizerOptions optimizer;
  int replicas;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class ResumeTest : public ::testing::TestWithParam<Case> {};

// The job checkpointed at step K (worker 0's pull of clock K and the state read there) and set in
// a fresh job goes on bit for bit as the job that never stopped; the state read is the same
// whenever the other worker's push of the round comes.
TEST_P(ResumeTest, AFreshJobGivenTheStateGoesOnBitForBit) {
  constexpr int64_t kSteps = 6, kAt = 3;
  const OptimizerOptions opt = GetParam().optimizer;
  const size_t slots = OptimizerSlotNames(opt).size();

  const StateJob whole = Uninterrupted(opt, kSteps, kAt);
  const StateJobResult a = RunStateJob(whole);
  ASSERT_TRUE(a.status.ok()) << a.status;
  ASSERT_TRUE(a.state.has_value());
  EXPECT_EQ(a.state->kind, OptimizerKindName(opt.kind));
  EXPECT_EQ(a.state->steps, kAt);  // one optimizer step per bsp round
  ASSERT_EQ(a.state->slots.size(), slots);
  for (const auto& tensors : a.state->slots) {
    ASSERT_EQ(tensors.size(), Layout().size());
    for (size_t t = 0; t < tensors.size(); ++t) {
      EXPECT_EQ(static_cast<int64_t>(tensors[t].size()), Layout()[t].size);
      EXPECT_TRUE(std::any_of(tensors[t].begin(), tensors[t].end(), [](float v) { return v != 0.0f; }));
    }
  }

  // The first half; worker 1 is late with the push of the last round: the state is read only once
  // that round is applied (the read is held like a pull of its clock).
  StateJob first = whole;
  first.steps = kAt;
  first.delay_ms = 300;
  first.delay_at = kAt - 1;
  const StateJobResult b = RunStateJob(first);
  ASSERT_TRUE(b.status.ok()) << b.status;
  ASSERT_TRUE(b.state.has_value());
  EXPECT_TRUE(SameState(*b.state, *a.state)) << "the state read at step " << kAt << " differs between the runs";
  EXPECT_TRUE(SameBits(b.params, a.read_params));

  // The second half, from the parameters and the state of the first.
  StateJob rest;
  rest.optimizer = opt;
  rest.replicas = GetParam().replicas;
  rest.init = b.params;
  rest.first_step = kAt;
  rest.steps = kSteps - kAt;
  rest.set_state = b.state;
  rest.read_at = kSteps - kAt;
  const StateJobResult c = RunStateJob(rest);
  ASSERT_TRUE(c.status.ok()) << c.status;
  EXPECT_TRUE(SameBits(c.params, a.params)) << "the resumed job's parameters differ from the job that never stopped";
  ASSERT_TRUE(c.state.has_value());
  EXPECT_EQ(c.state->steps, kSteps);
  for (const ServerStats& s : c.stats) {
    EXPECT_EQ(s.state.state_sets, 1);
    EXPECT_EQ(s.requests.rejected, 0) << "a shard (or a backup, for a state entry) refused a message";
    if (GetParam().replicas > 1) {
      EXPECT_GT(s.replication.replica_entries, 0);
    }
  }

  // Without the state (a fresh optimizer) the resumed job would not be the same: the test sees it.
  StateJob forgetful = rest;
  forgetful.set_state.reset();
  const StateJobResult d = RunStateJob(forgetful);
  ASSERT_TRUE(d.status.ok()) << d.status;
  EXPECT_FALSE(SameBits(d.params, a.params));
}

// Horovod's resume order on the shards: the fresh job starts from other parameters (its own
// initialization), and worker 0 sets the checkpoint's parameters and state at clock 0, before
// any push: it goes on bit for bit as the job that never stopped. With backups, the set reaches
// them (a REPLICA_OPTIMIZER entry with the parameters) and nothing is refused.
TEST_P(ResumeTest, AFreshJobGivenTheParametersAfterItStartedGoesOnBitForBit) {
  constexpr int64_t kSteps = 5, kAt = 2;
  const StateJob whole = Uninterrupted(GetParam().optimizer, kSteps, kAt);
  const StateJobResult a = RunStateJob(whole);
  ASSERT_TRUE(a.status.ok()) << a.status;
  ASSERT_TRUE(a.state.has_value());

  StateJob rest;
  rest.optimizer = GetParam().optimizer;
  rest.replicas = GetParam().replicas;
  rest.init = std::vector<float>(kParams, 0.125f);  // what the fresh job's model started from
  rest.first_step = kAt;
  rest.steps = kSteps - kAt;
  rest.set_state = a.state;
  rest.set_params = a.read_params;
  const StateJobResult c = RunStateJob(rest);
  ASSERT_TRUE(c.status.ok()) << c.status;
  EXPECT_TRUE(SameBits(c.params, a.params)) << "the resumed job's parameters differ from the job that never stopped";
  for (const ServerStats& s : c.stats) {
    EXPECT_EQ(s.state.params_sets, 1);
    EXPECT_EQ(s.requests.rejected, 0) << "a shard (or a backup, for the parameters' entry) refused a message";
  }

  // Without the parameter set, the fresh job goes on from its own initialization: the test sees it.
  StateJob unset = rest;
  unset.set_params.reset();
  const StateJobResult d = RunStateJob(unset);
  ASSERT_TRUE(d.status.ok()) << d.status;
  EXPECT_FALSE(SameBits(d.params, a.params));
}

// A set at a later clock is held until the round before it is applied (worker 1 is late with its
// push of that round): setting the state a job already has at step K changes nothing.
TEST_P(ResumeTest, ASetIsHeldUntilTheRoundBeforeItIsApplied) {
  constexpr int64_t kSteps = 5, kAt = 3;
  const StateJob whole = Uninterrupted(GetParam().optimizer, kSteps, kAt);
  const StateJobResult a = RunStateJob(whole);
  ASSERT_TRUE(a.status.ok()) << a.status;
  ASSERT_TRUE(a.state.has_value());
  StateJob again = whole;
  again.replicas = GetParam().replicas;
  again.read_at = -1;
  again.set_state = a.state;
  again.set_at = kAt;
  again.delay_ms = 300;
  again.delay_at = kAt - 1;
  const StateJobResult b = RunStateJob(again);
  ASSERT_TRUE(b.status.ok()) << b.status;
  EXPECT_TRUE(SameBits(b.params, a.params)) << "the state was set before the round it follows was applied";
}

OptimizerOptions Sgd() {
  OptimizerOptions o;
  o.momentum = 0.9f;
  o.nesterov = true;
  o.weight_decay = 1e-3f;
  return o;
}

OptimizerOptions Adam() {
  OptimizerOptions o;
  o.kind = OptimizerKind::kAdam;
  o.weight_decay = 1e-3f;
  return o;
}

INSTANTIATE_TEST_SUITE_P(Optimizers, ResumeTest,
                         ::testing::Values(Case{"SgdNesterov", Sgd(), 1}, Case{"Adam", Adam(), 1},
                                           Case{"AdamWithBackups", Adam(), 2}),
                         [](const auto& p) { return p.param.name; });

// --- Validation: a raw peer speaks for worker 1 ---

zmq::message_t Floats(const std::vector<float>& v) { return zmq::message_t(v.data(), v.size() * sizeof(float)); }

TEST(OptimizerStateMessagesTest, BadOnesAreRefusedOneByOneAndChangeNothing) {
  TransportContext ctx(2);
  testing::OneShardJob job(ctx);
  ASSERT_TRUE(job.Start().ok());
  Server* server = &job.server();
  const auto n = static_cast<size_t>(kParams);  // one shard holds everything
  // Worker 0: a real client. Worker 1: raw messages.
  auto ps = std::move(PsClient::Create(ctx, job.table(), 0, Layout(), &job.worker(0))).value();
  ASSERT_TRUE(ps->Init(Job(Adam()), InitialParams(), 30).ok());
  ASSERT_TRUE(job.InitBarrier().ok());

  zmq::socket_t s(ctx, zmq::socket_type::dealer);
  s.set(zmq::sockopt::linger, 0);
  s.connect("tcp://127.0.0.1:" + std::to_string(server->port()));
  uint64_t id = 100;
  // The vectors of one set share their request's id (`set`: that id; 0: a new one).
  auto send = [&](wire::Header h, const std::vector<float>* values, uint64_t set = 0) {
    h.set_request_id(set != 0 ? set : ++id);
    if (values) h.set_has_values(true);
    std::string bytes;
    h.SerializeToString(&bytes);
    s.send(zmq::message_t(bytes.data(), bytes.size()), values ? zmq::send_flags::sndmore : zmq::send_flags::none);
    if (values) s.send(Floats(*values), zmq::send_flags::none);
  };
  struct Reply {
    wire::Header header;
    std::vector<float> values;
  };
  auto receive = [&]() -> std::optional<Reply> {
    zmq::pollitem_t item{static_cast<void*>(s), 0, ZMQ_POLLIN, 0};
    if (zmq::poll(&item, 1, std::chrono::milliseconds(5000)) == 0) return std::nullopt;
    std::vector<zmq::message_t> parts;
    zmq::message_t part;
    do {
      (void)s.recv(part);
      parts.push_back(std::move(part));
    } while (s.get(zmq::sockopt::rcvmore));
    Reply r;
    EXPECT_TRUE(r.header.ParseFromArray(parts[0].data(), static_cast<int>(parts[0].size())));
    if (parts.size() > 1) {
      r.values.resize(parts.back().size() / sizeof(float));
      std::memcpy(r.values.data(), parts.back().data(), parts.back().size());
    }
    return r;
  };
  auto state_pull = [&](int64_t clock, const std::string& kind) {
    wire::Header h = testing::WorkerRequest(wire::STATE_PULL, 1, clock, 0, n);
    if (!kind.empty()) h.mutable_ps()->mutable_state()->set_optimizer(kind);
    return h;
  };
  auto state_push = [&](int slot, int64_t steps) {
    wire::Header h = testing::WorkerRequest(wire::STATE_PUSH, 1, 0, 0, n);
    h.mutable_ps()->mutable_state()->set_optimizer("adam");
    h.mutable_ps()->mutable_state()->set_steps(steps);
    h.mutable_ps()->mutable_state()->set_slots(2);
    h.mutable_ps()->mutable_state()->set_slot(slot);
    return h;
  };
  // Each bad message is answered with exactly one ERROR whose message says `why`.
  int refused = 0;
  auto expect_error = [&](const char* why) {
    auto r = receive();
    ASSERT_TRUE(r.has_value()) << "no answer (" << why << ")";
    EXPECT_EQ(r->header.type(), wire::ERROR) << why;
    EXPECT_NE(r->header.error_message().find(why), std::string::npos) << r->header.error_message();
    ++refused;
  };

  // A valid pull first (it binds this connection to worker 1): zeros, no step taken, 2 vectors.
  send(state_pull(0, "adam"), nullptr);
  for (int k = 0; k < 2; ++k) {
    auto r = receive();
    ASSERT_TRUE(r.has_value());
    ASSERT_EQ(r->header.type(), wire::STATE_PULL_REPLY) << r->header.error_message();
    EXPECT_EQ(r->header.ps().state().slot(), k);
    EXPECT_EQ(r->header.ps().state().slots(), 2);
    EXPECT_EQ(r->header.ps().state().optimizer(), "adam");
    EXPECT_EQ(r->header.ps().state().steps(), 0);
    EXPECT_EQ(r->values, std::vector<float>(n, 0.0f));
  }

  const std::vector<float> m(n, 0.25f), v(n, 0.5f);
  std::vector<float> nan = v, negative = v, short_one(n - 1, 0.5f);
  nan[7] = NAN;
  negative[11] = -1.0f;
  send(state_pull(0, "sgd"), nullptr);
  expect_error("this shard's optimizer is adam");
  {
    wire::Header h = state_pull(0, "adam");
    h.mutable_segments(0)->set_length(n - 1);
    send(h, nullptr);
    expect_error("covers exactly this shard's range");
  }
  send(state_pull(4, "adam"), nullptr);
  expect_error("clock");
  {
    wire::Header h = state_pull(0, "adam");
    h.mutable_ps()->mutable_state()->set_steps(3);
    send(h, nullptr);
    expect_error("names an optimizer at most");
  }
  {
    wire::Header h = testing::WorkerRequest(wire::PULL, 1, 0, 0, n);
    h.mutable_ps()->mutable_state()->set_slots(1);
    send(h, nullptr);
    expect_error("belong on STATE_PULL");
  }
  {
    wire::Header h = state_push(0, 3);
    h.mutable_ps()->mutable_state()->set_optimizer("rmsprop");
    send(h, &m);
    expect_error("optimizer must be");
  }
  {
    wire::Header h = state_push(0, 3);
    h.mutable_ps()->mutable_state()->set_slots(1);
    send(h, &m);
    expect_error("keeps 2 (exp_avg, exp_avg_sq)");
  }
  {
    wire::Header h = state_push(2, 3);
    send(h, &m);
    expect_error("vector 2 of 2");
  }
  send(state_push(0, -1), &m);
  expect_error("out of range");
  send(state_push(0, 3), nullptr);
  expect_error("carries its state vector");
  {
    wire::Header h = state_push(0, 3);
    h.mutable_segments(0)->set_length(n - 1);
    send(h, &short_one);
    expect_error("covers exactly this shard's range");
  }
  send(state_push(1, 3), &v);  // vector 1 without vector 0
  expect_error("not the next");
  // Vector 0 is held (answered), then a bad vector 1 drops the whole set.
  send(state_push(0, 3), &m, 500);
  {
    auto r = receive();
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->header.type(), wire::STATE_PUSH_REPLY) << r->header.error_message();
  }
  send(state_push(1, 3), &negative, 500);
  expect_error("negative second moment");
  send(state_push(1, 3), &v, 500);  // the set is gone: this is no one's vector 1
  expect_error("not the next");
  send(state_push(0, 3), &nan);
  expect_error("NaN");
  send(state_push(0, 3), &m, 501);
  {
    auto r = receive();
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->header.type(), wire::STATE_PUSH_REPLY) << r->header.error_message();
  }
  send(state_push(1, 4), &v, 501);  // another step count than its vector 0's
  expect_error("not the next");
  send(state_push(0, 3), &m, 502);
  {
    auto r = receive();
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->header.type(), wire::STATE_PUSH_REPLY) << r->header.error_message();
  }
  send(state_push(1, 3), &v, 503);  // another request's
  expect_error("not the next");

  // Nothing of it changed the shard.
  auto unchanged = ps->state().PullOptimizerState(0, 30, "adam");
  ASSERT_TRUE(unchanged.ok()) << unchanged.status();
  EXPECT_EQ(unchanged->steps, 0);
  for (const auto& tensors : unchanged->slots)
    for (const auto& t : tensors) EXPECT_TRUE(std::all_of(t.begin(), t.end(), [](float x) { return x == 0.0f; }));
  EXPECT_EQ(server->stats().state.state_sets, 0);

  // A whole set: two answers, the second once the state is set; then every worker reads it.
  send(state_push(0, 3), &m, 504);
  send(state_push(1, 3), &v, 504);
  for (int k = 0; k < 2; ++k) {
    auto r = receive();
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->header.type(), wire::STATE_PUSH_REPLY) << r->header.error_message();
    EXPECT_EQ(r->header.ps().state().slot(), k);
  }
  auto set = ps->state().PullOptimizerState(0, 30, "");
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_EQ(set->kind, "adam");
  EXPECT_EQ(set->steps, 3);
  ASSERT_EQ(set->slots.size(), 2u);
  for (size_t t = 0; t < Layout().size(); ++t) {
    EXPECT_EQ(set->slots[0][t], std::vector<float>(static_cast<size_t>(Layout()[t].size), 0.25f));
    EXPECT_EQ(set->slots[1][t], std::vector<float>(static_cast<size_t>(Layout()[t].size), 0.5f));
  }
  // The client refuses a state that does not fit the layout before sending anything.
  OptimizerStateParts wrong = *set;
  wrong.slots[1][2].pop_back();
  EXPECT_EQ(ps->state().PushOptimizerState(0, wrong, 30).code(), StatusCode::kInvalidArgument);
  wrong = *set;
  wrong.kind = "sgd";  // the shard's answer: another optimizer's state
  EXPECT_EQ(ps->state().PushOptimizerState(0, wrong, 30).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ps->state().PullOptimizerState(0, 30, "sgd").status().code(), StatusCode::kInvalidArgument);

  // Parameter sets (STATE_PUSH with params): bad ones refused, each with one ERROR, nothing set.
  auto params_push = [&]() {
    wire::Header h = testing::WorkerRequest(wire::STATE_PUSH, 1, 0, 0, n);
    h.mutable_ps()->mutable_state()->set_params(true);
    return h;
  };
  const std::vector<float> before = [&] {
    std::vector<float> p(n);
    auto pull = ps->Pull(0, p, {});
    EXPECT_TRUE(pull.ok() && ps->Wait(*pull, 30).ok());
    return p;
  }();
  std::vector<float> new_params(n, 0.75f), nan_params(n, 0.75f), short_params(n - 1, 0.75f);
  nan_params[13] = NAN;
  send(params_push(), &nan_params);
  expect_error("not finite");
  send(params_push(), nullptr);
  expect_error("carries its state vector");
  {
    wire::Header h = params_push();
    h.mutable_segments(0)->set_length(n - 1);
    send(h, &short_params);
    expect_error("covers exactly this shard's range");
  }
  {
    wire::Header h = params_push();
    h.mutable_ps()->mutable_state()->set_optimizer("adam");
    send(h, &new_params);
    expect_error("carries no optimizer state fields");
  }
  {
    wire::Header h = state_pull(0, "");
    h.mutable_ps()->mutable_state()->set_params(true);
    send(h, nullptr);
    expect_error("set with STATE_PUSH");
  }
  EXPECT_EQ(ps->state().PushParameters(0, short_params, 30).code(), StatusCode::kInvalidArgument);  // nothing sent
  EXPECT_EQ(ps->state().PushParameters(0, std::vector<float>(kParams, NAN), 30).code(), StatusCode::kInvalidArgument);
  {
    std::vector<float> p(n);
    auto pull = ps->Pull(0, p, {});
    ASSERT_TRUE(pull.ok() && ps->Wait(*pull, 30).ok());
    EXPECT_TRUE(SameBits(p, before)) << "a refused parameter set changed the shard";
  }
  // A good one: answered once set; the optimizer state stays as it was set above.
  send(params_push(), &new_params);
  {
    auto r = receive();
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->header.type(), wire::STATE_PUSH_REPLY) << r->header.error_message();
    EXPECT_TRUE(r->header.ps().state().params());
  }
  {
    std::vector<float> p(n);
    auto pull = ps->Pull(0, p, {});
    ASSERT_TRUE(pull.ok() && ps->Wait(*pull, 30).ok());
    EXPECT_EQ(p, new_params);
    auto kept = ps->state().PullOptimizerState(0, 30, "adam");
    ASSERT_TRUE(kept.ok()) << kept.status();
    EXPECT_EQ(kept->steps, 3);
  }

  // No other answer is due.
  zmq::pollitem_t item{static_cast<void*>(s), 0, ZMQ_POLLIN, 0};
  EXPECT_EQ(zmq::poll(&item, 1, std::chrono::milliseconds(300)), 0) << "a message got more than one answer";
  EXPECT_EQ(server->stats().state.state_sets, 1);
  EXPECT_EQ(server->stats().state.params_sets, 1);
  EXPECT_EQ(server->stats().requests.rejected, refused + 3);  // and the client's refused set (2 vectors) and pull

  const Status finished = job.Finish();
  EXPECT_TRUE(finished.ok()) << finished;
}

}  // namespace
}  // namespace gradsync
