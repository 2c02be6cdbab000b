// The GPU tests' run/skip/fail decision (support/gpu_gate.h) from injected facts, nvidia-smi's
// listing read through a fake nvidia-smi, and (built with CUDA) the CUDA and NCCL test binaries
// failing, not skipping, where a fake nvidia-smi lists a GPU that CUDA does not see.
#include "tests/support/gpu_gate.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace gradsync::testing {
namespace {

constexpr char kSmiLine[] = "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-00000000-1111-2222-3333-444444444444)";

// An installed driver too old for the toolkit: what a lent machine with a mismatched driver says.
GpuFacts OldDriver() {
  GpuFacts f;
  f.count_error = kCudaErrorInsufficientDriver;
  f.count_error_text = "cudaErrorInsufficientDriver: CUDA driver version is insufficient for CUDA runtime version";
  f.driver_version = 12020;
  return f;
}

// No driver installed at all (this development machine: the toolkit, no libcuda.so.1).
GpuFacts NoDriver() {
  GpuFacts f = OldDriver();
  f.driver_version = 0;
  return f;
}

GpuFacts NoDevice() {
  GpuFacts f;
  f.count_error = kCudaErrorNoDevice;
  f.count_error_text = "cudaErrorNoDevice: no CUDA-capable device is detected";
  f.driver_version = 12020;
  return f;
}

TEST(GpuGateTest, DevicesRun) {
  GpuFacts f;
  f.devices = 2;
  f.smi_gpu = kSmiLine;
  EXPECT_EQ(DecideGpuTests(f).gate, GpuGate::kRun);
  f.in_ci = true;
  EXPECT_EQ(DecideGpuTests(f).gate, GpuGate::kRun);
}

TEST(GpuGateTest, NoDeviceSkipsInCiToo) {
  for (GpuFacts f : {NoDevice(), NoDriver(), GpuFacts{}}) {
    SCOPED_TRACE(f.count_error);
    for (bool ci : {false, true}) {
      f.in_ci = ci;
      const GpuDecision d = DecideGpuTests(f);
      EXPECT_EQ(d.gate, GpuGate::kSkip) << d.why;
      EXPECT_NE(d.why.find("no CUDA device is visible"), std::string::npos) << d.why;
    }
  }
}

// The mutation this catches: every cudaGetDeviceCount error taken as "no device".
TEST(GpuGateTest, AnErrorOtherThanNoDeviceFailsUnderCi) {
  GpuFacts f = OldDriver();
  f.in_ci = true;
  const GpuDecision d = DecideGpuTests(f);
  EXPECT_EQ(d.gate, GpuGate::kFail) << d.why;
  EXPECT_NE(d.why.find("cudaErrorInsufficientDriver"), std::string::npos) << d.why;
  EXPECT_NE(d.why.find("CI=true"), std::string::npos) << d.why;
  // Any other error too (cudaErrorInitializationError = 3, cudaErrorSystemDriverMismatch = 803).
  for (int e : {3, 803}) {
    f.count_error = e;
    f.count_error_text = "error " + std::to_string(e);
    EXPECT_EQ(DecideGpuTests(f).gate, GpuGate::kFail) << e;
  }
  // Outside CI it skips, naming the error and that CI fails it.
  f = OldDriver();
  const GpuDecision outside = DecideGpuTests(f);
  EXPECT_EQ(outside.gate, GpuGate::kSkip) << outside.why;
  EXPECT_NE(outside.why.find("cudaErrorInsufficientDriver"), std::string::npos) << outside.why;
}

// The mutation this catches: a skip where nvidia-smi lists a GPU.
TEST(GpuGateTest, ASkipWhereNvidiaSmiListsAGpuFails) {
  for (GpuFacts f : {NoDevice(), NoDriver(), OldDriver(), GpuFacts{}}) {
    SCOPED_TRACE(f.count_error);
    f.smi_gpu = kSmiLine;
    const GpuDecision d = DecideGpuTests(f);
    EXPECT_EQ(d.gate, GpuGate::kFail) << d.why;
    EXPECT_NE(d.why.find(kSmiLine), std::string::npos) << d.why;
  }
}

// A directory holding a fake nvidia-smi, put first on PATH while it lives.
class FakeSmi {
 public:
  explicit FakeSmi(const std::string& script) {
    char tmpl[] = "/tmp/gradsync-fake-smi-XXXXXX";
    dir_ = ::mkdtemp(tmpl);
    const std::string path = dir_ + "/nvidia-smi";
    std::ofstream(path) << "#!/bin/sh\n" << script << "\n";
    ::chmod(path.c_str(), 0755);
    const char* old = std::getenv("PATH");
    old_path_ = old ? old : "";
    ::setenv("PATH", (dir_ + ":" + old_path_).c_str(), 1);
  }
  ~FakeSmi() {
    ::setenv("PATH", old_path_.c_str(), 1);
    std::filesystem::remove_all(dir_);
  }
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_, old_path_;
};

TEST(GpuGateTest, NvidiaSmiListingIsRead) {
  {
    FakeSmi smi(std::string("echo '") + kSmiLine + "'\necho 'GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-5)'");
    EXPECT_EQ(NvidiaSmiFirstGpu(), kSmiLine);
  }
  {  // what nvidia-smi says without a driver to talk to
    FakeSmi smi(
        "echo 'NVIDIA-SMI has failed because it couldn'\"'\"'t communicate with the NVIDIA driver.'\nexit 9");
    EXPECT_EQ(NvidiaSmiFirstGpu(), "");
  }
  {
    FakeSmi smi("echo 'No devices found.'");
    EXPECT_EQ(NvidiaSmiFirstGpu(), "");
  }
}

#ifdef GRADSYNC_CUDA_TEST_BINARIES
// Every CUDA and NCCL test goes through the gate: with a fake nvidia-smi listing a GPU that CUDA
// does not see (none here; on a GPU machine CUDA_VISIBLE_DEVICES="" hides it), each of them
// fails: none skips, none passes.
TEST(GpuGateTest, EveryGpuTestFailsWhereNvidiaSmiListsAGpuThatCudaDoesNotSee) {
  int binaries = 0;
  for (const char* name : {"models_cuda_test", "cuda_binary_test", "nccl_test"}) {
    const std::string binary = std::string(GRADSYNC_CUDA_TEST_BINARIES) + "/" + name;
    if (::access(binary.c_str(), X_OK) != 0) continue;  // nccl_test: built only with NCCL
    ++binaries;
    SCOPED_TRACE(binary);
    FakeSmi smi(std::string("echo '") + kSmiLine + "'");
    // Every test but the two that need no GPU (option checks, the CPU model).
    FILE* p = ::popen(("CUDA_VISIBLE_DEVICES= " + binary + " --gtest_filter=-*.Rejects*:*.CpuModels* 2>&1").c_str(),
                      "r");
    ASSERT_NE(p, nullptr);
    std::string out;
    char buf[4096];
    for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
    const int status = ::pclose(p);
    // Shown with its skips renamed: ctest takes "[  SKIPPED ]" anywhere in a test's output for
    // a skip of that test (gtest_discover_tests' SKIP_REGULAR_EXPRESSION), and a skip passes.
    const bool skipped = out.find("[  SKIPPED ]") != std::string::npos;
    for (size_t at; (at = out.find("[  SKIPPED ]")) != std::string::npos;) out.replace(at, 12, "[  skipped ]");
    EXPECT_FALSE(skipped) << "a GPU test skipped where nvidia-smi lists a GPU:\n" << out;
    EXPECT_EQ(out.find("[       OK ]"), std::string::npos) << "a GPU test passed without a GPU:\n" << out;
    EXPECT_NE(status, 0) << "the GPU tests did not fail where nvidia-smi lists a GPU:\n" << out;
    EXPECT_NE(out.find("nvidia-smi -L lists '" + std::string(kSmiLine) + "' but"), std::string::npos)
        << "no failure names the GPU nvidia-smi lists:\n" << out;
  }
  EXPECT_GE(binaries, 2) << "models_cuda_test and cuda_binary_test are built with CUDA";
}
#endif

}  // namespace
}  // namespace gradsync::testing
