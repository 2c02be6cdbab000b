#include "server/server.h"

#include <chrono>
#include <cstdio>
#include <cstring>

#include "common/atomic_file.h"
#include "common/cluster.h"
#include "common/logging.h"

namespace gradsync {
namespace {
double NowMs() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

Result<std::unique_ptr<Server>> Server::Create(zmq::context_t& ctx, const ServerOptions& options) {
  ASSIGN_OR_RETURN(Socket s, Socket::Bind(ctx, zmq::socket_type::router, options.bind_host, options.port));
  return std::unique_ptr<Server>(new Server(ctx, options, std::move(s)));
}

std::vector<float> Server::params() const {
  if (!shard_) return {};
  return std::vector<float>(shard_->params().begin(), shard_->params().end());
}

wire::Header Server::ReplyHeader(wire::Type type, const wire::Header& request) const {
  wire::Header h;
  h.set_type(type);
  h.set_sender_role(wire::SERVER);
  h.set_sender_rank(rank_);
  h.set_request_id(request.request_id());
  h.set_clock(request.clock());
  return h;
}

std::vector<SegmentRef> Server::Segments(const Message& m) const {
  std::vector<SegmentRef> out;
  out.reserve(static_cast<size_t>(m.header.segments_size()));
  for (const auto& s : m.header.segments()) {
    out.push_back({static_cast<int64_t>(s.offset()), static_cast<int64_t>(s.length())});
  }
  return out;
}

void Server::ReplyError(const Message& m, const Status& s) {
  stats_.rejected++;
  GRADSYNC_LOG(DEBUG) << "server " << rank_ << ": rejected a message: " << s;
  if (m.peer.empty()) return;
  wire::Header h = ReplyHeader(wire::ERROR, m.header);
  h.set_error_code(static_cast<int>(s.code()));
  h.set_error_message("server " + std::to_string(rank_) + ": " + s.message());
  (void)socket_.Send(m.peer, h);
}

Status Server::CheckSender(const Message& m) {
  const auto& h = m.header;
  if (h.sender_role() != wire::WORKER) return InvalidArgumentError("sender is not a worker");
  const int w = h.sender_rank();
  if (w < 0 || w >= table_.workers_size()) {
    return InvalidArgumentError("unregistered sender: worker " + std::to_string(w) + " is not in the job");
  }
  if (h.type() == wire::JOIN && !controller_->IsLive(w)) {
    // A restarted worker: only once the scheduler has announced it (then its new connection
    // takes the rank over); before that it may simply be early, so it retries.
    if (!may_join_.count(w)) {
      return UnavailableError("worker " + std::to_string(w) + " has not been announced as rejoined yet; retry");
    }
    identity_of_worker_[w] = m.peer;
    return OkStatus();
  }
  auto it = identity_of_worker_.find(w);
  if (it == identity_of_worker_.end()) {
    identity_of_worker_[w] = m.peer;  // first contact binds the connection to the rank
  } else if (it->second != m.peer) {
    return InvalidArgumentError("unregistered sender: another connection already speaks for worker " +
                                std::to_string(w));
  }
  if (!controller_->IsLive(w)) return FailedPreconditionError("worker " + std::to_string(w) + " was declared dead");
  return OkStatus();
}

Status Server::HandleJoin(const Message& m) {
  if (!shard_) return UnavailableError("not initialized yet; retry");
  const int w = m.header.sender_rank();
  const int64_t clock = m.header.clock();
  if (clock < -1) return InvalidArgumentError("JOIN with clock " + std::to_string(clock));
  if (!controller_->IsLive(w)) {
    // A rejoining worker: live from now on, at the clock where it holds no one back.
    const int64_t start = controller_->Suggest(w);
    controller_->SetWorker(w, start);
    may_join_.erase(w);
    mirrors_.erase(w);  // its first pull is raw
    GRADSYNC_LOG(WARNING) << "server " << rank_ << ": worker " << w << " rejoins at clock " << start << " ("
                          << controller_->live_workers() << " live workers)";
  }
  if (clock >= 0) {
    const int64_t at = controller_->pushed(w);
    if (clock < at) {
      return AbortedError("JOIN at clock " + std::to_string(clock) + " but worker " + std::to_string(w) +
                          " has pushed " + std::to_string(at) + " gradients to this shard");
    }
    if (stats_.restored && !resynced_.count(w)) {
      // What this restored shard lost of this worker: the pushes it had made past the checkpoint.
      const int64_t lost = clock - restored_pushed_[w];
      stats_.lost_updates += lost;
      resynced_.insert(w);
      GRADSYNC_LOG(WARNING) << "server " << rank_ << ": worker " << w << " goes on at clock " << clock
                            << "; its " << lost << " push(es) after the checkpoint were lost";
    }
    if (clock > at) {
      round_.erase(w);  // a held push of a round this worker now skips
      partial_.erase(w);
      controller_->SetWorker(w, clock);
    }
    while (controller_->RoundComplete()) ApplyRound();
    AnswerParked();
  }
  wire::Header reply = ReplyHeader(wire::JOIN_REPLY, m.header);
  reply.set_clock(controller_->pushed(w));
  return socket_.Send(m.peer, reply);
}

Status Server::BuildShard(const wire::JobConfig& job) {
  if (job.num_workers() != table_.workers_size()) {
    return InvalidArgumentError("INIT for " + std::to_string(job.num_workers()) + " workers; the job has " +
                                std::to_string(table_.workers_size()));
  }
  std::vector<TensorInfo> layout;
  uint64_t next = 0;
  for (const auto& t : job.tensors()) {
    if (t.offset() != next || t.size() == 0) return InvalidArgumentError("INIT: tensors are not contiguous");
    layout.push_back({t.name(), {static_cast<int64_t>(t.size())}, static_cast<int64_t>(t.offset()),
                      static_cast<int64_t>(t.size()), t.sparse()});
    next += t.size();
  }
  if (next != job.num_params() || job.num_params() == 0 || job.num_params() > (uint64_t{1} << 34)) {
    return InvalidArgumentError("INIT: tensors do not add up to num_params");
  }
  OptimizerOptions opt{job.momentum(), job.nesterov(), job.weight_decay()};
  RETURN_IF_ERROR(ValidateOptimizerOptions(opt));
  LrSchedule lr;
  ASSIGN_OR_RETURN(lr.kind, ParseLrScheduleKind(job.lr_schedule()));
  lr.base = job.lr();
  lr.total_steps = job.total_steps();
  lr.warmup_steps = job.warmup_steps();
  lr.warmup_start = job.warmup_start_lr();
  if (lr.warmup_steps < 0 || !(lr.warmup_start >= 0)) return InvalidArgumentError("INIT: bad learning-rate warm-up");
  if (!(lr.base > 0)) return InvalidArgumentError("INIT: learning rate must be > 0");
  Partitioner part(static_cast<int64_t>(job.num_params()), table_.servers_size());
  const ShardRange range = part.range(rank_);
  std::unique_ptr<Compressor> codec, pull_codec;
  if (!job.compression().empty()) {
    ASSIGN_OR_RETURN(codec, CreateCompressor(job.compression(), job.compression_seed()));
  }
  if (job.compress_pull()) {
    if (!codec) return InvalidArgumentError("INIT: compress_pull needs a compression codec");
    ASSIGN_OR_RETURN(pull_codec, CreateCompressor(job.compression(), job.compression_seed()));
  }
  codec_ = std::move(codec);
  codec_spec_ = codec_ ? job.compression() : "";
  pull_codec_ = std::move(pull_codec);
  staleness_aware_lr_ = job.staleness_aware_lr();
  shard_ = std::make_unique<KvShard>(range, layout, opt, lr, table_.workers_size(), controller_->aggregates());
  job_ = job;
  GRADSYNC_LOG(INFO) << "server " << rank_ << ": holds [" << range.begin << ", " << range.end << ") of "
                     << job.num_params() << " parameters; lr " << lr.base << " (" << job.lr_schedule()
                     << "), momentum " << opt.momentum;
  return OkStatus();
}

Status Server::HandleInit(const Message& m) {
  if (m.header.sender_rank() != 0) return InvalidArgumentError("only worker 0 initializes the shards");
  if (shard_) return FailedPreconditionError("already initialized");
  if (!m.header.codec().empty()) return InvalidArgumentError("INIT carries raw initial values, not a codec payload");
  if (!m.header.has_values()) return InvalidArgumentError("INIT carries the shard's initial values");
  const auto& job = m.header.job();
  if (job.num_params() > 0 && job.num_params() <= (uint64_t{1} << 34)) {
    const ShardRange range = Partitioner(static_cast<int64_t>(job.num_params()), table_.servers_size()).range(rank_);
    auto segs = Segments(m);
    if (segs.size() != 1 || segs[0].offset != range.begin || segs[0].length != range.size() || m.header.num_keys()) {
      return InvalidArgumentError("INIT must carry exactly this shard's range [" + std::to_string(range.begin) +
                                  ", " + std::to_string(range.end) + ")");
    }
  }
  RETURN_IF_ERROR(BuildShard(job));
  std::vector<float> values(static_cast<size_t>(shard_->range().size()));
  m.CopyValues(values.data());
  shard_->SetValues(values);
  return socket_.Send(m.peer, ReplyHeader(wire::INIT_REPLY, m.header));
}

Server::PushChunk Server::TakeChunk(Message& m, std::vector<SegmentRef> segs, const float* values, size_t n) {
  PushChunk c;
  c.segments = std::move(segs);
  c.keys.swap(key_buffer_);  // taken, not copied: the next message sizes key_buffer_ again
  // A frame's bytes are kept where they are (heap memory that moves with the frame), unless
  // they are few (ZeroMQ keeps a small message's bytes inside the message object, which moves)
  // or not float-aligned: then they are copied.
  constexpr size_t kInlineBytes = 64;
  if (values == m.values.data() && n * sizeof(float) > kInlineBytes &&
      reinterpret_cast<uintptr_t>(values) % alignof(float) == 0) {
    c.frame = std::move(m.values);
  } else if (values == decoded_.data() && n > 0) {
    c.owned.swap(decoded_);  // a decoded push: its buffer changes hands
  } else {
    c.owned.resize(std::max<size_t>(n, 1));  // never empty: values() reads owned
    if (n > 0) std::memcpy(c.owned.data(), values, n * sizeof(float));
  }
  return c;
}

Result<Server::HeldPush*> Server::AddPart(Message& m, std::vector<SegmentRef> segs, const float* values, size_t n) {
  const auto& h = m.header;
  const int w = h.sender_rank();
  PartialPush& p = partial_[w];
  if (h.part() == 0) {
    p = PartialPush();
    p.clock = h.clock();
    p.version = h.version();
    p.parts = h.parts();
  } else if (p.parts == 0 || p.clock != h.clock() || p.parts != h.parts()) {
    return InvalidArgumentError("push part " + std::to_string(h.part()) + " of clock " + std::to_string(h.clock()) +
                                " without its first part");
  }
  if (h.part() != p.next) {
    return InvalidArgumentError("push part " + std::to_string(h.part()) + " arrived where part " +
                                std::to_string(p.next) + " was due");
  }
  if (h.version() != p.version) return InvalidArgumentError("the parts of one push carry different versions");
  if (!h.codec().empty() || h.num_keys() > 0) {
    return InvalidArgumentError("a push in parts carries dense raw values only (no codec, no keys)");
  }
  // No element twice: a part's segments may not overlap an earlier part's.
  for (const SegmentRef& sg : segs) {
    auto it = std::lower_bound(p.covered.begin(), p.covered.end(), sg,
                               [](const SegmentRef& a, const SegmentRef& b) { return a.offset < b.offset; });
    const bool hits_next = it != p.covered.end() && it->offset < sg.offset + sg.length;
    const bool hits_prev = it != p.covered.begin() && std::prev(it)->offset + std::prev(it)->length > sg.offset;
    if (hits_next || hits_prev) {
      return InvalidArgumentError("push part " + std::to_string(h.part()) + " repeats elements of an earlier part");
    }
    p.covered.insert(it, sg);
  }
  p.push.chunks.push_back(TakeChunk(m, std::move(segs), values, n));
  if (++p.next < p.parts) return nullptr;
  return &p.push;
}

Status Server::HandlePush(Message& m) {
  const auto& h = m.header;
  const int w = h.sender_rank();
  if (h.parts() > 1 && h.part() > 0) {
    auto it = partial_.find(w);
    if (it != partial_.end() && it->second.failed && it->second.clock == h.clock() && it->second.parts == h.parts()) {
      return OkStatus();  // the rest of a push whose error was the answer
    }
  }
  Status s = HandlePushMessage(m);
  if (!s.ok() && h.parts() > 1) {
    PartialPush& p = partial_[w];
    p = PartialPush();
    p.clock = h.clock();
    p.parts = h.parts();
    p.failed = true;
  }
  return s;
}

Status Server::HandlePushMessage(Message& m) {
  if (!shard_) return FailedPreconditionError("not initialized (worker 0 sends INIT first)");
  const auto& h = m.header;
  if (!h.has_values()) return InvalidArgumentError("a push carries values");
  const int w = h.sender_rank();
  if (h.parts() < 0 || h.parts() > kMaxPushParts || h.part() < 0 || (h.parts() <= 1 && h.part() != 0) ||
      (h.parts() > 1 && h.part() >= h.parts())) {
    return InvalidArgumentError("push part " + std::to_string(h.part()) + " of " + std::to_string(h.parts()) +
                                " (at most " + std::to_string(kMaxPushParts) + " parts)");
  }
  auto segs = Segments(m);
  key_buffer_.resize(h.num_keys());
  if (!key_buffer_.empty()) m.CopyKeys(key_buffer_.data());
  size_t n = m.num_values();
  const float* values = static_cast<const float*>(m.values.data());
  // Ranges and keys; a raw push's value count too (a compressed one's is its codec's business).
  RETURN_IF_ERROR(shard_->Validate(segs, key_buffer_, h.codec().empty() ? &n : nullptr));
  if (!h.codec().empty()) {
    // A compressed push: decoded (and so validated) before it can touch anything.
    if (!codec_ || h.codec() != codec_spec_) {
      return InvalidArgumentError("push compressed with '" + h.codec() + "' but this job uses '" +
                                  (codec_spec_.empty() ? std::string("none") : codec_spec_) + "'");
    }
    if (h.num_keys() > 0) return InvalidArgumentError("a compressed push carries no keys");
    n = 0;
    for (const auto& sg : segs) n += static_cast<size_t>(sg.length);
    decoded_.resize(n);
    RETURN_IF_ERROR(codec_->Decode(std::span(static_cast<const uint8_t*>(m.values.data()), m.values.size()), n,
                                   static_cast<uint64_t>(h.clock()), decoded_));
    values = decoded_.data();
  }
  if (h.version() < 0 || h.version() > shard_->version()) {
    return AbortedError("push computed on version " + std::to_string(h.version()) + " but the shard is at " +
                        std::to_string(shard_->version()));
  }
  // A part is checked against the consistency rule on arrival, and counted with the last one.
  RETURN_IF_ERROR(controller_->CheckPush(w, h.clock()));
  HeldPush whole;
  HeldPush* push = &whole;
  if (h.parts() > 1) {
    ASSIGN_OR_RETURN(push, AddPart(m, std::move(segs), values, n));
    if (push == nullptr) return OkStatus();  // more parts to come (or a failed push's rest)
  } else {
    whole.chunks.push_back(TakeChunk(m, std::move(segs), values, n));
  }
  RETURN_IF_ERROR(controller_->OnPush(w, h.clock()));
  // Accepted: acknowledge before applying (BytePS's recipe), so that the worker's next request
  // is on its way while the update runs; requests from one worker are still handled in order.
  const int64_t staleness = shard_->version() - h.version();
  stats_.version_lag[staleness]++;
  stats_.pushes++;
  wire::Header reply = ReplyHeader(wire::PUSH_REPLY, h);
  reply.set_observed_staleness(static_cast<double>(staleness));
  Status s = socket_.Send(m.peer, reply);
  if (controller_->aggregates()) {
    // Held until the round completes, without copying the values where the frames are aligned.
    round_[w] = std::move(*push);
  } else {
    const float scale = staleness_aware_lr_ ? 1.0f / static_cast<float>(std::max<int64_t>(1, staleness)) : 1.0f;
    for (size_t i = 0; i < push->chunks.size(); ++i) {
      const PushChunk& c = push->chunks[i];
      shard_->Apply(c.segments, c.keys, c.values(), scale, /*counts=*/i + 1 == push->chunks.size());
    }
    MaybeCheckpoint(true);
  }
  partial_.erase(w);
  if (controller_->RoundComplete()) ApplyRound();
  AnswerParked();
  return s;
}

void Server::ApplyRound() {
  const bool any = !round_.empty();
  for (const auto& [worker, held] : round_) {
    for (const PushChunk& c : held.chunks) shard_->Accumulate(c.segments, c.keys, c.values());
  }
  if (any) shard_->ApplyAccumulated(static_cast<int>(round_.size()));
  round_.clear();
  controller_->OnRoundApplied();
  if (any) MaybeCheckpoint(true);  // between rounds: nothing is held
}

std::string Server::CheckpointPath() const {
  return options_.checkpoint_dir + "/shard-" + std::to_string(rank_) + ".ckpt";
}

void Server::MaybeCheckpoint(bool updated) {
  if (options_.checkpoint_dir.empty() || !shard_) return;
  const double now = NowMs() / 1e3;
  if (updated) {
    if (updates_since_checkpoint_++ == 0) first_dirty_ = now;
  }
  if (updates_since_checkpoint_ == 0) return;
  if (controller_->aggregates() && !round_.empty()) return;  // bsp: only between rounds
  const bool by_count = options_.checkpoint_every > 0 && updates_since_checkpoint_ >= options_.checkpoint_every;
  const bool by_time = now - first_dirty_ >= options_.checkpoint_interval_s;
  if (!by_count && !by_time) return;
  const double t0 = NowMs();
  if (Status s = WriteCheckpoint(); !s.ok()) {
    GRADSYNC_LOG(ERROR) << "server " << rank_ << ": checkpoint failed (training goes on): " << s;
    first_dirty_ = now;  // try again after another interval
    return;
  }
  stats_.checkpoints++;
  stats_.checkpoint_ms_max = std::max(stats_.checkpoint_ms_max, NowMs() - t0);
  updates_since_checkpoint_ = 0;
  last_checkpoint_ = now;
}

Status Server::WriteCheckpoint() {
  wire::ShardCheckpoint c;
  c.set_rank(rank_);
  *c.mutable_job() = job_;
  c.set_begin(static_cast<uint64_t>(shard_->range().begin));
  c.set_end(static_cast<uint64_t>(shard_->range().end));
  const auto params = shard_->params();
  c.set_params(params.data(), params.size() * sizeof(float));
  const auto velocity = shard_->optimizer_state();
  c.set_velocity(velocity.data(), velocity.size() * sizeof(float));
  c.set_version(shard_->version());
  c.set_step(shard_->step());
  c.set_updates(shard_->gradients());
  c.set_rounds_applied(controller_->rounds_applied());
  for (int64_t p : controller_->pushed_all()) c.add_pushed(p);
  for (bool l : controller_->live_all()) c.add_live(l);
  c.set_written_at(std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count());
  std::string bytes;
  if (!c.SerializeToString(&bytes)) return InternalError("could not serialize the checkpoint");
  // Temporary file, fsync, rename, fsync the directory: a crash leaves the old file or the new.
  return WriteFileAtomically(CheckpointPath(), bytes);
}

Status Server::RestoreCheckpoint() {
  const std::string path = CheckpointPath();
  ASSIGN_OR_RETURN(std::string bytes, ReadWholeFile(path));
  wire::ShardCheckpoint c;
  if (!c.ParseFromString(bytes)) return DataLossError(path + " is not a shard checkpoint");
  if (c.rank() != rank_) {
    return DataLossError(path + " belongs to shard " + std::to_string(c.rank()) + ", this is shard " + std::to_string(rank_));
  }
  RETURN_IF_ERROR(BuildShard(c.job()).WithContext(path));
  if (c.begin() != static_cast<uint64_t>(shard_->range().begin) || c.end() != static_cast<uint64_t>(shard_->range().end) ||
      c.params().size() % sizeof(float) != 0 || c.velocity().size() % sizeof(float) != 0) {
    shard_.reset();
    return DataLossError(path + " does not hold this shard's range");
  }
  std::vector<float> params(c.params().size() / sizeof(float)), velocity(c.velocity().size() / sizeof(float));
  std::memcpy(params.data(), c.params().data(), c.params().size());
  std::memcpy(velocity.data(), c.velocity().data(), c.velocity().size());
  Status s = shard_->Restore(params, velocity, c.version(), c.step(), c.updates());
  if (s.ok()) {
    s = controller_->Restore(std::vector<int64_t>(c.pushed().begin(), c.pushed().end()),
                             std::vector<bool>(c.live().begin(), c.live().end()), c.rounds_applied());
  }
  if (!s.ok()) {
    shard_.reset();
    return s.WithContext(path);
  }
  restored_pushed_.assign(c.pushed().begin(), c.pushed().end());
  stats_.restored = true;
  const double age = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count() -
                     c.written_at();
  GRADSYNC_LOG(WARNING) << "server " << rank_ << ": restored from " << path << " (version " << c.version()
                        << ", round " << c.rounds_applied() << ", written " << age << " s ago); workers go on from there";
  return OkStatus();
}

Status Server::HandlePull(Message& m) {
  if (!shard_) return FailedPreconditionError("not initialized (worker 0 sends INIT first)");
  const auto& h = m.header;
  if (h.has_values()) return InvalidArgumentError("a pull carries no values");
  if (!h.codec().empty()) {
    if (!pull_codec_ || h.codec() != codec_spec_) {
      return InvalidArgumentError("pull asks for '" + h.codec() + "' deltas but this job " +
                                  (pull_codec_ ? "compresses pulls with '" + codec_spec_ + "'"
                                               : std::string("does not compress pulls (--compress-pull)")));
    }
    if (h.num_keys() > 0) return InvalidArgumentError("a compressed pull carries no keys");
  }
  auto segs = Segments(m);
  key_buffer_.resize(h.num_keys());
  if (!key_buffer_.empty()) m.CopyKeys(key_buffer_.data());
  RETURN_IF_ERROR(shard_->Validate(segs, key_buffer_, nullptr));
  RETURN_IF_ERROR(controller_->ValidatePull(h.sender_rank(), h.clock()));
  if (controller_->CanAnswerPull(h.sender_rank(), h.clock())) {
    AnswerPull(m, segs, key_buffer_, 0.0);
  } else {
    parked_.push_back({std::move(m), NowMs()});
  }
  return OkStatus();
}

void Server::UpdateMirror(int worker, const std::vector<SegmentRef>& segs, const float* values) {
  Mirror& mirror = mirrors_[worker];
  const ShardRange& range = shard_->range();
  mirror.values.resize(static_cast<size_t>(range.size()));
  int64_t covered = 0;
  for (const auto& s : segs) {
    std::memcpy(mirror.values.data() + (s.offset - range.begin), values, static_cast<size_t>(s.length) * sizeof(float));
    values += s.length;
    covered += s.length;
  }
  if (covered == range.size()) mirror.valid = true;  // segments are validated: disjoint, in range
}

bool Server::AnswerCompressedPull(const Message& m, const std::vector<SegmentRef>& segs, double waited_ms) {
  const auto& h = m.header;
  auto it = mirrors_.find(h.sender_rank());
  if (it == mirrors_.end() || !it->second.valid) return false;
  float* mirror = it->second.values.data();
  const int64_t base = shard_->range().begin;
  size_t n = 0;
  for (const auto& s : segs) n += static_cast<size_t>(s.length);
  pull_current_.resize(n);
  pull_delta_.resize(n);
  pull_decoded_.resize(n);
  shard_->Read(segs, {}, pull_current_.data());
  size_t pos = 0;
  for (const auto& s : segs) {
    for (int64_t i = 0; i < s.length; ++i, ++pos) pull_delta_[pos] = pull_current_[pos] - mirror[s.offset - base + i];
  }
  const uint64_t step = PullCodecStep(h.clock());
  pull_codec_->Encode(pull_delta_, step, &pull_payload_);
  // The worker adds exactly what it decodes; the mirror follows it bit for bit, so what was
  // not sent (params - mirror) is sent later.
  if (Status s = pull_codec_->Decode(pull_payload_, n, step, pull_decoded_); !s.ok()) {
    GRADSYNC_LOG(ERROR) << "server " << rank_ << ": own pull payload does not decode: " << s;
    return false;
  }
  pos = 0;
  for (const auto& s : segs) {
    for (int64_t i = 0; i < s.length; ++i, ++pos) mirror[s.offset - base + i] += pull_decoded_[pos];
  }
  wire::Header reply = ReplyHeader(wire::PULL_REPLY, h);
  reply.set_version(shard_->version());
  reply.set_wait_ms(waited_ms);
  reply.set_clock_staleness(controller_->ClockStaleness(h.clock()));
  reply.set_codec(codec_spec_);
  *reply.mutable_segments() = h.segments();
  zmq::message_t frame(pull_payload_.data(), pull_payload_.size());
  Payload p;
  p.has_values = true;
  p.values_frame = &frame;
  Status s = socket_.Send(m.peer, reply, p);
  if (!s.ok()) GRADSYNC_LOG(WARNING) << "server " << rank_ << ": pull reply to worker " << h.sender_rank() << ": " << s;
  stats_.compressed_pulls++;
  RecordPull(h, reply.clock_staleness());
  return true;
}

void Server::RecordPull(const wire::Header& h, int64_t clock_staleness) {
  stats_.pulls++;
  stats_.clock_staleness[clock_staleness]++;
  if (options_.record_pulls) {
    pull_log_.push_back({h.sender_rank(), h.clock(), controller_->min_live_clock(), controller_->rounds_applied(),
                         shard_->version(), clock_staleness});
  }
}

void Server::AnswerParkedPull(const Message& m, double waited_ms) {
  const auto segs = Segments(m);
  key_buffer_.resize(m.header.num_keys());
  if (!key_buffer_.empty()) m.CopyKeys(key_buffer_.data());
  AnswerPull(m, segs, key_buffer_, waited_ms);
}

void Server::AnswerPull(const Message& m, const std::vector<SegmentRef>& segs, std::span<const uint64_t> keys,
                        double waited_ms) {
  const auto& h = m.header;
  if (!h.codec().empty() && AnswerCompressedPull(m, segs, waited_ms)) return;
  uint64_t n = keys.size();
  for (const auto& s : segs) n += static_cast<uint64_t>(s.length);
  // The reply carries a snapshot (the shard may change before ZeroMQ has sent the bytes): one
  // copy into a pooled buffer that ZeroMQ sends without copying again.
  ReplyBuffer* buf = AcquireReplyBuffer(n);
  zmq::message_t frame;
  float* dst = nullptr;
  if (buf) {
    dst = buf->data.data();
  } else {
    frame.rebuild(n * sizeof(float));
    dst = static_cast<float*>(frame.data());
  }
  shard_->Read(segs, keys, dst);
  if (pull_codec_ && keys.empty()) UpdateMirror(h.sender_rank(), segs, dst);
  wire::Header reply = ReplyHeader(wire::PULL_REPLY, h);
  reply.set_version(shard_->version());
  reply.set_wait_ms(waited_ms);
  reply.set_clock_staleness(controller_->ClockStaleness(h.clock()));
  *reply.mutable_segments() = h.segments();
  Payload p;
  p.has_values = true;
  // Keys are echoed, so that a reply describes itself.
  if (buf) {
    buf->keys.assign(keys.begin(), keys.end());  // lent frames must outlive this function
    p.values = std::span<const float>(buf->data.data(), n);
    p.keys = buf->keys;
    p.lent = buf->inflight;
  } else {
    p.values_frame = &frame;
    p.keys = keys;
  }
  Status s = socket_.Send(m.peer, reply, p);
  if (!s.ok()) GRADSYNC_LOG(WARNING) << "server " << rank_ << ": pull reply to worker " << h.sender_rank() << ": " << s;
  RecordPull(h, reply.clock_staleness());
}

Server::ReplyBuffer* Server::AcquireReplyBuffer(size_t n) {
  constexpr size_t kMaxBuffers = 16;
  ReplyBuffer* best = nullptr;
  for (auto& b : reply_pool_) {
    if (b->inflight->count() != 0) continue;
    if (b->data.size() >= n) return b.get();
    best = b.get();
  }
  if (!best) {
    if (reply_pool_.size() >= kMaxBuffers) return nullptr;  // all in flight: build a fresh frame
    reply_pool_.push_back(std::make_unique<ReplyBuffer>());
    best = reply_pool_.back().get();
  }
  best->data.resize(n);
  return best;
}

void Server::AnswerParked() {
  const double now = NowMs();
  for (auto it = parked_.begin(); it != parked_.end();) {
    if (!controller_->IsLive(it->msg.header.sender_rank())) {
      it = parked_.erase(it);
      continue;
    }
    if (controller_->CanAnswerPull(it->msg.header.sender_rank(), it->msg.header.clock())) {
      AnswerParkedPull(it->msg, now - it->since);
      it = parked_.erase(it);
    } else {
      ++it;
    }
  }
}

void Server::OnMembership() {
  auto dead = scheduler_->dead_nodes();
  for (; seen_dead_ < dead.size(); ++seen_dead_) {
    const auto& n = dead[seen_dead_];
    if (n.role() == wire::WORKER) {
      GRADSYNC_LOG(WARNING) << "server " << rank_ << ": " << NodeName(n) << " is dead; continuing with "
                            << controller_->live_workers() - 1 << " live workers";
      controller_->RemoveWorker(n.rank());
      may_join_.erase(n.rank());
      partial_.erase(n.rank());
    }
  }
  auto joined = scheduler_->joined_nodes();
  for (; seen_joined_ < joined.size(); ++seen_joined_) {
    const auto& n = joined[seen_joined_];
    if (n.role() != wire::WORKER) continue;
    // Its new connection will JOIN; the old one no longer speaks for the rank.
    identity_of_worker_.erase(n.rank());
    may_join_.insert(n.rank());
  }
  if (shard_ && controller_->RoundComplete()) ApplyRound();
  if (shard_) AnswerParked();
}

void Server::Handle(Message& m) {
  if (!m.malformed.ok()) {
    stats_.malformed++;
    ReplyError(m, m.malformed);
    return;
  }
  Status s = CheckSender(m);
  if (s.ok()) {
    switch (m.header.type()) {
      case wire::INIT: s = HandleInit(m); break;
      case wire::PUSH: s = HandlePush(m); break;
      case wire::PULL: s = HandlePull(m); break;
      case wire::JOIN: s = HandleJoin(m); break;
      default: s = InvalidArgumentError("a server does not handle message type " + std::to_string(m.header.type()));
    }
  }
  if (!s.ok()) ReplyError(m, s);
}

Status Server::Run() {
  SchedulerClientOptions sc;
  sc.scheduler_endpoint = options_.scheduler_endpoint;
  sc.self.set_role(wire::SERVER);
  sc.self.set_host(options_.advertise_host);
  sc.self.set_port(socket_.port());
  sc.self.set_requested_rank(options_.requested_rank);
  sc.mode = ConsistencyModeName(options_.mode);
  sc.staleness = options_.mode == ConsistencyMode::kSsp ? options_.staleness : 0;
  sc.heartbeat_interval_s = options_.heartbeat_interval_s;
  sc.scheduler_timeout_s = options_.scheduler_timeout_s;
  scheduler_ = std::make_unique<SchedulerClient>(ctx_, sc);
  ASSIGN_OR_RETURN(table_, scheduler_->Register(options_.register_timeout_s));
  rank_ = scheduler_->rank();
  controller_ = std::make_unique<ConsistencyController>(options_.mode, options_.staleness, table_.workers_size());
  if (scheduler_->rejoined()) {
    // A restarted shard in a running job: its state comes from its checkpoint, or it is lost.
    if (options_.checkpoint_dir.empty()) {
      return FailedPreconditionError("this shard rejoined a running job but has no --checkpoint-dir: its parameters are lost");
    }
    RETURN_IF_ERROR(RestoreCheckpoint());
  }
  GRADSYNC_LOG(INFO) << "server " << rank_ << ": serving on port " << socket_.port() << " ("
                     << ConsistencyModeName(options_.mode)
                     << (options_.mode == ConsistencyMode::kSsp ? " s=" + std::to_string(options_.staleness) : "")
                     << ", " << table_.workers_size() << " workers)";
  Status result;
  while (!stop_.load()) {
    auto m = socket_.Recv(20);
    if (m.ok()) Handle(*m);
    else if (m.status().code() != StatusCode::kDeadlineExceeded) GRADSYNC_LOG(WARNING) << m.status();
    MaybeCheckpoint(false);
    if (scheduler_->events() != seen_events_) {
      seen_events_ = scheduler_->events();
      OnMembership();
      if (scheduler_->shutdown_requested()) break;
      if (!scheduler_->health().ok()) {
        result = scheduler_->health();
        break;
      }
    }
  }
  stats_.traffic = socket_.traffic();
  scheduler_.reset();  // stops the heartbeats: the scheduler sees this shard leave
  return result;
}

}  // namespace gradsync
