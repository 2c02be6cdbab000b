// The CUDA MLP's kernels and its error checks: included by cuda_mlp.cu alone (one translation
// unit, so that its launches need no relocatable device code), inside its anonymous namespace.
#pragma once


#define GS_CUDA_CHECK(call)                                                                     \
  do {                                                                                         \
    const cudaError_t gs_e = (call);                                                           \
    GRADSYNC_CHECK(gs_e == cudaSuccess) << #call << ": " << cudaGetErrorString(gs_e);          \
  } while (0)
#define GS_CUBLAS_CHECK(call)                                                                   \
  do {                                                                                         \
    const cublasStatus_t gs_s = (call);                                                        \
    GRADSYNC_CHECK(gs_s == CUBLAS_STATUS_SUCCESS) << #call << ": " << cublasGetStatusString(gs_s); \
  } while (0)

Status CudaStatus(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return OkStatus();
  return InternalError(std::string(what) + ": " + cudaGetErrorString(e));
}

constexpr int kThreads = 256;

int Blocks(int64_t n) { return static_cast<int>(std::min<int64_t>((n + kThreads - 1) / kThreads, 65535)); }

// out = act(out + bias) over a row-major [rows, cols] matrix; act is ReLU or the identity.
__global__ void BiasActivation(float* out, const float* bias, int64_t rows, int64_t cols, bool relu) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float v = out[i] + bias[i % cols];
    out[i] = relu ? (v > 0.0f ? v : 0.0f) : v;
  }
}

// delta[i] = 0 where the forward activation was clamped (a[i] <= 0).
__global__ void ReluBackward(const float* a, int64_t n, float* delta) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (!(a[i] > 0.0f)) delta[i] = 0.0f;
  }
}

// The 16-bit element types and their conversions.
__device__ __forceinline__ float ToFloat(__half x) { return __half2float(x); }
__device__ __forceinline__ float ToFloat(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T> __device__ __forceinline__ T FromFloat(float x);
template <> __device__ __forceinline__ __half FromFloat<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

template <typename T> constexpr cudaDataType_t kDataType = CUDA_R_32F;
template <> constexpr cudaDataType_t kDataType<__half> = CUDA_R_16F;
template <> constexpr cudaDataType_t kDataType<__nv_bfloat16> = CUDA_R_16BF;

// out[i] = T(in[i] * scale).
template <typename T>
__global__ void ConvertScaled(const float* in, int64_t n, float scale, T* out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = FromFloat<T>(in[i] * scale);
  }
}

// out[i] = float(in[i]) * scale; *nonfinite = 1 where a result is inf or NaN.
template <typename T>
__global__ void UnpackScaled(const T* in, int64_t n, float scale, float* out, int* nonfinite) {
  bool bad = false;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float v = ToFloat(in[i]) * scale;
    out[i] = v;
    bad |= !isfinite(v);
  }
  if (bad) *nonfinite = 1;
}

// out = T(act(float(out) + bias)) over a row-major [rows, cols] 16-bit matrix.
template <typename T>
__global__ void BiasActivation16(T* out, const T* bias, int64_t rows, int64_t cols, bool relu) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float v = ToFloat(out[i]) + ToFloat(bias[i % cols]);
    out[i] = FromFloat<T>(relu ? (v > 0.0f ? v : 0.0f) : v);
  }
}

template <typename T>
__global__ void ReluBackward16(const T* a, int64_t n, T* delta) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (!(ToFloat(a[i]) > 0.0f)) delta[i] = FromFloat<T>(0.0f);
  }
}

// Softmax cross-entropy, one thread per row: delta = (softmax(z) - onehot(y)) * inv_b * scale
// and the row's (unscaled) loss, as the CPU model computes them; fp32 inside, logits and delta
// of type T.
template <typename T>
__global__ void SoftmaxCrossEntropy16(const T* logits, const int32_t* labels, int64_t b, int64_t classes, float inv_b,
                                      float loss_scale, T* delta, float* row_loss) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < b;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const T* z = logits + i * classes;
    T* d = delta + i * classes;
    float m = ToFloat(z[0]);
    for (int64_t c = 1; c < classes; ++c) m = fmaxf(m, ToFloat(z[c]));
    float sum = 0.0f;
    for (int64_t c = 0; c < classes; ++c) sum += expf(ToFloat(z[c]) - m);
    const int32_t y = labels[i];
    row_loss[i] = logf(sum) + m - ToFloat(z[y]);
    const float scale = inv_b * loss_scale / sum;
    for (int64_t c = 0; c < classes; ++c) {
      float v = expf(ToFloat(z[c]) - m) * scale;
      if (c == y) v -= inv_b * loss_scale;
      d[c] = FromFloat<T>(v);
    }
  }
}

// Evaluation over 16-bit logits: as EvaluateRows.
template <typename T>
__global__ void EvaluateRows16(const T* logits, const int32_t* labels, int64_t b, int64_t classes, double* row_loss,
                               int* row_correct) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < b;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const T* z = logits + i * classes;
    int64_t top = 0;
    for (int64_t c = 1; c < classes; ++c) {
      if (ToFloat(z[c]) > ToFloat(z[top])) top = c;
    }
    const float m = ToFloat(z[top]);
    double sum = 0.0;
    for (int64_t c = 0; c < classes; ++c) sum += exp(static_cast<double>(ToFloat(z[c]) - m));
    const int32_t y = labels[i];
    row_loss[i] = log(sum) + m - ToFloat(z[y]);
    row_correct[i] = top == y ? 1 : 0;
  }
}

// Softmax cross-entropy, one thread per row: delta = (softmax(z) - onehot(y)) * inv_b and the
// row's loss, as the CPU model computes them.
__global__ void SoftmaxCrossEntropy(const float* logits, const int32_t* labels, int64_t b, int64_t classes,
                                    float inv_b, float* delta, float* row_loss) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < b;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float* z = logits + i * classes;
    float* d = delta + i * classes;
    float m = z[0];
    for (int64_t c = 1; c < classes; ++c) m = fmaxf(m, z[c]);
    float sum = 0.0f;
    for (int64_t c = 0; c < classes; ++c) {
      d[c] = expf(z[c] - m);
      sum += d[c];
    }
    const int32_t y = labels[i];
    row_loss[i] = logf(sum) + m - z[y];
    const float scale = inv_b / sum;
    for (int64_t c = 0; c < classes; ++c) d[c] *= scale;
    d[y] -= inv_b;
  }
}

// Evaluation, one thread per row: the loss (in double, as the CPU's EvaluateBatch) and whether
// the first largest logit is the label.
__global__ void EvaluateRows(const float* logits, const int32_t* labels, int64_t b, int64_t classes,
                             double* row_loss, int* row_correct) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < b;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float* z = logits + i * classes;
    int64_t top = 0;
    for (int64_t c = 1; c < classes; ++c) {
      if (z[c] > z[top]) top = c;
    }
    const float m = z[top];
    double sum = 0.0;
    for (int64_t c = 0; c < classes; ++c) sum += exp(static_cast<double>(z[c] - m));
    const int32_t y = labels[i];
    row_loss[i] = log(sum) + m - z[y];
    row_correct[i] = top == y ? 1 : 0;
  }
}

// out[0] = sum of x[0, n) in double, by one block in a fixed order (deterministic).
template <typename T>
__global__ void SumToDouble(const T* x, int64_t n, double* out) {
  __shared__ double partial[kThreads];
  double acc = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) acc += static_cast<double>(x[i]);
  partial[threadIdx.x] = acc;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s /= 2) {
    if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) *out = partial[0];
}

// The Optimizer rule (common/optim/optimizer.h): g' = g + wd w; b = mu b + g'; w -= lr (nesterov ?
// g' + mu b : b); without momentum w -= lr g'.
__global__ void SgdStep(float* w, const float* g, float* velocity, int64_t n, float lr, float mu, bool nesterov,
                        float wd) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float gi = g[i] + wd * w[i];
    if (mu == 0.0f) {
      w[i] -= lr * gi;
      continue;
    }
    const float b = mu * velocity[i] + gi;
    velocity[i] = b;
    w[i] -= lr * (nesterov ? gi + mu * b : b);
  }
}

__global__ void FillKernel(float* x, int64_t n, float v) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    x[i] = v;
  }
}
