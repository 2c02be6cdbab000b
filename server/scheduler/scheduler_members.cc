// Scheduler: membership after the job is complete: nodes declared dead by their silence, a
// restarted node taking a dead one's rank (a server back as a standby when its backup took its
// shard over), workers that ended training, and the news of all of these to every node.
#include <algorithm>

#include "common/base/clock.h"
#include "common/base/logging.h"
#include "common/config/train_config.h"
#include "common/net/control/node.h"
#include "common/obs/trace.h"
#include "server/replication/replication.h"
#include "server/scheduler/scheduler.h"

namespace gradsync {

void Scheduler::HandleRejoin(const std::string& peer, const ControlMessage& h, const std::string& who, double now) {
  const auto& info = h.node;
  // The same checks as a first registration: mode and (workers) the job's settings.
  if (h.mode != mode_ || (mode_ == ModeName(config::SSP) && h.staleness >= 0 && h.staleness != staleness_)) {
    return ReplyError(peer, InvalidArgumentError("mode mismatch: this job runs " + mode_ + ", this " +
                                                   RoleName(info.role()) + " asked for " + h.mode));
  }
  if (info.role() == wire::WORKER && h.job_fingerprint != fingerprint_) {
    const FingerprintDifference d = DescribeFingerprintDifference(h.job_fingerprint, fingerprint_);
    return ReplyError(peer, InvalidArgumentError("settings differ from the running job's: [" + d.mine + "] vs [" +
                                                   d.theirs + "]"));
  }
  // A restarted node takes the rank of a dead one of its role: the one it asks for, else the first.
  Node* slot = DeadSlotFor(info);
  if (!slot && info.requested_rank() >= 0) {
    if (Node* alive = LiveNode(info.role(), info.requested_rank())) {
      if (alive->info.adopted()) {
        // A backup took the shard over while this server was gone: it serves it now. The
        // server comes back as a standby backup (it catches up from the primaries' snapshots).
        if (options_.replicas > 1) return AddStandby(peer, h, who, *alive, now);
        return ReplyError(peer, FailedPreconditionError(
                                      NodeName(alive->info) + "'s shard was taken over by its backup at " +
                                      alive->info.host() + ":" + std::to_string(alive->info.port()) + "; nothing to rejoin"));
      }
      // Its predecessor has not been declared dead yet (a quick restart): it asks again.
      return ReplyError(peer, UnavailableError(NodeName(alive->info) + " is still alive; retry once it is declared dead"));
    }
  }
  if (slot && info.role() == wire::SERVER && options_.replicas > 1 && !info.adopted() &&
      now - slot->dead_at < options_.heartbeat_timeout_s) {
    // Its backup holds every acknowledged push and is about to take the rank over; a restarted
    // server would restore an older checkpoint. It asks again, and is a standby once the backup
    // has taken over (or takes the rank itself if no backup did).
    return ReplyError(peer, UnavailableError(NodeName(slot->info) + "'s backup may take its shard over; retry"));
  }
  if (!slot) {
    return ReplyError(peer, FailedPreconditionError(
                                  "the job is already complete and no " + RoleName(info.role()) +
                                  (info.requested_rank() >= 0 ? " of rank " + std::to_string(info.requested_rank()) : "") +
                                  " is dead: nothing to rejoin"));
  }
  by_identity_.erase(slot->identity);
  // Its predecessor, should it speak again (a paused process), is told it was replaced.
  replaced_[slot->identity] = NodeName(slot->info);
  const int rank = slot->info.rank();
  slot->info = info;
  slot->info.set_rank(rank);
  slot->identity = peer;
  slot->last_seen = now;
  slot->dead = false;
  slot->rejoins++;
  slot->ended_clock = -1;  // a restarted worker trains again
  slot->ended_joined = false;
  if (info.role() == wire::SERVER) {
    // A takeover runs in the process of the backup that took the rank over; anything else is a
    // process of its own. Its copies come once it is announced.
    copies_.Rejoined(ServerSlots(), static_cast<size_t>(slot - nodes_.data()), info.adopted());
  }
  by_identity_[peer] = static_cast<size_t>(slot - nodes_.data());
  *(info.role() == wire::SERVER ? table_.mutable_servers(rank) : table_.mutable_workers(rank)) = slot->info;
  GRADSYNC_LOG(WARNING) << "scheduler: " << who << " rejoins the job as " << NodeName(slot->info);
  WelcomeBack(peer, slot->info);
  if (info.role() == wire::SERVER) {
    // Workers reconnect as soon as they hear of it: not before its data socket accepts the job's
    // messages (it applies the table's limit, then says LISTENING).
    slot->listening = 0;
    slot->announce_when_listening = true;
    return;
  }
  AnnounceJoined(*slot);
}

Scheduler::Node* Scheduler::DeadSlotFor(const wire::NodeInfo& info) {
  for (auto& n : nodes_) {
    if (n.info.role() != info.role() || !n.dead || n.finished) continue;
    if (info.requested_rank() >= 0 && n.info.rank() != info.requested_rank()) continue;
    return &n;
  }
  return nullptr;
}

Scheduler::Node* Scheduler::LiveNode(wire::Role role, int rank) {
  for (auto& n : nodes_) {
    if (n.info.role() == role && n.info.rank() == rank && !n.dead && !n.finished) return &n;
  }
  return nullptr;
}

void Scheduler::WelcomeBack(const std::string& peer, const wire::NodeInfo& info) {
  ControlMessage reply = Control(wire::REGISTER_REPLY);
  reply.table = table_;
  reply.node = info;
  reply.rejoined = true;
  if (info.role() == wire::SERVER) reply.replica_key = replica_key_;
  Reply(peer, std::move(reply));
  // What it missed: the nodes that are dead now, and the live workers that ended training.
  for (const auto& n : nodes_) {
    if (!n.dead) continue;
    ControlMessage dead = Control(wire::NODE_DEAD);
    dead.node = n.info;
    Reply(peer, std::move(dead));
  }
  for (const auto& n : nodes_) {
    if (!n.dead && n.ended_clock >= 0) Reply(peer, TrainingEndedNews(n));
  }
}

ControlMessage Scheduler::TrainingEndedNews(const Node& n) const {
  ControlMessage h = Control(wire::TRAINING_ENDED);
  h.node = n.info;
  h.clock = n.ended_clock;
  h.joined = n.ended_joined;
  return h;
}

void Scheduler::HandleTrainingEnded(Node& n, const ControlMessage& c) {
  if (n.info.role() != wire::WORKER) return ReplyError(n.identity, InvalidArgumentError("only workers send TRAINING_ENDED"));
  if (!announced_) return ReplyError(n.identity, FailedPreconditionError("TRAINING_ENDED before the job is complete"));
  if (c.clock < 0) {
    return ReplyError(n.identity, InvalidArgumentError("TRAINING_ENDED with clock " + std::to_string(c.clock) +
                                                       " (the steps a worker pushed are >= 0)"));
  }
  n.ended_clock = c.clock;
  n.ended_joined = c.joined;
  GRADSYNC_LOG(INFO) << "scheduler: " << NodeName(n.info) << " ended training after " << n.ended_clock << " steps"
                     << (n.ended_joined ? " and leaves the consistency rule (join)" : "");
  TraceInstant(n.ended_joined ? "worker left (join)" : "worker ended training", "job",
               {{"rank", static_cast<double>(n.info.rank())}, {"clock", static_cast<double>(n.ended_clock)}});
  Broadcast(TrainingEndedNews(n));
  CheckBarriers();  // a joined worker is a member no more, or (the last to end) every worker again
}

void Scheduler::AddStandby(const std::string& peer, const ControlMessage& c, const std::string& who, const Node& taken,
                           double now) {
  Node n;
  n.info = c.node;
  n.info.set_standby(true);
  n.info.set_adopted(false);
  n.info.set_rank(options_.num_servers + table_.standbys_size());
  n.identity = peer;
  n.last_seen = now;
  copies_.NewStandby(nodes_.size());  // its copies come once it is announced
  by_identity_[peer] = nodes_.size();
  *table_.add_standbys() = n.info;
  GRADSYNC_LOG(WARNING) << "scheduler: " << who << " asked for " << NodeName(taken.info)
                        << "'s rank, whose shard its backup serves now: it stays as a standby, " << NodeName(n.info);
  WelcomeBack(peer, n.info);
  n.listening = 0;
  n.announce_when_listening = true;  // the primaries connect to it once it listens
  nodes_.push_back(std::move(n));
}

void Scheduler::AnnounceJoined(const Node& node) {
  TraceInstant(node.info.role() == wire::WORKER ? "worker rejoined" : "server rejoined", "failure",
               {{"rank", static_cast<double>(node.info.rank())}});
  ControlMessage joined = Control(wire::NODE_JOINED);
  joined.node = node.info;
  for (auto& n : nodes_)
    if (!n.dead && &n != &node) Reply(n.identity, joined);
}

void Scheduler::CheckHeartbeats(double now) {
  bool changed = false;
  for (auto& n : nodes_) {
    if (n.dead || n.finished || now - n.last_seen <= options_.heartbeat_timeout_s) continue;
    n.dead = true;
    n.dead_at = now;
    changed = true;
    if (n.info.role() == wire::SERVER) copies_.Died(static_cast<size_t>(&n - nodes_.data()));
    GRADSYNC_LOG(ERROR) << "scheduler: " << NodeName(n.info) << " sent nothing for "
                        << options_.heartbeat_timeout_s << " s: declared dead";
    TraceInstant(n.info.role() == wire::WORKER ? "worker declared dead" : "server declared dead", "failure",
                 {{"rank", static_cast<double>(n.info.rank())}});
    if (!announced_) continue;
    ControlMessage h = Control(wire::NODE_DEAD);
    h.node = n.info;
    Broadcast(h);
  }
  if (changed) {
    CheckBarriers();
    CheckMessageLimit();  // a dead server holds no worker back (they reconnect when it returns)
  }
  CheckShards(now);  // also a takeover that is late
}

std::vector<ServerSlot> Scheduler::ServerSlots() const {
  std::vector<ServerSlot> out;
  for (size_t i = 0; i < nodes_.size(); ++i) {
    const Node& n = nodes_[i];
    if (n.info.role() == wire::SERVER) out.push_back({i, n.info.rank(), n.info.standby(), n.dead, NodeName(n.info)});
  }
  return out;
}

void Scheduler::CheckShards(double now) {
  if (!announced_ || !lost_.ok()) return;
  const std::vector<ServerSlot> servers = ServerSlots();
  std::string lost, why;
  for (int s = 0; s < options_.num_servers; ++s) {
    const auto primary =
        std::find_if(servers.begin(), servers.end(), [&](const ServerSlot& x) { return !x.standby && x.rank == s; });
    if (primary == servers.end() || !primary->dead) {
      awaiting_restart_.erase(s);
      copies_.Served(s);
      continue;
    }
    const std::optional<std::string> no_copy = copies_.NoLiveCopy(servers, s, now);
    if (!no_copy) continue;  // its takeover is due
    const std::string& dead = *no_copy;
    const wire::NodeInfo& primary_info = nodes_[primary->slot].info;
    if (primary_info.checkpoints()) {
      if (awaiting_restart_.insert(s).second) {
        GRADSYNC_LOG(WARNING) << "scheduler: shard " << s << " has no live copy (" << dead
                              << "); it comes back only when " << NodeName(primary_info)
                              << " is restarted with its --checkpoint-dir (the workers wait --recovery-timeout for it)";
      }
      continue;
    }
    lost += (lost.empty() ? "" : ", ") + std::to_string(s);
    why += (why.empty() ? "" : "; ") + dead;
  }
  if (lost.empty()) return;
  const bool one = lost.find(',') == std::string::npos;
  lost_ = DataLossError((one ? "shard " : "shards ") + lost + (one ? " is" : " are") + " lost: " + why +
                        ", and no checkpoint (--checkpoint-dir) can restore " + (one ? "it" : "them"));
  GRADSYNC_LOG(ERROR) << "scheduler: " << lost_.message() << "; stopping the job";
  TraceInstant("shard lost", "failure");
}

}  // namespace gradsync
