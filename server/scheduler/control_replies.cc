#include "server/scheduler/control_replies.h"

#include "common/base/logging.h"

namespace gradsync {

void ControlReplies::Reply(const std::string& peer, ControlMessage c) {
  c.sender_role = wire::SCHEDULER;
  Status s = socket_.Send(peer, EncodeControl(c));
  if (!s.ok()) GRADSYNC_LOG(DEBUG) << "scheduler: reply failed: " << s;
}

void ControlReplies::Error(const std::string& peer, const Status& s) {
  ControlMessage c = Control(wire::ERROR);
  c.status = s;
  Reply(peer, std::move(c));
}

}  // namespace gradsync
