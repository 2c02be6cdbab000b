// StateService: the optimizer state and parameters workers read (STATE_PULL) and set (STATE_PUSH)
// (ARCHITECTURE.md, "Optimizer state"). Both requests carry the worker's current clock and are
// served where a pull of that clock would be answered (held until then): in an aggregating mode
// exactly between rounds clock - 1 and clock. What both must be: this shard initialized, its
// optimizer (when named), its range, the worker's current clock. A set's vectors are gathered
// (ShardCore's StateSets, each checked on arrival; a bad one drops the set) and the state is set
// whole when the last has come and the clock allows it, sent to the backups (the reply waits for
// them) and in the next checkpoint.
#pragma once

#include "common/base/status.h"
#include "common/net/transport.h"
#include "common/ps/ps_protocol.h"
#include "server/requests/error_replies.h"
#include "server/server_checkpoints.h"
#include "server/server_options.h"
#include "server/server_registration.h"
#include "server/server_shard.h"
#include "server/shard/state_sets.h"

namespace gradsync {

class StateService {
 public:
  StateService(Socket& socket, ServerShard& shard, const ServerRegistration& registration, ServerCheckpoints& checkpoints,
               ErrorReplies& replies, StateStats& stats)
      : socket_(socket),
        shard_(shard),
        registration_(registration),
        checkpoints_(checkpoints),
        replies_(replies),
        stats_(stats) {}

  // STATE_PULL: answered now, refused when its point never comes, or parked until it comes.
  Status HandlePull(PsRequest r, Message& m);
  // The whole state, one STATE_PULL_REPLY per state vector, sent before anything else is handled.
  void AnswerPull(const PsRequest& r, const Message& m);
  // STATE_PUSH: one vector of a set, gathered; the set is applied at once when complete and due.
  Status HandlePush(const PsRequest& r, const Message& m);
  // Sets a worker's gathered state, sends it to the backups (the reply waits for them) and replies.
  void Apply(StateSets::Set set);

 private:
  Status Check(const PsRequest& r);

  Socket& socket_;
  ServerShard& shard_;
  const ServerRegistration& registration_;
  ServerCheckpoints& checkpoints_;
  ErrorReplies& replies_;
  StateStats& stats_;
};

}  // namespace gradsync
