#include "worker/ps_trainer.h"

#include <algorithm>
#include <cstdio>
#include <memory>

#include "worker/local_sync.h"
#include "worker/periodic_sync.h"
#include "worker/training_loop.h"

namespace gradsync {

PsTrainer::PsTrainer(const PsTrainOptions& options, Model* model, const Dataset* train, const Dataset* test,
                     MetricsWriter* metrics, PsClient* client, SchedulerClient* scheduler)
    : options_(options), model_(model), train_(train), test_(test), metrics_(metrics), client_(client),
      scheduler_(scheduler) {}

Result<std::vector<EpochReport>> PsTrainer::Run(const std::function<void(const EpochReport&)>& on_epoch) {
  const bool straggles = options_.train.straggler.kind != StragglerSpec::Kind::kNone;
  const bool periodic = options_.train.periodic.every > 0;
  const bool overlap = options_.overlap && !HasSparse(model_->layout()) && options_.compression.empty() && !model_->on_device() &&
                       model_->waits_for_params() && !straggles && !periodic;
  if (options_.overlap && !overlap && !periodic) {
    std::printf("worker %d: overlap off (it needs a dense CPU mlp/softmax model, no compression, no straggler)\n",
                options_.rank);
    std::fflush(stdout);
  }
  std::unique_ptr<GradientSync> sync;
  if (periodic) {
    // Local SGD / DiLoCo: every step's update here, a push of the pseudo-gradient every H steps.
    sync = std::make_unique<PeriodicSync>(
        options_.train, model_, std::make_unique<LocalSync>(options_.train, model_),
        [this](Model* global, const LocalTrainOptions& outer) -> std::unique_ptr<GradientSync> {
          PsTrainOptions o = options_;
          o.train = outer;
          o.overlap = false;
          o.step_hook = {};
          o.step_lr = {};
          return std::make_unique<PsSync>(o, global, client_, scheduler_);
        });
  } else if (overlap) {
    sync = std::make_unique<PsOverlapSync>(options_, model_, client_, scheduler_);
  } else {
    sync = std::make_unique<PsSync>(options_, model_, client_, scheduler_);
  }
  TrainingLoopOptions loop_options;
  loop_options.train = options_.train;
  loop_options.evaluate = options_.rank == 0 && options_.evaluate;
  loop_options.before_compute = options_.step_hook;
  loop_options.step_lr = options_.step_lr;
  TrainingLoop loop(loop_options, model_, train_, test_, metrics_, sync.get());
  return loop.Run(on_epoch);
}

}  // namespace gradsync
