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
  if (Status terms = terms_.AdmitAgain(h); !terms.ok()) return replies_.Error(peer, terms);
  // A restarted node takes the rank of a dead one of its role: the one it asks for, else the first.
  Node* slot = roster_.DeadSlotFor(info);
  if (!slot && info.requested_rank() >= 0) {
    if (Node* alive = roster_.LiveNode(info.role(), info.requested_rank())) {
      if (alive->info.adopted()) {
        // A backup took the shard over while this server was gone: it serves it now. The
        // server comes back as a standby backup (it catches up from the primaries' snapshots).
        if (options_.replicas > 1) return AddStandby(peer, h, who, *alive, now);
        return replies_.Error(peer, FailedPreconditionError(
                                      NodeName(alive->info) + "'s shard was taken over by its backup at " +
                                      alive->info.host() + ":" + std::to_string(alive->info.port()) + "; nothing to rejoin"));
      }
      // Its predecessor has not been declared dead yet (a quick restart): it asks again.
      return replies_.Error(peer, UnavailableError(NodeName(alive->info) + " is still alive; retry once it is declared dead"));
    }
  }
  if (slot && info.role() == wire::SERVER && options_.replicas > 1 && !info.adopted() &&
      now - slot->dead_at < options_.heartbeat_timeout_s) {
    // Its backup holds every acknowledged push and is about to take the rank over; a restarted
    // server would restore an older checkpoint. It asks again, and is a standby once the backup
    // has taken over (or takes the rank itself if no backup did).
    return replies_.Error(peer, UnavailableError(NodeName(slot->info) + "'s backup may take its shard over; retry"));
  }
  if (!slot) {
    return replies_.Error(peer, FailedPreconditionError(
                                  "the job is already complete and no " + RoleName(info.role()) +
                                  (info.requested_rank() >= 0 ? " of rank " + std::to_string(info.requested_rank()) : "") +
                                  " is dead: nothing to rejoin"));
  }
  // Its predecessor, should it speak again (a paused process), is told it was replaced.
  roster_.Rebind(*slot, peer);
  const int rank = slot->info.rank();
  slot->info = info;
  slot->info.set_rank(rank);
  slot->last_seen = now;
  slot->dead = false;
  slot->rejoins++;
  slot->ended_clock = -1;  // a restarted worker trains again
  slot->ended_joined = false;
  if (info.role() == wire::SERVER) {
    // A takeover runs in the process of the backup that took the rank over; anything else is a
    // process of its own. Its copies come once it is announced.
    copies_.Rejoined(roster_.ServerSlots(), roster_.SlotOf(*slot), info.adopted());
  }
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

void Scheduler::WelcomeBack(const std::string& peer, const wire::NodeInfo& info) {
  ControlMessage reply = Control(wire::REGISTER_REPLY);
  reply.job.table = table_;
  reply.node = info;
  reply.job.rejoined = true;
  if (info.role() == wire::SERVER) reply.job.replica_key = terms_.replica_key();
  replies_.Reply(peer, std::move(reply));
  // What it missed: the nodes that are dead now, and the live workers that ended training.
  for (const auto& n : roster_.nodes()) {
    if (!n.dead) continue;
    ControlMessage dead = Control(wire::NODE_DEAD);
    dead.node = n.info;
    replies_.Reply(peer, std::move(dead));
  }
  for (const auto& n : roster_.nodes()) {
    if (!n.dead && n.ended_clock >= 0) replies_.Reply(peer, TrainingEndedNews(n));
  }
}

ControlMessage Scheduler::TrainingEndedNews(const Node& n) const {
  ControlMessage h = Control(wire::TRAINING_ENDED);
  h.node = n.info;
  h.ended.clock = n.ended_clock;
  h.ended.joined = n.ended_joined;
  return h;
}

void Scheduler::HandleTrainingEnded(Node& n, const ControlMessage& c) {
  if (n.info.role() != wire::WORKER) return replies_.Error(n.identity, InvalidArgumentError("only workers send TRAINING_ENDED"));
  if (!announced_) return replies_.Error(n.identity, FailedPreconditionError("TRAINING_ENDED before the job is complete"));
  if (c.ended.clock < 0) {
    return replies_.Error(n.identity, InvalidArgumentError("TRAINING_ENDED with clock " + std::to_string(c.ended.clock) +
                                                       " (the steps a worker pushed are >= 0)"));
  }
  n.ended_clock = c.ended.clock;
  n.ended_joined = c.ended.joined;
  GRADSYNC_LOG(INFO) << "scheduler: " << NodeName(n.info) << " ended training after " << n.ended_clock << " steps"
                     << (n.ended_joined ? " and leaves the consistency rule (join)" : "");
  TraceInstant(n.ended_joined ? "worker left (join)" : "worker ended training", "job",
               {{"rank", static_cast<double>(n.info.rank())}, {"clock", static_cast<double>(n.ended_clock)}});
  Broadcast(TrainingEndedNews(n));
  barriers_.Check();  // a joined worker is a member no more, or (the last to end) every worker again
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
  copies_.NewStandby(roster_.nodes().size());  // its copies come once it is announced
  *table_.add_standbys() = n.info;
  GRADSYNC_LOG(WARNING) << "scheduler: " << who << " asked for " << NodeName(taken.info)
                        << "'s rank, whose shard its backup serves now: it stays as a standby, " << NodeName(n.info);
  WelcomeBack(peer, n.info);
  n.listening = 0;
  n.announce_when_listening = true;  // the primaries connect to it once it listens
  roster_.Add(std::move(n));
}

void Scheduler::AnnounceJoined(const Node& node) {
  TraceInstant(node.info.role() == wire::WORKER ? "worker rejoined" : "server rejoined", "failure",
               {{"rank", static_cast<double>(node.info.rank())}});
  ControlMessage joined = Control(wire::NODE_JOINED);
  joined.node = node.info;
  for (auto& n : roster_.nodes())
    if (!n.dead && &n != &node) replies_.Reply(n.identity, joined);
}

void Scheduler::CheckHeartbeats(double now) {
  bool changed = false;
  for (auto& n : roster_.nodes()) {
    if (n.dead || n.finished || now - n.last_seen <= options_.heartbeat_timeout_s) continue;
    n.dead = true;
    n.dead_at = now;
    changed = true;
    if (n.info.role() == wire::SERVER) copies_.Died(roster_.SlotOf(n));
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
    barriers_.Check();
    CheckMessageLimit();  // a dead server holds no worker back (they reconnect when it returns)
  }
  CheckShards(now);  // also a takeover that is late
}

void Scheduler::CheckShards(double now) {
  if (!announced_ || !lost_.ok()) return;
  const std::vector<ServerSlot> servers = roster_.ServerSlots();
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
    const wire::NodeInfo& primary_info = roster_.nodes()[primary->slot].info;
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
