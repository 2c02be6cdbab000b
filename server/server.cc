#include "server/server.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <future>
#include <sstream>

#include "common/cluster.h"
#include "common/logging.h"
#include "common/security.h"
#include "common/trace.h"

namespace gradsync {
namespace {
double NowMs() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

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
  ReplyError(m.peer, m.header.request_id(), m.header.clock(), s);
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

Status Server::CheckSender(const PsRequest& r, const std::string& peer) {
  const int w = r.worker;
  if (w < 0 || w >= table_.workers_size()) {
    return InvalidArgumentError("unregistered sender: worker " + std::to_string(w) + " is not in the job");
  }
  if (r.type == wire::JOIN && !core_->rule().IsLive(w)) {
    // A restarted worker: only once the scheduler has announced it (then its new connection
    // takes the rank over); before that it may simply be early, so it retries.
    if (!may_join_.count(w)) {
      return UnavailableError("worker " + std::to_string(w) + " has not been announced as rejoined yet; retry");
    }
    identity_of_worker_[w] = peer;
    return OkStatus();
  }
  auto it = identity_of_worker_.find(w);
  if (it == identity_of_worker_.end()) {
    identity_of_worker_[w] = peer;  // first contact binds the connection to the rank
  } else if (it->second != peer) {
    return InvalidArgumentError("unregistered sender: another connection already speaks for worker " +
                                std::to_string(w));
  }
  // A worker that left the consistency rule (join) still pulls; the controller refuses its pushes.
  if (!core_->rule().IsLive(w) && !core_->rule().HasLeft(w)) {
    return FailedPreconditionError("worker " + std::to_string(w) + " was declared dead");
  }
  return OkStatus();
}

Status Server::HandleJoin(const PsRequest& r, const Message& m) {
  if (!built()) return UnavailableError("not initialized yet; retry");
  const int w = r.worker;
  const int64_t clock = r.clock;
  if (clock < -1) return InvalidArgumentError("JOIN with clock " + std::to_string(clock));
  if (!core_->rule().IsLive(w)) {
    // A rejoining worker: live from now on, at the clock where it holds no one back.
    const int64_t start = core_->rule().Suggest(w);
    core_->rule().SetWorker(w, start);
    Replicate(wire::REPLICA_CONTROL, w);
    may_join_.erase(w);
    if (pull_encoder_) pull_encoder_->Forget(w);  // its first pull is raw
    TraceInstant("worker rejoined", "failure", {{"worker", static_cast<double>(w)}, {"clock", static_cast<double>(start)}});
    GRADSYNC_LOG(WARNING) << "server " << rank_ << ": worker " << w << " rejoins at clock " << start << " ("
                          << core_->rule().live_workers() << " live workers)";
  }
  if (clock >= 0) {
    const int64_t at = core_->rule().pushed(w);
    if (clock < at) {
      return AbortedError("JOIN at clock " + std::to_string(clock) + " but worker " + std::to_string(w) +
                          " has pushed " + std::to_string(at) + " gradients to this shard");
    }
    if (stats_.restored && !resynced_.count(w)) {
      // What this restored shard lost of this worker: the pushes it had made past what was
      // restored (a checkpoint, a backup's copy), less any it sent again since.
      const int64_t lost = clock - at;
      stats_.lost_updates += lost;
      TraceInstant("worker resynced", "failure", {{"worker", static_cast<double>(w)}, {"clock", static_cast<double>(clock)},
                                                  {"lost pushes", static_cast<double>(lost)}});
      resynced_.insert(w);
      GRADSYNC_LOG(WARNING) << "server " << rank_ << ": worker " << w << " goes on at clock " << clock << "; "
                            << (lost == 0 ? std::string("nothing of it was lost")
                                          : "its " + std::to_string(lost) + " push(es) after what was restored were lost")
                            << " (restored at clock " << restored_pushed_[w] << ")";
    }
    if (clock > at) {
      core_->Drop(w);  // a held push of a round this worker now skips
      assembler_.Forget(w);
      core_->rule().SetWorker(w, clock);
      Replicate(wire::REPLICA_CONTROL, w);
    }
    while (core_->rule().RoundComplete()) ApplyRound();
    AnswerParked();
  }
  PsReply reply = ReplyTo(r, wire::JOIN_REPLY, rank_);
  reply.clock = core_->rule().pushed(w);
  reply.version = core_->shard().version();  // a push the worker sends next is computed on what it pulls now
  return socket_.Send(m.peer, EncodeReply(reply));
}

Status Server::BuildShard(const wire::JobConfig& job, const wire::ShardCheckpoint* from) {
  if (job.num_workers() != table_.workers_size()) {
    return InvalidArgumentError("INIT for " + std::to_string(job.num_workers()) + " workers; the job has " +
                                std::to_string(table_.workers_size()));
  }
  if (options_.apply_threads > 1 && !apply_pool_) apply_pool_ = std::make_unique<ParallelFor>(options_.apply_threads);
  if (from) {
    RETURN_IF_ERROR(core_->Restore(*from, table_.servers_size(), rank_, apply_pool_.get()));
  } else {
    RETURN_IF_ERROR(core_->Build(job, table_.servers_size(), rank_, apply_pool_.get()));
  }
  const OptimizerOptions opt = core_->shard().optimizer_options();
  const Segment range = core_->shard().range();
  std::unique_ptr<Compressor> codec, pull_codec;
  Status s;
  if (!job.compression().empty()) {
    auto c = CreateCompressor(job.compression(), job.compression_seed());
    if (c.ok()) codec = std::move(c).value();
    s = c.status();
  }
  if (s.ok() && job.compress_pull()) {
    auto c = codec ? CreateCompressor(job.compression(), job.compression_seed())
                   : Result<std::unique_ptr<Compressor>>(InvalidArgumentError("INIT: compress_pull needs a compression codec"));
    if (c.ok()) pull_codec = std::move(c).value();
    s = c.status();
  }
  if (!s.ok()) {
    core_->Reset();
    return s;
  }
  codec_ = std::move(codec);
  codec_spec_ = codec_ ? job.compression() : "";
  pull_encoder_ = pull_codec ? std::make_unique<PullDeltaEncoder>(std::move(pull_codec), range) : nullptr;
  staleness_aware_lr_ = job.staleness_aware_lr();
  GRADSYNC_LOG(INFO) << "server " << rank_ << ": holds [" << range.begin << ", " << range.end << ") of "
                     << job.num_params() << " parameters; lr " << job.lr() << " (" << job.lr_schedule() << "), "
                     << OptimizerText(opt);
  return OkStatus();
}

Status Server::HandleInit(const PsRequest& r, const Message& m) {
  if (r.worker != 0) return InvalidArgumentError("only worker 0 initializes the shards");
  if (built()) return FailedPreconditionError("already initialized");
  if (!r.codec.empty()) return InvalidArgumentError("INIT carries raw initial values, not a codec payload");
  if (!m.header.has_values()) return InvalidArgumentError("INIT carries the shard's initial values");
  const auto& job = r.job;
  if (job.num_params() > 0 && job.num_params() <= (uint64_t{1} << 34)) {
    const Segment range = Partitioner(static_cast<int64_t>(job.num_params()), table_.servers_size()).range(rank_);
    if (r.segments.size() != 1 || r.segments[0] != range || m.header.num_keys()) {
      return InvalidArgumentError("INIT must carry exactly this shard's range [" + std::to_string(range.begin) +
                                  ", " + std::to_string(range.end) + ")");
    }
  }
  RETURN_IF_ERROR(BuildShard(job));
  std::vector<float> values(static_cast<size_t>(core_->shard().range().size()));
  m.CopyValues(values.data());
  core_->shard().SetValues(values);
  // The first checkpoint at once: a shard killed before its first interval can still come back.
  if (checkpointer_.enabled()) WriteCheckpoint(NowMs() / 1e3);
  SendSnapshots();
  return socket_.Send(m.peer, EncodeReply(ReplyTo(r, wire::INIT_REPLY, rank_)));
}

Status Server::HandlePush(const PsRequest& r, Message& m) {
  auto drop_frame = [&] {
    if (!r.data || !data_) return;
    if (auto conn = data_->Find(r.worker)) conn->DropPush(r.data_seq);
  };
  // A shared-memory push's values stay in the worker's lane until this lease goes: once they are
  // read, or at once when the push is refused or is the rest of a failed one (the worker waits
  // for that before it writes the next push there, so no earlier push of it can still be held).
  std::shared_ptr<const float> lane = LaneLease(r);
  if (assembler_.IsRestOfFailed(r.worker, r)) {  // the rest of a push whose error was the answer
    drop_frame();
    return OkStatus();
  }
  Status s = HandlePushMessage(r, m, std::move(lane));
  if (!s.ok() && r.parts > 1) assembler_.Failed(r.worker, r);
  if (!s.ok()) drop_frame();  // nor does a refused push hold anything in the data channel
  return s;
}

std::shared_ptr<const float> Server::LaneLease(const PsRequest& r) {
  auto it = r.shm && r.shm_seq != 0 ? lanes_.find(r.worker) : lanes_.end();
  if (it == lanes_.end()) return nullptr;
  std::shared_ptr<ShmLane> lane = it->second;  // mapped while a push in it is held, even once detached
  const uint64_t seq = r.shm_seq;
  return std::shared_ptr<const float>(lane->push_area(), [lane, seq](const float*) { lane->Consume(seq); });
}

Status Server::HandleAttach(const PsRequest& r, const Message& m) {
  if (!built()) return FailedPreconditionError("not initialized (worker 0 sends INIT first)");
  if (m.header.has_values() || m.header.num_keys() > 0) return InvalidArgumentError("SHM_ATTACH carries no values");
  if (r.segments.size() != 1 || r.segments[0] != core_->shard().range()) {
    return InvalidArgumentError("a lane covers exactly this shard's range [" + std::to_string(core_->shard().range().begin) +
                                ", " + std::to_string(core_->shard().range().end) + ")");
  }
  ASSIGN_OR_RETURN(ShmLane lane, ShmLane::Attach(r.shm_name, core_->shard().range().size()));
  DetachLane(r.worker);
  lanes_[r.worker] = std::make_shared<ShmLane>(std::move(lane));
  stats_.shm_lanes = static_cast<int64_t>(lanes_.size());
  return socket_.Send(m.peer, EncodeReply(ReplyTo(r, wire::SHM_ATTACH_REPLY, rank_)));
}

Status Server::CheckLanePush(const PsRequest& r, const Message& m, size_t* n, const char* what) {
  if (m.header.num_keys() > 0 || !r.codec.empty()) {
    return InvalidArgumentError(std::string(what) + " push carries dense raw values only (no keys, no codec)");
  }
  if (r.segments.empty()) return InvalidArgumentError(std::string(what) + " push names no segments");
  for (size_t i = 1; i < r.segments.size(); ++i) {
    if (r.segments[i].begin != r.segments[i - 1].end) {
      return InvalidArgumentError(std::string(what) + " push's segments are not contiguous");
    }
  }
  // In the range, and so in the lane (or no larger than a frame may be).
  return core_->shard().Validate(r.segments, {}, n);
}

Result<const float*> Server::LaneValues(const PsRequest& r, const Message& m, size_t n) {
  auto it = lanes_.find(r.worker);
  if (it == lanes_.end()) return FailedPreconditionError("a shared-memory push, but worker " + std::to_string(r.worker) + " attached no lane");
  RETURN_IF_ERROR(CheckLanePush(r, m, &n, "a shared-memory"));
  return it->second->push_area() + (r.segments[0].begin - core_->shard().range().begin);
}

Status Server::HandleDataAttach(const PsRequest& r, const Message& m) {
  if (!built()) return FailedPreconditionError("not initialized (worker 0 sends INIT first)");
  if (m.header.has_values() || m.header.num_keys() > 0) return InvalidArgumentError("DATA_ATTACH carries no values");
  if (r.segments.size() != 1 || r.segments[0] != core_->shard().range()) {
    return InvalidArgumentError("a data channel covers exactly this shard's range [" +
                                std::to_string(core_->shard().range().begin) + ", " + std::to_string(core_->shard().range().end) + ")");
  }
  if (CurveEnabled(ctx_)) {
    return FailedPreconditionError("this job uses CURVE (--auth-dir): values stay on ZeroMQ, which encrypts them");
  }
  if (!data_) {
    const std::string host = options_.bind_host == "*" ? std::string("0.0.0.0") : options_.bind_host;
    ASSIGN_OR_RETURN(data_, DataListener::Create(host));
    GRADSYNC_LOG(INFO) << "server " << rank_ << ": data channel on port " << data_->port();
  }
  DetachLane(r.worker);  // one way for a worker's values at a time
  data_->Expect(r.data_token, r.worker, core_->shard().range().size());
  PsReply reply = ReplyTo(r, wire::DATA_ATTACH_REPLY, rank_);
  reply.data_port = data_->port();
  return socket_.Send(m.peer, EncodeReply(reply));
}

Result<std::shared_ptr<const float>> Server::DataValues(const PsRequest& r, const Message& m, size_t n) {
  // A worker does not write a frame into a channel the shard closed (DataStream::WriteFrame);
  // one that broke after the frame was written fails the push.
  auto conn = data_ ? data_->Find(r.worker) : nullptr;
  if (!conn) return FailedPreconditionError("a data-channel push, but worker " + std::to_string(r.worker) + " has no data channel");
  RETURN_IF_ERROR(CheckLanePush(r, m, &n, "a data-channel"));
  stats_.data_channels = static_cast<int64_t>(data_->size());
  // The worker wrote the frame before it sent this header: only its last bytes may be in flight.
  auto lease = conn->TakePush(r.data_seq, n, options_.data_wait_s);
  if (lease.ok() && ++data_pushes_ == options_.drop_data_channel_after_pushes) data_->Drop(r.worker);  // tests
  return lease;
}

void Server::DetachLane(int w) {
  if (data_) data_->Drop(w);
  if (!lanes_.erase(w)) return;
  // A push of it still held keeps the lane mapped through its lease until it is applied.
  assembler_.Forget(w);  // a half-sent push of a worker that left
  stats_.shm_lanes = static_cast<int64_t>(lanes_.size());
}

Status Server::HandlePushMessage(const PsRequest& r, Message& m, std::shared_ptr<const float> lane) {
  if (!built()) return FailedPreconditionError("not initialized (worker 0 sends INIT first)");
  const bool elsewhere = r.shm || r.data;  // the values are not in this message
  if (m.header.has_values() == elsewhere) {
    return InvalidArgumentError(r.shm    ? "a shared-memory push carries no values frame"
                                : r.data ? "a data-channel push carries no values frame"
                                         : "a push carries values");
  }
  const int w = r.worker;
  const auto keys = m.Keys(&key_buffer_);
  size_t n = elsewhere ? static_cast<size_t>(TotalSize(r.segments)) : m.num_values();
  const float* values = static_cast<const float*>(m.values.data());
  std::shared_ptr<const float> lease;
  if (r.shm) {
    ASSIGN_OR_RETURN(values, LaneValues(r, m, n));
    lease = std::move(lane);
  } else if (r.data) {
    ASSIGN_OR_RETURN(lease, DataValues(r, m, n));
    values = lease.get();
  }
  // Ranges and keys; a raw push's value count too (a compressed one's is its codec's business).
  {
    TraceSpan span("validate", "server", {{"worker", static_cast<double>(w)}, {"values", static_cast<double>(n)}});
    RETURN_IF_ERROR(core_->shard().Validate(r.segments, keys, r.codec.empty() ? &n : nullptr));
    RETURN_IF_ERROR(core_->shard().ValidateAbsent(r.segments, r.absent_tensors));
  }
  if (!r.codec.empty()) {
    // A compressed push: decoded (and so validated) before it can touch anything.
    if (!codec_ || r.codec != codec_spec_) {
      return InvalidArgumentError("push compressed with '" + r.codec + "' but this job uses '" +
                                  (codec_spec_.empty() ? std::string("none") : codec_spec_) + "'");
    }
    if (!keys.empty()) return InvalidArgumentError("a compressed push carries no keys");
    n = static_cast<size_t>(TotalSize(r.segments));
    decoded_.resize(n);
    TraceSpan span("decode", "server", {{"worker", static_cast<double>(w)}, {"bytes", static_cast<double>(m.values.size())}});
    RETURN_IF_ERROR(codec_->Decode(m.values.bytes(), n, static_cast<uint64_t>(r.clock), decoded_));
    values = decoded_.data();
  }
  if (r.version < 0 || r.version > core_->shard().version()) {
    return AbortedError("push computed on version " + std::to_string(r.version) + " but the shard is at " +
                        std::to_string(core_->shard().version()));
  }
  // A push (or each part of one) is checked against the consistency rule on arrival; it counts
  // with its last part.
  RETURN_IF_ERROR(core_->rule().CheckPush(w, r.clock));
  HeldPush whole;
  HeldPush* push = &whole;
  PushChunk chunk;
  if (elsewhere) {
    chunk.segments = r.segments;  // read in the lane, where the worker leaves them until the lease
    chunk.shared = values;        // goes, or in the data channel's frame, which the lease holds
    chunk.lease = std::move(lease);
  } else {
    chunk = TakeChunk(r.segments, keys, &m.values, values, n, &decoded_);
  }
  chunk.absent = r.absent_tensors;
  if (r.parts > 1) {
    RETURN_IF_ERROR(assembler_.Check(w, r, keys.size()));
    push = assembler_.Add(w, r, std::move(chunk));
    if (push == nullptr) return OkStatus();  // more parts to come
  } else {
    whole.chunks.push_back(std::move(chunk));
    whole.lr = r.lr;
  }
  core_->rule().CountPush(w);
  core_->Counted(w);
  // Accepted: acknowledge before applying (BytePS's recipe), so that the worker's next request
  // is on its way while the update runs; requests from one worker are still handled in order.
  const int64_t lag = core_->shard().version() - r.version;
  stats_.version_lag[lag]++;
  stats_.pushes++;
  PsReply reply = ReplyTo(r, wire::PUSH_REPLY, rank_);
  reply.version_lag = lag;
  const float scale = staleness_aware_lr_ && !core_->aggregates()
                          ? 1.0f / static_cast<float>(std::max<int64_t>(1, lag))
                          : 1.0f;
  Status s;
  if (replicator_ && replicator_->active()) {
    // Acknowledged once every backup holds it: no acknowledged push lives on this server alone.
    replicator_->Hold(ReplicatePush(w, *push, scale), m.peer, EncodeReply(reply));
  } else {
    s = socket_.Send(m.peer, EncodeReply(reply));
  }
  {
    std::optional<TraceSpan> span;
    if (!core_->aggregates()) {
      span.emplace("apply", "server", std::initializer_list<TraceArg>{
          {"worker", static_cast<double>(w)}, {"clock", static_cast<double>(r.clock)},
          {"version", static_cast<double>(core_->shard().version())}});
    }
    core_->Take(w, std::move(*push), scale);  // held for its round, or applied now
  }
  if (!core_->aggregates()) MaybeCheckpoint(true);
  assembler_.Forget(w);
  if (core_->rule().RoundComplete()) ApplyRound();
  AnswerParked();
  return s;
}

void Server::ApplyRound() {
  const ShardCore::Round round = core_->ApplyRound();
  if (replicator_ && replicator_->active()) {
    wire::Header h = Entry(wire::REPLICA_ROUND);
    if (!std::isnan(round.lr)) h.set_lr(round.lr);
    replicator_->Send(h);
    stats_.replicated++;
  }
  if (round.pushes > 0) MaybeCheckpoint(true);  // between rounds: nothing is held
}

void Server::MaybeCheckpoint(bool updated) {
  if (!checkpointer_.enabled() || !built()) return;
  const double now = NowMs() / 1e3;
  if (!checkpointer_.Due(updated, now)) return;
  if (core_->aggregates() && !core_->held().empty()) return;  // bsp: only between rounds
  WriteCheckpoint(now);
}

double Server::checkpoint_age_s() const {
  return stats_.last_checkpoint_s < 0 ? -1 : NowMs() / 1e3 - stats_.last_checkpoint_s;
}

void Server::WriteCheckpoint(double now_s) {
  TraceSpan span("checkpoint", "server", {{"version", static_cast<double>(core_->shard().version())}});
  if (Status s = checkpointer_.Write(rank_, table_, core_->job(), core_->shard(), core_->rule(), now_s); !s.ok()) {
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
  restored_pushed_.assign(c.pushed().begin(), c.pushed().end());
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

Status Server::HandlePull(PsRequest r, Message& m) {
  if (!built()) return FailedPreconditionError("not initialized (worker 0 sends INIT first)");
  if (m.header.has_values()) return InvalidArgumentError("a pull carries no values");
  const auto keys = m.Keys(&key_buffer_);
  if (!r.codec.empty()) {
    if (!pull_encoder_ || r.codec != codec_spec_) {
      return InvalidArgumentError("pull asks for '" + r.codec + "' deltas but this job " +
                                  (pull_encoder_ ? "compresses pulls with '" + codec_spec_ + "'"
                                                 : std::string("does not compress pulls (--compress-pull)")));
    }
    if (!keys.empty()) return InvalidArgumentError("a compressed pull carries no keys");
  }
  RETURN_IF_ERROR(core_->shard().Validate(r.segments, keys, nullptr));
  if (r.shm || r.data) {
    const char* what = r.shm ? "a shared-memory" : "a data-channel";
    if (!keys.empty() || !r.codec.empty() || pull_encoder_) {
      return InvalidArgumentError(std::string(what) + " pull asks for dense raw values only (no keys, no codec, " +
                                  "and not in a job with --compress-pull)");
    }
    if (r.shm && !lanes_.count(r.worker)) {
      return FailedPreconditionError("a shared-memory pull, but worker " + std::to_string(r.worker) + " attached no lane");
    }
    // A data-channel pull whose channel is gone (the worker may not know yet) is answered over
    // ZeroMQ, as one whose channel goes while it is parked (AnswerPullData).
  }
  RETURN_IF_ERROR(core_->rule().ValidatePull(r.worker, r.clock));
  if (core_->rule().CanAnswerPull(r.worker, r.clock)) {
    AnswerPull(r, m, keys, 0.0);
  } else if (auto blocker = core_->rule().Blocker(r.worker, r.clock)) {
    // A worker that ended training will never push what this pull waits for.
    return core_->rule().BlockedError(r.clock, *blocker);
  } else {
    parked_.push_back({std::move(m), std::move(r), NowMs()});
  }
  return OkStatus();
}

void Server::RecordPull(const PsRequest& r, int64_t clock_staleness) {
  stats_.pulls++;
  stats_.clock_staleness[clock_staleness]++;
  if (options_.record_pulls) {
    pull_log_.push_back({r.worker, r.clock, core_->rule().min_live_clock(), core_->rule().rounds_applied(),
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
  if (r.shm) return AnswerPullShm(r, m, std::move(reply));
  if (r.data && AnswerPullData(r, m, reply)) return;
  Payload p;
  p.has_values = true;
  Frame frame;
  if (!r.codec.empty()) {
    // --compress-pull: the delta against what the worker holds, once it holds the whole range.
    pull_current_.resize(n);
    core_->shard().Read(r.segments, {}, pull_current_.data());
    TraceSpan encode("encode", "server", {{"worker", static_cast<double>(r.worker)}, {"values", static_cast<double>(n)}});
    auto encoded = pull_encoder_->Encode(r.worker, r.segments, pull_current_, r.clock, &pull_payload_);
    encode.End();
    if (!encoded.ok()) GRADSYNC_LOG(ERROR) << "server " << rank_ << ": " << encoded.status();
    if (encoded.ok() && *encoded) {
      reply.codec = codec_spec_;
      frame = Frame::Copy(pull_payload_.data(), pull_payload_.size());
      p.values_frame = &frame;
      Status s = socket_.Send(m.peer, EncodeReply(reply), p);
      if (!s.ok()) GRADSYNC_LOG(WARNING) << "server " << rank_ << ": pull reply to worker " << r.worker << ": " << s;
      stats_.compressed_pulls++;
      RecordPull(r, reply.clock_staleness);
      return;
    }
  }
  if (keys.empty() && r.segments.size() == 1) {
    // One run: sent straight from the parameters, no copy. The reply holds them, so the next
    // update writes a fresh copy instead (KvShard::Share): the reply stays one version.
    const Segment& seg = r.segments[0];
    p.values = core_->shard().params().subspan(static_cast<size_t>(seg.begin - core_->shard().range().begin),
                                        static_cast<size_t>(seg.size()));
    p.owner = core_->shard().Share();
    if (pull_encoder_) pull_encoder_->Record(r.worker, r.segments, p.values.data());
    Status s = socket_.Send(m.peer, EncodeReply(reply), p);
    if (!s.ok()) GRADSYNC_LOG(WARNING) << "server " << rank_ << ": pull reply to worker " << r.worker << ": " << s;
    RecordPull(r, reply.clock_staleness);
    return;
  }
  // Several runs or keys: a snapshot (the shard may change before ZeroMQ has sent the bytes),
  // one copy into a pooled buffer that ZeroMQ sends without copying again.
  LentBufferPool::Buffer* buf = reply_pool_.Acquire(n);
  float* dst = nullptr;
  if (buf) {
    dst = buf->values.data();
  } else {
    frame = Frame(n * sizeof(float));
    dst = static_cast<float*>(frame.data());
  }
  core_->shard().Read(r.segments, keys, dst);
  if (pull_encoder_ && keys.empty()) pull_encoder_->Record(r.worker, r.segments, dst);
  // Keys are echoed, so that a reply describes itself.
  if (buf) {
    buf->keys.assign(keys.begin(), keys.end());  // lent frames must outlive this function
    p.values = std::span<const float>(buf->values.data(), n);
    p.keys = buf->keys;
    p.lent = buf->inflight;
  } else {
    p.values_frame = &frame;
    p.keys = keys;
  }
  Status s = socket_.Send(m.peer, EncodeReply(reply), p);
  if (!s.ok()) GRADSYNC_LOG(WARNING) << "server " << rank_ << ": pull reply to worker " << r.worker << ": " << s;
  RecordPull(r, reply.clock_staleness);
}

bool Server::AnswerPullData(const PsRequest& r, const Message& m, PsReply& reply) {
  auto conn = data_ ? data_->Find(r.worker) : nullptr;
  if (!conn || !conn->health().ok()) return false;  // gone while the pull was parked: over ZeroMQ
  // One run: written straight from the parameters, which the frame holds (KvShard::Share) so
  // the next update writes a fresh copy; several: one snapshot.
  std::vector<std::span<const float>> values;
  std::shared_ptr<const void> owner;
  const int64_t base = core_->shard().range().begin;
  if (r.segments.size() == 1) {
    const Segment& seg = r.segments[0];
    values.push_back(core_->shard().params().subspan(static_cast<size_t>(seg.begin - base), static_cast<size_t>(seg.size())));
    owner = core_->shard().Share();
  } else {
    auto snapshot = std::make_shared<std::vector<float>>(static_cast<size_t>(TotalSize(r.segments)));
    core_->shard().Read(r.segments, {}, snapshot->data());
    values.push_back(*snapshot);
    owner = std::move(snapshot);
  }
  // Tests: this pull's frame is never sent, and the channel goes.
  const bool drop = stats_.data_pulls + 1 == options_.drop_data_channel_after_pulls;
  auto seq = drop ? Result<uint64_t>(uint64_t{1}) : conn->SendPull(std::move(values), std::move(owner));
  if (!seq.ok()) return false;
  reply.data = true;
  reply.data_seq = *seq;
  Status s = socket_.Send(m.peer, EncodeReply(reply));
  if (!s.ok()) GRADSYNC_LOG(WARNING) << "server " << rank_ << ": pull reply to worker " << r.worker << ": " << s;
  stats_.data_pulls++;
  if (drop) {
    conn.reset();
    data_->Drop(r.worker);
  }
  stats_.data_channels = static_cast<int64_t>(data_->size());
  RecordPull(r, reply.clock_staleness);
  return true;
}

void Server::AnswerPullShm(const PsRequest& r, const Message& m, PsReply reply) {
  auto it = lanes_.find(r.worker);
  if (it == lanes_.end()) {  // detached while the pull was parked
    ReplyError(m, FailedPreconditionError("worker " + std::to_string(r.worker) + "'s lane is gone"));
    return;
  }
  // In pieces, each announced as soon as it is written: the worker copies one piece out while
  // the next is written, so a large pull costs about one copy's time, not two. All pieces are
  // written before anything else is handled: the answer is one version.
  const int64_t total = static_cast<int64_t>(TotalSize(r.segments));
  const int64_t piece = std::clamp<int64_t>(total / 8, int64_t{1} << 16, int64_t{1} << 20);
  std::vector<Segment> pieces;
  for (const Segment& seg : r.segments) {
    for (int64_t b = seg.begin; b < seg.end; b += piece) pieces.push_back({b, std::min(seg.end, b + piece)});
  }
  if (pieces.empty()) pieces.push_back({core_->shard().range().begin, core_->shard().range().begin});
  float* area = it->second->pull_area();
  const int64_t base = core_->shard().range().begin;
  reply.shm = true;
  reply.parts = pieces.size() > 1 ? static_cast<int>(pieces.size()) : 0;
  for (size_t i = 0; i < pieces.size(); ++i) {
    const Segment& one = pieces[i];
    float* dst = area + (one.begin - base);
    core_->shard().Read({&one, 1}, {}, dst);
    reply.part = reply.parts > 1 ? static_cast<int>(i) : 0;
    reply.segments = {one};
    Status s = socket_.Send(m.peer, EncodeReply(reply));
    if (!s.ok()) {
      GRADSYNC_LOG(WARNING) << "server " << rank_ << ": pull reply to worker " << r.worker << ": " << s;
      break;
    }
  }
  stats_.shm_pulls++;
  RecordPull(r, reply.clock_staleness);
}

void Server::AnswerParked() {
  const double now = NowMs();
  for (auto it = parked_.begin(); it != parked_.end();) {
    if (!core_->rule().IsLive(it->pull.worker) && !core_->rule().HasLeft(it->pull.worker)) {
      it = parked_.erase(it);  // a dead worker's
      continue;
    }
    if (core_->rule().CanAnswerPull(it->pull.worker, it->pull.clock)) {
      if (Trace::on()) {
        // Held by the consistency rule until the push just counted let it through.
        const double held_us = (now - it->since) * 1e3;
        Trace::Complete("pull held", "server", Trace::NowUs() - held_us, held_us,
                        {{"worker", static_cast<double>(it->pull.worker)}, {"clock", static_cast<double>(it->pull.clock)},
                         {"waited for worker", static_cast<double>(core_->last_counted())}});
      }
      if (it->pull.type == wire::STATE_PULL) {
        AnswerStatePull(it->pull, it->msg);
      } else {
        AnswerPull(it->pull, it->msg, it->msg.Keys(&key_buffer_), now - it->since);
      }
      it = parked_.erase(it);
    } else if (auto blocker = core_->rule().Blocker(it->pull.worker, it->pull.clock)) {
      // It waited for a worker that has ended training since: it would wait forever.
      const Status s = core_->rule().BlockedError(it->pull.clock, *blocker);
      GRADSYNC_LOG(WARNING) << "server " << rank_ << ": pull " << it->pull.clock << " of worker " << it->pull.worker
                            << " can never be answered: " << s.message();
      ReplyError(it->msg, s);
      it = parked_.erase(it);
    } else {
      ++it;
    }
  }
  // Optimizer states waiting for their quiescent point.
  for (auto it = state_sets_.begin(); it != state_sets_.end();) {
    const int w = it->first;
    const bool live = core_->rule().IsLive(w) || core_->rule().HasLeft(w);  // not a dead worker's
    const bool due = it->second.complete && core_->rule().CanAnswerPull(w, it->second.first.clock);
    const std::optional<int> blocker =
        it->second.complete && !due ? core_->rule().Blocker(w, it->second.first.clock) : std::nullopt;
    ++it;  // each below erases w's entry
    if (!live) {
      state_sets_.erase(w);
    } else if (due) {
      ApplyStateSet(w);
    } else if (blocker) {
      // A worker that ended training since makes its point never come.
      const StateSet set = std::move(state_sets_[w]);
      state_sets_.erase(w);
      ReplyError(set.peer, set.first.request_id, set.first.clock, core_->rule().BlockedError(set.first.clock, *blocker));
    }
  }
}

Status Server::CheckStateRequest(const PsRequest& r, const Message& m) {
  if (!built()) return FailedPreconditionError("not initialized (worker 0 sends INIT first)");
  const std::string kind = OptimizerKindName(core_->shard().optimizer_options().kind);
  if (!r.optimizer.empty() && r.optimizer != kind) {
    return InvalidArgumentError("the optimizer state is " + r.optimizer + "'s, but this shard's optimizer is " + kind);
  }
  if (m.header.num_keys() > 0 || !r.codec.empty() || r.shm || r.data) {
    return InvalidArgumentError("an optimizer state message carries raw floats over ZeroMQ (no keys, codec, lane or channel)");
  }
  const bool values = r.type == wire::STATE_PUSH && r.state_slots > 0;
  if (m.header.has_values() != values) {
    return InvalidArgumentError(values ? "a STATE_PUSH carries its state vector" : "this optimizer state message carries no values");
  }
  const Segment range = core_->shard().range();
  const bool ranged = r.type == wire::STATE_PULL || values;
  if (ranged ? r.segments.size() != 1 || r.segments[0] != range : !r.segments.empty()) {
    return InvalidArgumentError("an optimizer state message " +
                                std::string(ranged ? "covers exactly this shard's range [" + std::to_string(range.begin) +
                                                         ", " + std::to_string(range.end) + ")"
                                                   : "without a state vector names no segments"));
  }
  // The worker's current clock: its pushes so far (older or newer: kAborted, as a pull's).
  return core_->rule().ValidatePull(r.worker, r.clock);
}

Status Server::HandleStatePull(PsRequest r, Message& m) {
  RETURN_IF_ERROR(CheckStateRequest(r, m));
  if (core_->rule().CanAnswerPull(r.worker, r.clock)) {
    AnswerStatePull(r, m);
  } else if (auto blocker = core_->rule().Blocker(r.worker, r.clock)) {
    return core_->rule().BlockedError(r.clock, *blocker);  // its point never comes
  } else {
    parked_.push_back({std::move(m), std::move(r), NowMs()});
  }
  return OkStatus();
}

void Server::AnswerStatePull(const PsRequest& r, const Message& m) {
  const int slots = core_->shard().optimizer_slots();
  const auto state = core_->shard().optimizer_state();
  const Segment range = core_->shard().range();
  const size_t n = static_cast<size_t>(range.size());
  PsReply reply = ReplyTo(r, wire::STATE_PULL_REPLY, rank_);
  reply.version = core_->shard().version();
  reply.optimizer = OptimizerKindName(core_->shard().optimizer_options().kind);
  reply.steps = core_->shard().optimizer_steps();
  reply.skipped.assign(core_->shard().optimizer_skipped().begin(), core_->shard().optimizer_skipped().end());
  reply.state_slots = slots;
  // Every vector before anything else is handled: the answer is one state. (Copied into the
  // messages: the next update may change the state while ZeroMQ still sends them.)
  for (int k = 0; k < std::max(1, slots); ++k) {
    reply.state_slot = k;
    Payload p;
    if (slots > 0) {
      reply.segments = {range};
      p.has_values = true;
      p.values = state.subspan(static_cast<size_t>(k) * n, n);
    }
    if (Status s = socket_.Send(m.peer, EncodeReply(reply), p); !s.ok()) {
      GRADSYNC_LOG(WARNING) << "server " << rank_ << ": optimizer state to worker " << r.worker << ": " << s;
      break;
    }
  }
  stats_.state_pulls++;
}

Status Server::HandleStatePush(const PsRequest& r, const Message& m) {
  const int w = r.worker;
  auto refuse = [&](Status s) {
    state_sets_.erase(w);  // a bad vector drops the whole set: nothing of it is applied
    return s;
  };
  if (Status s = CheckStateRequest(r, m); !s.ok()) return refuse(s);
  const OptimizerKind kind = core_->shard().optimizer_options().kind;
  const int slots = core_->shard().optimizer_slots();
  if (r.state_slots != slots) {
    std::string names;
    for (const auto& name : OptimizerSlotNames(core_->shard().optimizer_options())) names += (names.empty() ? "" : ", ") + name;
    return refuse(InvalidArgumentError("an optimizer state of " + std::to_string(r.state_slots) +
                                       " vector(s); this shard's " + OptimizerKindName(kind) + " keeps " +
                                       std::to_string(slots) + (names.empty() ? "" : " (" + names + ")")));
  }
  const size_t n = static_cast<size_t>(core_->shard().range().size());
  StateSet* set = nullptr;
  if (r.state_slot == 0) {
    StateSet fresh;
    fresh.peer = m.peer;
    fresh.first = r;
    fresh.state.assign(static_cast<size_t>(slots) * n, 0.0f);
    set = &(state_sets_[w] = std::move(fresh));
  } else {
    auto it = state_sets_.find(w);
    if (it == state_sets_.end() || it->second.complete || it->second.next != r.state_slot ||
        it->second.first.request_id != r.request_id || it->second.first.clock != r.clock ||
        it->second.first.steps != r.steps || it->second.first.skipped != r.skipped ||
        it->second.first.optimizer != r.optimizer) {
      return refuse(InvalidArgumentError("optimizer state vector " + std::to_string(r.state_slot) + " of " +
                                         std::to_string(slots) +
                                         " is not the next of the set this worker sends (vectors 0, 1, ... of one "
                                         "request, in order)"));
    }
    set = &it->second;
  }
  if (slots > 0) {
    float* dst = set->state.data() + static_cast<size_t>(r.state_slot) * n;
    m.CopyValues(dst);
    if (Status s = CheckOptimizerSlot(kind, r.state_slot, {dst, n}); !s.ok()) return refuse(s);
  }
  set->next = r.state_slot + 1;
  if (set->next < std::max(1, slots)) {
    PsReply reply = ReplyTo(r, wire::STATE_PUSH_REPLY, rank_);
    reply.version = core_->shard().version();
    reply.optimizer = r.optimizer;
    reply.steps = r.steps;
    reply.state_slots = slots;
    reply.state_slot = r.state_slot;
    return socket_.Send(m.peer, EncodeReply(reply));
  }
  set->complete = true;
  // At its quiescent point: as a pull of this clock is answered (aggregating modes: between rounds
  // clock - 1 and clock, which cannot be applied before this worker pushes clock).
  if (core_->rule().CanAnswerPull(w, r.clock)) {
    ApplyStateSet(w);
  } else if (auto blocker = core_->rule().Blocker(w, r.clock)) {
    return refuse(core_->rule().BlockedError(r.clock, *blocker));  // its point never comes
  }
  return OkStatus();
}

void Server::ApplyStateSet(int w) {
  auto it = state_sets_.find(w);
  if (it == state_sets_.end()) return;
  const StateSet set = std::move(it->second);
  state_sets_.erase(it);
  const PsRequest& r = set.first;
  if (Status s = core_->shard().SetOptimizerState(set.state, r.steps, r.skipped); !s.ok()) {
    ReplyError(set.peer, r.request_id, r.clock, s);
    return;
  }
  stats_.state_sets++;
  GRADSYNC_LOG(INFO) << "server " << rank_ << ": worker " << w << " set the " << r.optimizer << " state at clock "
                     << r.clock << " (" << r.steps << " optimizer steps taken)";
  PsReply reply = ReplyTo(r, wire::STATE_PUSH_REPLY, rank_);
  reply.version = core_->shard().version();
  reply.optimizer = r.optimizer;
  reply.steps = r.steps;
  reply.state_slots = r.state_slots;
  reply.state_slot = std::max(0, r.state_slots - 1);
  if (replicator_ && replicator_->active()) {
    // Answered once every backup holds it, as an accepted push is.
    replicator_->Hold(ReplicateOptimizerState(w), set.peer, EncodeReply(reply));
  } else if (Status s = socket_.Send(set.peer, EncodeReply(reply)); !s.ok()) {
    GRADSYNC_LOG(WARNING) << "server " << rank_ << ": optimizer state reply to worker " << w << ": " << s;
  }
  MaybeCheckpoint(true);  // a change of the shard's state, as an update: in the next checkpoint
}

uint64_t Server::ReplicateOptimizerState(int worker) {
  const int slots = core_->shard().optimizer_slots();
  const auto state = core_->shard().optimizer_state();
  const Segment range = core_->shard().range();
  const size_t n = static_cast<size_t>(range.size());
  uint64_t seq = replicator_->last_seq();
  for (int k = 0; k < std::max(1, slots); ++k) {
    wire::Header h = Entry(wire::REPLICA_OPTIMIZER);
    h.set_replica_worker(worker);
    h.set_replica_part(k);
    h.set_state_optimizer(OptimizerKindName(core_->shard().optimizer_options().kind));
    h.set_state_steps(core_->shard().optimizer_steps());
    h.mutable_state_skipped()->Assign(core_->shard().optimizer_skipped().begin(), core_->shard().optimizer_skipped().end());
    h.set_state_slots(slots);
    Payload p;
    if (slots > 0) {
      auto* seg = h.add_segments();
      seg->set_offset(static_cast<uint64_t>(range.begin));
      seg->set_length(static_cast<uint64_t>(range.size()));
      p.has_values = true;
      p.values = state.subspan(static_cast<size_t>(k) * n, n);
    }
    seq = replicator_->Send(h, p);
    stats_.replicated++;
  }
  return seq;
}

void Server::OnMembership() {
  auto dead = scheduler_->dead_nodes();
  for (; seen_dead_ < dead.size(); ++seen_dead_) {
    const auto& n = dead[seen_dead_];
    if (n.role() == wire::WORKER) {
      GRADSYNC_LOG(WARNING) << "server " << rank_ << ": " << NodeName(n) << " is dead; continuing with "
                            << core_->rule().live_workers() - 1 << " live workers";
      TraceInstant("worker declared dead", "failure", {{"worker", static_cast<double>(n.rank())}});
      core_->rule().RemoveWorker(n.rank());
      may_join_.erase(n.rank());
      state_sets_.erase(n.rank());
      DetachLane(n.rank());
      assembler_.Forget(n.rank());
      Replicate(wire::REPLICA_CONTROL);
    } else if (n.role() == wire::SERVER && n.rank() != rank_) {
      UpdateBackups();
      // Every dead shard again, not only this one: the backup that was to take one over may
      // have died with it (its process), and be declared dead only now.
      for (int r = 0; replicas_ && r < table_.servers_size(); ++r) {
        if (scheduler_->IsDead(wire::SERVER, r)) MaybeAdopt(r);
      }
    }
  }
  auto joined = scheduler_->joined_nodes();
  for (; seen_joined_ < joined.size(); ++seen_joined_) {
    const auto& n = joined[seen_joined_];
    if (n.role() == wire::SERVER) UpdateBackups();  // a backup at a new address: a new link, a snapshot
    if (n.role() != wire::WORKER) continue;
    // Its new connection will JOIN; the old one no longer speaks for the rank.
    identity_of_worker_.erase(n.rank());
    may_join_.insert(n.rank());
  }
  auto ended = scheduler_->ended_workers();
  for (; seen_ended_ < ended.size(); ++seen_ended_) {
    const EndedWorker& e = ended[seen_ended_];
    if (e.rank < 0 || e.rank >= core_->rule().num_workers()) continue;
    core_->rule().EndAt(e.rank, e.clock);
    // A worker that leaves is out of the rounds and the minimum clock, as a dead one is (its push
    // of the open round stays in it), but may still pull. Not one that is dead by now.
    const bool leaves = e.joined && !scheduler_->IsDead(wire::WORKER, e.rank) && !core_->rule().HasLeft(e.rank);
    if (leaves) {
      core_->rule().Leave(e.rank);
      Replicate(wire::REPLICA_CONTROL);
    }
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

void Server::Handle(Message& m) {
  if (m.malformed.ok() && m.header.type() == wire::REPLICATE) return HandleReplicate(m);
  if (!m.malformed.ok()) {
    stats_.malformed++;
    ReplyError(m, m.malformed);
    return;
  }
  TraceSpan span("receive", "server", {{"type", static_cast<double>(m.header.type())},
                                       {"worker", static_cast<double>(m.header.sender_rank())},
                                       {"clock", static_cast<double>(m.header.clock())},
                                       {"bytes", static_cast<double>(m.values.size())}});
  auto r = DecodeRequest(m.header);
  Status s = r.ok() ? CheckSender(*r, m.peer) : r.status();
  if (s.ok()) {
    switch (r->type) {
      case wire::INIT: s = HandleInit(*r, m); break;
      case wire::PUSH: s = HandlePush(*r, m); break;
      case wire::PULL: s = HandlePull(std::move(*r), m); break;
      case wire::JOIN: s = HandleJoin(*r, m); break;
      case wire::SHM_ATTACH: s = HandleAttach(*r, m); break;
      case wire::DATA_ATTACH: s = HandleDataAttach(*r, m); break;
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
  seen_events_ = 0;
  seen_dead_ = seen_joined_ = seen_ended_ = 0;
  // Nothing is served before the job is complete (workers connect after it), but what strangers
  // send meanwhile must not pile up unread in the data socket: it is read and dropped.
  auto registered = std::async(std::launch::async, [&] { return scheduler_->Register(options_.register_timeout_s); });
  while (registered.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
    if (auto m = socket_.Recv(20); m.ok()) stats_.rejected++;
  }
  ASSIGN_OR_RETURN(table_, registered.get());
  rank_ = scheduler_->rank();
  standby_ = rank_ >= table_.servers_size();
  return OkStatus();
}

wire::Header Server::Entry(wire::ReplicaOp op) const {
  wire::Header h;
  h.set_replica_op(op);
  h.set_replica_worker(-1);
  h.mutable_replica_pushed()->Assign(core_->rule().pushed_all().begin(), core_->rule().pushed_all().end());
  for (bool l : core_->rule().live_all()) h.add_replica_live(l);
  h.set_replica_rounds(core_->rule().rounds_applied());
  return h;
}

void Server::Replicate(wire::ReplicaOp op, int worker) {
  if (!replicator_ || !replicator_->active() || !built()) return;
  wire::Header h = Entry(op);
  h.set_replica_worker(worker);
  replicator_->Send(h);
  stats_.replicated++;
}

wire::Header Server::PushEntry(int worker, const PushChunk& c, bool last, float lr, float scale, Payload* p) const {
  wire::Header h = Entry(wire::REPLICA_PUSH);
  h.set_replica_worker(worker);
  h.set_replica_scale(scale);
  h.set_replica_counts(last);
  if (!std::isnan(lr)) h.set_lr(lr);
  h.mutable_absent_tensors()->Assign(c.absent.begin(), c.absent.end());
  for (const Segment& seg : c.segments) {
    auto* out = h.add_segments();
    out->set_offset(static_cast<uint64_t>(seg.begin));
    out->set_length(static_cast<uint64_t>(seg.size()));
  }
  p->has_values = true;
  p->keys = c.keys;
  p->values = std::span<const float>(c.values(), static_cast<size_t>(TotalSize(c.segments)) + c.keys.size());
  return h;
}

uint64_t Server::ReplicatePush(int worker, const HeldPush& push, float scale) {
  uint64_t seq = replicator_->last_seq();
  for (size_t i = 0; i < push.chunks.size(); ++i) {
    Payload p;
    const wire::Header h = PushEntry(worker, push.chunks[i], i + 1 == push.chunks.size(), push.lr, scale, &p);
    seq = replicator_->Send(h, p);
    stats_.replicated++;
  }
  return seq;
}

void Server::SendSnapshots() {
  if (!replicator_ || !built()) return;
  for (int b : replicator_->NeedSnapshot()) {
    wire::ShardCheckpoint meta = core_->Snapshot(IdentityOf(rank_, table_));
    meta.clear_params();
    meta.clear_optimizer_state();
    wire::Header h = Entry(wire::REPLICA_META);
    h.set_replica_meta(meta.SerializeAsString());
    replicator_->SendSnapshotEntry(b, h);
    const Segment range = core_->shard().range();
    auto whole = [&](wire::ReplicaOp op, std::span<const float> values, int part) {
      wire::Header e = Entry(op);
      e.set_replica_part(part);
      auto* seg = e.add_segments();
      seg->set_offset(static_cast<uint64_t>(range.begin));
      seg->set_length(static_cast<uint64_t>(range.size()));
      Payload p;
      p.has_values = true;
      p.values = values;
      replicator_->SendSnapshotEntry(b, e, p);
    };
    whole(wire::REPLICA_PARAMS, core_->shard().params(), 0);
    const auto state = core_->shard().optimizer_state();
    const size_t n = static_cast<size_t>(range.size());
    for (size_t k = 0; n > 0 && (k + 1) * n <= state.size(); ++k) whole(wire::REPLICA_STATE, state.subspan(k * n, n), static_cast<int>(k));
    // The open round's pushes (bsp): acknowledged, so the copy must hold them too.
    for (const auto& [worker, held] : core_->held()) {
      for (size_t i = 0; i < held.chunks.size(); ++i) {
        Payload p;
        const wire::Header e = PushEntry(worker, held.chunks[i], i + 1 == held.chunks.size(), held.lr, 1.0f, &p);
        replicator_->SendSnapshotEntry(b, e, p);
      }
    }
    replicator_->SnapshotSent(b);
    GRADSYNC_LOG(INFO) << "server " << rank_ << ": sent a snapshot (version " << core_->shard().version() << ") to backup server "
                       << b;
  }
}

void Server::UpdateBackups() {
  if (!replicator_) return;
  const int servers = table_.servers_size();
  const wire::ClusterTable now = scheduler_->table();
  std::map<int, wire::NodeInfo> backups;
  for (const int r : standby_ ? std::vector<int>{} : BackupRanks(rank_, table_.replicas(), servers)) {
    if (r == rank_ || colocated_->Has(r) || scheduler_->IsDead(wire::SERVER, r)) continue;
    backups[r] = now.servers(r);
  }
  // Standbys back up every shard (they came back to restore the copies a death cost).
  for (const auto& sb : now.standbys()) {
    if (standby_ || sb.rank() == rank_ || colocated_->Has(sb.rank()) || scheduler_->IsDead(wire::SERVER, sb.rank())) continue;
    backups[sb.rank()] = sb;
  }
  replicator_->SetBackups(backups);
  SendSnapshots();
}

void Server::HandleReplicate(const Message& m) {
  const int s = m.header.replica_shard();
  const int servers = table_.servers_size();
  // Only the copies this server is a backup for: a shard whose primary is this process (taken
  // over) or that is not backed up here is refused.
  bool mine = standby_;
  for (const int r : BackupRanks(s, table_.replicas(), servers)) mine = mine || r == rank_;
  Status st;
  if (!replicas_ || !mine || s == rank_ || colocated_->Has(s)) {
    st = PermissionDeniedError("this server does not back up shard " + std::to_string(s));
  } else if (m.header.replica_op() == wire::REPLICA_META && scheduler_->IsDead(wire::SERVER, s)) {
    // A dead primary's late snapshot (or one from a process that says it is): not taken. A
    // primary that comes back is heard of (NODE_JOINED) and sends its snapshot again.
    st = UnavailableError("a snapshot of shard " + std::to_string(s) + ", whose primary the scheduler says is dead");
  } else {
    st = replicas_->Apply(m);
  }
  wire::Header reply;
  reply.set_sender_role(wire::SERVER);
  reply.set_sender_rank(rank_);
  reply.set_request_id(m.header.request_id());
  reply.set_replica_shard(s);
  if (st.ok()) {
    stats_.replica_entries++;
    reply.set_type(wire::REPLICATE_REPLY);
    if (ack_delay_.Defer(m.peer, reply)) return;
  } else {
    stats_.rejected++;
    GRADSYNC_LOG(WARNING) << "server " << rank_ << ": copy of shard " << s << ": " << st;
    reply.set_type(wire::ERROR);
    reply.set_error_code(static_cast<int>(st.code()));
    reply.set_error_message("server " + std::to_string(rank_) + ": " + st.message());
  }
  if (!m.peer.empty()) (void)socket_.Send(m.peer, reply);
}

void Server::MaybeAdopt(int dead) {
  if (!replicas_ || !replicas_->Complete(dead) || colocated_->Has(dead)) return;
  const int servers = table_.servers_size();
  // The first live backup in the dead shard's order takes it (its ranks, then the standbys); the
  // others keep their copies.
  std::vector<int> order = BackupRanks(dead, table_.replicas(), servers);
  const wire::ClusterTable now = scheduler_->table();
  for (const auto& sb : now.standbys()) order.push_back(sb.rank());
  bool mine = false;
  for (int r : order) {
    if (r == rank_) {
      mine = true;
      break;
    }
    if (!scheduler_->IsDead(wire::SERVER, r)) return;
  }
  if (!mine) return;
  auto copy = replicas_->Take(dead);
  if (!copy.ok()) return;
  ServerOptions o = options_;
  o.requested_rank = dead;
  o.port = 0;
  o.restore_from = std::make_shared<ReplicaCopy>(std::move(copy).value());
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
  UpdateBackups();  // the adopted shard is served here now: never a backup of this one
}

std::vector<const Server*> Server::adopted() const {
  std::vector<const Server*> out;
  for (const auto& a : adopted_) out.push_back(a->server.get());
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
  if (standby_) {
    // A backup serves its shard now: what this server held is stale. It keeps no shard and
    // catches up as a backup, from the snapshots the primaries send it.
    core_->Reset();
    parked_.clear();
    state_sets_.clear();
    codec_.reset();
    pull_encoder_.reset();
    replicas_ = std::make_unique<ReplicaStore>(table_.servers_size(), options_.mode, options_.staleness, scheduler_->replica_key());
    replicator_->SetBackups({});
    GRADSYNC_LOG(WARNING) << "server " << rank_ << " (standby): its shard was taken over by a backup meanwhile; it "
                          << "holds copies of the shards from now on and takes one over should its backups die";
    return OkStatus();
  }
  // Workers reconnect and JOIN at the clocks they reached, as after a restore from this state.
  restored_pushed_ = core_->rule().pushed_all();
  resynced_.clear();
  stats_.restored = true;
  identity_of_worker_.clear();
  may_join_.clear();
  parked_.clear();
  state_sets_.clear();
  assembler_ = PushAssembler();
  RETURN_IF_ERROR(ApplyMessageLimit());
  UpdateBackups();
  GRADSYNC_LOG(WARNING) << "server " << rank_ << ": back in the job with its shard (version "
                        << version() << ")";
  return OkStatus();
}

Status Server::Run() {
  colocated_ = options_.colocated ? options_.colocated : std::make_shared<Colocated>();
  RETURN_IF_ERROR(Register());
  if (!options_.trace_path.empty() && !Trace::on()) {
    RETURN_IF_ERROR(Trace::Start(options_.trace_path, "server", rank_, scheduler_->clock_offset_us()));
    if (scheduler_->rejoined()) TraceInstant("rejoined the job", "failure");
  }
  colocated_->Add(rank_);
  core_ = std::make_unique<ShardCore>(options_.mode, options_.staleness, table_.workers_size());
  if (table_.replicas() > 1) {
    replicator_ = std::make_unique<Replicator>(ctx_, rank_, scheduler_->replica_key());
    replicas_ = std::make_unique<ReplicaStore>(table_.servers_size(), options_.mode, options_.staleness, scheduler_->replica_key());
  }
  if (standby_) {
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
  UpdateBackups();
  GRADSYNC_LOG(INFO) << "server " << rank_ << ": serving on port " << socket_.port() << " ("
                     << ConsistencyModeName(options_.mode)
                     << (options_.mode == ConsistencyMode::kSsp ? " s=" + std::to_string(options_.staleness) : "")
                     << ", " << table_.workers_size() << " workers"
                     << (table_.replicas() > 1 ? ", " + std::to_string(table_.replicas() - 1) + " backup(s) per shard" : "")
                     << ")";
  Status result;
  std::vector<Socket*> sockets;
  while (!stop_.load()) {
    // The data socket's messages, at most 64 at a time. With backup links to watch as well, a
    // poll says which sockets have some; with the data socket alone ZeroMQ's blocking receive
    // waits for it (one system call to sleep in, where a poll and then a receive take several).
    int wait_ms = 20;
    if (replicator_) {
      sockets.assign(1, &socket_);
      for (Socket* l : replicator_->sockets()) sockets.push_back(l);
      auto ready = PollReadable(sockets, 20);
      if (!ready.ok()) GRADSYNC_LOG(WARNING) << ready.status();
      wait_ms = ready.ok() && !ready->empty() && ready->front() == 0 ? 0 : -1;
    }
    for (int k = 0; k < 64 && wait_ms >= 0; ++k) {
      auto m = socket_.Recv(k == 0 ? wait_ms : 0);
      if (m.ok()) Handle(*m);
      else break;
    }
    if (replicator_) {
      replicator_->Poll(socket_);
      SendSnapshots();
    }
    if (replicas_) ack_delay_.SendDue(socket_);
    MaybeCheckpoint(false);
    if (scheduler_->events() != seen_events_) {
      seen_events_ = scheduler_->events();
      if (static_cast<int64_t>(scheduler_->table().max_message_bytes()) > listening_) {
        if (result = ApplyMessageLimit(); !result.ok()) break;
      }
      OnMembership();
      if (scheduler_->shutdown_requested()) {
        result = scheduler_->job_failure();
        break;
      }
      if (!scheduler_->health().ok()) {
        // Paused past the heartbeat timeout (SIGSTOP, a stalled host): its shard is intact.
        if (scheduler_->health().code() == StatusCode::kAborted && built()) {
          if (Status s = Rejoin(); s.ok()) continue;
          else {
            result = s;
            break;
          }
        }
        result = scheduler_->health();
        break;
      }
    }
  }
  stats_.traffic = socket_.traffic();
  if (data_) {  // the data channels' bytes are on the wire too
    stats_.traffic.bytes_sent += data_->bytes_sent();
    stats_.traffic.bytes_received += data_->bytes_received();
  }
  if (Trace::on() && !options_.trace_path.empty()) {
    // The best estimate of the whole run (more probes unless the scheduler is shutting down).
    if (!scheduler_->shutdown_requested()) scheduler_->EstimateClock(SchedulerClient::kClockProbes, 0.5);
    Trace::RefineClockOffset(scheduler_->clock_offset_us(), scheduler_->clock_rtt_us() / 2);
  }
  scheduler_.reset();  // stops the heartbeats: the scheduler sees this shard leave
  for (auto& a : adopted_) {
    if (stop_.load()) a->server->Stop();
    if (a->thread.joinable()) a->thread.join();
    if (!a->result.ok()) GRADSYNC_LOG(ERROR) << "server " << rank_ << ": the shard it took over ended with: " << a->result;
  }
  return result;
}

}  // namespace gradsync
