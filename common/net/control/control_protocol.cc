#include "common/net/control/control_protocol.h"

#include "common/net/transport.h"

namespace gradsync {

bool IsControlType(wire::Type t) {
  switch (t) {
    case wire::REGISTER:
    case wire::REGISTER_REPLY:
    case wire::BARRIER:
    case wire::BARRIER_RELEASE:
    case wire::HEARTBEAT:
    case wire::NODE_DEAD:
    case wire::FINISHED:
    case wire::SHUTDOWN:
    case wire::NODE_JOINED:
    case wire::MESSAGE_LIMIT:
    case wire::SHARD_LIMIT:
    case wire::LISTENING:
    case wire::TRAINING_ENDED:
    case wire::ERROR:
      return true;
    default:
      return false;
  }
}

ControlMessage Control(wire::Type type) {
  ControlMessage c;
  c.type = type;
  return c;
}

wire::Header EncodeControl(const ControlMessage& c) {
  wire::Header h;
  h.set_type(c.type);
  h.set_sender_role(c.sender_role);
  h.set_sender_rank(c.sender_rank);
  wire::ControlFields& f = *h.mutable_control();
  if (c.node.ByteSizeLong() > 0) *f.mutable_node() = c.node;
  if (c.type == wire::REGISTER_REPLY) *f.mutable_table() = c.job.table;
  if (!c.job.mode.empty()) f.set_mode(c.job.mode);
  if (c.type == wire::REGISTER) f.set_staleness(c.job.staleness);
  if (!c.job.fingerprint.empty()) f.set_job_fingerprint(c.job.fingerprint);
  if (c.job.rejoined) f.set_rejoined(true);
  if (!c.job.replica_key.empty()) f.set_replica_key(c.job.replica_key);
  if (!c.barrier.name.empty()) f.set_barrier(c.barrier.name);
  if (!c.barrier.group.empty()) f.set_group(c.barrier.group);
  if (!c.barrier.data.empty()) f.set_barrier_data(c.barrier.data);
  for (const std::string& g : c.barrier.gathered) f.add_gathered(g);
  if (c.probe.sent_us != 0) f.set_sent_clock_us(c.probe.sent_us);
  if (c.probe.scheduler_us != 0) f.set_scheduler_clock_us(c.probe.scheduler_us);
  if (c.max_message_bytes != 0) f.set_max_message_bytes(c.max_message_bytes);
  if (c.type == wire::TRAINING_ENDED) {
    f.set_clock(c.ended.clock);
    f.set_joined(c.ended.joined);
  }
  if (!c.status.ok()) {
    h.set_error_code(static_cast<int>(c.status.code()));
    h.set_error_message(c.status.message());
  }
  return h;
}

Result<ControlMessage> DecodeControl(const wire::Header& h) {
  if (!IsControlType(h.type())) {
    return InvalidArgumentError("not a control message: type " + std::to_string(h.type()));
  }
  RETURN_IF_ERROR(CheckPlane(h, wire::Header::kControl));
  const wire::ControlFields& f = h.control();
  ControlMessage c;
  c.type = h.type();
  c.sender_role = h.sender_role();
  c.sender_rank = h.sender_rank();
  c.node = f.node();
  c.job.table = f.table();
  c.job.mode = f.mode();
  c.job.staleness = f.staleness();
  c.job.fingerprint = f.job_fingerprint();
  c.job.rejoined = f.rejoined();
  c.job.replica_key = f.replica_key();
  c.barrier.name = f.barrier();
  c.barrier.group = f.group();
  c.barrier.data = f.barrier_data();
  c.barrier.gathered.assign(f.gathered().begin(), f.gathered().end());
  c.probe.sent_us = f.sent_clock_us();
  c.probe.scheduler_us = f.scheduler_clock_us();
  c.max_message_bytes = f.max_message_bytes();
  c.ended.clock = f.clock();
  c.ended.joined = f.joined();
  c.status = StatusFromWire(h.error_code(), h.error_message());
  return c;
}

}  // namespace gradsync
