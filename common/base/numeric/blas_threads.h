// The threads OpenBLAS may use for each BLAS call: a process-wide setting that the worker's
// --threads, the models' sgemm, PowerSGD's factors and the simulator's timing of them share.
#pragma once

namespace gradsync {

// Threads OpenBLAS may use for each call (at least 1).
void SetBlasThreads(int threads);
// The threads OpenBLAS runs each BLAS call on now.
int BlasThreads();

}  // namespace gradsync
