#include "server/shard_checkpointer.h"

#include <chrono>
#include <cmath>
#include <cstring>
#include <vector>

#include "common/atomic_file.h"
#include "common/clock.h"
#include "common/train_config.h"

namespace gradsync {

bool ShardCheckpointer::Due(bool updated, double now_s) {
  if (!enabled()) return false;
  if (updated && updates_since_++ == 0) first_dirty_s_ = now_s;
  if (updates_since_ == 0) return false;
  const bool by_count = every_ > 0 && updates_since_ >= every_;
  const bool by_time = now_s - first_dirty_s_ >= interval_s_;
  return by_count || by_time;
}

namespace {
constexpr char kMagic[] = "GSSHARD1";  // 8 bytes: the checked file's kind

std::string ShortId(const std::string& id) { return id.empty() ? "(none)" : id; }
}  // namespace

wire::ShardCheckpoint SnapshotShard(int rank, const wire::ClusterTable& table, const wire::JobConfig& job,
                                    const KvShard& shard, const ConsistencyController& controller) {
  wire::ShardCheckpoint c;
  c.set_job_id(table.job_id());
  c.set_job_fingerprint(table.job_fingerprint());
  c.set_rank(rank);
  *c.mutable_job() = job;
  c.set_begin(static_cast<uint64_t>(shard.range().begin));
  c.set_end(static_cast<uint64_t>(shard.range().end));
  const auto params = shard.params();
  c.set_params(params.data(), params.size() * sizeof(float));
  const auto state = shard.optimizer_state();
  c.set_optimizer_state(state.data(), state.size() * sizeof(float));
  c.set_optimizer(OptimizerKindName(shard.optimizer_options().kind));
  c.set_optimizer_steps(shard.optimizer_steps());
  c.mutable_optimizer_skipped()->Assign(shard.optimizer_skipped().begin(), shard.optimizer_skipped().end());
  c.set_version(shard.version());
  c.set_step(shard.step());
  c.set_updates(shard.gradients());
  c.set_rounds_applied(controller.rounds_applied());
  for (int64_t p : controller.pushed_all()) c.add_pushed(p);
  for (bool l : controller.live_all()) c.add_live(l);
  c.set_written_at(std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count());
  return c;
}

Status CheckFinite(const wire::ShardCheckpoint& c) {
  for (const std::string* blob : {&c.params(), &c.optimizer_state()}) {
    const size_t n = blob->size() / sizeof(float);
    for (size_t i = 0; i < n; ++i) {
      float v;
      std::memcpy(&v, blob->data() + i * sizeof(float), sizeof v);
      if (!std::isfinite(v)) {
        return DataLossError(std::string(blob == &c.params() ? "parameter" : "optimizer state element") + " " +
                             std::to_string(i) + " is " + (std::isnan(v) ? "NaN" : "infinite"));
      }
    }
  }
  return OkStatus();
}

Status ShardCheckpointer::Write(int rank, const wire::ClusterTable& table, const wire::JobConfig& job,
                                const KvShard& shard, const ConsistencyController& controller, double now_s) {
  Stopwatch took;
  const wire::ShardCheckpoint c = SnapshotShard(rank, table, job, shard, controller);
  Status s = CheckFinite(c);
  if (!s.ok()) {
    s = DataLossError("not written, the last good checkpoint stays: " + s.message());
  } else {
    std::string bytes;
    s = c.SerializeToString(&bytes) ? WriteCheckedFile(Path(rank), kMagic, bytes)
                                    : InternalError("could not serialize the checkpoint");
  }
  if (!s.ok()) {
    first_dirty_s_ = now_s;  // try again after another interval
    ++failed_since_;
    return s;
  }
  ++written_;
  slowest_ms_ = std::max(slowest_ms_, took.Millis());
  updates_since_ = 0;
  failed_since_ = 0;
  last_written_s_ = now_s;
  return OkStatus();
}

std::string ShardCheckpointer::LastGood(double now_s) const {
  if (last_written_s_ < 0) return "no checkpoint of this shard has been written yet";
  char text[160];
  std::snprintf(text, sizeof text, "the last good checkpoint is %.0f s old (%lld write(s) failed since)",
                now_s - last_written_s_, static_cast<long long>(failed_since_));
  return text;
}

Result<wire::ShardCheckpoint> ShardCheckpointer::Read(int rank, const wire::ClusterTable& table) const {
  const std::string path = Path(rank);
  ASSIGN_OR_RETURN(std::string bytes, ReadCheckedFile(path, kMagic));
  wire::ShardCheckpoint c;
  if (!c.ParseFromString(bytes)) return DataLossError(path + " is not a shard checkpoint");
  if (c.job_id() != table.job_id()) {
    std::string why = path + " belongs to another job (" + ShortId(c.job_id()) + ", this one is " +
                      ShortId(table.job_id());
    if (c.job_fingerprint() != table.job_fingerprint() && !c.job_fingerprint().empty() &&
        !table.job_fingerprint().empty()) {
      const FingerprintDifference d = DescribeFingerprintDifference(c.job_fingerprint(), table.job_fingerprint());
      why += "; its settings [" + d.mine + "], this job's [" + d.theirs + "]";
    }
    return DataLossError(why + ")");
  }
  if (c.rank() != rank) {
    return DataLossError(path + " belongs to shard " + std::to_string(c.rank()) + ", this is shard " +
                         std::to_string(rank));
  }
  if (c.params().size() % sizeof(float) != 0 || c.optimizer_state().size() % sizeof(float) != 0) {
    return DataLossError(path + " does not hold whole floats");
  }
  if (Status s = CheckFinite(c); !s.ok()) return DataLossError(path + ": " + s.message());
  return c;
}

Status RestoreShard(const wire::ShardCheckpoint& c, KvShard* shard) {
  if (c.begin() != static_cast<uint64_t>(shard->range().begin) || c.end() != static_cast<uint64_t>(shard->range().end)) {
    return DataLossError("the checkpoint does not hold this shard's range");
  }
  const std::string written = c.optimizer().empty() ? "sgd" : c.optimizer();
  const std::string job = OptimizerKindName(shard->optimizer_options().kind);
  if (written != job) {
    return DataLossError("the checkpoint holds the state of a " + written + " optimizer, but its job's optimizer is " +
                         job);
  }
  std::vector<float> params(c.params().size() / sizeof(float)), state(c.optimizer_state().size() / sizeof(float));
  std::memcpy(params.data(), c.params().data(), params.size() * sizeof(float));
  std::memcpy(state.data(), c.optimizer_state().data(), state.size() * sizeof(float));
  return shard->Restore(params, state, c.optimizer_steps(), c.version(), c.step(), c.updates(),
                        {c.optimizer_skipped().data(), static_cast<size_t>(c.optimizer_skipped().size())});
}

}  // namespace gradsync
