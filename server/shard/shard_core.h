// ShardCore: one shard's state and rules, with no sockets.
//
// It owns the shard's parameters and optimizer (KvShard, built from the job, with its gradient
// transform), the consistency rule (ConsistencyController), the pushes on their way in
// (PushIntake) and the pushes a bsp round holds (ShardRound), and announces every change it makes
// (ShardEvents). Everything that changes the shard's parameters goes through it: a push applied
// at once (ssp, asp), a push held for its round, the round applied (the held pushes summed in
// worker-rank order, so that a bsp run is bit-for-bit reproducible whatever order they came in,
// and applied once). The primary's loop
// (server.cc) and a backup's copy (replication.cc) both replay pushes and rounds through these
// calls: one apply path. Snapshot and Restore are the one place a shard becomes a checkpoint and
// a checkpoint a shard: the checkpoint file, the snapshot a primary sends its backups, and the
// copy a backup takes over from.
//
// A held push's values stay where they came (a frame, a shared-memory lane, a data channel's
// buffer) until it is applied; whatever lends them (PushChunk::lease) is let go as soon as they
// have been read. Not thread-safe: one thread, the shard's loop (or the backup's), drives it.
#pragma once

#include <cmath>
#include <cstdint>
#include <map>
#include <span>
#include <memory>
#include <string>
#include <utility>

#include "common/base/numeric/parallel_for.h"
#include "common/base/status.h"
#include "common/ps/consistency.h"
#include "common/ps/ps_protocol.h"
#include "gradsync.pb.h"
#include "server/shard/kv/kv_shard.h"
#include "server/shard/push_assembler.h"
#include "server/shard/push_intake.h"
#include "server/shard/shard_round.h"
#include "server/shard/state_sets.h"
#include "server/shard/transform/gradient_transform.h"

namespace gradsync {

// Who a checkpoint belongs to: the shard's rank and its job's identity (the scheduler's job id
// and the workers' settings fingerprint).
struct ShardIdentity {
  int rank = -1;
  std::string job_id;
  std::string job_fingerprint;
};
ShardIdentity IdentityOf(int rank, const wire::ClusterTable& table);

// The shard of rank `rank` of `job` (range, layout, optimizer, learning-rate schedule), as INIT,
// a restore and a backup build it.
Result<std::unique_ptr<KvShard>> MakeShardForJob(const wire::JobConfig& job, int num_servers, int rank,
                                                 bool aggregates);

// The checkpoint of `shard` and `rule` as they are now: the one builder (ShardCore::Snapshot,
// ShardCheckpointer::Write).
wire::ShardCheckpoint SnapshotShard(const ShardIdentity& id, const wire::JobConfig& job, const KvShard& shard,
                                    const ConsistencyController& rule);
// Puts checkpoint `c` into `shard`, built from c.job(): parameters, optimizer state and steps,
// version, schedule step, gradient count. kDataLoss when the checkpoint holds another range, its
// optimizer state was written by another optimizer than the job's, or a size does not fit.
Status RestoreShard(const wire::ShardCheckpoint& c, KvShard* shard);

class ShardEvents;

class ShardCore {
 public:
  // `apply_threads` > 1: large dense updates are split over that many threads (the caller's
  // included). `events`: who hears of every change as it is made (a primary's backups' log);
  // null: nobody.
  ShardCore(ConsistencyMode mode, int staleness, int num_workers, int apply_threads = 1,
            ShardEvents* events = nullptr)
      : rule_(mode, staleness, num_workers), round_(rule_.aggregates()), apply_threads_(apply_threads),
        events_(events) {}

  ConsistencyController& rule() { return rule_; }
  const ConsistencyController& rule() const { return rule_; }
  // Built (INIT, a restore, a backup's snapshot): shard() may be used.
  bool built() const { return shard_ != nullptr; }
  KvShard& shard() { return *shard_; }
  const KvShard& shard() const { return *shard_; }
  // Pushes on their way in (PushIntake: Accept's parts, a refused push's rest, who counted last).
  PushIntake& intake() { return intake_; }
  // The open round (ShardRound: the pushes held for it; a backup's chunks taken as they come).
  ShardRound& round() { return round_; }
  const ShardRound& round() const { return round_; }

  // Builds the shard of `job` for rank `rank` of `num_servers` (MakeShardForJob); nothing is held.
  Status Build(const wire::JobConfig& job, int num_servers, int rank);
  // Puts checkpoint `c` back into the shard of rank `rank`: the shard built from its job, its
  // parameters, optimizer state and counters (kDataLoss when `c` holds another range), and the
  // rule's clocks, live set and rounds. On failure nothing is built.
  Status Restore(const wire::ShardCheckpoint& c, int num_servers, int rank);
  // The shard and the rule as a checkpoint (SnapshotShard).
  wire::ShardCheckpoint Snapshot(const ShardIdentity& id) const;
  // No shard, nothing held, the rule afresh (a standby that keeps copies only).
  void Reset();

  // Membership, as the rule's (ConsistencyController) with the change announced. A worker that
  // rejoins goes on where it holds no one back (Suggest; returned); one that skips ahead to
  // `clock` (a restored shard's worker) loses a push of the open round it held; a dead worker
  // leaves the live set; one that joined leaves the rule.
  int64_t Rejoin(int worker);
  void GoOnAt(int worker, int64_t clock);
  void Remove(int worker);
  void Leave(int worker);
  // A worker set the optimizer state (KvShard::SetOptimizerState), announced once set.
  Status SetOptimizerState(int worker, std::span<const float> state, int64_t steps, std::span<const int64_t> skipped);
  // A worker set the parameters (KvShard::SetParams), announced once set. With delay compensation,
  // every worker is taken to have read them (the setting worker's copy was broadcast to all).
  Status SetParams(int worker, std::span<const float> params);

  // Worker w's pull of `segments` was answered from the parameters as they are now: the
  // transform sees what it read (delay compensation keeps it for its next push's correction).
  void Pulled(int worker, std::span<const Segment> segments) { transform_->Pulled(worker, segments, shard_->params()); }
  // What this shard does to a push's values before applying them (MakeGradientTransform: the
  // job's delay compensation in ssp and asp, else PassThrough); null before Build.
  const GradientTransform* transform() const { return transform_.get(); }

  // A push (or one part of an overlapped push) whose values the caller has read and checked
  // (ranges, keys, decoding): checked against the shard's version (kAborted for a future one) and
  // the rule, and gathered with its earlier parts (PushIntake). Returns the whole push once
  // its last part is in, counted by the rule (then Take it), or null while parts are to come.
  Result<HeldPush*> Accept(const PsRequest& r, PushChunk chunk, size_t num_keys) {
    return intake_.Accept(r, std::move(chunk), num_keys, shard_->version(), rule_);
  }
  // A push the rule has counted (Accept), computed on a version `lag` behind the shard's,
  // announced first. Aggregating modes: held for its round. Otherwise its values go through the
  // transform (delay compensation: corrected, into chunks of their own), are announced as
  // transformed, so that a backup applies what this core applied, and are applied now at the
  // rate factor its lag earns (1 / max(1, lag) with the job's staleness-aware rate, else 1) and
  // let go.
  void Take(int worker, HeldPush push, int64_t lag);
  // The optimizer states workers are setting (STATE_PUSH), which wait for their point as pulls do.
  StateSets& state_sets() { return state_sets_; }

  // The open round is applied (ShardRound::Apply), the rule's round counted, and announced.
  using Round = AppliedRound;
  Round ApplyRound();

 private:
  ConsistencyController rule_;
  PushIntake intake_;
  ShardRound round_;  // after rule_: it holds pushes when the rule aggregates
  int apply_threads_;
  std::unique_ptr<ParallelFor> pool_;  // apply_threads_ > 1, made with the first shard
  StateSets state_sets_;
  wire::JobConfig job_;
  std::unique_ptr<KvShard> shard_;
  std::unique_ptr<GradientTransform> transform_;  // soft state: made afresh by Build (and so Restore)
  ShardEvents* events_;
};

// What a core's changes are, in the order it makes them, with the core as it is after each: a
// primary's replication (server/replication/) listens and writes its backups' log.
class ShardEvents {
 public:
  virtual ~ShardEvents() = default;
  // A counted push, before it is held or applied (`scale`: its staleness-aware factor).
  virtual void Pushed(const ShardCore& core, int worker, const HeldPush& push, float scale) = 0;
  virtual void RoundApplied(const ShardCore& core, const ShardCore::Round& round) = 0;
  // The rule's membership changed; worker >= 0: that worker's held push is dropped too.
  virtual void MembershipChanged(const ShardCore& core, int worker) = 0;
  virtual void OptimizerSet(const ShardCore& core, int worker) = 0;
  virtual void ParamsSet(const ShardCore& core, int worker) = 0;
};

}  // namespace gradsync
