#include "tests/support/cuda_gate.h"

#include <cuda_runtime.h>

#include <cstdlib>

namespace gradsync::testing {

static_assert(kCudaSuccess == cudaSuccess);
static_assert(kCudaErrorInsufficientDriver == cudaErrorInsufficientDriver);
static_assert(kCudaErrorNoDevice == cudaErrorNoDevice);

const GpuFacts& ProbedGpuFacts() {
  static const GpuFacts facts = [] {
    GpuFacts f;
    f.smi_gpu = NvidiaSmiFirstGpu();
    const cudaError_t e = cudaGetDeviceCount(&f.devices);
    f.count_error = static_cast<int>(e);
    if (e != cudaSuccess) {
      f.devices = 0;
      f.count_error_text = std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
      cudaGetLastError();  // not left for the test's own CUDA calls to find
    }
    if (cudaDriverGetVersion(&f.driver_version) != cudaSuccess) f.driver_version = 0;
    const char* ci = std::getenv("CI");
    f.in_ci = ci != nullptr && std::string(ci) == "true";
    return f;
  }();
  return facts;
}

GpuDecision GpuTestGate() { return DecideGpuTests(ProbedGpuFacts()); }

}  // namespace gradsync::testing
