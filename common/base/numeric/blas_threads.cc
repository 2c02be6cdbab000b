#include "common/base/numeric/blas_threads.h"

#include <cblas.h>

#include <algorithm>

namespace gradsync {

void SetBlasThreads(int threads) { openblas_set_num_threads(std::max(1, threads)); }

int BlasThreads() { return openblas_get_num_threads(); }

}  // namespace gradsync
