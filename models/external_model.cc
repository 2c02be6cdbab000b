#include "models/external_model.h"

#include "common/base/check.h"

namespace gradsync {

float ExternalModel::ForwardBackward(const Batch&) {
  GRADSYNC_CHECK(false) << "an external model computes outside gradsync";
  return 0;
}

EvalStats ExternalModel::EvaluateBatch(const Batch&) {
  GRADSYNC_CHECK(false) << "an external model computes outside gradsync";
  return {};
}

}  // namespace gradsync
