// gradsync-worker --device=cuda in every mode, against the same run on the CPU. Built with CUDA;
// skipped, saying so, where no GPU is visible, failed where one is listed that CUDA cannot use
// (GRADSYNC_REQUIRE_GPU, support/gpu_gate.h).
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "models/cuda/cuda_model.h"
#include "tests/support/cuda_gate.h"
#include "tests/support/subprocess.h"
#include "tests/support/temp_dir.h"

namespace gradsync::testing {
namespace {

// The accuracy in the evaluating worker's "final test_acc X%" line; -1 when missing.
double FinalAccuracy(const std::string& out) {
  const size_t at = out.find("final test_acc ");
  if (at == std::string::npos) return -1;
  return std::strtod(out.c_str() + at + 15, nullptr);
}

ProcessResult Launch(const std::vector<std::string>& launcher, const std::string& device, const TempDir& dir,
                     const std::string& precision = "fp32") {
  std::vector<std::string> args{BinaryPath("gradsync-launch")};
  args.insert(args.end(), launcher.begin(), launcher.end());
  args.insert(args.end(), {"--out=" + dir.path() + "/" + device + precision, "--", "--dataset=blobs", "--hidden=64,32",
                           "--epochs=3", "--batch=32", "--lr=0.05", "--device=" + device, "--precision=" + precision});
  return RunProcess(args, 240);
}

TEST(CudaBinaryTest, PsWorkersOnOneGpuTrainLikeCpuWorkers) {
  GRADSYNC_REQUIRE_GPU();
  for (const std::string mode : {"bsp", "asp"}) {
    SCOPED_TRACE(mode);
    TempDir dir;
    // Two workers share GPU 0 (rank modulo the visible devices, or --gpu).
    const std::vector<std::string> launcher{"--servers=2", "--workers=2", "--mode=" + mode};
    ProcessResult gpu = Launch(launcher, "cuda", dir);
    ASSERT_EQ(gpu.exit_code, 0) << gpu.out << gpu.err;
    EXPECT_NE(gpu.out.find("device=cuda:"), std::string::npos) << gpu.out;
    ProcessResult cpu = Launch(launcher, "cpu", dir);
    ASSERT_EQ(cpu.exit_code, 0) << cpu.out << cpu.err;
    const double a_gpu = FinalAccuracy(gpu.out), a_cpu = FinalAccuracy(cpu.out);
    ASSERT_GT(a_cpu, 50.0) << cpu.out;
    EXPECT_NEAR(a_gpu, a_cpu, 1.0) << gpu.out;
  }
}

TEST(CudaBinaryTest, AllreduceRunsNcclOnTheDevice) {
  GRADSYNC_REQUIRE_GPU();
  TempDir dir;
  const int workers = std::min(2, CudaDeviceCount());  // NCCL: one rank per GPU
  const std::vector<std::string> launcher{"--mode=allreduce", "--workers=" + std::to_string(workers)};
  ProcessResult gpu = Launch(launcher, "cuda", dir);
  ASSERT_EQ(gpu.exit_code, 0) << gpu.out << gpu.err;
  EXPECT_NE(gpu.out.find("NCCL all-reduced"), std::string::npos) << gpu.out;
  ProcessResult cpu = Launch(launcher, "cpu", dir);
  ASSERT_EQ(cpu.exit_code, 0) << cpu.out << cpu.err;
  EXPECT_NEAR(FinalAccuracy(gpu.out), FinalAccuracy(cpu.out), 1.0) << gpu.out;
}

// --precision=bf16|fp16 on the device: GemmEx in 16 bits, NCCL on the 16-bit gradient, fp16's
// loss scaling (the first steps at 2^30 overflow and are skipped); as accurate as fp32 on the CPU.
TEST(CudaBinaryTest, SixteenBitPrecisionsTrainOnTheDevice) {
  GRADSYNC_REQUIRE_GPU();
  TempDir dir;
  const std::vector<std::string> launcher{"--mode=allreduce", "--workers=1"};
  ProcessResult cpu = Launch(launcher, "cpu", dir);
  ASSERT_EQ(cpu.exit_code, 0) << cpu.out << cpu.err;
  for (const std::string precision : {"bf16", "fp16"}) {
    SCOPED_TRACE(precision);
    ProcessResult gpu = Launch(launcher, "cuda", dir, precision);
    ASSERT_EQ(gpu.exit_code, 0) << gpu.out << gpu.err;
    EXPECT_NE(gpu.out.find("precision=" + precision), std::string::npos) << gpu.out;
    EXPECT_NEAR(FinalAccuracy(gpu.out), FinalAccuracy(cpu.out), 2.0) << gpu.out;
  }
  ProcessResult local = RunProcess({BinaryPath("gradsync-worker"), "--dataset=blobs", "--hidden=64,32", "--epochs=2",
                                    "--device=cuda", "--precision=fp16", "--initial-loss-scale=1e9",
                                    "--out=" + dir.path() + "/local"},
                                   120);
  ASSERT_EQ(local.exit_code, 0) << local.out << local.err;
  EXPECT_GT(FinalAccuracy(local.out), 50.0) << local.out;
}

TEST(CudaBinaryTest, LocalTrainingOnTheGpu) {
  GRADSYNC_REQUIRE_GPU();
  ProcessResult r = RunProcess({BinaryPath("gradsync-worker"), "--dataset=blobs", "--hidden=64,32", "--epochs=2",
                                "--device=cuda"},
                               120);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_GT(FinalAccuracy(r.out), 50.0) << r.out;
}

}  // namespace
}  // namespace gradsync::testing
