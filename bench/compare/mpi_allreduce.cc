// MPI_Allreduce, timed like gradsync-bench-allreduce (for allreduce_compare.sh).
// Usage: mpirun -np N mpi_allreduce ITERS BYTES...   Prints "RESULT bytes p50_us p99_us busbw_GBps wrong".
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const int iters = std::atoi(argv[1]);
  for (int a = 2; a < argc; ++a) {
    const size_t bytes = std::strtoull(argv[a], nullptr, 10), count = bytes / sizeof(float);
    std::vector<float> x(count);
    const int n_iters = std::max<int>(3, std::min<long long>(iters, (2LL << 30) / static_cast<long long>(bytes)));
    std::vector<double> times;
    for (int it = 0; it < n_iters + 2; ++it) {
      for (size_t i = 0; i < count; ++i) x[i] = static_cast<float>((rank + 1) * static_cast<int>(i % 7 + 1));
      MPI_Barrier(MPI_COMM_WORLD);
      auto t0 = std::chrono::steady_clock::now();
      MPI_Allreduce(MPI_IN_PLACE, x.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
      if (it >= 2) times.push_back(us);
    }
    long long wrong = 0;
    const float total = static_cast<float>(size * (size + 1) / 2);
    for (size_t i = 0; i < count; ++i) wrong += x[i] != total * static_cast<float>(i % 7 + 1);
    std::sort(times.begin(), times.end());
    const double p50 = times[times.size() / 2], p99 = times[std::min(times.size() - 1, times.size() * 99 / 100)];
    if (rank == 0) {
      std::printf("RESULT %zu %.1f %.1f %.4f %lld\n", bytes, p50, p99, bytes / (p50 * 1e-6) / 1e9 * 2.0 * (size - 1) / size,
                  wrong);
      std::fflush(stdout);
    }
  }
  MPI_Finalize();
  return 0;
}
