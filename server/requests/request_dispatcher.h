// RequestDispatcher: a shard server's requests in, each to its handler. It reads the data
// socket (at most 64 messages a pass; with backup links to watch, a poll first), hands REPLICATE
// entries to the replication, and decodes every other message (common/ps/ps_protocol.h) and
// checks its sender (Membership) before routing it: INIT and JOIN to the lifecycle, PUSH / PULL /
// CHANNEL_ATTACH to the push/pull path, STATE_PULL / STATE_PUSH to the state service. A
// malformed message, an unknown type or a handler's error is answered with an ERROR (or dropped
// when it cannot be answered) and counted; it never stops the loop or changes the shard.
#pragma once

#include "common/net/transport.h"
#include "server/requests/error_replies.h"
#include "server/requests/push_pull_service.h"
#include "server/requests/state_service.h"
#include "server/server_lifecycle.h"
#include "server/server_options.h"
#include "server/server_registration.h"
#include "server/server_shard.h"

namespace gradsync {

class RequestDispatcher {
 public:
  RequestDispatcher(Socket& socket, ServerShard& shard, ServerRegistration& registration, ServerLifecycle& lifecycle,
                    PushPullService& push_pull, StateService& state, ErrorReplies& replies, RequestStats& stats)
      : socket_(socket),
        shard_(shard),
        registration_(registration),
        lifecycle_(lifecycle),
        push_pull_(push_pull),
        state_(state),
        replies_(replies),
        stats_(stats) {}

  // One pass over what came in.
  void Receive();
  // One message: decoded, its sender checked, handled (or refused).
  void Handle(Message& m);

 private:
  Socket& socket_;
  ServerShard& shard_;
  ServerRegistration& registration_;
  ServerLifecycle& lifecycle_;
  PushPullService& push_pull_;
  StateService& state_;
  ErrorReplies& replies_;
  RequestStats& stats_;
};

}  // namespace gradsync
