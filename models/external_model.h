// ExternalModel: a model whose computation happens elsewhere. It holds a layout and the two flat
// buffers (parameters and gradients) and nothing else: the Python frontend's model (PyTorch
// computes; its tensors are views of the buffers), and the global model that local SGD and
// DiLoCo keep beside the one a worker trains (worker/sync/periodic_sync.h: the parameters of the
// last synchronization and the pseudo-gradient). ForwardBackward and EvaluateBatch must not be
// called (a failed check).
#pragma once

#include <string>
#include <vector>

#include "models/model.h"

namespace gradsync {

class ExternalModel final : public Model {
 public:
  // `tables`: embedding tables whose rows the caller reads and updates through its sync
  // (GradientSync::ReadRows / SetStepTables): the Python frontend's gradsync.torch.Embedding.
  explicit ExternalModel(std::vector<TensorInfo> tensors, std::vector<TableSpec> tables = {}) {
    SetLayout(std::move(tensors));
    SetTables(std::move(tables));
  }
  std::string name() const override { return "external"; }
  void Initialize(uint64_t) override {}
  float ForwardBackward(const Batch&) override;
  EvalStats EvaluateBatch(const Batch&) override;
  // A caller that computes elsewhere may read each tensor as its pull lands.
  bool waits_for_params() const override { return true; }
};

}  // namespace gradsync
