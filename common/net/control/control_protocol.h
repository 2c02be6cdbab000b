// The control plane: what a node (server or worker) and the scheduler say to each other, as one
// typed message with one encoder and one decoder, used by both ends (common/net/control/client/scheduler_client.cc
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
  // REGISTER: the job a node asks to be part of; REGISTER_REPLY: what the job gives it.
  struct JobFields {
    std::string mode;             // REGISTER
    int staleness = 0;            // REGISTER: the ssp bound; -1: "the job's"
    std::string fingerprint;      // REGISTER from a worker: the settings that must agree
    wire::ClusterTable table;     // REGISTER_REPLY
    bool rejoined = false;        // REGISTER_REPLY: this node took a dead one's rank
    std::string replica_key;      // REGISTER_REPLY to a server
  };
  // BARRIER and BARRIER_RELEASE.
  struct BarrierFields {
    std::string name;                    // both
    std::string group;                   // BARRIER: workers | servers | all
    std::string data;                    // BARRIER: this node's part of a gather
    std::vector<std::string> gathered;   // BARRIER_RELEASE: every member's part, by rank
  };
  // HEARTBEAT as a clock probe.
  struct ClockProbe {
    double sent_us = 0;       // the node's clock when sent (0: not stamped)
    double scheduler_us = 0;  // the answer: the scheduler's
  };
  // TRAINING_ENDED.
  struct EndedFields {
    int64_t clock = 0;    // the steps the worker pushed
    bool joined = false;  // it leaves the consistency rule
  };

  wire::Type type = wire::TYPE_UNSPECIFIED;
  wire::Role sender_role = wire::ROLE_UNSPECIFIED;
  int sender_rank = 0;
  wire::NodeInfo node;                 // REGISTER, REGISTER_REPLY, NODE_DEAD, NODE_JOINED, a relayed TRAINING_ENDED
  JobFields job;
  BarrierFields barrier;
  ClockProbe probe;
  EndedFields ended;
  uint64_t max_message_bytes = 0;      // MESSAGE_LIMIT, SHARD_LIMIT, LISTENING
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
