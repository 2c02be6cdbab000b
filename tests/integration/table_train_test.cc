// Models with embedding tables trained over the servers (ARCHITECTURE.md, "Tables"): the DLRM-style
// model on the click log, through the same loop and syncs as every model. Mutations each test
// catches, by name:
// Equivalence: bsp over 2 servers x 2 workers against one process on the global batch, dense
// parameters by MaxRelativeDiff (floor 1e-3) and each table's rows by their largest difference over
// their largest value, both within 1e-5.
//   BspDlrmEqualsOneProcessOnTheGlobalBatch*: a round's row gradients applied per push or summed
//     instead of averaged, rows pulled for another clock, a worker's rows scattered to other ids,
//     dense and row updates at different rates or steps, the local tables stepping otherwise.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <vector>

#include "common/data/click_log.h"
#include "tests/support/ps_job.h"
#include "worker/loop/training_loop.h"
#include "worker/sync/local_sync.h"

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
    std::vector<float> rows(ids[t].size() * static_cast<size_t>(mo.dlrm.dim));
    EXPECT_TRUE(sync.ReadRows(one, rows).ok());
    end.rows.push_back(rows);
  }
  return end;
}

void ExpectBspEqualsLocal(RowOptimizerKind kind, float row_lr) {
  const Dataset data = ClickData(1600);
  PsJobOptions o;
  o.mode = ConsistencyMode::kBsp;
  o.num_servers = 2;
  o.num_workers = 2;
  o.model = SmallDlrm(kind);
  o.train = SmallTrain(16, kSteps, 0.0f);  // 2 x 16 = 32 per step
  o.train.lr = {LrSchedule::Kind::kConstant, row_lr, 0, 0.0f};
  o.train.optimizer.weight_decay = 0;
  PsJobResult r = RunPsJob(o, data, data);
  ASSERT_TRUE(r.status.ok()) << r.status;
  // Every row the servers hold, by table, in id order.
  std::vector<std::map<uint64_t, std::vector<float>>> held(3);
  for (const auto& server : r.table_rows) {
    for (const wire::TableRowsCheckpoint& c : server) {
      const size_t n = c.ids().size() / sizeof(uint64_t);
      for (size_t i = 0; i < n; ++i) {
        uint64_t id = 0;
        std::vector<float> row(4);
        std::memcpy(&id, c.ids().data() + i * sizeof(uint64_t), sizeof(id));
        std::memcpy(row.data(), c.values().data() + i * 4 * sizeof(float), 4 * sizeof(float));
        held[c.table()][id] = row;
      }
    }
  }
  std::vector<std::vector<uint64_t>> ids(3);
  std::vector<std::vector<float>> ps_rows(3);
  for (size_t t = 0; t < 3; ++t) {
    for (const auto& [id, row] : held[t]) {
      ids[t].push_back(id);
      ps_rows[t].insert(ps_rows[t].end(), row.begin(), row.end());
    }
  }
  LocalTrainOptions local = o.train;
  local.batch = 32;
  const LocalEnd want = TrainLocally(o.model, local, data, ids);
  const double dense = MaxRelativeDiff(r.params, want.params, 1e-3);
  EXPECT_LE(dense, 1e-5) << "dense parameters";
  size_t rows = 0;
  for (size_t t = 0; t < 3; ++t) {
    ASSERT_GT(ids[t].size(), 20u) << "table " << t << " hardly trained";
    rows += ids[t].size();
    // Each table's largest difference against its largest value: a row's value is a difference of
    // its initial value and its steps, so a small one carries the rounding of both (Adagrad's
    // first step is lr * g / |g|, whatever g's size).
    double worst = 0, largest = 0;
    for (size_t i = 0; i < ps_rows[t].size(); ++i) {
      worst = std::max(worst, std::fabs(static_cast<double>(ps_rows[t][i]) - want.rows[t][i]));
      largest = std::max(largest, std::fabs(static_cast<double>(want.rows[t][i])));
    }
    EXPECT_LE(worst / largest, 1e-5) << "table " << t << ": rows differ from one process's by "
                                     << worst << " (largest row value " << largest << ")";
  }
  ::testing::Test::RecordProperty("rows_compared", std::to_string(rows));
}

TEST(TableTrainTest, BspDlrmEqualsOneProcessOnTheGlobalBatchSgd) {
  ExpectBspEqualsLocal(RowOptimizerKind::kSgd, 0.5f);
}

TEST(TableTrainTest, BspDlrmEqualsOneProcessOnTheGlobalBatchAdagrad) {
  ExpectBspEqualsLocal(RowOptimizerKind::kAdagrad, 0.05f);
}

}  // namespace
}  // namespace gradsync::testing
