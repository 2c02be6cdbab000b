#include "server/shard/push_intake.h"

#include <string>
#include <utility>

namespace gradsync {

Result<HeldPush*> PushIntake::Accept(const PsRequest& r, PushChunk chunk, size_t num_keys, int64_t version,
                                     ConsistencyController& rule) {
  if (r.push.version < 0 || r.push.version > version) {
    return AbortedError("push computed on version " + std::to_string(r.push.version) + " but the shard is at " +
                        std::to_string(version));
  }
  // A push (or each part of one) is checked against the consistency rule on arrival; it counts
  // with its last part.
  RETURN_IF_ERROR(rule.CheckPush(r.worker, r.clock));
  HeldPush* push = nullptr;
  if (r.parts > 1) {
    RETURN_IF_ERROR(assembler_.Check(r.worker, r, num_keys));
    push = assembler_.Add(r.worker, r, std::move(chunk));
    if (push == nullptr) return push;  // more parts to come
  } else {
    whole_ = HeldPush();
    whole_.chunks.push_back(std::move(chunk));
    whole_.lr = r.push.lr;
    push = &whole_;
  }
  rule.clocks().CountPush(r.worker);
  last_counted_ = r.worker;
  return push;
}

}  // namespace gradsync
