// The parameter-server protocol: what a worker and a shard say to each other, as typed C++
// messages with one encoder and one decoder each, used by both sides (worker/ps/client/ps_client.cc and
// server/server.cc). On the wire a message is a wire::Header (common/proto/gradsync.proto) and
// raw key / value frames (common/net/transport.h); ARCHITECTURE.md, "Wire format", describes them.
//
//   worker -> shard   PsRequest   INIT (job + the shard's initial values), PUSH (a gradient, maybe
//                                 compressed, maybe one of `parts`), PULL (segments / keys wanted),
//                                 JOIN (clock -1: where do I start? c >= 0: I go on at c),
//                                 CHANNEL_ATTACH (a shared-memory lane, same host only, or a
//                                 data channel: a value channel beside ZeroMQ),
//                                 STATE_PULL / STATE_PUSH (the shard's optimizer state, one state
//                                 vector per message)
//   shard -> worker   PsReply     INIT_REPLY, PUSH_REPLY (version lag), PULL_REPLY (version,
//                                 wait, clock staleness, the values' segments), JOIN_REPLY
//                                 (clock), CHANNEL_ATTACH_REPLY, STATE_PULL_REPLY
//                                 (one per state vector), STATE_PUSH_REPLY, ERROR (a Status)
//
// Decoding checks everything a header alone can say is wrong (type, segment bounds, part numbers, a
// push's rate, error codes) and answers kInvalidArgument; what depends on a shard's state (its
// range, clocks, versions) is the receiver's to check.
#pragma once

#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/base/numeric/segment.h"
#include "common/base/numeric/tensor.h"
#include "common/base/status.h"
#include "common/optim/optimizer.h"
#include "common/table/table_spec.h"
#include "gradsync.pb.h"

namespace gradsync {

// A push comes in at most this many parts (PsRequest::parts).
inline constexpr int kMaxPushParts = 4096;
// A data channel's token (ValueRef::attach of a CHANNEL_ATTACH): random bytes, one per connection.
inline constexpr size_t kDataTokenBytes = 16;
// The most state vectors an optimizer keeps (Adam's and LAMB's m and v): STATE_* messages' state.slots.
inline constexpr int kMaxOptimizerSlots = 2;
// The most steps an optimizer state may say it has taken (a shard's counters stay below it).
inline constexpr int64_t kMaxOptimizerSteps = int64_t{1} << 62;

// Where a message's values are (wire::ValueRef): the message's own frames (CHANNEL_ZMQ), or a
// value channel beside ZeroMQ. One reference per message, whatever the channel.
struct ValueRef {
  wire::Channel channel = wire::CHANNEL_ZMQ;
  uint64_t seq = 0;    // PUSH: the push's number on its lane or its frame's on the data channel;
                       // PULL_REPLY over a data channel: its frame's
  std::string attach;  // CHANNEL_ATTACH: the lane's name or the data channel's token
  int port = 0;        // CHANNEL_ATTACH_REPLY for a data channel: where to connect
  bool outside() const { return channel != wire::CHANNEL_ZMQ; }
};

// A STATE_* message's optimizer state (wire::StateVector), what StateService and StateTransfer act
// on. STATE_PULL: the optimizer the worker expects ("": whatever the shard's is). STATE_PUSH and
// STATE_*_REPLY: the optimizer the state is for, its steps taken, its state vectors (`slots`, one
// message each, 0: one message without values) and the one this message carries (`slot`, its
// values: the shard's range).
struct StateVectorFields {
  std::string optimizer;
  int64_t steps = 0;
  std::vector<int64_t> skipped;  // per layer of the shard's range (wire::StateVector::skipped)
  int slots = 0;
  int slot = 0;
  bool params = false;  // the set is (STATE_PUSH_REPLY: was) the shard's parameters (wire::StateVector::params)
};

// What a PUSH says of its gradient, what the shard's push intake acts on.
struct PushFields {
  int64_t version = 0;                   // the shard version the gradient was computed on
  float lr = NAN;                        // the worker's own rate for this gradient; NaN: the job's schedule
  std::vector<uint32_t> absent_tensors;  // tensors without a gradient (wire::Header::absent_tensors)
};

struct PsRequest {
  wire::Type type = wire::TYPE_UNSPECIFIED;  // INIT, PUSH, PULL, JOIN, CHANNEL_ATTACH, STATE_PULL or STATE_PUSH
  int worker = 0;
  uint64_t request_id = 0;
  int64_t clock = 0;
  PushFields push;                // PUSH
  std::vector<Segment> segments;  // sorted and disjoint, as every sender cuts them
  std::string codec;              // PUSH: the values are this codec's payload; PULL: a delta is welcome
  int parts = 0;                  // PUSH in parts: 0 or 1 means the whole push in this message
  int part = 0;                   // 0-based, sent in order
  wire::JobConfig job;            // INIT
  ValueRef at;                    // PUSH, PULL: the channel of the values; CHANNEL_ATTACH: the one to attach
  bool has_values = false;        // the frames the header announces (the transport checked they came)
  uint64_t num_keys = 0;
  // PUSH, PULL of table rows (wire::PsFields::tables): the keys are these tables' ids, run by run;
  // no segments, no codec, over ZeroMQ.
  std::vector<TableRun> tables;
  StateVectorFields state;        // STATE_PULL, STATE_PUSH
};

// What a reply says of its request's staleness, what the worker's replies report.
struct ReplyStaleness {
  int64_t version_lag = 0;      // PUSH_REPLY: shard version at apply - the push's version
  int64_t clock_staleness = 0;  // PULL_REPLY: see ConsistencyController::ClockStaleness
  double wait_ms = 0;           // PULL_REPLY: how long the consistency rule held the pull
};

// A pull answered through a lane comes in `parts` messages (0 or 1: this one alone); this is
// `part` (0-based, in order).
struct ReplyPieces {
  int parts = 0;
  int part = 0;
};

struct PsReply {
  // INIT_REPLY, PUSH_REPLY, PULL_REPLY, JOIN_REPLY, CHANNEL_ATTACH_REPLY, STATE_PULL_REPLY,
  // STATE_PUSH_REPLY or ERROR
  wire::Type type = wire::TYPE_UNSPECIFIED;
  int server = 0;
  uint64_t request_id = 0;
  int64_t clock = 0;              // the request's; JOIN_REPLY: where the worker goes on
  int64_t version = 0;            // PULL_REPLY, STATE_*_REPLY: the shard's version of the values
  ReplyStaleness staleness;       // PUSH_REPLY, PULL_REPLY
  std::vector<Segment> segments;  // PULL_REPLY: where the values go
  std::string codec;              // PULL_REPLY: the values are a compressed delta to add
  ValueRef at;                    // PULL_REPLY: where the values are; CHANNEL_ATTACH_REPLY: the channel
  bool has_values = false;        // the frames the header announces (the transport checked they came)
  uint64_t num_keys = 0;
  std::vector<TableRun> tables;   // PULL_REPLY of table rows: the request's runs (the values: their rows)
  ReplyPieces piece;              // PULL_REPLY over a lane
  // STATE_PULL_REPLY: the shard's (values at `segments`, the shard's range). STATE_PUSH_REPLY: the
  // STATE_PUSH's.
  StateVectorFields state;
  Status error;                   // ERROR
};

// A reply of `type` from shard `server` to `request` (its id and clock).
PsReply ReplyTo(const PsRequest& request, wire::Type type, int server);

wire::Header EncodeRequest(const PsRequest& r);
// Fails (kInvalidArgument) on a type a worker does not send, a sender that is not a worker,
// bad segments or part numbers, a rate on anything but a PUSH or one that is not finite and >= 0,
// optimizer state fields on anything but STATE_PULL / STATE_PUSH or out of range there (an
// unknown optimizer, steps < 0 or past kMaxOptimizerSteps, state.slot not below state.slots, more
// than kMaxOptimizerSlots vectors; a STATE_PULL names an optimizer at most).
Result<PsRequest> DecodeRequest(const wire::Header& h);

wire::Header EncodeReply(const PsReply& r);
Result<PsReply> DecodeReply(const wire::Header& h);
// What any message's header says of itself, read without decoding the rest: to answer or fail
// the request of a message that does not decode, to route a message to its plane, for traces.
struct MessageTag {
  wire::Type type = wire::TYPE_UNSPECIFIED;
  int sender_rank = 0;
  uint64_t request_id = 0;
  int64_t clock = 0;
};
MessageTag TagOf(const wire::Header& h);

// The shards' optimizer in a JobConfig (INIT, shard checkpoints): worker 0 writes it, a shard
// reads it back. JobOptimizer fails (kInvalidArgument) on an unknown optimizer, settings
// ValidateOptimizerOptions refuses, and adam for a job with a sparse tensor.
void SetJobOptimizer(const OptimizerOptions& options, wire::JobConfig* job);
Result<OptimizerOptions> JobOptimizer(const wire::JobConfig& job);

// Segments: offset/length on the wire, [begin, end) here. Each offset and length must be at most
// 2^40 (so that their sum cannot overflow), else kInvalidArgument.
void EncodeSegments(std::span<const Segment> segments, wire::Header* h);
Result<std::vector<Segment>> DecodeSegments(const wire::Header& h);
// The number of elements the segments cover.
uint64_t TotalSize(std::span<const Segment> segments);

// The largest frame a worker and a shard exchange in a job with this layout over `num_servers`
// shards (Partitioner's ranges): a shard's whole range as floats (INIT, a push, a pull's reply), or
// its sparse elements as 8-byte keys, plus 64 bytes (a compressed payload is at most its raw values
// plus a small header); never below kMaxControlMessageBytes (headers). Both sides' ZMQ_MAXMSGSIZE.
int64_t MaxShardMessageBytes(std::span<const TensorInfo> layout, int num_servers);

}  // namespace gradsync
