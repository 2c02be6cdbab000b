// The CPU time the calling thread has used: what a piece of work cost apart from the time other
// threads and processes had the core (a traced codec's encode, which the simulator charges as CPU
// and shares out between the processes itself).
#pragma once

#include <time.h>

namespace gradsync {

// Microseconds of CPU this thread has used (CLOCK_THREAD_CPUTIME_ID).
inline double ThreadCpuMicros() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e6 + static_cast<double>(ts.tv_nsec) / 1e3;
}

}  // namespace gradsync
