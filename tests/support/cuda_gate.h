// Test support for the tests built with CUDA: GRADSYNC_REQUIRE_GPU() runs, skips or fails the
// test as DecideGpuTests (gpu_gate.h) says from this machine's facts.
#pragma once

#include <gtest/gtest.h>

#include "tests/support/gpu_gate.h"

namespace gradsync::testing {

// This machine's facts (nvidia-smi -L, cudaGetDeviceCount, cudaDriverGetVersion, CI), probed once.
const GpuFacts& ProbedGpuFacts();

// DecideGpuTests(ProbedGpuFacts()).
GpuDecision GpuTestGate();

}  // namespace gradsync::testing

// The first statement of a test that needs a GPU: skips it saying why, or fails it saying why
// (a GPU that nvidia-smi lists but CUDA cannot use; a CUDA error other than "no device" under
// CI=true). A statement, like GTEST_SKIP.
#define GRADSYNC_REQUIRE_GPU()                                                                           \
  if (const ::gradsync::testing::GpuDecision gs_gpu_gate_ = ::gradsync::testing::GpuTestGate();          \
      gs_gpu_gate_.gate == ::gradsync::testing::GpuGate::kFail) {                                        \
    FAIL() << gs_gpu_gate_.why;                                                                          \
  } else if (gs_gpu_gate_.gate == ::gradsync::testing::GpuGate::kSkip)                                   \
  GTEST_SKIP() << gs_gpu_gate_.why
