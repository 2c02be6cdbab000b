#include "worker/allreduce_trainer.h"

#include "worker/training_loop.h"

namespace gradsync {

AllreduceTrainer::AllreduceTrainer(const AllreduceTrainOptions& options, Model* model, const Dataset* train,
                                   const Dataset* test, MetricsWriter* metrics, Collective* collective)
    : options_(options), model_(model), train_(train), test_(test), metrics_(metrics), collective_(collective) {}

Result<std::vector<EpochReport>> AllreduceTrainer::Run(const std::function<void(const EpochReport&)>& on_epoch) {
  AllreduceSync sync(options_, model_, collective_);
  TrainingLoopOptions loop_options;
  loop_options.train = options_.train;
  loop_options.evaluate = collective_->rank() == 0 && options_.evaluate;
  TrainingLoop loop(loop_options, model_, train_, test_, metrics_, &sync);
  auto reports = loop.Run(on_epoch);
  optimizer_state_bytes_ = sync.optimizer_state_bytes();
  return reports;
}

}  // namespace gradsync
