// ParallelFor: a fixed set of threads that split one loop over [0, n) into equal contiguous
// pieces, the calling thread taking the first. The cut depends on n and the thread count only,
// and each element is handled by exactly one piece, so an element-wise loop gives the same
// bits whatever the number of threads. Threads sleep between loops. One caller at a time.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace gradsync {

class ParallelFor {
 public:
  // threads >= 1, the caller included (1: everything runs on the caller).
  explicit ParallelFor(int threads);
  ~ParallelFor();
  ParallelFor(const ParallelFor&) = delete;
  ParallelFor& operator=(const ParallelFor&) = delete;

  int threads() const { return static_cast<int>(workers_.size()) + 1; }
  // fn(begin, end) over pieces covering [0, n); loops of fewer than 2 * min_piece elements (or
  // with one thread) run on the caller alone. Returns when every piece is done.
  void Run(size_t n, size_t min_piece, const std::function<void(size_t, size_t)>& fn);

 private:
  void Loop(size_t index);

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable start_, done_;
  uint64_t generation_ = 0;
  size_t pending_ = 0;
  size_t pieces_ = 0;
  size_t n_ = 0;
  const std::function<void(size_t, size_t)>* fn_ = nullptr;
  bool stop_ = false;
};

}  // namespace gradsync
