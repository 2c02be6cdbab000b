// ErrorReplies: the one place a shard server refuses a request: an ERROR reply naming the shard
// (to a peer that can be answered), counted in the requests' `rejected` and logged at DEBUG.
#pragma once

#include <cstdint>
#include <string>

#include "common/base/status.h"
#include "common/net/transport.h"
#include "server/server_options.h"
#include "server/server_registration.h"

namespace gradsync {

class ErrorReplies {
 public:
  ErrorReplies(Socket& socket, const ServerRegistration& registration, RequestStats& stats)
      : socket_(socket), registration_(registration), stats_(stats) {}

  // The refusal of message `m` (its request id and clock from its header).
  void Reply(const Message& m, const Status& s);
  void Reply(const std::string& peer, uint64_t request_id, int64_t clock, const Status& s);

 private:
  Socket& socket_;
  const ServerRegistration& registration_;
  RequestStats& stats_;
};

}  // namespace gradsync
