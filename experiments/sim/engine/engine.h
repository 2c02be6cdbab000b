// The simulation's engine: events in time order (ties in the order scheduled).
#pragma once

#include <cstdint>
#include <functional>
#include <queue>
#include <utility>
#include <vector>

namespace gradsync::sim {

using Time = double;  // microseconds of simulated time

class Engine {
 public:
  void At(Time t, std::function<void()> f) { q_.push(Ev{t, seq_++, std::move(f)}); }
  void Run();
  Time now() const { return now_; }
  int64_t events() const { return events_; }

 private:
  struct Ev {
    Time t;
    uint64_t seq;
    std::function<void()> f;
    bool operator>(const Ev& o) const { return t != o.t ? t > o.t : seq > o.seq; }
  };
  std::priority_queue<Ev, std::vector<Ev>, std::greater<>> q_;
  uint64_t seq_ = 0;
  Time now_ = 0;
  int64_t events_ = 0;
};

}  // namespace gradsync::sim
