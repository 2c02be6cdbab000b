// PsTrainer: training over the parameter server (gradsync-worker --mode=bsp|ssp|asp).
//
// Worker `rank` of N trains on its shard of each epoch's seeded permutation (ShardedSampler),
// batch b; every worker runs the same number of steps per epoch (ceil(smallest shard / b)). Its
// iteration c: pull (clock c) -> forward/backward -> push (clock c); with overlap, the pull is
// waited for layer by layer inside forward and the push goes out tensor by tensor inside backward. The update itself happens
// on the servers (KvShard). Worker 0 sends the initial parameters (from the seed) and the job's
// optimizer settings to the shards first; everyone waits at the "init" barrier. Worker 0
// evaluates on the test set after every epoch with the parameters of its next pull, and once
// more at the end after every worker has finished (barrier "trained"), with a full pull.
// With one worker, or in bsp, this computes what LocalTrainer computes with batch N*b.
#pragma once

#include <functional>
#include <vector>

#include "common/data/dataset.h"
#include "common/net/scheduler_client.h"
#include "common/obs/metrics.h"
#include "models/model.h"
#include "worker/epoch.h"
#include "worker/local_trainer.h"
#include "worker/ps_client.h"
#include "worker/ps_sync.h"

namespace gradsync {

class PsTrainer {
 public:
  PsTrainer(const PsTrainOptions& options, Model* model, const Dataset* train, const Dataset* test,
            MetricsWriter* metrics, PsClient* client, SchedulerClient* scheduler);

  // Runs the whole job for this worker: TrainingLoop over a PsOverlapSync (options.overlap, where
  // the model and settings allow it) or a PsSync. Reports carry test accuracy on worker 0 only.
  Result<std::vector<EpochReport>> Run(const std::function<void(const EpochReport&)>& on_epoch = {});

 private:
  PsTrainOptions options_;
  Model* model_;
  const Dataset* train_;
  const Dataset* test_;
  MetricsWriter* metrics_;
  PsClient* client_;
  SchedulerClient* scheduler_;
};

}  // namespace gradsync
