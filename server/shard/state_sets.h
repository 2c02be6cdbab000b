// StateSets: the optimizer states workers are setting (STATE_PUSH), as their vectors come.
//
// A worker sends its state one vector per message (vectors 0, 1, ... of one request, in order);
// each is checked on arrival (CheckOptimizerSlot) and gathered, and a bad one drops the whole
// set: nothing of it is applied. A parameter set (r.params) is one message with the range's
// values, checked finite. A set is complete once its last vector has come; the shard sets
// it at its quiescent point, where a pull of its clock would be answered (aggregating modes:
// between rounds clock - 1 and clock). No sockets: the shard's loop replies.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/base/status.h"
#include "common/ps/consistency.h"
#include "common/ps/ps_protocol.h"
#include "server/shard/kv/kv_shard.h"

namespace gradsync {

class StateSets {
 public:
  struct Set {
    std::string peer;
    PsRequest first;  // its first message: every later one carries the same id, clock, optimizer, steps
    std::vector<float> state;
    int next = 0;  // the vector due next
    bool complete = false;
    bool params = false;  // the shard's parameters (wire::StateVector::params), in `state`
  };
  // Copies a message's values (as many as the shard's range holds) to `dst`.
  using CopyValues = std::function<void(float* dst)>;
  // Gathers vector r.state.slot of worker r.worker's set (sent by `peer`; its values copied by
  // `copy`) for `shard`; the set as it is now. An error (a count of vectors that is not the
  // shard's, a vector out of order, a bad value) drops the set.
  Result<const Set*> Add(const PsRequest& r, const std::string& peer, const CopyValues& copy, const KvShard& shard);
  void Drop(int worker) { sets_.erase(worker); }
  void Clear() { sets_.clear(); }
  // Worker w's set, which leaves.
  std::optional<Set> Take(int worker);
  // The complete sets whose point has come (ok) or never will (`refused`: a worker that ended
  // training holds it back), in worker order; a dead worker's set goes unanswered.
  struct Due {
    Set set;
    Status refused;
  };
  std::vector<Due> TakeDue(const ConsistencyController& rule);

 private:
  std::map<int, Set> sets_;
};

}  // namespace gradsync
