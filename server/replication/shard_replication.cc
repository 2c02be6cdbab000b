#include "server/replication/shard_replication.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "common/base/logging.h"
#include "common/optim/optimizer.h"

namespace gradsync {

ShardReplication::ShardReplication(TransportContext& ctx, int rank, const wire::ClusterTable& table,
                                   ConsistencyMode mode, int staleness, std::string key, bool standby,
                                   std::shared_ptr<Colocated> colocated)
    : rank_(rank),
      servers_(table.servers_size()),
      replicas_(table.replicas()),
      standby_(standby),
      colocated_(std::move(colocated)),
      mode_(mode),
      staleness_(staleness),
      key_(std::move(key)) {
  if (!on()) return;
  replicator_ = std::make_unique<Replicator>(ctx, rank_, key_);
  store_ = std::make_unique<ReplicaStore>(servers_, mode_, staleness_, key_);
}

// --- Primary side ---

ReplicaEntry ShardReplication::Entry(wire::ReplicaOp op, const ShardCore& core) const {
  ReplicaEntry e;
  e.op = op;
  const auto& pushed = core.rule().clocks().pushed_all();
  const auto& live = core.rule().clocks().live_all();
  e.control = ReplicaControl{{pushed.begin(), pushed.end()}, {live.begin(), live.end()}, core.rule().clocks().rounds_applied()};
  return e;
}

ReplicaEntry ShardReplication::PushEntry(const ShardCore& core, int worker, const PushChunk& c, bool last, float lr,
                                         float scale, Payload* p) const {
  ReplicaEntry h = Entry(wire::REPLICA_PUSH, core);
  h.worker = worker;
  h.push.scale = scale;
  h.push.counts = last;
  h.push.lr = lr;
  h.push.absent = c.absent;
  h.push.tables = c.tables;
  h.frames.segments = c.segments;
  p->has_values = true;
  p->keys = c.keys;
  const size_t n = c.tables.empty() ? static_cast<size_t>(TotalSize(c.segments)) + c.keys.size()
                                    : static_cast<size_t>(core.shard().tables().Floats(c.tables));
  p->values = std::span<const float>(c.values(), n);
  return h;
}

void ShardReplication::Pushed(const ShardCore& core, int worker, const HeldPush& push, float scale) {
  if (!active()) return;
  for (size_t i = 0; i < push.chunks.size(); ++i) {
    Payload p;
    ReplicaEntry h = PushEntry(core, worker, push.chunks[i], i + 1 == push.chunks.size(), push.lr, scale, &p);
    replicator_->Send(std::move(h), p);
    counts_.sent++;
  }
}

void ShardReplication::RoundApplied(const ShardCore& core, const ShardCore::Round& round) {
  if (!active()) return;
  ReplicaEntry h = Entry(wire::REPLICA_ROUND, core);
  h.push.lr = round.lr;
  replicator_->Send(std::move(h));
  counts_.sent++;
}

void ShardReplication::MembershipChanged(const ShardCore& core, int worker) {
  if (!active() || !core.built()) return;
  ReplicaEntry h = Entry(wire::REPLICA_CONTROL, core);
  h.worker = worker;
  replicator_->Send(std::move(h));
  counts_.sent++;
}

void ShardReplication::OptimizerSet(const ShardCore& core, int worker) {
  if (!active()) return;
  const KvShard& shard = core.shard();
  const int slots = shard.optimizer().num_slots();
  const auto state = shard.optimizer().state();
  const Segment range = shard.range();
  const size_t n = static_cast<size_t>(range.size());
  for (int k = 0; k < std::max(1, slots); ++k) {
    ReplicaEntry h = Entry(wire::REPLICA_OPTIMIZER, core);
    h.worker = worker;
    h.state.part = k;
    h.state.optimizer = OptimizerKindName(shard.optimizer().options().kind);
    h.state.steps = shard.optimizer().steps();
    h.state.skipped.assign(shard.optimizer().skipped().begin(), shard.optimizer().skipped().end());
    h.state.slots = slots;
    Payload p;
    if (slots > 0) {
      h.frames.segments = {range};
      p.has_values = true;
      p.values = state.subspan(static_cast<size_t>(k) * n, n);
    }
    replicator_->Send(std::move(h), p);
    counts_.sent++;
  }
}

void ShardReplication::ParamsSet(const ShardCore& core, int worker) {
  if (!active()) return;
  ReplicaEntry h = Entry(wire::REPLICA_OPTIMIZER, core);
  h.worker = worker;
  h.state.params = true;
  h.frames.segments = {core.shard().range()};
  Payload p;
  p.has_values = true;
  p.values = core.shard().params();
  replicator_->Send(std::move(h), p);
  counts_.sent++;
}

void ShardReplication::HoldReply(std::string peer, wire::Header reply) {
  replicator_->Hold(replicator_->last_seq(), std::move(peer), std::move(reply));
}

void ShardReplication::SendSnapshots(const ShardCore& core, const ShardIdentity& id) {
  if (!replicator_ || !core.built()) return;
  for (int b : replicator_->NeedSnapshot()) {
    wire::ShardCheckpoint meta = core.Snapshot(id);
    meta.clear_params();
    meta.clear_optimizer_state();
    ReplicaEntry h = Entry(wire::REPLICA_META, core);
    h.snapshot.meta = meta.SerializeAsString();
    replicator_->SendSnapshotEntry(b, std::move(h));
    const KvShard& shard = core.shard();
    const Segment range = shard.range();
    auto whole = [&](wire::ReplicaOp op, std::span<const float> values, int part) {
      ReplicaEntry e = Entry(op, core);
      e.state.part = part;
      e.frames.segments = {range};
      Payload p;
      p.has_values = true;
      p.values = values;
      replicator_->SendSnapshotEntry(b, std::move(e), p);
    };
    whole(wire::REPLICA_PARAMS, shard.params(), 0);
    const auto state = shard.optimizer().state();
    const size_t n = static_cast<size_t>(range.size());
    for (size_t k = 0; n > 0 && (k + 1) * n <= state.size(); ++k) whole(wire::REPLICA_STATE, state.subspan(k * n, n), static_cast<int>(k));
    // The open round's pushes (bsp): acknowledged, so the copy must hold them too.
    for (const auto& [worker, held] : core.round().held()) {
      for (size_t i = 0; i < held.chunks.size(); ++i) {
        Payload p;
        ReplicaEntry e = PushEntry(core, worker, held.chunks[i], i + 1 == held.chunks.size(), held.lr, 1.0f, &p);
        replicator_->SendSnapshotEntry(b, std::move(e), p);
      }
    }
    replicator_->SnapshotSent(b);
    GRADSYNC_LOG(INFO) << "server " << rank_ << ": sent a snapshot (version " << shard.version() << ") to backup server "
                       << b;
  }
}

void ShardReplication::UpdateBackups(const SchedulerClient& scheduler, const ShardCore& core, const ShardIdentity& id) {
  if (!replicator_) return;
  const wire::ClusterTable now = scheduler.table();
  std::map<int, wire::NodeInfo> backups;
  for (const int r : standby_ ? std::vector<int>{} : BackupRanks(rank_, replicas_, servers_)) {
    if (r == rank_ || colocated_->Has(r) || scheduler.IsDead(wire::SERVER, r)) continue;
    backups[r] = now.servers(r);
  }
  // Standbys back up every shard (they came back to restore the copies a death cost).
  for (const auto& sb : now.standbys()) {
    if (standby_ || sb.rank() == rank_ || colocated_->Has(sb.rank()) || scheduler.IsDead(wire::SERVER, sb.rank())) continue;
    backups[sb.rank()] = sb;
  }
  replicator_->SetBackups(backups);
  SendSnapshots(core, id);
}

std::vector<Socket*> ShardReplication::sockets() {
  return replicator_ ? replicator_->sockets() : std::vector<Socket*>{};
}

void ShardReplication::Poll(Socket& socket, const ShardCore& core, const ShardIdentity& id) {
  if (replicator_) {
    replicator_->Poll(socket);
    SendSnapshots(core, id);
  }
  if (store_) ack_delay_.SendDue(socket);
}

// --- Backup side ---

Status ShardReplication::HandleEntry(const Message& m, const SchedulerClient& scheduler, Socket& socket) {
  auto entry = DecodeReplicaEntry(m.header);
  const int s = entry.ok() ? entry->shard : -1;
  // Only the copies this server is a backup for: a shard whose primary is this process (taken
  // over) or that is not backed up here is refused.
  bool mine = standby_;
  for (const int r : BackupRanks(s, replicas_, servers_)) mine = mine || r == rank_;
  Status st;
  if (!entry.ok()) {
    st = entry.status();
  } else if (!store_ || !mine || s == rank_ || colocated_->Has(s)) {
    st = PermissionDeniedError("this server does not back up shard " + std::to_string(s));
  } else if (entry->op == wire::REPLICA_META && scheduler.IsDead(wire::SERVER, s)) {
    // A dead primary's late snapshot (or one from a process that says it is): not taken. A
    // primary that comes back is heard of (NODE_JOINED) and sends its snapshot again.
    st = UnavailableError("a snapshot of shard " + std::to_string(s) + ", whose primary the scheduler says is dead");
  } else {
    st = store_->Apply(*entry, m);
  }
  ReplicaAck ack;
  ack.sender = rank_;
  ack.shard = s;
  ack.seq = TagOf(m.header).request_id;
  if (st.ok()) {
    counts_.received++;
    if (ack_delay_.Defer(m.peer, EncodeReplicaAck(ack))) return st;
  } else {
    GRADSYNC_LOG(WARNING) << "server " << rank_ << ": copy of shard " << s << ": " << st;
    ack.error = Status(st.code(), "server " + std::to_string(rank_) + ": " + st.message());
  }
  if (!m.peer.empty()) (void)socket.Send(m.peer, EncodeReplicaAck(ack));
  return st;
}

std::vector<int> ShardReplication::DeadShards(const SchedulerClient& scheduler) const {
  std::vector<int> out;
  for (int r = 0; store_ && r < servers_; ++r) {
    if (scheduler.IsDead(wire::SERVER, r)) out.push_back(r);
  }
  return out;
}

std::optional<ReplicaCopy> ShardReplication::TakeOver(int dead, const SchedulerClient& scheduler) {
  if (!store_ || !store_->Complete(dead) || colocated_->Has(dead)) return std::nullopt;
  // The first live backup in the dead shard's order takes it (its ranks, then the standbys); the
  // others keep their copies.
  std::vector<int> order = BackupRanks(dead, replicas_, servers_);
  const wire::ClusterTable now = scheduler.table();
  for (const auto& sb : now.standbys()) order.push_back(sb.rank());
  const auto mine = std::find(order.begin(), order.end(), rank_);
  if (mine == order.end()) return std::nullopt;
  for (auto r = order.begin(); r != mine; ++r) {
    if (!scheduler.IsDead(wire::SERVER, *r)) return std::nullopt;  // a live backup before this one takes it
  }
  auto copy = store_->Take(dead);
  if (!copy.ok()) return std::nullopt;
  return std::move(copy).value();
}

void ShardReplication::BecomeStandby(int rank) {
  rank_ = rank;
  standby_ = true;
  if (!on()) return;
  store_ = std::make_unique<ReplicaStore>(servers_, mode_, staleness_, key_);
  replicator_->SetBackups({});
}

}  // namespace gradsync
