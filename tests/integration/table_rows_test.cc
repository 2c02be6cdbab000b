// Embedding-table rows on the shards over the wire (ARCHITECTURE.md, "Tables"): 2 servers and
// PsClients driven step by step (threads over 127.0.0.1). Each step a worker pulls the rows of
// the ids its batch reads (with the dense parameters, one Wait) and pushes their gradients (the
// push's last part to each shard). Mutations each test catches, by name:
//   BspRowsEqualOneTableStepping*: a round's row gradients applied per push instead of once, the
//     sum instead of the mean, rows summed in arrival order (bits differ run to run), a pulled
//     row scattered to another id's place, a row created at its initial value by a pull (memory),
//     the optimizer's per-row state lost between rounds.
//   AspOneWorkerAppliesEachPushAtOnce: the 1/N push scale wrong, a push's rows not applied when
//     its last part comes.
//   BadRowRequestsGetOneLineAndLoseNothing: an id past a fixed-size table, an unknown table, rows
//     that would pass a shard's bound taken in part (or crashing the shard), a refused push that
//     still counts; after each refusal the job goes on with every applied row intact.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>

#include "common/base/numeric/rng.h"
#include "common/net/control/client/scheduler_client.h"
#include "common/ps/ps_protocol.h"
#include "common/ps/table_wire.h"
#include "common/table/row_table.h"
#include "server/scheduler/scheduler.h"
#include "server/server.h"
#include "tests/support/ps_job.h"
#include "worker/ps/client/ps_client.h"

namespace gradsync {
namespace {

constexpr int64_t kDense = 64;
constexpr float kLr = 0.1f;
constexpr int kDim = 6;

std::vector<TensorInfo> Layout() { return {{"mlp.weight", {kDense}, 0, kDense, false}}; }

TableSpec Table(RowOptimizerKind kind, uint64_t num_ids = 0) {
  TableSpec t;
  t.name = "items";
  t.dim = kDim;
  t.num_ids = num_ids;
  t.init = {RowInit::Kind::kNormal, 0.5f};
  t.init_seed = 17;
  t.max_rows_per_shard = 10000;
  t.optimizer.kind = kind;
  return t;
}

wire::JobConfig Job(const std::vector<TableSpec>& tables, int workers) {
  wire::JobConfig job;
  auto* spec = job.add_tensors();
  spec->set_name("mlp.weight");
  spec->set_offset(0);
  spec->set_size(kDense);
  job.set_num_params(kDense);
  job.set_num_workers(workers);
  job.set_lr(kLr);
  job.set_lr_schedule("constant");
  SetJobOptimizer({}, &job);
  SetJobTables(tables, &job);
  return job;
}

// Worker w's ids at step c: a seeded draw over a few hundred ids, sorted and unique, overlapping
// the other worker's.
std::vector<uint64_t> Ids(int w, int64_t c) {
  Rng rng(Rng::Derive(5, static_cast<uint64_t>(w), static_cast<uint64_t>(c)));
  std::vector<uint64_t> ids;
  for (int i = 0; i < 40; ++i) ids.push_back(rng.UniformInt(300) * 1000003u);
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

// The row gradient of worker w at step c for a row it read: it depends on the row (so every
// step depends on the rows the last one left) and on the worker.
void RowGrads(int w, int64_t c, std::span<const uint64_t> ids, std::span<const float> rows,
              std::vector<float>* g) {
  g->resize(rows.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    for (int j = 0; j < kDim; ++j) {
      const size_t k = i * kDim + static_cast<size_t>(j);
      (*g)[k] = 0.3f * rows[k] +
                std::sin(0.7f * static_cast<float>(ids[i] % 97) + 0.3f * static_cast<float>(c) +
                         1.1f * static_cast<float>(w) + 0.2f * static_cast<float>(j));
    }
  }
}

struct RowJob {
  ConsistencyMode mode = ConsistencyMode::kBsp;
  int workers = 2;
  std::vector<TableSpec> tables;
  int64_t steps = 4;
  // Runs on worker 0 after its last step (the job still up): requests that must be refused.
  std::function<Status(PsClient&, int64_t clock)> after;
};

struct RowJobResult {
  Status status;
  std::vector<uint64_t> probe;  // every id any step read, and a few no step did
  std::vector<float> rows;      // worker 0's pull of `probe` after the last step
  Status after;                 // what `after` returned
};

RowJobResult RunRowJob(const RowJob& o) {
  RowJobResult result;
  for (int w = 0; w < o.workers; ++w) {
    for (int64_t c = 0; c < o.steps; ++c) {
      for (uint64_t id : Ids(w, c)) result.probe.push_back(id);
    }
  }
  for (uint64_t id = 1; id <= 5; ++id) result.probe.push_back(id * 7777777u + 1);  // never touched
  std::sort(result.probe.begin(), result.probe.end());
  result.probe.erase(std::unique(result.probe.begin(), result.probe.end()), result.probe.end());
  std::mutex mu;
  auto fail = [&](const Status& s) {
    std::lock_guard lock(mu);
    if (result.status.ok() && !s.ok()) result.status = s;
  };
  TransportContext ctx(2);
  SchedulerOptions so;
  so.num_servers = 2;
  so.num_workers = o.workers;
  so.heartbeat_timeout_s = 5;
  so.register_timeout_s = 30;
  auto sched = std::move(Scheduler::Create(ctx, so)).value();
  const std::string endpoint = "tcp://127.0.0.1:" + std::to_string(sched->port());
  const char* mode = o.mode == ConsistencyMode::kBsp ? "bsp" : "asp";
  std::vector<std::unique_ptr<Server>> servers;
  for (int i = 0; i < 2; ++i) {
    ServerOptions opt;
    opt.link.scheduler_endpoint = endpoint;
    opt.rule.mode = o.mode;
    opt.link.requested_rank = i;
    opt.link.heartbeat_interval_s = 0.2;
    opt.link.scheduler_timeout_s = 5;
    servers.push_back(std::move(Server::Create(ctx, opt)).value());
  }
  std::vector<std::thread> threads;
  threads.emplace_back([&] { fail(sched->Run().WithContext("scheduler")); });
  for (auto& s : servers)
    threads.emplace_back([&, srv = s.get()] { fail(srv->Run().WithContext("server")); });
  for (int w = 0; w < o.workers; ++w) {
    threads.emplace_back([&, w] {
      SchedulerClientOptions sc = testing::LoopbackClient(endpoint, wire::WORKER, w, mode);
      sc.scheduler_timeout_s = 5;
      SchedulerClient client(ctx, sc);
      Status st = [&]() -> Status {
        ASSIGN_OR_RETURN(wire::ClusterTable table, client.Register(30));
        ASSIGN_OR_RETURN(auto ps,
                         PsClient::Create(ctx, table, w, Layout(), &client, int64_t{1} << 20));
        if (w == 0)
          RETURN_IF_ERROR(ps->Init(Job(o.tables, o.workers), std::vector<float>(kDense, 0.0f), 30));
        RETURN_IF_ERROR(client.Barrier("init", "workers", 30));
        TablePlan plan(o.tables, 2);
        std::vector<float> params(kDense), rows, grads, dense(kDense, 0.01f);
        for (int64_t c = 0; c < o.steps; ++c) {
          const std::vector<std::vector<uint64_t>> ids = {Ids(w, c)};
          RETURN_IF_ERROR(plan.Set(ids));
          rows.assign(plan.floats(), NAN);
          ASSIGN_OR_RETURN(PsClient::RequestId pull, ps->Pull(c, params, {}, false, {&plan, rows}));
          RETURN_IF_ERROR(ps->Wait(pull, 30));
          RowGrads(w, c, ids[0], rows, &grads);
          ASSIGN_OR_RETURN(PsClient::RequestId push,
                           ps->Push(c, dense, {}, {}, NAN, {}, {}, {&plan, grads}));
          RETURN_IF_ERROR(ps->Wait(push, 30));
        }
        if (w == 0) {
          const std::vector<std::vector<uint64_t>> probe = {result.probe};
          RETURN_IF_ERROR(plan.Set(probe));
          std::vector<float> out(plan.floats(), NAN);
          ASSIGN_OR_RETURN(PsClient::RequestId pull,
                           ps->Pull(o.steps, params, {}, false, {&plan, out}));
          RETURN_IF_ERROR(ps->Wait(pull, 30));
          std::lock_guard lock(mu);
          result.rows = out;
          if (o.after) result.after = o.after(*ps, o.steps);
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
    while (!done.load() && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (!done.load()) {
      fail(DeadlineExceededError("the test job ran past its time bound"));
      sched->Stop();
      for (auto& s : servers) s->Stop();
    }
  });
  for (auto& t : threads) t.join();
  done = true;
  watchdog.join();
  return result;
}

// One process holding the whole table (shard 0 of 1) stepping as the job should: each step, the
// workers' gradients from the rows as they were, summed in worker order and applied once (bsp),
// or each applied at once (asp, one worker).
std::vector<float> Reference(const RowJob& o, const std::vector<uint64_t>& probe) {
  RowTable table(o.tables[0], 0, 1);
  std::vector<float> rows, grads;
  for (int64_t c = 0; c < o.steps; ++c) {
    std::vector<std::vector<float>> g(static_cast<size_t>(o.workers));
    for (int w = 0; w < o.workers; ++w) {
      const std::vector<uint64_t> ids = Ids(w, c);
      rows.resize(ids.size() * kDim);
      table.Read(ids, rows.data());
      RowGrads(w, c, ids, rows, &g[static_cast<size_t>(w)]);
    }
    if (o.mode == ConsistencyMode::kBsp) {
      for (int w = 0; w < o.workers; ++w)
        EXPECT_TRUE(table.Accumulate(Ids(w, c), g[static_cast<size_t>(w)].data()).ok());
      table.ApplyAccumulated(o.workers, kLr);
    } else {
      EXPECT_TRUE(table.Apply(Ids(0, c), g[0].data(), kLr, 1.0f, 1.0f).ok());
    }
  }
  std::vector<float> out(probe.size() * kDim);
  table.Read(probe, out.data());
  return out;
}

void ExpectSameRows(const RowJob& job) {
  const RowJobResult r = RunRowJob(job);
  ASSERT_TRUE(r.status.ok()) << r.status;
  const std::vector<float> want = Reference(job, r.probe);
  ASSERT_EQ(r.rows.size(), want.size());
  double worst = 0;
  size_t unlike = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double d = std::fabs(static_cast<double>(r.rows[i]) - want[i]);
    if (!(d == 0) && unlike < 3)
      ADD_FAILURE() << "probe " << i / kDim << " id " << r.probe[i / kDim] << ": " << r.rows[i]
                    << " vs " << want[i];
    unlike += !(d == 0);
    worst = std::max(worst, std::isnan(d) ? INFINITY : d);
  }
  EXPECT_EQ(std::memcmp(r.rows.data(), want.data(), want.size() * sizeof(float)), 0)
      << unlike << " of " << want.size()
      << " row values differ from one table stepping alike, by up to " << worst;
}

TEST(TableRowsTest, BspRowsEqualOneTableSteppingSgd) {
  RowJob job;
  job.tables = {Table(RowOptimizerKind::kSgd)};
  ExpectSameRows(job);
}

TEST(TableRowsTest, BspRowsEqualOneTableSteppingAdagradAndAdam) {
  for (auto kind : {RowOptimizerKind::kAdagrad, RowOptimizerKind::kAdam}) {
    RowJob job;
    job.tables = {Table(kind)};
    SCOPED_TRACE(RowOptimizerKindName(kind));
    ExpectSameRows(job);
  }
}

TEST(TableRowsTest, AspOneWorkerAppliesEachPushAtOnce) {
  RowJob job;
  job.mode = ConsistencyMode::kAsp;
  job.workers = 1;
  job.tables = {Table(RowOptimizerKind::kAdam)};
  ExpectSameRows(job);
}

TEST(TableRowsTest, BadRowRequestsGetOneLineAndLoseNothing) {
  RowJob job;
  job.workers = 1;
  TableSpec fixed = Table(RowOptimizerKind::kSgd, 400 * 1000003u);
  fixed.max_rows_per_shard = 1000;
  job.tables = {fixed};
  std::vector<std::string> errors;
  std::vector<float> before, after;
  job.after = [&](PsClient& ps, int64_t clock) -> Status {
    std::vector<float> params(kDense), dense(kDense, 0.0f);
    // A raw request naming an id past the table's end: refused with the table's name.
    TablePlan unchecked({Table(RowOptimizerKind::kSgd)}, 2);  // the same table, as if unbounded
    const std::vector<std::vector<uint64_t>> past = {{400 * 1000003u + 5}};
    RETURN_IF_ERROR(unchecked.Set(past));
    std::vector<float> rows(unchecked.floats());
    ASSIGN_OR_RETURN(auto id, ps.Pull(clock, params, {}, false, {&unchecked, rows}));
    errors.push_back(ps.Wait(id, 30).ToString());
    // Rows that would pass the bound of 1000 rows per shard: 3000 new ids, refused whole.
    std::vector<uint64_t> many;
    for (uint64_t i = 0; i < 3000; ++i) many.push_back(i * 131 + 7);
    std::sort(many.begin(), many.end());
    TablePlan plan({fixed}, 2);
    const std::vector<std::vector<uint64_t>> big = {many};
    RETURN_IF_ERROR(plan.Set(big));
    std::vector<float> grads(plan.floats(), 1.0f);
    ASSIGN_OR_RETURN(id, ps.Push(clock, dense, {}, {}, NAN, {}, {}, {&plan, grads}));
    errors.push_back(ps.Wait(id, 30).ToString());
    // The job goes on: the same clock's push of a few rows is taken, and the refused rows were
    // never applied.
    const std::vector<std::vector<uint64_t>> few = {{many[0], many[1]}};
    RETURN_IF_ERROR(plan.Set(few));
    before.assign(plan.floats(), NAN);
    ASSIGN_OR_RETURN(id, ps.Pull(clock, params, {}, false, {&plan, before}));
    RETURN_IF_ERROR(ps.Wait(id, 30));
    grads.assign(plan.floats(), 1.0f);
    ASSIGN_OR_RETURN(id, ps.Push(clock, dense, {}, {}, NAN, {}, {}, {&plan, grads}));
    RETURN_IF_ERROR(ps.Wait(id, 30));
    after.assign(plan.floats(), NAN);
    ASSIGN_OR_RETURN(id, ps.Pull(clock + 1, params, {}, false, {&plan, after}));
    return ps.Wait(id, 30);
  };
  const RowJobResult r = RunRowJob(job);
  ASSERT_TRUE(r.status.ok()) << r.status;
  ASSERT_TRUE(r.after.ok()) << r.after;
  ASSERT_EQ(errors.size(), 2u);
  EXPECT_NE(errors[0].find("table 'items'"), std::string::npos) << errors[0];
  EXPECT_NE(errors[0].find("outside [0, 400001200)"), std::string::npos) << errors[0];
  EXPECT_NE(errors[1].find("RESOURCE_EXHAUSTED"), std::string::npos) << errors[1];
  EXPECT_NE(errors[1].find("bound of 1000 rows per shard"), std::string::npos) << errors[1];
  TableSpec init = fixed;
  std::vector<float> initial(kDim);
  InitRow(init, 7, initial.data());  // many[0] = 7: untouched before, so at its initial value
  for (int j = 0; j < kDim; ++j) {
    EXPECT_EQ(before[static_cast<size_t>(j)], initial[static_cast<size_t>(j)])
        << "the refused push moved a row";
    EXPECT_FLOAT_EQ(after[static_cast<size_t>(j)], initial[static_cast<size_t>(j)] - kLr * 1.0f);
  }
}

}  // namespace
}  // namespace gradsync
