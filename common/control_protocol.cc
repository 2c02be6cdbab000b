#include "common/control_protocol.h"

namespace gradsync {
namespace {

}  // namespace

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
  if (c.node.ByteSizeLong() > 0) *h.mutable_node() = c.node;
  if (c.type == wire::REGISTER_REPLY) *h.mutable_table() = c.table;
  if (!c.mode.empty()) h.set_mode(c.mode);
  if (c.type == wire::REGISTER) h.set_staleness(c.staleness);
  if (!c.job_fingerprint.empty()) h.set_job_fingerprint(c.job_fingerprint);
  if (c.rejoined) h.set_rejoined(true);
  if (!c.replica_key.empty()) h.set_replica_key(c.replica_key);
  if (!c.barrier.empty()) h.set_barrier(c.barrier);
  if (!c.group.empty()) h.set_group(c.group);
  if (!c.barrier_data.empty()) h.set_barrier_data(c.barrier_data);
  for (const std::string& g : c.gathered) h.add_gathered(g);
  if (c.sent_clock_us != 0) h.set_sent_clock_us(c.sent_clock_us);
  if (c.scheduler_clock_us != 0) h.set_scheduler_clock_us(c.scheduler_clock_us);
  if (c.max_message_bytes != 0) h.set_max_message_bytes(c.max_message_bytes);
  if (c.type == wire::TRAINING_ENDED) {
    h.set_clock(c.clock);
    h.set_joined(c.joined);
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
  ControlMessage c;
  c.type = h.type();
  c.sender_role = h.sender_role();
  c.sender_rank = h.sender_rank();
  c.node = h.node();
  c.table = h.table();
  c.mode = h.mode();
  c.staleness = h.staleness();
  c.job_fingerprint = h.job_fingerprint();
  c.rejoined = h.rejoined();
  c.replica_key = h.replica_key();
  c.barrier = h.barrier();
  c.group = h.group();
  c.barrier_data = h.barrier_data();
  c.gathered.assign(h.gathered().begin(), h.gathered().end());
  c.sent_clock_us = h.sent_clock_us();
  c.scheduler_clock_us = h.scheduler_clock_us();
  c.max_message_bytes = h.max_message_bytes();
  c.clock = h.clock();
  c.joined = h.joined();
  c.status = StatusFromWire(h.error_code(), h.error_message());
  return c;
}

}  // namespace gradsync
