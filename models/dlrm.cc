#include "models/dlrm.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/base/check.h"
#include "common/base/numeric/rng.h"
#include "common/obs/trace.h"
#include "models/cpu_loops.h"

namespace gradsync {
namespace {

// Rng::Derive(seed, kInitStream, kTableSeeds, f): table f's init_seed (the dense tensors use
// Derive(seed, kInitStream, t): b = t, never this).
constexpr uint64_t kTableSeeds = 0x7461626c65ULL;  // "table"

constexpr int64_t kMaxLayer = int64_t{1} << 20;

using cpu::ColumnSums;
using cpu::Relu;
using cpu::ReluBackward;

// y += alpha * x.
void AxpyF(float alpha, const float* __restrict x, float* __restrict y, int64_t n) {
  for (int64_t k = 0; k < n; ++k) y[k] += alpha * x[k];
}

// out = in W + bias (b x din times din x dout), one sgemm.
void Linear(const float* in, int64_t b, int64_t din, int64_t dout, const float* w,
            const float* bias, float* out) {
  for (int64_t i = 0; i < b; ++i) std::copy(bias, bias + dout, out + i * dout);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(b),
              static_cast<int>(dout), static_cast<int>(din), 1.0f, in, static_cast<int>(din), w,
              static_cast<int>(dout), 1.0f, out, static_cast<int>(dout));
}

// gw = in^T delta, gb = column sums of delta.
void LinearGrads(const float* in, const float* delta, int64_t b, int64_t din, int64_t dout,
                 float* gw, float* gb) {
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, static_cast<int>(din),
              static_cast<int>(dout), static_cast<int>(b), 1.0f, in, static_cast<int>(din), delta,
              static_cast<int>(dout), 0.0f, gw, static_cast<int>(dout));
  ColumnSums(delta, b, dout, gb);
}

// delta_in = delta W^T (b x dout times dout x din).
void LinearInputGrad(const float* delta, const float* w, int64_t b, int64_t din, int64_t dout,
                     float* delta_in) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(b), static_cast<int>(din),
              static_cast<int>(dout), 1.0f, delta, static_cast<int>(dout), w,
              static_cast<int>(dout), 0.0f, delta_in, static_cast<int>(din));
}

// log(1 + e^z) - y z, without overflow.
double BinaryCrossEntropy(double z, int32_t y) {
  return std::max(z, 0.0) - y * z + std::log1p(std::exp(-std::fabs(z)));
}

float Sigmoid(float z) {
  if (z >= 0.0f) return 1.0f / (1.0f + std::exp(-z));
  const float e = std::exp(z);
  return e / (1.0f + e);
}

Status CheckLayers(const std::vector<int64_t>& sizes, const char* which) {
  for (int64_t h : sizes) {
    if (h < 1 || h > kMaxLayer) {
      return InvalidArgumentError(std::string("dlrm: ") + which + " MLP layer size " +
                                  std::to_string(h) + " is outside [1, 2^20]");
    }
  }
  return OkStatus();
}

std::vector<TensorInfo> LayerTensors(const std::string& prefix, const std::vector<int64_t>& dims) {
  std::vector<TensorInfo> tensors;
  for (size_t l = 0; l + 1 < dims.size(); ++l) {
    const std::string fc = prefix + ".fc" + std::to_string(l + 1);
    tensors.push_back({fc + ".weight", {dims[l], dims[l + 1]}});
    tensors.push_back({fc + ".bias", {dims[l + 1]}});
  }
  return tensors;
}

TableSpec MakeTableSpec(const DlrmOptions& o, int f) {
  TableSpec spec;
  spec.name = "table." + std::to_string(f);
  spec.dim = o.dim;
  spec.num_ids = o.ids_per_table;
  spec.init = o.init.value_or(DefaultDlrmRowInit(o.ids_per_table));
  spec.max_rows_per_shard = o.max_rows_per_shard;
  spec.optimizer = o.optimizer;
  return spec;
}

}  // namespace

RowInit DefaultDlrmRowInit(uint64_t ids_per_table) {
  RowInit init;
  if (ids_per_table == 0) {
    init.kind = RowInit::Kind::kNormal;
    init.scale = 0.01f;
  } else {
    init.kind = RowInit::Kind::kUniform;
    init.scale = static_cast<float>(std::sqrt(1.0 / static_cast<double>(ids_per_table)));
  }
  return init;
}

Status ValidateDlrmOptions(const DlrmOptions& o) {
  if (o.num_dense < 1 || o.num_dense > (1 << 16)) {
    return InvalidArgumentError("dlrm: num_dense " + std::to_string(o.num_dense) +
                                " is outside [1, 65536]");
  }
  if (o.num_tables < 1 || static_cast<uint32_t>(o.num_tables) > kMaxTables) {
    return InvalidArgumentError("dlrm: num_tables " + std::to_string(o.num_tables) +
                                " is outside [1, " + std::to_string(kMaxTables) + "]");
  }
  if (o.dim < 1 || o.dim > (1 << 16)) {
    return InvalidArgumentError("dlrm: the embedding dim " + std::to_string(o.dim) +
                                " is outside [1, 65536]");
  }
  RETURN_IF_ERROR(CheckLayers(o.bottom, "the bottom"));
  RETURN_IF_ERROR(CheckLayers(o.top, "the top"));
  if (Status st = ValidateTableSpec(MakeTableSpec(o, 0)); !st.ok()) {
    return InvalidArgumentError("dlrm: " + st.message());
  }
  return OkStatus();
}

Batch ClickBatchView(const ClickBatch& clicks, std::vector<int64_t>* row_ptr) {
  const int64_t f = clicks.num_categorical;
  row_ptr->resize(static_cast<size_t>(clicks.size + 1));
  for (int64_t i = 0; i <= clicks.size; ++i) (*row_ptr)[static_cast<size_t>(i)] = i * f;
  Batch batch;
  batch.size = clicks.size;
  batch.dim = clicks.num_dense;
  batch.x = clicks.dense.data();
  batch.row_ptr = *row_ptr;
  batch.keys = clicks.ids;
  batch.labels = clicks.labels;
  return batch;
}

DlrmModel::DlrmModel(const DlrmOptions& options) : options_(options) {
  GRADSYNC_CHECK(ValidateDlrmOptions(options).ok()) << ValidateDlrmOptions(options);
  const int64_t f = options.num_tables, d = options.dim;
  pairs_ = f * (f + 1) / 2;
  bottom_dims_.push_back(options.num_dense);
  bottom_dims_.insert(bottom_dims_.end(), options.bottom.begin(), options.bottom.end());
  bottom_dims_.push_back(d);
  top_dims_.push_back(d + pairs_);
  top_dims_.insert(top_dims_.end(), options.top.begin(), options.top.end());
  top_dims_.push_back(1);
  std::vector<TensorInfo> tensors = LayerTensors("bottom", bottom_dims_);
  for (TensorInfo& t : LayerTensors("top", top_dims_)) tensors.push_back(std::move(t));
  SetLayout(std::move(tensors));
  std::vector<TableSpec> tables;
  for (int t = 0; t < options.num_tables; ++t) {
    tables.push_back(MakeTableSpec(options, t));
    tables.back().init_seed = Rng::Derive(0, kInitStream, kTableSeeds, static_cast<uint64_t>(t));
  }
  SetTables(std::move(tables));
  bottom_acts_.resize(static_cast<size_t>(num_bottom()));
  top_acts_.resize(static_cast<size_t>(num_top()));
}

void DlrmModel::Initialize(uint64_t seed) {
  for (size_t t = 0; t < layout_.size(); ++t) {
    // A weight [in, out] and the bias after it share the layer's fan-in.
    const int64_t fan_in = layout_[t & ~size_t{1}].shape[0];
    const float bound = 1.0f / std::sqrt(static_cast<float>(fan_in));
    Rng rng(Rng::Derive(seed, kInitStream, t));
    for (float& w : tensor(t)) w = rng.Uniform(-bound, bound);
  }
  for (size_t f = 0; f < tables_.size(); ++f) {
    tables_[f].init_seed = Rng::Derive(seed, kInitStream, kTableSeeds, f);
  }
}

Status DlrmModel::TableIds(const Batch& batch, std::vector<std::vector<uint64_t>>* ids) {
  const auto num_tables = static_cast<size_t>(options_.num_tables);
  ids->resize(num_tables);
  for (auto& v : *ids) v.clear();
  ids_batch_size_ = -1;
  row_ids_.clear();
  SizeTableRows(0);
  const int64_t b = batch.size;
  const auto f_count = static_cast<int64_t>(num_tables);
  if (b < 0 || batch.row_ptr.size() != static_cast<size_t>(b + 1)) {
    return InvalidArgumentError("dlrm: a batch of " + std::to_string(b) + " examples needs " +
                                std::to_string(b + 1) + " row offsets (CSR), got " +
                                std::to_string(batch.row_ptr.size()));
  }
  if (b > int64_t{0xffffffff} / f_count) {
    return InvalidArgumentError("dlrm: a batch of " + std::to_string(b) + " examples is too large");
  }
  for (int64_t i = 0; i < b; ++i) {
    const int64_t begin = batch.row_ptr[static_cast<size_t>(i)];
    const int64_t end = batch.row_ptr[static_cast<size_t>(i) + 1];
    if (end - begin != f_count || begin < 0 || end > static_cast<int64_t>(batch.keys.size())) {
      return InvalidArgumentError(
          "dlrm: example " + std::to_string(i) + " has keys [" + std::to_string(begin) + ", " +
          std::to_string(end) + "): it needs exactly one id per table (" + std::to_string(f_count) +
          ") within the batch's " + std::to_string(batch.keys.size()) + " keys");
    }
  }
  row_of_.resize(static_cast<size_t>(b) * num_tables);
  sort_scratch_.resize(static_cast<size_t>(b));
  for (size_t f = 0; f < num_tables; ++f) {
    const TableSpec& spec = tables_[f];
    for (int64_t i = 0; i < b; ++i) {
      const uint64_t id =
          batch.keys[static_cast<size_t>(batch.row_ptr[static_cast<size_t>(i)]) + f];
      if (spec.num_ids != 0 && id >= spec.num_ids) {
        for (auto& v : *ids) v.clear();
        row_ids_.clear();
        const auto as_signed = static_cast<int64_t>(id);
        return InvalidArgumentError(
            "table '" + spec.name + "' (feature " + std::to_string(f) + "): id " +
            (as_signed < 0
                 ? std::to_string(as_signed) + " is negative"
                 : std::to_string(id) + " is outside [0, " + std::to_string(spec.num_ids) + ")") +
            " (example " + std::to_string(i) + " of the batch)");
      }
      sort_scratch_[static_cast<size_t>(i)] = {id, static_cast<uint32_t>(i)};
    }
    std::sort(sort_scratch_.begin(), sort_scratch_.end());
    std::vector<uint64_t>& out = (*ids)[f];
    for (size_t k = 0; k < sort_scratch_.size(); ++k) {
      const auto [id, example] = sort_scratch_[k];
      if (k == 0 || id != sort_scratch_[k - 1].first) {
        out.push_back(id);
        row_ids_.push_back(id);
      }
      row_of_[static_cast<size_t>(example) * num_tables + f] =
          static_cast<uint32_t>(row_ids_.size() - 1);
    }
  }
  SizeTableRows(row_ids_.size() * static_cast<size_t>(options_.dim));
  ids_batch_size_ = b;
  return OkStatus();
}

void DlrmModel::CheckBatch(const Batch& batch) const {
  const int64_t b = batch.size;
  GRADSYNC_CHECK(batch.x != nullptr && batch.dim == options_.num_dense)
      << "dlrm expects " << options_.num_dense << " dense features an example, got " << batch.dim;
  GRADSYNC_CHECK(ids_batch_size_ == b && batch.row_ptr.size() == static_cast<size_t>(b + 1))
      << "dlrm: call TableIds on the batch (" << b << " examples) before the model reads it";
  const auto num_tables = static_cast<size_t>(options_.num_tables);
  for (int64_t i = 0; i < b; ++i) {
    const auto begin = static_cast<size_t>(batch.row_ptr[static_cast<size_t>(i)]);
    GRADSYNC_CHECK(batch.row_ptr[static_cast<size_t>(i) + 1] -
                           batch.row_ptr[static_cast<size_t>(i)] ==
                       options_.num_tables &&
                   begin + num_tables <= batch.keys.size())
        << "dlrm: example " << i << " has not one key per table";
    for (size_t f = 0; f < num_tables; ++f) {
      GRADSYNC_CHECK(batch.keys[begin + f] ==
                     row_ids_[row_of_[static_cast<size_t>(i) * num_tables + f]])
          << "dlrm: example " << i << " feature " << f << " reads id " << batch.keys[begin + f]
          << ", which TableIds did not name: call TableIds on this batch first";
    }
  }
}

void DlrmModel::Forward(const Batch& batch, bool training) {
  CheckBatch(batch);
  const int64_t b = batch.size, d = options_.dim, f_count = options_.num_tables;
  const int64_t width = f_count + 1;  // vectors an example: z and one row per table
  const int64_t top_in = top_dims_[0];

  // Bottom MLP: dense -> z.
  const float* in = batch.x;
  for (int l = 0; l < num_bottom(); ++l) {
    if (training) {
      ParamWait(BottomTensor(l));
      ParamWait(BottomTensor(l) + 1);
    }
    const int64_t din = bottom_dims_[l], dout = bottom_dims_[l + 1];
    auto& out = bottom_acts_[static_cast<size_t>(l)];
    out.resize(static_cast<size_t>(b * dout));
    Linear(in, b, din, dout, tensor(BottomTensor(l)).data(), tensor(BottomTensor(l) + 1).data(),
           out.data());
    if (l + 1 < num_bottom()) Relu(out.data(), b * dout);
    in = out.data();
  }
  const float* z = bottom_acts_.back().data();

  // [z, e_0, ..., e_{F-1}] per example, and the top MLP's input [z, dots].
  vectors_.resize(static_cast<size_t>(b * width * d));
  top_input_.resize(static_cast<size_t>(b * top_in));
  gram_.resize(static_cast<size_t>(width * width));
  const float* rows = table_rows_.data();
  const size_t bytes = static_cast<size_t>(d) * sizeof(float);
  for (int64_t i = 0; i < b; ++i) {
    float* u = vectors_.data() + i * width * d;
    std::memcpy(u, z + i * d, bytes);
    const uint32_t* row_of = row_of_.data() + i * f_count;
    for (int64_t f = 0; f < f_count; ++f) {
      std::memcpy(u + (f + 1) * d, rows + static_cast<int64_t>(row_of[f]) * d, bytes);
    }
    // The Gram matrix u u^T (width x width) in one small sgemm (a loop of dot products is
    // several times slower: its sums do not vectorize), then its lower triangle.
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(width),
                static_cast<int>(width), static_cast<int>(d), 1.0f, u, static_cast<int>(d), u,
                static_cast<int>(d), 0.0f, gram_.data(), static_cast<int>(width));
    float* out = top_input_.data() + i * top_in;
    std::memcpy(out, u, bytes);
    float* dots = out + d;
    for (int64_t a = 1; a < width; ++a) {
      const float* gram_row = gram_.data() + a * width;
      for (int64_t c = 0; c < a; ++c) *dots++ = gram_row[c];
    }
  }

  // Top MLP -> logit.
  in = top_input_.data();
  for (int l = 0; l < num_top(); ++l) {
    if (training) {
      ParamWait(TopTensor(l));
      ParamWait(TopTensor(l) + 1);
    }
    const int64_t din = top_dims_[l], dout = top_dims_[l + 1];
    auto& out = top_acts_[static_cast<size_t>(l)];
    out.resize(static_cast<size_t>(b * dout));
    Linear(in, b, din, dout, tensor(TopTensor(l)).data(), tensor(TopTensor(l) + 1).data(),
           out.data());
    if (l + 1 < num_top()) Relu(out.data(), b * dout);
    in = out.data();
  }
}

float DlrmModel::ForwardBackward(const Batch& batch) {
  const int64_t b = batch.size;
  GRADSYNC_CHECK(b > 0) << "empty batch";
  GRADSYNC_CHECK(batch.labels.size() == static_cast<size_t>(b))
      << "dlrm: " << batch.labels.size() << " labels for " << b << " examples";
  const double forward_begin = Trace::on() ? Trace::NowUs() : -1;
  Forward(batch, /*training=*/true);
  const int64_t d = options_.dim, f_count = options_.num_tables, width = f_count + 1;

  // d(loss_scale * mean loss) / d(logit) = loss_scale * (sigmoid(logit) - y) / b.
  const float* logits = top_acts_.back().data();
  const float scale = loss_scale_ / static_cast<float>(b);
  delta_.resize(static_cast<size_t>(b));
  double loss = 0.0;
  for (int64_t i = 0; i < b; ++i) {
    const int32_t y = batch.labels[static_cast<size_t>(i)];
    GRADSYNC_CHECK(y == 0 || y == 1) << "label " << y;
    loss += BinaryCrossEntropy(logits[i], y);
    delta_[static_cast<size_t>(i)] = (Sigmoid(logits[i]) - static_cast<float>(y)) * scale;
  }
  if (forward_begin >= 0 && Trace::on()) {
    Trace::Complete("forward", "compute", forward_begin, Trace::NowUs() - forward_begin,
                    {{"samples", static_cast<double>(b)}});
  }

  TraceSpan backward_span("backward", "compute", {{"samples", static_cast<double>(b)}});
  // Top MLP, last layer first; ends with delta_ = the gradient by the top input [z, dots].
  for (int l = num_top() - 1; l >= 0; --l) {
    const int64_t din = top_dims_[l], dout = top_dims_[l + 1];
    const float* in = l == 0 ? top_input_.data() : top_acts_[static_cast<size_t>(l) - 1].data();
    LinearGrads(in, delta_.data(), b, din, dout, grad(TopTensor(l)).data(),
                grad(TopTensor(l) + 1).data());
    GradReady(TopTensor(l));
    GradReady(TopTensor(l) + 1);
    delta_prev_.resize(static_cast<size_t>(b * din));
    LinearInputGrad(delta_.data(), tensor(TopTensor(l)).data(), b, din, dout, delta_prev_.data());
    if (l > 0)
      ReluBackward(top_acts_[static_cast<size_t>(l) - 1].data(), b * din, delta_prev_.data());
    delta_.swap(delta_prev_);
  }

  // Interaction: g = d loss / d<u_a, u_c> gives du_a += g u_c and du_c += g u_a, so du = S u with
  // S the symmetric matrix of the pairs' gradients (zero diagonal): one small sgemm an example.
  // z also feeds the top directly: du_0 += its part of the top input's gradient.
  const int64_t top_in = top_dims_[0];
  dvectors_.resize(static_cast<size_t>(b * width * d));
  std::fill(gram_.begin(), gram_.end(), 0.0f);  // the diagonal stays 0
  for (int64_t i = 0; i < b; ++i) {
    const float* u = vectors_.data() + i * width * d;
    float* du = dvectors_.data() + i * width * d;
    const float* g = delta_.data() + i * top_in;
    const float* dots = g + d;
    for (int64_t a = 1; a < width; ++a) {
      for (int64_t c = 0; c < a; ++c) {
        gram_[static_cast<size_t>(a * width + c)] = *dots;
        gram_[static_cast<size_t>(c * width + a)] = *dots++;
      }
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(width),
                static_cast<int>(d), static_cast<int>(width), 1.0f, gram_.data(),
                static_cast<int>(width), u, static_cast<int>(d), 0.0f, du, static_cast<int>(d));
    AxpyF(1.0f, g, du, d);
  }

  // Table rows: each row's gradient summed over the examples that read it (in example order).
  FloatSpan table_grads = table_grads_mutable();
  std::fill(table_grads.begin(), table_grads.end(), 0.0f);
  for (int64_t i = 0; i < b; ++i) {
    const float* du = dvectors_.data() + i * width * d;
    const uint32_t* row_of = row_of_.data() + i * f_count;
    for (int64_t f = 0; f < f_count; ++f) {
      float* row = table_grads.data() + static_cast<int64_t>(row_of[f]) * d;
      AxpyF(1.0f, du + (f + 1) * d, row, d);
    }
  }

  // Bottom MLP, from dz (its last layer is linear: no mask).
  delta_.resize(static_cast<size_t>(b * d));
  for (int64_t i = 0; i < b; ++i) {
    std::memcpy(delta_.data() + i * d, dvectors_.data() + i * width * d,
                static_cast<size_t>(d) * sizeof(float));
  }
  for (int l = num_bottom() - 1; l >= 0; --l) {
    const int64_t din = bottom_dims_[l], dout = bottom_dims_[l + 1];
    const float* in = l == 0 ? batch.x : bottom_acts_[static_cast<size_t>(l) - 1].data();
    LinearGrads(in, delta_.data(), b, din, dout, grad(BottomTensor(l)).data(),
                grad(BottomTensor(l) + 1).data());
    GradReady(BottomTensor(l));
    GradReady(BottomTensor(l) + 1);
    if (l == 0) break;  // no gradient by the dense input
    delta_prev_.resize(static_cast<size_t>(b * din));
    LinearInputGrad(delta_.data(), tensor(BottomTensor(l)).data(), b, din, dout,
                    delta_prev_.data());
    ReluBackward(bottom_acts_[static_cast<size_t>(l) - 1].data(), b * din, delta_prev_.data());
    delta_.swap(delta_prev_);
  }
  return static_cast<float>(loss / static_cast<double>(b));
}

EvalStats DlrmModel::EvaluateBatch(const Batch& batch) {
  EvalStats s;
  if (batch.size == 0) return s;
  GRADSYNC_CHECK(batch.labels.size() == static_cast<size_t>(batch.size))
      << "dlrm: " << batch.labels.size() << " labels for " << batch.size << " examples";
  Forward(batch, /*training=*/false);
  const float* logits = top_acts_.back().data();
  for (int64_t i = 0; i < batch.size; ++i) {
    const int32_t y = batch.labels[static_cast<size_t>(i)];
    GRADSYNC_CHECK(y == 0 || y == 1) << "label " << y;
    s.loss_sum += BinaryCrossEntropy(logits[i], y);
    s.correct += ((logits[i] > 0.0f) == (y == 1)) ? 1 : 0;
  }
  s.count = batch.size;
  return s;
}

Status DlrmModel::Predict(const Batch& batch, std::vector<float>* probabilities) {
  probabilities->resize(static_cast<size_t>(std::max<int64_t>(batch.size, 0)));
  if (batch.size <= 0) return OkStatus();
  Forward(batch, /*training=*/false);
  const float* logits = top_acts_.back().data();
  for (int64_t i = 0; i < batch.size; ++i)
    (*probabilities)[static_cast<size_t>(i)] = Sigmoid(logits[i]);
  return OkStatus();
}

}  // namespace gradsync
