// Test support: whether a test that needs a GPU runs, skips or fails. One decision for every CUDA
// and NCCL test, taken from facts that a test can inject (gpu_gate_test does), so that a GPU
// machine whose tests cannot run (a driver that does not match the toolkit, a GPU that CUDA does
// not see) is red, never green with every GPU test skipped:
//
//   - CUDA counts one device or more: run.
//   - CUDA sees no device (cudaErrorNoDevice, a count of 0, or no driver installed at all: the
//     runtime's cudaErrorInsufficientDriver with cudaDriverGetVersion 0): skip, in CI too (CI
//     has no GPU) -- unless `nvidia-smi -L` lists a GPU, then fail: a GPU is there and the tests
//     would not run on it.
//   - Any other error of cudaGetDeviceCount (an installed driver too old for the toolkit, a
//     broken installation): fail where `nvidia-smi -L` lists a GPU or under CI=true; skip,
//     naming the error, elsewhere.
//
// The CUDA tests call GRADSYNC_REQUIRE_GPU() (support/cuda_gate.h), which probes these facts once.
#pragma once

#include <ostream>
#include <string>

namespace gradsync::testing {

// cudaError_t's values that the decision names (cuda_gate.cc checks them against the runtime's).
inline constexpr int kCudaSuccess = 0;
inline constexpr int kCudaErrorInsufficientDriver = 35;
inline constexpr int kCudaErrorNoDevice = 100;

struct GpuFacts {
  std::string smi_gpu;           // the first "GPU <n>: ..." line of `nvidia-smi -L`; "" if none
  int count_error = kCudaSuccess;  // what cudaGetDeviceCount returned
  std::string count_error_text;  // its name and description, for the message
  int devices = 0;               // the count, when it succeeded
  int driver_version = 0;        // cudaDriverGetVersion: 0 when no driver is installed
  bool in_ci = false;            // CI=true
};

enum class GpuGate { kRun, kSkip, kFail };

inline std::ostream& operator<<(std::ostream& os, GpuGate g) {
  return os << (g == GpuGate::kRun ? "run" : g == GpuGate::kSkip ? "skip" : "fail");
}

struct GpuDecision {
  GpuGate gate = GpuGate::kSkip;
  std::string why;  // one line: what was found, and for a failure what it means
};

// The decision above, from `facts` alone.
GpuDecision DecideGpuTests(const GpuFacts& facts);

// The first line of `nvidia-smi -L` that lists a GPU ("GPU 0: NVIDIA H100 ... (UUID: ...)"), or ""
// when nvidia-smi is missing, fails (no driver) or lists none. Found on PATH, as a shell would.
std::string NvidiaSmiFirstGpu();

}  // namespace gradsync::testing
