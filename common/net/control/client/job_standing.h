// JobStanding: whether this node still stands in a running job, as its scheduler client knows it:
// healthy, or why not (the scheduler lost or unreachable, its handshake refused, this node
// declared dead, the job failed); whether the scheduler shut the job down (and why, when it
// failed); and the change counter (events) that pollers compare, bumped by every part of the
// client that hears news.
//
// The first failure stays: a later one is not recorded. Every change wakes the client's waiters
// (the `wake` given at construction), after this class's mutex is released.
//
// Lock order: this mutex is a leaf. The client's other parts read it while holding their own
// mutex (their waits' conditions); it never takes theirs while holding its own.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>

#include "common/base/status.h"

namespace gradsync {

class JobStanding {
 public:
  // `wake` wakes every waiter of the client (called with no lock of this class held).
  explicit JobStanding(std::function<void()> wake) : wake_(std::move(wake)) {}
  JobStanding(const JobStanding&) = delete;
  JobStanding& operator=(const JobStanding&) = delete;

  // OK while the node stands in the job; otherwise why not.
  Status health() const;
  bool ok() const;
  // ok() and no shutdown: what every wait of the client waits on besides its own answer.
  bool running() const;
  // Records `why` as the node's failure unless one is recorded already (then returns false);
  // a recorded failure counts as an event.
  bool Fail(Status why);
  // The scheduler's SHUTDOWN: `why` is OK for an orderly end, else the job failed (recorded as
  // job_failure() and, unless the node failed first, as its health).
  void Shutdown(const Status& why);
  bool shutdown_requested() const;
  Status job_failure() const;

  uint64_t events() const { return events_.load(); }
  void Bump() { events_++; }

 private:
  std::function<void()> wake_;
  mutable std::mutex mu_;
  Status health_;
  bool shutdown_ = false;
  Status job_failure_;
  std::atomic<uint64_t> events_{0};
};

}  // namespace gradsync
