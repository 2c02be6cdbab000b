#include "server/replication/replication.h"

#include <sodium.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "common/base/clock.h"
#include "common/base/logging.h"
#include "common/ps/partitioner.h"
#include "common/ps/replica_protocol.h"
#include "server/shard/shard_checkpointer.h"

namespace gradsync {

std::vector<int> BackupRanks(int shard, int replicas, int servers) {
  std::vector<int> out;
  for (int k = 1; k < replicas && k < servers; ++k) out.push_back((shard + k) % servers);
  return out;
}

// --- Backup side ---

namespace {

// The consistency state an entry carries (the primary's after it), into the copy's rule. (The
// primary's entries always carry it; one without any leaves the rule as it was.)
Status SetControl(const ReplicaEntry& e, ConsistencyController* rule) {
  if (!e.control) return OkStatus();
  Status s = rule->clocks().Restore(e.control->pushed, e.control->live, e.control->rounds);
  return s.ok() ? s : InvalidArgumentError("REPLICATE: " + s.message());
}

std::vector<float> Values(const Message& m) {
  std::vector<float> v(m.num_values());
  m.CopyValues(v.data());
  return v;
}

}  // namespace

std::vector<int> ReplicaStore::shards() const {
  std::vector<int> out;
  for (const auto& [s, c] : copies_) out.push_back(s);
  return out;
}

std::span<const float> ReplicaStore::params(int shard) const {
  auto it = copies_.find(shard);
  if (it == copies_.end() || !it->second.core || !it->second.core->built()) return {};
  return it->second.core->shard().params();
}

bool ReplicaStore::Complete(int shard) const {
  auto it = copies_.find(shard);
  return it != copies_.end() && it->second.core && it->second.core->built() && it->second.params &&
         it->second.state_parts == 0;
}

Status ReplicaStore::Apply(const Message& m) {
  ASSIGN_OR_RETURN(const ReplicaEntry e, DecodeReplicaEntry(m.header));
  return Apply(e, m);
}

Status ReplicaStore::Apply(const ReplicaEntry& h, const Message& m) {
  const int s = h.shard;
  if (s < 0 || s >= num_servers_) return InvalidArgumentError("REPLICATE for shard " + std::to_string(s));
  if (h.op == wire::REPLICA_META) {
    // Checked before anything changes: a stranger's snapshot leaves the copy as it was.
    if (key_.empty() || h.snapshot.key.size() != key_.size() || sodium_memcmp(h.snapshot.key.data(), key_.data(), key_.size()) != 0) {
      return PermissionDeniedError("REPLICATE: a snapshot of shard " + std::to_string(s) +
                                   " without this job's replication key (not from one of its servers)");
    }
    if (h.sender != s) {
      return PermissionDeniedError("REPLICATE: a snapshot of shard " + std::to_string(s) + " from server " +
                                   std::to_string(h.sender) + ", not its primary");
    }
    Copy c;
    c.sender = m.peer;
    if (!c.meta.ParseFromString(h.snapshot.meta) || c.meta.rank() != s) {
      return InvalidArgumentError("REPLICATE: a snapshot of shard " + std::to_string(s) + " that does not describe it");
    }
    c.core = std::make_unique<ShardCore>(mode_, staleness_, c.meta.job().num_workers());
    c.core->round().set_traced(false);  // the primary's timeline shows its rounds
    RETURN_IF_ERROR(c.core->Build(c.meta.job(), num_servers_, s));
    // The table rows come whole in the snapshot (the dense parameters and state follow it).
    RETURN_IF_ERROR(c.core->shard().tables().Restore(c.meta.tables()));
    c.meta.clear_tables();
    RETURN_IF_ERROR(SetControl(h, &c.core->rule()));
    const size_t n = static_cast<size_t>(c.core->shard().range().size());
    c.state_parts = n == 0 ? 0 : static_cast<int>(c.core->shard().optimizer().state().size() / n);
    c.seq = h.seq;
    c.index = h.index;
    copies_[s] = std::move(c);
    return OkStatus();
  }
  auto it = copies_.find(s);
  if (it == copies_.end()) return FailedPreconditionError("REPLICATE: no snapshot of shard " + std::to_string(s) + " yet");
  Copy& c = it->second;
  if (m.peer != c.sender) {
    return PermissionDeniedError("REPLICATE: an entry of shard " + std::to_string(s) +
                                 "'s log not from the connection its snapshot came on");
  }
  if (h.index != c.index + 1 || h.seq < c.seq) {
    const uint64_t expected = c.index + 1;
    copies_.erase(it);
    return FailedPreconditionError("REPLICATE: entry " + std::to_string(h.index) + " of shard " +
                                   std::to_string(s) + "'s log, expected " + std::to_string(expected));
  }
  Status st = ApplyTo(c, h, m);
  if (st.ok()) st = SetControl(h, &c.core->rule());
  if (!st.ok()) {
    copies_.erase(it);
    return st;
  }
  c.seq = h.seq;
  c.index = h.index;
  return OkStatus();
}

namespace {

// An entry's segments and keys, read once.
struct EntryValues {
  std::vector<Segment> segments;
  std::vector<uint64_t> keys;
  bool whole = false;  // the shard's whole range, dense
};

EntryValues ReadEntry(const ReplicaEntry& entry, const Message& m, const Segment& range) {
  EntryValues e;
  e.segments = entry.frames.segments;
  std::vector<uint64_t> scratch;
  const auto keys = m.Keys(&scratch);
  e.keys.assign(keys.begin(), keys.end());
  e.whole = e.segments.size() == 1 && e.segments[0] == range && e.keys.empty() &&
            m.num_values() == static_cast<size_t>(range.size());
  return e;
}

}  // namespace

Status ReplicaStore::ApplySnapshotPart(Copy& c, const ReplicaEntry& h, const Message& m) {
  KvShard& shard = c.core->shard();
  const Segment range = shard.range();
  const EntryValues e = ReadEntry(h, m, range);
  const std::span<const int64_t> skipped(c.meta.optimizer_skipped().data(),
                                         static_cast<size_t>(c.meta.optimizer_skipped().size()));
  std::vector<float> params;
  std::vector<float> state(shard.optimizer().state().begin(), shard.optimizer().state().end());
  if (h.op == wire::REPLICA_PARAMS) {
    if (!e.whole) return InvalidArgumentError("REPLICATE: snapshot parameters are not the shard's range");
    // The counters come with the parameters; the state vectors (if any) follow.
    params = Values(m);
    c.params = true;
  } else {
    params.assign(shard.params().begin(), shard.params().end());
    const int part = h.state.part;
    const size_t n = static_cast<size_t>(range.size());
    const size_t parts = state.size() / std::max<size_t>(1, n);
    if (!e.whole || !c.params || part < 0 || static_cast<size_t>(part) >= parts || c.state_parts <= 0) {
      return InvalidArgumentError("REPLICATE: snapshot optimizer state part " + std::to_string(part));
    }
    m.CopyValues(state.data() + static_cast<size_t>(part) * n);
    c.state_parts--;
  }
  return shard.Restore(params, state, c.meta.optimizer_steps(), c.meta.version(), c.meta.step(), c.meta.updates(),
                       skipped);
}

Status ReplicaStore::ApplyPush(Copy& c, const ReplicaEntry& h, const Message& m) {
  const int w = h.worker;
  if (w < 0 || w >= c.meta.job().num_workers()) return InvalidArgumentError("REPLICATE: push of worker " + std::to_string(w));
  KvShard& shard = c.core->shard();
  EntryValues e = ReadEntry(h, m, shard.range());
  size_t n = m.num_values();
  PushChunk chunk;
  chunk.absent = h.push.absent;
  chunk.tables = h.push.tables;
  if (chunk.tables.empty()) {
    RETURN_IF_ERROR(shard.Validate(e.segments, e.keys, &n, chunk.absent));
  } else {
    RETURN_IF_ERROR(shard.tables().Validate(chunk.tables, e.keys, &n));
  }
  chunk.segments = std::move(e.segments);
  chunk.keys = std::move(e.keys);
  chunk.owned = Values(m);
  if (chunk.owned.empty()) chunk.owned.resize(1);  // values() reads owned
  c.core->round().TakeChunk(w, std::move(chunk), h.push.scale, h.push.counts, h.push.lr, shard);
  return OkStatus();
}

Status ReplicaStore::ApplyOptimizer(Copy& c, const ReplicaEntry& h, const Message& m) {
  // A worker's optimizer state: its vectors in order, set whole with the last (none: one entry
  // that sets the steps).
  KvShard& shard = c.core->shard();
  const EntryValues e = ReadEntry(h, m, shard.range());
  if (h.state.params) {
    // A worker set the parameters: the range's values, whole, in this one entry.
    if (!e.whole || c.staged_next != 0) return InvalidArgumentError("REPLICATE: a parameter set that is not the shard's range");
    std::vector<float> params(static_cast<size_t>(shard.range().size()));
    m.CopyValues(params.data());
    return c.core->SetParams(h.worker, params);
  }
  const int slots = shard.optimizer().num_slots();
  const int part = h.state.part;
  const size_t n = static_cast<size_t>(shard.range().size());
  if (h.state.slots != slots || part != c.staged_next || part >= std::max(1, slots) ||
      (slots > 0 ? !e.whole : h.frames.has_values || !e.segments.empty())) {
    c.staged_state.clear();
    c.staged_next = 0;
    return InvalidArgumentError("REPLICATE: optimizer state vector " + std::to_string(part) + " of " +
                                std::to_string(h.state.slots) + " (the shard keeps " + std::to_string(slots) +
                                ", vector " + std::to_string(c.staged_next) + " due)");
  }
  if (part == 0) c.staged_state.assign(shard.optimizer().state().size(), 0.0f);
  if (slots > 0) m.CopyValues(c.staged_state.data() + static_cast<size_t>(part) * n);
  if (part + 1 < slots) {
    c.staged_next = part + 1;
    return OkStatus();
  }
  c.staged_next = 0;
  const Status st = shard.SetOptimizerState(
      c.staged_state, h.state.steps, h.state.skipped);
  c.staged_state.clear();
  return st;
}

Status ReplicaStore::ApplyTo(Copy& c, const ReplicaEntry& h, const Message& m) {
  const wire::ReplicaOp op = h.op;
  if (op == wire::REPLICA_PARAMS || op == wire::REPLICA_STATE) return ApplySnapshotPart(c, h, m);
  if (!c.params || c.state_parts > 0) return FailedPreconditionError("REPLICATE: an entry before the snapshot is whole");
  switch (op) {
    case wire::REPLICA_PUSH: return ApplyPush(c, h, m);
    case wire::REPLICA_ROUND:
      if (!c.core->rule().aggregates()) return InvalidArgumentError("REPLICATE: a round in a mode without rounds");
      c.core->ApplyRound();
      return OkStatus();
    case wire::REPLICA_CONTROL:
      if (h.worker >= 0) c.core->round().Drop(h.worker);
      return OkStatus();
    case wire::REPLICA_OPTIMIZER: return ApplyOptimizer(c, h, m);
    default: return InvalidArgumentError("REPLICATE: unknown entry " + std::to_string(op));
  }
}

Result<ReplicaCopy> ReplicaStore::Take(int shard) {
  if (!Complete(shard)) return FailedPreconditionError("no whole copy of shard " + std::to_string(shard) + " here");
  Copy& c = copies_[shard];
  ReplicaCopy out;
  out.checkpoint = c.core->Snapshot({c.meta.rank(), c.meta.job_id(), c.meta.job_fingerprint()});
  out.held = c.core->round().TakeHeld();
  copies_.erase(shard);
  return out;
}

// --- Primary side ---

void Replicator::SetBackups(const std::map<int, wire::NodeInfo>& backups) {
  for (auto it = links_.begin(); it != links_.end();) {
    auto b = backups.find(it->first);
    const std::string endpoint =
        b == backups.end() ? "" : "tcp://" + b->second.host() + ":" + std::to_string(b->second.port());
    if (endpoint.empty() || endpoint != it->second.endpoint) {
      GRADSYNC_LOG(INFO) << "server " << shard_ << ": backup on server " << it->first << " dropped";
      it = links_.erase(it);
    } else {
      ++it;
    }
  }
  for (const auto& [rank, info] : backups) {
    if (links_.count(rank)) continue;
    Link link;
    link.endpoint = "tcp://" + info.host() + ":" + std::to_string(info.port());
    auto sock = Socket::ConnectDealer(ctx_, link.endpoint, "server " + std::to_string(rank) + " (backup)");
    if (!sock.ok()) {
      GRADSYNC_LOG(ERROR) << "server " << shard_ << ": cannot reach backup server " << rank << ": " << sock.status();
      continue;
    }
    link.socket = std::make_unique<Socket>(std::move(sock).value());
    links_[rank] = std::move(link);
    GRADSYNC_LOG(INFO) << "server " << shard_ << ": backed up on server " << rank << " at " << info.host() << ":"
                       << info.port();
  }
}

std::vector<int> Replicator::NeedSnapshot() const {
  std::vector<int> out;
  for (const auto& [rank, link] : links_)
    if (link.needs_snapshot && !link.refused) out.push_back(rank);
  return out;
}

void Replicator::SnapshotSent(int backup) {
  if (auto it = links_.find(backup); it != links_.end()) it->second.needs_snapshot = false;
}

void Replicator::Stamp(ReplicaEntry* e, uint64_t seq) const {
  e->sender = shard_;
  e->shard = shard_;
  e->seq = seq;
}

void Replicator::SendOn(int backup, Link& link, ReplicaEntry e, const Payload& p) {
  if (e.op == wire::REPLICA_META) {
    link.index = 0;
    e.snapshot.key = key_;
  }
  e.index = link.index++;
  Status s = link.socket->Send("", EncodeReplicaEntry(e), p);
  if (!s.ok()) {
    // Its copy is out of step now: a fresh snapshot once it reads again.
    GRADSYNC_LOG(WARNING) << "server " << shard_ << ": entry " << e.seq << " to backup server " << backup
                          << " not sent (" << s << "); it gets a new snapshot";
    link.needs_snapshot = true;
  }
}

uint64_t Replicator::Send(ReplicaEntry h, const Payload& p) {
  Stamp(&h, ++seq_);
  for (auto& [rank, link] : links_)
    if (!link.needs_snapshot && !link.refused) SendOn(rank, link, h, p);
  return seq_;
}

void Replicator::SendSnapshotEntry(int backup, ReplicaEntry h, const Payload& p) {
  Stamp(&h, seq_);
  auto it = links_.find(backup);
  if (it != links_.end()) SendOn(backup, it->second, h, p);
}

TestAckDelay::TestAckDelay() {
  const char* v = std::getenv("GRADSYNC_TEST_REPLICA_ACK_DELAY_MS");
  delay_ms_ = v == nullptr ? 0.0 : std::max(0.0, std::strtod(v, nullptr));
}

bool TestAckDelay::Defer(const std::string& peer, const wire::Header& reply) {
  if (delay_ms_ <= 0 || peer.empty()) return false;
  held_.push_back({SteadyMicros() / 1e3 + delay_ms_, peer, reply});
  return true;
}

void TestAckDelay::SendDue(Socket& socket) {
  const double now_ms = SteadyMicros() / 1e3;
  while (!held_.empty() && held_.front().due_ms <= now_ms) {
    (void)socket.Send(held_.front().peer, held_.front().reply);
    held_.pop_front();
  }
}

void Replicator::Hold(uint64_t seq, std::string peer, wire::Header reply) {
  held_.push_back({seq, std::move(peer), std::move(reply)});
}

std::vector<Socket*> Replicator::sockets() {
  std::vector<Socket*> out;
  for (auto& [rank, link] : links_) out.push_back(link.socket.get());
  return out;
}

void Replicator::Poll(Socket& socket) {
  for (auto& [rank, link] : links_) {
    for (int k = 0; k < 256; ++k) {
      auto m = link.socket->Recv(0);
      if (!m.ok()) break;
      if (!m->malformed.ok()) continue;
      auto ack = DecodeReplicaAck(m->header);
      if (!ack.ok()) continue;
      if (ack->error.ok()) {
        link.acked = std::max(link.acked, ack->seq);
      } else if (!link.refused) {
        if (ack->error.code() == StatusCode::kPermissionDenied) {
          // It does not keep copies of this shard (it serves it, or is no backup of it): no
          // reply waits for it until its address changes.
          GRADSYNC_LOG(WARNING) << "server " << shard_ << ": server " << rank << " refuses to back it up ("
                                << ack->error.message() << ")";
          link.refused = true;
          continue;
        }
        GRADSYNC_LOG(WARNING) << "server " << shard_ << ": backup server " << rank << " is out of step ("
                              << ack->error.message() << "); sending it a new snapshot";
        link.needs_snapshot = true;
        link.acked = 0;
      }
    }
  }
  Release(socket);
}

void Replicator::Release(Socket& socket) {
  uint64_t all = seq_;
  for (const auto& [rank, link] : links_)
    if (!link.refused) all = std::min(all, link.acked);
  size_t done = 0;
  while (done < held_.size() && held_[done].seq <= all) {
    Status s = socket.Send(held_[done].peer, held_[done].reply);
    if (!s.ok()) GRADSYNC_LOG(WARNING) << "server " << shard_ << ": reply after replication: " << s;
    ++done;
  }
  held_.erase(held_.begin(), held_.begin() + static_cast<std::ptrdiff_t>(done));
}

}  // namespace gradsync
