#include "server/server.h"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <optional>
#include <sstream>

#include "common/base/clock.h"
#include "common/base/logging.h"
#include "common/net/security.h"
#include "common/obs/trace.h"

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

Result<std::unique_ptr<Server>> Server::Create(TransportContext& ctx, const ServerOptions& options) {
  ASSIGN_OR_RETURN(Socket s, Socket::BindRouter(ctx, options.bind_host, options.port));
  return std::unique_ptr<Server>(new Server(ctx, options, std::move(s)));
}

std::vector<float> Server::params() const {
  if (!built()) return {};
  return std::vector<float>(core_->shard().params().begin(), core_->shard().params().end());
}

int64_t Server::version() const { return built() ? core_->shard().version() : 0; }

void Server::ReplyError(const Message& m, const Status& s) {
  const MessageTag tag = TagOf(m.header);
  ReplyError(m.peer, tag.request_id, tag.clock, s);
}

void Server::ReplyError(const std::string& peer, uint64_t request_id, int64_t clock, const Status& s) {
  stats_.rejected++;
  GRADSYNC_LOG(DEBUG) << "server " << rank_ << ": rejected a message: " << s;
  if (peer.empty()) return;
  PsReply r;
  r.type = wire::ERROR;
  r.server = rank_;
  r.request_id = request_id;
  r.clock = clock;
  r.error = Status(s.code(), "server " + std::to_string(rank_) + ": " + s.message());
  (void)socket_.Send(peer, EncodeReply(r));
}

Status Server::HandleJoin(const PsRequest& r, const Message& m) {
  if (!built()) return UnavailableError("not initialized yet; retry");
  const int w = r.worker;
  const int64_t clock = r.clock;
  if (clock < -1) return InvalidArgumentError("JOIN with clock " + std::to_string(clock));
  if (!core_->rule().clocks().IsLive(w)) {
    // A rejoining worker: live from now on, at the clock where it holds no one back.
    const int64_t start = core_->Rejoin(w);
    membership_.Settled(w);
    codecs_.Forget(w);  // its first pull is raw
    TraceInstant("worker rejoined", "failure", {{"worker", static_cast<double>(w)}, {"clock", static_cast<double>(start)}});
    GRADSYNC_LOG(WARNING) << "server " << rank_ << ": worker " << w << " rejoins at clock " << start << " ("
                          << core_->rule().clocks().live_workers() << " live workers)";
  }
  if (clock >= 0) {
    const int64_t at = core_->rule().clocks().pushed(w);
    if (clock < at) {
      return AbortedError("JOIN at clock " + std::to_string(clock) + " but worker " + std::to_string(w) +
                          " has pushed " + std::to_string(at) + " gradients to this shard");
    }
    if (const auto lost = membership_.Resync(w, clock, at)) {
      // What this restored shard lost of this worker: the pushes it had made past what was
      // restored (a checkpoint, a backup's copy), less any it sent again since.
      stats_.lost_updates += *lost;
      TraceInstant("worker resynced", "failure", {{"worker", static_cast<double>(w)}, {"clock", static_cast<double>(clock)},
                                                  {"lost pushes", static_cast<double>(*lost)}});
      GRADSYNC_LOG(WARNING) << "server " << rank_ << ": worker " << w << " goes on at clock " << clock << "; "
                            << (*lost == 0 ? std::string("nothing of it was lost")
                                           : "its " + std::to_string(*lost) + " push(es) after what was restored were lost")
                            << " (restored at clock " << membership_.restored_clock(w) << ")";
    }
    if (clock > at) {
      core_->intake().ForgetParts(w);
      core_->GoOnAt(w, clock);  // a held push of a round it now skips goes
    }
    while (core_->rule().RoundComplete()) ApplyRound();
    AnswerParked();
  }
  PsReply reply = ReplyTo(r, wire::JOIN_REPLY, rank_);
  reply.clock = core_->rule().clocks().pushed(w);
  reply.version = core_->shard().version();  // a push the worker sends next is computed on what it pulls now
  return socket_.Send(m.peer, EncodeReply(reply));
}

Status Server::BuildShard(const wire::JobConfig& job, const wire::ShardCheckpoint* from) {
  if (job.num_workers() != table_.workers_size()) {
    return InvalidArgumentError("INIT for " + std::to_string(job.num_workers()) + " workers; the job has " +
                                std::to_string(table_.workers_size()));
  }
  if (from) {
    RETURN_IF_ERROR(core_->Restore(*from, table_.servers_size(), rank_));
  } else {
    RETURN_IF_ERROR(core_->Build(job, table_.servers_size(), rank_));
  }
  const OptimizerOptions opt = core_->shard().optimizer().options();
  const Segment range = core_->shard().range();
  auto codecs = ShardCodecs::ForJob(job, range);
  if (!codecs.ok()) {
    core_->Reset();
    return codecs.status();
  }
  codecs_ = std::move(codecs).value();
  GRADSYNC_LOG(INFO) << "server " << rank_ << ": holds [" << range.begin << ", " << range.end << ") of "
                     << job.num_params() << " parameters; lr " << job.lr() << " (" << job.lr_schedule() << "), "
                     << OptimizerText(opt);
  if (const DelayCompensation* dc = AsDelayCompensation(core_->transform())) {
    GRADSYNC_LOG(INFO) << "server " << rank_ << ": delay compensation, lambda " << dc->options().lambda
                       << (dc->options().adaptive ? " (adaptive)" : "") << ": keeps each worker's last pull of this shard, "
                       << std::fixed << std::setprecision(2)
                       << static_cast<double>(range.size()) * 4 * (job.num_workers() + (dc->options().adaptive ? 1 : 0)) /
                              (1024.0 * 1024.0)
                       << " MiB at most";
  }
  return OkStatus();
}

Status Server::HandleInit(const PsRequest& r, const Message& m) {
  if (r.worker != 0) return InvalidArgumentError("only worker 0 initializes the shards");
  if (built()) return FailedPreconditionError("already initialized");
  if (!r.codec.empty()) return InvalidArgumentError("INIT carries raw initial values, not a codec payload");
  if (!r.has_values) return InvalidArgumentError("INIT carries the shard's initial values");
  const auto& job = r.job;
  if (job.num_params() > 0 && job.num_params() <= (uint64_t{1} << 34)) {
    const Segment range = Partitioner(static_cast<int64_t>(job.num_params()), table_.servers_size()).range(rank_);
    if (r.segments.size() != 1 || r.segments[0] != range || r.num_keys > 0) {
      return InvalidArgumentError("INIT must carry exactly this shard's range [" + std::to_string(range.begin) +
                                  ", " + std::to_string(range.end) + ")");
    }
  }
  RETURN_IF_ERROR(BuildShard(job));
  std::vector<float> values(static_cast<size_t>(core_->shard().range().size()));
  m.CopyValues(values.data());
  core_->shard().SetValues(values);
  // The first checkpoint at once: a shard killed before its first interval can still come back.
  if (checkpointer_.enabled()) WriteCheckpoint(SteadyMs() / 1e3);
  replication_->SendSnapshots(*core_, Identity());
  return socket_.Send(m.peer, EncodeReply(ReplyTo(r, wire::INIT_REPLY, rank_)));
}

Status Server::HandlePush(const PsRequest& r, Message& m) {
  // The channel its values came on lets them go at once when the push is refused or is the rest
  // of a refused one (a lane's worker waits for that before it writes its next push there).
  ShardChannel& channel = channels_->For(r);
  if (core_->intake().IsRestOfFailed(r.worker, r)) {  // the rest of a push whose error was the answer
    channel.Refuse(r);
    return OkStatus();
  }
  Status s = HandlePushMessage(r, m, channel);
  if (!s.ok()) {
    core_->intake().Refused(r.worker, r);
    channel.Refuse(r);
  }
  return s;
}

Status Server::HandleAttach(const PsRequest& r, const Message& m) {
  if (!built()) return FailedPreconditionError("not initialized (worker 0 sends INIT first)");
  ASSIGN_OR_RETURN(PsReply reply, channels_->Attach(r, core_->shard(), CurveEnabled(ctx_)));
  core_->intake().ForgetParts(r.worker);  // a half-sent push of it is not finished by the new channel
  return socket_.Send(m.peer, EncodeReply(reply));
}

void Server::DetachWorker(int w) {
  channels_->Detach(w);  // a push of it still held keeps its values through its lease
  core_->intake().ForgetParts(w);  // a half-sent push of a worker that left
}

Result<PushChunk> Server::ReadPush(const PsRequest& r, Message& m, ShardChannel& channel) {
  if (!built()) return FailedPreconditionError("not initialized (worker 0 sends INIT first)");
  const int w = r.worker;
  ASSIGN_OR_RETURN(PushValues in, channel.Push(r, m, core_->shard()));
  const auto keys = m.Keys(&key_buffer_);
  size_t n = in.n;
  const float* values = in.values;
  // Ranges and keys; a raw push's value count too (a compressed one's is its codec's business).
  {
    TraceSpan span("validate", "server", {{"worker", static_cast<double>(w)}, {"values", static_cast<double>(n)}});
    RETURN_IF_ERROR(core_->shard().Validate(r.segments, keys, r.codec.empty() ? &n : nullptr));
    RETURN_IF_ERROR(core_->shard().ValidateAbsent(r.segments, r.absent_tensors));
  }
  if (!r.codec.empty()) {
    // A compressed push: decoded (and so validated) before it can touch anything.
    if (!keys.empty() && r.codec == codecs_.spec()) return InvalidArgumentError("a compressed push carries no keys");
    n = static_cast<size_t>(TotalSize(r.segments));
    ASSIGN_OR_RETURN(values, codecs_.Decode(r, m, n));
  }
  PushChunk chunk;
  if (in.lease) {
    chunk.segments = r.segments;  // where the channel lent them (a lane, a data channel's frame),
    chunk.shared = values;        // held by the lease until the chunk goes
    chunk.lease = std::move(in.lease);
  } else {
    chunk = TakeChunk(r.segments, keys, &m.values, values, n, codecs_.decoded());
  }
  chunk.absent = r.absent_tensors;
  return chunk;
}

Status Server::HandlePushMessage(const PsRequest& r, Message& m, ShardChannel& channel) {
  ASSIGN_OR_RETURN(PushChunk chunk, ReadPush(r, m, channel));
  const size_t num_keys = chunk.keys.size();
  ASSIGN_OR_RETURN(HeldPush * push, core_->Accept(r, std::move(chunk), num_keys));
  if (push == nullptr) return OkStatus();  // more parts to come
  const int w = r.worker;
  // Accepted: acknowledge before applying (BytePS's recipe), so that the worker's next request
  // is on its way while the update runs; requests from one worker are still handled in order.
  const int64_t lag = core_->shard().version() - r.version;
  stats_.version_lag[lag]++;
  stats_.pushes++;
  PsReply reply = ReplyTo(r, wire::PUSH_REPLY, rank_);
  reply.version_lag = lag;
  // With backups it is acknowledged once every one holds it (its entries go as the core takes
  // it): no acknowledged push lives on this server alone.
  const bool replicated = replication_->active();
  Status s = replicated ? OkStatus() : socket_.Send(m.peer, EncodeReply(reply));
  {
    std::optional<TraceSpan> span;
    if (!core_->rule().aggregates()) {
      span.emplace("apply", "server", std::initializer_list<TraceArg>{
          {"worker", static_cast<double>(w)}, {"clock", static_cast<double>(r.clock)},
          {"version", static_cast<double>(core_->shard().version())}});
    }
    core_->Take(w, std::move(*push), lag);  // held for its round, or applied now
  }
  if (replicated) replication_->HoldReply(m.peer, EncodeReply(reply));
  if (!core_->rule().aggregates()) MaybeCheckpoint(true);
  if (core_->rule().RoundComplete()) ApplyRound();
  AnswerParked();
  return s;
}

void Server::ApplyRound() {
  if (core_->ApplyRound().pushes > 0) MaybeCheckpoint(true);  // between rounds: nothing is held
}

Status Server::HandlePull(PsRequest r, Message& m) {
  if (!built()) return FailedPreconditionError("not initialized (worker 0 sends INIT first)");
  if (r.has_values) return InvalidArgumentError("a pull carries no values");
  const auto keys = m.Keys(&key_buffer_);
  RETURN_IF_ERROR(codecs_.CheckPull(r, !keys.empty()));
  RETURN_IF_ERROR(core_->shard().Validate(r.segments, keys, nullptr));
  RETURN_IF_ERROR(channels_->For(r).CheckPull(r, !keys.empty()));
  RETURN_IF_ERROR(core_->rule().ValidatePull(r.worker, r.clock));
  if (core_->rule().CanAnswerPull(r.worker, r.clock)) {
    AnswerPull(r, m, keys, 0.0);
  } else if (auto blocker = core_->rule().Blocker(r.worker, r.clock)) {
    // A worker that ended training will never push what this pull waits for.
    return core_->rule().BlockedError(r.clock, *blocker);
  } else {
    parked_.Park(std::move(r), std::move(m), SteadyMs());
  }
  return OkStatus();
}

void Server::RecordPull(const PsRequest& r, int64_t clock_staleness) {
  stats_.pulls++;
  stats_.clock_staleness[clock_staleness]++;
  if (options_.record_pulls) {
    pull_log_.push_back({r.worker, r.clock, core_->rule().clocks().min_live_clock(), core_->rule().clocks().rounds_applied(),
                         core_->shard().version(), clock_staleness});
  }
}

void Server::AnswerPull(const PsRequest& r, const Message& m, std::span<const uint64_t> keys, double waited_ms) {
  const uint64_t n = keys.size() + TotalSize(r.segments);
  TraceSpan span("answer pull", "server", {{"worker", static_cast<double>(r.worker)}, {"clock", static_cast<double>(r.clock)},
                                           {"values", static_cast<double>(n)}});
  PsReply reply = ReplyTo(r, wire::PULL_REPLY, rank_);
  reply.version = core_->shard().version();
  reply.wait_ms = waited_ms;
  reply.clock_staleness = core_->rule().ClockStaleness(r.clock);
  reply.segments = r.segments;
  if (Status s = channels_->AnswerPull(r, m, reply, keys, core_->shard()); !s.ok()) return ReplyError(m, s);
  core_->Pulled(r.worker, r.segments);  // delay compensation: what this worker now computes on
  RecordPull(r, reply.clock_staleness);
}

void Server::AnswerParked() {
  const double now = SteadyMs();
  for (ParkedRequests::Due& due : parked_.TakeDue(core_->rule())) {
    ParkedRequests::Parked& p = due.parked;
    if (!due.refused.ok()) {
      GRADSYNC_LOG(WARNING) << "server " << rank_ << ": pull " << p.pull.clock << " of worker " << p.pull.worker
                            << " can never be answered: " << due.refused.message();
      ReplyError(p.msg, due.refused);
      continue;
    }
    if (Trace::on()) {
      // Held by the consistency rule until the push just counted let it through.
      const double held_us = (now - p.since_ms) * 1e3;
      Trace::Complete("pull held", "server", Trace::NowUs() - held_us, held_us,
                      {{"worker", static_cast<double>(p.pull.worker)}, {"clock", static_cast<double>(p.pull.clock)},
                       {"waited for worker", static_cast<double>(core_->intake().last_counted())}});
    }
    if (p.pull.type == wire::STATE_PULL) {
      AnswerStatePull(p.pull, p.msg);
    } else {
      AnswerPull(p.pull, p.msg, p.msg.Keys(&key_buffer_), now - p.since_ms);
    }
  }
  // Optimizer states waiting for their quiescent point.
  for (StateSets::Due& due : core_->state_sets().TakeDue(core_->rule())) {
    if (due.refused.ok()) {
      ApplyStateSet(std::move(due.set));
    } else {
      ReplyError(due.set.peer, due.set.first.request_id, due.set.first.clock, due.refused);
    }
  }
}

void Server::Handle(Message& m) {
  const MessageTag tag = TagOf(m.header);
  if (m.malformed.ok() && tag.type == wire::REPLICATE) {
    if (!replication_->HandleEntry(m, *scheduler_, socket_).ok()) stats_.rejected++;
    return;
  }
  if (!m.malformed.ok()) {
    stats_.malformed++;
    ReplyError(m, m.malformed);
    return;
  }
  TraceSpan span("receive", "server", {{"type", static_cast<double>(tag.type)},
                                       {"worker", static_cast<double>(tag.sender_rank)},
                                       {"clock", static_cast<double>(tag.clock)},
                                       {"bytes", static_cast<double>(m.values.size())}});
  auto r = DecodeRequest(m.header);
  Status s = r.ok() ? membership_.CheckSender(*r, m.peer, table_.workers_size(), core_->rule()) : r.status();
  if (s.ok()) {
    switch (r->type) {
      case wire::INIT: s = HandleInit(*r, m); break;
      case wire::PUSH: s = HandlePush(*r, m); break;
      case wire::PULL: s = HandlePull(std::move(*r), m); break;
      case wire::JOIN: s = HandleJoin(*r, m); break;
      case wire::CHANNEL_ATTACH: s = HandleAttach(*r, m); break;
      case wire::STATE_PULL: s = HandleStatePull(std::move(*r), m); break;
      case wire::STATE_PUSH: s = HandleStatePush(*r, m); break;
      default: s = InvalidArgumentError("a server does not handle message type " + std::to_string(r->type));
    }
  }
  if (!s.ok()) {
    TraceInstant("refused", "server", {{"code", static_cast<double>(s.code())}});
    ReplyError(m, s);
  }
}

void Server::Receive() {
  // The data socket's messages, at most 64 at a time. With backup links to watch as well, a
  // poll says which sockets have some; with the data socket alone ZeroMQ's blocking receive
  // waits for it (one system call to sleep in, where a poll and then a receive take several).
  int wait_ms = 20;
  if (replication_->on()) {
    std::vector<Socket*> sockets{&socket_};
    for (Socket* l : replication_->sockets()) sockets.push_back(l);
    auto ready = PollReadable(sockets, 20);
    if (!ready.ok()) GRADSYNC_LOG(WARNING) << ready.status();
    wait_ms = ready.ok() && !ready->empty() && ready->front() == 0 ? 0 : -1;
  }
  for (int k = 0; k < 64 && wait_ms >= 0; ++k) {
    auto m = socket_.Recv(k == 0 ? wait_ms : 0);
    if (m.ok()) Handle(*m);
    else break;
  }
}

std::optional<Status> Server::OnSchedulerNews() {
  if (static_cast<int64_t>(scheduler_->table().max_message_bytes()) > listening_) {
    if (Status s = ApplyMessageLimit(); !s.ok()) return s;
  }
  OnMembership();
  if (scheduler_->shutdown_requested()) return scheduler_->job_failure();
  if (scheduler_->health().ok()) return std::nullopt;
  // Paused past the heartbeat timeout (SIGSTOP, a stalled host): its shard is intact.
  if (scheduler_->health().code() == StatusCode::kAborted && built()) {
    Status s = Rejoin();
    if (s.ok()) return std::nullopt;
    return s;
  }
  return scheduler_->health();
}

Status Server::Run() {
  RETURN_IF_ERROR(Start());
  Status result;
  while (!stop_.load()) {
    Receive();
    replication_->Poll(socket_, *core_, Identity());
    MaybeCheckpoint(false);
    if (!membership_.News(*scheduler_)) continue;
    if (auto end = OnSchedulerNews()) {
      result = *end;
      break;
    }
  }
  Finish();
  return result;
}

}  // namespace gradsync
