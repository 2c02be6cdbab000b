// Status and Result<T>: the one error type of gradsync.
//
// Every fallible call returns a Status (or a Result<T> holding a value or a non-OK Status);
// errors are never thrown across module boundaries. Exceptions from third-party libraries
// (Boost.Program_options, cppzmq, Boost.Asio) are caught at the edge that calls them and turned
// into a Status. Broken invariants are not errors: they go to GRADSYNC_CHECK (check.h), which
// aborts. The codes follow abseil's canonical codes, so a caller can tell whether to retry:
//   kUnavailable        a peer is down or a connection was lost: retry after reconnecting
//   kDeadlineExceeded   a wait ran past its deadline: retry or give up
//   kAborted            rejected for consistency (too stale, clock mismatch): re-pull, retry
//   kFailedPrecondition not registered / not started / wrong state: fix the caller
//   kInvalidArgument    bad flag, bad spec, malformed message: never retry as is
//   kDataLoss           a file or payload is corrupt or truncated
//   kUnauthenticated    a peer refused this process's key, or the handshake failed (CURVE)
//   kResourceExhausted  a bound was reached (a table shard's rows): nothing was changed
//   kNotFound, kAlreadyExists, kOutOfRange, kUnimplemented, kInternal, kCancelled: as in abseil
//
// Thread safety: Status and Result<T> are values; const methods may be called concurrently.
//
//   Result<Dataset> r = LoadIdxDataset(images, labels);
//   if (!r.ok()) { std::cerr << r.status() << "\n"; return 1; }
//   Dataset d = std::move(r).value();
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

#include "common/base/check.h"

namespace gradsync {

enum class StatusCode : int {
  kOk = 0,
  kCancelled = 1,
  kUnknown = 2,
  kInvalidArgument = 3,
  kDeadlineExceeded = 4,
  kNotFound = 5,
  kAlreadyExists = 6,
  kPermissionDenied = 7,
  kResourceExhausted = 8,
  kFailedPrecondition = 9,
  kAborted = 10,
  kOutOfRange = 11,
  kUnimplemented = 12,
  kInternal = 13,
  kUnavailable = 14,
  kDataLoss = 15,
  kUnauthenticated = 16,
};

std::string_view StatusCodeName(StatusCode code);

class Status;
// A status read off the wire (a code and a message): 0 is OK, a code this build knows is that
// code, any other reads as kUnknown (an error from a newer peer is still an error).
Status StatusFromWire(int code, const std::string& message);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message);

  [[nodiscard]] bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "INVALID_ARGUMENT: message", or "OK".
  std::string ToString() const;

  // Returns a copy whose message is "context: message" (for adding a file name, a flag...).
  Status WithContext(std::string_view context) const;

  friend bool operator==(const Status& a, const Status& b) {
    return a.code_ == b.code_ && a.message_ == b.message_;
  }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

std::ostream& operator<<(std::ostream& os, const Status& s);

inline Status OkStatus() { return Status(); }
Status InvalidArgumentError(std::string message);
Status DataLossError(std::string message);
Status UnauthenticatedError(std::string message);
Status PermissionDeniedError(std::string message);
Status NotFoundError(std::string message);
Status FailedPreconditionError(std::string message);
Status UnavailableError(std::string message);
Status DeadlineExceededError(std::string message);
Status AbortedError(std::string message);
Status OutOfRangeError(std::string message);
Status ResourceExhaustedError(std::string message);
Status UnimplementedError(std::string message);
Status InternalError(std::string message);
// "what: " and the text of the current errno (read it before anything else can change errno).
std::string ErrnoMessage(const std::string& what);

// A value or a non-OK Status. Accessing value() of an error is an invariant violation (aborts).
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design, like StatusOr
  Result(Status status) : v_(std::move(status)) {  // NOLINT
    GRADSYNC_CHECK(!std::get<Status>(v_).ok()) << "Result constructed from an OK Status";
  }

  [[nodiscard]] bool ok() const { return std::holds_alternative<T>(v_); }
  Status status() const { return ok() ? Status() : std::get<Status>(v_); }

  T& value() & { return Get(); }
  const T& value() const& { return const_cast<Result*>(this)->Get(); }
  T&& value() && { return std::move(Get()); }
  T* operator->() { return &Get(); }
  const T* operator->() const { return &const_cast<Result*>(this)->Get(); }
  T& operator*() & { return Get(); }
  const T& operator*() const& { return const_cast<Result*>(this)->Get(); }

 private:
  T& Get() {
    GRADSYNC_CHECK(ok()) << "value() of an error Result: " << std::get<Status>(v_);
    return std::get<T>(v_);
  }
  std::variant<T, Status> v_;
};

}  // namespace gradsync

#define GRADSYNC_CONCAT_INNER_(a, b) a##b
#define GRADSYNC_CONCAT_(a, b) GRADSYNC_CONCAT_INNER_(a, b)

// Returns the Status of `expr` from the enclosing function when it is not OK.
#define RETURN_IF_ERROR(expr)                                    \
  do {                                                           \
    ::gradsync::Status gradsync_status_ = (expr);                \
    if (!gradsync_status_.ok()) return gradsync_status_;         \
  } while (0)

// ASSIGN_OR_RETURN(auto x, MakeX()); declares x from a Result or returns its error.
#define ASSIGN_OR_RETURN(lhs, expr) \
  ASSIGN_OR_RETURN_IMPL_(GRADSYNC_CONCAT_(gradsync_result_, __LINE__), lhs, expr)
#define ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                           \
  if (!tmp.ok()) return tmp.status();          \
  lhs = std::move(tmp).value()
