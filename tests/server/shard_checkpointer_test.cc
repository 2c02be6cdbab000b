#include "server/shard/shard_checkpointer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <cstring>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>

#include "common/base/atomic_file.h"

#include "common/ps/ps_protocol.h"
#include "common/ps/table_wire.h"
#include "server/shard/shard_core.h"
#include "tests/support/temp_dir.h"

namespace gradsync {
namespace {

// The job's identity as the scheduler hands it out.
wire::ClusterTable Table(const std::string& job_id = "0123456789abcdef") {
  wire::ClusterTable t;
  t.set_job_id(job_id);
  t.set_job_fingerprint("settings");
  return t;
}

// What the server hands ShardCheckpointer::Write: shard 0's snapshot of this job (Table()).
std::function<wire::ShardCheckpoint()> Snapshot(const wire::JobConfig& job, const KvShard& shard,
                                                const ConsistencyController& controller) {
  return [&job, &shard, &controller] { return SnapshotShard(IdentityOf(0, Table()), job, shard, controller); };
}

// A small SGD shard after one update, checkpointed into dir/shard-0.ckpt.
struct Written {
  std::vector<TensorInfo> layout = {{"w", {8}, 0, 8, false}};
  KvShard shard{{0, 8}, layout, {0.9f, false, 0.0f}, {LrSchedule::Kind::kConstant, 0.1f, 0, 0}, 2, false};
  ConsistencyController controller{ConsistencyMode::kAsp, 0, 2};
  wire::JobConfig job;
  ShardCheckpointer checkpointer;

  explicit Written(const std::string& dir) : checkpointer(dir, 1, 5.0) {
    shard.SetValues(std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8});
    std::vector<float> g(8, 1.0f);
    const std::vector<Segment> all = {{0, 8}};
    shard.Apply(all, {}, g.data());
    job.set_num_workers(2);
    job.set_lr(0.1f);
  }
  Status Write() { return checkpointer.Write(0, Snapshot(job, shard, controller), 0); }
  std::string Bytes() { return testing::ReadFile(checkpointer.Path(0)); }
  void Put(const std::string& bytes) { std::ofstream(checkpointer.Path(0), std::ios::binary | std::ios::trunc) << bytes; }
};

TEST(ShardCheckpointerTest, DueByCountOrByTimeAfterTheFirstUpdate) {
  ShardCheckpointer by_count("dir", 3, 100.0);
  EXPECT_FALSE(by_count.Due(false, 0));  // nothing changed
  EXPECT_FALSE(by_count.Due(true, 0));
  EXPECT_FALSE(by_count.Due(true, 1));
  EXPECT_TRUE(by_count.Due(true, 2));
  ShardCheckpointer by_time("dir", 0, 5.0);
  EXPECT_FALSE(by_time.Due(false, 0));
  EXPECT_FALSE(by_time.Due(true, 10));  // the first update since the last checkpoint
  EXPECT_FALSE(by_time.Due(false, 14.9));
  EXPECT_TRUE(by_time.Due(false, 15.0));
  ShardCheckpointer off("", 1, 1.0);
  EXPECT_FALSE(off.enabled());
  EXPECT_FALSE(off.Due(true, 100));
}

TEST(ShardCheckpointerTest, WritesTheWholeStateAndReadsItBack) {
  testing::TempDir dir;
  std::vector<TensorInfo> layout = {{"w", {8}, 0, 8, false}};
  KvShard shard({0, 8}, layout, {0.9f, false, 0.0f}, {LrSchedule::Kind::kConstant, 0.1f, 0, 0}, 2, false);
  shard.SetValues(std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8});
  std::vector<Segment> all = {{0, 8}};
  std::vector<float> g(8, 1.0f);
  shard.Apply(all, {}, g.data());
  ConsistencyController controller(ConsistencyMode::kAsp, 0, 2);
  ASSERT_TRUE(controller.OnPush(1, 0).ok());
  wire::JobConfig job;
  job.set_num_workers(2);
  job.set_lr(0.1f);
  ShardCheckpointer c(dir.path(), 1, 5.0);
  ASSERT_TRUE(c.Due(true, 0));
  ASSERT_TRUE(c.Write(0, Snapshot(job, shard, controller), 0).ok());
  EXPECT_EQ(c.written(), 1);
  EXPECT_FALSE(c.Due(false, 1));  // written: nothing new since
  auto back = c.Read(0, Table());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->rank(), 0);
  EXPECT_EQ(back->version(), 1);
  EXPECT_EQ(back->job().num_workers(), 2);
  EXPECT_EQ(back->params().size(), 8 * sizeof(float));
  EXPECT_EQ(back->optimizer_state().size(), 8 * sizeof(float));
  EXPECT_EQ(back->optimizer(), "sgd");
  EXPECT_EQ(back->optimizer_steps(), 1);
  ASSERT_EQ(back->pushed_size(), 2);
  EXPECT_EQ(back->pushed(1), 1);
  // Another shard's file, a missing one, and garbage are each a clear error.
  EXPECT_EQ(c.Read(1, Table()).status().code(), StatusCode::kNotFound);
  std::ofstream(c.Path(1)) << "not a checkpoint";
  EXPECT_EQ(c.Read(1, Table()).status().code(), StatusCode::kDataLoss);
  std::filesystem::copy_file(c.Path(0), c.Path(2));
  auto foreign = c.Read(2, Table());
  EXPECT_EQ(foreign.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(foreign.status().message().find("belongs to shard 0"), std::string::npos) << foreign.status();
}

wire::JobConfig AdamJob() {
  wire::JobConfig job;
  auto* t = job.add_tensors();
  t->set_name("w");
  t->set_size(8);
  job.set_num_params(8);
  job.set_num_workers(2);
  job.set_lr(0.1f);
  OptimizerOptions adam;
  adam.kind = OptimizerKind::kAdam;
  adam.weight_decay = 0.01f;
  SetJobOptimizer(adam, &job);
  return job;
}

// A shard of `job` (parameters 1..8 over `layout`) steps three asp gradients, is checkpointed and
// read back; a fresh shard restored from the checkpoint and the original then step three more:
// they must end equal to the bit. The checkpoint names `optimizer` and holds `state_floats`
// floats of state per parameter. Returns the checkpoint and the restored shard.
struct RoundTrip {
  wire::ShardCheckpoint back;
  std::unique_ptr<KvShard> restored;
};
RoundTrip CheckRoundTrip(const wire::JobConfig& job, const std::vector<TensorInfo>& layout, const std::string& optimizer,
                         size_t state_floats) {
  RoundTrip out;
  testing::TempDir dir;
  const LrSchedule lr{LrSchedule::Kind::kConstant, 0.1f, 0, 0};
  auto options = JobOptimizer(job);
  EXPECT_TRUE(options.ok()) << options.status();
  if (!options.ok()) return out;
  KvShard shard({0, 8}, layout, *options, lr, 2, false);
  shard.SetValues(std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8});
  const std::vector<Segment> all = {{0, 8}};
  auto gradient = [](int k) {
    std::vector<float> g(8);
    for (int i = 0; i < 8; ++i) g[i] = std::sin(static_cast<float>(k * 8 + i));
    return g;
  };
  for (int k = 0; k < 3; ++k) shard.Apply(all, {}, gradient(k).data());
  ConsistencyController controller(ConsistencyMode::kAsp, 0, 2);
  ShardCheckpointer c(dir.path(), 1, 5.0);
  EXPECT_TRUE(c.Write(0, Snapshot(job, shard, controller), 0).ok());
  auto back = c.Read(0, Table());
  EXPECT_TRUE(back.ok()) << back.status();
  if (!back.ok()) return out;
  EXPECT_EQ(back->optimizer(), optimizer);
  EXPECT_EQ(back->optimizer_steps(), 3);
  EXPECT_EQ(back->optimizer_state().size(), state_floats * 8 * sizeof(float));

  auto restored_options = JobOptimizer(back->job());
  EXPECT_TRUE(restored_options.ok()) << restored_options.status();
  if (!restored_options.ok()) return out;
  out.restored = std::make_unique<KvShard>(Segment{0, 8}, layout, *restored_options, lr, 2, false);
  EXPECT_TRUE(RestoreShard(*back, out.restored.get()).ok());
  for (int k = 3; k < 6; ++k) {
    shard.Apply(all, {}, gradient(k).data());
    out.restored->Apply(all, {}, gradient(k).data());
  }
  EXPECT_TRUE(std::equal(shard.params().begin(), shard.params().end(), out.restored->params().begin()));
  EXPECT_TRUE(std::equal(shard.optimizer().state().begin(), shard.optimizer().state().end(),
                         out.restored->optimizer().state().begin()));
  EXPECT_EQ(out.restored->optimizer().steps(), 6);
  EXPECT_EQ(out.restored->version(), 6);
  out.back = *back;
  return out;
}

TEST(ShardCheckpointerTest, AnAdamShardRestoredFromItsCheckpointGoesOnBitForBit) {
  const std::vector<TensorInfo> layout = {{"w", {8}, 0, 8, false}};
  CheckRoundTrip(AdamJob(), layout, "adam", 2);  // m and v
}

TEST(ShardCheckpointerTest, LarsAndLambShardsRestoredFromTheirCheckpointsGoOnBitForBit) {
  const std::vector<TensorInfo> layout = {{"w", {2, 3}, 0, 6, false}, {"b", {2}, 6, 2, false}};
  for (OptimizerKind kind : {OptimizerKind::kLars, OptimizerKind::kLamb}) {
    SCOPED_TRACE(OptimizerKindName(kind));
    wire::JobConfig job = AdamJob();
    job.mutable_tensors(0)->set_size(6);
    auto* bias = job.add_tensors();
    bias->set_name("b");
    bias->set_size(2);
    OptimizerOptions o;
    o.kind = kind;
    o.weight_decay = 0.01f;
    if (kind == OptimizerKind::kLars) {
      o.momentum = 0.9f;
      o.trust_coefficient = 0.05;
    }
    SetJobOptimizer(o, &job);
    auto options = JobOptimizer(job);
    ASSERT_TRUE(options.ok()) << options.status();
    EXPECT_EQ(options->kind, kind);
    if (kind == OptimizerKind::kLars) {
      EXPECT_EQ(options->trust_coefficient, 0.05);
    }
    RoundTrip r = CheckRoundTrip(job, layout, OptimizerKindName(kind), kind == OptimizerKind::kLars ? 1u : 2u);
    ASSERT_NE(r.restored, nullptr);
    // A shard of the job with the other layer-wise optimizer (or adam) refuses this state.
    wire::ShardCheckpoint other = r.back;
    other.set_optimizer(kind == OptimizerKind::kLars ? "lamb" : "lars");
    Status s = RestoreShard(other, r.restored.get());
    EXPECT_EQ(s.code(), StatusCode::kDataLoss);
    EXPECT_NE(s.message().find(std::string("but its job's optimizer is ") + OptimizerKindName(kind)), std::string::npos) << s;
  }
}

TEST(ShardCheckpointerTest, RestoreRefusesAnotherOptimizersStateOrRange) {
  testing::TempDir dir;
  const std::vector<TensorInfo> layout = {{"w", {8}, 0, 8, false}};
  const LrSchedule lr{LrSchedule::Kind::kConstant, 0.1f, 0, 0};
  KvShard sgd({0, 8}, layout, {0.9f, false, 0.0f}, lr, 2, false);
  ConsistencyController controller(ConsistencyMode::kAsp, 0, 2);
  ShardCheckpointer c(dir.path(), 1, 5.0);
  ASSERT_TRUE(c.Write(0, Snapshot(AdamJob(), sgd, controller), 0).ok());  // a job that says adam, an sgd state
  auto back = c.Read(0, Table());
  ASSERT_TRUE(back.ok()) << back.status();
  KvShard adam({0, 8}, layout, *JobOptimizer(back->job()), lr, 2, false);
  Status s = RestoreShard(*back, &adam);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("the state of a sgd optimizer, but its job's optimizer is adam"), std::string::npos) << s;
  // Adam's state of the wrong size, and another range.
  wire::ShardCheckpoint short_state = *back;
  short_state.set_optimizer("adam");
  s = RestoreShard(short_state, &adam);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("optimizer state has 8 values; this shard's adam keeps 16"), std::string::npos) << s;
  KvShard other({0, 4}, layout, {0.9f, false, 0.0f}, lr, 2, false);
  EXPECT_EQ(RestoreShard(*back, &other).code(), StatusCode::kDataLoss);
  // A step count that the next step would overflow (Adam's t).
  KvShard sgd_again({0, 8}, layout, {0.9f, false, 0.0f}, lr, 2, false);
  wire::ShardCheckpoint huge = *back;
  huge.set_optimizer("sgd");
  ASSERT_TRUE(RestoreShard(huge, &sgd_again).ok());
  huge.set_optimizer_steps(INT64_MAX);
  s = RestoreShard(huge, &sgd_again);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("counter out of range"), std::string::npos) << s;
}

}  // namespace
}  // namespace gradsync

namespace gradsync {
namespace {

TEST(ShardCheckpointerTest, RefusesAnotherJobsCheckpointNamingTheFileAndTheJobs) {
  testing::TempDir dir;
  Written w(dir.path());
  ASSERT_TRUE(w.Write().ok());
  wire::ClusterTable other = Table("fedcba9876543210");
  other.set_job_fingerprint("other settings");
  auto back = w.checkpointer.Read(0, other);
  ASSERT_EQ(back.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(back.status().message().find(w.checkpointer.Path(0) + " belongs to another job (0123456789abcdef, this one is fedcba9876543210"),
            std::string::npos)
      << back.status();
  EXPECT_TRUE(w.checkpointer.Read(0, Table()).ok());
}

TEST(ShardCheckpointerTest, EveryFlippedBitAndEveryCutIsRefused) {
  testing::TempDir dir;
  Written w(dir.path());
  ASSERT_TRUE(w.Write().ok());
  const std::string good = w.Bytes();
  ASSERT_GT(good.size(), kCheckedFileHeaderBytes);
  // One flipped bit anywhere (every byte, a different bit each time): never restored.
  for (size_t i = 0; i < good.size(); ++i) {
    std::string bad = good;
    bad[i] = static_cast<char>(bad[i] ^ (1 << (i % 8)));
    w.Put(bad);
    auto back = w.checkpointer.Read(0, Table());
    ASSERT_EQ(back.status().code(), StatusCode::kDataLoss) << "byte " << i;
  }
  w.Put(good.substr(0, good.size() / 2));  // cut (at whatever field boundary)
  auto cut = w.checkpointer.Read(0, Table());
  EXPECT_NE(cut.status().message().find("cut short"), std::string::npos) << cut.status();
  std::string flipped = good;
  flipped[good.size() - 3] ^= 0x40;  // an exponent bit of the last parameter
  w.Put(flipped);
  auto corrupt = w.checkpointer.Read(0, Table());
  EXPECT_NE(corrupt.status().message().find("checksum mismatch"), std::string::npos) << corrupt.status();
  w.Put(good);
  EXPECT_TRUE(w.checkpointer.Read(0, Table()).ok());
}

TEST(ShardCheckpointerTest, NonFiniteParametersAreNeitherWrittenNorRestored) {
  testing::TempDir dir;
  Written w(dir.path());
  ASSERT_TRUE(w.Write().ok());
  const std::string good = w.Bytes();
  std::vector<float> nan(8, 1.0f);
  nan[3] = NAN;
  w.shard.SetValues(nan);
  Status s = w.Write();
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("the last good checkpoint stays: parameter 3 is NaN"), std::string::npos) << s;
  EXPECT_EQ(w.Bytes(), good);  // untouched
  // A file whose checksum matches but which holds an infinity (written by something else).
  auto c = w.checkpointer.Read(0, Table());
  ASSERT_TRUE(c.ok());
  std::string params = c->params();
  const float inf = INFINITY;
  std::memcpy(params.data() + 4, &inf, sizeof inf);
  c->set_params(params);
  ASSERT_TRUE(WriteCheckedFile(w.checkpointer.Path(0), "GSSHARD1", c->SerializeAsString()).ok());
  auto back = w.checkpointer.Read(0, Table());
  EXPECT_EQ(back.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(back.status().message().find("parameter 1 is infinite"), std::string::npos) << back.status();
}

TEST(ShardCheckpointerTest, AFailedWriteKeepsTheLastCheckpointAndLeavesNoTemporaryFile) {
  testing::TempDir dir;
  Written w(dir.path());
  ASSERT_TRUE(w.Write().ok());
  const std::string good = w.Bytes();
  // A disk that fills up mid-write: files may not grow past 64 bytes (EFBIG, as ENOSPC would).
  struct rlimit old{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  auto* previous = std::signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = old;
  small.rlim_cur = 64;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  Status s = w.Write();
  ::setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, previous);
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s;
  EXPECT_EQ(w.Bytes(), good);
  EXPECT_FALSE(std::filesystem::exists(w.checkpointer.Path(0) + ".tmp"));
  EXPECT_TRUE(w.checkpointer.Read(0, Table()).ok());
  // The warning says how old the checkpoint a restart would go back to is.
  EXPECT_EQ(w.checkpointer.failed_since(), 1);
  EXPECT_EQ(w.checkpointer.last_written_s(), 0);
  EXPECT_EQ(w.checkpointer.LastGood(42), "the last good checkpoint is 42 s old (1 write(s) failed since)");
  EXPECT_EQ(ShardCheckpointer(dir.path(), 1, 5.0).LastGood(42), "no checkpoint of this shard has been written yet");
  // A directory that cannot take a file is found out before the job starts.
  EXPECT_TRUE(CheckWritableDirectory(dir.path()).ok());
  Status not_dir = CheckWritableDirectory("/dev/null/checkpoints");
  EXPECT_FALSE(not_dir.ok());
  EXPECT_NE(not_dir.message().find("/dev/null/checkpoints"), std::string::npos) << not_dir;
}

TEST(ShardCheckpointerTest, CheckpointsAreTheOwnersAloneInADirectoryOnlyTheOwnerEnters) {
  // Parameters and optimizer state are no other user's to read: the file is 0600 from its
  // creation on, and a checkpoint directory the job creates is 0700 (one it is given stays as it is).
  testing::TempDir dir;
  const std::string sub = dir.path() + "/a/checkpoints";
  ASSERT_TRUE(CheckWritableDirectory(sub).ok());
  struct stat st {};
  ASSERT_EQ(::stat(sub.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  Written w(sub);
  ASSERT_TRUE(w.Write().ok());
  ASSERT_EQ(::stat(w.checkpointer.Path(0).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  ASSERT_EQ(::chmod(dir.path().c_str(), 0755), 0);
  ASSERT_TRUE(CheckWritableDirectory(dir.path()).ok());
  ASSERT_EQ(::stat(dir.path().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0755u);
}

}  // namespace
}  // namespace gradsync

namespace gradsync {
namespace {

// A job of 8 dense parameters and one table of Adam rows (per-row moments and step counts).
wire::JobConfig TableJob() {
  wire::JobConfig job = AdamJob();
  SetJobOptimizer({}, &job);
  job.set_lr_schedule("constant");
  TableSpec t;
  t.name = "items";
  t.dim = 3;
  t.init_seed = 9;
  t.optimizer.kind = RowOptimizerKind::kAdam;
  SetJobTables(std::vector<TableSpec>{t}, &job);
  return job;
}

// Mutations caught: the rows left out of SnapshotShard or RestoreShard, their optimizer state or
// step counts lost (the next step differs), damaged rows taken in part.
TEST(ShardCheckpointerTest, TableRowsTravelWithTheShardsCheckpointAndGoOnBitForBit) {
  const wire::JobConfig job = TableJob();
  auto shard = MakeShardForJob(job, 1, 0, false);
  ASSERT_TRUE(shard.ok()) << shard.status();
  const std::vector<TableRun> runs = {{0, 3}};
  const std::vector<uint64_t> ids = {4, 90, 1u << 30};
  std::vector<float> g = {1, 2, 3, -1, -2, -3, 0.5f, 0.5f, 0.5f};
  for (int step = 0; step < 3; ++step) (*shard)->Apply({}, ids, g.data(), 1.0f, true, NAN, {}, runs);
  ConsistencyController rule(ConsistencyMode::kAsp, 0, 2);
  wire::ShardCheckpoint c = SnapshotShard(IdentityOf(0, Table()), job, **shard, rule);
  ASSERT_EQ(c.tables_size(), 1);
  wire::ShardCheckpoint back;
  ASSERT_TRUE(back.ParseFromString(c.SerializeAsString()));
  auto restored = MakeShardForJob(job, 1, 0, false);
  ASSERT_TRUE(restored.ok());
  ASSERT_TRUE(RestoreShard(back, restored->get()).ok());
  EXPECT_EQ((*restored)->tables().rows(), 3);
  for (auto* s : {shard->get(), restored->get()}) s->Apply({}, ids, g.data(), 1.0f, true, NAN, {}, runs);
  std::vector<float> a(9), b(9);
  (*shard)->Read({}, ids, a.data(), runs);
  (*restored)->Read({}, ids, b.data(), runs);
  EXPECT_EQ(a, b);
  // A damaged row: refused, and the fresh shard holds no rows.
  std::string values = back.tables(0).values();
  const float nan = NAN;
  std::memcpy(values.data() + 4, &nan, sizeof(float));
  back.mutable_tables(0)->set_values(values);
  auto fresh = MakeShardForJob(job, 1, 0, false);
  ASSERT_TRUE(fresh.ok());
  const Status st = RestoreShard(back, fresh->get());
  EXPECT_EQ(st.code(), StatusCode::kDataLoss);
  EXPECT_NE(st.message().find("table 'items'"), std::string::npos) << st;
  EXPECT_EQ((*fresh)->tables().rows(), 0);
}

}  // namespace
}  // namespace gradsync
