// A worker's training in a job: the sync MakeGradientSync builds (worker/sync/sync_factory.h) under a
// TrainingLoop. Two faces, one path:
//
// - PsTrainer (gradsync-worker --mode=bsp|ssp|asp): worker `rank` of N trains on its shard of
//   each epoch's seeded permutation (ShardedSampler), batch b; every worker runs the same number of
//   steps per epoch (ceil(smallest shard / b)). Its iteration c: pull (clock c) ->
//   forward/backward -> push (clock c); with overlap, the pull is waited for layer by layer inside
//   forward and the push goes out tensor by tensor inside backward. The update itself happens on
//   the servers (KvShard). Worker 0 sends the initial parameters (from the seed) and the job's
//   optimizer settings to the shards first; everyone waits at the "init" barrier. Worker 0
//   evaluates on the test set after every epoch with the parameters of its next pull, and once
//   more at the end after every worker has finished (barrier "trained"), with a full pull. With
//   one worker, or in bsp, this computes what LocalTrainer computes with batch N*b.
// - AllreduceTrainer (--mode=allreduce): every worker holds a replica. Rank 0's initial
//   parameters are broadcast; each step every rank computes the gradient of its own batch (the
//   same sharded sampler), the gradients are averaged by AllreduceSync and every rank applies the
//   same optimizer and learning-rate schedule locally. So N workers with batch b compute what
//   LocalTrainer computes with batch N*b (up to float summation order), and what bsp computes over
//   the PS. Rank 0 evaluates after every epoch and at the end.
//
// With --sync-every both train in rounds of local steps (PeriodicSync).
#pragma once

#include <functional>
#include <vector>

#include "allreduce/collective.h"
#include "common/data/dataset.h"
#include "common/net/control/client/scheduler_client.h"
#include "common/obs/metrics.h"
#include "models/model.h"
#include "worker/loop/epoch.h"
#include "worker/sync/sync_factory.h"

namespace gradsync {

// What a worker's training gave back.
struct JobTraining {
  Result<std::vector<EpochReport>> reports = std::vector<EpochReport>{};
  size_t optimizer_state_bytes = 0;  // all-reduce: the optimizer state this rank held (ZeRO: its shard's)
};

// Trains to the end through the sync `recipe` makes over `links`; this worker evaluates where
// `evaluate`. The PS options' step hook and step rate go to the loop.
JobTraining TrainInJob(const SyncRecipe& recipe, const SyncLinks& links, bool evaluate, Model* model,
                       const Dataset* train, const Dataset* test, MetricsWriter* metrics,
                       const std::function<void(const EpochReport&)>& on_epoch);

class PsTrainer {
 public:
  PsTrainer(const PsTrainOptions& options, Model* model, const Dataset* train, const Dataset* test,
            MetricsWriter* metrics, PsClient* client, SchedulerClient* scheduler)
      : options_(options), model_(model), train_(train), test_(test), metrics_(metrics), client_(client),
        scheduler_(scheduler) {}

  // Runs the whole job for this worker. Reports carry test accuracy on worker 0 only.
  Result<std::vector<EpochReport>> Run(const std::function<void(const EpochReport&)>& on_epoch = {}) {
    SyncRecipe recipe;
    recipe.ps = true;
    recipe.ps_options = options_;
    SyncLinks links;
    links.client = client_;
    links.scheduler = scheduler_;
    return TrainInJob(recipe, links, options_.rank == 0 && options_.evaluate, model_, train_, test_, metrics_, on_epoch)
        .reports;
  }

 private:
  PsTrainOptions options_;
  Model* model_;
  const Dataset* train_;
  const Dataset* test_;
  MetricsWriter* metrics_;
  PsClient* client_;
  SchedulerClient* scheduler_;
};

class AllreduceTrainer {
 public:
  AllreduceTrainer(const AllreduceTrainOptions& options, Model* model, const Dataset* train, const Dataset* test,
                   MetricsWriter* metrics, Collective* collective)
      : options_(options), model_(model), train_(train), test_(test), metrics_(metrics), collective_(collective) {}

  // Runs the whole job for this rank; rank 0 evaluates (options.evaluate).
  Result<std::vector<EpochReport>> Run(const std::function<void(const EpochReport&)>& on_epoch = {}) {
    SyncRecipe recipe;
    recipe.allreduce_options = options_;
    SyncLinks links;
    links.collective = collective_;
    JobTraining t = TrainInJob(recipe, links, collective_->rank() == 0 && options_.evaluate, model_, train_, test_,
                               metrics_, on_epoch);
    optimizer_state_bytes_ = t.optimizer_state_bytes;
    return std::move(t.reports);
  }
  // After Run: the bytes of optimizer state this rank held (ZeRO: its shard's).
  size_t optimizer_state_bytes() const { return optimizer_state_bytes_; }

 private:
  AllreduceTrainOptions options_;
  Model* model_;
  const Dataset* train_;
  const Dataset* test_;
  MetricsWriter* metrics_;
  Collective* collective_;
  size_t optimizer_state_bytes_ = 0;
};

}  // namespace gradsync
