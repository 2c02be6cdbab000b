// A DLRM-style click model (Naumov et al. 2019) whose embedding tables live outside it: the
// model holds the two MLPs; the caller (the PS client, or a test's RowTable) supplies each step's
// embedding rows in table_rows() and takes their gradients from table_grads() (model.h,
// "Embedding tables"). Nothing here grows with a table's id space: a step holds the rows of its
// batch's ids and nothing else.
//
//   z      = bottom MLP(dense)                 num_dense -> bottom... -> dim (ReLU hidden, the last
//                                              layer linear)
//   e_f    = row of table f for the example's id in feature f   (f = 0 .. num_tables - 1)
//   dots   = <u_a, u_b> for every pair b < a of u = [z, e_0, ..., e_{F-1}], in the order
//            (1,0), (2,0), (2,1), (3,0), ... (DLRM's lower triangle, pair a(a-1)/2 + b)
//   logit  = top MLP(concat(z, dots))          dim + F(F+1)/2 -> top... -> 1 (ReLU hidden)
//   loss   = mean binary cross-entropy with logits, log(1 + e^l) - y l, computed stably
//
// Tensors (the flat buffer, forward order): bottom.fc{k}.weight [in, out] (row-major: one
// sgemm per layer and pass, as mlp.h's), bottom.fc{k}.bias [out], then top.fc{k}.weight,
// top.fc{k}.bias. Initialization: nn.Linear's U(-1/sqrt(in), 1/sqrt(in)) for weights and biases,
// tensor t from Rng::Derive(seed, kInitStream, t). Tables: "table.0" ... one per categorical
// feature, dim floats a row; their init_seed is Rng::Derive(seed, kInitStream, "table", f), set
// by Initialize(seed) (tables() before the first Initialize carry seed 0's), so every process
// that initializes with one seed agrees on every row's initial value.
//
// Batches (common/data/dataset.h Batch): x = size x num_dense floats (dim = num_dense); row_ptr /
// keys = CSR with exactly num_tables keys per example, key f of an example being its id in table
// f (values are not read). ClickBatchView makes one from the click log's ClickBatch without
// copying its ids. A step is: TableIds(batch) -> fill table_rows() -> ForwardBackward (or
// EvaluateBatch / Predict) on that same batch; the model checks that every key it reads is the
// id TableIds put at that row, so a step on another batch stops with a CHECK.
//
// Gradients: dense tensors in grads(), reported ready (GradReady) the last layer first: top's
// last .. top's first, then bottom's last .. bottom's first; parameters are waited for
// (ParamWait) in forward order. table_grads() holds, per row, the sum over the examples that
// read it of d(loss_scale * mean loss)/d(row) (a row no example's loss depends on: zeros). fp32
// only (CreateModel refuses bf16/fp16).
//
// Compute: every MLP layer is one cblas_sgemm per pass over the batch (batch-major); the
// interaction is two small sgemms an example (its Gram matrix forward, du = S u backward). Per
// example with the defaults (13 dense, 26 tables, dim 16, bottom {64}, top {64}): about 31k
// multiply-adds forward (the top's 367 x 64 layer 24k, the Gram matrix 12k of which half is kept),
// about twice that backward. Buffers are kept across steps: a step of a batch size seen before
// allocates nothing (TableIds: nothing once the caller's id vectors have grown).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/data/click/click_log.h"
#include "models/dlrm_options.h"
#include "models/model.h"

namespace gradsync {

// A view of `clicks` as the Batch DlrmModel reads (num_tables = clicks.num_categorical): x, keys
// and labels point into `clicks` (its ids are not copied); row_ptr (size + 1 offsets 0, F, 2F, ...)
// is written to *row_ptr, which the caller owns (reused: no allocation once large enough). Valid
// while both live and are not refilled.
Batch ClickBatchView(const ClickBatch& clicks, std::vector<int64_t>* row_ptr);

class DlrmModel final : public Model {
 public:
  // options valid (ValidateDlrmOptions; CreateModel checks).
  explicit DlrmModel(const DlrmOptions& options);

  std::string name() const override { return "dlrm"; }
  const DlrmOptions& options() const { return options_; }
  void Initialize(uint64_t seed) override;
  // Per table, the batch's sorted unique ids; sizes table_rows()/table_grads() to them (table
  // after table). kInvalidArgument (and no rows) for a batch whose CSR is not num_tables keys an
  // example, or an id outside a fixed-size table: "table 'table.3' (feature 3): id 123 is
  // outside [0, 100)".
  Status TableIds(const Batch& batch, std::vector<std::vector<uint64_t>>* ids) override;
  float ForwardBackward(const Batch& batch) override;
  // Loss sum (binary cross-entropy), correct = (p > 0.5, i.e. logit > 0) == label, count.
  EvalStats EvaluateBatch(const Batch& batch) override;
  Status Predict(const Batch& batch, std::vector<float>* probabilities) override;
  bool waits_for_params() const override { return true; }

  // Width of the top MLP's input: dim + F(F+1)/2.
  int64_t top_input_dim() const { return top_dims_[0]; }

 private:
  // The forward pass into the buffers below; top_acts_.back() holds the batch's logits.
  void Forward(const Batch& batch, bool training);
  void CheckBatch(const Batch& batch) const;
  int num_bottom() const { return static_cast<int>(bottom_dims_.size()) - 1; }
  int num_top() const { return static_cast<int>(top_dims_.size()) - 1; }
  // Tensor index of layer l's weight (bias: + 1).
  size_t BottomTensor(int l) const { return 2 * static_cast<size_t>(l); }
  size_t TopTensor(int l) const { return 2 * static_cast<size_t>(num_bottom() + l); }

  DlrmOptions options_;
  std::vector<int64_t> bottom_dims_;  // num_dense, bottom..., dim
  std::vector<int64_t> top_dims_;     // dim + pairs, top..., 1
  int64_t pairs_ = 0;                 // F(F+1)/2

  // From TableIds: per (example, table), the row of the step it reads (example-major), and each
  // row's id (to check that ForwardBackward reads the batch TableIds named).
  int64_t ids_batch_size_ = -1;
  std::vector<uint32_t> row_of_;
  std::vector<uint64_t> row_ids_;
  std::vector<std::pair<uint64_t, uint32_t>> sort_scratch_;  // (id, example) of one table

  // Activations, per layer (post-ReLU for hidden layers; the last is linear).
  std::vector<std::vector<float>> bottom_acts_;
  std::vector<std::vector<float>> top_acts_;
  std::vector<float> vectors_;    // size x (F + 1) x dim: [z, e_0, ..., e_{F-1}] per example
  std::vector<float> top_input_;  // size x (dim + pairs): [z, dots]
  std::vector<float> gram_;       // (F + 1)^2: an example's Gram matrix, then its pairs' gradients
  std::vector<float> delta_, delta_prev_;
  std::vector<float> dvectors_;  // the gradient by vectors_
};

}  // namespace gradsync
