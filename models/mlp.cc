#include "models/mlp.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>

#include "common/base/check.h"
#include "common/base/numeric/half.h"
#include "common/base/numeric/rng.h"
#include "common/obs/trace.h"
#include "models/cpu_loops.h"

namespace gradsync {
namespace {

using cpu::ColumnSums;
using cpu::Relu;
using cpu::ReluBackward;

}  // namespace

std::vector<TensorInfo> MlpTensors(const std::vector<int64_t>& dims) {
  std::vector<TensorInfo> tensors;
  for (size_t l = 0; l + 1 < dims.size(); ++l) {
    tensors.push_back({"fc" + std::to_string(l + 1) + ".weight", {dims[l], dims[l + 1]}});
    tensors.push_back({"fc" + std::to_string(l + 1) + ".bias", {dims[l + 1]}});
  }
  return tensors;
}

void InitializeMlp(const std::vector<int64_t>& dims, const std::vector<TensorInfo>& layout, FloatSpan params,
                   uint64_t seed) {
  for (size_t t = 0; t < layout.size(); ++t) {
    const int64_t fan_in = dims[t / 2];
    const float bound = 1.0f / std::sqrt(static_cast<float>(fan_in));
    Rng rng(Rng::Derive(seed, kInitStream, t));
    for (float& w : params.subspan(layout[t].offset, layout[t].size)) w = rng.Uniform(-bound, bound);
  }
}

Mlp::Mlp(std::string name, int64_t input_dim, std::vector<int64_t> hidden, int num_classes, Precision precision)
    : name_(std::move(name)) {
  precision_ = precision;
  dims_.push_back(input_dim);
  dims_.insert(dims_.end(), hidden.begin(), hidden.end());
  dims_.push_back(num_classes);
  SetLayout(MlpTensors(dims_));
  acts_.resize(static_cast<size_t>(num_layers()));
  if (precision_ != Precision::kFp32) weights16_.resize(static_cast<size_t>(num_layers()));
}

void Mlp::Initialize(uint64_t seed) { InitializeMlp(dims_, layout_, params_, seed); }

void Mlp::Forward(const Batch& batch, bool training) {
  GRADSYNC_CHECK(batch.x != nullptr && batch.dim == dims_[0])
      << name_ << " expects dense inputs of dimension " << dims_[0] << ", got " << batch.dim;
  const int64_t b = batch.size;
  const float* in = batch.x;
  const std::optional<Float16> f16 = PrecisionFormat(precision_);
  if (f16) {
    input16_.assign(batch.x, batch.x + b * dims_[0]);
    RoundTo16(*f16, input16_.data(), input16_.size());
    in = input16_.data();
  }
  for (int l = 0; l < num_layers(); ++l) {
    const int64_t din = dims_[l], dout = dims_[l + 1];
    auto& out = acts_[l];
    out.resize(static_cast<size_t>(b * dout));
    if (training) {
      ParamWait(2 * l);
      ParamWait(2 * l + 1);
    }
    const float* w = tensor(2 * l).data();
    const float* bias = tensor(2 * l + 1).data();
    if (f16) {
      auto& w16 = weights16_[static_cast<size_t>(l)];
      w16.assign(w, w + din * dout);
      RoundTo16(*f16, w16.data(), w16.size());
      w = w16.data();
    }
    // out = bias (broadcast), then out += in * W in one sgemm with beta = 1.
    for (int64_t i = 0; i < b; ++i) std::copy(bias, bias + dout, out.data() + i * dout);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(b),
                static_cast<int>(dout), static_cast<int>(din), 1.0f, in, static_cast<int>(din), w,
                static_cast<int>(dout), 1.0f, out.data(), static_cast<int>(dout));
    if (l + 1 < num_layers()) Relu(out.data(), b * dout);
    if (f16) RoundTo16(*f16, out.data(), out.size());
    in = out.data();
  }
}

float Mlp::ForwardBackward(const Batch& batch) {
  const int64_t b = batch.size;
  GRADSYNC_CHECK(b > 0) << "empty batch";
  const double forward_begin = Trace::on() ? Trace::NowUs() : -1;
  Forward(batch, /*training=*/true);
  const int64_t classes = dims_.back();
  const float inv_b = 1.0f / static_cast<float>(b);

  // Softmax cross-entropy: delta = (softmax(z) - onehot(y)) / b.
  const float* logits = acts_.back().data();
  delta_.resize(static_cast<size_t>(b * classes));
  double loss = 0.0;
  for (int64_t i = 0; i < b; ++i) {
    const float* z = logits + i * classes;
    float* d = delta_.data() + i * classes;
    const int32_t y = batch.labels[i];
    GRADSYNC_CHECK(y >= 0 && y < classes) << "label " << y;
    float m = *std::max_element(z, z + classes);
    float sum = 0.0f;
    for (int64_t c = 0; c < classes; ++c) {
      d[c] = std::exp(z[c] - m);
      sum += d[c];
    }
    loss += std::log(sum) + m - z[y];
    const float scale = inv_b / sum;
    for (int64_t c = 0; c < classes; ++c) d[c] *= scale;
    d[y] -= inv_b;
  }

  if (forward_begin >= 0 && Trace::on()) {  // the forward pass and the loss
    Trace::Complete("forward", "compute", forward_begin, Trace::NowUs() - forward_begin, {{"samples", static_cast<double>(b)}});
  }
  const std::optional<Float16> f16 = PrecisionFormat(precision_);
  if (loss_scale_ != 1.0f) Scale(delta_, loss_scale_);
  if (f16) RoundTo16(*f16, delta_.data(), delta_.size());
  for (int l = num_layers() - 1; l >= 0; --l) {
    TraceSpan backward_span("backward", "compute", {{"layer", static_cast<double>(l)}});
    const int64_t din = dims_[l], dout = dims_[l + 1];
    const float* in = l == 0 ? (f16 ? input16_.data() : batch.x) : acts_[l - 1].data();
    float* gw = grad(2 * l).data();
    float* gb = grad(2 * l + 1).data();
    // dW = in^T * delta ([din, b] x [b, dout]).
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, static_cast<int>(din),
                static_cast<int>(dout), static_cast<int>(b), 1.0f, in, static_cast<int>(din),
                delta_.data(), static_cast<int>(dout), 0.0f, gw, static_cast<int>(dout));
    ColumnSums(delta_.data(), b, dout, gb);
    if (f16) {
      RoundTo16(*f16, gw, static_cast<size_t>(din * dout));
      RoundTo16(*f16, gb, static_cast<size_t>(dout));
    }
    GradReady(2 * l);
    GradReady(2 * l + 1);
    if (l == 0) break;  // no gradient w.r.t. the input
    // delta_prev = (delta * W^T) masked by ReLU'(previous layer).
    delta_prev_.resize(static_cast<size_t>(b * din));
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(b),
                static_cast<int>(din), static_cast<int>(dout), 1.0f, delta_.data(),
                static_cast<int>(dout), f16 ? weights16_[static_cast<size_t>(l)].data() : tensor(2 * l).data(),
                static_cast<int>(dout), 0.0f, delta_prev_.data(), static_cast<int>(din));
    ReluBackward(acts_[l - 1].data(), b * din, delta_prev_.data());
    if (f16) RoundTo16(*f16, delta_prev_.data(), static_cast<size_t>(b * din));
    delta_.swap(delta_prev_);
  }
  return static_cast<float>(loss / static_cast<double>(b));
}

EvalStats Mlp::EvaluateBatch(const Batch& batch) {
  EvalStats s;
  if (batch.size == 0) return s;
  Forward(batch, /*training=*/false);
  const int64_t classes = dims_.back();
  const float* logits = acts_.back().data();
  for (int64_t i = 0; i < batch.size; ++i) {
    const float* z = logits + i * classes;
    const int32_t y = batch.labels[i];
    const float* top = std::max_element(z, z + classes);
    float m = *top;
    double sum = 0.0;
    for (int64_t c = 0; c < classes; ++c) sum += std::exp(static_cast<double>(z[c] - m));
    s.loss_sum += std::log(sum) + m - z[y];
    s.correct += (top - z) == y ? 1 : 0;
  }
  s.count = batch.size;
  return s;
}

}  // namespace gradsync
