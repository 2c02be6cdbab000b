#include "worker/sync/sync_factory.h"

#include "worker/allreduce/tables/table_allreduce_sync.h"
#include "worker/sync/local_sync.h"
#include "worker/sync/periodic_sync.h"

namespace gradsync {
namespace {

// The rounds' outer sync: the mode's own over the global model, with the outer SGD as its
// optimizer (applied by the sync itself), no overlap, no per-step hooks or rates.
PeriodicSync::OuterFactory OuterOf(const SyncRecipe& r, const SyncLinks& links, BuiltSync* built) {
  return [r, links, built](Model* global, const LocalTrainOptions& outer) -> std::unique_ptr<GradientSync> {
    if (r.ps) {
      PsTrainOptions o = r.ps_options;
      o.train = outer;
      o.overlap.enabled = false;
      o.loop = {};
      return std::make_unique<PsSync>(o, global, links.client, links.scheduler);
    }
    AllreduceTrainOptions o = r.allreduce_options;
    o.train = outer;
    o.overlap = false;
    o.apply_update = true;
    auto made = std::make_unique<AllreduceSync>(o, global, links.collective);
    built->allreduce = made.get();
    return made;
  };
}

}  // namespace

BuiltSync MakeGradientSync(const SyncRecipe& r, Model* model, const SyncLinks& links) {
  BuiltSync built;
  const LocalTrainOptions& train = r.ps ? r.ps_options.train : r.allreduce_options.train;
  if (train.periodic.every > 0) {
    // Local SGD / DiLoCo: every step's update here (or the caller's), an exchange every H steps.
    built.sync = std::make_unique<PeriodicSync>(train, model,
                                                r.local_update ? std::make_unique<LocalSync>(train, model) : nullptr,
                                                OuterOf(r, links, &built));
    built.kind = r.ps ? "rounds-ps" : "rounds-allreduce";
    return built;
  }
  if (r.ps) {
    const OverlapFacts facts = PsSyncBase::OverlapFactsOf(r.ps_options, *model);
    built.overlapped = PsOverlaps(facts);
    built.overlap_refused = PsOverlapRefused(facts);
    std::unique_ptr<PsSyncBase> ps;
    if (built.overlapped) {
      ps = std::make_unique<PsOverlapSync>(r.ps_options, model, links.client, links.scheduler);
    } else {
      ps = std::make_unique<PsSync>(r.ps_options, model, links.client, links.scheduler);
    }
    built.ps = ps.get();
    built.sync = std::move(ps);
    built.kind = built.overlapped ? "ps-overlap" : "ps";
    return built;
  }
  built.overlapped = AllreduceOverlaps(AllreduceSync::OverlapFactsOf(r.allreduce_options, *model, links.collective->size()));
  auto sync = std::make_unique<AllreduceSync>(r.allreduce_options, model, links.collective);
  built.allreduce = sync.get();
  if (!model->tables().empty()) {
    // Embedding tables: a replica on every worker, the step's rows all-gathered beside the dense
    // all-reduce (never overlapped: OverlapFactsOf counts tables as sparse).
    built.sync = std::make_unique<TableAllreduceSync>(std::move(sync), r.allreduce_options, model, links.collective);
    built.kind = "allreduce-tables";
    return built;
  }
  built.sync = std::move(sync);
  built.kind = built.overlapped ? "allreduce-overlap" : "allreduce";
  return built;
}

}  // namespace gradsync
