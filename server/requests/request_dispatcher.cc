#include "server/requests/request_dispatcher.h"

#include <string>
#include <vector>

#include "common/base/logging.h"
#include "common/obs/trace.h"
#include "common/ps/ps_protocol.h"

namespace gradsync {

void RequestDispatcher::Handle(Message& m) {
  const MessageTag tag = TagOf(m.header);
  if (m.malformed.ok() && tag.type == wire::REPLICATE) {
    if (!shard_.replication->HandleEntry(m, registration_.scheduler(), socket_).ok()) stats_.rejected++;
    return;
  }
  if (!m.malformed.ok()) {
    stats_.malformed++;
    replies_.Reply(m, m.malformed);
    return;
  }
  TraceSpan span("receive", "server", {{"type", static_cast<double>(tag.type)},
                                       {"worker", static_cast<double>(tag.sender_rank)},
                                       {"clock", static_cast<double>(tag.clock)},
                                       {"bytes", static_cast<double>(m.values.size())}});
  auto r = DecodeRequest(m.header);
  Status s = r.ok() ? shard_.membership.CheckSender(*r, m.peer, registration_.table().workers_size(),
                                                    shard_.core->rule())
                     : r.status();
  if (s.ok()) {
    switch (r->type) {
      case wire::INIT: s = lifecycle_.HandleInit(*r, m); break;
      case wire::PUSH: s = push_pull_.HandlePush(*r, m); break;
      case wire::PULL: s = push_pull_.HandlePull(std::move(*r), m); break;
      case wire::JOIN: s = lifecycle_.HandleJoin(*r, m); break;
      case wire::CHANNEL_ATTACH: s = push_pull_.HandleAttach(*r, m); break;
      case wire::STATE_PULL: s = state_.HandlePull(std::move(*r), m); break;
      case wire::STATE_PUSH: s = state_.HandlePush(*r, m); break;
      default: s = InvalidArgumentError("a server does not handle message type " + std::to_string(r->type));
    }
  }
  if (!s.ok()) {
    TraceInstant("refused", "server", {{"code", static_cast<double>(s.code())}});
    replies_.Reply(m, s);
  }
}

void RequestDispatcher::Receive() {
  // The data socket's messages, at most 64 at a time. With backup links to watch as well, a
  // poll says which sockets have some; with the data socket alone ZeroMQ's blocking receive
  // waits for it (one system call to sleep in, where a poll and then a receive take several).
  int wait_ms = 20;
  if (shard_.replication->on()) {
    std::vector<Socket*> sockets{&socket_};
    for (Socket* l : shard_.replication->sockets()) sockets.push_back(l);
    auto ready = PollReadable(sockets, 20);
    if (!ready.ok()) GRADSYNC_LOG(WARNING) << ready.status();
    wait_ms = ready.ok() && !ready->empty() && ready->front() == 0 ? 0 : -1;
  }
  for (int k = 0; k < 64 && wait_ms >= 0; ++k) {
    auto m = socket_.Recv(k == 0 ? wait_ms : 0);
    if (m.ok()) Handle(*m);
    else break;
  }
}

}  // namespace gradsync
