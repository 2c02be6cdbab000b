// Single-process training (gradsync-worker --mode=local): the baseline every distributed mode is
// compared with, and the reference the bsp / all-reduce equivalence tests check against.
//
// Each epoch visits the training set in a seeded permutation (ShardedSampler with one
// replica), in batches of `batch` (the last one may be smaller, like PyTorch's DataLoader),
// applies w -= lr(step) * optimizer(g), evaluates on the test set at the end of the epoch, and
// writes metrics rows. Not thread-safe; OpenBLAS may use --threads threads inside a step.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "common/base/status.h"
#include "common/config/straggler.h"
#include "common/data/dataset.h"
#include "common/obs/metrics.h"
#include "common/optim/optimizer.h"
#include "common/optim/precision.h"
#include "models/model.h"

namespace gradsync {

// Local SGD and DiLoCo (worker/sync/periodic_sync.h): rounds of `every` steps, each worker on its own
// copy of the model with the optimizer of LocalTrainOptions, then the outer SGD on the averaged
// pseudo-gradient.
struct PeriodicOptions {
  int64_t every = 0;        // H; 0: every step's gradient is exchanged (no rounds)
  OptimizerOptions outer;   // SGD: momentum and Nesterov (DiLoCo: 0.9, Nesterov)
  float outer_lr = 1.0f;    // 1, no momentum: the models are averaged (local SGD); DiLoCo: 0.7
};

struct LocalTrainOptions {
  OptimizerOptions optimizer;
  Precision precision = Precision::kFp32;  // the model's; fp16: dynamic loss scaling
  float initial_loss_scale = 65536.0f;     // fp16: where the loss scale starts
  LrSchedule lr;               // total_steps is filled in by the trainer for cosine
  int64_t batch = 64;
  int epochs = 10;
  int64_t max_steps = 0;       // stop after this many steps (0: no limit)
  uint64_t seed = 0;           // data order; the model is initialized by the caller
  int64_t log_every = 50;      // a training metrics row every N steps
  int64_t eval_batch = 1000;
  // Also evaluate every this many steps (0: after each epoch only), for accuracy-over-time
  // curves finer than epochs. Only the evaluating worker does.
  int64_t eval_every = 0;
  // Gradient accumulation: when > 0 and below `batch`, each step's batch is computed in
  // micro-batches of this many samples whose gradients are summed (weighted by size) before
  // the one update or push: the same step as one batch of `batch` samples (dense models).
  int64_t micro_batch = 0;
  // Linear warm-up of the learning rate from lr.warmup_start to lr.base over this many epochs.
  double warmup_epochs = 0;
  StragglerSpec straggler;     // injected delay per step (straggler.h)
  uint64_t straggler_seed = 0;
  PeriodicOptions periodic;    // local SGD / DiLoCo (a distributed mode's exchange every H steps)
};

struct EpochReport {
  int epoch = 0;             // 1-based
  int64_t steps = 0;         // total so far
  double train_loss = 0.0;   // mean over the epoch's steps
  double test_loss = 0.0;
  double test_accuracy = 0.0;
  double train_seconds = 0.0;  // this epoch, without evaluation
  double samples_per_s = 0.0;  // training samples / train_seconds
  double wall_s = 0.0;         // since the start of Run
};

// Applies the model's current gradient (dense and sparse tensors) with `opt` at rate `lr`: one
// optimizer step.
void ApplyGradients(Model& model, Optimizer& opt, float lr, float grad_scale = 1.0f);

class LocalTrainer {
 public:
  // `metrics` may be null. The pointers must outlive the trainer.
  LocalTrainer(const LocalTrainOptions& options, Model* model, const Dataset* train,
               const Dataset* test, MetricsWriter* metrics);

  // Trains; calls on_epoch after each epoch's evaluation. Fails on a non-finite loss
  // (divergence) or a metrics write error.
  Result<std::vector<EpochReport>> Run(const std::function<void(const EpochReport&)>& on_epoch = {});

 private:
  LocalTrainOptions options_;
  Model* model_;
  const Dataset* train_;
  const Dataset* test_;
  MetricsWriter* metrics_;
};

}  // namespace gradsync
