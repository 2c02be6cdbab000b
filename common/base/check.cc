#include "common/base/check.h"

#include <cstdio>
#include <cstdlib>

namespace gradsync::internal {

CheckFailure::CheckFailure(const char* file, int line, const char* condition) {
  os_ << "CHECK failed at " << file << ":" << line << ": " << condition << " ";
}

CheckFailure::~CheckFailure() {
  std::string s = os_.str();
  std::fprintf(stderr, "%s\n", s.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace gradsync::internal
