#include "worker/allreduce_sync.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>

#include "common/atomic_file.h"
#include "common/clock.h"
#include "gradsync.pb.h"
#include "worker/epoch.h"

namespace gradsync {
namespace {
constexpr char kTrainerCheckpointMagic[] = "GSTRAIN1";  // the checked file's kind (common/atomic_file.h)
}  // namespace

AllreduceSync::AllreduceSync(const AllreduceTrainOptions& options, Model* model, Collective* collective)
    : options_(options), model_(model), collective_(collective),
      ckpt_path_(options.checkpoint_dir + "/allreduce.ckpt"),
      dense_runs_(DenseRuns(model->layout(), {0, model->num_params()})) {}

Status AllreduceSync::AverageGradients() {
  const auto& layout = model_->layout();
  merged_.resize(layout.size());
  const size_t bucket = std::max<size_t>(1, options_.bucket_bytes / sizeof(float));
  // Dense tensors: contiguous runs of the flat buffer, averaged bucket by bucket.
  size_t bucket_index = 0;
  for (const Segment& run : dense_runs_) {
    const size_t begin = static_cast<size_t>(run.begin), end = static_cast<size_t>(run.end);
    for (size_t b = begin; b < end; b += bucket, ++bucket_index) {
      FloatSpan g = model_->grads().subspan(b, std::min(bucket, end - b));
      RETURN_IF_ERROR(averager_->Average(g, bucket_index, static_cast<uint64_t>(step_)));
    }
  }
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

Result<int64_t> AllreduceSync::Start(const JobShape& shape) {
  const auto& o = options_.train;
  const int rank = collective_->rank(), n = collective_->size();
  const bool device = model_->on_device();
  if (!options_.apply_update && (device || HasSparse(model_->layout()) || options_.resume || options_.checkpoint_every > 0)) {
    return InvalidArgumentError("averaging without an update (the caller's optimizer) takes dense CPU models without checkpoints");
  }
  if (device) {
    if (!options_.device_collective) return FailedPreconditionError("a CUDA model needs a device collective (NCCL)");
    if (!options_.compression.empty()) return InvalidArgumentError("--compress is not supported with --device=cuda in allreduce mode");
  }
  // --resume: rank 0 reads the checkpoint; every rank learns the step, then the parameters
  // (the initial broadcast) and the momentum come from it.
  int64_t start_step = 0;
  wire::TrainerCheckpoint resumed;
  if (options_.resume) {
    if (device) return InvalidArgumentError("--resume is not supported with --device=cuda");
    std::vector<float> head(3, 0.0f);  // found, step / 2^20, step % 2^20 (exact in floats)
    Status load;
    if (rank == 0) {
      load = [&]() -> Status {
        ASSIGN_OR_RETURN(std::string bytes, ReadCheckedFile(ckpt_path_, kTrainerCheckpointMagic));
        if (!resumed.ParseFromString(bytes)) return DataLossError(ckpt_path_ + " is not an all-reduce checkpoint");
        if (resumed.workers() != n) {
          return InvalidArgumentError(ckpt_path_ + " was written by " + std::to_string(resumed.workers()) +
                                      " workers; this job has " + std::to_string(n));
        }
        const std::string written = resumed.optimizer().empty() ? "sgd" : resumed.optimizer();
        if (written != OptimizerKindName(o.optimizer.kind)) {
          return InvalidArgumentError(ckpt_path_ + " was written with --optimizer=" + written + "; this run uses --optimizer=" +
                                      OptimizerKindName(o.optimizer.kind));
        }
        if (resumed.params().size() != model_->params().size_bytes()) {
          return DataLossError(ckpt_path_ + " holds another model (" + std::to_string(resumed.params().size() / 4) +
                               " parameters, this one has " + std::to_string(model_->num_params()) + ")");
        }
        std::memcpy(model_->params().data(), resumed.params().data(), resumed.params().size());
        return OkStatus();
      }();
      if (load.ok()) head = {1.0f, static_cast<float>(resumed.step() >> 20), static_cast<float>(resumed.step() & 0xFFFFF)};
    }
    RETURN_IF_ERROR(collective_->Broadcast(head, 0).WithContext("sharing the checkpoint's step"));
    if (head[0] != 1.0f) return rank == 0 ? load.WithContext("--resume") : FailedPreconditionError("--resume: rank 0 has no checkpoint");
    start_step = (static_cast<int64_t>(head[1]) << 20) + static_cast<int64_t>(head[2]);
  }
  RETURN_IF_ERROR(collective_->Broadcast(model_->params(), 0).WithContext("broadcasting the initial parameters"));
  if (device) {
    RETURN_IF_ERROR(model_->ParamsToDevice());
    RETURN_IF_ERROR(model_->SetOptimizer(o.optimizer));
  }
  ASSIGN_OR_RETURN(averager_, BucketAverager::Create(collective_, options_.compression, o.seed, options_.error_feedback,
                                                     options_.correction_momentum));
  if (averager_->compressed()) {
    for (const auto& t : model_->layout()) {
      if (t.sparse) return InvalidArgumentError("--compress applies to dense models; " + t.name + " is sparse");
    }
  }
  const bool any_sparse = HasSparse(model_->layout());
  if (options_.overlap && !averager_->compressed() && !any_sparse && n > 1 && !device) {
    reducer_ = std::make_unique<OverlappedReducer>(collective_, model_->layout(), options_.bucket_bytes,
                                                   options_.first_bucket_bytes);
  }
  lr_ = RunSchedule(o, shape.total_steps, shape.steps_per_epoch);
  opt_.emplace(o.optimizer, device ? 0 : model_->num_params());
  if (options_.resume && !opt_->state().empty()) {
    std::vector<float> state(opt_->state().size(), 0.0f);
    if (rank == 0 && resumed.optimizer_state().size() == state.size() * sizeof(float)) {
      std::memcpy(state.data(), resumed.optimizer_state().data(), resumed.optimizer_state().size());
    }
    RETURN_IF_ERROR(collective_->Broadcast(state, 0).WithContext("broadcasting the checkpoint's optimizer state"));
    opt_->SetState(state);
  }
  opt_->set_steps(start_step);  // one optimizer step per training step (Adam's t)
  if (options_.resume && rank == 0) {
    std::printf("worker 0: resumed from %s at step %lld of %lld\n", ckpt_path_.c_str(), static_cast<long long>(start_step),
                static_cast<long long>(shape.total_steps));
    std::fflush(stdout);
  }
  return start_step;
}

Status AllreduceSync::WriteCheckpoint(int64_t step) {
  wire::TrainerCheckpoint c;
  c.set_step(step);
  c.set_workers(collective_->size());
  c.set_params(model_->params().data(), model_->params().size_bytes());
  c.set_optimizer_state(opt_->state().data(), opt_->state().size_bytes());
  c.set_optimizer(OptimizerKindName(opt_->options().kind));
  c.set_written_at(std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count());
  return WriteCheckedFile(ckpt_path_, kTrainerCheckpointMagic, c.SerializeAsString());
}

Status AllreduceSync::BeginStep(const StepPlan& plan) {
  RETURN_IF_ERROR(CheckStepRate(plan.lr));
  step_ = plan.step;
  step_lr_ = plan.lr;
  if (reducer_) reducer_->Begin(model_->grads());
  return OkStatus();
}

Result<SyncStepStats> AllreduceSync::FinishStep() {
  const int64_t step = step_;
  const float rate = std::isnan(step_lr_) ? lr_.At(step) : step_lr_;
  const bool device = model_->on_device();
  Stopwatch comm;
  double comm_ms = 0, hidden_ms = 0;
  if (device) {
    // NCCL on the device gradient, then the optimizer, both on the model's stream; the one
    // wait (with a deadline) is here, so that a dead peer fails the step instead of hanging.
    DeviceCollective& dc = *options_.device_collective;
    RETURN_IF_ERROR(dc.AllReduceDevice(model_->device_grads(), static_cast<size_t>(model_->num_params()),
                                       ReduceOp::kAverage, model_->device_stream())
                        .WithContext("step " + std::to_string(step)));
    RETURN_IF_ERROR(model_->OptimizerStep(rate));
    RETURN_IF_ERROR(dc.SynchronizeDevice(model_->device_stream(), options_.collective_timeout_s)
                        .WithContext("step " + std::to_string(step)));
    comm_ms = comm.Millis();
  } else if (reducer_) {
    RETURN_IF_ERROR(reducer_->Finish().WithContext("step " + std::to_string(step)));
    comm_ms = reducer_->busy_ms();
    hidden_ms = std::max(0.0, comm_ms - reducer_->exposed_ms());
  } else {
    RETURN_IF_ERROR(AverageGradients().WithContext("step " + std::to_string(step)));
    comm_ms = comm.Millis();
  }
  if (!device && options_.apply_update) {
    for (size_t t = 0; t < model_->layout().size(); ++t) {
      const TensorInfo& ti = model_->layout()[t];
      if (ti.sparse) opt_->StepSparse(model_->tensor(t), merged_[t].keys, merged_[t].values, rate, ti.offset);
    }
    for (const Segment& run : dense_runs_) {
      opt_->Step(model_->params().subspan(run.begin, run.size()), model_->grads().subspan(run.begin, run.size()), rate,
                 run.begin);
    }
    opt_->EndStep();
  }
  if (options_.apply_update && collective_->rank() == 0 && !options_.checkpoint_dir.empty() && options_.checkpoint_every > 0 &&
      (step + 1) % options_.checkpoint_every == 0) {
    if (Status cs = WriteCheckpoint(step + 1); !cs.ok()) {
      std::fprintf(stderr, "worker 0: checkpoint failed (training goes on): %s\n", cs.message().c_str());
    }
  }
  SyncStepStats stats;
  stats.comm_ms = comm_ms;
  stats.hidden_ms = hidden_ms;
  stats.bytes_sent = collective_->bytes_sent();
  stats.bytes_received = collective_->bytes_received();
  return stats;
}

}  // namespace gradsync
