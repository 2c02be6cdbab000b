// NcclCollective: all-reduce on device buffers with NCCL (GPU workers, --device=cuda).
//
// The ncclUniqueId is created on rank 0 and shared over a CPU collective that is already
// connected (the ring that rendezvoused through the scheduler). Operations are enqueued on the
// caller's stream and never synchronize by themselves; Synchronize() waits with a deadline and
// aborts the communicator when a peer never shows up, so that no rank hangs. Built only when
// CUDA and NCCL are found (target gradsync_allreduce_nccl). Not thread-safe.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <memory>

#include "allreduce/collective.h"

namespace gradsync {

class NcclCollective final : public DeviceCollective {
 public:
  // Number of visible CUDA devices (0 when there is no GPU or no driver).
  static int DeviceCount();
  // Creates rank bootstrap.rank() of bootstrap.size() on `device`.
  static Result<std::unique_ptr<NcclCollective>> Create(Collective& bootstrap, int device);
  ~NcclCollective();

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  // Enqueues data <- op over all ranks on `stream` (count floats of device memory).
  Status AllReduce(float* device_data, size_t count, ReduceOp op, cudaStream_t stream);
  // Enqueues data <- sum over all ranks of `count` 16-bit floats (ncclFloat16 or ncclBfloat16;
  // the 16-bit precisions pre-divide by size()).
  Status AllReduce16(uint16_t* device_data, size_t count, Float16 format, cudaStream_t stream);
  // Waits for `stream`, at most timeout_s; on timeout aborts the communicator.
  Status Synchronize(cudaStream_t stream, double timeout_s);

  // DeviceCollective (the trainers' view): the same calls with an opaque stream.
  Status AllReduceDevice(float* device_data, size_t count, ReduceOp op, void* stream) override {
    elements_ += count;
    return AllReduce(device_data, count, op, static_cast<cudaStream_t>(stream));
  }
  Status AllReduceDevice16(uint16_t* device_data, size_t count, Float16 format, void* stream) override {
    elements_ += count;
    return AllReduce16(device_data, count, format, static_cast<cudaStream_t>(stream));
  }
  // In place, with the Collective chunk layout (count a multiple of size()): ncclReduceScatter
  // leaves chunk rank() reduced, ncclAllGather fills every chunk from its rank.
  Status ReduceScatterDevice(float* device_data, size_t count, ReduceOp op, void* stream) override;
  Status AllGatherDevice(float* device_data, size_t count, void* stream) override;
  Status SynchronizeDevice(void* stream, double timeout_s) override {
    return Synchronize(static_cast<cudaStream_t>(stream), timeout_s);
  }
  uint64_t elements_reduced() const override { return elements_; }

 private:
  NcclCollective() = default;
  // A live communicator, and a count NCCL can cut in size() equal chunks.
  Status CheckEqualChunks(const char* what, size_t count) const;
  ncclComm_t comm_ = nullptr;
  int rank_ = 0;
  int size_ = 1;
  int device_ = 0;
  uint64_t elements_ = 0;
};

}  // namespace gradsync
