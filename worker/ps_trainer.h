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

#include "common/dataset.h"
#include "common/metrics.h"
#include "common/scheduler_client.h"
#include "models/model.h"
#include "worker/epoch.h"
#include "worker/local_trainer.h"
#include "worker/ps_client.h"

namespace gradsync {

struct PsTrainOptions {
  LocalTrainOptions train;   // optimizer, lr schedule, batch (per worker), epochs, seed...
  int rank = 0;
  int num_workers = 1;
  double request_timeout_s = 60.0;
  double barrier_timeout_s = 600.0;
  bool evaluate = true;      // worker 0 only
  std::string compression;   // push codec spec ("" or "none": raw floats)
  bool error_feedback = false;
  float correction_momentum = 0;  // DGC momentum correction (then train.optimizer has no momentum)
  // Pulls carry compressed parameter deltas (needs a codec). The evaluating worker still
  // evaluates the servers' exact parameters: it pulls them raw before each evaluation.
  bool compress_pull = false;
  bool staleness_aware_lr = false;  // ssp/asp: the shards divide each step by its staleness
  // Overlap communication with computation (dense CPU models, raw pushes, no straggler): each
  // tensor's gradient (in parts of at most push_part_floats) is pushed the moment backward
  // produced it, and the next step's pulls go out one per tensor in forward order, each layer's
  // forward waiting only for its own parameters. The same updates as without (bsp included).
  bool overlap = false;
  size_t push_part_floats = size_t{1} << 20;
  // How long to wait for a dead server to come back (from its checkpoint) before failing; the
  // step is then redone against the restored shard. 0: fail at once.
  double recovery_timeout_s = 0;
  // Test and experiment hooks: called before each step's compute (e.g. a straggler's delay),
  // and once after the "init" barrier.
  std::function<void(int64_t step)> step_hook;
  std::function<void()> after_init;
};

// The job's optimizer settings and layout as worker 0 sends them to the shards.
wire::JobConfig MakeJobConfig(const Model& model, const PsTrainOptions& options, int64_t total_steps,
                              int64_t steps_per_epoch);

class PsTrainer {
 public:
  PsTrainer(const PsTrainOptions& options, Model* model, const Dataset* train, const Dataset* test,
            MetricsWriter* metrics, PsClient* client, SchedulerClient* scheduler);

  // Runs the whole job for this worker. Reports carry test accuracy on worker 0 only.
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
