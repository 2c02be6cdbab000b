#include "worker/allreduce/allreduce_checkpoints.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <span>

#include "common/base/atomic_file.h"

namespace gradsync {
namespace {
constexpr char kTrainerCheckpointMagic[] = "GSTRAIN1";  // the checked file's kind (common/base/atomic_file.h)
}  // namespace

AllreduceCheckpoints::AllreduceCheckpoints(const AllreduceCheckpointOptions& options, int zero, Model* model,
                                           Collective* collective, const ZeroShards* shards)
    : options_(options), zero_(zero), path_(options.dir + "/allreduce.ckpt"), model_(model), collective_(collective),
      shards_(shards) {}

Status AllreduceCheckpoints::Read(OptimizerKind kind, wire::TrainerCheckpoint* resumed) {
  const int n = collective_->size();
  ASSIGN_OR_RETURN(std::string bytes, ReadCheckedFile(path_, kTrainerCheckpointMagic));
  if (!resumed->ParseFromString(bytes)) return DataLossError(path_ + " is not an all-reduce checkpoint");
  if (resumed->workers() != n) {
    return InvalidArgumentError(path_ + " was written by " + std::to_string(resumed->workers()) +
                                " workers; this job has " + std::to_string(n));
  }
  const std::string written = resumed->optimizer().empty() ? "sgd" : resumed->optimizer();
  if (written != OptimizerKindName(kind)) {
    return InvalidArgumentError(path_ + " was written with --optimizer=" + written + "; this run uses --optimizer=" +
                                OptimizerKindName(kind));
  }
  if (resumed->params().size() != model_->params().size_bytes()) {
    return DataLossError(path_ + " holds another model (" + std::to_string(resumed->params().size() / 4) +
                         " parameters, this one has " + std::to_string(model_->num_params()) + ")");
  }
  std::memcpy(model_->params().data(), resumed->params().data(), resumed->params().size());
  return OkStatus();
}

Status AllreduceCheckpoints::ShareStep(OptimizerKind kind, wire::TrainerCheckpoint* resumed, int64_t* start_step,
                                       int* resumed_zero) {
  const int rank = collective_->rank();
  if (model_->on_device()) return InvalidArgumentError("--resume is not supported with --device=cuda");
  std::vector<float> head(4, 0.0f);  // found, step / 2^20, step % 2^20 (exact in floats), the writer's ZeRO stage
  Status load;
  if (rank == 0) {
    load = Read(kind, resumed);
    if (load.ok() && resumed->zero() > 0 && zero_ == 0) {
      load = InvalidArgumentError(path_ + " was written with --zero=" + std::to_string(resumed->zero()) +
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

Status AllreduceCheckpoints::ResumeOptimizerState(const wire::TrainerCheckpoint& resumed, int64_t start_step,
                                                  int resumed_zero, const OptimizerOptions& optimizer, Optimizer* opt) {
  const int rank = collective_->rank();
  if (options_.resume && zero_ > 0 && !model_->on_device()) {
    // A plain checkpoint's whole state (rank 0 broadcasts it) or each rank's shard file.
    std::vector<float> whole;
    if (resumed_zero == 0) {
      const size_t per = Optimizer(optimizer, 1).state().size();  // state floats per parameter
      whole.assign(per * static_cast<size_t>(model_->num_params()), 0.0f);
      if (rank == 0 && resumed.optimizer_state().size() == whole.size() * sizeof(float)) {
        std::memcpy(whole.data(), resumed.optimizer_state().data(), resumed.optimizer_state().size());
      }
      RETURN_IF_ERROR(collective_->Broadcast(whole, 0).WithContext("broadcasting the checkpoint's optimizer state"));
    }
    RETURN_IF_ERROR(LoadShardState(start_step, resumed_zero > 0, whole, opt));
  } else if (options_.resume && !opt->state().empty()) {
    std::vector<float> state(opt->state().size(), 0.0f);
    if (rank == 0 && resumed.optimizer_state().size() == state.size() * sizeof(float)) {
      std::memcpy(state.data(), resumed.optimizer_state().data(), resumed.optimizer_state().size());
    }
    RETURN_IF_ERROR(collective_->Broadcast(state, 0).WithContext("broadcasting the checkpoint's optimizer state"));
    opt->SetState(state);
  }
  return OkStatus();
}

std::string AllreduceCheckpoints::ShardPath(int rank, bool previous) const {
  return options_.dir + "/allreduce-shard-" + std::to_string(rank) + (previous ? ".prev" : "") + ".ckpt";
}

// Plain: rank 0 writes everything. ZeRO: every rank writes its shard's state first (the file it
// replaces becomes .prev, so that the shards of rank 0's last checkpoint survive a failure in
// between), every rank learns whether every rank could, and only then rank 0 writes the
// parameters; a failure on any rank leaves the last checkpoint as it was.
Status AllreduceCheckpoints::Write(int64_t step, const Optimizer& opt, bool* collective_failed) {
  const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  const int rank = collective_->rank();
  if (zero_ > 0) {
    wire::TrainerCheckpoint shard;
    shard.set_step(step);
    shard.set_workers(collective_->size());
    shard.set_optimizer_state(opt.state().data(), opt.state().size_bytes());
    shard.set_optimizer(OptimizerKindName(opt.options().kind));
    shard.set_written_at(now);
    shard.set_zero(zero_);
    shard.set_rank(rank);
    shard.set_shard_begin(static_cast<int64_t>(shards_->begin()));
    shard.set_shard_end(static_cast<int64_t>(shards_->end()));
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
  if (zero_ == 0) c.set_optimizer_state(opt.state().data(), opt.state().size_bytes());
  c.set_optimizer(OptimizerKindName(opt.options().kind));
  c.set_written_at(now);
  c.set_zero(zero_);
  return WriteCheckedFile(path_, kTrainerCheckpointMagic, c.SerializeAsString());
}

Status AllreduceCheckpoints::LoadShardState(int64_t step, bool from_shard_files, const std::vector<float>& whole,
                                            Optimizer* opt) {
  const int rank = collective_->rank();
  const size_t b = shards_->begin(), e = shards_->end(), params = static_cast<size_t>(model_->num_params());
  std::vector<float> state(opt->state().size(), 0.0f);
  Status mine = [&]() -> Status {
    if (!from_shard_files) {
      // Each of the state's buffers (SGD's momentum, Adam's m then v) cut to the shard.
      const size_t buffers = params == 0 ? 0 : whole.size() / params;
      if (buffers * (e - b) != state.size()) return DataLossError(path_ + " holds another optimizer's state");
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
      if ((shard.optimizer().empty() ? "sgd" : shard.optimizer()) != OptimizerKindName(opt->options().kind) ||
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
  opt->SetState(state);
  return OkStatus();
}

Status AllreduceCheckpoints::MaybeWrite(int64_t step, const Optimizer& opt) {
  // Plain: rank 0 checkpoints; ZeRO: every rank (its shard) and rank 0 (the parameters).
  if ((collective_->rank() == 0 || zero_ > 0) && !options_.dir.empty() && options_.every > 0 &&
      (step + 1) % options_.every == 0) {
    bool collective_failed = false;
    if (Status cs = Write(step + 1, opt, &collective_failed); !cs.ok()) {
      if (collective_failed) return cs;  // the ranks could not agree: the step fails
      std::fprintf(stderr, "worker %d: checkpoint failed (training goes on): %s\n", collective_->rank(), cs.message().c_str());
    }
  }
  return OkStatus();
}

}  // namespace gradsync
