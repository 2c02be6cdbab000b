#include "common/replica_protocol.h"

#include "common/ps_protocol.h"

namespace gradsync {

wire::Header EncodeReplicaEntry(const ReplicaEntry& e) {
  wire::Header h;
  h.set_type(wire::REPLICATE);
  h.set_sender_role(wire::SERVER);
  h.set_sender_rank(e.sender);
  h.set_request_id(e.seq);
  h.set_replica_shard(e.shard);
  h.set_replica_op(e.op);
  h.set_replica_index(e.index);
  if (!e.key.empty()) h.set_replica_key(e.key);
  if (!e.meta.empty()) h.set_replica_meta(e.meta);
  h.set_replica_worker(e.worker);
  if (e.op == wire::REPLICA_PUSH) {
    h.set_replica_scale(e.scale);
    h.set_replica_counts(e.counts);
  }
  if (e.part != 0) h.set_replica_part(e.part);
  if (!std::isnan(e.lr)) h.set_lr(e.lr);
  h.mutable_absent_tensors()->Assign(e.absent.begin(), e.absent.end());
  EncodeSegments(e.segments, &h);
  if (e.control) {
    h.mutable_replica_pushed()->Assign(e.control->pushed.begin(), e.control->pushed.end());
    for (bool l : e.control->live) h.add_replica_live(l);
    h.set_replica_rounds(e.control->rounds);
  }
  if (e.op == wire::REPLICA_OPTIMIZER) {
    h.set_state_optimizer(e.optimizer);
    h.set_state_steps(e.steps);
    h.mutable_state_skipped()->Assign(e.skipped.begin(), e.skipped.end());
    h.set_state_slots(e.state_slots);
  }
  return h;
}

Result<ReplicaEntry> DecodeReplicaEntry(const wire::Header& h) {
  if (h.type() != wire::REPLICATE) return InvalidArgumentError("not a REPLICATE entry: type " + std::to_string(h.type()));
  if (h.sender_role() != wire::SERVER) return InvalidArgumentError("REPLICATE: the sender is not a server");
  ReplicaEntry e;
  e.sender = h.sender_rank();
  e.shard = h.replica_shard();
  if (!wire::ReplicaOp_IsValid(h.replica_op()) || h.replica_op() == wire::REPLICA_OP_UNSPECIFIED) {
    return InvalidArgumentError("REPLICATE: unknown entry " + std::to_string(h.replica_op()));
  }
  e.op = h.replica_op();
  e.seq = h.request_id();
  e.index = h.replica_index();
  e.key = h.replica_key();
  e.meta = h.replica_meta();
  if ((e.op == wire::REPLICA_META) != !e.meta.empty()) {
    return InvalidArgumentError("REPLICATE: a snapshot's description belongs on its META, and a META needs one");
  }
  e.worker = h.replica_worker();
  e.scale = h.replica_scale();
  e.counts = h.replica_counts();
  if (e.op == wire::REPLICA_PUSH && !std::isfinite(e.scale)) {
    return InvalidArgumentError("REPLICATE: a push's scale " + std::to_string(e.scale) + " is not finite");
  }
  e.part = h.replica_part();
  if (e.part < 0) return InvalidArgumentError("REPLICATE: part " + std::to_string(e.part));
  if (h.has_lr()) {
    if (!std::isfinite(h.lr()) || h.lr() < 0) {
      return InvalidArgumentError("REPLICATE: learning rate " + std::to_string(h.lr()) + " is not a finite number >= 0");
    }
    e.lr = h.lr();
  }
  e.absent.assign(h.absent_tensors().begin(), h.absent_tensors().end());
  ASSIGN_OR_RETURN(e.segments, DecodeSegments(h));
  // The primary's entries always carry its consistency state; one without any leaves the rule.
  if (!h.replica_pushed().empty() || !h.replica_live().empty()) {
    ReplicaControl c;
    c.pushed.assign(h.replica_pushed().begin(), h.replica_pushed().end());
    c.live.assign(h.replica_live().begin(), h.replica_live().end());
    c.rounds = h.replica_rounds();
    e.control = std::move(c);
  }
  e.optimizer = h.state_optimizer();
  e.steps = h.state_steps();
  e.skipped.assign(h.state_skipped().begin(), h.state_skipped().end());
  e.state_slots = h.state_slots();
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
  h.set_replica_shard(a.shard);
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
  a.shard = h.replica_shard();
  a.seq = h.request_id();
  if (h.type() == wire::ERROR) {
    // A code this build does not know (or OK) is still a refusal.
    a.error = StatusFromWire(h.error_code(), h.error_message());
    if (a.error.ok()) a.error = Status(StatusCode::kUnknown, h.error_message());
  }
  return a;
}

}  // namespace gradsync
