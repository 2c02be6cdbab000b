// Models with embedding tables trained over the servers and in all-reduce mode (ARCHITECTURE.md,
// "Tables"): the DLRM-style model on the click log, through the same loop and syncs as every model.
// Mutations each test catches, by name:
// Equivalence: bsp over 2 servers x 2 workers, and all-reduce over 2 workers, against one process
// on the global batch, dense parameters by MaxRelativeDiff (floor 1e-3) and each table's rows by
// their largest difference over their largest value, both within 1e-5.
//   BspDlrmEqualsOneProcessOnTheGlobalBatch*: a round's row gradients applied per push or summed
//     instead of averaged, rows pulled for another clock, a worker's rows scattered to other ids,
//     dense and row updates at different rates or steps, the local tables stepping otherwise.
//   BspSparseLogRegEqualsOneProcessOnTheGlobalBatch: sparse_logreg's keys read as other rows, its
//     row gradients not scaled as the mean loss's, the rows' SGD not the local run's.
//   AllreduceDlrmEqualsOneProcessOnTheGlobalBatch*: the all-gathered rows summed but not divided
//     by the workers, applied per worker (Adagrad), a peer's rows dropped (each replica would step
//     on its own batch only) or merged in another order on each replica (replicas no longer equal
//     bit for bit), rows read before the last step's update, the rows' rate not the step's, the
//     factory not building the table sync for a model with tables, the gather's bytes missing from
//     the sync's traffic.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <thread>
#include <vector>

#include "allreduce/tcp_ring.h"
#include "common/data/click/click_log.h"
#include "common/data/synthetic.h"
#include "tests/support/ps_job.h"
#include "worker/allreduce/tables/table_allreduce_sync.h"
#include "worker/loop/training_loop.h"
#include "worker/sync/local_sync.h"
#include "worker/sync/sync_factory.h"

namespace gradsync::testing {
namespace {

constexpr int64_t kSteps = 60;

ModelOptions SmallDlrm(RowOptimizerKind kind) {
  ModelOptions m;
  m.name = "dlrm";
  m.dlrm.num_dense = 4;
  m.dlrm.num_tables = 3;
  m.dlrm.dim = 4;
  m.dlrm.ids_per_table = 200;
  m.dlrm.bottom = {8};
  m.dlrm.top = {8};
  m.dlrm.optimizer.kind = kind;
  return m;
}

Dataset ClickData(int64_t n) {
  ClickLogOptions o;
  o.num_dense = 4;
  o.num_categorical = 3;
  o.ids_per_feature = {200};
  o.seed = 11;
  ClickLog log = std::move(ClickLog::Create(o)).value();
  return ClickLogDataset(log, 0, n, "clicks");
}

// One process stepping on the global batch: its dense parameters, and the rows of `ids` per
// table as its tables hold them.
struct LocalEnd {
  std::vector<float> params;
  std::vector<std::vector<float>> rows;
};
LocalEnd TrainLocally(const ModelOptions& mo, const LocalTrainOptions& train, const Dataset& data,
                      const std::vector<std::vector<uint64_t>>& ids) {
  auto model = std::move(CreateModel(mo)).value();
  model->Initialize(0);
  LocalSync sync(train, model.get());
  TrainingLoopOptions lo;
  lo.train = train;
  lo.evaluate = false;
  TrainingLoop loop(lo, model.get(), &data, &data, nullptr, &sync);
  EXPECT_TRUE(loop.Run().ok());
  LocalEnd end;
  end.params.assign(model->params().begin(), model->params().end());
  for (size_t t = 0; t < ids.size(); ++t) {
    std::vector<std::vector<uint64_t>> one(ids.size());
    one[t] = ids[t];
    std::vector<float> rows(ids[t].size() * static_cast<size_t>(model->tables()[t].dim));
    EXPECT_TRUE(sync.ReadRows(one, rows).ok());
    end.rows.push_back(rows);
  }
  return end;
}

// A job's end (dense parameters, and the rows of `ids` per table) against one process's with
// `local` (the global batch): dense by MaxRelativeDiff (floor 1e-3), each table's rows by their
// largest difference over their largest value, both within 1e-5.
void ExpectEqualsLocal(const ModelOptions& mo, const LocalTrainOptions& local, const Dataset& data,
                       const std::vector<std::vector<uint64_t>>& ids, const std::vector<float>& params,
                       const std::vector<std::vector<float>>& got_rows) {
  const LocalEnd want = TrainLocally(mo, local, data, ids);
  const double dense = MaxRelativeDiff(params, want.params, 1e-3);
  EXPECT_LE(dense, 1e-5) << "dense parameters";
  size_t rows = 0;
  for (size_t t = 0; t < ids.size(); ++t) {
    ASSERT_GT(ids[t].size(), 20u) << "table " << t << " hardly trained";
    rows += ids[t].size();
    // Each table's largest difference against its largest value: a row's value is a difference of
    // its initial value and its steps, so a small one carries the rounding of both (Adagrad's
    // first step is lr * g / |g|, whatever g's size).
    double worst = 0, largest = 0;
    for (size_t i = 0; i < got_rows[t].size(); ++i) {
      worst = std::max(worst, std::fabs(static_cast<double>(got_rows[t][i]) - want.rows[t][i]));
      largest = std::max(largest, std::fabs(static_cast<double>(want.rows[t][i])));
    }
    EXPECT_LE(worst / largest, 1e-5) << "table " << t << ": rows differ from one process's by "
                                     << worst << " (largest row value " << largest << ")";
  }
  ::testing::Test::RecordProperty("rows_compared", std::to_string(rows));
}

void ExpectBspEqualsLocal(const ModelOptions& model, const Dataset& data, float row_lr) {
  PsJobOptions o;
  o.mode = ConsistencyMode::kBsp;
  o.num_servers = 2;
  o.num_workers = 2;
  o.model = model;
  o.train = SmallTrain(16, kSteps, 0.0f);  // 2 x 16 = 32 per step
  o.train.lr = {LrSchedule::Kind::kConstant, row_lr, 0, 0.0f};
  o.train.optimizer.weight_decay = 0;
  PsJobResult r = RunPsJob(o, data, data);
  ASSERT_TRUE(r.status.ok()) << r.status;
  const std::vector<TableSpec> tables = std::move(CreateModel(model)).value()->tables();
  // Every row the servers hold, by table, in id order.
  std::vector<std::map<uint64_t, std::vector<float>>> held(tables.size());
  for (const auto& server : r.table_rows) {
    for (const wire::TableRowsCheckpoint& c : server) {
      const size_t n = c.ids().size() / sizeof(uint64_t);
      const auto dim = static_cast<size_t>(tables[c.table()].dim);
      for (size_t i = 0; i < n; ++i) {
        uint64_t id = 0;
        std::vector<float> row(dim);
        std::memcpy(&id, c.ids().data() + i * sizeof(uint64_t), sizeof(id));
        std::memcpy(row.data(), c.values().data() + i * dim * sizeof(float), dim * sizeof(float));
        held[c.table()][id] = row;
      }
    }
  }
  std::vector<std::vector<uint64_t>> ids(tables.size());
  std::vector<std::vector<float>> ps_rows(tables.size());
  for (size_t t = 0; t < tables.size(); ++t) {
    for (const auto& [id, row] : held[t]) {
      ids[t].push_back(id);
      ps_rows[t].insert(ps_rows[t].end(), row.begin(), row.end());
    }
  }
  LocalTrainOptions local = o.train;
  local.batch = 32;
  ExpectEqualsLocal(o.model, local, data, ids, r.params, ps_rows);
}

TEST(TableTrainTest, BspDlrmEqualsOneProcessOnTheGlobalBatchSgd) {
  ExpectBspEqualsLocal(SmallDlrm(RowOptimizerKind::kSgd), ClickData(1600), 0.5f);
}

// sparse_logreg's weights are a table of rows of one float: bsp over 2 x 2 steps them as one
// process does (its bias, the one dense tensor, too).
TEST(TableTrainTest, BspSparseLogRegEqualsOneProcessOnTheGlobalBatch) {
  SparseLogisticOptions so;
  so.n = 1600;
  so.feature_bits = 12;
  so.nnz = 8;
  ModelOptions mo;
  mo.name = "sparse_logreg";
  mo.feature_bits = 12;
  ExpectBspEqualsLocal(mo, MakeSparseLogistic(so), 2.0f);
}

TEST(TableTrainTest, BspDlrmEqualsOneProcessOnTheGlobalBatchAdagrad) {
  ExpectBspEqualsLocal(SmallDlrm(RowOptimizerKind::kAdagrad), ClickData(1600), 0.05f);
}

// The job's collective, counting what the syncs hand it: the bytes of the all-gathers (the table
// rows', and Start's comparison of the tables) and the floats all-reduced.
class CountingCollective final : public Collective {
 public:
  explicit CountingCollective(Collective* inner) : inner_(inner) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  Status AllReduce(FloatSpan data, ReduceOp op) override {
    reduced_floats_ += data.size();
    return inner_->AllReduce(data, op);
  }
  Status AllReduce16(std::span<uint16_t> data, Float16 format) override { return inner_->AllReduce16(data, format); }
  Status ReduceScatter(FloatSpan data, ReduceOp op, std::span<const size_t> bounds) override {
    return inner_->ReduceScatter(data, op, bounds);
  }
  Status AllGatherChunks(FloatSpan data, std::span<const size_t> bounds) override {
    return inner_->AllGatherChunks(data, bounds);
  }
  Status Broadcast(FloatSpan data, int root) override { return inner_->Broadcast(data, root); }
  Status AllGather(std::span<const std::byte> mine, std::vector<std::vector<std::byte>>* out) override {
    gathered_bytes_ += mine.size();
    return inner_->AllGather(mine, out);
  }
  Status Barrier() override { return inner_->Barrier(); }
  uint64_t bytes_sent() const override { return inner_->bytes_sent(); }
  uint64_t bytes_received() const override { return inner_->bytes_received(); }
  uint64_t shm_bytes_sent() const override { return inner_->shm_bytes_sent(); }
  uint64_t shm_bytes_received() const override { return inner_->shm_bytes_received(); }
  uint64_t gathered_bytes() const { return gathered_bytes_; }
  uint64_t reduced_floats() const { return reduced_floats_; }

 private:
  Collective* inner_;
  uint64_t gathered_bytes_ = 0;
  uint64_t reduced_floats_ = 0;
};

// Each rank's end of a 2-worker all-reduce job: its dense parameters, every id's row of every
// table (ids 0 .. 199) from its replica, and what its sync counted.
struct RankEnd {
  Status status;
  std::string kind;
  std::vector<float> params;
  std::vector<std::vector<float>> rows;
  int64_t replica_rows = 0;
  SyncTraffic traffic;
  uint64_t gathered_bytes = 0, reduced_floats = 0;
};

void ExpectAllreduceEqualsLocal(RowOptimizerKind kind, float row_lr) {
  constexpr int kWorkers = 2;
  const Dataset data = ClickData(1600);
  const ModelOptions mo = SmallDlrm(kind);
  LocalTrainOptions train = SmallTrain(16, kSteps, 0.0f);  // 2 x 16 = 32 per step
  train.lr = {LrSchedule::Kind::kConstant, row_lr, 0, 0.0f};
  train.optimizer.weight_decay = 0;
  std::vector<std::vector<uint64_t>> ids(3);
  for (auto& table : ids) {
    for (uint64_t id = 0; id < 200; ++id) table.push_back(id);
  }
  std::vector<std::unique_ptr<RingCollective>> rings;
  std::vector<std::string> peers;
  for (int r = 0; r < kWorkers; ++r) {
    rings.push_back(std::move(RingCollective::Listen("127.0.0.1", {})).value());
    peers.push_back("127.0.0.1:" + std::to_string(rings.back()->port()));
  }
  std::vector<RankEnd> ends(kWorkers);
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorkers; ++r) {
    threads.emplace_back([&, r] {
      RankEnd& end = ends[static_cast<size_t>(r)];
      end.status = rings[r]->Connect(r, peers, 10);
      if (!end.status.ok()) return;
      CountingCollective collective(rings[r].get());
      auto model = std::move(CreateModel(mo)).value();
      model->Initialize(0);  // every worker's seed: the tables' initial rows agree
      SyncRecipe recipe;
      recipe.allreduce_options.train = train;
      recipe.allreduce_options.evaluate = false;
      BuiltSync built = MakeGradientSync(recipe, model.get(), {.client = nullptr, .scheduler = nullptr, .collective = &collective});
      end.kind = built.kind;
      TrainingLoopOptions lo;
      lo.train = train;
      lo.evaluate = false;
      TrainingLoop loop(lo, model.get(), &data, &data, nullptr, built.sync.get());
      end.status = loop.Run().status();
      if (!end.status.ok()) return;
      end.params.assign(model->params().begin(), model->params().end());
      for (size_t t = 0; t < ids.size(); ++t) {
        std::vector<std::vector<uint64_t>> one(ids.size());
        one[t] = ids[t];
        std::vector<float> rows(ids[t].size() * static_cast<size_t>(model->tables()[t].dim));
        end.status = built.sync->ReadRows(one, rows);
        end.rows.push_back(rows);
      }
      if (const auto* tables = dynamic_cast<const TableAllreduceSync*>(built.sync.get())) {
        end.replica_rows = tables->rows().replica().rows();
      }
      end.traffic = built.sync->traffic();
      end.gathered_bytes = collective.gathered_bytes();
      end.reduced_floats = collective.reduced_floats();
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kWorkers; ++r) {
    const RankEnd& end = ends[static_cast<size_t>(r)];
    ASSERT_TRUE(end.status.ok()) << "rank " << r << ": " << end.status;
    EXPECT_EQ(end.kind, "allreduce-tables");
    EXPECT_GT(end.replica_rows, 60) << "rank " << r << ": its replica holds the rows trained";
    // The wire's bytes (the ring's, or shared memory's) cover the all-reduces and the gathers: with
    // 2 ranks each sends its half of every all-reduced float twice and its own gather message once.
    const uint64_t moved = end.traffic.bytes_sent + end.traffic.shm_bytes_sent;
    EXPECT_GE(moved, end.reduced_floats * sizeof(float) + end.gathered_bytes)
        << "rank " << r << ": the table rows' all-gather is missing from the sync's traffic";
    EXPECT_GT(end.gathered_bytes, static_cast<uint64_t>(kSteps) * 3 * (8 + 8 + 4 * 4)) << "a row a table a step at least";
  }
  // Every replica applied the same merged update in the same order: the same bits.
  EXPECT_EQ(ends[1].params, ends[0].params);
  EXPECT_EQ(ends[1].rows, ends[0].rows);
  // The rows the replicas trained: those whose value moved from the initial one.
  LocalTrainOptions local = train;
  local.batch = 32;
  auto fresh = std::move(CreateModel(mo)).value();
  fresh->Initialize(0);
  LocalTables initial(fresh->tables());
  std::vector<std::vector<uint64_t>> trained(3);
  std::vector<std::vector<float>> got(3);
  const size_t dim = static_cast<size_t>(mo.dlrm.dim);
  for (size_t t = 0; t < 3; ++t) {
    std::vector<std::vector<uint64_t>> one(3);
    one[t] = ids[t];
    std::vector<float> init(ids[t].size() * dim);
    ASSERT_TRUE(initial.Read(one, init).ok());
    for (size_t i = 0; i < ids[t].size(); ++i) {
      if (std::equal(init.begin() + i * dim, init.begin() + (i + 1) * dim, ends[0].rows[t].begin() + i * dim)) continue;
      trained[t].push_back(ids[t][i]);
      got[t].insert(got[t].end(), ends[0].rows[t].begin() + i * dim, ends[0].rows[t].begin() + (i + 1) * dim);
    }
  }
  ExpectEqualsLocal(mo, local, data, trained, ends[0].params, got);
}

TEST(TableTrainTest, AllreduceDlrmEqualsOneProcessOnTheGlobalBatchSgd) {
  ExpectAllreduceEqualsLocal(RowOptimizerKind::kSgd, 0.5f);
}

TEST(TableTrainTest, AllreduceDlrmEqualsOneProcessOnTheGlobalBatchAdagrad) {
  ExpectAllreduceEqualsLocal(RowOptimizerKind::kAdagrad, 0.05f);
}

}  // namespace
}  // namespace gradsync::testing
