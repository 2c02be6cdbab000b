#include "server/requests/state_service.h"

#include <algorithm>

#include "common/base/clock.h"
#include "common/base/logging.h"

namespace gradsync {

Status StateService::Check(const PsRequest& r) {
  if (!shard_.built()) return ServerShard::NotBuilt();
  const std::string kind = OptimizerKindName(shard_.core->shard().optimizer().options().kind);
  if (!r.state.optimizer.empty() && r.state.optimizer != kind) {
    return InvalidArgumentError("the optimizer state is " + r.state.optimizer + "'s, but this shard's optimizer is " + kind);
  }
  if (r.num_keys > 0 || !r.codec.empty() || r.at.outside()) {
    return InvalidArgumentError("an optimizer state message carries raw floats over ZeroMQ (no keys, codec, lane or channel)");
  }
  const bool values = r.type == wire::STATE_PUSH && (r.state.slots > 0 || r.state.params);
  if (r.has_values != values) {
    return InvalidArgumentError(values ? "a STATE_PUSH carries its state vector" : "this optimizer state message carries no values");
  }
  const Segment range = shard_.core->shard().range();
  const bool ranged = r.type == wire::STATE_PULL || values;
  if (ranged ? r.segments.size() != 1 || r.segments[0] != range : !r.segments.empty()) {
    return InvalidArgumentError("an optimizer state message " +
                                std::string(ranged ? "covers exactly this shard's range [" + std::to_string(range.begin) +
                                                         ", " + std::to_string(range.end) + ")"
                                                   : "without a state vector names no segments"));
  }
  // The worker's current clock: its pushes so far (older or newer: kAborted, as a pull's).
  return shard_.core->rule().ValidatePull(r.worker, r.clock);
}

Status StateService::HandlePull(PsRequest r, Message& m) {
  RETURN_IF_ERROR(Check(r));
  if (shard_.core->rule().CanAnswerPull(r.worker, r.clock)) {
    AnswerPull(r, m);
  } else if (auto blocker = shard_.core->rule().Blocker(r.worker, r.clock)) {
    return shard_.core->rule().BlockedError(r.clock, *blocker);  // its point never comes
  } else {
    shard_.parked.Park(std::move(r), std::move(m), SteadyMs());
  }
  return OkStatus();
}

void StateService::AnswerPull(const PsRequest& r, const Message& m) {
  const int slots = shard_.core->shard().optimizer().num_slots();
  const auto state = shard_.core->shard().optimizer().state();
  const Segment range = shard_.core->shard().range();
  const size_t n = static_cast<size_t>(range.size());
  PsReply reply = ReplyTo(r, wire::STATE_PULL_REPLY, registration_.rank());
  reply.version = shard_.core->shard().version();
  reply.state.optimizer = OptimizerKindName(shard_.core->shard().optimizer().options().kind);
  reply.state.steps = shard_.core->shard().optimizer().steps();
  reply.state.skipped.assign(shard_.core->shard().optimizer().skipped().begin(), shard_.core->shard().optimizer().skipped().end());
  reply.state.slots = slots;
  // Every vector before anything else is handled: the answer is one state. (Copied into the
  // messages: the next update may change the state while ZeroMQ still sends them.)
  for (int k = 0; k < std::max(1, slots); ++k) {
    reply.state.slot = k;
    Payload p;
    if (slots > 0) {
      reply.segments = {range};
      p.has_values = true;
      p.values = state.subspan(static_cast<size_t>(k) * n, n);
    }
    if (Status s = socket_.Send(m.peer, EncodeReply(reply), p); !s.ok()) {
      GRADSYNC_LOG(WARNING) << "server " << registration_.rank() << ": optimizer state to worker " << r.worker << ": " << s;
      break;
    }
  }
  stats_.state_pulls++;
}

Status StateService::HandlePush(const PsRequest& r, const Message& m) {
  const int w = r.worker;
  if (Status s = Check(r); !s.ok()) {
    shard_.core->state_sets().Drop(w);  // a bad message drops the whole set: nothing of it is applied
    return s;
  }
  ASSIGN_OR_RETURN(const StateSets::Set* set, shard_.core->state_sets().Add(
                                                   r, m.peer, [&m](float* dst) { m.CopyValues(dst); }, shard_.core->shard()));
  if (!set->complete) {
    PsReply reply = ReplyTo(r, wire::STATE_PUSH_REPLY, registration_.rank());
    reply.version = shard_.core->shard().version();
    reply.state.optimizer = r.state.optimizer;
    reply.state.steps = r.state.steps;
    reply.state.slots = r.state.slots;
    reply.state.slot = r.state.slot;
    return socket_.Send(m.peer, EncodeReply(reply));
  }
  // At its quiescent point: as a pull of this clock is answered (aggregating modes: between rounds
  // clock - 1 and clock, which cannot be applied before this worker pushes clock).
  if (shard_.core->rule().CanAnswerPull(w, r.clock)) {
    Apply(*shard_.core->state_sets().Take(w));
  } else if (auto blocker = shard_.core->rule().Blocker(w, r.clock)) {
    shard_.core->state_sets().Drop(w);
    return shard_.core->rule().BlockedError(r.clock, *blocker);  // its point never comes
  }
  return OkStatus();
}

void StateService::Apply(StateSets::Set set) {
  const PsRequest& r = set.first;
  const int w = r.worker;
  const Status set_status =
      set.params ? shard_.core->SetParams(w, set.state) : shard_.core->SetOptimizerState(w, set.state, r.state.steps, r.state.skipped);
  if (!set_status.ok()) {
    replies_.Reply(set.peer, r.request_id, r.clock, set_status);
    return;
  }
  PsReply reply = ReplyTo(r, wire::STATE_PUSH_REPLY, registration_.rank());
  reply.version = shard_.core->shard().version();
  if (set.params) {
    stats_.params_sets++;
    GRADSYNC_LOG(INFO) << "server " << registration_.rank() << ": worker " << w << " set the parameters at clock " << r.clock;
    reply.state.params = true;
  } else {
    stats_.state_sets++;
    GRADSYNC_LOG(INFO) << "server " << registration_.rank() << ": worker " << w << " set the " << r.state.optimizer << " state at clock "
                       << r.clock << " (" << r.state.steps << " optimizer steps taken)";
    reply.state.optimizer = r.state.optimizer;
    reply.state.steps = r.state.steps;
    reply.state.slots = r.state.slots;
    reply.state.slot = std::max(0, r.state.slots - 1);
  }
  if (shard_.replication->active()) {
    // Answered once every backup holds it (its entries went as the core set it), as a push is.
    shard_.replication->HoldReply(set.peer, EncodeReply(reply));
  } else if (Status s = socket_.Send(set.peer, EncodeReply(reply)); !s.ok()) {
    GRADSYNC_LOG(WARNING) << "server " << registration_.rank() << ": optimizer state reply to worker " << w << ": " << s;
  }
  checkpoints_.Maybe(true);  // a change of the shard's state, as an update: in the next checkpoint
}

}  // namespace gradsync
