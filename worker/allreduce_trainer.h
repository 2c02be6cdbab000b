// AllreduceTrainer: training without servers (gradsync-worker --mode=allreduce).
//
// Every worker holds a replica. Rank 0's initial parameters are broadcast; each step every rank
// computes the gradient of its own batch (the same sharded sampler as the PS modes), the dense
// gradients are averaged with the collective in buckets of at most bucket_bytes (the flat
// gradient buffer cut in order; one bucket for small models), sparse gradients are all-gathered
// as (key, value) pairs and averaged per key, and every rank applies the same optimizer and
// learning-rate schedule locally. So N workers with batch b compute what LocalTrainer computes
// with batch N*b (up to float summation order), and what bsp computes over the PS.
// Rank 0 evaluates after every epoch and at the end.
#pragma once

#include <functional>
#include <vector>

#include "allreduce/collective.h"
#include "common/data/dataset.h"
#include "common/obs/metrics.h"
#include "models/model.h"
#include "worker/allreduce_sync.h"
#include "worker/local_trainer.h"

namespace gradsync {

class AllreduceTrainer {
 public:
  AllreduceTrainer(const AllreduceTrainOptions& options, Model* model, const Dataset* train, const Dataset* test,
                   MetricsWriter* metrics, Collective* collective);
  // TrainingLoop over an AllreduceSync: rank 0 evaluates (options.evaluate).
  Result<std::vector<EpochReport>> Run(const std::function<void(const EpochReport&)>& on_epoch = {});
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
