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
#include "common/data/dataset.h"
#include "common/obs/metrics.h"
#include "common/optim/optimizer.h"
#include "models/model.h"
#include "worker/loop/train_options.h"

namespace gradsync {

struct EpochReport {
  int epoch = 0;             // 1-based
  int64_t steps = 0;         // total so far
  double train_loss = 0.0;   // mean over the epoch's steps
  double test_loss = 0.0;
  double test_accuracy = 0.0;
  double test_auc = NAN;       // a model that predicts probabilities (dlrm)
  double train_seconds = 0.0;  // this epoch, without evaluation
  double samples_per_s = 0.0;  // training samples / train_seconds
  double wall_s = 0.0;         // since the start of Run
  MetricsRow::RowReads row_reads;  // PS with tables: the reads of rows so far (every step's, summed)
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
