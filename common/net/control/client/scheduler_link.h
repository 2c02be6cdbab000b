// SchedulerLink: the connection of a node to its scheduler. Its loop, run by the scheduler
// client's thread, owns the ZeroMQ socket: it sends what the node queued (Send) and a heartbeat
// every `heartbeat_interval_s`, hands each message from the scheduler to the client (`deliver`),
// and judges the scheduler's silence. The scheduler answers every heartbeat; when it has been
// silent for `scheduler_timeout_s` and its connection is closed (it died: its kernel closed it)
// the link reports it lost (JobStanding::Fail), so that a node never outlives its job. A
// scheduler that is silent with its connection up (paused, starved of CPU: it judges nobody
// meanwhile, see Scheduler) gets up to kSchedulerUpFactor timeouts, said once in the log. A
// handshake the scheduler refused is reported the same way, once.
//
// Lock order: its mutex, then JobStanding's (Flush's condition reads it); the rank it stamps on
// messages is read from Registration with no lock of its own held.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <stop_token>
#include <string>

#include "common/base/status.h"
#include "common/net/control/client/job_standing.h"
#include "common/net/control/client/registration.h"
#include "common/net/control/control_protocol.h"
#include "common/net/transport.h"
#include "gradsync.pb.h"

namespace gradsync {

struct SchedulerClientOptions {
  std::string scheduler_endpoint;   // tcp://host:port
  wire::NodeInfo self;              // role, advertised host/port, requested rank
  std::string mode;                 // bsp | ssp | asp | allreduce
  int staleness = 0;
  std::string job_fingerprint;      // workers: settings that must agree across the job
  double heartbeat_interval_s = 1.0;
  double scheduler_timeout_s = 10.0;
};

// How many scheduler timeouts a node waits for a silent scheduler whose connection is up.
inline constexpr double kSchedulerUpFactor = 3.0;

class SchedulerLink {
 public:
  // `deliver` is called on the loop's thread for each control message the scheduler sends.
  SchedulerLink(TransportContext& ctx, const SchedulerClientOptions& options, JobStanding& standing,
                const Registration& self, std::function<void(const ControlMessage&)> deliver);
  SchedulerLink(const SchedulerLink&) = delete;
  SchedulerLink& operator=(const SchedulerLink&) = delete;

  // The loop, until `stop` (the client's thread).
  void Run(std::stop_token stop);
  // Queues `c` for the scheduler, stamped with this node's role and rank. Does not wait.
  void Send(ControlMessage c);
  // Waits (at most timeout_s) until every queued message has been handed to ZeroMQ.
  void Flush(double timeout_s);
  TrafficCounters traffic() const;
  // Called once, on the loop's thread, when the node's standing turns non-OK (the scheduler lost
  // or gone, this node declared dead, the job failed), so that a node busy elsewhere (an
  // all-reduce, which never asks the scheduler) stops too. Once set_on_unhealthy returns, the
  // previous callback is not running and will not run again.
  void set_on_unhealthy(std::function<void(const Status&)> fn);
  // Wakes Flush's waiters (their condition may have changed elsewhere).
  void Wake();

 private:
  // The loop's state between two turns.
  struct LinkState {
    std::chrono::steady_clock::time_point last_heard;
    bool heard = false;         // the scheduler has answered once: silence from then on is losing it
    bool said_waiting = false;  // the warning about a silent scheduler whose connection is up
    std::chrono::steady_clock::time_point next_beat;
  };

  // Run's steps: sends what the node queued and the heartbeat when it is due, takes one message
  // from the scheduler (or none in 5 ms), and judges the scheduler's silence.
  void SendQueued(Socket& sock, LinkState& link);
  void ReceiveOne(Socket& sock, LinkState& link);
  void CheckSilence(Socket& sock, LinkState& link);

  const SchedulerClientOptions& options_;
  TransportContext& ctx_;
  JobStanding& standing_;
  const Registration& self_;
  std::function<void(const ControlMessage&)> deliver_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<ControlMessage> outbox_;
  TrafficCounters traffic_;
  std::mutex on_unhealthy_mu_;  // held while on_unhealthy_ runs, and to replace it
  std::function<void(const Status&)> on_unhealthy_;
  bool told_unhealthy_ = false;  // the loop's thread only
};

}  // namespace gradsync
