#include "server/requests/error_replies.h"

#include "common/base/logging.h"
#include "common/ps/ps_protocol.h"

namespace gradsync {

void ErrorReplies::Reply(const Message& m, const Status& s) {
  const MessageTag tag = TagOf(m.header);
  Reply(m.peer, tag.request_id, tag.clock, s);
}

void ErrorReplies::Reply(const std::string& peer, uint64_t request_id, int64_t clock, const Status& s) {
  const int rank = registration_.rank();
  stats_.rejected++;
  GRADSYNC_LOG(DEBUG) << "server " << rank << ": rejected a message: " << s;
  if (peer.empty()) return;
  PsReply r;
  r.type = wire::ERROR;
  r.server = rank;
  r.request_id = request_id;
  r.clock = clock;
  r.error = Status(s.code(), "server " + std::to_string(rank) + ": " + s.message());
  (void)socket_.Send(peer, EncodeReply(r));
}

}  // namespace gradsync
