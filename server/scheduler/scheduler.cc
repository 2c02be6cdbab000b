#include "server/scheduler/scheduler.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <thread>

#include "common/base/clock.h"
#include "common/base/logging.h"
#include "common/config/train_config.h"
#include "common/net/control/client/scheduler_client.h"
#include "common/net/control/node.h"
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
  if (beat.probe.sent_us > 0) {
    ack.probe.sent_us = beat.probe.sent_us;
    ack.probe.scheduler_us = SteadyMicros();
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
  return sched;
}

void Scheduler::Broadcast(const ControlMessage& c) {
  for (auto& n : roster_.nodes())
    if (!n.dead) replies_.Reply(n.identity, c);
}

void Scheduler::HandleRegister(const std::string& peer, const ControlMessage& h, double now) {
  const auto& info = h.node;
  if (info.role() != wire::SERVER && info.role() != wire::WORKER) {
    return replies_.Error(peer, InvalidArgumentError("only servers and workers register"));
  }
  if (roster_.Find(peer)) return;  // a duplicate (resend): the reply comes with the table
  const std::string who = RoleName(info.role()) + " at " + info.host() + (info.port() ? ":" + std::to_string(info.port()) : "");
  if (announced_) return HandleRejoin(peer, h, who, now);
  if (Status terms = terms_.Admit(who, h); !terms.ok()) return replies_.Error(peer, terms);
  int have = 0;
  for (const auto& n : roster_.nodes()) have += n.info.role() == info.role();
  const int want = info.role() == wire::SERVER ? options_.num_servers : options_.num_workers;
  if (have >= want) {
    return replies_.Error(peer, FailedPreconditionError("the job already has " + std::to_string(want) + " " +
                                                      RoleName(info.role()) + "s"));
  }
  if (info.requested_rank() >= want) {
    return replies_.Error(peer, InvalidArgumentError("rank " + std::to_string(info.requested_rank()) + " >= the " +
                                                   std::to_string(want) + " " + RoleName(info.role()) + "s of the job"));
  }
  Node n;
  n.info = info;
  n.info.set_rank(-1);
  n.identity = peer;
  n.last_seen = now;
  roster_.Add(std::move(n));
  GRADSYNC_LOG(INFO) << "scheduler: registered " << who;
  int servers = 0, workers = 0;
  for (const auto& x : roster_.nodes()) (x.info.role() == wire::SERVER ? servers : workers)++;
  if (servers == options_.num_servers && workers == options_.num_workers) AssignRanksAndAnnounce();
}

void Scheduler::HandleMessageLimit(Node& n, const ControlMessage& c) {
  const uint64_t want = c.max_message_bytes;
  auto answer = [&](const Status& s) {
    ControlMessage r = Control(wire::MESSAGE_LIMIT);
    r.status = s;
    replies_.Reply(n.identity, std::move(r));
  };
  if (n.info.role() != wire::WORKER) return replies_.Error(n.identity, InvalidArgumentError("only workers send MESSAGE_LIMIT"));
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
    for (const auto& s : roster_.nodes())
      if (!s.dead && s.info.role() == wire::SERVER) replies_.Reply(s.identity, limit);
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
  if (n.info.role() != wire::SERVER) return replies_.Error(n.identity, InvalidArgumentError("only servers send LISTENING"));
  n.listening = std::max(n.listening, static_cast<int64_t>(c.max_message_bytes));
  if (n.announce_when_listening && n.listening >= static_cast<int64_t>(table_.max_message_bytes())) {
    n.announce_when_listening = false;
    copies_.Announced(roster_.ServerSlots(), roster_.SlotOf(n));  // the snapshots it gets and gives
    AnnounceJoined(n);
  }
  CheckMessageLimit();
}

void Scheduler::CheckMessageLimit() {
  const auto limit = static_cast<int64_t>(table_.max_message_bytes());
  if (limit_waiters_.empty() || limit == 0) return;
  for (const auto& n : roster_.nodes())
    if (n.info.role() == wire::SERVER && !n.dead && n.listening < limit) return;
  ControlMessage ok = Control(wire::MESSAGE_LIMIT);
  ok.max_message_bytes = static_cast<uint64_t>(limit);
  for (const auto& id : limit_waiters_) replies_.Reply(id, ok);
  limit_waiters_.clear();
}

void Scheduler::AssignRanksAndAnnounce() {
  for (wire::Role role : {wire::SERVER, wire::WORKER}) {
    std::vector<Node*> group;
    for (auto& n : roster_.nodes())
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
  terms_.Fill(table_);
  table_.set_replicas(options_.replicas);
  table_.mutable_servers()->Reserve(options_.num_servers);
  for (int i = 0; i < options_.num_servers; ++i) table_.add_servers();
  for (int i = 0; i < options_.num_workers; ++i) table_.add_workers();
  for (const auto& n : roster_.nodes()) {
    auto* slot = n.info.role() == wire::SERVER ? table_.mutable_servers(n.info.rank())
                                               : table_.mutable_workers(n.info.rank());
    *slot = n.info;
  }
  copies_.Start(roster_.ServerSlots());
  announced_ = true;
  for (const auto& n : roster_.nodes()) {
    ControlMessage h = Control(wire::REGISTER_REPLY);
    h.job.table = table_;
    h.node = n.info;
    if (n.info.role() == wire::SERVER) h.job.replica_key = terms_.replica_key();
    replies_.Reply(n.identity, std::move(h));
  }
  GRADSYNC_LOG(INFO) << "scheduler: job complete (" << options_.num_servers << " servers, "
                     << options_.num_workers << " workers, mode " << terms_.mode() << "); ranks assigned";
  TraceInstant("every node registered", "job", {{"servers", static_cast<double>(options_.num_servers)},
                                                {"workers", static_cast<double>(options_.num_workers)}});
}

void Scheduler::Handle(Message& m, double now) {
  Node* found = roster_.Find(m.peer);
  if (!m.malformed.ok()) {
    GRADSYNC_LOG(WARNING) << "scheduler: dropped a malformed message: " << m.malformed.message();
    if (found != nullptr) found->last_seen = now;
    return;
  }
  auto decoded = DecodeControl(m.header);
  const ControlMessage c = decoded.ok() ? std::move(decoded).value() : ControlMessage{};
  if (c.type == wire::REGISTER) return HandleRegister(m.peer, c, now);
  if (found == nullptr) {
    if (const std::string* replaced = roster_.Replaced(m.peer)) {
      return replies_.Error(m.peer,
                            AbortedError(*replaced + " was declared dead and its rank has been taken by another process"));
    }
    if (c.type == wire::HEARTBEAT) return replies_.Reply(m.peer, HeartbeatAnswer(c));  // a node whose REGISTER is still in flight
    return replies_.Error(m.peer, FailedPreconditionError("not registered"));
  }
  Node& n = *found;
  n.last_seen = now;
  if (n.dead) {
    // Declared dead already (it was silent too long: stopped, or cut off). It may not come back
    // under this connection: told so, it stops; a restarted process can rejoin (HandleRejoin).
    return replies_.Error(m.peer, AbortedError(NodeName(n.info) + " was declared dead after " +
                                           SecondsText(options_.heartbeat_timeout_s) +
                                           " s of silence; restart it to rejoin the job"));
  }
  switch (c.type) {
    case wire::HEARTBEAT:
      replies_.Reply(m.peer, HeartbeatAnswer(c));
      break;
    case wire::BARRIER:
      barriers_.Arrive(m.peer, c);
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
      replies_.Error(m.peer, InvalidArgumentError("the scheduler does not handle message type " +
                                              std::to_string(TagOf(m.header).type)));
  }
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
  barriers_.Check();
}

bool Scheduler::JobOver() const { return announced_ && roster_.WorkersDone(); }

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
      for (auto& n : roster_.nodes()) n.last_seen += paused;
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
                                   " s: " + std::to_string(roster_.nodes().size()) + " of " +
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
  for (const auto& n : roster_.nodes()) {
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
