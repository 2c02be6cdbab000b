#include "server/shard/shard_core.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <optional>
#include <vector>

#include "common/config/train_config.h"
#include "common/obs/trace.h"
#include "common/ps/partitioner.h"
#include "common/ps/table_wire.h"

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
  const Result<std::vector<TableSpec>> tables = JobTables(job);
  if (!tables.ok()) return tables.status().WithContext("INIT");
  return std::make_unique<KvShard>(range, layout, *optimizer, lr, job.num_workers(), aggregates,
                                   ShardTables(*tables, rank, num_servers, job.num_workers()));
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
  const auto state = shard.optimizer().state();
  c.set_optimizer_state(state.data(), state.size() * sizeof(float));
  c.set_optimizer(OptimizerKindName(shard.optimizer().options().kind));
  c.set_optimizer_steps(shard.optimizer().steps());
  c.mutable_optimizer_skipped()->Assign(shard.optimizer().skipped().begin(), shard.optimizer().skipped().end());
  c.set_version(shard.version());
  c.set_step(shard.step());
  c.set_updates(shard.gradients());
  c.set_rounds_applied(rule.clocks().rounds_applied());
  for (int64_t p : rule.clocks().pushed_all()) c.add_pushed(p);
  for (bool l : rule.clocks().live_all()) c.add_live(l);
  for (wire::TableRowsCheckpoint& t : shard.tables().Save()) *c.add_tables() = std::move(t);
  c.set_written_at(std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count());
  return c;
}

Status RestoreShard(const wire::ShardCheckpoint& c, KvShard* shard) {
  if (c.begin() != static_cast<uint64_t>(shard->range().begin) || c.end() != static_cast<uint64_t>(shard->range().end)) {
    return DataLossError("the checkpoint does not hold this shard's range");
  }
  const std::string written = c.optimizer().empty() ? "sgd" : c.optimizer();
  const std::string job = OptimizerKindName(shard->optimizer().options().kind);
  if (written != job) {
    return DataLossError("the checkpoint holds the state of a " + written + " optimizer, but its job's optimizer is " +
                         job);
  }
  std::vector<float> params(c.params().size() / sizeof(float)), state(c.optimizer_state().size() / sizeof(float));
  // (An empty vector's data() may be null, which memcpy may not be given even for 0 bytes.)
  if (!params.empty()) std::memcpy(params.data(), c.params().data(), params.size() * sizeof(float));
  if (!state.empty()) std::memcpy(state.data(), c.optimizer_state().data(), state.size() * sizeof(float));
  RETURN_IF_ERROR(shard->Restore(params, state, c.optimizer_steps(), c.version(), c.step(), c.updates(),
                                 {c.optimizer_skipped().data(), static_cast<size_t>(c.optimizer_skipped().size())}));
  return shard->tables().Restore(c.tables());
}

Status ShardCore::Build(const wire::JobConfig& job, int num_servers, int rank) {
  ASSIGN_OR_RETURN(std::unique_ptr<KvShard> shard, MakeShardForJob(job, num_servers, rank, rule_.aggregates()));
  if (apply_threads_ > 1 && !pool_) pool_ = std::make_unique<ParallelFor>(apply_threads_);
  shard->set_parallel(pool_.get());
  ASSIGN_OR_RETURN(transform_, MakeGradientTransform(job, shard->range(), rule_.aggregates()));
  shard_ = std::move(shard);
  job_ = job;
  round_.Clear();
  return OkStatus();
}

Status ShardCore::Restore(const wire::ShardCheckpoint& c, int num_servers, int rank) {
  RETURN_IF_ERROR(Build(c.job(), num_servers, rank));
  Status s = RestoreShard(c, shard_.get());
  if (s.ok()) {
    s = rule_.clocks().Restore(std::vector<int64_t>(c.pushed().begin(), c.pushed().end()),
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
  transform_.reset();
  round_.Clear();
  intake_.ForgetAllParts();
  state_sets_.Clear();
  job_.Clear();
  rule_ = ConsistencyController(rule_.mode(), rule_.staleness(), rule_.clocks().num_workers());
}

int64_t ShardCore::Rejoin(int worker) {
  const int64_t start = rule_.Suggest(worker);
  rule_.clocks().SetWorker(worker, start);
  if (events_) events_->MembershipChanged(*this, worker);
  return start;
}

void ShardCore::GoOnAt(int worker, int64_t clock) {
  round_.Drop(worker);  // a held push of a round this worker now skips
  rule_.clocks().SetWorker(worker, clock);
  if (events_) events_->MembershipChanged(*this, worker);
}

void ShardCore::Remove(int worker) {
  rule_.clocks().RemoveWorker(worker);
  if (events_) events_->MembershipChanged(*this, -1);
}

void ShardCore::Leave(int worker) {
  rule_.clocks().Leave(worker);
  if (events_) events_->MembershipChanged(*this, -1);
}

Status ShardCore::SetOptimizerState(int worker, std::span<const float> state, int64_t steps,
                                    std::span<const int64_t> skipped) {
  RETURN_IF_ERROR(shard_->SetOptimizerState(state, steps, skipped));
  if (events_) events_->OptimizerSet(*this, worker);
  return OkStatus();
}

Status ShardCore::SetParams(int worker, std::span<const float> params) {
  RETURN_IF_ERROR(shard_->SetParams(params));
  const Segment whole[] = {shard_->range()};
  for (int w = 0; w < job_.num_workers(); ++w) transform_->Pulled(w, whole, shard_->params());
  if (events_) events_->ParamsSet(*this, worker);
  return OkStatus();
}

void ShardCore::Take(int worker, HeldPush push, int64_t lag) {
  const bool aggregates = rule_.aggregates();
  const float scale =
      job_.staleness_aware_lr() && !aggregates ? 1.0f / static_cast<float>(std::max<int64_t>(1, lag)) : 1.0f;
  intake_.ForgetParts(worker);  // `push` may have been gathered there: it is ours now
  if (!aggregates) transform_->Transform(worker, &push, shard_->params());
  if (events_) events_->Pushed(*this, worker, push, scale);
  round_.Take(worker, std::move(push), scale, *shard_);
}

ShardCore::Round ShardCore::ApplyRound() {
  std::optional<TraceSpan> span;  // the round's, until it is announced
  const Round out = round_.Apply(*shard_, rule_.clocks().rounds_applied(), intake_.last_counted(), &span);
  rule_.clocks().OnRoundApplied();
  if (events_) events_->RoundApplied(*this, out);
  return out;
}

}  // namespace gradsync
