#include "server/scheduler/scheduler.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <thread>

#include "common/base/clock.h"
#include "common/base/logging.h"
#include "common/config/train_config.h"
#include "common/net/control/node.h"
#include "common/net/control/scheduler_client.h"
#include "common/obs/trace.h"
#include "common/ps/consistency.h"
#include "common/ps/ps_protocol.h"
#include "server/replication/replication.h"

namespace gradsync {
namespace {
double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The answer to a heartbeat: the node's stamp echoed, with this clock beside it.
ControlMessage HeartbeatAnswer(const ControlMessage& beat) {
  ControlMessage ack = Control(wire::HEARTBEAT);
  if (beat.sent_clock_us > 0) {
    ack.sent_clock_us = beat.sent_clock_us;
    ack.scheduler_clock_us = SteadyMicros();
  }
  return ack;
}
}  // namespace

Result<std::unique_ptr<Scheduler>> Scheduler::Create(TransportContext& ctx, const SchedulerOptions& options) {
  if (options.num_servers < 0 || options.num_workers < 1) {
    return InvalidArgumentError("a job needs >= 1 worker and >= 0 servers");
  }
  ASSIGN_OR_RETURN(Socket s, Socket::BindRouter(ctx, options.bind_host, options.port));
  auto sched = std::unique_ptr<Scheduler>(new Scheduler(options, std::move(s)));
  if (options.replicas < 1 || (options.num_servers > 0 && options.replicas > options.num_servers)) {
    return InvalidArgumentError("--replicas must be between 1 and --num-servers (" +
                                std::to_string(options.num_servers) + ")");
  }
  // This run's identity: two checkpoint directories of the same settings still tell runs apart.
  std::random_device rd;
  char id[17];
  std::snprintf(id, sizeof id, "%08x%08x", rd(), rd());
  sched->job_id_ = id;
  for (int i = 0; i < 4; ++i) {
    const uint32_t v = rd();
    sched->replica_key_.append(reinterpret_cast<const char*>(&v), sizeof v);
  }
  sched->mode_ = options.mode;
  sched->staleness_ = options.staleness;
  if (!options.mode.empty()) sched->mode_source_ = "the scheduler's --mode";
  return sched;
}

void Scheduler::Reply(const std::string& peer, ControlMessage c) {
  c.sender_role = wire::SCHEDULER;
  Status s = socket_.Send(peer, EncodeControl(c));
  if (!s.ok()) GRADSYNC_LOG(DEBUG) << "scheduler: reply failed: " << s;
}

void Scheduler::ReplyError(const std::string& peer, const Status& s) {
  ControlMessage c = Control(wire::ERROR);
  c.status = s;
  Reply(peer, std::move(c));
}

void Scheduler::Broadcast(const ControlMessage& c) {
  for (auto& n : nodes_)
    if (!n.dead) Reply(n.identity, c);
}

std::vector<Scheduler::Node*> Scheduler::Members(const std::string& group) {
  // While some worker still trains, a worker that joined (left the consistency rule) takes no
  // part in the workers' barriers and gathers: those the others train through go on without it.
  // It may still arrive at one (its end of training), and is released with the members. Once
  // no worker trains, every worker is a member again.
  bool training = false;
  for (const auto& n : nodes_) {
    training = training || (n.info.role() == wire::WORKER && !n.dead && !n.finished && n.ended_clock < 0);
  }
  std::vector<Node*> out;
  for (auto& n : nodes_) {
    if (n.dead || n.finished) continue;
    if (training && group != "servers" && n.info.role() == wire::WORKER && n.ended_joined) continue;
    if (group == "workers" && n.info.role() != wire::WORKER) continue;
    if (group == "servers" && n.info.role() != wire::SERVER) continue;
    out.push_back(&n);
  }
  return out;
}

void Scheduler::HandleRegister(const std::string& peer, const ControlMessage& h, double now) {
  const auto& info = h.node;
  if (info.role() != wire::SERVER && info.role() != wire::WORKER) {
    return ReplyError(peer, InvalidArgumentError("only servers and workers register"));
  }
  if (by_identity_.count(peer)) return;  // a duplicate (resend): the reply comes with the table
  const std::string who = RoleName(info.role()) + " at " + info.host() + (info.port() ? ":" + std::to_string(info.port()) : "");
  if (announced_) return HandleRejoin(peer, h, who, now);
  // A staleness of -1 (a worker started without --staleness) takes the job's bound.
  const std::string& ssp = ModeName(config::SSP);
  if (mode_.empty()) {
    mode_ = h.mode;
    staleness_ = h.staleness;
    mode_source_ = who;
  } else if (h.mode != mode_ || (mode_ == ssp && staleness_ >= 0 && h.staleness >= 0 && h.staleness != staleness_)) {
    std::string mine = mode_ == ssp ? "ssp with staleness " + std::to_string(staleness_) : mode_;
    std::string theirs = h.mode == ssp ? "ssp with staleness " + std::to_string(h.staleness) : h.mode;
    GRADSYNC_LOG(ERROR) << "refused " << who << ": it runs " << theirs << " but the job runs " << mine;
    return ReplyError(peer, InvalidArgumentError("mode mismatch: this job runs " + mine + " (set by " +
                                                   mode_source_ + "), this " + RoleName(info.role()) +
                                                   " asked for " + theirs));
  }
  if (mode_ == ssp && staleness_ < 0) staleness_ = h.staleness;
  if (info.role() == wire::WORKER) {
    if (fingerprint_source_.empty()) {
      fingerprint_ = h.job_fingerprint;
      fingerprint_source_ = who;
    } else if (h.job_fingerprint != fingerprint_) {
      const FingerprintDifference d = DescribeFingerprintDifference(h.job_fingerprint, fingerprint_);
      return ReplyError(peer, InvalidArgumentError("settings differ between workers: " + who + " has [" + d.mine +
                                                     "] but " + fingerprint_source_ + " has [" + d.theirs + "]"));
    }
  }
  int have = 0;
  for (const auto& n : nodes_) have += n.info.role() == info.role();
  const int want = info.role() == wire::SERVER ? options_.num_servers : options_.num_workers;
  if (have >= want) {
    return ReplyError(peer, FailedPreconditionError("the job already has " + std::to_string(want) + " " +
                                                      RoleName(info.role()) + "s"));
  }
  if (info.requested_rank() >= want) {
    return ReplyError(peer, InvalidArgumentError("rank " + std::to_string(info.requested_rank()) + " >= the " +
                                                   std::to_string(want) + " " + RoleName(info.role()) + "s of the job"));
  }
  Node n;
  n.info = info;
  n.info.set_rank(-1);
  n.identity = peer;
  n.last_seen = now;
  by_identity_[peer] = nodes_.size();
  nodes_.push_back(std::move(n));
  GRADSYNC_LOG(INFO) << "scheduler: registered " << who;
  int servers = 0, workers = 0;
  for (const auto& x : nodes_) (x.info.role() == wire::SERVER ? servers : workers)++;
  if (servers == options_.num_servers && workers == options_.num_workers) AssignRanksAndAnnounce();
}

void Scheduler::HandleMessageLimit(Node& n, const ControlMessage& c) {
  const uint64_t want = c.max_message_bytes;
  auto answer = [&](const Status& s) {
    ControlMessage r = Control(wire::MESSAGE_LIMIT);
    r.status = s;
    Reply(n.identity, std::move(r));
  };
  if (n.info.role() != wire::WORKER) return ReplyError(n.identity, InvalidArgumentError("only workers send MESSAGE_LIMIT"));
  if (!announced_) return answer(FailedPreconditionError("MESSAGE_LIMIT before the job is complete"));
  if (want == 0 || want > static_cast<uint64_t>(kMaxJobMessageBytes)) {
    return answer(InvalidArgumentError("a largest message of " + std::to_string(want) + " bytes is not sane (at most " +
                                       std::to_string(kMaxJobMessageBytes) + ")"));
  }
  if (table_.max_message_bytes() == 0) {
    table_.set_max_message_bytes(want);
    GRADSYNC_LOG(INFO) << "scheduler: the shards accept messages of up to " << want << " bytes (" << NodeName(n.info)
                       << "'s model)";
    ControlMessage limit = Control(wire::SHARD_LIMIT);
    limit.max_message_bytes = want;
    for (const auto& s : nodes_)
      if (!s.dead && s.info.role() == wire::SERVER) Reply(s.identity, limit);
  } else if (want > table_.max_message_bytes()) {
    return answer(FailedPreconditionError(NodeName(n.info) + "'s largest message to a shard is " + std::to_string(want) +
                                          " bytes but the job's shards accept " +
                                          std::to_string(table_.max_message_bytes()) +
                                          " (set by the first worker): does its model differ?"));
  }
  limit_waiters_.insert(n.identity);
  CheckMessageLimit();
}

void Scheduler::HandleListening(Node& n, const ControlMessage& c) {
  if (n.info.role() != wire::SERVER) return ReplyError(n.identity, InvalidArgumentError("only servers send LISTENING"));
  n.listening = std::max(n.listening, static_cast<int64_t>(c.max_message_bytes));
  if (n.announce_when_listening && n.listening >= static_cast<int64_t>(table_.max_message_bytes())) {
    n.announce_when_listening = false;
    copies_.Announced(ServerSlots(), static_cast<size_t>(&n - nodes_.data()));  // the snapshots it gets and gives
    AnnounceJoined(n);
  }
  CheckMessageLimit();
}

void Scheduler::CheckMessageLimit() {
  const auto limit = static_cast<int64_t>(table_.max_message_bytes());
  if (limit_waiters_.empty() || limit == 0) return;
  for (const auto& n : nodes_)
    if (n.info.role() == wire::SERVER && !n.dead && n.listening < limit) return;
  ControlMessage ok = Control(wire::MESSAGE_LIMIT);
  ok.max_message_bytes = static_cast<uint64_t>(limit);
  for (const auto& id : limit_waiters_) Reply(id, ok);
  limit_waiters_.clear();
}

void Scheduler::AssignRanksAndAnnounce() {
  for (wire::Role role : {wire::SERVER, wire::WORKER}) {
    std::vector<Node*> group;
    for (auto& n : nodes_)
      if (n.info.role() == role) group.push_back(&n);
    const int count = static_cast<int>(group.size());
    std::vector<bool> taken(static_cast<size_t>(count), false);
    // Requested ranks first (a clash keeps the first and re-ranks the other), the rest by address.
    std::sort(group.begin(), group.end(), [](const Node* a, const Node* b) {
      return std::make_tuple(a->info.host(), a->info.port(), a->identity) <
             std::make_tuple(b->info.host(), b->info.port(), b->identity);
    });
    for (Node* n : group) {
      int r = n->info.requested_rank();
      if (r >= 0 && r < count && !taken[r]) {
        n->info.set_rank(r);
        taken[r] = true;
      }
    }
    int next = 0;
    for (Node* n : group) {
      if (n->info.rank() >= 0) continue;
      while (taken[next]) ++next;
      n->info.set_rank(next);
      taken[next] = true;
    }
  }
  table_.Clear();
  table_.set_mode(mode_);
  table_.set_staleness(std::max(0, staleness_));
  table_.set_job_id(job_id_);
  table_.set_job_fingerprint(fingerprint_);
  table_.set_replicas(options_.replicas);
  table_.mutable_servers()->Reserve(options_.num_servers);
  for (int i = 0; i < options_.num_servers; ++i) table_.add_servers();
  for (int i = 0; i < options_.num_workers; ++i) table_.add_workers();
  for (const auto& n : nodes_) {
    auto* slot = n.info.role() == wire::SERVER ? table_.mutable_servers(n.info.rank())
                                               : table_.mutable_workers(n.info.rank());
    *slot = n.info;
  }
  copies_.Start(ServerSlots());
  announced_ = true;
  for (const auto& n : nodes_) {
    ControlMessage h = Control(wire::REGISTER_REPLY);
    h.table = table_;
    h.node = n.info;
    if (n.info.role() == wire::SERVER) h.replica_key = replica_key_;
    Reply(n.identity, std::move(h));
  }
  GRADSYNC_LOG(INFO) << "scheduler: job complete (" << options_.num_servers << " servers, "
                     << options_.num_workers << " workers, mode " << mode_ << "); ranks assigned";
  TraceInstant("every node registered", "job", {{"servers", static_cast<double>(options_.num_servers)},
                                                {"workers", static_cast<double>(options_.num_workers)}});
}

const Scheduler::Node* Scheduler::EndedAbsent(const std::vector<Node*>& members, const std::string& barrier) const {
  if (barrier == kTrainedBarrier) return nullptr;  // the one barrier a worker that ended still comes to
  const auto& arrived = barrier_arrivals_.at(barrier);
  // Only a worker that still trains can be at a barrier of training; one that ended without
  // joining is past all of them (at its end, or gone), so it never comes to this one.
  bool trainer_waits = false;
  for (const Node* n : members) {
    trainer_waits = trainer_waits || (arrived.count(n->identity) && n->info.role() == wire::WORKER && n->ended_clock < 0);
  }
  if (!trainer_waits) return nullptr;
  for (const Node* n : members) {
    if (n->info.role() == wire::WORKER && n->ended_clock >= 0 && !n->ended_joined && !arrived.count(n->identity)) return n;
  }
  return nullptr;
}

void Scheduler::CheckBarriers() {
  for (auto it = barrier_arrivals_.begin(); it != barrier_arrivals_.end();) {
    const auto members = Members(barrier_group_[it->first]);
    // No member left (every worker joined): those that arrived are all there is.
    bool all = !members.empty() || !it->second.empty();
    for (const Node* n : members) all = all && it->second.count(n->identity);
    if (!all) {
      if (const Node* gone = EndedAbsent(members, it->first); gone != nullptr) {
        // A worker that ended training (without join) will never come to a barrier that workers
        // still training wait at. Those waiting here fail now, told why.
        const Status why = FailedPreconditionError(
            "barrier '" + it->first + "' waits for " + NodeName(gone->info) + ", which ended training after " +
            std::to_string(gone->ended_clock) + " steps while this worker still trains: " + UnevenStepsAdvice());
        GRADSYNC_LOG(WARNING) << "scheduler: " << why.message();
        ControlMessage failed = Control(wire::BARRIER_RELEASE);
        failed.barrier = it->first;
        failed.status = why;
        for (const auto& id : it->second) Reply(id, failed);
        barrier_data_.erase(it->first);
        barrier_group_.erase(it->first);
        it = barrier_arrivals_.erase(it);
        continue;
      }
      ++it;
      continue;
    }
    ControlMessage h = Control(wire::BARRIER_RELEASE);
    h.barrier = it->first;
    // A gather: entry r is the data of the member of rank r (empty: none, or no such member).
    if (auto d = barrier_data_.find(it->first); d != barrier_data_.end()) {
      for (const Node* n : members) {
        auto mine = d->second.find(n->identity);
        if (mine == d->second.end() || n->info.rank() < 0) continue;
        if (h.gathered.size() <= static_cast<size_t>(n->info.rank())) h.gathered.resize(static_cast<size_t>(n->info.rank()) + 1);
        h.gathered[static_cast<size_t>(n->info.rank())] = mine->second;
      }
      barrier_data_.erase(d);
    }
    for (const auto& id : it->second) Reply(id, h);
    TraceInstant("barrier released", "job", {{"members", static_cast<double>(members.size())}});
    barrier_group_.erase(it->first);
    it = barrier_arrivals_.erase(it);
  }
}

void Scheduler::Handle(Message& m, double now) {
  auto it = by_identity_.find(m.peer);
  if (!m.malformed.ok()) {
    GRADSYNC_LOG(WARNING) << "scheduler: dropped a malformed message: " << m.malformed.message();
    if (it != by_identity_.end()) nodes_[it->second].last_seen = now;
    return;
  }
  auto decoded = DecodeControl(m.header);
  const ControlMessage c = decoded.ok() ? std::move(decoded).value() : ControlMessage{};
  if (c.type == wire::REGISTER) return HandleRegister(m.peer, c, now);
  if (it == by_identity_.end()) {
    if (auto r = replaced_.find(m.peer); r != replaced_.end()) {
      return ReplyError(m.peer, AbortedError(r->second + " was declared dead and its rank has been taken by another process"));
    }
    if (c.type == wire::HEARTBEAT) return Reply(m.peer, HeartbeatAnswer(c));  // a node whose REGISTER is still in flight
    return ReplyError(m.peer, FailedPreconditionError("not registered"));
  }
  Node& n = nodes_[it->second];
  n.last_seen = now;
  if (n.dead) {
    // Declared dead already (it was silent too long: stopped, or cut off). It may not come back
    // under this connection: told so, it stops; a restarted process can rejoin (HandleRejoin).
    return ReplyError(m.peer, AbortedError(NodeName(n.info) + " was declared dead after " +
                                           SecondsText(options_.heartbeat_timeout_s) +
                                           " s of silence; restart it to rejoin the job"));
  }
  switch (c.type) {
    case wire::HEARTBEAT:
      Reply(m.peer, HeartbeatAnswer(c));
      break;
    case wire::BARRIER:
      HandleBarrier(m.peer, c);
      break;
    case wire::FINISHED:
      HandleFinished(n, c);
      break;
    case wire::MESSAGE_LIMIT:
      HandleMessageLimit(n, c);
      break;
    case wire::LISTENING:
      HandleListening(n, c);
      break;
    case wire::TRAINING_ENDED:
      HandleTrainingEnded(n, c);
      break;
    default:
      ReplyError(m.peer, InvalidArgumentError("the scheduler does not handle message type " +
                                              std::to_string(TagOf(m.header).type)));
  }
}

void Scheduler::HandleBarrier(const std::string& peer, const ControlMessage& c) {
  if (c.barrier_data.size() > kMaxGatherBytes) {
    return ReplyError(peer, InvalidArgumentError("barrier '" + c.barrier + "': " +
                                                   std::to_string(c.barrier_data.size()) +
                                                   " bytes of gather data, at most " + std::to_string(kMaxGatherBytes)));
  }
  if (!c.barrier_data.empty()) {
    // The release carries every member's data: it must fit what nodes accept from here.
    auto& data = barrier_data_[c.barrier];
    size_t total = c.barrier_data.size();
    for (const auto& [id, d] : data) total += id == peer ? 0 : d.size();
    if (total + (64 << 10) > static_cast<size_t>(kMaxSchedulerReplyBytes)) {
      if (data.empty()) barrier_data_.erase(c.barrier);
      return ReplyError(peer, InvalidArgumentError("barrier '" + c.barrier + "': " + std::to_string(total) +
                                                     " bytes of gather data in all, at most " +
                                                     std::to_string(kMaxSchedulerReplyBytes - (64 << 10))));
    }
    data[peer] = c.barrier_data;
  }
  barrier_arrivals_[c.barrier].insert(peer);
  barrier_group_[c.barrier] = c.group;
  CheckBarriers();
}

void Scheduler::HandleFinished(Node& n, const ControlMessage& c) {
  n.finished = true;
  n.result = c.status;
  GRADSYNC_LOG(INFO) << "scheduler: " << NodeName(n.info) << " finished" << (n.result.ok() ? "" : ": " + n.result.ToString());
  TraceInstant(n.result.ok() ? "worker finished" : "worker failed", "job", {{"rank", static_cast<double>(n.info.rank())}});
  if (!n.result.ok()) {
    // A worker that stopped on an error pushes no more: the others must not wait for it.
    ControlMessage dead = Control(wire::NODE_DEAD);
    dead.node = n.info;
    Broadcast(dead);
  }
  CheckBarriers();
}

bool Scheduler::JobOver() const {
  if (!announced_) return false;
  for (const auto& n : nodes_)
    if (n.info.role() == wire::WORKER && !n.dead && !n.finished) return false;
  return true;
}

Status Scheduler::Run() {
  const double start = NowSeconds();
  // A turn takes at most 50 ms and its handling; a much longer gap is the scheduler's own pause.
  PauseDetector pause(kPausedS);
  while (!stop_.load()) {
    auto m = socket_.Recv(50);
    double now = NowSeconds();
    if (const double paused = pause.Turn(); paused > 0) {
      GRADSYNC_LOG(WARNING) << "scheduler: this process was paused for " << paused
                            << " s; the nodes' silence over it does not count toward their heartbeat timeout";
      for (auto& n : nodes_) n.last_seen += paused;
    }
    if (m.ok()) Handle(*m, now);
    // Everything that waits is heard before anyone is judged (after a pause, many heartbeats).
    for (int k = 0; k < kDrainPerTurn; ++k) {
      auto more = socket_.Recv(0);
      if (!more.ok()) break;
      now = NowSeconds();
      Handle(*more, now);
    }
    now = NowSeconds();
    CheckHeartbeats(now);
    if (JobOver() || !lost_.ok()) break;
    if (!announced_ && now - start > options_.register_timeout_s) {
      Broadcast(Control(wire::SHUTDOWN));
      return DeadlineExceededError("the job did not fill up within " + SecondsText(options_.register_timeout_s) +
                                   " s: " + std::to_string(nodes_.size()) + " of " +
                                   std::to_string(options_.num_servers + options_.num_workers) + " nodes registered");
    }
  }
  ControlMessage shutdown = Control(wire::SHUTDOWN);
  shutdown.status = lost_;
  Broadcast(shutdown);
  // Give the SHUTDOWN frames a moment to leave before the socket closes (linger is 0).
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  // The job succeeded when some worker finished training and none failed: the workers that
  // died went on without (elastic membership); they are named. A dead server's shard is lost
  // unless it came back, so a dead server fails the job (its workers report it too).
  std::string failed, died;
  int finished_ok = 0;
  for (const auto& n : nodes_) {
    if (n.dead) {
      // A dead standby held only copies: the job goes on without it.
      (n.info.role() == wire::WORKER || n.info.standby() ? died : failed) += " " + NodeName(n.info) + " died;";
    } else if (n.info.role() == wire::WORKER) {
      if (n.result.ok()) ++finished_ok;
      else failed += " " + NodeName(n.info) + ": " + n.result.message() + ";";
    }
  }
  if (!lost_.ok()) return lost_;
  if (stop_.load() && !JobOver()) return AbortedError("scheduler stopped before the job ended");
  if (!failed.empty() || finished_ok == 0) return AbortedError("job failed:" + failed + died);
  if (!died.empty()) {
    GRADSYNC_LOG(WARNING) << "scheduler: job over; " << finished_ok << " of " << options_.num_workers
                          << " workers finished, the others went missing:" << died;
  } else {
    GRADSYNC_LOG(INFO) << "scheduler: every worker finished; job over";
  }
  return OkStatus();
}

}  // namespace gradsync
