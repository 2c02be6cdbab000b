// The NCCL collective (built with CUDA and NCCL; skipped, saying so, where no GPU is visible,
// failed where one is listed that CUDA cannot use: GRADSYNC_REQUIRE_GPU, support/gpu_gate.h).
#include <gtest/gtest.h>

#include "allreduce/nccl/nccl_allreduce.h"
#include "allreduce/tcp_ring.h"
#include "tests/support/cuda_gate.h"

namespace gradsync {
namespace {

TEST(NcclTest, OneRankAllReduceOnDeviceBuffers) {
  GRADSYNC_REQUIRE_GPU();
  auto ring = std::move(RingCollective::Listen("127.0.0.1", {})).value();
  ASSERT_TRUE(ring->Connect(0, {"127.0.0.1:" + std::to_string(ring->port())}, 5).ok());
  auto nccl = NcclCollective::Create(*ring, 0);
  ASSERT_TRUE(nccl.ok()) << nccl.status();
  const size_t n = 1000003;
  std::vector<float> host(n);
  for (size_t i = 0; i < n; ++i) host[i] = static_cast<float>(i % 13);
  float* dev = nullptr;
  ASSERT_EQ(cudaMalloc(&dev, n * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dev, host.data(), n * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  ASSERT_TRUE((*nccl)->AllReduce(dev, n, ReduceOp::kSum, stream).ok());
  ASSERT_TRUE((*nccl)->AllReduce(dev, n, ReduceOp::kAverage, stream).ok());
  ASSERT_TRUE((*nccl)->Synchronize(stream, 30).ok());
  std::vector<float> back(n);
  ASSERT_EQ(cudaMemcpy(back.data(), dev, n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(back, host);  // one rank: sum and average are the identity
  cudaFree(dev);
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace gradsync
