// BarrierWaits: what a node waits for the job's other members to reach, as the scheduler answers
// it: barriers (released, with a gather's data, or given up) and the shards' message limit (the
// largest message every live shard accepts, or the refusal). SchedulerClient sends the request;
// the wait for its answer is here.
//
// Lock order: its mutex, then JobStanding's (the waits' conditions read it).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "common/base/status.h"
#include "common/net/control/client/job_standing.h"
#include "common/net/control/control_protocol.h"

namespace gradsync {

class BarrierWaits {
 public:
  explicit BarrierWaits(const JobStanding& standing) : standing_(standing) {}
  BarrierWaits(const BarrierWaits&) = delete;
  BarrierWaits& operator=(const BarrierWaits&) = delete;

  void Released(const ControlMessage& c);     // BARRIER_RELEASE
  void LimitAnswer(const ControlMessage& c);  // MESSAGE_LIMIT
  // Waits at most timeout_s for barrier `name`'s release: every live member's gathered data (see
  // SchedulerClient::Gather), or why not.
  Result<std::vector<std::string>> Wait(const std::string& name, double timeout_s);
  // Waits at most timeout_s until every live shard accepts messages of `bytes`.
  Status WaitLimit(int64_t bytes, double timeout_s);
  // Wakes the waiters (their conditions may have changed elsewhere).
  void Wake();

 private:
  const JobStanding& standing_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::set<std::string> released_;
  std::map<std::string, Status> failed_;  // barrier name -> why the scheduler gave it up
  std::map<std::string, std::vector<std::string>> gathered_;  // barrier name -> released data
  int64_t limit_accepted_ = 0;  // MESSAGE_LIMIT answered: every live shard accepts this much
  Status limit_error_;
};

}  // namespace gradsync
