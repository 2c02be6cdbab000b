// ring_check: one rank of a ring all-reduce check run as its own process (by ring_process_test).
// Usage: ring_check RANK N DIR — listens, writes DIR/port-RANK, waits for every rank's port file,
// connects the ring, then checks exact sums for counts {0, 1, n-1, 1000, 1000003}.
// Exit 0 when every result is exact; 1 with one line on stderr otherwise.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <thread>

#include "allreduce/tcp_ring.h"

int main(int argc, char** argv) {
  using namespace gradsync;
  if (argc != 4) return 2;
  const int rank = std::atoi(argv[1]), n = std::atoi(argv[2]);
  const std::string dir = argv[3];
  CollectiveOptions opt;
  opt.timeout_s = 30;
  auto ring = RingCollective::Listen("127.0.0.1", opt);
  if (!ring.ok()) return 1;
  {
    std::ofstream(dir + "/port-" + std::to_string(rank) + ".tmp") << (*ring)->port() << "\n";
    std::rename((dir + "/port-" + std::to_string(rank) + ".tmp").c_str(), (dir + "/port-" + std::to_string(rank)).c_str());
  }
  std::vector<std::string> peers;
  for (int r = 0; r < n; ++r) {
    std::string port;
    for (int i = 0; i < 2000 && port.empty(); ++i) {
      std::ifstream f(dir + "/port-" + std::to_string(r));
      if (f) std::getline(f, port);
      if (port.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (port.empty()) {
      std::cerr << "ring_check: no port file from rank " << r << std::endl;
      return 1;
    }
    peers.push_back("127.0.0.1:" + port);
  }
  if (Status s = (*ring)->Connect(rank, peers, 30); !s.ok()) {
    std::cerr << "ring_check: " << s << std::endl;
    return 1;
  }
  for (size_t count : {size_t{0}, size_t{1}, static_cast<size_t>(n - 1), size_t{1000}, size_t{1000003}}) {
    std::vector<float> x(count);
    for (size_t i = 0; i < count; ++i) x[i] = static_cast<float>((rank + 1) * static_cast<int>(i % 7 + 1));
    if (Status s = (*ring)->AllReduce(x, ReduceOp::kSum); !s.ok()) {
      std::cerr << "ring_check: " << s << std::endl;
      return 1;
    }
    const float total = static_cast<float>(n * (n + 1) / 2);
    for (size_t i = 0; i < count; ++i) {
      if (x[i] != total * static_cast<float>(i % 7 + 1)) {
        std::cerr << "ring_check: rank " << rank << " count " << count << ": wrong sum at " << i << std::endl;
        return 1;
      }
    }
  }
  return (*ring)->Barrier().ok() ? 0 : 1;
}
