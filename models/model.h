// Model: the interface every trainer (local, parameter server, all-reduce) drives.
//
// A model's parameters are named tensors laid out in ONE flat float buffer (layout()); the
// gradient buffer has the same layout. That flat view is what the optimizer, the PS client and
// the all-reduce buckets work on. ForwardBackward computes the mean loss of a batch and the
// gradient of that mean; dense tensors' gradients land in grads(), sparse tensors' (see
// TensorInfo::sparse) in sparse_grad(). Initialization is a pure function of the seed, so every
// process that builds the same model with the same seed holds bit-identical parameters.
//
// Backends: the CPU models here use CBLAS sgemm (OpenBLAS). The CUDA backend (models/cuda/)
// implements the same interface with parameters, gradients and activations on the device; there
// params()/grads() are pinned host mirrors that ParamsToHost / GradsToHost / ParamsToDevice fill
// or drain, device work is enqueued on the model's one stream, and the optimizer runs on the
// device (OptimizerStep). On a CPU model those calls are no-ops or unsupported (see below).
// Thread safety: none; one model per training thread.
//
//   ASSIGN_OR_RETURN(auto model, CreateModel(options));
//   model->Initialize(seed);
//   float loss = model->ForwardBackward(batch);
//   optimizer.Step(model->params(), model->grads(), lr);
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/base/numeric/segment.h"
#include "common/base/status.h"
#include "common/base/numeric/tensor.h"
#include "common/config/train_names.h"
#include "common/data/dataset.h"
#include "common/obs/trace.h"
#include "common/optim/optimizer.h"
#include "common/optim/precision.h"
#include "common/table/table_spec.h"
#include "models/dlrm_options.h"

namespace gradsync {

// The gradient of a sparse tensor: sorted unique element indices into the tensor and values.
struct SparseGrad {
  std::vector<uint64_t> keys;
  std::vector<float> values;
};

// Sums over a batch (divide by count for means).
struct EvalStats {
  double loss_sum = 0.0;
  int64_t correct = 0;
  int64_t count = 0;
};

class Model {
 public:
  virtual ~Model() = default;

  virtual std::string name() const = 0;
  const std::vector<TensorInfo>& layout() const { return layout_; }
  int64_t num_params() const { return static_cast<int64_t>(params_.size()); }

  FloatSpan params() { return params_; }
  ConstFloatSpan params() const { return params_; }
  FloatSpan grads() { return grads_; }
  ConstFloatSpan grads() const { return grads_; }
  FloatSpan tensor(size_t i) { return FloatSpan(params_).subspan(layout_[i].offset, layout_[i].size); }
  FloatSpan grad(size_t i) { return FloatSpan(grads_).subspan(layout_[i].offset, layout_[i].size); }

  // The precision of the compute (ModelOptions::precision; common/optim/precision.h): bf16 and fp16
  // models round every GEMM operand, activation and gradient to 16 bits and accumulate in fp32;
  // params() stay the fp32 master weights.
  Precision precision() const { return precision_; }
  // ForwardBackward's gradient is of loss_scale * the mean loss (the loss it returns is not
  // scaled): fp16's dynamic loss scaling sets it before each step and divides it out of the
  // update. 1 (the default) leaves every bit as it was.
  void set_loss_scale(float scale) { loss_scale_ = scale; }
  float loss_scale() const { return loss_scale_; }

  // Deterministic initialization from `seed` (same seed, same bits, on every machine).
  virtual void Initialize(uint64_t seed) = 0;

  // Mean loss over the batch; fills the gradient of that mean (dense: grads(), sparse tensors:
  // sparse_grad()). batch.dim must equal the model's input dimension.
  virtual float ForwardBackward(const Batch& batch) = 0;

  // Loss sum and correct predictions over the batch; touches no gradient.
  virtual EvalStats EvaluateBatch(const Batch& batch) = 0;

  // Binary classifiers: each example's predicted probability of label 1 (*probabilities resized
  // to batch.size), for AUC and log loss (common/data/binary_metrics.h); touches no gradient.
  // kUnimplemented for the others (the default). A model with tables reads them as EvaluateBatch
  // does (TableIds and table_rows() first).
  virtual Status Predict(const Batch& batch, std::vector<float>* probabilities);

  // The gradient of sparse tensor `i` from the last ForwardBackward. Dense models have none.
  virtual const SparseGrad& sparse_grad(size_t i) const;

  // --- Embedding tables (common/table/table_spec.h): rows that live outside the model, on the
  // PS shards or in the sync's own copy, so that a worker holds only the rows of its batch. ---
  // The model's tables (empty: none), in the order their ids and rows come below.
  const std::vector<TableSpec>& tables() const { return tables_; }
  // The ids `batch` reads: per table, sorted and unique (*ids resized to tables().size()); sizes
  // table_rows() and table_grads() to their rows (table after table, id after id, each dim
  // floats). kInvalidArgument naming the table and feature for an id the table cannot hold.
  // Call before ForwardBackward or EvaluateBatch on that batch, then fill table_rows().
  virtual Status TableIds(const Batch& batch, std::vector<std::vector<uint64_t>>* ids);
  // The rows of the ids TableIds named, which the caller fills before the model reads them.
  FloatSpan table_rows() { return table_rows_; }
  // The gradient of the mean loss by each of those rows, filled by ForwardBackward (a row read
  // by several examples: their sum; a row no example's loss depends on: zeros).
  ConstFloatSpan table_grads() const { return table_grads_; }

  // Layer-wise readiness: ForwardBackward calls fn(i) the moment tensor i's gradient is final
  // (the last layer first), so that its communication can start while backward goes on. Every
  // tensor is reported exactly once per ForwardBackward. Empty: no calls.
  void set_grad_ready(std::function<void(size_t tensor)> fn) { grad_ready_ = std::move(fn); }
  const std::function<void(size_t)>& grad_ready() const { return grad_ready_; }
  // The other direction: ForwardBackward calls fn(i) just before it first reads tensor i's
  // parameters (the first layer first), so that the parameters of later layers may still be
  // arriving while the first layers compute; fn returns once they are in params(). Models that
  // report it say so (waits_for_params); the others read every parameter at once. Not called by
  // EvaluateBatch.
  void set_param_wait(std::function<void(size_t tensor)> fn) { param_wait_ = std::move(fn); }
  virtual bool waits_for_params() const { return false; }

  // --- Device models (CUDA). A CPU model's tensors ARE params()/grads(): these do nothing. ---
  virtual bool on_device() const { return false; }
  // grads() <- the device gradient of the last ForwardBackward (waits for it).
  virtual Status GradsToHost() { return OkStatus(); }
  // params() <- the device parameters (waits for them).
  virtual Status ParamsToHost() { return OkStatus(); }
  // The device parameters <- params() (enqueued on the model's stream: later device work sees
  // them; params() must not change until the next call that waits).
  virtual Status ParamsToDevice() { return OkStatus(); }
  // The flat device gradient and the model's cudaStream_t (opaque here, so that this header
  // needs no CUDA), for a device all-reduce. nullptr on the CPU.
  virtual float* device_grads() { return nullptr; }
  // The flat device parameters (ZeRO on the device all-gathers them in place).
  virtual float* device_params() { return nullptr; }
  virtual void* device_stream() { return nullptr; }
  // The optimizer where the tensors live (device models): the same rule as Optimizer's SGD, with
  // its state on the device (adam: kUnimplemented). SetOptimizer once, then OptimizerStep(lr)
  // after each gradient (enqueued).
  // CPU models: kUnimplemented (the trainers run Optimizer on params()/grads() themselves).
  virtual Status SetOptimizer(const OptimizerOptions& options);
  // The same, updating only `ranges` of the flat parameter vector, with state for those only
  // (ZeRO: this rank's shard).
  virtual Status SetOptimizerRanges(const OptimizerOptions& options, const std::vector<Segment>& ranges);
  virtual Status OptimizerStep(float lr);
  // 16-bit precisions on the device: the gradient's 16-bit copy, which a device all-reduce sums
  // (nullptr otherwise). PackGrads16 enqueues grads16 <- 16-bit(device grads * scale);
  // UnpackGrads16 enqueues device grads <- float(grads16) * scale and notes whether every value
  // was finite, which GradsFinite answers once the stream has been waited for.
  virtual uint16_t* device_grads16() { return nullptr; }
  virtual Status PackGrads16(float scale);
  virtual Status UnpackGrads16(float scale);
  virtual Result<bool> GradsFinite();

 protected:
  void GradReady(size_t tensor) const {
    if (grad_ready_) grad_ready_(tensor);
  }
  void ParamWait(size_t tensor) const {
    if (!param_wait_) return;
    TraceSpan span("wait for parameters", "comm", {{"tensor", static_cast<double>(tensor)}});
    param_wait_(tensor);
  }
  // Lays out `tensors` contiguously in declaration order and allocates params and grads.
  void SetLayout(std::vector<TensorInfo> tensors);
  // The model's tables (models with tables call this once, in their constructor).
  void SetTables(std::vector<TableSpec> tables) { tables_ = std::move(tables); }
  // Sizes table_rows() and table_grads() to `floats` (TableIds' implementations).
  void SizeTableRows(size_t floats) {
    table_rows_.assign(floats, 0.0f);
    table_grads_.assign(floats, 0.0f);
  }
  FloatSpan table_grads_mutable() { return table_grads_; }

  std::vector<TensorInfo> layout_;
  Precision precision_ = Precision::kFp32;
  float loss_scale_ = 1.0f;
  std::vector<float> params_;
  std::vector<float> grads_;
  std::function<void(size_t)> grad_ready_;
  std::function<void(size_t)> param_wait_;
  std::vector<TableSpec> tables_;
  std::vector<float> table_rows_;
  std::vector<float> table_grads_;
};

struct ModelOptions {
  std::string name = "mlp";       // softmax | mlp | sparse_logreg | dlrm
  int64_t input_dim = 784;        // dense models
  int num_classes = 10;           // dense models
  std::vector<int64_t> hidden = {256, 128};  // mlp only
  int feature_bits = 20;          // sparse_logreg: 2^feature_bits weights
  Precision precision = Precision::kFp32;  // dense models; sparse_logreg and dlrm are fp32 only
  DlrmOptions dlrm;                        // dlrm only (models/dlrm.h)
};

// The model names CreateModel accepts, for --help texts.
// kModelNames (the names CreateModel knows) is common/config/train_names.h's.

// Builds a CPU model; rejects unknown names and bad sizes with kInvalidArgument.
Result<std::unique_ptr<Model>> CreateModel(const ModelOptions& options);

// The layer sizes (input, hidden..., classes) of a dense model (softmax | mlp), validated as
// CreateModel does; kInvalidArgument for sparse_logreg and unknown names.
Result<std::vector<int64_t>> DenseModelDims(const ModelOptions& options);

// Mean loss and accuracy of `model` over all of `data`, in batches of `batch_size` (a model
// without tables: one with tables needs its rows for each batch, which only its caller has).
struct EvalResult {
  double loss = 0.0;
  double accuracy = 0.0;
  double auc = NAN;  // a binary classifier that predicts (Model::Predict), by EvaluateWithRows; else NaN
};
EvalResult Evaluate(Model& model, const Dataset& data, int64_t batch_size = 1000);

// Where an evaluation of a model with tables reads the rows of a batch's ids (per table, sorted
// and unique) into the model's table_rows(): the shards, or the process's own tables.
using RowReader = std::function<Status(std::span<const std::vector<uint64_t>> ids, std::span<float> rows)>;
// Evaluate for any model: a model with tables has each batch's rows read through `rows` first
// (required then); an error of TableIds or of the reader fails the evaluation. A model that
// predicts probabilities (Model::Predict) also gets its AUC over `data`.
Result<EvalResult> EvaluateWithRows(Model& model, const Dataset& data, int64_t batch_size, const RowReader& rows);

}  // namespace gradsync
