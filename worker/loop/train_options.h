// The training settings every worker mode shares (local, the PS modes, all-reduce, rounds), in
// groups by the component that acts on them, so that each component is handed its own group
// whole: the precision to LossScaling, the straggler to Straggler, the reporting cadence to the
// loop's EpochReporter, the rounds to PeriodicSync, the codec to the syncs that encode. The
// TrainingLoop acts on the rest (batch, epochs, steps, seed, micro-batches) and the optimizer and
// its schedule on `optimizer`, `lr` and `warmup_epochs`. worker/train_options.h fills them from a
// TrainConfig.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "common/config/straggler.h"
#include "common/optim/optimizer.h"
#include "common/optim/precision.h"

namespace gradsync {

// Local SGD and DiLoCo (worker/sync/periodic_sync.h): rounds of `every` steps, each worker on its own
// copy of the model with the optimizer of LocalTrainOptions, then the outer SGD on the averaged
// pseudo-gradient.
struct PeriodicOptions {
  int64_t every = 0;        // H; 0: every step's gradient is exchanged (no rounds)
  OptimizerOptions outer;   // SGD: momentum and Nesterov (DiLoCo: 0.9, Nesterov)
  float outer_lr = 1.0f;    // 1, no momentum: the models are averaged (local SGD); DiLoCo: 0.7
};

// The model's number format and, for fp16, where dynamic loss scaling starts (LossScaling,
// worker/sync/loss_scaling.h).
struct PrecisionOptions {
  Precision precision = Precision::kFp32;  // the model's; fp16: dynamic loss scaling
  float initial_loss_scale = 65536.0f;     // fp16: where the loss scale starts
};

// The injected delay after each step's compute (common/config/straggler.h's Straggler).
struct StragglerOptions {
  StragglerSpec spec;
  uint64_t seed = 0;
};

// What the loop writes and evaluates when (worker/loop/epoch_reporter.h).
struct ReportOptions {
  int64_t log_every = 50;      // a training metrics row every N steps
  int64_t eval_batch = 1000;
  // Also evaluate every this many steps (0: after each epoch only), for accuracy-over-time
  // curves finer than epochs. Only the evaluating worker does.
  int64_t eval_every = 0;
};

struct LocalTrainOptions {
  OptimizerOptions optimizer;
  PrecisionOptions numerics;
  LrSchedule lr;               // total_steps is filled in by the trainer for cosine
  // Linear warm-up of the learning rate from lr.warmup_start to lr.base over this many epochs.
  double warmup_epochs = 0;
  int64_t batch = 64;
  int epochs = 10;
  int64_t max_steps = 0;       // stop after this many steps (0: no limit)
  uint64_t seed = 0;           // data order; the model is initialized by the caller
  // Gradient accumulation: when > 0 and below `batch`, each step's batch is computed in
  // micro-batches of this many samples whose gradients are summed (weighted by size) before
  // the one update or push: the same step as one batch of `batch` samples (dense models).
  int64_t micro_batch = 0;
  ReportOptions report;
  StragglerOptions straggler;  // injected delay per step (straggler.h)
  PeriodicOptions periodic;    // local SGD / DiLoCo (a distributed mode's exchange every H steps)
};

// The gradient codec of the syncs that exchange gradients (the PS client's pushes, all-reduce's
// averagers).
struct CodecOptions {
  // The codec spec ("" or "none": raw floats).
  std::string compression;
  bool error_feedback = false;
  float correction_momentum = 0;  // DGC momentum correction (then train.optimizer has no momentum)
  // PS only: pulls carry compressed parameter deltas (needs a codec). The evaluating worker
  // still evaluates the servers' exact parameters: it pulls them raw before each evaluation.
  bool compress_pull = false;
};

// The loop's per-step calls into its caller (tests, experiments, a frontend's own schedule).
struct StepHooks {
  // Called before each step's compute (e.g. a straggler's delay).
  std::function<void(int64_t step)> before_compute;
  // Each step's own rate (StepPlan::lr), as a caller with its own schedule sets it; empty: the
  // job's schedule.
  std::function<float(int64_t step)> step_lr;
};

}  // namespace gradsync
