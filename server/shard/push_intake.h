// PushIntake: a push on its way into the shard, until it counts. Each message (or part of an
// overlapped push) is checked against the shard's version (a push computed on a future one is
// kAborted) and the consistency rule, and gathered with its earlier parts (PushAssembler); the
// whole push counts with its last part, in the rule. After a refused part the rest of that push
// is dropped quietly (IsRestOfFailed). Also who was counted last, for traces.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/base/status.h"
#include "common/ps/consistency.h"
#include "common/ps/ps_protocol.h"
#include "server/shard/push_assembler.h"

namespace gradsync {

class PushIntake {
 public:
  // A push (or part) whose values the caller has read and checked (ranges, keys, decoding),
  // carrying `num_keys` keys, against a shard at `version` and `rule`: the whole push once its last
  // part is in, counted by the rule (the caller takes it), or null while parts are to come.
  Result<HeldPush*> Accept(const PsRequest& r, PushChunk chunk, size_t num_keys, int64_t version,
                           ConsistencyController& rule);
  // A push (or part) was refused: the rest of an overlapped one is dropped (IsRestOfFailed).
  void Refused(int worker, const PsRequest& part) {
    if (part.parts > 1) assembler_.Failed(worker, part);
  }
  bool IsRestOfFailed(int worker, const PsRequest& part) const { return assembler_.IsRestOfFailed(worker, part); }
  // A half-sent push of a worker that left, skips ahead or reconnects goes (and a push taken).
  void ForgetParts(int worker) { assembler_.Forget(worker); }
  void ForgetAllParts() { assembler_ = PushAssembler(); }
  // For traces: the worker whose push was counted last (the one a completed round or a held pull
  // waited for), -1 before any.
  int last_counted() const { return last_counted_; }

 private:
  PushAssembler assembler_;
  HeldPush whole_;  // Accept's push in one message, until it is taken
  int last_counted_ = -1;
};

}  // namespace gradsync
