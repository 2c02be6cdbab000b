// Server: registering, starting and ending; the scheduler's news (dead, rejoined and finished
// workers, dead servers whose shards a copy here takes over); checkpoints and restores; coming
// back after a pause.
#include <algorithm>
#include <chrono>
#include <future>

#include "common/base/clock.h"
#include "common/base/logging.h"
#include "common/net/control/node.h"
#include "common/obs/trace.h"
#include "server/server.h"

namespace gradsync {

void Server::MaybeCheckpoint(bool updated) {
  if (!checkpointer_.enabled() || !built()) return;
  const double now = SteadyMs() / 1e3;
  if (!checkpointer_.Due(updated, now)) return;
  if (core_->aggregates() && !core_->held().empty()) return;  // bsp: only between rounds
  WriteCheckpoint(now);
}

double Server::checkpoint_age_s() const {
  return stats_.last_checkpoint_s < 0 ? -1 : SteadyMs() / 1e3 - stats_.last_checkpoint_s;
}

void Server::WriteCheckpoint(double now_s) {
  TraceSpan span("checkpoint", "server", {{"version", static_cast<double>(core_->shard().version())}});
  if (Status s = checkpointer_.Write(rank_, [this] { return core_->Snapshot(Identity()); }, now_s); !s.ok()) {
    GRADSYNC_LOG(ERROR) << "server " << rank_ << ": checkpoint " << checkpointer_.Path(rank_)
                        << " failed (training goes on): " << s << "; " << checkpointer_.LastGood(now_s);
  }
  stats_.checkpoints = checkpointer_.written();
  stats_.checkpoint_failures = checkpointer_.failed_since();
  stats_.last_checkpoint_s = checkpointer_.last_written_s();
  stats_.checkpoint_ms_max = checkpointer_.slowest_ms();
}

Status Server::RestoreState(const wire::ShardCheckpoint& c) {
  RETURN_IF_ERROR(BuildShard(c.job(), &c));
  membership_.Restored(std::vector<int64_t>(c.pushed().begin(), c.pushed().end()));
  stats_.restored = true;
  TraceInstant("restored", "failure", {{"version", static_cast<double>(c.version())},
                                       {"round", static_cast<double>(c.rounds_applied())}});
  return OkStatus();
}

Status Server::RestoreCheckpoint() {
  const std::string path = checkpointer_.Path(rank_);
  ASSIGN_OR_RETURN(wire::ShardCheckpoint c, checkpointer_.Read(rank_, table_));
  RETURN_IF_ERROR(RestoreState(c).WithContext(path));
  const double age = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count() -
                     c.written_at();
  GRADSYNC_LOG(WARNING) << "server " << rank_ << ": restored from " << path << " (version " << c.version()
                        << ", round " << c.rounds_applied() << ", written " << age << " s ago); workers go on from there";
  return OkStatus();
}

void Server::OnMembership() {
  for (const wire::NodeInfo& n : membership_.NewDead(*scheduler_)) {
    if (n.role() == wire::WORKER) {
      GRADSYNC_LOG(WARNING) << "server " << rank_ << ": " << NodeName(n) << " is dead; continuing with "
                            << core_->rule().live_workers() - 1 << " live workers";
      TraceInstant("worker declared dead", "failure", {{"worker", static_cast<double>(n.rank())}});
      core_->Remove(n.rank());
      membership_.Settled(n.rank());
      core_->state_sets().Drop(n.rank());
      DetachWorker(n.rank());
    } else if (n.role() == wire::SERVER && n.rank() != rank_) {
      replication_->UpdateBackups(*scheduler_, *core_, Identity());
      // Every dead shard again, not only this one: the backup that was to take one over may
      // have died with it (its process), and be declared dead only now.
      for (int r : replication_->DeadShards(*scheduler_)) MaybeAdopt(r);
    }
  }
  for (const wire::NodeInfo& n : membership_.NewJoined(*scheduler_)) {
    // A backup at a new address: a new link, a snapshot.
    if (n.role() == wire::SERVER) replication_->UpdateBackups(*scheduler_, *core_, Identity());
    if (n.role() != wire::WORKER) continue;
    membership_.Announced(n.rank());  // its new connection will JOIN
  }
  for (const EndedWorker& e : membership_.NewEnded(*scheduler_)) {
    if (e.rank < 0 || e.rank >= core_->rule().num_workers()) continue;
    core_->rule().EndAt(e.rank, e.clock);
    // A worker that leaves is out of the rounds and the minimum clock, as a dead one is (its push
    // of the open round stays in it), but may still pull. Not one that is dead by now.
    const bool leaves = e.joined && !scheduler_->IsDead(wire::WORKER, e.rank) && !core_->rule().HasLeft(e.rank);
    if (leaves) core_->Leave(e.rank);
    TraceInstant(e.joined ? "worker left (join)" : "worker ended training", "job",
                 {{"worker", static_cast<double>(e.rank)}, {"clock", static_cast<double>(e.clock)}});
    GRADSYNC_LOG(INFO) << "server " << rank_ << ": worker " << e.rank << " ended training after " << e.clock
                       << " steps"
                       << (leaves ? "; it leaves the consistency rule (" + std::to_string(core_->rule().live_workers()) +
                                        " live workers)"
                                  : std::string());
  }
  while (built() && core_->rule().RoundComplete()) ApplyRound();
  if (built()) AnswerParked();
}

Status Server::ApplyMessageLimit() {
  const auto want = static_cast<int64_t>(scheduler_->table().max_message_bytes());
  if (want > kMaxJobMessageBytes) {
    return InvalidArgumentError("the scheduler's message limit of " + std::to_string(want) + " bytes is not sane");
  }
  if (want > socket_.max_message_bytes()) {
    RETURN_IF_ERROR(socket_.RaiseMaxMessageBytes(want));
    GRADSYNC_LOG(INFO) << "server " << rank_ << ": accepts messages of up to " << want << " bytes";
  }
  listening_ = std::max(want, socket_.max_message_bytes());
  scheduler_->Listening(socket_.max_message_bytes());
  return OkStatus();
}

Status Server::Register() {
  SchedulerClientOptions sc;
  sc.scheduler_endpoint = options_.scheduler_endpoint;
  sc.self.set_role(wire::SERVER);
  sc.self.set_host(options_.advertise_host);
  sc.self.set_port(socket_.port());
  sc.self.set_requested_rank(rank_ >= 0 ? rank_ : options_.requested_rank);
  sc.self.set_adopted(options_.restore_from != nullptr);
  sc.self.set_checkpoints(!options_.checkpoint_dir.empty());
  sc.mode = ConsistencyModeName(options_.mode);
  sc.staleness = options_.mode == ConsistencyMode::kSsp ? options_.staleness : 0;
  sc.heartbeat_interval_s = options_.heartbeat_interval_s;
  sc.scheduler_timeout_s = options_.scheduler_timeout_s;
  scheduler_.reset();  // a previous link (declared dead) stops its heartbeats first
  scheduler_ = std::make_unique<SchedulerClient>(ctx_, sc);
  membership_.ResetNews();
  // Nothing is served before the job is complete (workers connect after it), but what strangers
  // send meanwhile must not pile up unread in the data socket: it is read and dropped.
  auto registered = std::async(std::launch::async, [&] { return scheduler_->Register(options_.register_timeout_s); });
  while (registered.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
    if (auto m = socket_.Recv(20); m.ok()) stats_.rejected++;
  }
  ASSIGN_OR_RETURN(table_, registered.get());
  rank_ = scheduler_->rank();
  return OkStatus();
}

void Server::MaybeAdopt(int dead) {
  std::optional<ReplicaCopy> copy = replication_->TakeOver(dead, *scheduler_);
  if (!copy) return;
  ServerOptions o = options_;
  o.requested_rank = dead;
  o.port = 0;
  o.restore_from = std::make_shared<ReplicaCopy>(std::move(*copy));
  // The rank is free now or never (someone else took it): no long wait.
  o.register_timeout_s = std::min(o.register_timeout_s, 2 * options_.scheduler_timeout_s);
  o.colocated = colocated_;
  auto server = Server::Create(ctx_, o);
  if (!server.ok()) {
    GRADSYNC_LOG(ERROR) << "server " << rank_ << ": cannot take over shard " << dead << ": " << server.status();
    return;
  }
  colocated_->Add(dead);
  TraceInstant("took over a dead server's shard", "failure", {{"shard", static_cast<double>(dead)}});
  GRADSYNC_LOG(WARNING) << "server " << rank_ << ": server " << dead << " is dead; taking over its shard from the copy held here (version "
                        << o.restore_from->checkpoint.version() << ")";
  auto a = std::make_unique<Adoption>();
  a->server = std::move(server).value();
  Adoption* raw = a.get();
  a->thread = std::thread([raw] { raw->result = raw->server->Run(); });
  adopted_.push_back(std::move(a));
  replication_->UpdateBackups(*scheduler_, *core_, Identity());  // served here now: never a backup of this one
}

std::vector<const Server*> Server::adopted() const {
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

Status Server::RestoreFromCopy() {
  ReplicaCopy& copy = *options_.restore_from;
  const wire::ShardCheckpoint& c = copy.checkpoint;
  RETURN_IF_ERROR(RestoreState(c).WithContext("the backup's copy"));
  core_->SetHeld(std::move(copy.held));
  stats_.adopted = true;
  GRADSYNC_LOG(WARNING) << "server " << rank_ << ": took over from its backup copy (version " << c.version() << ", round "
                        << c.rounds_applied() << ", " << core_->held().size() << " push(es) of the open round); workers go on from there";
  return OkStatus();
}

Status Server::Rejoin() {
  TraceInstant("declared dead; rejoining", "failure");
  GRADSYNC_LOG(WARNING) << "server " << rank_ << ": declared dead while it did not answer (" << scheduler_->health()
                        << "); registering again to serve its shard as it is";
  RETURN_IF_ERROR(Register().WithContext("rejoining"));
  RETURN_IF_ERROR(ApplyMessageLimit());  // the scheduler announces this shard once it listens
  colocated_->Add(rank_);
  if (standby()) {
    // A backup serves its shard now: what this server held is stale. It keeps no shard and
    // catches up as a backup, from the snapshots the primaries send it.
    core_->Reset();
    parked_.Clear();
    core_->state_sets().Clear();
    codecs_ = ShardCodecs();
    replication_->BecomeStandby(rank_);
    GRADSYNC_LOG(WARNING) << "server " << rank_ << " (standby): its shard was taken over by a backup meanwhile; it "
                          << "holds copies of the shards from now on and takes one over should its backups die";
    return OkStatus();
  }
  // Workers reconnect and JOIN at the clocks they reached, as after a restore from this state.
  membership_.Restored(core_->rule().pushed_all());
  stats_.restored = true;
  membership_.ForgetConnections();
  parked_.Clear();
  core_->ForgetAllParts();
  core_->state_sets().Clear();
  RETURN_IF_ERROR(ApplyMessageLimit());
  replication_->UpdateBackups(*scheduler_, *core_, Identity());
  GRADSYNC_LOG(WARNING) << "server " << rank_ << ": back in the job with its shard (version "
                        << version() << ")";
  return OkStatus();
}

Status Server::Start() {
  colocated_ = options_.colocated ? options_.colocated : std::make_shared<Colocated>();
  RETURN_IF_ERROR(Register());
  if (!options_.trace_path.empty() && !Trace::on()) {
    RETURN_IF_ERROR(Trace::Start(options_.trace_path, "server", rank_, scheduler_->clock().offset_us()));
    if (scheduler_->rejoined()) TraceInstant("rejoined the job", "failure");
  }
  colocated_->Add(rank_);
  core_ = std::make_unique<ShardCore>(options_.mode, options_.staleness, table_.workers_size(), options_.apply_threads);
  replication_ = std::make_unique<ShardReplication>(ctx_, rank_, table_, options_.mode, options_.staleness,
                                                    scheduler_->replica_key(), standby(), colocated_);
  core_->set_events(replication_.get());
  DataChannelOptions data;
  data.bind_host = options_.bind_host;
  data.wait_s = options_.data_wait_s;
  data.drop_after_pulls = options_.drop_data_channel_after_pulls;
  data.drop_after_pushes = options_.drop_data_channel_after_pushes;
  channels_ = std::make_unique<ShardChannels>(&socket_, rank_, &codecs_, std::move(data));
  if (standby()) {
    GRADSYNC_LOG(WARNING) << "server " << rank_ << " (standby): its shard was taken over by a backup; it holds copies "
                          << "of the shards and takes one over should its backups die";
  } else if (scheduler_->rejoined()) {
    // A restarted shard in a running job: its state comes from a backup's copy, its checkpoint,
    // or it is lost.
    if (options_.restore_from) {
      RETURN_IF_ERROR(RestoreFromCopy());
    } else if (options_.checkpoint_dir.empty()) {
      return FailedPreconditionError("this shard rejoined a running job but has no --checkpoint-dir: its parameters are lost");
    } else if (Status s = RestoreCheckpoint(); !s.ok()) {
      return Status(s.code(), "shard " + std::to_string(rank_) +
                                  " rejoined a running job but cannot restore its checkpoint (its parameters are lost): " +
                                  s.message());
    }
  }
  RETURN_IF_ERROR(ApplyMessageLimit());
  replication_->UpdateBackups(*scheduler_, *core_, Identity());
  GRADSYNC_LOG(INFO) << "server " << rank_ << ": serving on port " << socket_.port() << " ("
                     << ConsistencyModeName(options_.mode)
                     << (options_.mode == ConsistencyMode::kSsp ? " s=" + std::to_string(options_.staleness) : "")
                     << ", " << table_.workers_size() << " workers"
                     << (table_.replicas() > 1 ? ", " + std::to_string(table_.replicas() - 1) + " backup(s) per shard" : "")
                     << ")";
  return OkStatus();
}

void Server::Finish() {
  stats_.traffic = socket_.traffic();
  stats_.traffic.bytes_sent += channels_->bytes_sent();  // the data channels' bytes are on the wire too
  stats_.traffic.bytes_received += channels_->bytes_received();
  const ChannelCounts& c = channels_->counts();
  stats_.shm_lanes = c.shm_lanes;
  stats_.shm_pulls = c.shm_pulls;
  stats_.data_channels = c.data_channels;
  stats_.data_pulls = c.data_pulls;
  stats_.compressed_pulls = c.compressed_pulls;
  stats_.replicated = replication_->counts().sent;
  stats_.replica_entries = replication_->counts().received;
  if (Trace::on() && !options_.trace_path.empty()) {
    // The best estimate of the whole run (more probes unless the scheduler is shutting down).
    if (!scheduler_->shutdown_requested()) scheduler_->clock().Estimate(SchedulerClient::kClockProbes, 0.5);
    Trace::RefineClockOffset(scheduler_->clock().offset_us(), scheduler_->clock().rtt_us() / 2);
  }
  scheduler_.reset();  // stops the heartbeats: the scheduler sees this shard leave
  for (auto& a : adopted_) {
    if (stop_.load()) a->server->Stop();
    if (a->thread.joinable()) a->thread.join();
    if (!a->result.ok()) GRADSYNC_LOG(ERROR) << "server " << rank_ << ": the shard it took over ended with: " << a->result;
  }
}

}  // namespace gradsync
