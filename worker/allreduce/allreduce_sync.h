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
#include "common/config/sync_decisions.h"
#include "common/optim/optimizer.h"
#include "common/ps/partitioner.h"
#include "compression/gradient_encoder.h"
#include "gradsync.pb.h"
#include "models/model.h"
#include "worker/allreduce/allreduce_checkpoints.h"
#include "worker/allreduce/bucket_average.h"
#include "worker/allreduce/dense_averager.h"
#include "worker/allreduce/overlap.h"
#include "worker/allreduce/sparse_averager.h"
#include "worker/allreduce/zero_shards.h"
#include "worker/loop/train_options.h"
#include "worker/sync/gradient_sync.h"
#include "worker/sync/loss_scaling.h"

namespace gradsync {

struct AllreduceTrainOptions {
  LocalTrainOptions train;
  size_t bucket_bytes = 25u << 20;
  bool evaluate = true;  // rank 0 only
  // Gradient codec ("" or "none": plain ring average; compress_pull unused). The ring-summable
  // codecs run inside the ring: fp16 as a half-precision ring sum of gradients pre-divided by n,
  // random-k as an average of the k values every rank kept (the same indices in a step). The
  // other codecs' payloads are all-gathered and every rank decodes and averages them in rank
  // order.
  CodecOptions codec;
  // Dense, uncompressed models: all-reduce each bucket on a communication thread as soon as
  // backward has produced it (worker/allreduce/overlap.h), the first bucket at most first_bucket_bytes.
  bool overlap = true;
  size_t first_bucket_bytes = 1u << 20;
  // Device models (--device=cuda): the gradient is averaged by this collective (NCCL) on the
  // device, with no host copy, and the optimizer runs on the device. The CPU collective still
  // broadcasts the initial parameters and holds the final barrier.
  DeviceCollective* device_collective = nullptr;
  double collective_timeout_s = 60.0;  // deadline of a device all-reduce
  AllreduceCheckpointOptions checkpoint;  // worker/allreduce/allreduce_checkpoints.h
  // false: FinishStep leaves the averaged gradient in the model's gradient buffer and updates
  // nothing, so that the caller's own optimizer steps (the Python frontend: any PyTorch
  // optimizer). Dense CPU models; no checkpoints.
  bool apply_update = true;
  // ZeRO (dense models): rank r keeps the optimizer state of shard r of the flat parameter
  // vector only (ChunkBegin's n near-equal chunks) and updates only those parameters, which are
  // then all-gathered: the bytes of an all-reduce, 1/n of the optimizer state. Stage 1
  // reduce-scatters the gradient after backward; stage 2 bucket by bucket during backward (with
  // overlap; the model's own gradient buffer, where backward writes, stays whole either way). With
  // a codec the gradient goes through the codec's own exchange and only the update and the
  // parameter all-gather are sharded. Device models: NCCL reduce-scatter and all-gather, the
  // device optimizer on the shard. Checkpoints: rank 0 writes the parameters, every rank its
  // shard's optimizer state (allreduce-shard-<rank>.ckpt).
  int zero = 0;
};

class AllreduceSync final : public GradientSync {
 public:
  // `model` and `collective` (and options.device_collective) must outlive the sync.
  AllreduceSync(const AllreduceTrainOptions& options, Model* model, Collective* collective);
  // Not copied or moved: its checkpoints hold the address of its ZeRO shards.
  AllreduceSync(const AllreduceSync&) = delete;
  AllreduceSync& operator=(const AllreduceSync&) = delete;

  // The codec the gradient travels as: the named one, else (CPU models) the precision's 16 bits;
  // "" for plain floats. A device model's NCCL moves the 16-bit gradient itself.
  static std::string GradientCodec(const AllreduceTrainOptions& o, bool on_device);
  // What AllreduceOverlaps reads (common/config/sync_decisions.h) of a run over `workers` ranks.
  static OverlapFacts OverlapFactsOf(const AllreduceTrainOptions& o, const Model& model, int workers);

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
  SyncTraffic traffic() const override {
    return {collective_->bytes_sent(), collective_->bytes_received(), collective_->shm_bytes_sent(),
            collective_->shm_bytes_received()};
  }

 private:
  // Start's steps, in order: the options checked, ZeRO's shards cut, --resume's step shared (rank 0
  // reads the checkpoint: AllreduceCheckpoints), rank 0's parameters broadcast, the averagers and
  // the optimizer made, and the checkpoint's optimizer state loaded.
  Status CheckOptions() const;
  Status BroadcastParams();
  Status CreateAveragers();
  void CreateOptimizer(const JobShape& shape);
  // FinishStep's: a device model's average and update (NCCL), a CPU model's update (not ZeRO's).
  Status DeviceReduceAndStep(int64_t step, float rate);
  void ApplyUpdate(float rate);
  Status AverageGradients();
  // ZeRO: the step's update of this rank's shard, then the parameters all-gathered.
  Status ShardedUpdate(float rate, bool apply);

  AllreduceTrainOptions options_;
  Model* model_;
  Collective* collective_;
  LrSchedule lr_;
  std::optional<Optimizer> opt_;
  std::vector<Segment> dense_runs_;  // the dense tensors' contiguous runs of the flat buffer
  std::unique_ptr<DenseAverager> averager_;  // the dense gradient: buckets, plain or compressed, or PowerSGD
  SparseAverager sparse_;                    // the sparse gradients: all-gathered pairs
  std::optional<LossScaling> scaling_;         // --precision (fp16: dynamic loss scaling)
  int64_t step_ = 0;
  float step_lr_ = NAN;  // the caller's rate for the step (StepPlan::lr), NaN: the schedule's
  std::unique_ptr<OverlappedReducer> reducer_;
  ZeroShards shards_;  // ZeRO: this rank's shard of the flat parameter vector
  AllreduceCheckpoints checkpoints_;

 public:
  // The bytes of optimizer state this rank holds (ZeRO: its shard's only).
  size_t optimizer_state_bytes() const { return opt_ ? opt_->state().size_bytes() : 0; }
};

}  // namespace gradsync
