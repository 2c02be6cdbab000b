// Device and page-locked host memory that only grow: included by cuda_mlp.cu alone, inside its
// anonymous namespace (after kernels.cuh, whose checks they use).
#pragma once

// Device memory that only grows (a reallocation synchronizes, so it happens at the first batch
// of a new size, not every step).
template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), size_(o.size_) { o.ptr_ = nullptr, o.size_ = 0; }
  DeviceBuffer& operator=(DeviceBuffer&&) = delete;
  ~DeviceBuffer() {
    if (ptr_) cudaFree(ptr_);
  }
  // True when it grew (the contents are then undefined).
  bool Reserve(size_t count) {
    if (count <= size_) return false;
    if (ptr_) GS_CUDA_CHECK(cudaFree(ptr_));
    ptr_ = nullptr;
    GS_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&ptr_), std::max<size_t>(1, count) * sizeof(T)));
    size_ = count;
    return true;
  }
  T* get() const { return ptr_; }

 private:
  T* ptr_ = nullptr;
  size_t size_ = 0;
};

// Page-locked host memory that only grows (staging for batches and results).
template <typename T>
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  ~PinnedBuffer() {
    if (ptr_) cudaFreeHost(ptr_);
  }
  void Reserve(size_t count) {
    if (count <= size_) return;
    if (ptr_) GS_CUDA_CHECK(cudaFreeHost(ptr_));
    ptr_ = nullptr;
    GS_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&ptr_), std::max<size_t>(1, count) * sizeof(T)));
    size_ = count;
  }
  T* get() const { return ptr_; }

 private:
  T* ptr_ = nullptr;
  size_t size_ = 0;
};
