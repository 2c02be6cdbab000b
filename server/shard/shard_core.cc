#include "server/shard/shard_core.h"

#include <chrono>
#include <cstring>
#include <optional>
#include <vector>

#include "common/partitioner.h"
#include "common/trace.h"
#include "common/train_config.h"

namespace gradsync {

ShardIdentity IdentityOf(int rank, const wire::ClusterTable& table) {
  return {rank, table.job_id(), table.job_fingerprint()};
}

Result<std::unique_ptr<KvShard>> MakeShardForJob(const wire::JobConfig& job, int num_servers, int rank,
                                                 bool aggregates) {
  std::vector<TensorInfo> layout;
  uint64_t next = 0;
  for (const auto& t : job.tensors()) {
    if (t.offset() != next || t.size() == 0) return InvalidArgumentError("INIT: tensors are not contiguous");
    std::vector<int64_t> shape(t.shape().begin(), t.shape().end());
    if (shape.empty()) shape = {static_cast<int64_t>(t.size())};
    uint64_t elements = 1;
    for (const int64_t d : shape) {
      if (d < 1 || static_cast<uint64_t>(d) > (uint64_t{1} << 34) / elements) {
        elements = 0;
        break;
      }
      elements *= static_cast<uint64_t>(d);
    }
    if (elements != t.size()) return InvalidArgumentError("INIT: tensor '" + t.name() + "': its shape does not hold its size");
    layout.push_back({t.name(), std::move(shape), static_cast<int64_t>(t.offset()), static_cast<int64_t>(t.size()), t.sparse()});
    next += t.size();
  }
  if (next != job.num_params() || job.num_params() == 0 || job.num_params() > (uint64_t{1} << 34)) {
    return InvalidArgumentError("INIT: tensors do not add up to num_params");
  }
  const Result<OptimizerOptions> optimizer = JobOptimizer(job);
  if (!optimizer.ok()) return optimizer.status().WithContext("INIT");
  LrSchedule lr;
  ASSIGN_OR_RETURN(lr.kind, ParseLrScheduleKind(job.lr_schedule()));
  lr.base = job.lr();
  lr.total_steps = job.total_steps();
  lr.warmup_steps = job.warmup_steps();
  lr.warmup_start = job.warmup_start_lr();
  if (lr.warmup_steps < 0 || !(lr.warmup_start >= 0)) return InvalidArgumentError("INIT: bad learning-rate warm-up");
  if (!(lr.base > 0)) return InvalidArgumentError("INIT: learning rate must be > 0");
  if (job.num_workers() < 1) return InvalidArgumentError("INIT: no workers");
  const Segment range = Partitioner(static_cast<int64_t>(job.num_params()), num_servers).range(rank);
  return std::make_unique<KvShard>(range, layout, *optimizer, lr, job.num_workers(), aggregates);
}

wire::ShardCheckpoint SnapshotShard(const ShardIdentity& id, const wire::JobConfig& job, const KvShard& shard,
                                    const ConsistencyController& rule) {
  wire::ShardCheckpoint c;
  c.set_job_id(id.job_id);
  c.set_job_fingerprint(id.job_fingerprint);
  c.set_rank(id.rank);
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
  c.set_rounds_applied(rule.rounds_applied());
  for (int64_t p : rule.pushed_all()) c.add_pushed(p);
  for (bool l : rule.live_all()) c.add_live(l);
  c.set_written_at(std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count());
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

Status ShardCore::Build(const wire::JobConfig& job, int num_servers, int rank, ParallelFor* pool) {
  ASSIGN_OR_RETURN(std::unique_ptr<KvShard> shard, MakeShardForJob(job, num_servers, rank, rule_.aggregates()));
  shard->set_parallel(pool);
  shard_ = std::move(shard);
  job_ = job;
  round_.clear();
  round_open_us_ = -1;
  return OkStatus();
}

Status ShardCore::Restore(const wire::ShardCheckpoint& c, int num_servers, int rank, ParallelFor* pool) {
  RETURN_IF_ERROR(Build(c.job(), num_servers, rank, pool));
  Status s = RestoreShard(c, shard_.get());
  if (s.ok()) {
    s = rule_.Restore(std::vector<int64_t>(c.pushed().begin(), c.pushed().end()),
                      std::vector<bool>(c.live().begin(), c.live().end()), c.rounds_applied());
  }
  if (!s.ok()) shard_.reset();
  return s;
}

wire::ShardCheckpoint ShardCore::Snapshot(const ShardIdentity& id) const {
  return SnapshotShard(id, job_, *shard_, rule_);
}

void ShardCore::Reset() {
  shard_.reset();
  round_.clear();
  round_open_us_ = -1;
  job_.Clear();
  rule_ = ConsistencyController(rule_.mode(), rule_.staleness(), rule_.num_workers());
}

void ShardCore::ApplyChunk(const PushChunk& c, float scale, bool counts, float lr) {
  shard_->Apply(c.segments, c.keys, c.values(), scale, counts, lr, c.absent);
}

void ShardCore::Take(int worker, HeldPush push, float scale) {
  if (rule_.aggregates()) {
    // Held until the round completes, without copying the values where they came.
    if (round_.empty()) round_open_us_ = traced_ && Trace::on() ? Trace::NowUs() : -1;
    round_[worker] = std::move(push);
    return;
  }
  for (size_t i = 0; i < push.chunks.size(); ++i) ApplyChunk(push.chunks[i], scale, i + 1 == push.chunks.size(), push.lr);
}

void ShardCore::TakeChunk(int worker, PushChunk chunk, float scale, bool counts, float lr) {
  if (!rule_.aggregates()) {
    ApplyChunk(chunk, scale, counts, lr);
    return;
  }
  HeldPush& held = round_[worker];
  held.chunks.push_back(std::move(chunk));
  held.lr = lr;
}

ShardCore::Round ShardCore::ApplyRound() {
  Round out;
  out.pushes = static_cast<int>(round_.size());
  const double round = static_cast<double>(rule_.rounds_applied());
  if (out.pushes > 0 && round_open_us_ >= 0 && Trace::on()) {
    // From the round's first push to its last: what the others waited for.
    Trace::Complete("round wait", "server", round_open_us_, Trace::NowUs() - round_open_us_,
                    {{"round", round}, {"waited for worker", static_cast<double>(last_counted_)},
                     {"pushes", static_cast<double>(out.pushes)}});
  }
  round_open_us_ = -1;
  std::optional<TraceSpan> span;
  if (traced_) span.emplace("apply round", "server", std::initializer_list<TraceArg>{{"round", round}, {"pushes", static_cast<double>(out.pushes)}});
  for (auto& [worker, held] : round_) {
    for (const PushChunk& c : held.chunks) shard_->Accumulate(c.segments, c.keys, c.values(), c.absent);
    if (!std::isnan(held.lr)) out.lr = held.lr;
    held.chunks.clear();  // read: whatever lent the values may have them back
  }
  if (out.pushes > 0) shard_->ApplyAccumulated(out.pushes, out.lr);
  round_.clear();
  rule_.OnRoundApplied();
  return out;
}

}  // namespace gradsync
