// ControlReplies: the scheduler's messages to nodes, each stamped as the scheduler's and sent on
// its ROUTER socket to one connection; a send that fails (the node went) is logged at DEBUG.
//
// Threading: the scheduler's.
#pragma once

#include <string>

#include "common/base/status.h"
#include "common/net/control/control_protocol.h"
#include "common/net/transport.h"

namespace gradsync {

class ControlReplies {
 public:
  explicit ControlReplies(Socket& socket) : socket_(socket) {}
  void Reply(const std::string& peer, ControlMessage c);
  // An ERROR carrying `s`.
  void Error(const std::string& peer, const Status& s);

 private:
  Socket& socket_;
};

}  // namespace gradsync
