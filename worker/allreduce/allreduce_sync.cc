#include "worker/allreduce/allreduce_sync.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>

#include "common/base/atomic_file.h"
#include "common/base/clock.h"
#include "common/obs/trace.h"
#include "gradsync.pb.h"
#include "worker/loop/epoch.h"

namespace gradsync {
namespace {
constexpr char kTrainerCheckpointMagic[] = "GSTRAIN1";  // the checked file's kind (common/base/atomic_file.h)
}  // namespace

AllreduceSync::AllreduceSync(const AllreduceTrainOptions& options, Model* model, Collective* collective)
    : options_(options), model_(model), collective_(collective),
      ckpt_path_(options.checkpoint_dir + "/allreduce.ckpt"),
      dense_runs_(DenseRuns(model->layout(), {0, model->num_params()})) {}

Status AllreduceSync::AverageGradients() {
  const auto& layout = model_->layout();
  merged_.resize(layout.size());
  // Dense tensors: bucket by bucket, or PowerSGD's factors (DenseAverager).
  RETURN_IF_ERROR(averager_->Average(model_->grads(), static_cast<uint64_t>(step_)));
  // Sparse tensors: indices differ per rank, so (key, value) pairs are all-gathered.
  const float inv_n = 1.0f / static_cast<float>(collective_->size());
  for (size_t t = 0; t < layout.size(); ++t) {
    if (!layout[t].sparse) continue;
    const SparseGrad& g = model_->sparse_grad(t);
    std::vector<std::byte> mine(g.keys.size() * (sizeof(uint64_t) + sizeof(float)));
    std::memcpy(mine.data(), g.keys.data(), g.keys.size() * sizeof(uint64_t));
    std::memcpy(mine.data() + g.keys.size() * sizeof(uint64_t), g.values.data(), g.values.size() * sizeof(float));
    RETURN_IF_ERROR(collective_->AllGather(mine, &gathered_));
    std::map<uint64_t, float> sum;
    for (const auto& part : gathered_) {  // rank order: the same sum on every rank
      const size_t k = part.size() / (sizeof(uint64_t) + sizeof(float));
      for (size_t q = 0; q < k; ++q) {
        uint64_t key;
        float v;
        std::memcpy(&key, part.data() + q * sizeof(uint64_t), sizeof(key));
        std::memcpy(&v, part.data() + k * sizeof(uint64_t) + q * sizeof(float), sizeof(v));
        if (key >= static_cast<uint64_t>(layout[t].size)) return DataLossError("all-gathered key out of range");
        sum[key] += v;
      }
    }
    merged_[t].keys.clear();
    merged_[t].values.clear();
    for (const auto& [k, v] : sum) {
      merged_[t].keys.push_back(k);
      merged_[t].values.push_back(v * inv_n);
    }
  }
  return OkStatus();
}

Status AllreduceSync::CheckOptions() const {
  const bool device = model_->on_device();
  if (!options_.apply_update && (device || HasSparse(model_->layout()) || options_.resume || options_.checkpoint_every > 0)) {
    return InvalidArgumentError("averaging without an update (the caller's optimizer) takes dense CPU models without checkpoints");
  }
  if (device) {
    if (!options_.device_collective) return FailedPreconditionError("a CUDA model needs a device collective (NCCL)");
    if (!options_.compression.empty()) return InvalidArgumentError("--compress is not supported with --device=cuda in allreduce mode");
  }
  const int zero = options_.zero;
  if (zero < 0 || zero > 2) return InvalidArgumentError("--zero must be 0, 1 or 2");
  if (zero > 0) {
    if (HasSparse(model_->layout())) return InvalidArgumentError("--zero applies to dense models");
    if (!options_.apply_update) return InvalidArgumentError("--zero shards the optimizer: it needs gradsync's own update");
  }
  return OkStatus();
}

void AllreduceSync::CutShards() {
  // The shards of the flat parameter vector. On the device NCCL cuts n equal chunks of the
  // largest multiple of n; the few elements past it (fewer than n) are all-reduced and every
  // rank updates them.
  const int n = collective_->size();
  const size_t params = static_cast<size_t>(model_->num_params());
  shards_.clear();
  if (model_->on_device()) {
    device_shard_count_ = params / static_cast<size_t>(n) * static_cast<size_t>(n);
    for (int i = 0; i <= n; ++i) shards_.push_back(device_shard_count_ / static_cast<size_t>(n) * static_cast<size_t>(i));
  } else {
    for (int i = 0; i <= n; ++i) shards_.push_back(ChunkBegin(params, n, i));
  }
}

Status AllreduceSync::ReadCheckpoint(wire::TrainerCheckpoint* resumed) {
  const auto& o = options_.train;
  const int n = collective_->size();
  ASSIGN_OR_RETURN(std::string bytes, ReadCheckedFile(ckpt_path_, kTrainerCheckpointMagic));
  if (!resumed->ParseFromString(bytes)) return DataLossError(ckpt_path_ + " is not an all-reduce checkpoint");
  if (resumed->workers() != n) {
    return InvalidArgumentError(ckpt_path_ + " was written by " + std::to_string(resumed->workers()) +
                                " workers; this job has " + std::to_string(n));
  }
  const std::string written = resumed->optimizer().empty() ? "sgd" : resumed->optimizer();
  if (written != OptimizerKindName(o.optimizer.kind)) {
    return InvalidArgumentError(ckpt_path_ + " was written with --optimizer=" + written + "; this run uses --optimizer=" +
                                OptimizerKindName(o.optimizer.kind));
  }
  if (resumed->params().size() != model_->params().size_bytes()) {
    return DataLossError(ckpt_path_ + " holds another model (" + std::to_string(resumed->params().size() / 4) +
                         " parameters, this one has " + std::to_string(model_->num_params()) + ")");
  }
  std::memcpy(model_->params().data(), resumed->params().data(), resumed->params().size());
  return OkStatus();
}

Status AllreduceSync::ShareCheckpointStep(wire::TrainerCheckpoint* resumed, int64_t* start_step, int* resumed_zero) {
  const int rank = collective_->rank();
  if (model_->on_device()) return InvalidArgumentError("--resume is not supported with --device=cuda");
  std::vector<float> head(4, 0.0f);  // found, step / 2^20, step % 2^20 (exact in floats), the writer's ZeRO stage
  Status load;
  if (rank == 0) {
    load = ReadCheckpoint(resumed);
    if (load.ok() && resumed->zero() > 0 && options_.zero == 0) {
      load = InvalidArgumentError(ckpt_path_ + " was written with --zero=" + std::to_string(resumed->zero()) +
                                  " (each rank's optimizer state in its own file): resume with --zero=1 or 2");
    }
    if (load.ok()) {
      head = {1.0f, static_cast<float>(resumed->step() >> 20), static_cast<float>(resumed->step() & 0xFFFFF),
              static_cast<float>(resumed->zero())};
    }
  }
  RETURN_IF_ERROR(collective_->Broadcast(head, 0).WithContext("sharing the checkpoint's step"));
  if (head[0] != 1.0f) return rank == 0 ? load.WithContext("--resume") : FailedPreconditionError("--resume: rank 0 has no checkpoint");
  *start_step = (static_cast<int64_t>(head[1]) << 20) + static_cast<int64_t>(head[2]);
  *resumed_zero = static_cast<int>(head[3]);
  return OkStatus();
}

Status AllreduceSync::BroadcastParams() {
  const auto& o = options_.train;
  RETURN_IF_ERROR(collective_->Broadcast(model_->params(), 0).WithContext("broadcasting the initial parameters"));
  if (model_->on_device()) {
    RETURN_IF_ERROR(model_->ParamsToDevice());
    if (options_.zero > 0) {
      const int64_t tail = static_cast<int64_t>(device_shard_count_);
      RETURN_IF_ERROR(model_->SetOptimizerRanges(
          o.optimizer, {Segment{static_cast<int64_t>(shard_begin()), static_cast<int64_t>(shard_end())}, Segment{tail, model_->num_params()}}));
    } else {
      RETURN_IF_ERROR(model_->SetOptimizer(o.optimizer));
    }
  }
  return OkStatus();
}

std::string AllreduceSync::GradientCodec(const AllreduceTrainOptions& o, bool on_device) {
  return o.compression.empty() && !on_device ? PrecisionCodec(o.train.precision) : o.compression;
}

OverlapFacts AllreduceSync::OverlapFactsOf(const AllreduceTrainOptions& o, const Model& model, int workers) {
  const std::string codec = GradientCodec(o, model.on_device());
  return {.requested = o.overlap,
          .compressed = !codec.empty() && codec != "none",
          .sparse = HasSparse(model.layout()),
          .on_device = model.on_device(),
          .per_tensor_params = model.waits_for_params(),
          .straggles = o.train.straggler.kind != StragglerSpec::Kind::kNone,
          .rounds = o.train.periodic.every > 0,
          .workers = workers,
          .zero = o.zero};
}

Status AllreduceSync::CreateAveragers() {
  const auto& o = options_.train;
  const bool device = model_->on_device();
  scaling_.emplace(o.precision, o.initial_loss_scale);
  // The CPU gradient travels as the named codec, else in the precision's 16 bits (on the device
  // NCCL moves the 16-bit gradient: FinishStep).
  const std::string codec = GradientCodec(options_, device);
  ASSIGN_OR_RETURN(averager_, MakeDenseAverager(collective_, model_->layout(),
                                                {.codec = codec, .seed = o.seed, .error_feedback = options_.error_feedback,
                                                 .correction_momentum = options_.correction_momentum,
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
    if (options_.zero == 2) reducer_->ReduceScatterToShards(shards_);
  }
  return OkStatus();
}

void AllreduceSync::CreateOptimizer(const JobShape& shape) {
  const auto& o = options_.train;
  const bool device = model_->on_device();
  const int zero = options_.zero;
  lr_ = RunSchedule(o, shape.total_steps, shape.steps_per_epoch);
  const int64_t opt_size = device ? 0 : zero > 0 ? static_cast<int64_t>(shard_end() - shard_begin()) : model_->num_params();
  opt_.emplace(o.optimizer, opt_size);
  // LARS's and LAMB's layers: the whole model's, or those of this rank's ZeRO shard (a layer cut
  // by the shard's bounds is a layer of its own there: its norms are the shard's part's).
  if (!device) {
    opt_->SetLayers(OptimizerLayers(model_->layout(), zero > 0 ? Segment{static_cast<int64_t>(shard_begin()),
                                                                         static_cast<int64_t>(shard_end())}
                                                               : Segment{0, model_->num_params()}));
  }
}

Status AllreduceSync::ResumeOptimizerState(const wire::TrainerCheckpoint& resumed, int64_t start_step,
                                           int resumed_zero) {
  const auto& o = options_.train;
  const int rank = collective_->rank();
  if (options_.resume && options_.zero > 0 && !model_->on_device()) {
    // A plain checkpoint's whole state (rank 0 broadcasts it) or each rank's shard file.
    std::vector<float> whole;
    if (resumed_zero == 0) {
      const size_t per = Optimizer(o.optimizer, 1).state().size();  // state floats per parameter
      whole.assign(per * static_cast<size_t>(model_->num_params()), 0.0f);
      if (rank == 0 && resumed.optimizer_state().size() == whole.size() * sizeof(float)) {
        std::memcpy(whole.data(), resumed.optimizer_state().data(), resumed.optimizer_state().size());
      }
      RETURN_IF_ERROR(collective_->Broadcast(whole, 0).WithContext("broadcasting the checkpoint's optimizer state"));
    }
    RETURN_IF_ERROR(LoadShardState(start_step, resumed_zero > 0, whole));
  } else if (options_.resume && !opt_->state().empty()) {
    std::vector<float> state(opt_->state().size(), 0.0f);
    if (rank == 0 && resumed.optimizer_state().size() == state.size() * sizeof(float)) {
      std::memcpy(state.data(), resumed.optimizer_state().data(), resumed.optimizer_state().size());
    }
    RETURN_IF_ERROR(collective_->Broadcast(state, 0).WithContext("broadcasting the checkpoint's optimizer state"));
    opt_->SetState(state);
  }
  return OkStatus();
}

Result<int64_t> AllreduceSync::Start(const JobShape& shape) {
  const auto& o = options_.train;
  const int rank = collective_->rank(), n = collective_->size();
  const bool device = model_->on_device();
  const int zero = options_.zero;
  RETURN_IF_ERROR(CheckOptions());
  if (zero > 0) CutShards();
  // --resume: rank 0 reads the checkpoint; every rank learns the step, then the parameters
  // (the initial broadcast) and the momentum come from it.
  int64_t start_step = 0;
  int resumed_zero = 0;
  wire::TrainerCheckpoint resumed;
  if (options_.resume) RETURN_IF_ERROR(ShareCheckpointStep(&resumed, &start_step, &resumed_zero));
  RETURN_IF_ERROR(BroadcastParams());
  RETURN_IF_ERROR(CreateAveragers());
  CreateOptimizer(shape);
  RETURN_IF_ERROR(ResumeOptimizerState(resumed, start_step, resumed_zero));
  if (zero > 0 && rank == 0 && !device) {  // (on the device the state is the model's)
    const size_t whole = Optimizer(o.optimizer, 1).state().size_bytes() * static_cast<size_t>(model_->num_params());
    std::printf("worker 0: ZeRO stage %d: each of the %d workers updates 1/%d of the %lld parameters and keeps their "
                "optimizer state only (%zu bytes here, %zu unsharded)\n",
                zero, n, n, static_cast<long long>(model_->num_params()), opt_->state().size_bytes(), whole);
    std::fflush(stdout);
  }
  opt_->set_steps(start_step);  // one optimizer step per training step (Adam's t)
  if (options_.resume) {  // every rank: each says where it goes on from (rank 0's file, broadcast)
    std::printf("worker %d: resumed from %s at step %lld of %lld\n", rank, ckpt_path_.c_str(), static_cast<long long>(start_step),
                static_cast<long long>(shape.total_steps));
    std::fflush(stdout);
  }
  return start_step;
}

std::string AllreduceSync::ShardPath(int rank, bool previous) const {
  return options_.checkpoint_dir + "/allreduce-shard-" + std::to_string(rank) + (previous ? ".prev" : "") + ".ckpt";
}

// Plain: rank 0 writes everything. ZeRO: every rank writes its shard's state first (the file it
// replaces becomes .prev, so that the shards of rank 0's last checkpoint survive a failure in
// between), every rank learns whether every rank could, and only then rank 0 writes the
// parameters; a failure on any rank leaves the last checkpoint as it was.
Status AllreduceSync::WriteCheckpoint(int64_t step, bool* collective_failed) {
  const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  const int rank = collective_->rank();
  if (options_.zero > 0) {
    wire::TrainerCheckpoint shard;
    shard.set_step(step);
    shard.set_workers(collective_->size());
    shard.set_optimizer_state(opt_->state().data(), opt_->state().size_bytes());
    shard.set_optimizer(OptimizerKindName(opt_->options().kind));
    shard.set_written_at(now);
    shard.set_zero(options_.zero);
    shard.set_rank(rank);
    shard.set_shard_begin(static_cast<int64_t>(shard_begin()));
    shard.set_shard_end(static_cast<int64_t>(shard_end()));
    Status mine = [&]() -> Status {
      if (std::rename(ShardPath(rank, false).c_str(), ShardPath(rank, true).c_str()) != 0 && errno != ENOENT) {
        return InternalError("cannot keep " + ShardPath(rank, false) + " as " + ShardPath(rank, true) + ": " + std::strerror(errno));
      }
      return WriteCheckedFile(ShardPath(rank, false), kTrainerCheckpointMagic, shard.SerializeAsString());
    }();
    std::vector<float> failed = {mine.ok() ? 0.0f : 1.0f};
    if (Status s = collective_->AllReduce(failed, ReduceOp::kSum); !s.ok()) {
      *collective_failed = true;
      return s.WithContext("checkpoint at step " + std::to_string(step));
    }
    if (!mine.ok()) return mine;
    if (failed[0] > 0) {
      return rank == 0 ? InternalError(std::to_string(static_cast<int>(failed[0])) +
                                       " rank(s) could not write their shard; the last checkpoint stays")
                       : OkStatus();
    }
    if (rank != 0) return OkStatus();
  }
  wire::TrainerCheckpoint c;
  c.set_step(step);
  c.set_workers(collective_->size());
  c.set_params(model_->params().data(), model_->params().size_bytes());
  if (options_.zero == 0) c.set_optimizer_state(opt_->state().data(), opt_->state().size_bytes());
  c.set_optimizer(OptimizerKindName(opt_->options().kind));
  c.set_written_at(now);
  c.set_zero(options_.zero);
  return WriteCheckedFile(ckpt_path_, kTrainerCheckpointMagic, c.SerializeAsString());
}

Status AllreduceSync::LoadShardState(int64_t step, bool from_shard_files, const std::vector<float>& whole) {
  const int rank = collective_->rank();
  const size_t b = shard_begin(), e = shard_end(), params = static_cast<size_t>(model_->num_params());
  std::vector<float> state(opt_->state().size(), 0.0f);
  Status mine = [&]() -> Status {
    if (!from_shard_files) {
      // Each of the state's buffers (SGD's momentum, Adam's m then v) cut to the shard.
      const size_t buffers = params == 0 ? 0 : whole.size() / params;
      if (buffers * (e - b) != state.size()) return DataLossError(ckpt_path_ + " holds another optimizer's state");
      for (size_t k = 0; k < buffers; ++k) {
        std::copy(whole.begin() + static_cast<std::ptrdiff_t>(k * params + b),
                  whole.begin() + static_cast<std::ptrdiff_t>(k * params + e), state.begin() + static_cast<std::ptrdiff_t>(k * (e - b)));
      }
      return OkStatus();
    }
    std::string why;
    for (bool previous : {false, true}) {
      const std::string path = ShardPath(rank, previous);
      auto bytes = ReadCheckedFile(path, kTrainerCheckpointMagic);
      if (!bytes.ok()) {
        why += (why.empty() ? "" : "; ") + bytes.status().message();
        continue;
      }
      wire::TrainerCheckpoint shard;
      if (!shard.ParseFromString(*bytes)) {
        why += (why.empty() ? "" : "; ") + path + " is not a shard checkpoint";
        continue;
      }
      if (shard.step() != step) {
        why += (why.empty() ? "" : "; ") + path + " is from step " + std::to_string(shard.step()) + ", the checkpoint from step " +
               std::to_string(step);
        continue;
      }
      if (shard.workers() != collective_->size() || shard.rank() != rank || shard.shard_begin() != static_cast<int64_t>(b) ||
          shard.shard_end() != static_cast<int64_t>(e)) {
        return InvalidArgumentError(path + " holds rank " + std::to_string(shard.rank()) + "'s shard [" +
                                    std::to_string(shard.shard_begin()) + ", " + std::to_string(shard.shard_end()) + ") of " +
                                    std::to_string(shard.workers()) + " workers; rank " + std::to_string(rank) + " of " +
                                    std::to_string(collective_->size()) + " needs [" + std::to_string(b) + ", " +
                                    std::to_string(e) + ")");
      }
      if ((shard.optimizer().empty() ? "sgd" : shard.optimizer()) != OptimizerKindName(opt_->options().kind) ||
          shard.optimizer_state().size() != state.size() * sizeof(float)) {
        return InvalidArgumentError(path + " holds another optimizer's state (" + shard.optimizer() + ")");
      }
      std::memcpy(state.data(), shard.optimizer_state().data(), shard.optimizer_state().size());
      return OkStatus();
    }
    return DataLossError("no shard of step " + std::to_string(step) + " for rank " + std::to_string(rank) + ": " + why);
  }();
  // Every rank learns every rank's verdict, so that all fail alike, each naming the ranks that could not.
  const std::string verdict = mine.ok() ? "" : mine.message();
  std::vector<std::vector<std::byte>> all;
  RETURN_IF_ERROR(collective_->AllGather(std::as_bytes(std::span<const char>(verdict.data(), verdict.size())), &all)
                      .WithContext("sharing the shard checkpoints' verdicts"));
  std::string failures;
  for (size_t r = 0; r < all.size(); ++r) {
    if (!all[r].empty()) {
      failures += (failures.empty() ? "" : "; ") + std::string("rank ") + std::to_string(r) + ": " +
                  std::string(reinterpret_cast<const char*>(all[r].data()), all[r].size());
    }
  }
  if (!failures.empty()) return DataLossError("--resume: " + failures);
  opt_->SetState(state);
  return OkStatus();
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
  const size_t b = shard_begin(), e = shard_end();
  opt_->Step(model_->params().subspan(b, e - b), model_->grads().subspan(b, e - b), rate, 0, scaling_->inverse());
  opt_->EndStep();
  return collective_->AllGatherChunks(model_->params(), shards_);
}

Status AllreduceSync::DeviceReduceAndStep(int64_t step, float rate) {
  // NCCL on the device gradient, then the optimizer, both on the model's stream; the one
  // wait (with a deadline) is here, so that a dead peer fails the step instead of hanging.
  DeviceCollective& dc = *options_.device_collective;
  const std::string where = "step " + std::to_string(step);
  if (options_.zero > 0) {
    // NCCL reduce-scatter of the equal chunks, the optimizer on this rank's chunk (and the
    // few elements past them, all-reduced), then the parameters all-gathered.
    const size_t even = device_shard_count_, rest = static_cast<size_t>(model_->num_params()) - even;
    RETURN_IF_ERROR(dc.ReduceScatterDevice(model_->device_grads(), even, ReduceOp::kAverage, model_->device_stream()).WithContext(where));
    if (rest > 0) {
      RETURN_IF_ERROR(dc.AllReduceDevice(model_->device_grads() + even, rest, ReduceOp::kAverage, model_->device_stream()).WithContext(where));
    }
    RETURN_IF_ERROR(model_->OptimizerStep(rate));
    RETURN_IF_ERROR(dc.AllGatherDevice(model_->device_params(), even, model_->device_stream()).WithContext(where));
  } else if (const auto format = PrecisionFormat(options_.train.precision)) {
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
    if (ti.sparse) opt_->StepSparse(model_->tensor(t), merged_[t].keys, merged_[t].values, rate, ti.offset);
  }
  for (const Segment& run : dense_runs_) {
    opt_->Step(model_->params().subspan(run.begin, run.size()), model_->grads().subspan(run.begin, run.size()), rate,
               run.begin, scaling_->inverse());
  }
  opt_->EndStep();
}

Status AllreduceSync::MaybeCheckpoint(int64_t step) {
  // Plain: rank 0 checkpoints; ZeRO: every rank (its shard) and rank 0 (the parameters).
  if (options_.apply_update && (collective_->rank() == 0 || options_.zero > 0) && !options_.checkpoint_dir.empty() &&
      options_.checkpoint_every > 0 && (step + 1) % options_.checkpoint_every == 0) {
    bool collective_failed = false;
    if (Status cs = WriteCheckpoint(step + 1, &collective_failed); !cs.ok()) {
      if (collective_failed) return cs;  // the ranks could not agree: the step fails
      std::fprintf(stderr, "worker %d: checkpoint failed (training goes on): %s\n", collective_->rank(), cs.message().c_str());
    }
  }
  return OkStatus();
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
  RETURN_IF_ERROR(MaybeCheckpoint(step));
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
