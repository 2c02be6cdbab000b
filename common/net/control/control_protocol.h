// The control plane: what a node (server or worker) and the scheduler say to each other, as one
// typed message with one encoder and one decoder, used by both ends (common/net/control/scheduler_client.cc
// and server/scheduler*.cc). On the wire it is a wire::Header (common/proto/gradsync.proto);
// ARCHITECTURE.md, "Wire format", lists each type's fields.
//
//   node -> scheduler   REGISTER (node, mode, staleness, job fingerprint), BARRIER (name, group,
//                       gather data), HEARTBEAT (a clock stamp), FINISHED (a Status),
//                       MESSAGE_LIMIT (a worker's largest message), LISTENING (a server's data
//                       socket accepts that much), TRAINING_ENDED (clock, joined)
//   scheduler -> node   REGISTER_REPLY (table, node with its rank, rejoined, a server's
//                       replication key), BARRIER_RELEASE (name, every member's data, or a
//                       Status: given up), HEARTBEAT (the stamp echoed with the scheduler's clock),
//                       NODE_DEAD / NODE_JOINED (node), TRAINING_ENDED (relayed, with the node),
//                       MESSAGE_LIMIT (accepted, or a Status), SHARD_LIMIT, SHUTDOWN (a Status
//                       when the job failed), ERROR (a Status)
//
// Decoding refuses (kInvalidArgument) a type that is not the control plane's; what a message
// means for the job (who may send it, when) is the receiver's to check.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/base/status.h"
#include "gradsync.pb.h"

namespace gradsync {

struct ControlMessage {
  wire::Type type = wire::TYPE_UNSPECIFIED;
  wire::Role sender_role = wire::ROLE_UNSPECIFIED;
  int sender_rank = 0;
  wire::NodeInfo node;                 // REGISTER, REGISTER_REPLY, NODE_DEAD, NODE_JOINED, a relayed TRAINING_ENDED
  wire::ClusterTable table;            // REGISTER_REPLY
  std::string mode;                    // REGISTER
  int staleness = 0;                   // REGISTER: the ssp bound; -1: "the job's"
  std::string job_fingerprint;         // REGISTER from a worker
  bool rejoined = false;               // REGISTER_REPLY: this node took a dead one's rank
  std::string replica_key;             // REGISTER_REPLY to a server
  std::string barrier;                 // BARRIER, BARRIER_RELEASE: its name
  std::string group;                   // BARRIER: workers | servers | all
  std::string barrier_data;            // BARRIER: this node's part of a gather
  std::vector<std::string> gathered;   // BARRIER_RELEASE: every member's part, by rank
  double sent_clock_us = 0;            // HEARTBEAT: the node's clock when sent (0: not stamped)
  double scheduler_clock_us = 0;       // HEARTBEAT answer: the scheduler's
  uint64_t max_message_bytes = 0;      // MESSAGE_LIMIT, SHARD_LIMIT, LISTENING
  int64_t clock = 0;                   // TRAINING_ENDED: the steps the worker pushed
  bool joined = false;                 // TRAINING_ENDED: it leaves the consistency rule
  // ERROR; FINISHED (OK: success); SHUTDOWN (the job failed); BARRIER_RELEASE (given up);
  // MESSAGE_LIMIT (refused). A code this build does not know reads as kUnknown.
  Status status;
};

// Whether `type` is the control plane's.
bool IsControlType(wire::Type type);
// A message of `type` with nothing else set.
ControlMessage Control(wire::Type type);
wire::Header EncodeControl(const ControlMessage& c);
Result<ControlMessage> DecodeControl(const wire::Header& h);

}  // namespace gradsync
