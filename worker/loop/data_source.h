// Loads the train and test sets a worker trains on, by name.
//   fashion-mnist     the IDX files of Debian's dataset-fashion-mnist (or --data-dir)
//   blobs             Gaussian blobs, 784 features, 10 classes (synthetic, for smoke runs)
//   sparse-logistic   hashed sparse features, binary labels (for --model=sparse_logreg)
//   click-log         a click log with a known answer (common/data/click/click_log.h; for --model=dlrm):
//                     dense features and one Zipf-distributed id per categorical feature; train
//                     examples [0, click_train), test examples from ClickLog::kTestBegin
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "common/base/status.h"
#include "common/config/train_names.h"
#include "common/data/click/click_log.h"
#include "common/data/dataset.h"

namespace gradsync {

struct DataOptions {
  std::string name = "fashion-mnist";
  std::string dir;             // fashion-mnist: where the IDX files are ("" = Debian's path)
  std::string cache_dir;       // fashion-mnist: the host's shared decoded copy ("" = none: a private one)
  bool standardize = false;    // fashion-mnist: (x - 0.2860) / 0.3530 after scaling to [0, 1]
  int feature_bits = 20;       // sparse-logistic
  ClickLogOptions click;       // click-log (its seed: `seed`)
  int64_t click_train = 100000;
  int64_t click_test = 20000;
  int64_t synthetic_train = 60000;
  int64_t synthetic_test = 10000;
  uint64_t seed = 0;           // synthetic sets
};

// kDatasetNames (the names LoadTrainTest knows) is common/config/train_names.h's.
inline constexpr float kFashionMnistMean = 0.2860f;
inline constexpr float kFashionMnistStd = 0.3530f;

struct TrainTest {
  Dataset train;
  Dataset test;
  // click-log: the planted model's quality on the test set, the best any model can reach.
  std::optional<ClickOracleMetrics> oracle;
};

Result<TrainTest> LoadTrainTest(const DataOptions& options);

}  // namespace gradsync
