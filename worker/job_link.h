// JobLink: what a worker process holds of the job it joined: the transport, CURVE keys, the
// scheduler client, its rank and the cluster table, and (all-reduce) the TCP ring. Shared by
// gradsync-worker (worker/run_worker.cc) and the Python frontend (python/), so that both join
// a job from the same TrainConfig and WorkerProcess in the same way.
//
//   JobLink job;
//   if (Status s = JoinJob(train, process, &job); !s.ok()) ...   // kInvalidArgument: refused
//   ... train over job.ring / a PsClient on job.table ...
//   job.Finished(status);                                          // tells the scheduler
//
// Local mode joins nothing (the context only). Not thread-safe; one per process.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "allreduce/tcp_ring.h"
#include "common/base/status.h"
#include "common/config/train_config.h"
#include "common/net/control/client/scheduler_client.h"
#include "common/net/security.h"
#include "common/net/transport.h"
#include "gradsync.pb.h"

namespace gradsync {

struct JobLink {
  TransportContext ctx{1};
  std::unique_ptr<CurveAuthenticator> auth;  // declared after ctx: stops first
  std::unique_ptr<SchedulerClient> scheduler;
  wire::ClusterTable table;
  int rank = 0;
  std::unique_ptr<RingCollective> ring;
  // A host of the job runs more workers than it has cores (--overlap's default, OverlapOf):
  // allreduce: any rank's host, agreed over the ring (every rank overlaps alike or none does);
  // bsp|ssp|asp: this worker's host.
  bool oversubscribed = false;

  ~JobLink();
  int num_workers() const { return scheduler ? table.workers_size() : 1; }
  // Tells the scheduler how this worker ended and gives the message up to 2 s to leave.
  void Finished(const Status& s);
};

// CURVE (--auth-dir), the ring's listening socket (all-reduce), registration with the scheduler
// (the PS modes get the rank from it; the job fingerprint of `train` must match the other
// workers') and the ring's connections. kInvalidArgument: a bad setting or the scheduler's
// refusal (the message says which settings differ); other codes: the job was not reached or was
// lost. `train` and `process` must have passed Validate().
Status JoinJob(const config::TrainConfig& train, const config::WorkerProcess& process, JobLink* job);

// The workers of `table` on worker `rank`'s host (by their advertised host), and whether they
// outnumber `cores` (allreduce/plan/algorithm.h's Oversubscribed).
int WorkersOnHost(const wire::ClusterTable& table, int rank);
bool HostOversubscribed(const wire::ClusterTable& table, int rank, unsigned cores);

}  // namespace gradsync
