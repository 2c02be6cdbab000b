#include "worker/allreduce_trainer.h"

#include "worker/local_sync.h"
#include "worker/periodic_sync.h"
#include "worker/training_loop.h"

namespace gradsync {

AllreduceTrainer::AllreduceTrainer(const AllreduceTrainOptions& options, Model* model, const Dataset* train,
                                   const Dataset* test, MetricsWriter* metrics, Collective* collective)
    : options_(options), model_(model), train_(train), test_(test), metrics_(metrics), collective_(collective) {}

Result<std::vector<EpochReport>> AllreduceTrainer::Run(const std::function<void(const EpochReport&)>& on_epoch) {
  TrainingLoopOptions loop_options;
  loop_options.train = options_.train;
  loop_options.evaluate = collective_->rank() == 0 && options_.evaluate;
  if (options_.train.periodic.every > 0) {
    // Local SGD / DiLoCo: every step's update here, an all-reduce of the pseudo-gradient every H
    // steps and the outer SGD on every rank.
    AllreduceSync* outer_sync = nullptr;
    PeriodicSync sync(options_.train, model_, std::make_unique<LocalSync>(options_.train, model_),
                      [&](Model* global, const LocalTrainOptions& outer) -> std::unique_ptr<GradientSync> {
                        AllreduceTrainOptions o = options_;
                        o.train = outer;
                        o.overlap = false;
                        auto made = std::make_unique<AllreduceSync>(o, global, collective_);
                        outer_sync = made.get();
                        return made;
                      });
    TrainingLoop loop(loop_options, model_, train_, test_, metrics_, &sync);
    auto reports = loop.Run(on_epoch);
    optimizer_state_bytes_ = outer_sync->optimizer_state_bytes();
    return reports;
  }
  AllreduceSync sync(options_, model_, collective_);
  TrainingLoop loop(loop_options, model_, train_, test_, metrics_, &sync);
  auto reports = loop.Run(on_epoch);
  optimizer_state_bytes_ = sync.optimizer_state_bytes();
  return reports;
}

}  // namespace gradsync
