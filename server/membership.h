// Membership: the workers of one shard as its loop knows them, apart from the consistency rule.
//
// Which connection speaks for each worker rank (the first one that does; a restarted worker's
// new connection takes the rank over once the scheduler has announced it, and it may JOIN only
// then), what a restored shard held of each worker (its clock in the checkpoint or copy, to
// count the pushes lost when the worker resyncs, once per worker), and the scheduler's news
// (dead nodes, rejoined nodes, workers that ended training) not handled yet. No sockets.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/base/status.h"
#include "common/net/control/client/scheduler_client.h"
#include "common/ps/consistency.h"
#include "common/ps/ps_protocol.h"

namespace gradsync {

class Membership {
 public:
  // Whether message `r` from connection `peer` may speak for its worker: a rank in the job
  // (`num_workers`), the connection bound to it (the first that spoke for it; a JOIN of a worker
  // the rule does not hold live binds it anew once announced, kUnavailable before), and a worker
  // the rule holds live or that left it (join), not a dead one.
  Status CheckSender(const PsRequest& r, const std::string& peer, int num_workers, const ConsistencyController& rule);
  // The scheduler announced worker w restarted: its new connection will JOIN; the old one no
  // longer speaks for the rank.
  void Announced(int worker);
  // Worker w JOINed (or died): no longer waiting to.
  void Settled(int worker) { may_join_.erase(worker); }
  // Registered (again): the scheduler's news is read from its start.
  void ResetNews();
  // Registered again after a pause: every worker reconnects, none is waiting to JOIN.
  void ForgetConnections();

  // The shard was restored (a checkpoint, a backup's copy, its own state after a pause), with each
  // worker's clock in it.
  void Restored(std::vector<int64_t> pushed);
  // Worker w goes on at `clock`, the shard holding `at` of its pushes: the pushes the restore lost
  // of it (its first resync since the restore; nullopt after that, or with no restore).
  std::optional<int64_t> Resync(int worker, int64_t clock, int64_t at);
  int64_t restored_clock(int worker) const;

  // The scheduler's news not seen yet (each returned once, in order).
  std::vector<wire::NodeInfo> NewDead(const SchedulerClient& scheduler);
  std::vector<wire::NodeInfo> NewJoined(const SchedulerClient& scheduler);
  std::vector<EndedWorker> NewEnded(const SchedulerClient& scheduler);
  // Whether the scheduler has news since the last call that said so.
  bool News(const SchedulerClient& scheduler);

 private:
  std::map<int, std::string> identity_of_worker_;
  std::set<int> may_join_;  // workers the scheduler announced as rejoined, not yet JOINed
  std::vector<int64_t> restored_pushed_;  // per worker: its clock in what was restored
  std::set<int> resynced_;                // restored: workers that JOINed since
  bool restored_ = false;
  uint64_t seen_events_ = 0;
  size_t seen_dead_ = 0;
  size_t seen_joined_ = 0;
  size_t seen_ended_ = 0;
};

}  // namespace gradsync
