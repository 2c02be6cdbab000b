#include "common/ps/replica_protocol.h"

#include "common/net/transport.h"
#include "common/ps/ps_protocol.h"

namespace gradsync {

wire::Header EncodeReplicaEntry(const ReplicaEntry& e) {
  wire::Header h;
  h.set_type(wire::REPLICATE);
  h.set_sender_role(wire::SERVER);
  h.set_sender_rank(e.sender);
  h.set_request_id(e.seq);
  wire::ReplicaFields& f = *h.mutable_replica();
  f.set_shard(e.shard);
  f.set_op(e.op);
  f.set_index(e.index);
  if (!e.key.empty()) f.set_key(e.key);
  if (!e.meta.empty()) f.set_meta(e.meta);
  f.set_worker(e.worker);
  if (e.op == wire::REPLICA_PUSH) {
    f.set_scale(e.scale);
    f.set_counts(e.counts);
  }
  if (e.part != 0) f.set_part(e.part);
  if (!std::isnan(e.lr)) f.set_lr(e.lr);
  f.mutable_absent_tensors()->Assign(e.absent.begin(), e.absent.end());
  EncodeSegments(e.segments, &h);
  if (e.control) {
    f.mutable_pushed()->Assign(e.control->pushed.begin(), e.control->pushed.end());
    for (bool l : e.control->live) f.add_live(l);
    f.set_rounds(e.control->rounds);
  }
  if (e.op == wire::REPLICA_OPTIMIZER) {
    wire::StateVector& v = *f.mutable_state();
    v.set_optimizer(e.optimizer);
    v.set_steps(e.steps);
    v.mutable_skipped()->Assign(e.skipped.begin(), e.skipped.end());
    v.set_slots(e.state_slots);
    if (e.params) v.set_params(true);
  }
  return h;
}

Result<ReplicaEntry> DecodeReplicaEntry(const wire::Header& h) {
  if (h.type() != wire::REPLICATE) return InvalidArgumentError("not a REPLICATE entry: type " + std::to_string(h.type()));
  if (h.sender_role() != wire::SERVER) return InvalidArgumentError("REPLICATE: the sender is not a server");
  RETURN_IF_ERROR(CheckPlane(h, wire::Header::kReplica));
  const wire::ReplicaFields& f = h.replica();
  ReplicaEntry e;
  e.sender = h.sender_rank();
  e.shard = f.shard();
  if (!wire::ReplicaOp_IsValid(f.op()) || f.op() == wire::REPLICA_OP_UNSPECIFIED) {
    return InvalidArgumentError("REPLICATE: unknown entry " + std::to_string(f.op()));
  }
  e.op = f.op();
  e.seq = h.request_id();
  e.index = f.index();
  e.key = f.key();
  e.meta = f.meta();
  if ((e.op == wire::REPLICA_META) != !e.meta.empty()) {
    return InvalidArgumentError("REPLICATE: a snapshot's description belongs on its META, and a META needs one");
  }
  e.worker = f.worker();
  e.scale = f.scale();
  e.counts = f.counts();
  if (e.op == wire::REPLICA_PUSH && !std::isfinite(e.scale)) {
    return InvalidArgumentError("REPLICATE: a push's scale " + std::to_string(e.scale) + " is not finite");
  }
  e.part = f.part();
  if (e.part < 0) return InvalidArgumentError("REPLICATE: part " + std::to_string(e.part));
  if (f.has_lr()) {
    if (!std::isfinite(f.lr()) || f.lr() < 0) {
      return InvalidArgumentError("REPLICATE: learning rate " + std::to_string(f.lr()) + " is not a finite number >= 0");
    }
    e.lr = f.lr();
  }
  e.absent.assign(f.absent_tensors().begin(), f.absent_tensors().end());
  ASSIGN_OR_RETURN(e.segments, DecodeSegments(h));
  // The primary's entries always carry its consistency state; one without any leaves the rule.
  if (!f.pushed().empty() || !f.live().empty()) {
    ReplicaControl c;
    c.pushed.assign(f.pushed().begin(), f.pushed().end());
    c.live.assign(f.live().begin(), f.live().end());
    c.rounds = f.rounds();
    e.control = std::move(c);
  }
  const wire::StateVector& v = f.state();
  e.optimizer = v.optimizer();
  e.steps = v.steps();
  e.skipped.assign(v.skipped().begin(), v.skipped().end());
  e.state_slots = v.slots();
  e.params = v.params();
  if (e.params && (e.op != wire::REPLICA_OPTIMIZER || e.state_slots != 0 || e.steps != 0 || e.part != 0)) {
    return InvalidArgumentError("REPLICATE: a parameter set is one OPTIMIZER entry without state fields");
  }
  if (e.state_slots < 0 || e.state_slots > kMaxOptimizerSlots || e.steps < 0 || e.steps > kMaxOptimizerSteps) {
    return InvalidArgumentError("REPLICATE: an optimizer state of " + std::to_string(e.state_slots) + " vectors and " +
                                std::to_string(e.steps) + " steps");
  }
  e.has_values = h.has_values();
  e.num_keys = h.num_keys();
  return e;
}

wire::Header EncodeReplicaAck(const ReplicaAck& a) {
  wire::Header h;
  h.set_type(a.error.ok() ? wire::REPLICATE_REPLY : wire::ERROR);
  h.set_sender_role(wire::SERVER);
  h.set_sender_rank(a.sender);
  h.set_request_id(a.seq);
  h.mutable_replica()->set_shard(a.shard);
  if (!a.error.ok()) {
    h.set_error_code(static_cast<int>(a.error.code()));
    h.set_error_message(a.error.message());
  }
  return h;
}

Result<ReplicaAck> DecodeReplicaAck(const wire::Header& h) {
  if (h.type() != wire::REPLICATE_REPLY && h.type() != wire::ERROR) {
    return InvalidArgumentError("not a backup's answer: type " + std::to_string(h.type()));
  }
  ReplicaAck a;
  a.sender = h.sender_rank();
  RETURN_IF_ERROR(CheckPlane(h, wire::Header::kReplica));
  a.shard = h.replica().shard();
  a.seq = h.request_id();
  if (h.type() == wire::ERROR) {
    // A code this build does not know (or OK) is still a refusal.
    a.error = StatusFromWire(h.error_code(), h.error_message());
    if (a.error.ok()) a.error = Status(StatusCode::kUnknown, h.error_message());
  }
  return a;
}

}  // namespace gradsync
