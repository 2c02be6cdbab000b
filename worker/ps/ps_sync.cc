#include "worker/ps/ps_sync.h"

#include <algorithm>
#include <cstdio>

#include "common/ps/consistency.h"
#include "common/ps/table_wire.h"
#include "worker/loop/epoch.h"

namespace gradsync {

OverlapFacts PsSyncBase::OverlapFactsOf(const PsTrainOptions& o, const Model& model) {
  return {.requested = o.overlap.enabled,
          .compressed = !o.codec.compression.empty() && o.codec.compression != "none",
          .sparse = HasSparse(model.layout()) || !model.tables().empty(),
          .on_device = model.on_device(),
          .per_tensor_params = model.waits_for_params(),
          .straggles = o.train.straggler.spec.kind != StragglerSpec::Kind::kNone,
          .rounds = o.train.periodic.every > 0,
          .workers = o.num_workers,
          .zero = 0};
}

wire::JobConfig MakeJobConfig(const Model& model, const PsTrainOptions& o, int64_t total_steps,
                              int64_t steps_per_epoch) {
  wire::JobConfig job;
  for (const auto& t : model.layout()) {
    auto* spec = job.add_tensors();
    spec->set_name(t.name);
    spec->set_offset(static_cast<uint64_t>(t.offset));
    spec->set_size(static_cast<uint64_t>(t.size));
    spec->set_sparse(t.sparse);
    for (const int64_t d : t.shape) spec->add_shape(d);
  }
  job.set_num_params(static_cast<uint64_t>(model.num_params()));
  job.set_num_workers(o.num_workers);
  job.set_lr(o.train.lr.base);
  job.set_lr_schedule(LrScheduleKindName(o.train.lr.kind));
  const LrSchedule lr = RunSchedule(o.train, total_steps, steps_per_epoch);
  job.set_total_steps(lr.total_steps);
  job.set_warmup_steps(lr.warmup_steps);
  job.set_warmup_start_lr(lr.warmup_start);
  SetJobOptimizer(o.train.optimizer, &job);
  SetJobTables(model.tables(), &job);
  job.set_staleness_aware_lr(o.shard_update.staleness_aware_lr);
  if (!std::isnan(o.shard_update.delay_compensation)) {
    job.set_delay_compensation(o.shard_update.delay_compensation);
    job.set_delay_compensation_adaptive(o.shard_update.delay_compensation_adaptive);
  }
  if (!o.codec.compression.empty() && o.codec.compression != "none") {
    job.set_compression(o.codec.compression);
    job.set_compression_seed(o.train.seed);
    job.set_compress_pull(o.codec.compress_pull);
  }
  return job;
}

PsSyncBase::PsSyncBase(const PsTrainOptions& options, Model* model, PsClient* client, SchedulerClient* scheduler)
    : options_(options), model_(model), client_(client), scheduler_(scheduler), sparse_(HasSparse(model->layout())),
      scaling_(options.train.numerics), table_plan_(model->tables(), client != nullptr ? client->num_shards() : 0),
      pushed_plan_(table_plan_), read_plan_(table_plan_),
      row_cache_(model->tables(), client != nullptr ? client->num_shards() : 0) {}

StepRows PsSyncBase::KeepRowGrads() {
  if (step_tables_ == nullptr) {
    pushed_rows_.clear();
    return {};
  }
  // The model's row gradients go with the next batch's ids (TableIds), before this push is known
  // to have arrived: it keeps its own copy, which Recover sends again if a shard lacks the push.
  // The step's plan is made afresh by the next BeginStep (TablePlan::Set): swapped, not copied.
  std::swap(pushed_plan_, table_plan_);
  pushed_rows_.assign(step_tables_->grads.begin(), step_tables_->grads.end());
  return PushedRowGrads();
}

StepRows PsSyncBase::PushedRowGrads() {
  if (pushed_rows_.empty()) return {};
  return {&pushed_plan_, pushed_rows_};
}

Status PsSyncBase::ReadRows(std::span<const std::vector<uint64_t>> ids, std::span<float> rows) {
  if (ids.empty()) return OkStatus();
  // An evaluation's batch, or a frontend's forward: its rows as the shards hold them at this
  // clock (the rows alone; the dense parameters stay as they were pulled).
  RETURN_IF_ERROR(read_plan_.Set(ids));
  ASSIGN_OR_RETURN(const StepRows to_pull, RowsToPull(read_plan_, ids, rows));
  if (to_pull.plan != nullptr) {
    ASSIGN_OR_RETURN(const PsClient::RequestId pull, client_->Pull(clock_, {}, {}, false, to_pull));
    RETURN_IF_ERROR(client_->Wait(pull, options_.request_timeout_s).WithContext("rows at step " + std::to_string(clock_)));
  }
  RowsPulled(read_plan_, rows);
  return OkStatus();
}

void PsSyncBase::RowsPulled(const TablePlan& plan, FloatSpan rows) {
  const PsReplies& replies = client_->replies();
  row_cache_.Pulled(clock_, plan, rows, [&replies](int shard) { return replies.last_clock_staleness(shard); });
}

Status PsSyncBase::SetStepTables(const TableStep* tables) {
  step_tables_ = tables;
  return tables != nullptr ? table_plan_.Set(tables->ids) : OkStatus();
}

Result<int64_t> PsSyncBase::Start(const JobShape& shape) {
  const double timeout = options_.request_timeout_s;
  client_->set_wait_policy(options_.wait);
  const CodecOptions& codec = options_.codec;
  if (!codec.compression.empty()) {
    RETURN_IF_ERROR(client_->SetCompression(codec.compression, options_.train.seed, codec.error_feedback,
                                            codec.correction_momentum, codec.compress_pull));
  }
  std::vector<int> all_shards(static_cast<size_t>(scheduler_->table().servers_size()));
  for (size_t i = 0; i < all_shards.size(); ++i) all_shards[i] = static_cast<int>(i);
  int64_t start_clock = 0;
  if (scheduler_->rejoined()) {
    // A restarted worker in a running job: the shards say where to start (the open round, or
    // the slowest live worker's clock); it takes the largest and goes on from there with its
    // own shard of the data. The shards were initialized long ago.
    ASSIGN_OR_RETURN(int64_t suggested, client_->Join(all_shards, -1, timeout));
    ASSIGN_OR_RETURN(start_clock, client_->Join(all_shards, suggested, timeout));
    std::printf("worker %d: rejoined the job at step %lld of %lld\n", options_.rank, static_cast<long long>(start_clock),
                static_cast<long long>(shape.total_steps));
    std::fflush(stdout);
  } else {
    if (options_.rank == 0) {
      RETURN_IF_ERROR(client_->Init(MakeJobConfig(*model_, options_, shape.total_steps, shape.steps_per_epoch),
                                    model_->params(), timeout)
                          .WithContext("initializing the shards"));
    }
    RETURN_IF_ERROR(scheduler_->Barrier("init", "workers", options_.barrier_timeout_s));
  }
  if (options_.channels.shm) {
    ASSIGN_OR_RETURN(const int lanes, client_->AttachSharedMemory(timeout));
    if (lanes > 0) {
      std::printf("worker %d: %d of %d shard(s) on this host: values through shared memory\n", options_.rank, lanes,
                  scheduler_->table().servers_size());
      std::fflush(stdout);
    }
  }
  if (options_.channels.data_channel) {
    client_->channels().set_data_min_floats(options_.channels.data_min_floats);
    ASSIGN_OR_RETURN(const int channels, client_->AttachDataChannels(timeout));
    if (channels > 0) {
      std::printf("worker %d: %d of %d shard(s) with a data channel: large values over TCP beside ZeroMQ\n",
                  options_.rank, channels, scheduler_->table().servers_size());
      std::fflush(stdout);
    }
  }
  if (!scheduler_->rejoined()) {
    if (shape.total_steps > 0) {
      std::printf("worker %d: in the job, %lld steps to train\n", options_.rank, static_cast<long long>(shape.total_steps));
    } else {
      // A Python script that gave DistributedOptimizer no total_steps: its loop decides.
      std::printf("worker %d: in the job (the script decides how many steps: no total_steps given)\n", options_.rank);
    }
    std::fflush(stdout);
  }
  const wire::ClusterTable table = scheduler_->table();
  row_cache_.set_bound(RowCacheBound(options_.row_cache && !model_->tables().empty(), table.mode(), table.staleness()));
  if (row_cache_.on() && options_.rank == 0) {
    std::printf("worker %d: row cache on: a table row read serves this worker's reads for up to %d clocks past the "
                "updates it holds (ssp's bound)\n", options_.rank, row_cache_.bound());
    std::fflush(stdout);
  }
  if (options_.after_init) options_.after_init();
  clock_ = start_clock;
  return start_clock;
}

Status PsSyncBase::GradAbsent(size_t tensor) { return push_.MarkAbsent(model_->layout(), tensor); }

Status PsSyncBase::Recover(const Status& failure) {
  const std::vector<int> shards = client_->shards_to_reconnect();
  if (options_.recovery_timeout_s <= 0 || failure.code() != StatusCode::kUnavailable || shards.empty()) return failure;
  const int rank = options_.rank;
  std::printf("worker %d: step %lld: %s; waiting up to %.0f s for it to come back\n", rank, static_cast<long long>(clock_),
              failure.message().c_str(), options_.recovery_timeout_s);
  std::fflush(stdout);
  RETURN_IF_ERROR(client_->Reconnect(options_.recovery_timeout_s).WithContext("after: " + failure.message()));
  push_.Interrupted(clock_);
  row_cache_.Clear();  // the shard that came back may hold other rows than those read before
  const int64_t unacked = push_.unacked_clock();
  // The gradient of an unacknowledged push is still in the model only while it is the last one.
  if (unacked >= 0 && unacked == clock_ - 1 && options_.codec.compression.empty()) {
    // The last push was never acknowledged by the shards that came back. Each says how many of
    // this worker's pushes it holds; one short of the clock means it has not got that push (a
    // backup that took over holds every acknowledged one): its gradient, still in the model, is
    // sent again, so nothing of it is lost. (A compressed push is not: its encoder has moved on.)
    RETURN_IF_ERROR(client_->Join(shards, -1, options_.recovery_timeout_s).status());
    std::vector<int> missing;
    for (int s : shards)
      if (client_->join_clock(s) == unacked) missing.push_back(s);
    if (!missing.empty()) {
      ASSIGN_OR_RETURN(PsClient::RequestId again, client_->Push(unacked, model_->grads(), push_.keys(), push_.values(),
                                                               push_.last_lr(), push_.last_absent(), missing,
                                                               PushedRowGrads()));
      RETURN_IF_ERROR(client_->Wait(again, options_.request_timeout_s).WithContext("resending push " + std::to_string(unacked)));
      std::printf("worker %d: step %lld: sent its last push again to %zu shard(s) that did not hold it\n", rank,
                  static_cast<long long>(clock_), missing.size());
    }
  }
  // Pushes a restored shard lost for good (past its checkpoint) are counted there.
  RETURN_IF_ERROR(client_->Join(shards, clock_, options_.recovery_timeout_s).status());
  std::printf("worker %d: step %lld: going on with the restarted shard(s)\n", rank, static_cast<long long>(clock_));
  std::fflush(stdout);
  return OkStatus();
}

namespace {

// A worker's part of the "trained" gather: its clock and whether it left the rule.
std::string EndText(int64_t clock, bool left) { return std::to_string(clock) + (left ? " left" : " ended"); }

bool ParseEnd(const std::string& text, int64_t* clock, bool* left) {
  const size_t space = text.find(' ');
  if (space == std::string::npos || space == 0) return false;
  const std::string word = text.substr(space + 1);
  if (word != "left" && word != "ended") return false;
  int64_t c = 0;
  for (size_t i = 0; i < space; ++i) {
    if (text[i] < '0' || text[i] > '9' || c > (int64_t{1} << 56)) return false;
    c = c * 10 + (text[i] - '0');
  }
  *clock = c;
  *left = word == "left";
  return true;
}

}  // namespace

Status PsSyncBase::Finish(bool evaluate, bool leave) {
  const double timeout = options_.request_timeout_s;
  if (push_.pending()) {
    Status st = client_->Wait(push_.pending(), timeout).WithContext("last push");
    push_.Answered(st.ok(), clock_ - 1);
    push_.Settle();
    if (!st.ok()) RETURN_IF_ERROR(Recover(st));  // resent to a shard that came back without it
  }
  // Every shard holds this worker's pushes: the others hear how many (a pull that needs one more
  // fails at once instead of waiting forever), or that it leaves the rule.
  scheduler_->TrainingEnded(clock_, leave);
  // Every worker's last push is applied before anyone passes this barrier, unless a worker ended
  // before the others without leaving: in the aggregating modes (bsp, ssp with s = 0) the rounds
  // after its last one never complete, so the pushes of a worker that ran more steps were never
  // applied. That worker fails, naming it (the others ran fewer steps: theirs are all in).
  ASSIGN_OR_RETURN(const std::vector<std::string> ends,
                   scheduler_->Gather(kTrainedBarrier, "workers", EndText(clock_, leave), options_.barrier_timeout_s));
  const wire::ClusterTable table = scheduler_->table();
  const auto mode = ParseConsistencyMode(table.mode());
  const bool aggregating = mode.ok() && (*mode == ConsistencyMode::kBsp ||
                                         (*mode == ConsistencyMode::kSsp && table.staleness() == 0));
  for (size_t r = 0; aggregating && r < ends.size(); ++r) {
    int64_t clock = 0;
    bool left = false;
    if (static_cast<int>(r) == options_.rank || !ParseEnd(ends[r], &clock, &left) || left || clock >= clock_) continue;
    const std::string w = "worker " + std::to_string(r);
    const std::string pushes = clock + 1 == clock_ ? "its push of step " + std::to_string(clock) + " waits for " + w +
                                                         "'s in the same round"
                                                   : "its pushes of steps " + std::to_string(clock) + " to " +
                                                         std::to_string(clock_ - 1) + " wait for " + w +
                                                         "'s in the same rounds";
    return FailedPreconditionError(w + " ended training after " + std::to_string(clock) + " steps, but this worker ran " +
                                   std::to_string(clock_) + ": " + pushes + " (" +
                                   ConsistencyRuleName(*mode, table.staleness()) + ") and can never be applied: " +
                                   UnevenStepsAdvice());
  }
  if (evaluate) {
    ASSIGN_OR_RETURN(PsClient::RequestId pull, client_->Pull(clock_, model_->params(), {}, /*full=*/true));
    RETURN_IF_ERROR(client_->Wait(pull, timeout).WithContext("final pull"));
  }
  return OkStatus();
}

SyncTraffic PsSyncBase::traffic() const {
  const auto t = client_->traffic();
  const auto st = scheduler_->traffic();
  const ChannelBytes lanes = client_->channels().bytes(wire::CHANNEL_LANE);
  return {t.bytes_sent + st.bytes_sent, t.bytes_received + st.bytes_received, lanes.pushed, lanes.pulled};
}

void PsSyncBase::FillStats(SyncStepStats* stats) const {
  const PsReplies& replies = client_->replies();
  if (replies.last_version_lag() >= 0) stats->version_lag = replies.last_version_lag();
  if (replies.last_clock_staleness() >= 0) stats->clock_staleness = static_cast<double>(replies.last_clock_staleness());
  const SyncTraffic t = traffic();
  stats->bytes_sent = t.bytes_sent;
  stats->bytes_received = t.bytes_received;
  stats->shm_bytes_sent = t.shm_bytes_sent;
  stats->shm_bytes_received = t.shm_bytes_received;
}

// --- Sequential ---

Status PsSync::BeginStep(const StepPlan& plan) {
  RETURN_IF_ERROR(CheckStepRate(plan.lr));
  const double timeout = options_.request_timeout_s;
  clock_ = plan.step;
  step_lr_ = plan.lr;
  push_.BeginStep(0);
  scaling_.Begin(*model_);
  Stopwatch comm;
  Status st = [&]() -> Status {
    step_tables_ = plan.tables;
    StepRows rows;
    if (step_tables_ != nullptr) {
      RETURN_IF_ERROR(table_plan_.Set(step_tables_->ids));
      ASSIGN_OR_RETURN(rows, RowsToPull(table_plan_, step_tables_->ids, step_tables_->rows));
    }
    ASSIGN_OR_RETURN(PsClient::RequestId pull, client_->Pull(clock_, model_->params(), plan.sparse_keys, false, rows));
    const Status pulled = client_->Wait(pull, timeout).WithContext("pull " + std::to_string(clock_));
    if (pulled.ok() && step_tables_ != nullptr) RowsPulled(table_plan_, step_tables_->rows);
    if (push_.pending()) {
      // A refused push (a table past its bound, say) is the cause of the pull's failure that
      // follows it ("future clock"): its error is the one to report.
      Status pushed = client_->Wait(push_.pending(), timeout).WithContext("push " + std::to_string(clock_ - 1));
      push_.Answered(pushed.ok(), clock_ - 1);
      RETURN_IF_ERROR(pushed);
    }
    return pulled;
  }();
  pull_ms_ += comm.Millis();
  if (!st.ok()) return st;
  push_.Settle();
  wait_ms_ = std::min(pull_ms_, client_->replies().last_wait_ms());
  if (plan.evaluate && (sparse_ || options_.codec.compress_pull)) {
    // Refresh every weight (sparse: not only this batch's keys; compressed pulls: the exact
    // parameters, not this worker's approximation).
    ASSIGN_OR_RETURN(PsClient::RequestId full, client_->Pull(clock_, model_->params(), {}, true));
    RETURN_IF_ERROR(client_->Wait(full, timeout).WithContext("evaluation pull"));
  }
  return OkStatus();
}

Result<SyncStepStats> PsSync::FinishStep() {
  push_.GatherSparse(*model_, sparse_);
  if (scaling_.active()) {
    Scale(model_->grads(), scaling_.inverse());
    if (!scaling_.Finish(AllFinite(model_->grads()))) Fill(model_->grads(), 0.0f);
  }
  Stopwatch push_clock;
  ASSIGN_OR_RETURN(const PsClient::RequestId id,
                   client_->Push(clock_, model_->grads(), push_.keys(), push_.values(), step_lr_, push_.TakeAbsent(), {},
                                 KeepRowGrads()));
  push_.Sent(id, step_lr_);
  SyncStepStats stats;
  scaling_.Report(&stats);
  stats.table_rows = TableStepRows(step_tables_);
  stats.row_reads = row_cache_.TakeReads();
  stats.comm_ms = pull_ms_ - wait_ms_ + push_clock.Millis();
  stats.wait_ms = wait_ms_;
  pull_ms_ = 0;
  ++clock_;
  FillStats(&stats);
  return stats;
}

// --- Overlapped ---

Result<int64_t> PsOverlapSync::Start(const JobShape& shape) {
  ASSIGN_OR_RETURN(int64_t start, PsSyncBase::Start(shape));
  client_->parts().set_part_floats(options_.overlap.push_part_floats);
  return start;
}

void PsOverlapSync::Boundary(bool computed) {
  client_->Poll();
  const double now = since_start_.Millis();
  const bool busy = client_->InFlight();
  if (computed && seg_start_ >= 0 && seg_busy_ && busy) hidden_ms_ += now - seg_start_;
  seg_start_ = now;
  seg_busy_ = busy;
}

Status PsOverlapSync::WaitTensor(size_t t) {
  if (!failed_.ok()) return failed_;
  if (t >= ids_.size() || ids_[t] == 0 || waited_[t]) return OkStatus();
  waited_[t] = true;
  Boundary(true);
  Stopwatch w;
  failed_ = client_->Wait(ids_[t], options_.request_timeout_s).WithContext("pull " + std::to_string(clock_));
  blocked_ms_ += w.Millis();
  Boundary(false);  // waiting is not computing
  return failed_;
}

Status PsOverlapSync::BeginStep(const StepPlan& plan) {
  RETURN_IF_ERROR(CheckStepRate(plan.lr));
  clock_ = plan.step;
  step_lr_ = plan.lr;
  push_.BeginStep(model_->layout().size());
  failed_ = OkStatus();
  pushing_ = false;
  blocked_ms_ = param_blocked_ms_ = hidden_ms_ = 0;
  seg_start_ = -1;
  seg_busy_ = false;
  {
    Stopwatch w;
    ids_ = client_->parts().PullTensors(clock_, model_->params());
    waited_.assign(ids_.size(), false);
    // The previous push's parts must be out of the gradient buffer before backward.
    if (push_.pending()) {
      failed_ = client_->Wait(push_.pending(), options_.request_timeout_s).WithContext("push " + std::to_string(clock_ - 1));
      push_.Answered(failed_.ok(), clock_ - 1);
    }
    push_.Settle();
    blocked_ms_ += w.Millis();
  }
  if (plan.evaluate) {
    for (size_t t = 0; t < ids_.size(); ++t) (void)WaitTensor(t);  // evaluation reads every parameter
  }
  seg_start_ = -1;  // what the caller does before forward is not counted
  return failed_;
}

Status PsOverlapSync::WaitParams(size_t tensor) {
  const double before = blocked_ms_;
  Status s = WaitTensor(tensor);
  param_blocked_ms_ += blocked_ms_ - before;
  return s;
}

Status PsOverlapSync::GradReady(size_t tensor) {
  if (!failed_.ok()) return failed_;  // parameters missing: nothing of the step is pushed
  push_.MarkReady(tensor);
  Boundary(true);
  if (!pushing_) {
    client_->parts().BeginPush(clock_, model_->grads(), step_lr_);
    pushing_ = true;
  }
  client_->parts().PushReady(tensor);
  Boundary(false);
  return OkStatus();
}

Result<SyncStepStats> PsOverlapSync::FinishStep() {
  Boundary(true);  // the last layer's backward
  for (size_t t = 0; t < ids_.size(); ++t) (void)WaitTensor(t);  // every request answered or failed
  // (A failed pull stops the step before anything more is pushed: the shards never count it.)
  if (!failed_.ok()) return failed_;
  Stopwatch w;
  if (!pushing_) client_->parts().BeginPush(clock_, model_->grads(), step_lr_);
  push_.Sent(client_->parts().FinishPush(push_.TakeAbsent()), step_lr_);
  blocked_ms_ += w.Millis();
  const double wait_ms = std::min(blocked_ms_, client_->replies().last_wait_ms());
  SyncStepStats stats;
  stats.comm_ms = blocked_ms_ - wait_ms + hidden_ms_;  // exposed + hidden, as all-reduce's
  stats.wait_ms = wait_ms;
  stats.hidden_ms = hidden_ms_;
  stats.blocked_ms = param_blocked_ms_;
  ++clock_;
  FillStats(&stats);
  return stats;
}

void PsOverlapSync::AbandonStep() {
  // Every pull answered or failed; the parts already pushed are never completed, so no shard
  // counts the step.
  for (size_t t = 0; t < ids_.size(); ++t) (void)WaitTensor(t);
}

}  // namespace gradsync
