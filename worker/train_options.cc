#include "worker/train_options.h"

#include <algorithm>

namespace gradsync {
namespace {

// Every size flag is in MiB (TrainConfig's *_mib fields).
constexpr double kMiB = 1024.0 * 1024.0;

std::string Codec(const config::TrainConfig& c) { return c.compress() == "none" ? "" : c.compress(); }

// What gradients travel as: the named codec, else the precision's 16 bits ("" for fp32).
std::string WireCodec(const config::TrainConfig& c) {
  const std::string named = Codec(c);
  return named.empty() ? PrecisionCodec(*ParsePrecision(c.precision())) : named;
}

// The codec `spec` with error feedback and DGC's momentum correction (DGC moves the momentum to
// the sender: then the applied update is plain SGD).
CodecOptions CodecOf(const config::TrainConfig& c, const std::string& spec) {
  return {.compression = spec,
          .error_feedback = c.error_feedback(),
          .correction_momentum = c.momentum_correction() ? c.momentum() : 0.0f};
}

// A size in MiB as a count of floats, at least 1.
size_t Floats(double mib) { return static_cast<size_t>(std::max(1.0, mib * kMiB / sizeof(float))); }

}  // namespace

LocalTrainOptions TrainOptionsFrom(const config::TrainConfig& c) {
  LocalTrainOptions t;
  t.optimizer.kind = *ParseOptimizerKind(c.optimizer());  // Validate() checked it
  t.optimizer.weight_decay = c.weight_decay();
  if (t.optimizer.kind == OptimizerKind::kAdam || t.optimizer.kind == OptimizerKind::kLamb) {
    t.optimizer.beta1 = c.adam_beta1();
    t.optimizer.beta2 = c.adam_beta2();
    t.optimizer.eps = c.adam_eps();
  } else {
    t.optimizer.momentum = c.momentum_correction() ? 0.0f : c.momentum();
    t.optimizer.nesterov = c.nesterov();
  }
  t.numerics.precision = *ParsePrecision(c.precision());  // Validate() checked it
  t.numerics.initial_loss_scale = c.initial_loss_scale();
  if (t.optimizer.kind == OptimizerKind::kLars) t.optimizer.trust_coefficient = c.trust_coefficient();
  t.lr.base = c.lr();
  t.lr.kind = *ParseLrScheduleKind(c.lr_schedule());
  t.batch = c.batch();
  if (c.accumulate() > 1) {
    t.micro_batch = t.batch;
    t.batch *= c.accumulate();  // a step takes K micro-batches
  }
  t.warmup_epochs = c.warmup_epochs();
  t.epochs = c.epochs();
  t.max_steps = c.max_steps();
  t.seed = c.seed();
  t.report.log_every = c.log_every();
  t.report.eval_every = c.eval_every();
  t.straggler.spec = *ParseStraggler(c.straggle());
  t.straggler.seed = c.straggle_seed();
  t.periodic.every = c.sync_every();
  t.periodic.outer_lr = c.outer_lr();
  t.periodic.outer.momentum = c.outer_momentum();
  t.periodic.outer.nesterov = c.outer_nesterov();
  return t;
}

PsTrainOptions PsOptionsFrom(const config::TrainConfig& c, const LocalTrainOptions& train, int rank, int num_workers,
                             bool oversubscribed) {
  PsTrainOptions po;
  po.train = train;
  po.rank = rank;
  po.num_workers = num_workers;
  po.request_timeout_s = c.request_timeout();
  po.recovery_timeout_s = c.recovery_timeout();
  po.codec = CodecOf(c, WireCodec(c));
  po.codec.compress_pull = c.compress_pull();
  po.shard_update.staleness_aware_lr = c.staleness_aware_lr();
  if (c.has_delay_compensation()) {
    po.shard_update.delay_compensation = c.delay_compensation();
    po.shard_update.delay_compensation_adaptive = c.delay_compensation_adaptive();
  }
  po.overlap.enabled = OverlapOf(c, oversubscribed);
  po.overlap.push_part_floats = Floats(c.push_part_mib());
  po.channels.shm = c.shm();
  po.channels.data_channel = c.data_channel();
  po.channels.data_min_floats = Floats(c.data_channel_min_mib());
  po.wait = WaitPolicyOf(c);
  po.row_cache = c.row_cache();
  return po;
}

AllreduceTrainOptions AllreduceOptionsFrom(const config::TrainConfig& c, const LocalTrainOptions& train,
                                           bool oversubscribed) {
  AllreduceTrainOptions ao;
  ao.train = train;
  ao.bucket_bytes = static_cast<size_t>(c.bucket_mib() * kMiB);
  ao.overlap = OverlapOf(c, oversubscribed);
  ao.first_bucket_bytes = static_cast<size_t>(c.first_bucket_mib() * kMiB);
  ao.codec = CodecOf(c, Codec(c));
  ao.collective_timeout_s = c.collective_timeout();
  ao.zero = c.zero();
  return ao;
}

AllreduceCheckpointOptions CheckpointOptionsFrom(const config::TrainConfig& c) {
  return {.dir = c.checkpoint_dir(), .every = c.checkpoint_every(), .resume = c.resume()};
}

}  // namespace gradsync
