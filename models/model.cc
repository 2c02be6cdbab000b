#include "models/model.h"

#include <algorithm>

#include "common/base/check.h"
#include "common/data/binary_metrics.h"
#include "models/dlrm.h"
#include "models/mlp.h"
#include "models/sparse_logreg.h"

namespace gradsync {

Status Model::TableIds(const Batch&, std::vector<std::vector<uint64_t>>* ids) {
  ids->assign(tables_.size(), {});
  SizeTableRows(0);
  return tables_.empty() ? OkStatus() : UnimplementedError(name() + " has tables but does not name their ids");
}

Status Model::Predict(const Batch&, std::vector<float>* probabilities) {
  probabilities->clear();
  return UnimplementedError(name() + " predicts no probabilities (not a binary classifier)");
}

const SparseGrad& Model::sparse_grad(size_t i) const {
  GRADSYNC_CHECK(false) << name() << " has no sparse tensor " << i;
  static const SparseGrad kEmpty;
  return kEmpty;
}

Status Model::SetOptimizer(const OptimizerOptions&) {
  return UnimplementedError(name() + " runs its optimizer on the host (Optimizer on params()/grads())");
}
Status Model::SetOptimizerRanges(const OptimizerOptions&, const std::vector<Segment>&) {
  return UnimplementedError(name() + " runs its optimizer on the host (Optimizer on params()/grads())");
}
Status Model::OptimizerStep(float) {
  return UnimplementedError(name() + " runs its optimizer on the host (Optimizer on params()/grads())");
}

Status Model::PackGrads16(float) {
  return UnimplementedError(name() + " has no 16-bit device gradient (a device model with --precision=bf16|fp16 has)");
}
Status Model::UnpackGrads16(float) {
  return UnimplementedError(name() + " has no 16-bit device gradient (a device model with --precision=bf16|fp16 has)");
}
Result<bool> Model::GradsFinite() {
  return UnimplementedError(name() + " has no 16-bit device gradient (a device model with --precision=bf16|fp16 has)");
}

void Model::SetLayout(std::vector<TensorInfo> tensors) {
  int64_t offset = 0;
  for (auto& t : tensors) {
    t.size = ShapeSize(t.shape);
    t.offset = offset;
    offset += t.size;
  }
  layout_ = std::move(tensors);
  params_.assign(static_cast<size_t>(offset), 0.0f);
  grads_.assign(static_cast<size_t>(offset), 0.0f);
}

Result<std::vector<int64_t>> DenseModelDims(const ModelOptions& o) {
  if (o.name != "softmax" && o.name != "mlp") {
    return InvalidArgumentError("'" + o.name + "' is not a dense model (expected softmax|mlp)");
  }
  if (o.input_dim <= 0) return InvalidArgumentError("input dimension must be > 0");
  if (o.num_classes < 2) return InvalidArgumentError("a classifier needs >= 2 classes");
  std::vector<int64_t> hidden = o.name == "mlp" ? o.hidden : std::vector<int64_t>{};
  if (o.name == "mlp" && hidden.empty()) {
    return InvalidArgumentError("mlp needs at least one hidden layer (use --model=softmax for none)");
  }
  for (int64_t h : hidden) {
    if (h <= 0 || h > (1 << 20)) {
      return InvalidArgumentError("hidden layer sizes must be in [1, 2^20], got " + std::to_string(h));
    }
  }
  std::vector<int64_t> dims{o.input_dim};
  dims.insert(dims.end(), hidden.begin(), hidden.end());
  dims.push_back(o.num_classes);
  return dims;
}

Result<std::unique_ptr<Model>> CreateModel(const ModelOptions& o) {
  if (o.name == "softmax" || o.name == "mlp") {
    ASSIGN_OR_RETURN(std::vector<int64_t> dims, DenseModelDims(o));
    std::unique_ptr<Model> m = std::make_unique<Mlp>(
        o.name, o.input_dim, std::vector<int64_t>(dims.begin() + 1, dims.end() - 1), o.num_classes, o.precision);
    return m;
  }
  if (o.name == "sparse_logreg") {
    if (o.precision != Precision::kFp32) {
      return InvalidArgumentError(std::string("sparse_logreg computes in fp32 only, not ") + PrecisionName(o.precision));
    }
    if (o.feature_bits < 4 || o.feature_bits > 30) {
      return InvalidArgumentError("feature bits must be in [4, 30], got " + std::to_string(o.feature_bits));
    }
    std::unique_ptr<Model> m = std::make_unique<SparseLogReg>(o.feature_bits);
    return m;
  }
  if (o.name == "dlrm") {
    if (o.precision != Precision::kFp32) {
      return InvalidArgumentError(std::string("dlrm computes in fp32 only, not ") + PrecisionName(o.precision));
    }
    RETURN_IF_ERROR(ValidateDlrmOptions(o.dlrm));
    std::unique_ptr<Model> m = std::make_unique<DlrmModel>(o.dlrm);
    return m;
  }
  return InvalidArgumentError("unknown model '" + o.name + "' (expected " + std::string(kModelNames) + ")");
}

namespace {

// Mean loss and accuracy of an evaluation's sums.
EvalResult Mean(const EvalStats& total) {
  EvalResult r;
  if (total.count > 0) {
    r.loss = total.loss_sum / static_cast<double>(total.count);
    r.accuracy = static_cast<double>(total.correct) / static_cast<double>(total.count);
  }
  return r;
}

}  // namespace

EvalResult Evaluate(Model& model, const Dataset& data, int64_t batch_size) {
  GRADSYNC_CHECK(batch_size > 0);
  EvalStats total;
  BatchBuffer rows;
  for (int64_t begin = 0; begin < data.n; begin += batch_size) {
    EvalStats s = model.EvaluateBatch(rows.Slice(data, begin, std::min(data.n, begin + batch_size)));
    total.loss_sum += s.loss_sum;
    total.correct += s.correct;
    total.count += s.count;
  }
  return Mean(total);
}

Result<EvalResult> EvaluateWithRows(Model& model, const Dataset& data, int64_t batch_size, const RowReader& rows) {
  if (model.tables().empty()) return Evaluate(model, data, batch_size);
  if (!rows) return FailedPreconditionError(model.name() + " has embedding tables: its evaluation needs their rows");
  GRADSYNC_CHECK(batch_size > 0);
  EvalStats total;
  BatchBuffer buffer;
  std::vector<std::vector<uint64_t>> ids;
  bool predicts = true;
  std::vector<float> probabilities, scores;
  std::vector<int32_t> labels;  // the batches' (a generated data set stores none)
  for (int64_t begin = 0; begin < data.n; begin += batch_size) {
    const Batch batch = buffer.Slice(data, begin, std::min(data.n, begin + batch_size));
    RETURN_IF_ERROR(model.TableIds(batch, &ids));
    RETURN_IF_ERROR(rows(ids, model.table_rows()));
    EvalStats s = model.EvaluateBatch(batch);
    total.loss_sum += s.loss_sum;
    total.correct += s.correct;
    total.count += s.count;
    if (predicts) {
      Status st = model.Predict(batch, &probabilities);
      predicts = st.ok();
      scores.insert(scores.end(), probabilities.begin(), probabilities.end());
      labels.insert(labels.end(), batch.labels.begin(), batch.labels.end());
    }
  }
  EvalResult r = Mean(total);
  if (predicts && static_cast<int64_t>(scores.size()) == data.n) r.auc = Auc(scores, labels);
  return r;
}

}  // namespace gradsync
