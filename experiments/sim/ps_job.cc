#include "experiments/sim/ps_job.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "common/config/train_config.h"

namespace gradsync::sim {

Status PsJob::Build() {
  const auto& t = j_.plan.run.train();
  const int S = j_.plan.servers, N = j_.plan.workers;
  const int64_t total = j_.s.params;
  part_ = std::make_unique<Partitioner>(total, S);
  compress_ = codecs_.on();
  compress_pull_ = compress_ && t.compress_pull();
  rounds_ = {.every = t.sync_every(), .total_steps = j_.s.steps};
  compensates_ = t.has_delay_compensation() && j_.plan.mode != config::BSP;
  // PsOverlaps, as the real worker decides (worker/sync/sync_factory.h), per worker: a straggling
  // worker runs without overlap; by default none where the workers' host runs more of them than
  // host_cores.
  OverlapFacts facts = j_.OverlapFactsOf(compress_);
  // Without overlap: the whole model is one forward group, a piece per shard.
  plain_.group_floats.assign(1, total);
  for (int k = 0; k < S; ++k) plain_.pieces.push_back({k, part_->range(k), 0});
  // With overlap: a forward group per tensor, pushed in parts of push_part_mib as it ends.
  overlapped_.overlap = true;
  int64_t offset = 0;
  for (size_t ti = 0; ti < j_.s.tensors.size(); ++ti) {
    const Segment tensor{offset, offset + j_.s.tensors[ti]};
    offset += j_.s.tensors[ti];
    overlapped_.group_floats.push_back(0);
    for (int k = 0; k < S; ++k) {
      const Segment& r = part_->range(k);
      const Segment cut{std::max(r.begin, tensor.begin), std::min(r.end, tensor.end)};
      if (cut.begin >= cut.end) continue;
      const int64_t part = std::max<int64_t>(1, static_cast<int64_t>(t.push_part_mib() * 1024 * 1024 / 4));
      for (int64_t b = cut.begin; b < cut.end; b += part)
        overlapped_.pieces.push_back({k, {b, std::min(cut.end, b + part)}, static_cast<int>(ti)});
      overlapped_.group_floats.back() += cut.end - cut.begin;
    }
  }
  for (Layout* l : {&plain_, &overlapped_}) {
    l->parts_per_shard.assign(static_cast<size_t>(S), 0);
    for (const auto& p : l->pieces) l->parts_per_shard[static_cast<size_t>(p.shard)]++;
  }
  const config::Mode m = j_.plan.mode;
  const ConsistencyMode cm = m == config::BSP   ? ConsistencyMode::kBsp
                             : m == config::SSP ? ConsistencyMode::kSsp
                                                : ConsistencyMode::kAsp;
  for (int k = 0; k < S; ++k) shards_.push_back(std::make_unique<Shard>(cm, j_.plan.staleness, N));
  workers_.resize(static_cast<size_t>(N));
  for (int w = 0; w < N; ++w) {
    auto& wk = workers_[static_cast<size_t>(w)];
    facts.straggles = j_.plan.stragglers.count(w) > 0;
    wk.layout = PsOverlaps(facts) ? &overlapped_ : &plain_;
    wk.pending.assign(wk.layout->group_floats.size(), 0);
    wk.version.assign(static_cast<size_t>(S), 0);
    wk.pushed.assign(static_cast<size_t>(S), 0);
  }
  // Codec sizes and times, measured once per size.
  if (compress_) {
    for (int k = 0; k < S; ++k) RETURN_IF_ERROR(codecs_.Cost(static_cast<size_t>(part_->range(k).size())).status());
  }
  return OkStatus();
}

void PsJob::Start() {
  // Worker 0 initializes every shard; every worker pulls once it has.
  auto remaining = std::make_shared<int>(j_.plan.servers);
  for (int k = 0; k < j_.plan.servers; ++k) {
    PsRequest init;
    init.type = wire::INIT;
    init.segments = {part_->range(k)};
    const uint64_t bytes = HeaderBytes(init) + 4 * static_cast<uint64_t>(part_->range(k).size());
    SendToShard(0, k, bytes, [this, k, remaining] {
      ReplyToWorker(k, 0, ReplyBytes(wire::INIT_REPLY, 0, {}), [this, remaining] {
        if (--*remaining == 0)
          for (int w = 0; w < j_.plan.workers; ++w) SendPulls(w, 0, false);
      });
    });
  }
}

uint64_t PsJob::ReplyBytes(wire::Type type, int64_t clock, const std::vector<Segment>& segs,
                           const std::string& codec) const {
  PsReply r;
  r.type = type;
  r.clock = clock;
  r.segments = segs;
  r.codec = codec;
  if (type == wire::PULL_REPLY) {
    r.version = clock * j_.plan.workers;
    r.staleness.wait_ms = 0.5;
    r.staleness.clock_staleness = 1;
  }
  return EncodeReply(r).ByteSizeLong();
}

void PsJob::SendToShard(int w, int k, uint64_t bytes, std::function<void()> at_shard) {
  j_.rec[static_cast<size_t>(w)].sent += bytes;
  shards_[static_cast<size_t>(k)]->received += bytes;
  j_.net->Send(WorkerHost(w), ShardHost(k), bytes, std::move(at_shard));
}

void PsJob::ReplyToWorker(int k, int w, uint64_t bytes, std::function<void()> at_worker) {
  shards_[static_cast<size_t>(k)]->sent += bytes;
  j_.rec[static_cast<size_t>(w)].received += bytes;
  j_.net->Send(ShardHost(k), WorkerHost(w), bytes, std::move(at_worker));
}

void PsJob::SendPulls(int w, int64_t c, bool eval) {
  auto& wk = workers_[static_cast<size_t>(w)];
  const Layout& l = *wk.layout;
  std::fill(wk.pending.begin(), wk.pending.end(), 0);
  for (const Piece& p : l.pieces) wk.pending[static_cast<size_t>(p.group)]++;
  wk.group = 0;
  wk.waiting = true;
  wk.step_start = j_.engine.now();
  wk.step_wait_ms = 0;
  for (const Piece& p : l.pieces) {
    PsRequest pull;
    pull.type = wire::PULL;
    pull.worker = w;
    pull.clock = c;
    pull.request_id = static_cast<uint64_t>(c) * l.pieces.size() + 1;
    pull.segments = {p.seg};
    const bool delta = compress_pull_ && !eval && c > 0;
    if (delta) pull.codec = codecs_.spec();
    const Piece piece = p;
    SendToShard(w, p.shard, HeaderBytes(pull),
                [this, w, c, piece, delta, eval] { ShardPull(piece, w, c, delta, eval); });
  }
}

void PsJob::ShardPull(const Piece& p, int w, int64_t c, bool delta, bool eval) {
  Shard& sh = *shards_[static_cast<size_t>(p.shard)];
  auto answer = [this, p, w, c, delta, eval](double wait_ms) {
    Shard& s = *shards_[static_cast<size_t>(p.shard)];
    s.staleness[s.cc.ClockStaleness(c)]++;
    s.pulls++;
    const int64_t version = s.version;
    const int64_t staleness = s.cc.ClockStaleness(c);
    uint64_t values = 4 * static_cast<uint64_t>(p.seg.size());
    double encode_us = compensates_ ? j_.s.apply_ns_per_byte * static_cast<double>(values) / 1e3 : 0;
    if (delta) {
      const CodecCost cost = *codecs_.Cost(static_cast<size_t>(p.seg.size()));
      values = cost.payload;
      encode_us = cost.pull_encode_us;
    }
    const uint64_t bytes = ReplyBytes(wire::PULL_REPLY, c, {p.seg}, delta ? codecs_.spec() : "") + values;
    j_.cpus->Run(ShardHost(p.shard), encode_us, [this, p, w, c, bytes, version, staleness, wait_ms, delta, eval] {
      ReplyToWorker(p.shard, w, bytes, [this, p, w, c, version, staleness, wait_ms, delta, eval] {
        const double decode_us = delta ? codecs_.Cost(static_cast<size_t>(p.seg.size()))->pull_decode_us : 0;
        j_.cpus->Run(WorkerHost(w), decode_us, [this, p, w, c, version, staleness, wait_ms, eval] {
          PullAnswered(p, w, c, version, staleness, wait_ms, eval);
        });
      });
    });
  };
  if (sh.cc.CanAnswerPull(w, c)) {
    answer(0);
  } else {
    sh.held.emplace(c, Shard::Held{w, j_.engine.now(), std::move(answer)});
  }
}

void PsJob::AnswerHeld(Shard& sh) {
  while (!sh.held.empty() && sh.cc.CanAnswerPull(sh.held.begin()->second.worker, sh.held.begin()->first)) {
    auto answer = std::move(sh.held.begin()->second.answer);
    const double wait_ms = (j_.engine.now() - sh.held.begin()->second.since) / 1e3;
    sh.held.erase(sh.held.begin());
    answer(wait_ms);
  }
}

void PsJob::PullAnswered(const Piece& p, int w, int64_t c, int64_t version, int64_t staleness, double wait_ms,
                         bool eval) {
  auto& wk = workers_[static_cast<size_t>(w)];
  auto& r = j_.rec[static_cast<size_t>(w)];
  wk.version[static_cast<size_t>(p.shard)] = version;
  r.clock_staleness = std::isnan(r.clock_staleness) ? static_cast<double>(staleness)
                                                    : std::max(r.clock_staleness, static_cast<double>(staleness));
  wk.step_wait_ms = std::max(wk.step_wait_ms, wait_ms);
  wk.pending[static_cast<size_t>(p.group)]--;
  if (eval) {
    int left = 0;
    for (int n : wk.pending) left += n;
    if (left == 0) (void)j_.EvalRow(j_.s.steps);
    return;
  }
  if (wk.waiting && wk.pending[static_cast<size_t>(wk.group)] == 0) Forward(w, c);
}

void PsJob::Forward(int w, int64_t c) {
  auto& wk = workers_[static_cast<size_t>(w)];
  wk.waiting = false;
  const std::vector<int64_t>& groups = wk.layout->group_floats;
  const double share = static_cast<double>(groups[static_cast<size_t>(wk.group)]) / static_cast<double>(TotalFloats());
  j_.cpus->Run(WorkerHost(w), 1e3 * j_.s.compute_ms * j_.s.forward_fraction * share, [this, w, c, &groups] {
    auto& k = workers_[static_cast<size_t>(w)];
    if (k.group + 1 < static_cast<int>(groups.size())) {
      k.group++;
      if (k.pending[static_cast<size_t>(k.group)] == 0)
        Forward(w, c);
      else
        k.waiting = true;
      return;
    }
    Backward(w, c, static_cast<int>(groups.size()) - 1);
  });
}

void PsJob::Backward(int w, int64_t c, int g) {
  const Layout& l = *workers_[static_cast<size_t>(w)].layout;
  const double share = static_cast<double>(l.group_floats[static_cast<size_t>(g)]) / static_cast<double>(TotalFloats());
  j_.cpus->Run(WorkerHost(w), 1e3 * j_.s.compute_ms * (1 - j_.s.forward_fraction) * share, [this, w, c, g, &l] {
    if (l.overlap) PushGroup(w, c, g);
    if (g > 0) {
      Backward(w, c, g - 1);
      return;
    }
    // The straggler's delay, the same draw as the worker's, then encode and push.
    auto& r = j_.rec[static_cast<size_t>(w)];
    const double delay = j_.stragglers[static_cast<size_t>(w)].DelayMs(j_.s.compute_ms);
    r.delay_ms = delay;
    r.compute_ms = j_.s.compute_ms;
    j_.engine.At(j_.engine.now() + delay * 1e3, [this, w, c] { FinishStep(w, c); });
  });
}

void PsJob::PushGroup(int w, int64_t c, int g) {
  for (const Piece& p : workers_[static_cast<size_t>(w)].layout->pieces)
    if (p.group == g) PushPiece(w, c, p, 0);
}

void PsJob::PushPiece(int w, int64_t c, const Piece& p, size_t encoded_payload) {
  auto& wk = workers_[static_cast<size_t>(w)];
  PsRequest push;
  push.type = wire::PUSH;
  push.worker = w;
  push.clock = c;
  push.push.version = wk.version[static_cast<size_t>(p.shard)];
  push.request_id = static_cast<uint64_t>(c) * wk.layout->pieces.size() + 2;
  push.segments = {p.seg};
  const int parts = wk.layout->parts_per_shard[static_cast<size_t>(p.shard)];
  if (parts > 1) {
    push.parts = parts;
    push.part = static_cast<int>(wk.pushed[static_cast<size_t>(p.shard)]++ % parts);
  }
  if (encoded_payload > 0) push.codec = codecs_.spec();
  const uint64_t values = encoded_payload > 0 ? encoded_payload : 4 * static_cast<uint64_t>(p.seg.size());
  const int64_t version = push.push.version;
  SendToShard(w, p.shard, HeaderBytes(push) + values,
              [this, w, c, p, version, encoded_payload] { ShardPush(p, w, c, version, encoded_payload > 0); });
}

void PsJob::FinishStep(int w, int64_t c) {
  if (rounds_.every > 0) {
    FinishLocalStep(w, c);
    return;
  }
  if (!workers_[static_cast<size_t>(w)].layout->overlap) {
    PushEncoded(w, c, 0);
    return;
  }
  EndStep(w, c);
}

void PsJob::PushEncoded(int w, int64_t c, size_t i) {
  const std::vector<Piece>& pieces = workers_[static_cast<size_t>(w)].layout->pieces;
  if (i == pieces.size()) {
    EndStep(w, c);
    return;
  }
  if (!compress_) {
    PushPiece(w, c, pieces[i], 0);
    PushEncoded(w, c, i + 1);
    return;
  }
  const CodecCost cost = *codecs_.Cost(static_cast<size_t>(pieces[i].seg.size()));
  j_.cpus->Run(WorkerHost(w), cost.encode_us, [this, w, c, i, &pieces, payload = cost.payload] {
    PushPiece(w, c, pieces[i], payload);
    PushEncoded(w, c, i + 1);
  });
}

void PsJob::FinishLocalStep(int w, int64_t c) {
  auto& wk = workers_[static_cast<size_t>(w)];
  const bool ends_round = rounds_.EndsRound(wk.step);
  // The worker's optimizer on its own model (LocalSync: its own kind's cost), and at a round's
  // end Δ = global - own.
  const double pass_us = j_.s.apply_ns_per_byte * 4.0 * static_cast<double>(TotalFloats()) / 1e3;
  const double us = j_.s.inner_optimizer_us + (ends_round ? pass_us : 0);
  j_.rec[static_cast<size_t>(w)].compute_ms += us / 1e3;
  j_.cpus->Run(WorkerHost(w), us, [this, w, c, ends_round] {
    if (ends_round) {
      PushEncoded(w, c, 0);
      return;
    }
    EndStep(w, c);
  });
}

void PsJob::ComputeStep(int w, int64_t c) {
  auto& wk = workers_[static_cast<size_t>(w)];
  std::fill(wk.pending.begin(), wk.pending.end(), 0);
  wk.group = 0;
  wk.step_start = j_.engine.now();
  wk.step_wait_ms = 0;
  Forward(w, c);
}

void PsJob::EndStep(int w, int64_t c) {
  auto& wk = workers_[static_cast<size_t>(w)];
  auto& r = j_.rec[static_cast<size_t>(w)];
  const double step_ms = (j_.engine.now() - wk.step_start) / 1e3;
  r.wait_ms = wk.step_wait_ms;
  r.comm_ms = std::max(0.0, step_ms - r.compute_ms - r.delay_ms - r.wait_ms);
  j_.worker_steps++;
  wk.step++;
  // A round's last step pushed clock c; the round's other steps stay at it.
  const bool next_clock = rounds_.every == 0 || wk.step % rounds_.every == 0 || wk.step >= j_.s.steps;
  if (next_clock) wk.clock = c + 1;
  (void)j_.Row(w, wk.step);
  if (w == 0 && j_.EvalDue(wk.step)) (void)j_.EvalRow(wk.step);
  if (wk.step >= j_.s.steps) {
    wk.done = true;
    if (++finished_ == j_.plan.workers) SendPulls(0, FinalClock(), true);  // worker 0's final evaluation
    return;
  }
  if (next_clock) {
    SendPulls(w, wk.clock, false);
  } else {
    ComputeStep(w, wk.clock);
  }
}

void PsJob::ShardPush(const Piece& p, int w, int64_t c, int64_t version, bool compressed) {
  Shard& sh = *shards_[static_cast<size_t>(p.shard)];
  const int parts = workers_[static_cast<size_t>(w)].layout->parts_per_shard[static_cast<size_t>(p.shard)];
  double us = j_.s.apply_ns_per_byte * 4.0 * static_cast<double>(p.seg.size()) / 1e3;
  if (compressed) us += codecs_.Cost(static_cast<size_t>(p.seg.size()))->decode_us;
  if (compensates_) us += 2 * j_.s.apply_ns_per_byte * 4.0 * static_cast<double>(p.seg.size()) / 1e3;
  j_.cpus->Run(ShardHost(p.shard), us, [this, &sh, p, w, c, version, parts] {
    if (++sh.parts_in[static_cast<size_t>(w)] < parts) return;
    sh.parts_in[static_cast<size_t>(w)] = 0;
    const Status st = sh.cc.OnPush(w, c);
    if (!st.ok()) return;  // the simulation sends only pushes the rule takes
    sh.pushes++;
    ReplyToWorker(p.shard, w, ReplyBytes(wire::PUSH_REPLY, c, {}), [] {});
    if (sh.cc.aggregates()) {
      sh.round.push_back(w);
      sh.push_version[static_cast<size_t>(w)] = version;
      if (!sh.cc.RoundComplete()) return;
      // The round's sum applied once.
      const double apply_us = j_.s.apply_ns_per_byte * 4.0 * static_cast<double>(part_->range(p.shard).size()) / 1e3;
      j_.cpus->Run(ShardHost(p.shard), apply_us, [this, &sh] {
        for (int worker : sh.round) {
          sh.lag[sh.version - sh.push_version[static_cast<size_t>(worker)]]++;
          j_.rec[static_cast<size_t>(worker)].version_lag =
              static_cast<double>(sh.version - sh.push_version[static_cast<size_t>(worker)]);
        }
        sh.round.clear();
        sh.version++;
        sh.cc.clocks().OnRoundApplied();
        AnswerHeld(sh);
      });
      return;
    }
    sh.lag[sh.version - version]++;
    j_.rec[static_cast<size_t>(w)].version_lag = static_cast<double>(sh.version - version);
    sh.version++;
    AnswerHeld(sh);
  });
}

Status PsJob::WriteSummaries(const std::string& dir) {
  for (size_t k = 0; k < shards_.size(); ++k) {
    const Shard& sh = *shards_[k];
    summary::ProcessSummary ps;
    ps.set_role("server");
    ps.set_rank(static_cast<int>(k));
    ps.set_mode(ModeName(j_.plan.mode));
    ps.set_ok(true);
    ps.set_wall_s(j_.engine.now() / 1e6);
    ps.set_pushes(sh.pushes);
    ps.set_pulls(sh.pulls);
    ps.set_bytes_sent(static_cast<int64_t>(sh.sent));
    ps.set_bytes_received(static_cast<int64_t>(sh.received));
    SetHistogram(sh.lag, ps.mutable_version_lag());
    SetHistogram(sh.staleness, ps.mutable_clock_staleness());
    RETURN_IF_ERROR(WriteProcessSummary(dir, ps));
  }
  return OkStatus();
}

}  // namespace gradsync::sim
