// ParkedRequests: the pulls (and STATE_PULLs) the consistency rule cannot answer yet, with the
// ZeroMQ message each came in, until the rule lets them through. The shard's loop (Server) parks
// them and asks for the due ones after every change that may let one through (a counted push, a
// round applied, a worker that died or left). Not thread-safe: the loop's alone.
#pragma once

#include <deque>
#include <vector>

#include "common/base/status.h"
#include "common/net/transport.h"
#include "common/ps/consistency.h"
#include "common/ps/ps_protocol.h"

namespace gradsync {

class ParkedRequests {
 public:
  struct Parked {
    Message msg;
    PsRequest pull;
    double since_ms = 0;
  };
  void Park(PsRequest pull, Message msg, double now_ms) { parked_.push_back({std::move(msg), std::move(pull), now_ms}); }
  // The parked requests that are due now under `rule`, in the order they came: each answerable
  // now, or refused (`refused`: a worker that ended training will never push what it waits
  // for). A dead worker's go without an answer; the rest stay.
  struct Due {
    Parked parked;
    Status refused;
  };
  std::vector<Due> TakeDue(const ConsistencyController& rule);
  void Clear() { parked_.clear(); }

 private:
  std::deque<Parked> parked_;
};

}  // namespace gradsync
