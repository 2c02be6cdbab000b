#include "common/ps/ps_protocol.h"

#include <algorithm>
#include <cmath>

#include "common/net/transport.h"
#include "common/ps/partitioner.h"
#include "common/ps/table_wire.h"

namespace gradsync {
namespace {

constexpr uint64_t kMaxOffset = uint64_t{1} << 40;

bool IsRequest(wire::Type t) {
  return t == wire::INIT || t == wire::PUSH || t == wire::PULL || t == wire::JOIN ||
         t == wire::CHANNEL_ATTACH || t == wire::STATE_PULL || t == wire::STATE_PUSH;
}

bool IsReply(wire::Type t) {
  return t == wire::INIT_REPLY || t == wire::PUSH_REPLY || t == wire::PULL_REPLY || t == wire::JOIN_REPLY ||
         t == wire::CHANNEL_ATTACH_REPLY || t == wire::STATE_PULL_REPLY ||
         t == wire::STATE_PUSH_REPLY || t == wire::ERROR;
}

bool CarriesState(wire::Type t) {
  return t == wire::STATE_PULL || t == wire::STATE_PUSH || t == wire::STATE_PULL_REPLY || t == wire::STATE_PUSH_REPLY;
}

// The optimizer state fields of a header: only on the STATE_* types, and in range there.
Status CheckStateFields(wire::Type type, const wire::PsFields& p) {
  const wire::StateVector& h = p.state();
  if (!CarriesState(type)) {
    if (p.has_state()) {
      return InvalidArgumentError("optimizer state fields belong on STATE_PULL, STATE_PUSH and their replies");
    }
    return OkStatus();
  }
  if (h.params()) {
    // The parameters: one message, no optimizer state fields (the state stays as it is).
    if (type != wire::STATE_PUSH && type != wire::STATE_PUSH_REPLY) {
      return InvalidArgumentError("parameters are set with STATE_PUSH (and read with PULL)");
    }
    if (!h.optimizer().empty() || h.steps() != 0 || h.slots() != 0 || h.slot() != 0 || h.skipped_size() != 0) {
      return InvalidArgumentError("a parameter set carries no optimizer state fields");
    }
    return OkStatus();
  }
  if (type == wire::STATE_PULL) {
    if (h.steps() != 0 || h.slots() != 0 || h.slot() != 0 || h.skipped_size() != 0) {
      return InvalidArgumentError("a STATE_PULL names an optimizer at most (no steps, no state vectors)");
    }
  } else if (h.optimizer().empty()) {
    return InvalidArgumentError("an optimizer state message names its optimizer");
  }
  if (!h.optimizer().empty()) RETURN_IF_ERROR(ParseOptimizerKind(h.optimizer()).status());
  if (h.steps() < 0 || h.steps() > kMaxOptimizerSteps) {
    return InvalidArgumentError("optimizer steps " + std::to_string(h.steps()) + " out of range");
  }
  for (int64_t skipped : h.skipped()) {
    if (skipped < 0 || skipped > h.steps()) {
      return InvalidArgumentError("a layer skipped " + std::to_string(skipped) + " of " +
                                  std::to_string(h.steps()) + " optimizer steps");
    }
  }
  if (h.slots() < 0 || h.slots() > kMaxOptimizerSlots || h.slot() < 0 ||
      h.slot() >= std::max(1, h.slots())) {
    return InvalidArgumentError("optimizer state vector " + std::to_string(h.slot()) + " of " +
                                std::to_string(h.slots()) + " (at most " + std::to_string(kMaxOptimizerSlots) +
                                ")");
  }
  return OkStatus();
}

void SetStateFields(const StateVectorFields& f, wire::PsFields* p) {
  wire::StateVector* v = p->mutable_state();
  if (f.params) v->set_params(true);
  if (!f.optimizer.empty()) v->set_optimizer(f.optimizer);
  if (f.steps != 0) v->set_steps(f.steps);
  v->mutable_skipped()->Assign(f.skipped.begin(), f.skipped.end());
  if (f.slots != 0) v->set_slots(f.slots);
  if (f.slot != 0) v->set_slot(f.slot);
}

void ReadStateFields(const wire::StateVector& v, StateVectorFields* f) {
  f->params = v.params();
  f->optimizer = v.optimizer();
  f->steps = v.steps();
  f->skipped.assign(v.skipped().begin(), v.skipped().end());
  f->slots = v.slots();
  f->slot = v.slot();
}

// What every PS-plane header starts with: the envelope and the clock.
wire::Header Header(wire::Type type, wire::Role role, int rank, uint64_t request_id, int64_t clock) {
  wire::Header h;
  h.set_type(type);
  h.set_sender_role(role);
  h.set_sender_rank(rank);
  h.set_request_id(request_id);
  h.mutable_ps()->set_clock(clock);
  return h;
}

bool KnownCode(int code) {
  return (code >= 1 && code <= 6) || (code >= 8 && code <= 15);
}


void EncodeValueRef(const ValueRef& at, wire::PsFields* p) {
  if (!at.outside() && at.seq == 0 && at.attach.empty() && at.port == 0) return;
  wire::ValueRef* v = p->mutable_values_at();
  v->set_channel(at.channel);
  if (at.seq != 0) v->set_seq(at.seq);
  if (!at.attach.empty()) v->set_attach(at.attach);
  if (at.port != 0) v->set_port(static_cast<uint32_t>(at.port));
}

// The reference as sent, its channel known; what it may hold on which message is the callers'.
Result<ValueRef> ReadValueRef(const wire::PsFields& p) {
  ValueRef at;
  if (!p.has_values_at()) return at;
  const wire::ValueRef& v = p.values_at();
  if (!wire::Channel_IsValid(v.channel())) {
    return InvalidArgumentError("unknown value channel " + std::to_string(v.channel()));
  }
  at.channel = v.channel();
  at.seq = v.seq();
  at.attach = v.attach();
  at.port = static_cast<int>(v.port());
  return at;
}

// A request's reference: a channel on a PUSH or PULL (a push's with its number), or the channel to
// attach and its name or token; nothing else.
Result<ValueRef> DecodeRequestRef(const wire::PsFields& p, wire::Type type) {
  ASSIGN_OR_RETURN(ValueRef at, ReadValueRef(p));
  const bool moves = type == wire::PUSH || type == wire::PULL;
  if (at.outside() && !moves && type != wire::CHANNEL_ATTACH) {
    return InvalidArgumentError("only a push or a pull moves its values through a value channel");
  }
  if (at.port != 0) return InvalidArgumentError("a request names no port");
  if (type == wire::PUSH && at.outside() && at.seq == 0) {
    return InvalidArgumentError("a push through a value channel has no number there (values_at.seq)");
  }
  if (at.seq != 0 && !(type == wire::PUSH && at.outside())) {
    return InvalidArgumentError("only a push through a value channel is numbered there");
  }
  if ((type == wire::CHANNEL_ATTACH) != !at.attach.empty() || (type == wire::CHANNEL_ATTACH && !at.outside())) {
    return InvalidArgumentError("CHANNEL_ATTACH names a channel and its lane or token; nothing else does");
  }
  if (type == wire::CHANNEL_ATTACH && at.channel == wire::CHANNEL_DATA && at.attach.size() != kDataTokenBytes) {
    return InvalidArgumentError("a data token is " + std::to_string(kDataTokenBytes) + " bytes, not " +
                                std::to_string(at.attach.size()));
  }
  return at;
}

// A reply's reference: a pull's channel (a data channel's with its frame number), or the channel
// attached (a data channel's with its port).
Result<ValueRef> DecodeReplyRef(const wire::PsFields& p, wire::Type type) {
  ASSIGN_OR_RETURN(ValueRef at, ReadValueRef(p));
  if (!at.attach.empty()) return InvalidArgumentError("a reply attaches nothing");
  if (at.outside() && type != wire::PULL_REPLY && type != wire::CHANNEL_ATTACH_REPLY) {
    return InvalidArgumentError("only a pull's answer names a value channel");
  }
  if (type == wire::CHANNEL_ATTACH_REPLY) {
    const bool data = at.channel == wire::CHANNEL_DATA;
    if (!at.outside() || at.seq != 0 || (data && (at.port <= 0 || at.port > 65535)) || (!data && at.port != 0)) {
      return InvalidArgumentError("a CHANNEL_ATTACH_REPLY without its channel, or a bad data port");
    }
    return at;
  }
  if (at.port != 0 || (at.channel == wire::CHANNEL_DATA) != (at.seq != 0)) {
    return InvalidArgumentError("a data-channel reply without its frame number, or a number without one");
  }
  return at;
}
}  // namespace

void EncodeSegments(std::span<const Segment> segments, wire::Header* h) {
  for (const Segment& s : segments) {
    auto* w = h->add_segments();
    w->set_offset(static_cast<uint64_t>(s.begin));
    w->set_length(static_cast<uint64_t>(s.size()));
  }
}

Result<std::vector<Segment>> DecodeSegments(const wire::Header& h) {
  std::vector<Segment> out;
  out.reserve(static_cast<size_t>(h.segments_size()));
  for (const auto& s : h.segments()) {
    if (s.offset() > kMaxOffset || s.length() > kMaxOffset) {
      return InvalidArgumentError("segment offset " + std::to_string(s.offset()) + " length " +
                                  std::to_string(s.length()) + " is out of range");
    }
    const auto begin = static_cast<int64_t>(s.offset());
    out.push_back({begin, begin + static_cast<int64_t>(s.length())});
  }
  return out;
}

uint64_t TotalSize(std::span<const Segment> segments) {
  uint64_t n = 0;
  for (const Segment& s : segments) n += static_cast<uint64_t>(s.size());
  return n;
}

void SetJobOptimizer(const OptimizerOptions& o, wire::JobConfig* job) {
  job->set_optimizer(OptimizerKindName(o.kind));
  job->set_momentum(o.momentum);
  job->set_nesterov(o.nesterov);
  job->set_weight_decay(o.weight_decay);
  if (o.kind == OptimizerKind::kAdam || o.kind == OptimizerKind::kLamb) {
    job->set_adam_beta1(o.beta1);
    job->set_adam_beta2(o.beta2);
    job->set_adam_eps(o.eps);
  }
  if (o.kind == OptimizerKind::kLars) job->set_trust_coefficient(o.trust_coefficient);
}

Result<OptimizerOptions> JobOptimizer(const wire::JobConfig& job) {
  OptimizerOptions o;
  ASSIGN_OR_RETURN(o.kind, ParseOptimizerKind(job.optimizer().empty() ? "sgd" : job.optimizer()));
  o.momentum = job.momentum();
  o.nesterov = job.nesterov();
  o.weight_decay = job.weight_decay();
  if (o.kind == OptimizerKind::kAdam || o.kind == OptimizerKind::kLamb) {
    o.beta1 = job.adam_beta1();
    o.beta2 = job.adam_beta2();
    o.eps = job.adam_eps();
  }
  if (o.kind == OptimizerKind::kLars) o.trust_coefficient = job.trust_coefficient();
  if (o.kind != OptimizerKind::kSgd) {
    for (const auto& t : job.tensors()) {
      if (t.sparse()) {
        return InvalidArgumentError(std::string(OptimizerKindName(o.kind)) + " applies to dense models; tensor '" + t.name() +
                                    "' is sparse");
      }
    }
  }
  RETURN_IF_ERROR(ValidateOptimizerOptions(o));
  return o;
}

PsReply ReplyTo(const PsRequest& request, wire::Type type, int server) {
  PsReply r;
  r.type = type;
  r.server = server;
  r.request_id = request.request_id;
  r.clock = request.clock;
  return r;
}

wire::Header EncodeRequest(const PsRequest& r) {
  wire::Header h = Header(r.type, wire::WORKER, r.worker, r.request_id, r.clock);
  wire::PsFields& p = *h.mutable_ps();
  if (r.push.version != 0) p.set_version(r.push.version);
  EncodeSegments(r.segments, &h);
  if (!r.codec.empty()) h.set_codec(r.codec);
  if (r.parts > 1) {
    p.set_parts(r.parts);
    p.set_part(r.part);
  }
  if (!std::isnan(r.push.lr)) p.set_lr(r.push.lr);
  p.mutable_absent_tensors()->Assign(r.push.absent_tensors.begin(), r.push.absent_tensors.end());
  if (r.type == wire::INIT) *p.mutable_job() = r.job;
  EncodeTableRuns(r.tables, p.mutable_tables());
  EncodeValueRef(r.at, &p);
  if (CarriesState(r.type)) SetStateFields(r.state, &p);
  return h;
}

Result<PsRequest> DecodeRequest(const wire::Header& h) {
  if (!IsRequest(h.type())) {
    return InvalidArgumentError("a server does not handle message type " + std::to_string(h.type()));
  }
  if (h.sender_role() != wire::WORKER) return InvalidArgumentError("sender is not a worker");
  RETURN_IF_ERROR(CheckPlane(h, wire::Header::kPs));
  const wire::PsFields& p = h.ps();
  PsRequest r;
  r.type = h.type();
  r.worker = h.sender_rank();
  r.request_id = h.request_id();
  r.clock = p.clock();
  r.push.version = p.version();
  ASSIGN_OR_RETURN(r.segments, DecodeSegments(h));
  r.codec = h.codec();
  r.parts = p.parts();
  r.part = p.part();
  if (r.parts < 0 || r.parts > kMaxPushParts || r.part < 0 || (r.parts <= 1 && r.part != 0) ||
      (r.parts > 1 && r.part >= r.parts) || (r.parts > 1 && r.type != wire::PUSH)) {
    return InvalidArgumentError("push part " + std::to_string(r.part) + " of " + std::to_string(r.parts) +
                                " (at most " + std::to_string(kMaxPushParts) + " parts)");
  }
  if (p.has_lr()) {
    if (r.type != wire::PUSH) return InvalidArgumentError("only a push carries a learning rate");
    if (!std::isfinite(p.lr()) || p.lr() < 0) {
      return InvalidArgumentError("push learning rate " + std::to_string(p.lr()) + " is not a finite number >= 0");
    }
    r.push.lr = p.lr();
  }
  if (p.absent_tensors_size() > 0) {
    // Which tensors exist is the shard's to check (KvShard::ValidateAbsent).
    if (r.type != wire::PUSH) return InvalidArgumentError("only a push names absent tensors");
    r.push.absent_tensors.assign(p.absent_tensors().begin(), p.absent_tensors().end());
  }
  if (r.type == wire::INIT) r.job = p.job();
  ASSIGN_OR_RETURN(r.at, DecodeRequestRef(p, r.type));
  r.has_values = h.has_values();
  r.num_keys = h.num_keys();
  if (p.tables_size() > 0) {
    if (r.type != wire::PUSH && r.type != wire::PULL) return InvalidArgumentError("only a push or a pull names table rows");
    if (!r.segments.empty() || !r.codec.empty() || r.at.outside()) {
      return InvalidArgumentError("a message of table rows carries no segments and no codec, over ZeroMQ only");
    }
    ASSIGN_OR_RETURN(r.tables, DecodeTableRuns(p.tables(), r.num_keys));
  }
  RETURN_IF_ERROR(CheckStateFields(r.type, p));
  ReadStateFields(p.state(), &r.state);
  return r;
}

wire::Header EncodeReply(const PsReply& r) {
  wire::Header h = Header(r.type, wire::SERVER, r.server, r.request_id, r.clock);
  wire::PsFields& p = *h.mutable_ps();
  switch (r.type) {
    case wire::PUSH_REPLY:
      p.set_version_lag(r.staleness.version_lag);
      break;
    case wire::PULL_REPLY:
      p.set_version(r.version);
      p.set_wait_ms(r.staleness.wait_ms);
      p.set_clock_staleness(r.staleness.clock_staleness);
      EncodeSegments(r.segments, &h);
      if (!r.codec.empty()) h.set_codec(r.codec);
      EncodeValueRef(r.at, &p);
      if (r.piece.parts > 1) {
        p.set_parts(r.piece.parts);
        p.set_part(r.piece.part);
      }
      EncodeTableRuns(r.tables, p.mutable_tables());
      break;
    case wire::CHANNEL_ATTACH_REPLY:
      EncodeValueRef(r.at, &p);
      break;
    case wire::STATE_PULL_REPLY:
    case wire::STATE_PUSH_REPLY:
      p.set_version(r.version);
      EncodeSegments(r.segments, &h);
      SetStateFields(r.state, &p);
      break;
    case wire::ERROR:
      h.set_error_code(static_cast<int>(r.error.code()));
      h.set_error_message(r.error.message());
      break;
    default:
      break;
  }
  return h;
}

Result<PsReply> DecodeReply(const wire::Header& h) {
  if (!IsReply(h.type())) return InvalidArgumentError("not a shard's reply: message type " + std::to_string(h.type()));
  RETURN_IF_ERROR(CheckPlane(h, wire::Header::kPs));
  const wire::PsFields& p = h.ps();
  PsReply r;
  r.type = h.type();
  r.server = h.sender_rank();
  r.request_id = h.request_id();
  r.clock = p.clock();
  r.version = p.version();
  r.staleness.version_lag = p.version_lag();
  r.staleness.clock_staleness = p.clock_staleness();
  r.staleness.wait_ms = p.wait_ms();
  ASSIGN_OR_RETURN(r.segments, DecodeSegments(h));
  r.codec = h.codec();
  const int parts = p.parts(), part = p.part();
  r.piece = {parts, part};
  ASSIGN_OR_RETURN(r.at, DecodeReplyRef(p, r.type));
  r.has_values = h.has_values();
  r.num_keys = h.num_keys();
  if (parts < 0 || part < 0 || (parts <= 1 && part != 0) || (parts > 1 && part >= parts) ||
      (parts > 1 && (r.type != wire::PULL_REPLY || r.at.channel != wire::CHANNEL_LANE))) {
    return InvalidArgumentError("reply part " + std::to_string(part) + " of " + std::to_string(parts) +
                                " (only a pull answered through a lane comes in parts)");
  }
  if (p.tables_size() > 0) {
    if (r.type != wire::PULL_REPLY || !r.segments.empty() || r.at.outside()) {
      return InvalidArgumentError("only a pull's reply over ZeroMQ, without segments, carries table rows");
    }
    ASSIGN_OR_RETURN(r.tables, DecodeTableRuns(p.tables(), r.num_keys));
  }
  RETURN_IF_ERROR(CheckStateFields(r.type, p));
  ReadStateFields(p.state(), &r.state);
  if (r.type == wire::ERROR) {
    // A code this build does not know still fails the request, as kUnknown.
    const StatusCode code = KnownCode(h.error_code()) ? static_cast<StatusCode>(h.error_code()) : StatusCode::kUnknown;
    r.error = Status(code, h.error_message());
  }
  return r;
}

MessageTag TagOf(const wire::Header& h) { return {h.type(), h.sender_rank(), h.request_id(), h.ps().clock()}; }

int64_t MaxShardMessageBytes(std::span<const TensorInfo> layout, int num_servers) {
  int64_t total = 0;
  for (const auto& t : layout) total = std::max(total, t.offset + t.size);
  int64_t largest = 0;
  if (total > 0 && num_servers > 0) {
    const Partitioner part(total, num_servers);
    for (const Segment& r : part.ranges()) {
      int64_t sparse = 0;  // elements of sparse tensors in the range: at most that many keys
      for (const auto& t : layout) {
        if (!t.sparse) continue;
        const int64_t lo = std::max<int64_t>(t.offset, r.begin), hi = std::min<int64_t>(t.offset + t.size, r.end);
        if (hi > lo) sparse += hi - lo;
      }
      largest = std::max({largest, r.size() * int64_t{4}, sparse * int64_t{8}});
    }
  }
  return std::max(largest + 64, kMaxControlMessageBytes);
}

}  // namespace gradsync
