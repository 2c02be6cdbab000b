// The native side of the Python frontend, free of Python: a job joined from gradsync-worker's
// flags (FrontendJob) and a GradientSync over the flat buffers of a model that Python computes
// (FrontendSync). python/native/module.cc binds them with pybind11; everything here reports
// failure by throwing StatusError, which the binding turns into a Python exception.
//
//   FrontendJob job = FrontendJob({"prog", "--mode=bsp", "--scheduler=127.0.0.1:7000"});  // + GRADSYNC_*
//   FrontendSync sync(&job, {{"fc.weight", {128, 784}}, {"fc.bias", {128}}}, optimizer);
//   // PyTorch's parameters and gradients become views of sync.params() / sync.grads()
//   int64_t step = sync.Start(total_steps, steps_per_epoch);
//   sync.BeginStep(step, false, lr);  ...  WaitParams(t) / GradReady(t)  ...  sync.FinishStep();
//
// The model (ExternalModel) only holds the layout and the two flat buffers: the computation is
// PyTorch's. Modes: local (no sync: every call returns at once), bsp / ssp / asp (PsSync, or
// PsOverlapSync when overlap is on and nothing is compressed: per-tensor pushes and pulls), and
// allreduce (AllreduceSync averaging the gradient in place; the caller's optimizer steps).
// Threading: as GradientSync (one training thread per sync).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/base/status.h"
#include "common/config/train_config.h"
#include "models/external_model.h"
#include "models/model.h"
#include "python/native/frontend_tables.h"
#include "python/native/shard_state.h"
#include "worker/allreduce/bucket_average.h"
#include "worker/allreduce/dense_averager.h"
#include "worker/job_link.h"
#include "worker/ps/client/ps_client.h"
#include "worker/ps/ps_sync.h"
#include "worker/sync/gradient_sync.h"

namespace gradsync::python {

// A failed Status, thrown.
class StatusError : public std::runtime_error {
 public:
  explicit StatusError(const Status& s) : std::runtime_error(s.message()), code_(s.code()) {}
  StatusCode code() const { return code_; }

 private:
  StatusCode code_;
};

void ThrowIfError(const Status& s);

// `name` with the lifetime of the process, for a trace event's name or category (common/obs/trace.h).
const char* TraceName(const std::string& name);

class FrontendJob {
 public:
  // Parses `argv` (argv[0] a program name, then gradsync-worker's flags) and the GRADSYNC_*
  // environment, validates the settings, and joins the job (blocks until every worker has
  // registered). Throws kInvalidArgument for a bad flag or a refused registration.
  explicit FrontendJob(const std::vector<std::string>& argv);
  ~FrontendJob();

  int rank() const { return link_.rank; }
  int size() const { return link_.num_workers(); }
  config::Mode mode() const { return train_.mode(); }
  // ssp: the job's bound; 0 otherwise.
  int staleness() const;
  const config::TrainConfig& train() const { return train_; }
  const config::WorkerProcess& process() const { return process_; }
  JobLink& link() { return link_; }
  // Every worker's `data`, by rank (a scheduler barrier); local mode: {data}.
  std::vector<std::string> Gather(const std::string& name, const std::string& data, double timeout_s);
  // Every worker's `data` becomes root's: over the ring (all-reduce) or, in chunks of at most
  // kMaxGatherBytes, through the scheduler (PS modes). `data.size()` must be the same on every
  // worker and a multiple of 4.
  void Broadcast(std::span<std::byte> data, int root);
  // Averages (or sums) `data` over the job's ring in place (all-reduce mode; one worker:
  // unchanged).
  void AllReduce(FloatSpan data, ReduceOp op);
  // Every worker's `mine`, by rank (sizes may differ): over the ring's all-gather (all-reduce
  // mode, unless `via_scheduler`) or, in rounds of at most kMaxGatherBytes a worker, through the
  // scheduler, where a worker that joined while others train is no member (its entry: empty);
  // local mode: {mine}. Every worker must call it, in the same order as its other collectives.
  std::vector<std::string> AllGather(const std::string& mine, bool via_scheduler = false);
  // Mode allreduce: tells the scheduler this worker ended training after `steps` (the PS syncs
  // do it themselves), and whether it joined (the scheduler's gathers then go on without it).
  void TrainingEnded(int64_t steps, bool joined);
  // The host each worker advertised, by rank (local mode: this one's).
  std::vector<std::string> WorkerHosts() const;
  // PS modes: the workers that ended training, as the scheduler told (TRAINING_ENDED).
  std::vector<EndedWorker> EndedWorkers() const;
  // Tells the scheduler how this worker ended (once; later calls do nothing).
  void Finished(const Status& status);
  // After the end of training (PS modes): AllGather's calls are counted again from the largest
  // count of any worker, through one gather: a worker that joined early skipped the others'
  // collectives, and the next ones must have the same names everywhere.
  void AlignGathers();

 private:
  config::TrainConfig train_;
  config::WorkerProcess process_;
  JobLink link_;
  bool finished_ = false;
  int64_t gathers_ = 0;  // AllGather's calls through the scheduler, for their barrier names
  int64_t aligns_ = 0;   // AlignGathers' calls
};

// Averages buckets of gradient over the job's ring, plain or compressed (BucketAverager), or
// with PowerSGD's factors per tensor of the bucket (a DenseAverager per bucket index, over the
// shapes DDP's bucket declares): the DDP communication hook's native side. All-reduce mode only.
class FrontendBucketReducer {
 public:
  FrontendBucketReducer(FrontendJob* job, const std::string& codec, bool error_feedback);
  // `shapes`: the bucket's tensors, in order (a codec that needs_shapes, PowerSGD, needs them; the
  // payload codecs ignore them).
  void Average(FloatSpan bucket, size_t bucket_index, uint64_t step, const std::vector<std::vector<int64_t>>& shapes = {});
  bool needs_shapes() const { return by_shape_; }
  SyncTraffic traffic() const;

 private:
  FrontendJob* job_;
  std::string codec_;
  bool error_feedback_ = false;
  bool by_shape_ = false;  // the codec needs_shapes: an averager per bucket, made for its shapes
  std::unique_ptr<BucketAverager> averager_;
  // Per bucket index, its averager and the shapes it was made for.
  std::map<size_t, std::pair<std::vector<std::vector<int64_t>>, std::unique_ptr<DenseAverager>>> by_shape_averagers_;
};

struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
};

// The wrapped optimizer, as the PS shards apply it (the all-reduce and local modes leave it to
// the caller).
struct OptimizerSpec {
  std::string kind = "sgd";  // sgd | adam
  float lr = 0.01f;
  float momentum = 0;
  bool nesterov = false;
  float weight_decay = 0;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  // doubles, as PyTorch's Python floats
};

class FrontendSync {
 public:
  // Checks (through the scheduler) that every worker declares the same tensors, in the same
  // order, with the same shapes: a difference throws kInvalidArgument naming the first tensor
  // that differs and the workers. Then builds the sync of the job's mode. `job` must outlive it.
  // `compression`: a codec spec overriding the job's --compress ("" = the job's);
  // `error_feedback`: -1 the job's --error-feedback, else 0 / 1.
  // `tables`: the model's embedding tables (gradsync.torch.Embedding), compared across workers
  // with the tensors; their rows live on the shards, in each worker's replica (allreduce) or in
  // this process (local), never whole here (tables()).
  FrontendSync(FrontendJob* job, const std::vector<TensorSpec>& tensors, const OptimizerSpec& optimizer,
               const std::string& compression = "", int error_feedback = -1,
               const std::vector<TableSpec>& tables = {});
  ~FrontendSync();

  FloatSpan params() { return model_->params(); }
  FloatSpan grads() { return model_->grads(); }
  const std::vector<TensorInfo>& layout() const { return model_->layout(); }
  // True when pushes leave per tensor and pulls come per tensor (PS overlap) or buckets are
  // all-reduced during backward (all-reduce overlap).
  bool overlapped() const { return overlapped_; }
  const std::string& kind() const { return kind_; }
  // Local SGD / DiLoCo (--sync-every): the steps of a round (0: every step is exchanged). The
  // caller's optimizer then steps before FinishStep, and a round's first step must begin before
  // the caller reads a parameter (BeginStep puts the global model there).
  int64_t sync_every() const { return sync_every_; }

  int64_t Start(int64_t total_steps, int64_t steps_per_epoch);
  // lr: the step's rate when the caller's optimizer sets it (PS: it goes with the push); NaN:
  // the job's schedule.
  void BeginStep(int64_t step, bool evaluate, float lr);
  void WaitParams(size_t tensor);
  void GradReady(size_t tensor);
  // PS modes: tensor t got no gradient this step (GradientSync::GradAbsent): the shards leave it
  // alone. All-reduce and local modes refuse it (the Python side skips such tensors itself).
  void GradAbsent(size_t tensor);
  SyncStepStats FinishStep();
  void AbandonStep();
  // After the last step. join: this worker ran out of data while others may run more steps (PS
  // modes: GradientSync::Leave, it leaves the consistency rule and waits until every worker has
  // ended or left); all-reduce and local: the same as without (the Python side handles join).
  void EndTraining(bool evaluate, bool join = false);
  SyncTraffic traffic() const;
  // The job's injected delay (--straggle, --straggle-seed: GRADSYNC_STRAGGLE from a spec's
  // straggler), slept after a step's computation of compute_ms as gradsync-worker sleeps it (the
  // same draws); returns the milliseconds slept (0 without one).
  double Straggle(double compute_ms);
  // PS modes: the replies to this worker's pushes and pulls, as its summary counts them.
  PsClient::ReplyCounts reply_counts() const { return client_ ? client_->replies().counts() : PsClient::ReplyCounts{}; }

  // PS modes: the shards' optimizer state and parameters, read and set (shard_state.h); other
  // modes: kInvalidArgument (the wrapped optimizer keeps its state in this process).
  FrontendShardState& shard_state();
  // The model's embedding tables: a forward's rows, a step's row gradients.
  FrontendTables& tables() { return *tables_; }

 private:
  FrontendJob* job_;
  std::unique_ptr<ExternalModel> model_;
  std::unique_ptr<PsClient> client_;
  std::unique_ptr<GradientSync> sync_;  // null in local mode
  std::unique_ptr<FrontendShardState> shard_state_;  // PS modes (not with --sync-every)
  std::unique_ptr<FrontendTables> tables_;           // after sync_, which it reads through
  float step_lr_ = NAN;                              // BeginStep's rate (mode local's tables apply it)
  bool overlapped_ = false;
  bool in_step_ = false;
  double compute_begin_us_ = -1;  // traces: when BeginStep returned (the user's compute began)
  std::string kind_ = "local";
  int64_t sync_every_ = 0;
  Straggler straggler_;
};

}  // namespace gradsync::python
