// The shards' state as the Python frontend reads and sets it (PS modes; ARCHITECTURE.md,
// "Optimizer state"): the optimizer state in torch.optim's names (sync.optimizer_state() /
// set_optimizer_state(), for DistributedOptimizer.state_dict() / load_state_dict()), and the
// parameters (sync.set_parameters(), for broadcast_parameters). Each request goes at the sync's
// clock (its pushes so far) and the shards serve it where a pull of that clock is answered.
//
//   FrontendShardState& s = sync.shard_state();   // kInvalidArgument outside the PS modes
//   NamedOptimizerState state = s.Read();  ...  s.SetOptimizerState(state);  s.SetParameters();
//
// Threading: the sync's training thread, between steps (as PsClient).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/optim/optimizer.h"
#include "models/model.h"
#include "worker/ps/client/ps_client.h"
#include "worker/ps/ps_sync.h"

namespace gradsync::python {

// The shards' optimizer state as the frontend names it: the state vectors by torch.optim's names
// for them (OptimizerSlotNames: SGD with momentum "momentum_buffer"; Adam "exp_avg",
// "exp_avg_sq"), each one flat array per tensor in layout order, and `step`, the optimizer's steps
// taken (Adam's t, torch's state["step"]). Before the first step: no vectors and no step (torch's
// state is empty then).
struct NamedOptimizerState {
  std::string kind;  // sgd | adam
  std::optional<int64_t> step;
  std::vector<int64_t> tensor_steps;  // OptimizerStateParts::tensor_steps
  std::map<std::string, std::vector<std::vector<float>>> slots;
};

class FrontendShardState {
 public:
  // `client`, `sync` and `model` (the layout and the flat parameters) must outlive it; `optimizer`
  // is the wrapped optimizer as the shards apply it; `timeout_s` each request's.
  FrontendShardState(PsClient* client, const PsSyncBase* sync, const Model* model, OptimizerOptions optimizer,
                     double timeout_s);

  // The optimizer state the shards hold at the sync's clock: after step() the state the shards
  // reach once every worker's push of that step is applied (bsp: that round's), before the next
  // step's update; so a new job given the parameters of the next pull and this state goes on as
  // this one would.
  NamedOptimizerState Read();
  // kInvalidArgument for a state that is not this job's optimizer's (another kind, a vector it
  // does not keep or one missing, a tensor's size, a step < 1 with vectors, or a step > 0 without
  // them; Adam's step is required with its vectors; SGD's defaults to 1). No vectors and no step:
  // the state of no step taken (zeros).
  void SetOptimizerState(NamedOptimizerState state);
  // The shards' parameters become the model's as they are in this process (the optimizer state
  // stays); returns once every shard holds them. For a model changed outside training (a
  // checkpoint loaded, then broadcast: Horovod's resume). The step's pulls must have landed
  // first: a pull answered later would overwrite what is set.
  void SetParameters();

 private:
  PsClient* client_;
  const PsSyncBase* sync_;
  const Model* model_;
  OptimizerOptions optimizer_;
  double timeout_s_;
};

}  // namespace gradsync::python
