// GradientSync: how one data-parallel worker exchanges a training step with the others, as
// seen from the training loop that computes the gradient (TrainingLoop here, or an outside
// loop such as a PyTorch frontend).
//
// A sync owns the communication and, where the update happens in this process (local,
// all-reduce), the optimizer. It works on the flat parameter and gradient buffers of a
// model's layout: tensor t is [offset, offset + size) of both (TensorInfo), and every call
// below names tensors by their index in that layout. The caller computes the gradient; the
// sync makes the next step's parameters appear in the parameter buffer.
//
// One step, in this order (every call on the training thread):
//
//   Result<int64_t> first = sync.Start({total_steps, steps_per_epoch});   // once
//   for each step s from *first:
//     sync.BeginStep({s, keys, evaluate});   // e.g. the pulls go out; evaluate: all parameters
//                                            // are in the buffer when it returns (a caller
//                                            // with its own rate schedule sets .lr too)
//     forward:  sync.WaitParams(t) before tensor t's parameters are first read
//     backward: sync.GradReady(t) once tensor t's gradient is final (may start sending it),
//               or sync.GradAbsent(t) for a tensor that got none (before FinishStep)
//     sync.FinishStep()                       // the update is applied or pushed; the stats
//   sync.EndTraining(evaluate)                // every worker's updates applied everywhere
//                                             // (or sync.Leave(evaluate): this worker ran out
//                                             // of data, the others may run more steps)
//
// A failed call fails the step: the caller stops calling the step's per-tensor calls (they
// return the same failure at once), then either calls Recover(failure) and, when it returns
// OK, starts the same step again with BeginStep, or gives up (a failed step needs no
// AbandonStep). A step that will not be finished although nothing failed (the loss diverged) is
// let go with AbandonStep, which sends nothing more of it. A caller must not report a gradient
// it does not mean to send: GradReady may put it on the wire at once.
//
// Threading: not thread-safe; every call comes from one thread (the one that runs forward
// and backward). An implementation may communicate on threads of its own between GradReady
// and FinishStep; it then reads the gradient buffer, which the caller must leave alone until
// FinishStep returns. Ownership: a sync borrows what it is built on (model, clients,
// collectives), which must outlive it; it owns nothing the caller passes per call.
// Errors: Status / Result; kUnavailable marks a failure Recover may be able to repair.
#pragma once

#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/base/status.h"
#include "common/obs/metrics.h"

namespace gradsync {

// The shape of the job, known once the data set and batch are.
struct JobShape {
  int64_t total_steps = 0;
  int64_t steps_per_epoch = 1;
};

// A step's embedding-table rows (Model::tables()): the ids its batch reads, per table, sorted and
// unique (Model::TableIds); where BeginStep puts their rows (table after table, id after id),
// and where FinishStep reads their gradients, laid out alike.
struct TableStep {
  std::span<const std::vector<uint64_t>> ids;
  std::span<float> rows;
  std::span<const float> grads;
};

struct StepPlan {
  int64_t step = 0;                          // steps finished before this one
  std::span<const uint64_t> sparse_keys{};   // flat keys of the sparse rows the batch reads
  // A model with tables: the batch's rows, in place when BeginStep returns (PS: pulled with the
  // parameters; local: read from the process's own tables), their gradients sent or applied by
  // FinishStep. Null: no tables.
  const TableStep* tables = nullptr;
  bool evaluate = false;  // the caller evaluates before computing: every parameter, exact
  // The rate of this step when the caller's own optimizer/schedule sets it (a frontend); NaN:
  // the job's schedule. Else finite and >= 0 (BeginStep refuses others: CheckStepRate). PS: it
  // goes with the step's push and the shards apply it (their per-mode rule unchanged).
  float lr = NAN;
};

// kInvalidArgument unless `lr` (StepPlan::lr) is NaN or a finite rate >= 0.
inline Status CheckStepRate(float lr) {
  if (std::isnan(lr) || (std::isfinite(lr) && lr >= 0)) return OkStatus();
  return InvalidArgumentError("a step's learning rate must be finite and >= 0, not " + std::to_string(lr));
}

// What a step's synchronization reports (the columns of a metrics row; ARCHITECTURE.md).
struct SyncStepStats {
  double comm_ms = 0;     // communication of the step, excluding wait_ms
  double wait_ms = 0;     // held back by the consistency rule (PS)
  double hidden_ms = 0;   // of comm_ms, the part that ran behind computation
  double blocked_ms = 0;  // of the caller's forward/backward, the time WaitParams/GradReady blocked
  double compute_ms = 0;  // computation done inside FinishStep that counts as the step's compute
                          // (local: the optimizer step)
  double version_lag = NAN;      // PS: of the last push (max over the shards)
  double clock_staleness = NAN;  // PS: of the last answered pull (max over the shards)
  uint64_t bytes_sent = 0;       // cumulative, this process, on the wire
  uint64_t bytes_received = 0;
  uint64_t shm_bytes_sent = 0;   // cumulative, through shared memory (SyncTraffic)
  uint64_t shm_bytes_received = 0;
  float loss_scale = NAN;        // fp16: the scale this step's gradient was computed with
  int64_t skipped_steps = 0;     // fp16: steps skipped so far (their gradient overflowed)
  // A model with embedding tables: the rows the step read and whose gradients it sent or applied
  // (the batch's unique ids over every table); 0 without tables.
  int64_t table_rows = 0;
  // PS modes with tables: how the step's reads of rows were served (MetricsRow::RowReads).
  MetricsRow::RowReads row_reads;
};

// The rows a step's tables name (SyncStepStats::table_rows); 0 for none.
inline int64_t TableStepRows(const TableStep* tables) {
  int64_t n = 0;
  if (tables != nullptr) {
    for (const auto& ids : tables->ids) n += static_cast<int64_t>(ids.size());
  }
  return n;
}

// Cumulative bytes of this process: on the wire (ZeroMQ, data channels, the ring's TCP), and
// the values moved through shared memory with processes of this host (PS lanes, the all-reduce's
// shared-memory group), counted as the wire would count them.
struct SyncTraffic {
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
  uint64_t shm_bytes_sent = 0;
  uint64_t shm_bytes_received = 0;
};

class GradientSync {
 public:
  virtual ~GradientSync() = default;

  // This worker's index among size() workers.
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Joins the job: the initial parameters reach every worker (PS: worker 0 initializes the
  // shards; all-reduce: rank 0's are broadcast). Returns the first step to run: 0, or where a
  // resumed job (all-reduce checkpoint) or a rejoining worker (the shards' clock) goes on.
  virtual Result<int64_t> Start(const JobShape& shape) = 0;

  // Starts step plan.step (PS: the pulls go out; sequential: and are waited for).
  virtual Status BeginStep(const StepPlan& plan) = 0;
  // Returns once tensor t's parameters of this step are in the parameter buffer.
  virtual Status WaitParams(size_t tensor) = 0;
  // Tensor t's gradient is final in the gradient buffer.
  virtual Status GradReady(size_t tensor) = 0;
  // The rows of `ids` (per table, sorted and unique) as they are now, into `rows` (table after
  // table, id after id): an evaluation's batch of a model with tables. The default: no tables.
  virtual Status ReadRows(std::span<const std::vector<uint64_t>> ids, std::span<float> rows) {
    (void)rows;
    return ids.empty() ? OkStatus() : UnimplementedError("this sync holds no embedding tables");
  }
  // A frontend that learns a step's ids only in its forward, after BeginStep (which had no
  // tables): it reads their rows with ReadRows, then names the step's tables here before
  // FinishStep, which sends or applies tables->grads for tables->ids as for StepPlan::tables
  // (tables->rows is not read). `tables` must stay valid until FinishStep returns; null: none.
  // The default: a sync that holds no embedding tables.
  virtual Status SetStepTables(const TableStep* tables) {
    return tables == nullptr ? OkStatus() : UnimplementedError("this sync holds no embedding tables");
  }
  // Tensor t got no gradient this step (a frontend's parameter whose .grad stayed None), instead
  // of GradReady: its parameters and optimizer state stay as they are, as torch leaves such a
  // parameter (Adam's step count included). The PS syncs tell the shards with the push (bsp: a
  // tensor absent from every worker's push of the round is left alone, one that another worker
  // has a gradient for is updated with the average, this worker's counted as zero). The default
  // refuses: all-reduce and local update every tensor here (a frontend with its own optimizer
  // leaves such parameters alone itself).
  virtual Status GradAbsent(size_t tensor) {
    return UnimplementedError("tensor " + std::to_string(tensor) + ": this sync updates every tensor");
  }
  // Finishes the step: the rest of the gradient is sent, the update applied (local,
  // all-reduce) or pushed (PS).
  virtual Result<SyncStepStats> FinishStep() = 0;
  // The step begun last will not be finished: what it left in flight is waited for or let go,
  // and nothing more of its gradient is sent.
  virtual void AbandonStep() = 0;
  // After `failure` failed the step: repairs what can be repaired (PS: waits for a restarted
  // server, reconnects, rejoins at the step) and returns OK when the step may be run again;
  // otherwise returns the failure.
  virtual Status Recover(const Status& failure) = 0;
  // After the last step: every worker's updates are applied (PS: the last push answered, then
  // the workers' barrier); with evaluate, the exact final parameters are in the buffer.
  virtual Status EndTraining(bool evaluate) = 0;
  // EndTraining for a worker that has run out of data while the others may train on (uneven
  // inputs, Horovod's join()): PS modes: its last push answered, it leaves the consistency rule
  // (the shards go on without it, as without a dead worker, and still answer its pulls), and it
  // returns once every worker has ended or left. Default: EndTraining (all-reduce and local have
  // nothing to leave; a frontend handles join there itself).
  virtual Status Leave(bool evaluate) { return EndTraining(evaluate); }

  // An evaluation within a step (the caller's, between BeginStep and the step's computation)
  // reads the parameter buffer between these two calls: BeginEvaluation may put the parameters
  // to evaluate there, EndEvaluation puts the step's own back. Default: the step's own are
  // evaluated (local SGD and DiLoCo evaluate the global model: worker/sync/periodic_sync.h).
  virtual void BeginEvaluation() {}
  virtual void EndEvaluation() {}

  // True when a device model's parameters and gradients stay on the device (the sync reads
  // and updates them there); false: the sync reads the host gradient buffer and writes the
  // host parameter buffer, so a device model's are copied across around it.
  virtual bool on_device() const { return false; }
  // Bytes this process has sent and received for the job so far.
  virtual SyncTraffic traffic() const { return {}; }
};

}  // namespace gradsync
