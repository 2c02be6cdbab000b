// CPUs: a core per host, or cores shared by every host.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <vector>

#include "experiments/sim/engine/engine.h"

namespace gradsync::sim {

// Work runs on a host's own thread, one piece after another (a process's main thread), or beside
// every thread (the kernel's copies). With a core per host, a piece runs as soon as the host's
// earlier work has. With `shared_cores` shared by every host (a job on one machine), the runnable
// pieces share them as the kernel's scheduler shares a machine: each progresses at
// min(1, cores / runnable), so a short piece gets through while long ones run, slowed.
class Cpus {
 public:
  Cpus(Engine& engine, int hosts, int shared_cores, double usable_cores);

  // Runs `us` of host h's work after its earlier work; then `done`.
  void Run(int h, double us, std::function<void()> done);
  // Work of no process's own thread (the kernel moving a message) on the shared cores, then
  // `done`; without shared cores it costs nothing: `done` now.
  void Kernel(double us, std::function<void()> done);
  bool shared() const { return cores_ > 0; }
  // The CPU time modelled so far: host h's own threads, and the kernel's on the shared cores.
  double busy_us(int h) const { return busy_us_[static_cast<size_t>(h)]; }
  double kernel_us() const { return kernel_us_; }

 private:
  struct Task {
    double left;  // microseconds of CPU still to run
    int host;     // -1: the kernel's
    std::function<void()> done;
  };
  double Rate() const;
  // Brings every running task's `left` up to now.
  void Advance();
  void Add(Task t);
  // An event when the first running task ends; an earlier one is void once this is scheduled.
  void Schedule();
  void Tick();

  Engine& engine_;
  int cores_;
  double usable_;                // what the running work gets of cores_ when it wants them all
  std::vector<Time> host_free_;  // a core per host: when its work so far ends
  std::vector<double> busy_us_;
  double kernel_us_ = 0;
  // Shared cores: the tasks running, each host's tasks behind its running one.
  std::vector<Task> running_;
  std::vector<std::deque<Task>> queued_;
  std::vector<bool> host_running_;
  Time updated_ = 0;
  uint64_t gen_ = 0;
};

}  // namespace gradsync::sim
