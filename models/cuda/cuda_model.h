// The CUDA backend of models/: the dense models (softmax, MLP) with parameters, gradients and
// activations on one GPU, behind the same Model interface as the CPU ones.
//
// cuBLAS sgemm for the dense layers (the same row-major [in, out] weights as the CPU MLP, so a
// layer is one sgemm each way); small kernels for bias + ReLU, ReLU's mask, softmax cross-entropy,
// accuracy and the optimizer step (OptimizerStep: the Optimizer's SGD rule, state on the device;
// SetOptimizer refuses adam with kUnimplemented). All work goes on the model's one stream; the host
// waits only where a result leaves the device: the loss (end of ForwardBackward), the evaluation
// sums, GradsToHost, ParamsToHost. params()/grads() are pinned host mirrors (cudaHostRegister), so
// the parameter-server modes copy to and from them with DMA; Initialize fills both sides from the
// CPU model's bits.
//
// GradReady(t) (layer-wise readiness) is called when tensor t's gradient has been ENQUEUED:
// device work issued on device_stream() afterwards sees it. With stream_grads_to_host, each
// layer's gradient is also copied into grads() on a second stream as soon as it is computed,
// overlapping the rest of backward; GradsToHost then waits only for the last copies.
//
// This header needs no CUDA: a CPU-only build never includes the implementation.
//
//   ASSIGN_OR_RETURN(auto model, CreateCudaModel(options, {.device = 0}));
//   model->Initialize(seed);
//   RETURN_IF_ERROR(model->SetOptimizer(opt));
//   float loss = model->ForwardBackward(batch);   // waits for the loss only
//   RETURN_IF_ERROR(model->OptimizerStep(lr));    // enqueued
#pragma once

#include <memory>
#include <string>

#include "models/model.h"

namespace gradsync {

struct CudaModelOptions {
  int device = 0;                     // CUDA device index
  bool stream_grads_to_host = false;  // copy each layer's gradient to grads() during backward
};

// Visible CUDA devices (0 without a GPU or a driver); a device's name ("" if none).
int CudaDeviceCount();
std::string CudaDeviceName(int device);

// A dense model (softmax | mlp) on `cuda.device`. kInvalidArgument for bad options (the same
// checks as CreateModel) and for sparse_logreg; kFailedPrecondition when no such device exists.
Result<std::unique_ptr<Model>> CreateCudaModel(const ModelOptions& options, const CudaModelOptions& cuda);

}  // namespace gradsync
