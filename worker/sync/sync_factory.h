// MakeGradientSync: the one place that decides which GradientSync a run trains through, from
// the run's options: the parameter server's (PsSync, or PsOverlapSync where PsOverlaps allows it)
// or all-reduce's (AllreduceSync; for a model with embedding tables, inside a TableAllreduceSync that
// keeps a replica of the tables on every worker and all-gathers each step's rows:
// worker/allreduce/tables/table_allreduce_sync.h), each inside a PeriodicSync for rounds of local steps
// (--sync-every). gradsync-worker (worker/job_trainer.h) and the Python frontend
// (python/native/frontend.cc) both build their sync here, so that a setting chooses the same sync
// in both; the simulator calls the same decisions (common/config/sync_decisions.h).
//
//   SyncRecipe r{.ps = true, .ps_options = PsOptionsFrom(c, train, rank, n, oversubscribed)};
//   BuiltSync s = MakeGradientSync(r, model, {.client = client, .scheduler = scheduler});
//   TrainingLoop loop(loop_options, model, &train, &test, metrics, s.sync.get());
#pragma once

#include <memory>
#include <string>

#include "allreduce/collective.h"
#include "common/net/control/client/scheduler_client.h"
#include "models/model.h"
#include "worker/allreduce/allreduce_sync.h"
#include "worker/ps/client/ps_client.h"
#include "worker/ps/ps_sync.h"
#include "worker/sync/gradient_sync.h"

namespace gradsync {

// What the sync exchanges through (all must outlive it): the PS modes' client and scheduler, or
// all-reduce's collective.
struct SyncLinks {
  PsClient* client = nullptr;
  SchedulerClient* scheduler = nullptr;
  Collective* collective = nullptr;
};

struct SyncRecipe {
  bool ps = false;                          // the PS modes (ps_options), else all-reduce (allreduce_options)
  PsTrainOptions ps_options;
  AllreduceTrainOptions allreduce_options;
  // Rounds (train.periodic.every > 0): a LocalSync makes each step's update with the job's
  // optimizer (gradsync-worker), or the caller's own optimizer has before FinishStep (false: the
  // Python frontend). The round's exchange is the mode's sync over the global model, with the
  // outer SGD (OuterTrainOptions), which it applies itself, and no overlap.
  bool local_update = true;
};

struct BuiltSync {
  std::unique_ptr<GradientSync> sync;
  // "ps", "ps-overlap", "allreduce", "allreduce-overlap", "allreduce-tables" (a model with
  // tables), "rounds-ps" or "rounds-allreduce".
  std::string kind;
  bool overlapped = false;       // communication overlaps backward (PsOverlaps / AllreduceOverlaps)
  bool overlap_refused = false;  // PS: overlap was asked for and the model or settings refuse it
  PsSyncBase* ps = nullptr;      // the PS sync (not in rounds)
  AllreduceSync* allreduce = nullptr;  // the all-reduce sync (with tables: the dense one inside), or the rounds' outer one
};

BuiltSync MakeGradientSync(const SyncRecipe& recipe, Model* model, const SyncLinks& links);

}  // namespace gradsync
