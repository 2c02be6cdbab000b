// Registration: this node's place in the job as the scheduler gave it (REGISTER_REPLY: its rank,
// whether it took a dead node's rank, a server's replication key) or the scheduler's refusal, and
// the wait for either (SchedulerClient::Register). The cluster table that comes with the reply is
// JobNews's.
//
// Lock order: its mutex, then JobStanding's (the wait's condition reads it).
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <string>

#include "common/base/status.h"
#include "common/net/control/client/job_standing.h"
#include "common/net/control/control_protocol.h"

namespace gradsync {

class Registration {
 public:
  explicit Registration(const JobStanding& standing) : standing_(standing) {}
  Registration(const Registration&) = delete;
  Registration& operator=(const Registration&) = delete;

  // REGISTER_REPLY.
  void Accept(const ControlMessage& reply);
  // An ERROR from the scheduler: before the reply it is the registration's refusal (returns
  // true); once registered it is not the registration's (returns false).
  bool TakeRefusal(const Status& why);
  // Waits until the scheduler answered, the node stopped standing in the job, or `deadline`.
  // Returns the answer: OK (registered) or the refusal (a kUnavailable one is taken: the node
  // asks again); nullopt when there is none (the node's standing failed, or the deadline passed).
  using Deadline = std::chrono::time_point<std::chrono::steady_clock, std::chrono::duration<double>>;
  std::optional<Status> Wait(Deadline deadline);
  // Wakes the waiter (its condition may have changed elsewhere).
  void Wake();

  int rank() const;  // -1 until registered
  bool rejoined() const;
  std::string replica_key() const;

 private:
  const JobStanding& standing_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool registered_ = false;
  Status refusal_;
  int rank_ = -1;
  bool rejoined_ = false;
  std::string replica_key_;
};

}  // namespace gradsync
