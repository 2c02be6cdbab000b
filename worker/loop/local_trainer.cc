#include "worker/loop/local_trainer.h"

#include "common/ps/partitioner.h"
#include "worker/sync/local_sync.h"
#include "worker/loop/training_loop.h"

namespace gradsync {

// Each dense run in one Step call: whole layers, as LARS and LAMB need (common/optim/optimizer.h).
void ApplyGradients(Model& model, Optimizer& opt, float lr, float grad_scale) {
  const auto& layout = model.layout();
  for (size_t i = 0; i < layout.size(); ++i) {
    const TensorInfo& t = layout[i];
    if (t.sparse) {
      const SparseGrad& g = model.sparse_grad(i);
      opt.StepSparse(model.tensor(i), g.keys, g.values, lr, t.offset);
    }
  }
  // Dense tensors are contiguous runs of the flat buffer: update each run in one call.
  for (const Segment& run : DenseRuns(layout, {0, model.num_params()})) {
    opt.Step(model.params().subspan(run.begin, run.size()), model.grads().subspan(run.begin, run.size()), lr,
             run.begin, grad_scale);
  }
  opt.EndStep();
}

LocalTrainer::LocalTrainer(const LocalTrainOptions& options, Model* model, const Dataset* train,
                           const Dataset* test, MetricsWriter* metrics)
    : options_(options), model_(model), train_(train), test_(test), metrics_(metrics) {}

Result<std::vector<EpochReport>> LocalTrainer::Run(
    const std::function<void(const EpochReport&)>& on_epoch) {
  LocalSync sync(options_, model_);
  TrainingLoopOptions loop_options;
  loop_options.train = options_;
  TrainingLoop loop(loop_options, model_, train_, test_, metrics_, &sync);
  return loop.Run(on_epoch);
}

}  // namespace gradsync
