// AllreduceCheckpoints: all-reduce's checkpoints (AllreduceCheckpointOptions: --checkpoint-dir,
// --checkpoint-every, --resume), written and read for AllreduceSync. Plain: rank 0 writes
// dir/allreduce.ckpt (parameters, optimizer state, step) atomically; resume: rank 0 reads it
// (another optimizer's, another number of workers' or another model's is refused) and every rank
// learns its step, its parameters (the initial broadcast) and its optimizer state. ZeRO: every
// rank writes its shard's optimizer state to dir/allreduce-shard-<rank>.ckpt first (the file it
// replaces kept as .prev, so that rank 0's last checkpoint keeps its shards), then rank 0 the
// parameters; a failure on any rank leaves the last checkpoint as it was; resume takes each
// rank's shard file of the checkpoint's step, or its cut of a plain checkpoint's state, and every
// rank fails alike when one cannot.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "allreduce/collective.h"
#include "common/base/status.h"
#include "common/optim/optimizer.h"
#include "gradsync.pb.h"
#include "models/model.h"
#include "worker/allreduce/zero_shards.h"

namespace gradsync {

// Checkpoints (CPU models): rank 0 writes dir/allreduce.ckpt (parameters, optimizer state, step;
// Adam's t is the step) atomically every `every` steps; resume makes every rank start from it
// (rank 0 reads it and broadcasts; another optimizer's is refused). A dead rank fails every other
// rank (the collective's deadline): the job is restarted with resume and loses at most `every`
// steps. AllreduceCheckpoints acts on them.
struct AllreduceCheckpointOptions {
  std::string dir;
  int64_t every = 0;
  bool resume = false;
};

class AllreduceCheckpoints {
 public:
  // `zero`: the run's ZeRO stage (0: none), cut by `shards`. The pointers must outlive it.
  AllreduceCheckpoints(const AllreduceCheckpointOptions& options, int zero, Model* model, Collective* collective,
                       const ZeroShards* shards);

  const std::string& path() const { return path_; }

  // --resume, before the initial broadcast: rank 0 reads the checkpoint (the run's optimizer is
  // `kind`) into *resumed and the model's parameters; every rank learns its step and the ZeRO
  // stage it was written with, or fails alike.
  Status ShareStep(OptimizerKind kind, wire::TrainerCheckpoint* resumed, int64_t* start_step, int* resumed_zero);
  // --resume, once `opt` is made: the checkpoint's optimizer state into `opt` on every rank (ZeRO:
  // this rank's shard's). Nothing without --resume.
  Status ResumeOptimizerState(const wire::TrainerCheckpoint& resumed, int64_t start_step, int resumed_zero,
                              const OptimizerOptions& optimizer, Optimizer* opt);
  // After step `step`: the checkpoint when one is due (plain: rank 0; ZeRO: every rank). An error
  // only when the ranks could not agree on it (the step fails); a file's failure is a warning.
  Status MaybeWrite(int64_t step, const Optimizer& opt);

 private:
  Status Read(OptimizerKind kind, wire::TrainerCheckpoint* resumed);
  // *collective_failed: the failure is the collective's (the step fails), not a file's.
  Status Write(int64_t step, const Optimizer& opt, bool* collective_failed);
  // ZeRO: this rank's shard of a checkpoint's optimizer state. From the shard files (the one
  // whose step is `step`) when the checkpoint was written by ZeRO, else cut from `whole` (a
  // plain checkpoint's state, every rank alike). Every rank learns whether every rank could.
  Status LoadShardState(int64_t step, bool from_shard_files, const std::vector<float>& whole, Optimizer* opt);
  std::string ShardPath(int rank, bool previous) const;

  AllreduceCheckpointOptions options_;
  int zero_;
  std::string path_;  // dir/allreduce.ckpt
  Model* model_;
  Collective* collective_;
  const ZeroShards* shards_;
};

}  // namespace gradsync
