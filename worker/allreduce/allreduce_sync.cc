#include "worker/allreduce/allreduce_sync.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "common/base/clock.h"
#include "common/obs/trace.h"
#include "gradsync.pb.h"
#include "worker/loop/epoch.h"

namespace gradsync {
AllreduceSync::AllreduceSync(const AllreduceTrainOptions& options, Model* model, Collective* collective)
    : options_(options), model_(model), collective_(collective),
      dense_runs_(DenseRuns(model->layout(), {0, model->num_params()})),
      checkpoints_(options.checkpoint, options.zero, model, collective, &shards_) {}

Status AllreduceSync::AverageGradients() {
  // Dense tensors: bucket by bucket, or PowerSGD's factors (DenseAverager).
  RETURN_IF_ERROR(averager_->Average(model_->grads(), static_cast<uint64_t>(step_)));
  // Sparse tensors: indices differ per rank, so (key, value) pairs are all-gathered.
  return sparse_.Average(*model_, *collective_);
}

Status AllreduceSync::CheckOptions() const {
  const bool device = model_->on_device();
  if (!options_.apply_update && (device || HasSparse(model_->layout()) || options_.checkpoint.resume || options_.checkpoint.every > 0)) {
    return InvalidArgumentError("averaging without an update (the caller's optimizer) takes dense CPU models without checkpoints");
  }
  if (device) {
    if (!options_.device_collective) return FailedPreconditionError("a CUDA model needs a device collective (NCCL)");
    if (!options_.codec.compression.empty()) return InvalidArgumentError("--compress is not supported with --device=cuda in allreduce mode");
  }
  const int zero = options_.zero;
  if (zero < 0 || zero > 2) return InvalidArgumentError("--zero must be 0, 1 or 2");
  if (zero > 0) {
    if (HasSparse(model_->layout())) return InvalidArgumentError("--zero applies to dense models");
    if (!options_.apply_update) return InvalidArgumentError("--zero shards the optimizer: it needs gradsync's own update");
  }
  return OkStatus();
}

Status AllreduceSync::BroadcastParams() {
  const auto& o = options_.train;
  RETURN_IF_ERROR(collective_->Broadcast(model_->params(), 0).WithContext("broadcasting the initial parameters"));
  if (model_->on_device()) {
    RETURN_IF_ERROR(model_->ParamsToDevice());
    if (options_.zero > 0) {
      const int64_t tail = static_cast<int64_t>(shards_.device_count());
      RETURN_IF_ERROR(model_->SetOptimizerRanges(o.optimizer, {shards_.segment(), Segment{tail, model_->num_params()}}));
    } else {
      RETURN_IF_ERROR(model_->SetOptimizer(o.optimizer));
    }
  }
  return OkStatus();
}

std::string AllreduceSync::GradientCodec(const AllreduceTrainOptions& o, bool on_device) {
  return o.codec.compression.empty() && !on_device ? PrecisionCodec(o.train.numerics.precision) : o.codec.compression;
}

OverlapFacts AllreduceSync::OverlapFactsOf(const AllreduceTrainOptions& o, const Model& model, int workers) {
  const std::string codec = GradientCodec(o, model.on_device());
  return {.requested = o.overlap,
          .compressed = !codec.empty() && codec != "none",
          .sparse = HasSparse(model.layout()) || !model.tables().empty(),  // tables: rows after backward
          .on_device = model.on_device(),
          .per_tensor_params = model.waits_for_params(),
          .straggles = o.train.straggler.spec.kind != StragglerSpec::Kind::kNone,
          .rounds = o.train.periodic.every > 0,
          .workers = workers,
          .zero = o.zero};
}

Status AllreduceSync::CreateAveragers() {
  const auto& o = options_.train;
  const bool device = model_->on_device();
  scaling_.emplace(o.numerics);
  // The CPU gradient travels as the named codec, else in the precision's 16 bits (on the device
  // NCCL moves the 16-bit gradient: FinishStep).
  const std::string codec = GradientCodec(options_, device);
  ASSIGN_OR_RETURN(averager_, MakeDenseAverager(collective_, model_->layout(),
                                                {.codec = codec, .seed = o.seed, .error_feedback = options_.codec.error_feedback,
                                                 .correction_momentum = options_.codec.correction_momentum,
                                                 .bucket_bytes = options_.bucket_bytes,
                                                 .allow_overflow = scaling_->active()}));
  if (averager_->compressed()) {
    for (const auto& t : model_->layout()) {
      if (t.sparse) return InvalidArgumentError("--compress applies to dense models; " + t.name + " is sparse");
    }
  }
  // Stage 1 reduce-scatters after backward (no overlap); stage 2 bucket by bucket during it.
  if (AllreduceOverlaps(OverlapFactsOf(options_, *model_, collective_->size()))) {
    reducer_ = std::make_unique<OverlappedReducer>(collective_, model_->layout(), options_.bucket_bytes,
                                                   options_.first_bucket_bytes);
    if (options_.zero == 2) reducer_->ReduceScatterToShards(shards_.bounds());
  }
  return OkStatus();
}

void AllreduceSync::CreateOptimizer(const JobShape& shape) {
  const auto& o = options_.train;
  const bool device = model_->on_device();
  const int zero = options_.zero;
  lr_ = RunSchedule(o, shape.total_steps, shape.steps_per_epoch);
  const int64_t opt_size = device ? 0 : zero > 0 ? static_cast<int64_t>(shards_.end() - shards_.begin()) : model_->num_params();
  opt_.emplace(o.optimizer, opt_size);
  // LARS's and LAMB's layers: the whole model's, or those of this rank's ZeRO shard (a layer cut
  // by the shard's bounds is a layer of its own there: its norms are the shard's part's).
  if (!device) {
    opt_->SetLayers(OptimizerLayers(model_->layout(), zero > 0 ? shards_.segment() : Segment{0, model_->num_params()}));
  }
}

Result<int64_t> AllreduceSync::Start(const JobShape& shape) {
  const auto& o = options_.train;
  const int rank = collective_->rank(), n = collective_->size();
  const bool device = model_->on_device();
  const int zero = options_.zero;
  RETURN_IF_ERROR(CheckOptions());
  // The shards of the flat parameter vector (ZeroShards: on the device NCCL's equal chunks).
  if (zero > 0) shards_.Cut(n, rank, static_cast<size_t>(model_->num_params()), device);
  // --resume: rank 0 reads the checkpoint; every rank learns the step, then the parameters
  // (the initial broadcast) and the momentum come from it.
  int64_t start_step = 0;
  int resumed_zero = 0;
  wire::TrainerCheckpoint resumed;
  if (options_.checkpoint.resume) {
    RETURN_IF_ERROR(checkpoints_.ShareStep(o.optimizer.kind, &resumed, &start_step, &resumed_zero));
  }
  RETURN_IF_ERROR(BroadcastParams());
  RETURN_IF_ERROR(CreateAveragers());
  CreateOptimizer(shape);
  RETURN_IF_ERROR(checkpoints_.ResumeOptimizerState(resumed, start_step, resumed_zero, o.optimizer, &*opt_));
  if (zero > 0 && rank == 0 && !device) {  // (on the device the state is the model's)
    const size_t whole = Optimizer(o.optimizer, 1).state().size_bytes() * static_cast<size_t>(model_->num_params());
    std::printf("worker 0: ZeRO stage %d: each of the %d workers updates 1/%d of the %lld parameters and keeps their "
                "optimizer state only (%zu bytes here, %zu unsharded)\n",
                zero, n, n, static_cast<long long>(model_->num_params()), opt_->state().size_bytes(), whole);
    std::fflush(stdout);
  }
  opt_->set_steps(start_step);  // one optimizer step per training step (Adam's t)
  if (options_.checkpoint.resume) {  // every rank: each says where it goes on from (rank 0's file, broadcast)
    std::printf("worker %d: resumed from %s at step %lld of %lld\n", rank, checkpoints_.path().c_str(), static_cast<long long>(start_step),
                static_cast<long long>(shape.total_steps));
    std::fflush(stdout);
  }
  return start_step;
}

Status AllreduceSync::BeginStep(const StepPlan& plan) {
  RETURN_IF_ERROR(CheckStepRate(plan.lr));
  step_ = plan.step;
  step_lr_ = plan.lr;
  if (reducer_) reducer_->Begin(model_->grads());
  if (options_.apply_update) scaling_->Begin(*model_);
  return OkStatus();
}

Status AllreduceSync::ShardedUpdate(float rate, bool apply) {
  if (!apply) return OkStatus();  // a skipped step: every rank skips it, so nothing changes anywhere
  const size_t b = shards_.begin(), e = shards_.end();
  opt_->Step(model_->params().subspan(b, e - b), model_->grads().subspan(b, e - b), rate, 0, scaling_->inverse());
  opt_->EndStep();
  return collective_->AllGatherChunks(model_->params(), shards_.bounds());
}

Status AllreduceSync::DeviceReduceAndStep(int64_t step, float rate) {
  // NCCL on the device gradient, then the optimizer, both on the model's stream; the one
  // wait (with a deadline) is here, so that a dead peer fails the step instead of hanging.
  DeviceCollective& dc = *options_.device_collective;
  const std::string where = "step " + std::to_string(step);
  if (options_.zero > 0) {
    // NCCL reduce-scatter of the equal chunks, the optimizer on this rank's chunk (and the
    // few elements past them, all-reduced), then the parameters all-gathered.
    const size_t even = shards_.device_count(), rest = static_cast<size_t>(model_->num_params()) - even;
    RETURN_IF_ERROR(dc.ReduceScatterDevice(model_->device_grads(), even, ReduceOp::kAverage, model_->device_stream()).WithContext(where));
    if (rest > 0) {
      RETURN_IF_ERROR(dc.AllReduceDevice(model_->device_grads() + even, rest, ReduceOp::kAverage, model_->device_stream()).WithContext(where));
    }
    RETURN_IF_ERROR(model_->OptimizerStep(rate));
    RETURN_IF_ERROR(dc.AllGatherDevice(model_->device_params(), even, model_->device_stream()).WithContext(where));
  } else if (const auto format = PrecisionFormat(options_.train.numerics.precision)) {
    // 16 bits on the wire: each rank's gradient pre-divided by n in 16 bits, summed by NCCL
    // in 16 bits, back to fp32 with the loss scale divided out. fp16 waits for the verdict
    // (every rank holds the same sum, so every rank decides alike) before the optimizer.
    const size_t count = static_cast<size_t>(model_->num_params());
    RETURN_IF_ERROR(model_->PackGrads16(1.0f / static_cast<float>(collective_->size())).WithContext(where));
    RETURN_IF_ERROR(dc.AllReduceDevice16(model_->device_grads16(), count, *format, model_->device_stream()).WithContext(where));
    RETURN_IF_ERROR(model_->UnpackGrads16(scaling_->inverse()).WithContext(where));
    bool finite = true;
    if (scaling_->active()) {
      RETURN_IF_ERROR(dc.SynchronizeDevice(model_->device_stream(), options_.collective_timeout_s).WithContext(where));
      ASSIGN_OR_RETURN(finite, model_->GradsFinite());
    }
    if (scaling_->Finish(finite)) RETURN_IF_ERROR(model_->OptimizerStep(rate));
  } else {
    RETURN_IF_ERROR(dc.AllReduceDevice(model_->device_grads(), static_cast<size_t>(model_->num_params()),
                                       ReduceOp::kAverage, model_->device_stream())
                        .WithContext(where));
    RETURN_IF_ERROR(model_->OptimizerStep(rate));
  }
  RETURN_IF_ERROR(dc.SynchronizeDevice(model_->device_stream(), options_.collective_timeout_s)
                      .WithContext("step " + std::to_string(step)));
  return OkStatus();
}

void AllreduceSync::ApplyUpdate(float rate) {
  TraceSpan span("optimizer", "compute");
  for (size_t t = 0; t < model_->layout().size(); ++t) {
    const TensorInfo& ti = model_->layout()[t];
    if (ti.sparse) opt_->StepSparse(model_->tensor(t), sparse_.merged(t).keys, sparse_.merged(t).values, rate, ti.offset);
  }
  for (const Segment& run : dense_runs_) {
    opt_->Step(model_->params().subspan(run.begin, run.size()), model_->grads().subspan(run.begin, run.size()), rate,
               run.begin, scaling_->inverse());
  }
  opt_->EndStep();
}

Result<SyncStepStats> AllreduceSync::FinishStep() {
  const int64_t step = step_;
  const float rate = std::isnan(step_lr_) ? lr_.At(step) : step_lr_;
  const bool device = model_->on_device();
  Stopwatch comm;
  double comm_ms = 0, hidden_ms = 0;
  if (device) {
    RETURN_IF_ERROR(DeviceReduceAndStep(step, rate));
    comm_ms = comm.Millis();
  } else if (reducer_) {
    RETURN_IF_ERROR(reducer_->Finish().WithContext("step " + std::to_string(step)));
    comm_ms = reducer_->busy_ms();
    hidden_ms = std::max(0.0, comm_ms - reducer_->exposed_ms());
  } else if (options_.zero > 0 && !averager_->compressed()) {
    RETURN_IF_ERROR(collective_->ReduceScatter(model_->grads(), ReduceOp::kAverage).WithContext("step " + std::to_string(step)));
    comm_ms = comm.Millis();
  } else {
    RETURN_IF_ERROR(AverageGradients().WithContext("step " + std::to_string(step)));
    comm_ms = comm.Millis();
  }
  // fp16: after the average (the same bits on every rank), the verdict on the step.
  const bool apply =
      device || !options_.apply_update || scaling_->Finish(!scaling_->active() || AllFinite(model_->grads()));
  if (!device && options_.zero > 0) {
    Stopwatch gather;
    RETURN_IF_ERROR(ShardedUpdate(rate, apply).WithContext("step " + std::to_string(step)));
    comm_ms += gather.Millis();
  } else if (!device && options_.apply_update && apply) {
    ApplyUpdate(rate);
  }
  if (options_.apply_update) RETURN_IF_ERROR(checkpoints_.MaybeWrite(step, *opt_));
  SyncStepStats stats;
  stats.comm_ms = comm_ms;
  stats.hidden_ms = hidden_ms;
  stats.bytes_sent = collective_->bytes_sent();
  stats.bytes_received = collective_->bytes_received();
  stats.shm_bytes_sent = collective_->shm_bytes_sent();
  stats.shm_bytes_received = collective_->shm_bytes_received();
  scaling_->Report(&stats);
  return stats;
}

}  // namespace gradsync
