#include "common/ps_protocol.h"

#include <algorithm>

#include "common/partitioner.h"
#include "common/transport.h"

namespace gradsync {
namespace {

constexpr uint64_t kMaxOffset = uint64_t{1} << 40;

bool IsRequest(wire::Type t) {
  return t == wire::INIT || t == wire::PUSH || t == wire::PULL || t == wire::JOIN || t == wire::SHM_ATTACH ||
         t == wire::DATA_ATTACH || t == wire::STATE_PULL || t == wire::STATE_PUSH;
}

bool IsReply(wire::Type t) {
  return t == wire::INIT_REPLY || t == wire::PUSH_REPLY || t == wire::PULL_REPLY || t == wire::JOIN_REPLY ||
         t == wire::SHM_ATTACH_REPLY || t == wire::DATA_ATTACH_REPLY || t == wire::STATE_PULL_REPLY ||
         t == wire::STATE_PUSH_REPLY || t == wire::ERROR;
}

bool CarriesState(wire::Type t) {
  return t == wire::STATE_PULL || t == wire::STATE_PUSH || t == wire::STATE_PULL_REPLY || t == wire::STATE_PUSH_REPLY;
}

// The optimizer state fields of a header: only on the STATE_* types, and in range there.
Status CheckStateFields(const wire::Header& h) {
  if (!CarriesState(h.type())) {
    if (!h.state_optimizer().empty() || h.state_steps() != 0 || h.state_slots() != 0 || h.state_slot() != 0 ||
        h.state_skipped_size() != 0) {
      return InvalidArgumentError("optimizer state fields belong on STATE_PULL, STATE_PUSH and their replies");
    }
    return OkStatus();
  }
  if (h.type() == wire::STATE_PULL) {
    if (h.state_steps() != 0 || h.state_slots() != 0 || h.state_slot() != 0 || h.state_skipped_size() != 0) {
      return InvalidArgumentError("a STATE_PULL names an optimizer at most (no steps, no state vectors)");
    }
  } else if (h.state_optimizer().empty()) {
    return InvalidArgumentError("an optimizer state message names its optimizer");
  }
  if (!h.state_optimizer().empty()) RETURN_IF_ERROR(ParseOptimizerKind(h.state_optimizer()).status());
  if (h.state_steps() < 0 || h.state_steps() > kMaxOptimizerSteps) {
    return InvalidArgumentError("optimizer steps " + std::to_string(h.state_steps()) + " out of range");
  }
  for (int64_t skipped : h.state_skipped()) {
    if (skipped < 0 || skipped > h.state_steps()) {
      return InvalidArgumentError("a layer skipped " + std::to_string(skipped) + " of " +
                                  std::to_string(h.state_steps()) + " optimizer steps");
    }
  }
  if (h.state_slots() < 0 || h.state_slots() > kMaxOptimizerSlots || h.state_slot() < 0 ||
      h.state_slot() >= std::max(1, h.state_slots())) {
    return InvalidArgumentError("optimizer state vector " + std::to_string(h.state_slot()) + " of " +
                                std::to_string(h.state_slots()) + " (at most " + std::to_string(kMaxOptimizerSlots) +
                                ")");
  }
  return OkStatus();
}

void SetStateFields(const std::string& optimizer, int64_t steps, std::span<const int64_t> skipped, int slots, int slot,
                    wire::Header* h) {
  if (!optimizer.empty()) h->set_state_optimizer(optimizer);
  if (steps != 0) h->set_state_steps(steps);
  h->mutable_state_skipped()->Assign(skipped.begin(), skipped.end());
  if (slots != 0) h->set_state_slots(slots);
  if (slot != 0) h->set_state_slot(slot);
}

// What every data-plane header starts with.
wire::Header Header(wire::Type type, wire::Role role, int rank, uint64_t request_id, int64_t clock) {
  wire::Header h;
  h.set_type(type);
  h.set_sender_role(role);
  h.set_sender_rank(rank);
  h.set_request_id(request_id);
  h.set_clock(clock);
  return h;
}

bool KnownCode(int code) {
  return (code >= 1 && code <= 6) || (code >= 9 && code <= 15);
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
  if (r.version != 0) h.set_version(r.version);
  EncodeSegments(r.segments, &h);
  if (!r.codec.empty()) h.set_codec(r.codec);
  if (r.parts > 1) {
    h.set_parts(r.parts);
    h.set_part(r.part);
  }
  if (!std::isnan(r.lr)) h.set_lr(r.lr);
  h.mutable_absent_tensors()->Assign(r.absent_tensors.begin(), r.absent_tensors.end());
  if (r.type == wire::INIT) *h.mutable_job() = r.job;
  if (r.shm) h.set_shm(true);
  if (r.shm_seq != 0) h.set_shm_seq(r.shm_seq);
  if (!r.shm_name.empty()) h.set_shm_name(r.shm_name);
  if (r.data) h.set_data(true);
  if (r.data_seq != 0) h.set_data_seq(r.data_seq);
  if (!r.data_token.empty()) h.set_data_token(r.data_token);
  if (CarriesState(r.type)) SetStateFields(r.optimizer, r.steps, r.skipped, r.state_slots, r.state_slot, &h);
  return h;
}

Result<PsRequest> DecodeRequest(const wire::Header& h) {
  if (!IsRequest(h.type())) {
    return InvalidArgumentError("a server does not handle message type " + std::to_string(h.type()));
  }
  if (h.sender_role() != wire::WORKER) return InvalidArgumentError("sender is not a worker");
  PsRequest r;
  r.type = h.type();
  r.worker = h.sender_rank();
  r.request_id = h.request_id();
  r.clock = h.clock();
  r.version = h.version();
  ASSIGN_OR_RETURN(r.segments, DecodeSegments(h));
  r.codec = h.codec();
  r.parts = h.parts();
  r.part = h.part();
  if (r.parts < 0 || r.parts > kMaxPushParts || r.part < 0 || (r.parts <= 1 && r.part != 0) ||
      (r.parts > 1 && r.part >= r.parts) || (r.parts > 1 && r.type != wire::PUSH)) {
    return InvalidArgumentError("push part " + std::to_string(r.part) + " of " + std::to_string(r.parts) +
                                " (at most " + std::to_string(kMaxPushParts) + " parts)");
  }
  if (h.has_lr()) {
    if (r.type != wire::PUSH) return InvalidArgumentError("only a push carries a learning rate");
    if (!std::isfinite(h.lr()) || h.lr() < 0) {
      return InvalidArgumentError("push learning rate " + std::to_string(h.lr()) + " is not a finite number >= 0");
    }
    r.lr = h.lr();
  }
  if (h.absent_tensors_size() > 0) {
    // Which tensors exist is the shard's to check (KvShard::ValidateAbsent).
    if (r.type != wire::PUSH) return InvalidArgumentError("only a push names absent tensors");
    r.absent_tensors.assign(h.absent_tensors().begin(), h.absent_tensors().end());
  }
  if (r.type == wire::INIT) r.job = h.job();
  r.shm = h.shm();
  r.shm_seq = h.shm_seq();
  r.shm_name = h.shm_name();
  if (r.shm && r.type != wire::PUSH && r.type != wire::PULL) {
    return InvalidArgumentError("only a push or a pull moves its values through shared memory");
  }
  if (r.type == wire::PUSH && r.shm && r.shm_seq == 0) return InvalidArgumentError("a shared-memory push has no shm_seq");
  if ((r.type == wire::SHM_ATTACH) != !r.shm_name.empty()) {
    return InvalidArgumentError("shm_name belongs on SHM_ATTACH, and SHM_ATTACH needs one");
  }
  r.data = h.data();
  r.data_seq = h.data_seq();
  r.data_token = h.data_token();
  if (r.data && r.type != wire::PUSH && r.type != wire::PULL) {
    return InvalidArgumentError("only a push or a pull moves its values over the data channel");
  }
  if (r.data && r.shm) return InvalidArgumentError("values move through shared memory or the data channel, not both");
  if (r.type == wire::PUSH && r.data && r.data_seq == 0) return InvalidArgumentError("a data-channel push has no data_seq");
  if ((r.type == wire::DATA_ATTACH) != !r.data_token.empty()) {
    return InvalidArgumentError("data_token belongs on DATA_ATTACH, and DATA_ATTACH needs one");
  }
  if (!r.data_token.empty() && r.data_token.size() != kDataTokenBytes) {
    return InvalidArgumentError("a data token is " + std::to_string(kDataTokenBytes) + " bytes, not " +
                                std::to_string(r.data_token.size()));
  }
  RETURN_IF_ERROR(CheckStateFields(h));
  r.optimizer = h.state_optimizer();
  r.steps = h.state_steps();
  r.skipped.assign(h.state_skipped().begin(), h.state_skipped().end());
  r.state_slots = h.state_slots();
  r.state_slot = h.state_slot();
  return r;
}

wire::Header EncodeReply(const PsReply& r) {
  wire::Header h = Header(r.type, wire::SERVER, r.server, r.request_id, r.clock);
  switch (r.type) {
    case wire::PUSH_REPLY:
      h.set_observed_staleness(static_cast<double>(r.version_lag));
      break;
    case wire::PULL_REPLY:
      h.set_version(r.version);
      h.set_wait_ms(r.wait_ms);
      h.set_clock_staleness(r.clock_staleness);
      EncodeSegments(r.segments, &h);
      if (!r.codec.empty()) h.set_codec(r.codec);
      if (r.shm) h.set_shm(true);
      if (r.data) {
        h.set_data(true);
        h.set_data_seq(r.data_seq);
      }
      if (r.parts > 1) {
        h.set_parts(r.parts);
        h.set_part(r.part);
      }
      break;
    case wire::DATA_ATTACH_REPLY:
      h.set_data_port(static_cast<uint32_t>(r.data_port));
      break;
    case wire::STATE_PULL_REPLY:
    case wire::STATE_PUSH_REPLY:
      h.set_version(r.version);
      EncodeSegments(r.segments, &h);
      SetStateFields(r.optimizer, r.steps, r.skipped, r.state_slots, r.state_slot, &h);
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
  PsReply r;
  r.type = h.type();
  r.server = h.sender_rank();
  r.request_id = h.request_id();
  r.clock = h.clock();
  r.version = h.version();
  r.version_lag = static_cast<int64_t>(h.observed_staleness());
  r.clock_staleness = h.clock_staleness();
  r.wait_ms = h.wait_ms();
  ASSIGN_OR_RETURN(r.segments, DecodeSegments(h));
  r.codec = h.codec();
  r.shm = h.shm();
  r.parts = h.parts();
  r.part = h.part();
  if (r.parts < 0 || r.part < 0 || (r.parts <= 1 && r.part != 0) || (r.parts > 1 && r.part >= r.parts) ||
      ((r.shm || r.parts > 1) && r.type != wire::PULL_REPLY)) {
    return InvalidArgumentError("reply part " + std::to_string(r.part) + " of " + std::to_string(r.parts));
  }
  r.data = h.data();
  r.data_seq = h.data_seq();
  r.data_port = static_cast<int>(h.data_port());
  if ((r.data && (r.type != wire::PULL_REPLY || r.data_seq == 0 || r.shm || r.parts > 1)) ||
      (r.type == wire::DATA_ATTACH_REPLY && (r.data_port <= 0 || r.data_port > 65535))) {
    return InvalidArgumentError("a data-channel reply without its frame number, or a bad data port");
  }
  RETURN_IF_ERROR(CheckStateFields(h));
  r.optimizer = h.state_optimizer();
  r.steps = h.state_steps();
  r.skipped.assign(h.state_skipped().begin(), h.state_skipped().end());
  r.state_slots = h.state_slots();
  r.state_slot = h.state_slot();
  if (r.type == wire::ERROR) {
    // A code this build does not know still fails the request, as kUnknown.
    const StatusCode code = KnownCode(h.error_code()) ? static_cast<StatusCode>(h.error_code()) : StatusCode::kUnknown;
    r.error = Status(code, h.error_message());
  }
  return r;
}

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
