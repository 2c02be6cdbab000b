// GRADSYNC_CHECK: invariant assertions that stay on in release builds.
//
// A failed check means a bug in gradsync, not bad input: it prints file:line, the condition and
// any streamed message to stderr and aborts. Bad input (flags, files, messages) never reaches a
// CHECK; it is turned into a Status first (status.h).
//
//   GRADSYNC_CHECK(offset + n <= size) << "range " << offset << "+" << n;
#pragma once

#include <sstream>

namespace gradsync::internal {

class CheckFailure {
 public:
  CheckFailure(const char* file, int line, const char* condition);
  [[noreturn]] ~CheckFailure();
  CheckFailure(const CheckFailure&) = delete;
  CheckFailure& operator=(const CheckFailure&) = delete;
  std::ostream& stream() { return os_; }

 private:
  std::ostringstream os_;
};

// Makes `cond ? (void)0 : Voidify() & stream` type-check.
struct Voidify {
  void operator&(std::ostream&) {}
};

}  // namespace gradsync::internal

#define GRADSYNC_CHECK(cond)                   \
  (cond) ? (void)0                             \
         : ::gradsync::internal::Voidify() &   \
               ::gradsync::internal::CheckFailure(__FILE__, __LINE__, #cond).stream()
