#include "server/requests/parked_requests.h"

namespace gradsync {

std::vector<ParkedRequests::Due> ParkedRequests::TakeDue(const ConsistencyController& rule) {
  std::vector<Due> out;
  for (auto it = parked_.begin(); it != parked_.end();) {
    const int w = it->pull.worker;
    const int64_t clock = it->pull.clock;
    if (!rule.clocks().IsLive(w) && !rule.clocks().HasLeft(w)) {
      it = parked_.erase(it);  // a dead worker's
    } else if (rule.CanAnswerPull(w, clock)) {
      out.push_back({std::move(*it), OkStatus()});
      it = parked_.erase(it);
    } else if (auto blocker = rule.Blocker(w, clock)) {
      // It waited for a worker that has ended training since: it would wait forever.
      out.push_back({std::move(*it), rule.BlockedError(clock, *blocker)});
      it = parked_.erase(it);
    } else {
      ++it;
    }
  }
  return out;
}

}  // namespace gradsync
