// The parameter-server GradientSyncs (gradsync-worker --mode=bsp|ssp|asp). The update happens
// on the servers (KvShard); a worker pulls the parameters of its iteration c, computes, and
// pushes the gradient of c, the push of c overlapping the pull of c+1.
//
// Start: worker 0 sends the initial parameters and the job's optimizer settings to the shards
// (MakeJobConfig), then every worker waits at the "init" barrier; a worker that rejoined a
// running job JOINs the shards instead and starts at their clock. EndTraining waits for the
// last push, tells the scheduler (TRAINING_ENDED: its clock; the shards then fail at once any
// pull that needs a push of it it will never make), passes the "trained" barrier (a gather of
// every worker's end: each worker's last push is applied, unless a worker ended earlier without
// leaving, which in bsp fails the workers that ran more steps, naming it), and, to evaluate,
// pulls every parameter. Leave is EndTraining for a worker that ran out of data (uneven inputs):
// it also leaves the consistency rule, so the others go on without it. Recover: when a server died and came back from its
// checkpoint (kUnavailable, recovery_timeout_s > 0), waits for it, reconnects, JOINs it at the
// step and lets the step be redone (the pushes it lost are counted on its side).
//
// A step's own rate (StepPlan::lr) goes with every message of its push; the shards apply it
// instead of the job's schedule.
//
// PsSync: sequential. BeginStep pulls (dense tensors and the batch's sparse keys) and waits for
// the pull and the previous push; FinishStep pushes (dense gradient lent to ZeroMQ, sparse
// (key, value) pairs), optionally compressed (--compress, --compress-pull).
// PsOverlapSync: dense CPU models, raw values. BeginStep sends one pull per tensor in forward
// order; WaitParams(t) waits for tensor t's only; GradReady(t) pushes tensor t's gradient in
// parts of at most push_part_floats at once; FinishStep sends the rest. hidden_ms is the
// computation between two of these calls at both of which a request was in flight (a lower
// bound). Both compute the same updates (bsp included).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "common/base/clock.h"
#include "common/config/sync_decisions.h"
#include "common/net/control/client/scheduler_client.h"
#include "gradsync.pb.h"
#include "models/model.h"
#include "worker/loop/train_options.h"
#include "worker/ps/client/ps_client.h"
#include "worker/ps/push_record.h"
#include "worker/ps/row_cache.h"
#include "worker/sync/gradient_sync.h"
#include "worker/sync/loss_scaling.h"

namespace gradsync {

// What the shards do with each push of an ssp/asp job (MakeJobConfig sends it to them).
struct ShardUpdateOptions {
  bool staleness_aware_lr = false;  // ssp/asp: the shards divide each step by its staleness
  // ssp/asp: delay-compensated ASGD on the shards with this lambda (NaN: off), adaptive or not.
  float delay_compensation = NAN;
  bool delay_compensation_adaptive = false;
};

// Overlap communication with computation (dense CPU models, raw pushes, no straggler): each
// tensor's gradient (in parts of at most push_part_floats) is pushed the moment backward
// produced it, and the next step's pulls go out one per tensor in forward order, each layer's
// forward waiting only for its own parameters. The same updates as without (bsp included).
// PsOverlaps decides (enabled is the request); PsOverlapSync runs it.
struct PsOverlapOptions {
  bool enabled = false;
  size_t push_part_floats = size_t{1} << 20;
};

// The value channels the PS client attaches after the "init" barrier (worker/channels/).
struct PsChannelOptions {
  // Values of raw dense pushes and pulls through shared memory to the shards on this host
  // (PsClient::AttachSharedMemory).
  bool shm = true;
  // Values of large raw dense pushes and pulls over a data channel to every other shard
  // (PsClient::AttachDataChannels, after the shared-memory lanes).
  bool data_channel = true;
  size_t data_min_floats = size_t{1} << 20;  // the smallest request that uses it (4 MiB)
};

struct PsTrainOptions {
  LocalTrainOptions train;   // optimizer, lr schedule, batch (per worker), epochs, seed...
  int rank = 0;
  int num_workers = 1;
  double request_timeout_s = 60.0;
  double barrier_timeout_s = 600.0;
  bool evaluate = true;      // worker 0 only
  CodecOptions codec;        // the push codec (PsClient::SetCompression) and compressed pulls
  ShardUpdateOptions shard_update;
  PsOverlapOptions overlap;
  PsChannelOptions channels;
  // How a wait for the shards' replies waits (PsClient::set_wait_policy; --busy-poll-ms).
  WaitPolicy wait{};
  // How long to wait for a dead server to come back (from its checkpoint) before failing; the
  // step is then redone against the restored shard. 0: fail at once.
  double recovery_timeout_s = 0;
  // ssp: serve table rows from this worker's row cache while within the bound (RowCache); false:
  // every read asks the shards. bsp and asp keep no rows whatever it says.
  bool row_cache = true;
  // Test and experiment hooks of the loop (its before_compute: e.g. a straggler's delay; its
  // step_lr: each step's own rate, pushed with its gradient), and one after the "init" barrier.
  StepHooks loop;
  std::function<void()> after_init;
};

// The job's optimizer settings and layout as worker 0 sends them to the shards.
wire::JobConfig MakeJobConfig(const Model& model, const PsTrainOptions& options, int64_t total_steps,
                              int64_t steps_per_epoch);

// What both PS syncs share: joining the job, recovery, the end, traffic and staleness.
class PsSyncBase : public GradientSync {
 public:
  // The pointers must outlive the sync.
  PsSyncBase(const PsTrainOptions& options, Model* model, PsClient* client, SchedulerClient* scheduler);

  // What PsOverlaps reads (common/config/sync_decisions.h) of a run with these options.
  static OverlapFacts OverlapFactsOf(const PsTrainOptions& o, const Model& model);

  int rank() const override { return options_.rank; }
  int size() const override { return options_.num_workers; }
  Result<int64_t> Start(const JobShape& shape) override;
  Status Recover(const Status& failure) override;
  Status EndTraining(bool evaluate) override { return Finish(evaluate, /*leave=*/false); }
  Status Leave(bool evaluate) override { return Finish(evaluate, /*leave=*/true); }
  SyncTraffic traffic() const override;
  // A batch's table rows, pulled at this clock (GradientSync::ReadRows).
  Status ReadRows(std::span<const std::vector<uint64_t>> ids, std::span<float> rows) override;
  // The step's row gradients go with its push (GradientSync::SetStepTables).
  Status SetStepTables(const TableStep* tables) override;
  // Marks tensor t for this step's push (GradientSync::GradAbsent). kInvalidArgument for a sparse
  // tensor or one out of range; kFailedPrecondition when its gradient was already reported ready.
  Status GradAbsent(size_t tensor) override;
  // This worker's clock: the step begun last, or after FinishStep the next one (its pushes so far,
  // once the shards have the last): what its optimizer state requests carry.
  int64_t clock() const { return clock_; }

 protected:
  // Staleness and bytes after the step's push.
  void FillStats(SyncStepStats* stats) const;
  // This step's table row gradients for its push, kept as the push's own (none without tables);
  // the last push's, as kept (Recover sends them again).
  StepRows KeepRowGrads();
  StepRows PushedRowGrads();
  // A read at clock_ of `ids` (`plan` set from them) into `rows`, through the row cache: the
  // rows to pull (none: every row was served from the cache), then, once that pull is answered,
  // its rows in place (RowCache::ToPull, Pulled).
  Result<StepRows> RowsToPull(const TablePlan& plan, std::span<const std::vector<uint64_t>> ids, FloatSpan rows) {
    return row_cache_.ToPull(clock_, plan, ids, rows);
  }
  void RowsPulled(const TablePlan& plan, FloatSpan rows);
  // EndTraining and Leave: the last push answered, TRAINING_ENDED (clock_, leave), the "trained"
  // gather of every worker's end, the check that none of this worker's pushes was left out of a
  // round, and the final pull.
  Status Finish(bool evaluate, bool leave);

  PsTrainOptions options_;
  Model* model_;
  PsClient* client_;
  SchedulerClient* scheduler_;
  const bool sparse_;  // the model has sparse tensors (pushes and pulls by key)
  int64_t clock_ = 0;  // the step begun last, or after FinishStep the next one
  float step_lr_ = NAN;  // the step's own rate (StepPlan::lr), sent with its push; NaN: none
  // This step's push and the last one as sent (its gradient stays in the model until the next
  // backward): a shard that took over or came back without it gets it again in Recover.
  PushRecord push_;
  // --precision=fp16 (PsSync: a 16-bit codec always goes with a 16-bit precision, so the
  // overlapped sync never scales): each worker judges its own gradient, unscales it and pushes
  // it; an overflowed one is pushed as zeros (a bsp round needs every worker's push).
  LossScaling scaling_;
  // A model with tables: this step's ids cut per shard, and the step's rows (StepPlan::tables).
  TablePlan table_plan_;
  const TableStep* step_tables_ = nullptr;
  TablePlan pushed_plan_;            // the last push's rows: its plan (the tables' alike) and its row gradients
  std::vector<float> pushed_rows_;
  TablePlan read_plan_;  // ReadRows' ids cut per shard, made again in the memory it had
  RowCache row_cache_;   // ssp: the rows read, served again while within the bound; every read counted
};

class PsSync final : public PsSyncBase {
 public:
  using PsSyncBase::PsSyncBase;

  Status BeginStep(const StepPlan& plan) override;
  Status WaitParams(size_t) override { return OkStatus(); }
  Status GradReady(size_t) override { return OkStatus(); }
  Result<SyncStepStats> FinishStep() override;
  void AbandonStep() override {}

 private:
  double pull_ms_ = 0;  // this step's pulls and waits, attempts included
  double wait_ms_ = 0;
};

class PsOverlapSync final : public PsSyncBase {
 public:
  using PsSyncBase::PsSyncBase;

  Result<int64_t> Start(const JobShape& shape) override;
  Status BeginStep(const StepPlan& plan) override;
  Status WaitParams(size_t tensor) override;
  Status GradReady(size_t tensor) override;
  Result<SyncStepStats> FinishStep() override;
  void AbandonStep() override;

 private:
  Status WaitTensor(size_t tensor);
  // A layer boundary: `computed` when the stretch since the previous one was computation.
  void Boundary(bool computed);

  std::vector<PsClient::RequestId> ids_;  // per tensor, this step's pull
  std::vector<bool> waited_;
  Status failed_;
  bool pushing_ = false;
  double blocked_ms_ = 0;        // this step's waits, pushes included
  double param_blocked_ms_ = 0;  // of which in WaitParams
  double hidden_ms_ = 0;
  double seg_start_ = -1;
  bool seg_busy_ = false;
  Stopwatch since_start_;
};

}  // namespace gradsync
