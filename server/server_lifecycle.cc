#include "server/server_lifecycle.h"

#include <algorithm>
#include <chrono>
#include <iomanip>
#include <sstream>
#include <thread>

#include "common/base/clock.h"
#include "common/base/logging.h"
#include "common/net/control/node.h"
#include "common/obs/trace.h"
#include "server/server.h"

namespace gradsync {
namespace {
std::string OptimizerText(const OptimizerOptions& o) {
  std::ostringstream s;
  if (o.kind == OptimizerKind::kAdam || o.kind == OptimizerKind::kLamb) {
    s << OptimizerKindName(o.kind) << " (beta1 " << o.beta1 << ", beta2 " << o.beta2 << ", eps " << o.eps;
  } else if (o.kind == OptimizerKind::kLars) {
    s << "lars (momentum " << o.momentum << ", trust coefficient " << o.trust_coefficient;
  } else {
    s << "sgd (momentum " << o.momentum << (o.nesterov ? ", nesterov" : "");
  }
  s << ", weight decay " << o.weight_decay << ")";
  return s.str();
}
}  // namespace

// A shard of a dead server taken over here: its own Server, running its own loop.
struct ServerLifecycle::Adoption {
  std::unique_ptr<Server> server;
  std::thread thread;
  Status result;
};

ServerLifecycle::ServerLifecycle(TransportContext& ctx, const ServerOptions& options, Socket& socket,
                                 const std::atomic<bool>& stop, ServerRegistration& registration, ServerShard& shard,
                                 ServerCheckpoints& checkpoints, PushPullService& push_pull, RecoveryStats& stats)
    : ctx_(ctx),
      options_(options),
      socket_(socket),
      stop_(stop),
      registration_(registration),
      shard_(shard),
      checkpoints_(checkpoints),
      push_pull_(push_pull),
      stats_(stats) {}

ServerLifecycle::~ServerLifecycle() = default;

std::optional<Status> ServerLifecycle::Poll() {
  shard_.replication->Poll(socket_, *shard_.core, registration_.Identity());
  checkpoints_.Maybe(false);
  if (!shard_.membership.News(registration_.scheduler())) return std::nullopt;
  return OnSchedulerNews();
}

Status ServerLifecycle::HandleJoin(const PsRequest& r, const Message& m) {
  const int rank = registration_.rank();
  if (!shard_.built()) return UnavailableError("not initialized yet; retry");
  const int w = r.worker;
  const int64_t clock = r.clock;
  if (clock < -1) return InvalidArgumentError("JOIN with clock " + std::to_string(clock));
  if (!shard_.core->rule().clocks().IsLive(w)) {
    // A rejoining worker: live from now on, at the clock where it holds no one back.
    const int64_t start = shard_.core->Rejoin(w);
    shard_.membership.Settled(w);
    shard_.codecs.Forget(w);  // its first pull is raw
    TraceInstant("worker rejoined", "failure", {{"worker", static_cast<double>(w)}, {"clock", static_cast<double>(start)}});
    GRADSYNC_LOG(WARNING) << "server " << rank << ": worker " << w << " rejoins at clock " << start << " ("
                          << shard_.core->rule().clocks().live_workers() << " live workers)";
  }
  if (clock >= 0) {
    const int64_t at = shard_.core->rule().clocks().pushed(w);
    if (clock < at) {
      return AbortedError("JOIN at clock " + std::to_string(clock) + " but worker " + std::to_string(w) +
                          " has pushed " + std::to_string(at) + " gradients to this shard");
    }
    if (const auto lost = shard_.membership.Resync(w, clock, at)) {
      // What this restored shard lost of this worker: the pushes it had made past what was
      // restored (a checkpoint, a backup's copy), less any it sent again since.
      stats_.lost_updates += *lost;
      TraceInstant("worker resynced", "failure", {{"worker", static_cast<double>(w)}, {"clock", static_cast<double>(clock)},
                                                  {"lost pushes", static_cast<double>(*lost)}});
      GRADSYNC_LOG(WARNING) << "server " << rank << ": worker " << w << " goes on at clock " << clock << "; "
                            << (*lost == 0 ? std::string("nothing of it was lost")
                                           : "its " + std::to_string(*lost) + " push(es) after what was restored were lost")
                            << " (restored at clock " << shard_.membership.restored_clock(w) << ")";
    }
    if (clock > at) {
      shard_.core->intake().ForgetParts(w);
      shard_.core->GoOnAt(w, clock);  // a held push of a round it now skips goes
    }
    while (shard_.core->rule().RoundComplete()) push_pull_.ApplyRound();
    push_pull_.AnswerParked();
  }
  PsReply reply = ReplyTo(r, wire::JOIN_REPLY, rank);
  reply.clock = shard_.core->rule().clocks().pushed(w);
  reply.version = shard_.core->shard().version();  // a push the worker sends next is computed on what it pulls now
  return socket_.Send(m.peer, EncodeReply(reply));
}

Status ServerLifecycle::BuildShard(const wire::JobConfig& job, const wire::ShardCheckpoint* from) {
  const int rank = registration_.rank();
  const wire::ClusterTable& table = registration_.table();
  if (job.num_workers() != table.workers_size()) {
    return InvalidArgumentError("INIT for " + std::to_string(job.num_workers()) + " workers; the job has " +
                                std::to_string(table.workers_size()));
  }
  if (from) {
    RETURN_IF_ERROR(shard_.core->Restore(*from, table.servers_size(), rank));
  } else {
    RETURN_IF_ERROR(shard_.core->Build(job, table.servers_size(), rank));
  }
  const OptimizerOptions opt = shard_.core->shard().optimizer().options();
  const Segment range = shard_.core->shard().range();
  auto codecs = ShardCodecs::ForJob(job, range);
  if (!codecs.ok()) {
    shard_.core->Reset();
    return codecs.status();
  }
  shard_.codecs = std::move(codecs).value();
  GRADSYNC_LOG(INFO) << "server " << rank << ": holds [" << range.begin << ", " << range.end << ") of "
                     << job.num_params() << " parameters; lr " << job.lr() << " (" << job.lr_schedule() << "), "
                     << OptimizerText(opt);
  if (const DelayCompensation* dc = AsDelayCompensation(shard_.core->transform())) {
    GRADSYNC_LOG(INFO) << "server " << rank << ": delay compensation, lambda " << dc->options().lambda
                       << (dc->options().adaptive ? " (adaptive)" : "") << ": keeps each worker's last pull of this shard, "
                       << std::fixed << std::setprecision(2)
                       << static_cast<double>(range.size()) * 4 * (job.num_workers() + (dc->options().adaptive ? 1 : 0)) /
                              (1024.0 * 1024.0)
                       << " MiB at most";
  }
  return OkStatus();
}

Status ServerLifecycle::HandleInit(const PsRequest& r, const Message& m) {
  if (r.worker != 0) return InvalidArgumentError("only worker 0 initializes the shards");
  if (shard_.built()) return FailedPreconditionError("already initialized");
  if (!r.codec.empty()) return InvalidArgumentError("INIT carries raw initial values, not a codec payload");
  if (!r.has_values) return InvalidArgumentError("INIT carries the shard's initial values");
  const auto& job = r.job;
  if (job.num_params() > 0 && job.num_params() <= (uint64_t{1} << 34)) {
    const Segment range = Partitioner(static_cast<int64_t>(job.num_params()), registration_.table().servers_size())
                              .range(registration_.rank());
    if (r.segments.size() != 1 || r.segments[0] != range || r.num_keys > 0) {
      return InvalidArgumentError("INIT must carry exactly this shard's range [" + std::to_string(range.begin) +
                                  ", " + std::to_string(range.end) + ")");
    }
  }
  RETURN_IF_ERROR(BuildShard(job));
  std::vector<float> values(static_cast<size_t>(shard_.core->shard().range().size()));
  m.CopyValues(values.data());
  shard_.core->shard().SetValues(values);
  // The first checkpoint at once: a shard killed before its first interval can still come back.
  if (checkpoints_.enabled()) checkpoints_.Write(SteadyMs() / 1e3);
  shard_.replication->SendSnapshots(*shard_.core, registration_.Identity());
  return socket_.Send(m.peer, EncodeReply(ReplyTo(r, wire::INIT_REPLY, registration_.rank())));
}

std::optional<Status> ServerLifecycle::OnSchedulerNews() {
  if (registration_.LimitRaised()) {
    if (Status s = registration_.ApplyMessageLimit(); !s.ok()) return s;
  }
  OnMembership();
  const SchedulerClient& scheduler = registration_.scheduler();
  if (scheduler.shutdown_requested()) return scheduler.job_failure();
  if (scheduler.health().ok()) return std::nullopt;
  // Paused past the heartbeat timeout (SIGSTOP, a stalled host): its shard is intact.
  if (scheduler.health().code() == StatusCode::kAborted && shard_.built()) {
    Status s = Rejoin();
    if (s.ok()) return std::nullopt;
    return s;
  }
  return registration_.scheduler().health();
}

Status ServerLifecycle::RestoreState(const wire::ShardCheckpoint& c) {
  RETURN_IF_ERROR(BuildShard(c.job(), &c));
  shard_.membership.Restored(std::vector<int64_t>(c.pushed().begin(), c.pushed().end()));
  stats_.restored = true;
  TraceInstant("restored", "failure", {{"version", static_cast<double>(c.version())},
                                       {"round", static_cast<double>(c.rounds_applied())}});
  return OkStatus();
}

Status ServerLifecycle::RestoreCheckpoint() {
  const std::string path = checkpoints_.Path();
  ASSIGN_OR_RETURN(wire::ShardCheckpoint c, checkpoints_.Read());
  RETURN_IF_ERROR(RestoreState(c).WithContext(path));
  const double age = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count() -
                     c.written_at();
  GRADSYNC_LOG(WARNING) << "server " << registration_.rank() << ": restored from " << path << " (version " << c.version()
                        << ", round " << c.rounds_applied() << ", written " << age << " s ago); workers go on from there";
  return OkStatus();
}

void ServerLifecycle::OnMembership() {
  const int rank = registration_.rank();
  SchedulerClient& scheduler = registration_.scheduler();
  for (const wire::NodeInfo& n : shard_.membership.NewDead(scheduler)) {
    if (n.role() == wire::WORKER) {
      GRADSYNC_LOG(WARNING) << "server " << rank << ": " << NodeName(n) << " is dead; continuing with "
                            << shard_.core->rule().clocks().live_workers() - 1 << " live workers";
      TraceInstant("worker declared dead", "failure", {{"worker", static_cast<double>(n.rank())}});
      shard_.core->Remove(n.rank());
      shard_.membership.Settled(n.rank());
      shard_.core->state_sets().Drop(n.rank());
      push_pull_.DetachWorker(n.rank());
    } else if (n.role() == wire::SERVER && n.rank() != rank) {
      shard_.replication->UpdateBackups(scheduler, *shard_.core, registration_.Identity());
      // Every dead shard again, not only this one: the backup that was to take one over may
      // have died with it (its process), and be declared dead only now.
      for (int r : shard_.replication->DeadShards(scheduler)) MaybeAdopt(r);
    }
  }
  for (const wire::NodeInfo& n : shard_.membership.NewJoined(scheduler)) {
    // A backup at a new address: a new link, a snapshot.
    if (n.role() == wire::SERVER) shard_.replication->UpdateBackups(scheduler, *shard_.core, registration_.Identity());
    if (n.role() != wire::WORKER) continue;
    shard_.membership.Announced(n.rank());  // its new connection will JOIN
  }
  for (const EndedWorker& e : shard_.membership.NewEnded(scheduler)) {
    if (e.rank < 0 || e.rank >= shard_.core->rule().clocks().num_workers()) continue;
    shard_.core->rule().clocks().EndAt(e.rank, e.clock);
    // A worker that leaves is out of the rounds and the minimum clock, as a dead one is (its push
    // of the open round stays in it), but may still pull. Not one that is dead by now.
    const bool leaves = e.joined && !scheduler.IsDead(wire::WORKER, e.rank) && !shard_.core->rule().clocks().HasLeft(e.rank);
    if (leaves) shard_.core->Leave(e.rank);
    TraceInstant(e.joined ? "worker left (join)" : "worker ended training", "job",
                 {{"worker", static_cast<double>(e.rank)}, {"clock", static_cast<double>(e.clock)}});
    GRADSYNC_LOG(INFO) << "server " << rank << ": worker " << e.rank << " ended training after " << e.clock
                       << " steps"
                       << (leaves ? "; it leaves the consistency rule (" + std::to_string(shard_.core->rule().clocks().live_workers()) +
                                        " live workers)"
                                  : std::string());
  }
  while (shard_.built() && shard_.core->rule().RoundComplete()) push_pull_.ApplyRound();
  if (shard_.built()) push_pull_.AnswerParked();
}

void ServerLifecycle::MaybeAdopt(int dead) {
  const int rank = registration_.rank();
  SchedulerClient& scheduler = registration_.scheduler();
  std::optional<ReplicaCopy> copy = shard_.replication->TakeOver(dead, scheduler);
  if (!copy) return;
  ServerOptions o = options_;
  o.link.requested_rank = dead;
  o.channels.port = 0;
  o.takeover.restore_from = std::make_shared<ReplicaCopy>(std::move(*copy));
  // The rank is free now or never (someone else took it): no long wait.
  o.link.register_timeout_s = std::min(o.link.register_timeout_s, 2 * options_.link.scheduler_timeout_s);
  o.takeover.colocated = colocated_;
  auto server = Server::Create(ctx_, o);
  if (!server.ok()) {
    GRADSYNC_LOG(ERROR) << "server " << rank << ": cannot take over shard " << dead << ": " << server.status();
    return;
  }
  colocated_->Add(dead);
  TraceInstant("took over a dead server's shard", "failure", {{"shard", static_cast<double>(dead)}});
  GRADSYNC_LOG(WARNING) << "server " << rank << ": server " << dead << " is dead; taking over its shard from the copy held here (version "
                        << o.takeover.restore_from->checkpoint.version() << ")";
  auto a = std::make_unique<Adoption>();
  a->server = std::move(server).value();
  Adoption* raw = a.get();
  a->thread = std::thread([raw] { raw->result = raw->server->Run(); });
  adopted_.push_back(std::move(a));
  shard_.replication->UpdateBackups(scheduler, *shard_.core, registration_.Identity());  // served here now: never a backup of this one
}

std::vector<const Server*> ServerLifecycle::adopted() const {
  std::vector<const Server*> out;
  for (const auto& a : adopted_) {
    if (a->server->rank() < 0) continue;  // the job ended before it had the rank: it served nothing
    out.push_back(a->server.get());
    // A shard server that took a rank over backs other shards up in turn, and may take one of
    // them over later (the same process serving three ranks): its shards are this process's too.
    for (const Server* more : a->server->adopted()) out.push_back(more);
  }
  return out;
}

Status ServerLifecycle::RestoreFromCopy() {
  ReplicaCopy& copy = *options_.takeover.restore_from;
  const wire::ShardCheckpoint& c = copy.checkpoint;
  RETURN_IF_ERROR(RestoreState(c).WithContext("the backup's copy"));
  shard_.core->round().SetHeld(std::move(copy.held));
  stats_.adopted = true;
  GRADSYNC_LOG(WARNING) << "server " << registration_.rank() << ": took over from its backup copy (version " << c.version() << ", round "
                        << c.rounds_applied() << ", " << shard_.core->round().held().size() << " push(es) of the open round); workers go on from there";
  return OkStatus();
}

Status ServerLifecycle::Rejoin() {
  TraceInstant("declared dead; rejoining", "failure");
  GRADSYNC_LOG(WARNING) << "server " << registration_.rank() << ": declared dead while it did not answer (" << registration_.scheduler().health()
                        << "); registering again to serve its shard as it is";
  RETURN_IF_ERROR(registration_.Register().WithContext("rejoining"));
  shard_.membership.ResetNews();
  RETURN_IF_ERROR(registration_.ApplyMessageLimit());  // the scheduler announces this shard once it listens
  colocated_->Add(registration_.rank());
  if (registration_.standby()) {
    // A backup serves its shard now: what this server held is stale. It keeps no shard and
    // catches up as a backup, from the snapshots the primaries send it.
    shard_.core->Reset();
    shard_.parked.Clear();
    shard_.core->state_sets().Clear();
    shard_.codecs = ShardCodecs();
    shard_.replication->BecomeStandby(registration_.rank());
    GRADSYNC_LOG(WARNING) << "server " << registration_.rank() << " (standby): its shard was taken over by a backup meanwhile; it "
                          << "holds copies of the shards from now on and takes one over should its backups die";
    return OkStatus();
  }
  // Workers reconnect and JOIN at the clocks they reached, as after a restore from this state.
  shard_.membership.Restored(shard_.core->rule().clocks().pushed_all());
  stats_.restored = true;
  shard_.membership.ForgetConnections();
  shard_.parked.Clear();
  shard_.core->intake().ForgetAllParts();
  shard_.core->state_sets().Clear();
  RETURN_IF_ERROR(registration_.ApplyMessageLimit());
  shard_.replication->UpdateBackups(registration_.scheduler(), *shard_.core, registration_.Identity());
  GRADSYNC_LOG(WARNING) << "server " << registration_.rank() << ": back in the job with its shard (version "
                        << shard_.core->shard().version() << ")";
  return OkStatus();
}

Status ServerLifecycle::Start() {
  colocated_ = options_.takeover.colocated ? options_.takeover.colocated : std::make_shared<Colocated>();
  RETURN_IF_ERROR(registration_.Register());
  shard_.membership.ResetNews();
  if (!options_.trace_path.empty() && !Trace::on()) {
    RETURN_IF_ERROR(Trace::Start(options_.trace_path, "server", registration_.rank(), registration_.scheduler().clock().offset_us()));
    if (registration_.scheduler().rejoined()) TraceInstant("rejoined the job", "failure");
  }
  colocated_->Add(registration_.rank());
  const int rank = registration_.rank();
  const ShardRuleOptions& rule = options_.rule;
  shard_.replication = std::make_unique<ShardReplication>(ctx_, rank, registration_.table(), rule.mode, rule.staleness,
                                                    registration_.scheduler().replica_key(), registration_.standby(), colocated_);
  shard_.core = std::make_unique<ShardCore>(rule.mode, rule.staleness, registration_.table().workers_size(),
                                            rule.apply_threads, shard_.replication.get());
  DataChannelOptions data;
  data.bind_host = options_.channels.bind_host;
  data.wait_s = options_.channels.data_wait_s;
  data.drop_after_pulls = options_.channels.drop_data_channel_after_pulls;
  data.drop_after_pushes = options_.channels.drop_data_channel_after_pushes;
  shard_.channels = std::make_unique<ShardChannels>(&socket_, rank, &shard_.codecs, std::move(data));
  if (registration_.standby()) {
    GRADSYNC_LOG(WARNING) << "server " << registration_.rank() << " (standby): its shard was taken over by a backup; it holds copies "
                          << "of the shards and takes one over should its backups die";
  } else if (registration_.scheduler().rejoined()) {
    // A restarted shard in a running job: its state comes from a backup's copy, its checkpoint,
    // or it is lost.
    if (options_.takeover.restore_from) {
      RETURN_IF_ERROR(RestoreFromCopy());
    } else if (options_.checkpoints.dir.empty()) {
      return FailedPreconditionError("this shard rejoined a running job but has no --checkpoint-dir: its parameters are lost");
    } else if (Status s = RestoreCheckpoint(); !s.ok()) {
      return Status(s.code(), "shard " + std::to_string(registration_.rank()) +
                                  " rejoined a running job but cannot restore its checkpoint (its parameters are lost): " +
                                  s.message());
    }
  }
  RETURN_IF_ERROR(registration_.ApplyMessageLimit());
  shard_.replication->UpdateBackups(registration_.scheduler(), *shard_.core, registration_.Identity());
  GRADSYNC_LOG(INFO) << "server " << registration_.rank() << ": serving on port " << socket_.port() << " ("
                     << ConsistencyModeName(rule.mode)
                     << (rule.mode == ConsistencyMode::kSsp ? " s=" + std::to_string(rule.staleness) : "")
                     << ", " << registration_.table().workers_size() << " workers"
                     << (registration_.table().replicas() > 1 ? ", " + std::to_string(registration_.table().replicas() - 1) + " backup(s) per shard" : "")
                     << ")";
  return OkStatus();
}

void ServerLifecycle::Finish() {
  if (Trace::on() && !options_.trace_path.empty()) {
    // The best estimate of the whole run (more probes unless the scheduler is shutting down).
    if (!registration_.scheduler().shutdown_requested()) registration_.scheduler().clock().Estimate(SchedulerClient::kClockProbes, 0.5);
    Trace::RefineClockOffset(registration_.scheduler().clock().offset_us(), registration_.scheduler().clock().rtt_us() / 2);
  }
  registration_.Leave();  // stops the heartbeats: the scheduler sees this shard leave
  for (auto& a : adopted_) {
    if (stop_.load()) a->server->Stop();
    if (a->thread.joinable()) a->thread.join();
    if (!a->result.ok()) GRADSYNC_LOG(ERROR) << "server " << registration_.rank() << ": the shard it took over ended with: " << a->result;
  }
}

}  // namespace gradsync
