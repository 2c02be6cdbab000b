// From a worker's TrainConfig to the options of the pieces it builds: one mapping, shared by
// gradsync-worker (worker/run_worker.cc) and the Python frontend (python/native/frontend.cc), so
// that a setting means the same in both. `c` must have passed Validate().
#pragma once

#include "common/config/train_config.h"
#include "worker/allreduce/allreduce_sync.h"
#include "worker/loop/train_options.h"
#include "worker/ps/ps_sync.h"

namespace gradsync {

// The optimizer, learning-rate schedule, batch (times --accumulate), epochs, seed, logging and
// straggler of the job.
LocalTrainOptions TrainOptionsFrom(const config::TrainConfig& c);

// The PS modes' sync options around `train`: deadlines, recovery, codec (with error feedback or
// DGC momentum correction), compressed pulls, the staleness-aware rate, overlap and push parts.
// `oversubscribed`: JobLink::oversubscribed (--overlap's default, OverlapOf).
PsTrainOptions PsOptionsFrom(const config::TrainConfig& c, const LocalTrainOptions& train, int rank, int num_workers,
                             bool oversubscribed);

// All-reduce's: buckets, overlap, codec, the collective's deadline (no checkpoints: the caller's).
AllreduceTrainOptions AllreduceOptionsFrom(const config::TrainConfig& c, const LocalTrainOptions& train,
                                           bool oversubscribed);

// All-reduce's checkpoints: --checkpoint-dir, --checkpoint-every, --resume.
AllreduceCheckpointOptions CheckpointOptionsFrom(const config::TrainConfig& c);

}  // namespace gradsync
