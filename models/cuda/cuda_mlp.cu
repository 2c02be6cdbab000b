// CudaMlp: the MLP (and softmax regression) of models/mlp.h on one GPU. See cuda_model.h.
//
// Row-major matrices in cuBLAS (column-major): a row-major [r, c] matrix is the column-major
// [c, r] matrix with leading dimension c, its transpose. So with X [b, in], W [in, out],
// delta [b, out] (all row-major):
//   Y = X W                 -> C^T = W^T X^T:      sgemm(N, N, m=out, n=b,  k=in,  W, out, X, in)
//   dW = X^T delta          -> dW^T = delta^T X:   sgemm(N, T, m=out, n=in, k=b,   delta, out, X, in)
//   dX = delta W^T          -> dX^T = W delta^T:   sgemm(T, N, m=in,  n=b,  k=out, W, out, delta, out)
//   db = column sums        -> sgemv(N, m=out, n=b, delta, out, ones)
//
// bf16 | fp16 (precision()): each forward converts the fp32 master parameters into one 16-bit
// copy; the input, the activations (bias and ReLU applied, logits included) and the output
// gradients are 16-bit buffers; every product is cublasGemmEx with 16-bit A and B and fp32
// accumulation (CUBLAS_COMPUTE_32F): the forward and dX products write 16 bits, dW and db write
// the fp32 gradient buffer. Softmax and the loss compute in fp32 from the 16-bit logits, and
// the output gradient is scaled by the loss scale before it is stored in 16 bits. The 16-bit
// gradient for the wire is PackGrads16's.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>

#include "common/base/check.h"
#include "models/cuda/cuda_model.h"
#include "models/mlp.h"

namespace gradsync {
namespace {

#include "models/cuda/kernels.cuh"  // first: GS_CUDA_CHECK, which the buffers use
#include "models/cuda/device_buffer.cuh"

class CudaMlp final : public Model {
 public:
  CudaMlp(std::string name, std::vector<int64_t> dims, const CudaModelOptions& cuda, Precision precision)
      : name_(std::move(name)), dims_(std::move(dims)), cuda_(cuda) {
    precision_ = precision;
    SetLayout(MlpTensors(dims_));
    Use();
    GS_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    GS_CUDA_CHECK(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
    GS_CUBLAS_CHECK(cublasCreate(&blas_));
    GS_CUBLAS_CHECK(cublasSetStream(blas_, stream_));
    // Plain fp32 sgemm (no TF32), so that the results match the CPU backend's.
    GS_CUBLAS_CHECK(cublasSetMathMode(blas_, CUBLAS_DEFAULT_MATH));
    const size_t n = static_cast<size_t>(num_params());
    params_d_.Reserve(n);
    grads_d_.Reserve(n);
    GS_CUDA_CHECK(cudaMemsetAsync(grads_d_.get(), 0, n * sizeof(float), stream_));
    // The host mirrors become page-locked in place: copies to and from them are DMA.
    GS_CUDA_CHECK(cudaHostRegister(params_.data(), n * sizeof(float), cudaHostRegisterDefault));
    GS_CUDA_CHECK(cudaHostRegister(grads_.data(), n * sizeof(float), cudaHostRegisterDefault));
    acts_.resize(static_cast<size_t>(num_layers()));
    layer_done_.resize(static_cast<size_t>(num_layers()));
    for (auto& e : layer_done_) GS_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    results_.Reserve(2);
    if (precision_ != Precision::kFp32) {
      params16_.Reserve(n);
      grads16_.Reserve(n);
      acts16_.resize(static_cast<size_t>(num_layers()));
      nonfinite_d_.Reserve(1);
      nonfinite_h_.Reserve(1);
    }
  }

  ~CudaMlp() override {
    cudaSetDevice(cuda_.device);
    cudaStreamSynchronize(stream_);
    cudaStreamSynchronize(copy_stream_);
    for (auto& e : layer_done_) cudaEventDestroy(e);
    cudaHostUnregister(params_.data());
    cudaHostUnregister(grads_.data());
    cublasDestroy(blas_);
    cudaStreamDestroy(copy_stream_);
    cudaStreamDestroy(stream_);
  }

  std::string name() const override { return name_; }
  bool on_device() const override { return true; }
  float* device_grads() override { return grads_d_.get(); }
  float* device_params() override { return params_d_.get(); }
  void* device_stream() override { return stream_; }

  void Initialize(uint64_t seed) override {
    Use();
    InitializeMlp(dims_, layout_, params_, seed);
    GS_CUDA_CHECK(cudaMemcpyAsync(params_d_.get(), params_.data(), params_.size() * sizeof(float),
                                  cudaMemcpyHostToDevice, stream_));
    if (velocity_d_.get()) {
      GS_CUDA_CHECK(cudaMemsetAsync(velocity_d_.get(), 0, params_.size() * sizeof(float), stream_));
    }
    GS_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  float ForwardBackward(const Batch& batch) override {
    if (precision_ == Precision::kBf16) return ForwardBackward16<__nv_bfloat16>(batch);
    if (precision_ == Precision::kFp16) return ForwardBackward16<__half>(batch);
    const int64_t b = batch.size;
    GRADSYNC_CHECK(b > 0) << "empty batch";
    Use();
    Forward(batch);
    const int64_t classes = dims_.back();
    // (The loss scale, 1 unless a caller sets it, multiplies the output gradient.)
    const float inv_b = 1.0f / static_cast<float>(b) * loss_scale_;
    float* delta = delta_.get();
    SoftmaxCrossEntropy<<<Blocks(b), kThreads, 0, stream_>>>(acts_.back().get(), labels_d_.get(), b, classes, inv_b,
                                                               delta, row_loss_.get());
    SumToDouble<float><<<1, kThreads, 0, stream_>>>(row_loss_.get(), b, loss_d_.get());
    GS_CUDA_CHECK(cudaGetLastError());

    for (int l = num_layers() - 1; l >= 0; --l) {
      const int din = static_cast<int>(dims_[l]), dout = static_cast<int>(dims_[l + 1]);
      const float* in = l == 0 ? x_d_.get() : acts_[l - 1].get();
      float* gw = grads_d_.get() + layout_[2 * l].offset;
      float* gb = grads_d_.get() + layout_[2 * l + 1].offset;
      const float one = 1.0f, zero = 0.0f;
      GS_CUBLAS_CHECK(cublasSgemm(blas_, CUBLAS_OP_N, CUBLAS_OP_T, dout, din, static_cast<int>(b), &one, delta, dout,
                                  in, din, &zero, gw, dout));
      GS_CUBLAS_CHECK(
          cublasSgemv(blas_, CUBLAS_OP_N, dout, static_cast<int>(b), &one, delta, dout, ones_.get(), 1, &zero, gb, 1));
      if (cuda_.stream_grads_to_host) StreamLayerGradsToHost(l);
      GradReady(2 * l);
      GradReady(2 * l + 1);
      if (l == 0) break;  // no gradient w.r.t. the input
      float* delta_prev = delta == delta_.get() ? delta_prev_.get() : delta_.get();
      GS_CUBLAS_CHECK(cublasSgemm(blas_, CUBLAS_OP_T, CUBLAS_OP_N, din, static_cast<int>(b), dout, &one,
                                  params_d_.get() + layout_[2 * l].offset, dout, delta, dout, &zero, delta_prev, din));
      ReluBackward<<<Blocks(b * din), kThreads, 0, stream_>>>(acts_[l - 1].get(), b * din, delta_prev);
      GS_CUDA_CHECK(cudaGetLastError());
      delta = delta_prev;
    }
    // The loss leaves the device: the one wait of a step (it also covers backward, so that a
    // trainer's compute time is the GPU's).
    GS_CUDA_CHECK(cudaMemcpyAsync(results_.get(), loss_d_.get(), sizeof(double), cudaMemcpyDeviceToHost, stream_));
    GS_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return static_cast<float>(results_.get()[0] / static_cast<double>(b));
  }

  EvalStats EvaluateBatch(const Batch& batch) override {
    EvalStats s;
    if (batch.size == 0) return s;
    Use();
    const int64_t b = batch.size;
    if (precision_ == Precision::kBf16) {
      Forward16<__nv_bfloat16>(batch);
      EvaluateRows16<<<Blocks(b), kThreads, 0, stream_>>>(Acts16<__nv_bfloat16>(num_layers() - 1), labels_d_.get(), b,
                                                            dims_.back(), eval_loss_.get(), eval_correct_.get());
    } else if (precision_ == Precision::kFp16) {
      Forward16<__half>(batch);
      EvaluateRows16<<<Blocks(b), kThreads, 0, stream_>>>(Acts16<__half>(num_layers() - 1), labels_d_.get(), b,
                                                            dims_.back(), eval_loss_.get(), eval_correct_.get());
    } else {
      Forward(batch);
      EvaluateRows<<<Blocks(b), kThreads, 0, stream_>>>(acts_.back().get(), labels_d_.get(), b, dims_.back(),
                                                          eval_loss_.get(), eval_correct_.get());
    }
    SumToDouble<double><<<1, kThreads, 0, stream_>>>(eval_loss_.get(), b, sums_d_.get());
    SumToDouble<int><<<1, kThreads, 0, stream_>>>(eval_correct_.get(), b, sums_d_.get() + 1);
    GS_CUDA_CHECK(cudaGetLastError());
    GS_CUDA_CHECK(cudaMemcpyAsync(results_.get(), sums_d_.get(), 2 * sizeof(double), cudaMemcpyDeviceToHost, stream_));
    GS_CUDA_CHECK(cudaStreamSynchronize(stream_));
    s.loss_sum = results_.get()[0];
    s.correct = static_cast<int64_t>(results_.get()[1]);
    s.count = b;
    return s;
  }

  Status GradsToHost() override {
    Use();
    if (cuda_.stream_grads_to_host) return CudaStatus(cudaStreamSynchronize(copy_stream_), "gradient copies");
    RETURN_IF_ERROR(CudaStatus(cudaMemcpyAsync(grads_.data(), grads_d_.get(), grads_.size() * sizeof(float),
                                               cudaMemcpyDeviceToHost, stream_),
                               "gradient copy"));
    return CudaStatus(cudaStreamSynchronize(stream_), "gradient copy");
  }

  Status ParamsToHost() override {
    Use();
    RETURN_IF_ERROR(CudaStatus(cudaMemcpyAsync(params_.data(), params_d_.get(), params_.size() * sizeof(float),
                                               cudaMemcpyDeviceToHost, stream_),
                               "parameter copy"));
    return CudaStatus(cudaStreamSynchronize(stream_), "parameter copy");
  }

  // Waits for the copy: the caller may write the host mirror again as soon as this returns (a
  // pull into params() does), and an upload still in flight would read those writes.
  Status ParamsToDevice() override {
    Use();
    RETURN_IF_ERROR(CudaStatus(cudaMemcpyAsync(params_d_.get(), params_.data(), params_.size() * sizeof(float),
                                               cudaMemcpyHostToDevice, stream_),
                               "parameter upload"));
    return CudaStatus(cudaStreamSynchronize(stream_), "parameter upload");
  }

  uint16_t* device_grads16() override { return precision_ == Precision::kFp32 ? nullptr : grads16_.get(); }

  Status PackGrads16(float scale) override {
    if (precision_ == Precision::kFp32) return FailedPreconditionError(name() + ": PackGrads16 on an fp32 model");
    Use();
    const int64_t n = num_params();
    if (precision_ == Precision::kBf16) {
      ConvertScaled<<<Blocks(n), kThreads, 0, stream_>>>(grads_d_.get(), n, scale, Grads16<__nv_bfloat16>());
    } else {
      ConvertScaled<<<Blocks(n), kThreads, 0, stream_>>>(grads_d_.get(), n, scale, Grads16<__half>());
    }
    return CudaStatus(cudaGetLastError(), "gradient to 16 bits");
  }

  Status UnpackGrads16(float scale) override {
    if (precision_ == Precision::kFp32) return FailedPreconditionError(name() + ": UnpackGrads16 on an fp32 model");
    Use();
    const int64_t n = num_params();
    RETURN_IF_ERROR(CudaStatus(cudaMemsetAsync(nonfinite_d_.get(), 0, sizeof(int), stream_), "gradient check"));
    if (precision_ == Precision::kBf16) {
      UnpackScaled<<<Blocks(n), kThreads, 0, stream_>>>(Grads16<__nv_bfloat16>(), n, scale, grads_d_.get(), nonfinite_d_.get());
    } else {
      UnpackScaled<<<Blocks(n), kThreads, 0, stream_>>>(Grads16<__half>(), n, scale, grads_d_.get(), nonfinite_d_.get());
    }
    return CudaStatus(cudaGetLastError(), "gradient from 16 bits");
  }

  Result<bool> GradsFinite() override {
    if (precision_ == Precision::kFp32) return FailedPreconditionError(name() + ": GradsFinite on an fp32 model");
    Use();
    RETURN_IF_ERROR(CudaStatus(cudaMemcpyAsync(nonfinite_h_.get(), nonfinite_d_.get(), sizeof(int), cudaMemcpyDeviceToHost, stream_),
                               "gradient check"));
    RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(stream_), "gradient check"));
    return nonfinite_h_.get()[0] == 0;
  }

  Status SetOptimizer(const OptimizerOptions& options) override {
    return SetOptimizerRanges(options, {Segment{0, num_params()}});
  }

  Status SetOptimizerRanges(const OptimizerOptions& options, const std::vector<Segment>& ranges) override {
    RETURN_IF_ERROR(ValidateOptimizerOptions(options));
    int64_t state = 0;
    for (const Segment& r : ranges) {
      if (r.begin < 0 || r.end < r.begin || r.end > num_params()) return InvalidArgumentError("optimizer range out of the model");
      state += r.size();
    }
    if (options.kind != OptimizerKind::kSgd) {
      return UnimplementedError(name() + ": the device optimizer is SGD's (momentum, Nesterov, weight decay); " +
                                OptimizerKindName(options.kind) + " runs on the servers in the PS modes only");
    }
    Use();
    optimizer_ = options;
    ranges_ = ranges;
    if (options.momentum > 0.0f && state > 0) {
      velocity_d_.Reserve(static_cast<size_t>(state));
      RETURN_IF_ERROR(CudaStatus(cudaMemsetAsync(velocity_d_.get(), 0, static_cast<size_t>(state) * sizeof(float), stream_),
                                 "optimizer state"));
    }
    optimizer_set_ = true;
    return OkStatus();
  }

  Status OptimizerStep(float lr) override {
    if (!optimizer_set_) return FailedPreconditionError("OptimizerStep before SetOptimizer");
    Use();
    int64_t state = 0;  // each range's velocity follows the previous one's
    for (const Segment& r : ranges_) {
      const int64_t n = r.size();
      if (n == 0) continue;
      float* velocity = optimizer_.momentum > 0.0f ? velocity_d_.get() + state : nullptr;
      SgdStep<<<Blocks(n), kThreads, 0, stream_>>>(params_d_.get() + r.begin, grads_d_.get() + r.begin, velocity, n, lr,
                                                     optimizer_.momentum, optimizer_.nesterov, optimizer_.weight_decay);
      state += n;
    }
    return CudaStatus(cudaGetLastError(), "optimizer step");
  }

 private:
  int num_layers() const { return static_cast<int>(dims_.size()) - 1; }
  void Use() const { GS_CUDA_CHECK(cudaSetDevice(cuda_.device)); }

  // Buffers for batches of up to b samples.
  void Reserve(int64_t b) {
    if (b <= capacity_) return;
    const size_t n = static_cast<size_t>(b);
    int64_t widest = 0;
    for (size_t l = 1; l < dims_.size(); ++l) widest = std::max(widest, dims_[l]);
    x_d_.Reserve(n * static_cast<size_t>(dims_[0]));
    labels_d_.Reserve(n);
    x_h_.Reserve(n * static_cast<size_t>(dims_[0]));
    labels_h_.Reserve(n);
    for (int l = 0; l < num_layers(); ++l) acts_[l].Reserve(n * static_cast<size_t>(dims_[l + 1]));
    delta_.Reserve(n * static_cast<size_t>(widest));
    delta_prev_.Reserve(n * static_cast<size_t>(widest));
    row_loss_.Reserve(n);
    eval_loss_.Reserve(n);
    eval_correct_.Reserve(n);
    loss_d_.Reserve(1);
    sums_d_.Reserve(2);
    ones_.Reserve(n);
    FillKernel<<<Blocks(b), kThreads, 0, stream_>>>(ones_.get(), b, 1.0f);
    if (precision_ != Precision::kFp32) {
      x16_.Reserve(n * static_cast<size_t>(dims_[0]));
      for (int l = 0; l < num_layers(); ++l) acts16_[l].Reserve(n * static_cast<size_t>(dims_[l + 1]));
      delta16_.Reserve(n * static_cast<size_t>(widest));
      delta_prev16_.Reserve(n * static_cast<size_t>(widest));
      ones16_.Reserve(n);
      if (precision_ == Precision::kBf16) {
        ConvertScaled<<<Blocks(b), kThreads, 0, stream_>>>(ones_.get(), b, 1.0f, reinterpret_cast<__nv_bfloat16*>(ones16_.get()));
      } else {
        ConvertScaled<<<Blocks(b), kThreads, 0, stream_>>>(ones_.get(), b, 1.0f, reinterpret_cast<__half*>(ones16_.get()));
      }
    }
    GS_CUDA_CHECK(cudaGetLastError());
    capacity_ = b;
  }

  // Layer l's gradient to grads() on the copy stream, once the model's stream has computed it.
  // fc{l}.weight and fc{l}.bias are adjacent in the flat buffer: one copy per layer.
  void StreamLayerGradsToHost(int l) {
    const int64_t begin = layout_[2 * l].offset;
    const int64_t count = layout_[2 * l].size + layout_[2 * l + 1].size;
    GS_CUDA_CHECK(cudaEventRecord(layer_done_[l], stream_));
    GS_CUDA_CHECK(cudaStreamWaitEvent(copy_stream_, layer_done_[l], 0));
    GS_CUDA_CHECK(cudaMemcpyAsync(grads_.data() + begin, grads_d_.get() + begin, count * sizeof(float),
                                  cudaMemcpyDeviceToHost, copy_stream_));
  }

  template <typename T>
  T* Grads16() const { return reinterpret_cast<T*>(grads16_.get()); }
  template <typename T>
  T* Acts16(int l) const { return reinterpret_cast<T*>(acts16_[static_cast<size_t>(l)].get()); }
  template <typename T>
  T* As(const DeviceBuffer<uint16_t>& buffer) const { return reinterpret_cast<T*>(buffer.get()); }

  // C = A B in cuBLAS's column-major terms, A and B 16-bit (T), C of type C_T, fp32 accumulation.
  template <typename T, typename CT>
  void Gemm16(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const T* a, int lda, const T* b,
              int ldb, CT* c, int ldc) {
    const float one = 1.0f, zero = 0.0f;
    GS_CUBLAS_CHECK(cublasGemmEx(blas_, ta, tb, m, n, k, &one, a, kDataType<T>, lda, b, kDataType<T>, ldb, &zero, c,
                                 kDataType<CT>, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }

  // The 16-bit forward pass: the parameters' 16-bit copy, the input in 16 bits, each layer a
  // GemmEx into its 16-bit activations, then bias and ReLU.
  template <typename T>
  void Forward16(const Batch& batch) {
    Upload(batch);
    const int64_t b = batch.size, n = num_params();
    T* w16 = As<T>(params16_);
    ConvertScaled<<<Blocks(n), kThreads, 0, stream_>>>(params_d_.get(), n, 1.0f, w16);
    ConvertScaled<<<Blocks(b * dims_[0]), kThreads, 0, stream_>>>(x_d_.get(), b * dims_[0], 1.0f, As<T>(x16_));
    GS_CUDA_CHECK(cudaGetLastError());
    const T* in = As<T>(x16_);
    for (int l = 0; l < num_layers(); ++l) {
      const int din = static_cast<int>(dims_[l]), dout = static_cast<int>(dims_[l + 1]);
      T* out = Acts16<T>(l);
      Gemm16<T, T>(CUBLAS_OP_N, CUBLAS_OP_N, dout, static_cast<int>(b), din, w16 + layout_[2 * l].offset, dout, in, din, out,
                   dout);
      BiasActivation16<<<Blocks(b * dout), kThreads, 0, stream_>>>(out, w16 + layout_[2 * l + 1].offset, b, dout,
                                                                     l + 1 < num_layers());
      GS_CUDA_CHECK(cudaGetLastError());
      in = out;
    }
  }

  template <typename T>
  float ForwardBackward16(const Batch& batch) {
    const int64_t b = batch.size;
    GRADSYNC_CHECK(b > 0) << "empty batch";
    Use();
    Forward16<T>(batch);
    const int64_t classes = dims_.back();
    const float inv_b = 1.0f / static_cast<float>(b);
    T* delta = As<T>(delta16_);
    SoftmaxCrossEntropy16<<<Blocks(b), kThreads, 0, stream_>>>(Acts16<T>(num_layers() - 1), labels_d_.get(), b, classes,
                                                                 inv_b, loss_scale_, delta, row_loss_.get());
    SumToDouble<float><<<1, kThreads, 0, stream_>>>(row_loss_.get(), b, loss_d_.get());
    GS_CUDA_CHECK(cudaGetLastError());
    const T* w16 = As<T>(params16_);
    for (int l = num_layers() - 1; l >= 0; --l) {
      const int din = static_cast<int>(dims_[l]), dout = static_cast<int>(dims_[l + 1]);
      const T* in = l == 0 ? As<T>(x16_) : Acts16<T>(l - 1);
      float* gw = grads_d_.get() + layout_[2 * l].offset;
      float* gb = grads_d_.get() + layout_[2 * l + 1].offset;
      Gemm16<T, float>(CUBLAS_OP_N, CUBLAS_OP_T, dout, din, static_cast<int>(b), delta, dout, in, din, gw, dout);
      Gemm16<T, float>(CUBLAS_OP_N, CUBLAS_OP_N, dout, 1, static_cast<int>(b), delta, dout, As<T>(ones16_),
                       static_cast<int>(b), gb, dout);
      if (cuda_.stream_grads_to_host) StreamLayerGradsToHost(l);
      GradReady(2 * l);
      GradReady(2 * l + 1);
      if (l == 0) break;
      T* delta_prev = delta == As<T>(delta16_) ? As<T>(delta_prev16_) : As<T>(delta16_);
      Gemm16<T, T>(CUBLAS_OP_T, CUBLAS_OP_N, din, static_cast<int>(b), dout, w16 + layout_[2 * l].offset, dout, delta, dout,
                   delta_prev, din);
      ReluBackward16<<<Blocks(b * din), kThreads, 0, stream_>>>(Acts16<T>(l - 1), b * din, delta_prev);
      GS_CUDA_CHECK(cudaGetLastError());
      delta = delta_prev;
    }
    GS_CUDA_CHECK(cudaMemcpyAsync(results_.get(), loss_d_.get(), sizeof(double), cudaMemcpyDeviceToHost, stream_));
    GS_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return static_cast<float>(results_.get()[0] / static_cast<double>(b));
  }

  // Uploads the batch (through pinned staging) and runs the forward pass into acts_.
  void Forward(const Batch& batch) {
    Upload(batch);
    const int64_t b = batch.size;
    const float* in = x_d_.get();
    const float one = 1.0f, zero = 0.0f;
    for (int l = 0; l < num_layers(); ++l) {
      const int din = static_cast<int>(dims_[l]), dout = static_cast<int>(dims_[l + 1]);
      float* out = acts_[l].get();
      GS_CUBLAS_CHECK(cublasSgemm(blas_, CUBLAS_OP_N, CUBLAS_OP_N, dout, static_cast<int>(b), din, &one,
                                  params_d_.get() + layout_[2 * l].offset, dout, in, din, &zero, out, dout));
      BiasActivation<<<Blocks(b * dout), kThreads, 0, stream_>>>(out, params_d_.get() + layout_[2 * l + 1].offset, b,
                                                                   dout, l + 1 < num_layers());
      GS_CUDA_CHECK(cudaGetLastError());
      in = out;
    }
  }

  // The batch and labels to the device (through pinned staging).
  void Upload(const Batch& batch) {
    GRADSYNC_CHECK(batch.x != nullptr && batch.dim == dims_[0])
        << name_ << " expects dense inputs of dimension " << dims_[0] << ", got " << batch.dim;
    const int64_t b = batch.size, classes = dims_.back();
    GRADSYNC_CHECK(static_cast<int64_t>(batch.labels.size()) >= b) << "batch without labels";
    for (int64_t i = 0; i < b; ++i) {
      GRADSYNC_CHECK(batch.labels[i] >= 0 && batch.labels[i] < classes) << "label " << batch.labels[i];
    }
    Reserve(b);
    // The staging buffers are free: the previous call waited for its stream, copies included.
    std::memcpy(x_h_.get(), batch.x, static_cast<size_t>(b * dims_[0]) * sizeof(float));
    std::memcpy(labels_h_.get(), batch.labels.data(), static_cast<size_t>(b) * sizeof(int32_t));
    GS_CUDA_CHECK(cudaMemcpyAsync(x_d_.get(), x_h_.get(), static_cast<size_t>(b * dims_[0]) * sizeof(float),
                                  cudaMemcpyHostToDevice, stream_));
    GS_CUDA_CHECK(cudaMemcpyAsync(labels_d_.get(), labels_h_.get(), static_cast<size_t>(b) * sizeof(int32_t),
                                  cudaMemcpyHostToDevice, stream_));
  }

  std::string name_;
  std::vector<int64_t> dims_;
  CudaModelOptions cuda_;
  cudaStream_t stream_ = nullptr;
  cudaStream_t copy_stream_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  std::vector<cudaEvent_t> layer_done_;
  DeviceBuffer<float> params_d_, grads_d_, velocity_d_;
  DeviceBuffer<float> x_d_, delta_, delta_prev_, row_loss_, ones_;
  DeviceBuffer<int32_t> labels_d_;
  DeviceBuffer<double> loss_d_, sums_d_, eval_loss_;
  DeviceBuffer<int> eval_correct_;
  std::vector<DeviceBuffer<float>> acts_;
  // 16-bit precisions: the parameters' 16-bit copy, the gradient's (the wire's), the input,
  // activations and output gradients in 16 bits, a column of ones, the non-finite flag.
  DeviceBuffer<uint16_t> params16_, grads16_, x16_, delta16_, delta_prev16_, ones16_;
  std::vector<DeviceBuffer<uint16_t>> acts16_;
  DeviceBuffer<int> nonfinite_d_;
  PinnedBuffer<int> nonfinite_h_;
  PinnedBuffer<float> x_h_;
  PinnedBuffer<int32_t> labels_h_;
  PinnedBuffer<double> results_;
  int64_t capacity_ = 0;
  OptimizerOptions optimizer_;
  bool optimizer_set_ = false;
  std::vector<Segment> ranges_;  // what OptimizerStep updates (ZeRO: the shard), the velocity laid out in this order
};

}  // namespace

int CudaDeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return n;
}

std::string CudaDeviceName(int device) {
  cudaDeviceProp prop;
  if (device < 0 || device >= CudaDeviceCount() || cudaGetDeviceProperties(&prop, device) != cudaSuccess) return "";
  return prop.name;
}

Result<std::unique_ptr<Model>> CreateCudaModel(const ModelOptions& options, const CudaModelOptions& cuda) {
  if (options.name == "sparse_logreg") {
    return InvalidArgumentError("sparse_logreg has no CUDA backend (its gradient is a sparse key list); use --device=cpu");
  }
  ASSIGN_OR_RETURN(std::vector<int64_t> dims, DenseModelDims(options));
  for (int64_t d : dims) {
    if (d > (1 << 30)) return InvalidArgumentError("layer size " + std::to_string(d) + " is too large for cuBLAS");
  }
  const int devices = CudaDeviceCount();
  if (devices == 0) return FailedPreconditionError("--device=cuda: no CUDA device is visible");
  if (cuda.device < 0 || cuda.device >= devices) {
    return FailedPreconditionError("CUDA device " + std::to_string(cuda.device) + " does not exist (" +
                                   std::to_string(devices) + " visible)");
  }
  std::unique_ptr<Model> m = std::make_unique<CudaMlp>(options.name, std::move(dims), cuda, options.precision);
  return std::move(m);  // nvcc's front end does not treat a returned local as an rvalue here
}

}  // namespace gradsync
