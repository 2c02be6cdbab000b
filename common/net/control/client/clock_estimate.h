// ClockEstimate: the scheduler's steady clock minus this process's, estimated from clock probes
// (heartbeats stamped when sent, which the scheduler answers with its clock): the shortest
// round trip's midpoint (error at most half its round trip, rtt_us), refined by every answered
// probe whose round trip is shorter still. Traces add it, so that every process of a job writes
// the scheduler's time.
//
// Lock order: its mutex, then JobStanding's (Estimate's condition reads it); it sends its probes
// through the link with no lock of its own held.
#pragma once

#include <condition_variable>
#include <mutex>

#include "common/net/control/client/job_standing.h"
#include "common/net/control/client/scheduler_link.h"
#include "common/net/control/control_protocol.h"

namespace gradsync {

class ClockEstimate {
 public:
  ClockEstimate(SchedulerLink& link, const JobStanding& standing) : link_(link), standing_(standing) {}
  ClockEstimate(const ClockEstimate&) = delete;
  ClockEstimate& operator=(const ClockEstimate&) = delete;

  // The scheduler's steady clock minus this process's, in microseconds (0 until known).
  double offset_us() const;
  double rtt_us() const;  // -1 until known
  // Sends `probes` probes, one after another (at most timeout_s in all): SchedulerClient::Register
  // sends SchedulerClient::kClockProbes; a process about to write its trace refines the offset
  // with more.
  void Estimate(int probes, double timeout_s);
  // The scheduler's answer to a heartbeat (the client's thread).
  void Answered(const ControlMessage& beat);
  // Wakes Estimate (its condition may have changed elsewhere).
  void Wake();

 private:
  SchedulerLink& link_;
  const JobStanding& standing_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  double offset_us_ = 0;
  double rtt_us_ = -1;
  int answered_ = 0;  // stamped heartbeats answered
};

}  // namespace gradsync
