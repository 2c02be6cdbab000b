// Dense classifier on the CPU: input -> [Linear -> ReLU] x len(hidden) -> Linear -> softmax
// cross-entropy. With no hidden layer it is softmax (multinomial logistic) regression.
//
// Tensors, in order: fc{i}.weight [in, out] (row-major, so a layer is Y = X W + b and both
// passes are single sgemm calls), fc{i}.bias [out]. Initialization matches PyTorch's nn.Linear:
// weight and bias ~ U(-1/sqrt(in), 1/sqrt(in)).
//
// bf16 | fp16 (precision()): the sgemm operands are 16-bit values: each step's weights are
// rounded copies of the fp32 masters, the input and each layer's output (bias and ReLU
// included, the logits too) are rounded, and so are the output gradients that backward
// multiplies and the weight and bias gradients it produces (so an fp16 gradient beyond 65504 is
// infinite, which the loss scaler sees). The products accumulate in fp32 (sgemm), as tensor
// cores do; softmax and the loss are fp32. Debian's OpenBLAS has no bf16 or fp16 GEMM (its
// build leaves out sbgemm), so the CPU gains nothing in speed from 16 bits: it pays the
// rounding passes, and the numerics are those of 16-bit compute.
#pragma once

#include <string>
#include <vector>

#include "models/model.h"

namespace gradsync {

// The MLP's tensors for layer sizes `dims` (input, hidden..., classes), and its initialization
// into `params` laid out as `layout`: shared by the CPU model and the CUDA one, so that both
// start from the same bits.
std::vector<TensorInfo> MlpTensors(const std::vector<int64_t>& dims);
void InitializeMlp(const std::vector<int64_t>& dims, const std::vector<TensorInfo>& layout, FloatSpan params,
                   uint64_t seed);

class Mlp final : public Model {
 public:
  Mlp(std::string name, int64_t input_dim, std::vector<int64_t> hidden, int num_classes,
      Precision precision = Precision::kFp32);

  std::string name() const override { return name_; }
  void Initialize(uint64_t seed) override;
  float ForwardBackward(const Batch& batch) override;
  EvalStats EvaluateBatch(const Batch& batch) override;
  bool waits_for_params() const override { return true; }

 private:
  // Runs the forward pass into acts_ (acts_[l] is layer l's output, post-ReLU for hidden ones;
  // the last is the logits); training's pass waits for each layer's parameters (ParamWait).
  void Forward(const Batch& batch, bool training);
  int num_layers() const { return static_cast<int>(dims_.size()) - 1; }

  std::string name_;
  std::vector<int64_t> dims_;  // input, hidden..., classes
  std::vector<std::vector<float>> acts_;
  std::vector<float> delta_;       // gradient w.r.t. the current layer's output
  std::vector<float> delta_prev_;  // gradient w.r.t. the previous layer's output
  // 16-bit precisions: this step's rounded weights per layer and the rounded input.
  std::vector<std::vector<float>> weights16_;
  std::vector<float> input16_;
};

}  // namespace gradsync
