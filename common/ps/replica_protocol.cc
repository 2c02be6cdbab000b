#include "common/ps/replica_protocol.h"

#include "common/net/transport.h"
#include "common/ps/ps_protocol.h"
#include "common/ps/table_wire.h"

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
  if (!e.snapshot.key.empty()) f.set_key(e.snapshot.key);
  if (!e.snapshot.meta.empty()) f.set_meta(e.snapshot.meta);
  f.set_worker(e.worker);
  if (e.op == wire::REPLICA_PUSH) {
    f.set_scale(e.push.scale);
    f.set_counts(e.push.counts);
  }
  if (e.state.part != 0) f.set_part(e.state.part);
  if (!std::isnan(e.push.lr)) f.set_lr(e.push.lr);
  f.mutable_absent_tensors()->Assign(e.push.absent.begin(), e.push.absent.end());
  EncodeTableRuns(e.push.tables, f.mutable_tables());
  EncodeSegments(e.frames.segments, &h);
  if (e.control) {
    f.mutable_pushed()->Assign(e.control->pushed.begin(), e.control->pushed.end());
    for (bool l : e.control->live) f.add_live(l);
    f.set_rounds(e.control->rounds);
  }
  if (e.op == wire::REPLICA_OPTIMIZER) {
    wire::StateVector& v = *f.mutable_state();
    v.set_optimizer(e.state.optimizer);
    v.set_steps(e.state.steps);
    v.mutable_skipped()->Assign(e.state.skipped.begin(), e.state.skipped.end());
    v.set_slots(e.state.slots);
    if (e.state.params) v.set_params(true);
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
  e.snapshot.key = f.key();
  e.snapshot.meta = f.meta();
  if ((e.op == wire::REPLICA_META) != !e.snapshot.meta.empty()) {
    return InvalidArgumentError("REPLICATE: a snapshot's description belongs on its META, and a META needs one");
  }
  e.worker = f.worker();
  e.push.scale = f.scale();
  e.push.counts = f.counts();
  if (e.op == wire::REPLICA_PUSH && !std::isfinite(e.push.scale)) {
    return InvalidArgumentError("REPLICATE: a push's scale " + std::to_string(e.push.scale) + " is not finite");
  }
  e.state.part = f.part();
  if (e.state.part < 0) return InvalidArgumentError("REPLICATE: part " + std::to_string(e.state.part));
  if (f.has_lr()) {
    if (!std::isfinite(f.lr()) || f.lr() < 0) {
      return InvalidArgumentError("REPLICATE: learning rate " + std::to_string(f.lr()) + " is not a finite number >= 0");
    }
    e.push.lr = f.lr();
  }
  e.push.absent.assign(f.absent_tensors().begin(), f.absent_tensors().end());
  ASSIGN_OR_RETURN(e.frames.segments, DecodeSegments(h));
  if (f.tables_size() > 0) {
    if (e.op != wire::REPLICA_PUSH || !e.frames.segments.empty()) {
      return InvalidArgumentError("REPLICATE: only a push chunk without segments carries table rows");
    }
    ASSIGN_OR_RETURN(e.push.tables, DecodeTableRuns(f.tables(), h.num_keys()));
  }
  // The primary's entries always carry its consistency state; one without any leaves the rule.
  if (!f.pushed().empty() || !f.live().empty()) {
    ReplicaControl c;
    c.pushed.assign(f.pushed().begin(), f.pushed().end());
    c.live.assign(f.live().begin(), f.live().end());
    c.rounds = f.rounds();
    e.control = std::move(c);
  }
  const wire::StateVector& v = f.state();
  ReplicaState& st = e.state;
  st.optimizer = v.optimizer();
  st.steps = v.steps();
  st.skipped.assign(v.skipped().begin(), v.skipped().end());
  st.slots = v.slots();
  st.params = v.params();
  if (st.params && (e.op != wire::REPLICA_OPTIMIZER || st.slots != 0 || st.steps != 0 || st.part != 0)) {
    return InvalidArgumentError("REPLICATE: a parameter set is one OPTIMIZER entry without state fields");
  }
  if (st.slots < 0 || st.slots > kMaxOptimizerSlots || st.steps < 0 || st.steps > kMaxOptimizerSteps) {
    return InvalidArgumentError("REPLICATE: an optimizer state of " + std::to_string(st.slots) + " vectors and " +
                                std::to_string(st.steps) + " steps");
  }
  e.frames.has_values = h.has_values();
  e.frames.num_keys = h.num_keys();
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
