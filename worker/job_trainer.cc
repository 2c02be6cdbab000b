#include "worker/job_trainer.h"

#include <cstdio>

#include "worker/loop/training_loop.h"

namespace gradsync {

JobTraining TrainInJob(const SyncRecipe& recipe, const SyncLinks& links, bool evaluate, Model* model,
                       const Dataset* train, const Dataset* test, MetricsWriter* metrics,
                       const std::function<void(const EpochReport&)>& on_epoch) {
  BuiltSync built = MakeGradientSync(recipe, model, links);
  if (built.overlap_refused) {
    std::printf("worker %d: overlap off (it needs a dense CPU mlp/softmax model, no compression, no straggler)\n",
                recipe.ps_options.rank);
    std::fflush(stdout);
  }
  TrainingLoopOptions loop_options;
  loop_options.train = recipe.ps ? recipe.ps_options.train : recipe.allreduce_options.train;
  loop_options.evaluate = evaluate;
  if (recipe.ps) loop_options.hooks = recipe.ps_options.loop;
  TrainingLoop loop(loop_options, model, train, test, metrics, built.sync.get());
  JobTraining out;
  out.reports = loop.Run(on_epoch);
  if (built.allreduce != nullptr) out.optimizer_state_bytes = built.allreduce->optimizer_state_bytes();
  return out;
}

}  // namespace gradsync
