// TrainingLoop: the one step loop of every worker mode, over a GradientSync (gradient_sync.h)
// that does the mode's communication and update.
//
// Worker rank r of N (the sync's) trains on its shard of each epoch's seeded permutation
// (ShardedSampler), batch b, for StepsPerEpoch(n, N, b) steps per epoch (the same on every
// worker), from the step the sync starts at (0, a resumed checkpoint's, or a rejoining worker's
// clock) to epochs x steps per epoch or max_steps. Each step:
//
//   BeginStep -> [evaluation] -> forward/backward -> divergence check -> straggler delay
//             -> FinishStep -> metrics row
//
// The model's hooks are the sync's per-tensor calls: Model::set_param_wait -> WaitParams,
// Model::set_grad_ready -> GradReady. The evaluating worker evaluates when a step starts at an
// epoch's end or every eval_every steps (on the parameters that step computes on), and once
// more after EndTraining; every worker closes its epochs (EpochReport). A non-finite loss, or a
// non-finite first gradient backward reports (checked before the sync is told about it, so that
// none of a diverged step is sent), fails the run with "training diverged". A step that fails
// in the sync is redone after Recover says so, at most 3 times. A device model whose sync
// works on host buffers gets its parameters uploaded after BeginStep and its gradient copied to
// the host before FinishStep.
// Not thread-safe: one loop per training thread; model, data, metrics and sync are borrowed.
#pragma once

#include <functional>
#include <span>
#include <vector>

#include "common/base/clock.h"
#include "common/base/status.h"
#include "common/config/straggler.h"
#include "common/data/dataset.h"
#include "common/obs/metrics.h"
#include "models/model.h"
#include "worker/loop/epoch.h"
#include "worker/loop/epoch_reporter.h"
#include "worker/loop/local_trainer.h"
#include "worker/sync/gradient_sync.h"

namespace gradsync {

struct TrainingLoopOptions {
  LocalTrainOptions train;  // batch per worker, epochs, max_steps, seed, log/eval schedule, straggler
  bool evaluate = true;     // this worker evaluates (epoch ends, eval_every, the end)
  StepHooks hooks;          // before each step's compute; each step's own rate (StepPlan::lr)
};

class TrainingLoop {
 public:
  // `metrics` may be null. The pointers must outlive the loop.
  TrainingLoop(const TrainingLoopOptions& options, Model* model, const Dataset* train, const Dataset* test,
               MetricsWriter* metrics, GradientSync* sync);

  // Trains to the end; calls on_epoch after each closed epoch. Reports carry test accuracy on
  // the evaluating worker only.
  Result<std::vector<EpochReport>> Run(const std::function<void(const EpochReport&)>& on_epoch = {});

 private:
  // The current step's state as the model's hooks see it.
  struct StepState {
    Status failure;          // the first failed sync call of the step
    bool any_ready = false;  // backward has reported a tensor
    bool diverged = false;   // the first reported gradient was not finite
  };
  // What a step starts with: its samples, its gathered batch (sparse models), what is due first.
  struct StepInput {
    std::span<const uint32_t> indices{};
    const Batch* batch = nullptr;     // gathered already (sparse models), or null
    std::span<const uint64_t> keys{};  // its sparse rows (flat keys)
    TableStep* tables = nullptr;  // a model with tables: the batch's ids and rows (in the model)
    int epoch = 0;
    bool epoch_end = false;  // the step starts after epoch `epoch - 1` ended: close it
    bool mid_eval = false;   // an --eval-every evaluation is due
  };
  void OnParamWait(size_t tensor);
  void OnGradReady(size_t tensor);
  // Runs step step_ to its end (redone after a recovery), then counts it and writes its row.
  Status RunStep(const StepInput& in);
  // RunStep's: the evaluations due before the step (once, not again when it is redone).
  Status EvaluateDue(const StepInput& in);
  Status CloseEpoch(int epoch) { return reporter_.CloseEpoch(epoch, step_, sync_->traffic()); }

  TrainingLoopOptions options_;
  Model* model_;
  const Dataset* train_;
  GradientSync* sync_;
  StepState step_state_;
  // The run's state (Run resets it).
  int64_t steps_per_epoch_ = 1;
  int64_t step_ = 0;
  bool copy_to_device_ = false;
  Straggler straggler_;
  BatchBuffer buffer_;
  std::vector<float> accum_;
  EpochReporter reporter_;  // epochs' reports, evaluations and metrics rows
};

}  // namespace gradsync
