#include "allreduce/nccl/nccl_allreduce.h"
#include "common/base/clock.h"

#include <chrono>
#include <cstring>
#include <thread>

namespace gradsync {
namespace {
Status CudaError(cudaError_t e, const char* what) {
  return UnavailableError(std::string(what) + ": " + cudaGetErrorString(e));
}
Status NcclError(ncclResult_t r, const char* what) {
  return UnavailableError(std::string(what) + ": " + ncclGetErrorString(r));
}
}  // namespace

int NcclCollective::DeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

Result<std::unique_ptr<NcclCollective>> NcclCollective::Create(Collective& bootstrap, int device) {
  if (DeviceCount() == 0) return FailedPreconditionError("no CUDA device is visible");
  auto c = std::unique_ptr<NcclCollective>(new NcclCollective());
  c->rank_ = bootstrap.rank();
  c->size_ = bootstrap.size();
  c->device_ = device;
  if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) return CudaError(e, "cudaSetDevice");
  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  if (c->rank_ == 0) {
    if (ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess) return NcclError(r, "ncclGetUniqueId");
  }
  // The id travels as floats through the CPU collective's broadcast (bit patterns preserved).
  static_assert(sizeof(ncclUniqueId) % sizeof(float) == 0);
  std::vector<float> words(sizeof(ncclUniqueId) / sizeof(float));
  std::memcpy(words.data(), &id, sizeof(id));
  RETURN_IF_ERROR(bootstrap.Broadcast(words, 0).WithContext("sharing the NCCL id"));
  std::memcpy(&id, words.data(), sizeof(id));
  if (ncclResult_t r = ncclCommInitRank(&c->comm_, c->size_, id, c->rank_); r != ncclSuccess) {
    return NcclError(r, "ncclCommInitRank");
  }
  return c;
}

NcclCollective::~NcclCollective() {
  if (comm_) ncclCommDestroy(comm_);
}

Status NcclCollective::AllReduce(float* device_data, size_t count, ReduceOp op, cudaStream_t stream) {
  if (count == 0) return OkStatus();
  if (!comm_) return FailedPreconditionError("the NCCL communicator was aborted after an earlier failure");
  ncclResult_t r = ncclAllReduce(device_data, device_data, count, ncclFloat32,
                                 op == ReduceOp::kAverage ? ncclAvg : ncclSum, comm_, stream);
  return r == ncclSuccess ? OkStatus() : NcclError(r, "ncclAllReduce");
}

Status NcclCollective::AllReduce16(uint16_t* device_data, size_t count, Float16 format, cudaStream_t stream) {
  if (count == 0) return OkStatus();
  if (!comm_) return FailedPreconditionError("the NCCL communicator was aborted after an earlier failure");
  const bool bf16 = format == Float16::kBfloat16;
  ncclResult_t r = ncclAllReduce(device_data, device_data, count, bf16 ? ncclBfloat16 : ncclFloat16, ncclSum, comm_, stream);
  return r == ncclSuccess ? OkStatus() : NcclError(r, bf16 ? "ncclAllReduce (bf16)" : "ncclAllReduce (fp16)");
}

Status NcclCollective::CheckEqualChunks(const char* what, size_t count) const {
  if (!comm_) return FailedPreconditionError("the NCCL communicator was aborted after an earlier failure");
  if (count % static_cast<size_t>(size_) != 0) {
    return InvalidArgumentError(std::string("NCCL ") + what + " of " + std::to_string(count) + " floats: not a multiple of " +
                                std::to_string(size_) + " ranks");
  }
  return OkStatus();
}

Status NcclCollective::ReduceScatterDevice(float* device_data, size_t count, ReduceOp op, void* stream) {
  if (count == 0) return OkStatus();
  RETURN_IF_ERROR(CheckEqualChunks("reduce-scatter", count));
  elements_ += count;
  const size_t chunk = count / static_cast<size_t>(size_);
  // In place: the receive buffer is this rank's chunk of the send buffer.
  ncclResult_t r = ncclReduceScatter(device_data, device_data + chunk * static_cast<size_t>(rank_), chunk, ncclFloat32,
                                     op == ReduceOp::kAverage ? ncclAvg : ncclSum, comm_, static_cast<cudaStream_t>(stream));
  return r == ncclSuccess ? OkStatus() : NcclError(r, "ncclReduceScatter");
}

Status NcclCollective::AllGatherDevice(float* device_data, size_t count, void* stream) {
  if (count == 0) return OkStatus();
  RETURN_IF_ERROR(CheckEqualChunks("all-gather", count));
  elements_ += count;
  const size_t chunk = count / static_cast<size_t>(size_);
  ncclResult_t r = ncclAllGather(device_data + chunk * static_cast<size_t>(rank_), device_data, chunk, ncclFloat32, comm_,
                                 static_cast<cudaStream_t>(stream));
  return r == ncclSuccess ? OkStatus() : NcclError(r, "ncclAllGather");
}

Status NcclCollective::Synchronize(cudaStream_t stream, double timeout_s) {
  if (!comm_) return FailedPreconditionError("the NCCL communicator was aborted after an earlier failure");
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (true) {
    cudaError_t e = cudaStreamQuery(stream);
    if (e == cudaSuccess) return OkStatus();
    if (e != cudaErrorNotReady) return CudaError(e, "NCCL stream");
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(comm_, &async);
    if (async != ncclSuccess) {
      ncclCommAbort(comm_);
      comm_ = nullptr;
      return NcclError(async, "NCCL");
    }
    if (std::chrono::steady_clock::now() > deadline) {
      ncclCommAbort(comm_);
      comm_ = nullptr;
      return DeadlineExceededError("NCCL all-reduce did not finish within " + SecondsText(timeout_s) + " s");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

}  // namespace gradsync
