#include "tests/support/gpu_gate.h"

#include <cstdio>
#include <string_view>

namespace gradsync::testing {

GpuDecision DecideGpuTests(const GpuFacts& f) {
  if (f.count_error == kCudaSuccess && f.devices > 0) {
    return {GpuGate::kRun, std::to_string(f.devices) + " CUDA device(s) visible"};
  }
  // No device, as opposed to a device CUDA cannot use: the runtime's "no device", a count of 0,
  // or no driver library at all (the runtime then says "insufficient driver", and the driver
  // version is 0). An installed driver that is too old also says "insufficient driver", with
  // its version: that is a broken setup, not a machine without a GPU.
  const bool no_device = (f.count_error == kCudaSuccess && f.devices == 0) || f.count_error == kCudaErrorNoDevice ||
                         (f.count_error == kCudaErrorInsufficientDriver && f.driver_version == 0);
  const std::string found = f.count_error == kCudaSuccess ? "CUDA counts 0 devices"
                                                          : "cudaGetDeviceCount failed: " + f.count_error_text;
  if (!f.smi_gpu.empty()) {
    return {GpuGate::kFail, "nvidia-smi -L lists '" + f.smi_gpu + "' but " + found +
                                ": the GPU tests cannot run on this GPU (a driver that does not match the CUDA "
                                "toolkit, or CUDA_VISIBLE_DEVICES hiding it?)"};
  }
  if (no_device) {
    const bool no_driver = f.count_error == kCudaErrorInsufficientDriver && f.driver_version == 0;
    return {GpuGate::kSkip, "no CUDA device is visible (" + found + (no_driver ? "; no CUDA driver is installed" : "") + ")"};
  }
  if (f.in_ci) {
    return {GpuGate::kFail, found + ", which is not 'no device': a broken CUDA setup fails under CI=true"};
  }
  return {GpuGate::kSkip, found + " (not 'no device': this skips only outside CI=true)"};
}

std::string NvidiaSmiFirstGpu() {
  // Bounded: nvidia-smi can hang on a wedged driver.
  FILE* p = ::popen("timeout 30 nvidia-smi -L 2>/dev/null", "r");
  if (p == nullptr) return "";
  std::string out;
  char buf[512];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  if (::pclose(p) != 0) return "";  // missing, or no driver to talk to
  for (size_t at = 0; at < out.size();) {
    size_t end = out.find('\n', at);
    if (end == std::string::npos) end = out.size();
    const std::string_view line(out.data() + at, end - at);
    if (line.starts_with("GPU ") && line.find(':') != std::string_view::npos) return std::string(line);
    at = end + 1;
  }
  return "";
}

}  // namespace gradsync::testing
