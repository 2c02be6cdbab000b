#include "worker/loop/data_source.h"

#include "common/data/idx.h"
#include "common/data/synthetic.h"

namespace gradsync {
namespace {

// Splits the last `n_test` rows of `all` off into a test set.
TrainTest SplitOffTest(Dataset all, int64_t n_test) {
  TrainTest tt;
  const int64_t n_train = all.n - n_test;
  tt.test.name = all.name + "-test";
  tt.test.n = n_test;
  tt.test.dim = all.dim;
  tt.test.num_classes = all.num_classes;
  tt.test.sparse = all.sparse;
  tt.test.labels.assign(all.labels.begin() + n_train, all.labels.end());
  all.labels.resize(static_cast<size_t>(n_train));
  if (!all.sparse) {
    tt.test.features.assign(all.features.begin() + n_train * all.dim, all.features.end());
    all.features.resize(static_cast<size_t>(n_train * all.dim));
  } else {
    const int64_t cut = all.row_ptr[n_train];
    tt.test.keys.assign(all.keys.begin() + cut, all.keys.end());
    tt.test.values.assign(all.values.begin() + cut, all.values.end());
    for (int64_t i = n_train; i <= all.n; ++i) tt.test.row_ptr.push_back(all.row_ptr[i] - cut);
    all.keys.resize(static_cast<size_t>(cut));
    all.values.resize(static_cast<size_t>(cut));
    all.row_ptr.resize(static_cast<size_t>(n_train + 1));
  }
  all.n = n_train;
  all.name += "-train";
  tt.train = std::move(all);
  return tt;
}

}  // namespace

Result<TrainTest> LoadTrainTest(const DataOptions& o) {
  if (o.name == "fashion-mnist") {
    const std::string dir = o.dir.empty() ? kDefaultFashionMnistDir : o.dir;
    TrainTest tt;
    ASSIGN_OR_RETURN(tt.train, LoadFashionMnist(dir, Split::kTrain, o.cache_dir));
    ASSIGN_OR_RETURN(tt.test, LoadFashionMnist(dir, Split::kTest, o.cache_dir));
    if (o.standardize) {
      Standardize(&tt.train, kFashionMnistMean, kFashionMnistStd);
      Standardize(&tt.test, kFashionMnistMean, kFashionMnistStd);
    }
    return tt;
  }
  if (o.name == "click-log") {
    ClickLogOptions c = o.click;
    c.seed = o.seed;
    ASSIGN_OR_RETURN(ClickLog log, ClickLog::Create(c));
    TrainTest tt;
    tt.train = ClickLogDataset(log, 0, o.click_train, "click-log-train");
    tt.test = ClickLogDataset(log, ClickLog::kTestBegin, o.click_test, "click-log-test");
    tt.oracle = log.OracleMetrics(ClickLog::kTestBegin, o.click_test);
    return tt;
  }
  if (o.synthetic_train <= 0 || o.synthetic_test <= 0) {
    return InvalidArgumentError("synthetic train and test sizes must be > 0");
  }
  if (o.name == "blobs") {
    BlobsOptions b;
    b.n = o.synthetic_train + o.synthetic_test;
    b.dim = 784;
    b.classes = 10;
    b.center_scale = 0.1f;
    b.seed = o.seed;
    return SplitOffTest(MakeGaussianBlobs(b), o.synthetic_test);
  }
  if (o.name == "sparse-logistic") {
    SparseLogisticOptions s;
    s.n = o.synthetic_train + o.synthetic_test;
    s.feature_bits = o.feature_bits;
    s.seed = o.seed;
    return SplitOffTest(MakeSparseLogistic(s), o.synthetic_test);
  }
  return InvalidArgumentError("unknown dataset '" + o.name + "' (expected " + kDatasetNames + ")");
}

}  // namespace gradsync
