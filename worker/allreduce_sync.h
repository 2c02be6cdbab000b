// AllreduceSync: the GradientSync of --mode=allreduce. Every worker holds a replica. Start
// broadcasts rank 0's initial parameters (or, with resume, rank 0's checkpoint: parameters,
// optimizer state, step); each step the dense gradients are averaged with the collective in buckets
// of at most bucket_bytes (the flat gradient buffer cut in order; with overlap, on a communication
// thread as backward reports them: OverlappedReducer), sparse gradients are all-gathered as (key,
// value) pairs and averaged per key, compressed gradients are summed inside the ring (fp16,
// random-k) or all-gathered and decoded in rank order (the other codecs), a device model's gradient
// is averaged by the device collective (NCCL) with the optimizer on the device; then every rank
// applies the same optimizer and learning-rate schedule (or the step's own rate, StepPlan::lr)
// locally (FinishStep). So N workers with batch b compute what LocalSync computes with batch N*b
// (up to float summation order), and what bsp computes over the PS. EndTraining is the collective's
// barrier.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "allreduce/collective.h"
#include "common/optimizer.h"
#include "common/partitioner.h"
#include "compression/gradient_encoder.h"
#include "models/model.h"
#include "worker/bucket_average.h"
#include "worker/gradient_sync.h"
#include "worker/local_trainer.h"
#include "worker/overlap.h"

namespace gradsync {

struct AllreduceTrainOptions {
  LocalTrainOptions train;
  size_t bucket_bytes = 25u << 20;
  bool evaluate = true;  // rank 0 only
  // Gradient codec ("" or "none": plain ring average). The ring-summable codecs run inside the
  // ring: fp16 as a half-precision ring sum of gradients pre-divided by n, random-k as an
  // average of the k values every rank kept (the same indices in a step). The other codecs'
  // payloads are all-gathered and every rank decodes and averages them in rank order.
  std::string compression;
  bool error_feedback = false;
  float correction_momentum = 0;  // DGC momentum correction (then train.optimizer has no momentum)
  // Dense, uncompressed models: all-reduce each bucket on a communication thread as soon as
  // backward has produced it (worker/overlap.h), the first bucket at most first_bucket_bytes.
  bool overlap = true;
  size_t first_bucket_bytes = 1u << 20;
  // Device models (--device=cuda): the gradient is averaged by this collective (NCCL) on the
  // device, with no host copy, and the optimizer runs on the device. The CPU collective still
  // broadcasts the initial parameters and holds the final barrier.
  DeviceCollective* device_collective = nullptr;
  double collective_timeout_s = 60.0;  // deadline of a device all-reduce
  // Checkpoints (CPU models): rank 0 writes checkpoint_dir/allreduce.ckpt (parameters, optimizer
  // state, step; Adam's t is the step) atomically every checkpoint_every steps; resume makes every
  // rank start from it (rank 0 reads it and broadcasts; another optimizer's is refused). A dead
  // rank fails every other rank (the collective's deadline): the job is restarted with resume and
  // loses at most checkpoint_every steps.
  std::string checkpoint_dir;
  int64_t checkpoint_every = 0;
  bool resume = false;
  // false: FinishStep leaves the averaged gradient in the model's gradient buffer and updates
  // nothing, so that the caller's own optimizer steps (the Python frontend: any PyTorch
  // optimizer). Dense CPU models; no checkpoints.
  bool apply_update = true;
};

class AllreduceSync final : public GradientSync {
 public:
  // `model` and `collective` (and options.device_collective) must outlive the sync.
  AllreduceSync(const AllreduceTrainOptions& options, Model* model, Collective* collective);

  int rank() const override { return collective_->rank(); }
  int size() const override { return collective_->size(); }
  Result<int64_t> Start(const JobShape& shape) override;
  Status BeginStep(const StepPlan& plan) override;
  Status WaitParams(size_t) override { return OkStatus(); }
  Status GradReady(size_t tensor) override {
    if (reducer_) reducer_->OnReady(tensor);
    return OkStatus();
  }
  Result<SyncStepStats> FinishStep() override;
  void AbandonStep() override {
    if (reducer_) (void)reducer_->Finish();  // the communication thread lets go of the ring
  }
  Status Recover(const Status& failure) override { return failure; }
  Status EndTraining(bool) override { return collective_->Barrier().WithContext("final barrier"); }
  bool on_device() const override { return model_->on_device(); }
  SyncTraffic traffic() const override { return {collective_->bytes_sent(), collective_->bytes_received()}; }

 private:
  Status AverageGradients();
  Status WriteCheckpoint(int64_t step);

  AllreduceTrainOptions options_;
  Model* model_;
  Collective* collective_;
  std::string ckpt_path_;
  LrSchedule lr_;
  std::optional<Optimizer> opt_;
  std::vector<std::vector<std::byte>> gathered_;  // sparse tensors' (key, value) pairs
  std::vector<Segment> dense_runs_;  // the dense tensors' contiguous runs of the flat buffer
  std::vector<SparseGrad> merged_;  // per tensor, for sparse tensors
  std::unique_ptr<BucketAverager> averager_;  // the dense buckets, plain or compressed
  int64_t step_ = 0;
  float step_lr_ = NAN;  // the caller's rate for the step (StepPlan::lr), NaN: the schedule's
  std::unique_ptr<OverlappedReducer> reducer_;
};

}  // namespace gradsync
