#include "common/base/status.h"

#include <cerrno>
#include <cstring>

namespace gradsync {

std::string_view StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "OK";
    case StatusCode::kCancelled: return "CANCELLED";
    case StatusCode::kUnknown: return "UNKNOWN";
    case StatusCode::kInvalidArgument: return "INVALID_ARGUMENT";
    case StatusCode::kDeadlineExceeded: return "DEADLINE_EXCEEDED";
    case StatusCode::kNotFound: return "NOT_FOUND";
    case StatusCode::kAlreadyExists: return "ALREADY_EXISTS";
    case StatusCode::kFailedPrecondition: return "FAILED_PRECONDITION";
    case StatusCode::kAborted: return "ABORTED";
    case StatusCode::kOutOfRange: return "OUT_OF_RANGE";
    case StatusCode::kUnimplemented: return "UNIMPLEMENTED";
    case StatusCode::kInternal: return "INTERNAL";
    case StatusCode::kUnavailable: return "UNAVAILABLE";
    case StatusCode::kDataLoss: return "DATA_LOSS";
    case StatusCode::kUnauthenticated: return "UNAUTHENTICATED";
    case StatusCode::kPermissionDenied: return "PERMISSION_DENIED";
    case StatusCode::kResourceExhausted: return "RESOURCE_EXHAUSTED";
  }
  return "UNKNOWN";
}

Status::Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {
  if (code_ == StatusCode::kOk) message_.clear();
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  std::string s(StatusCodeName(code_));
  s += ": ";
  s += message_;
  return s;
}

Status Status::WithContext(std::string_view context) const {
  if (ok()) return *this;
  std::string m(context);
  m += ": ";
  m += message_;
  return Status(code_, std::move(m));
}

std::ostream& operator<<(std::ostream& os, const Status& s) { return os << s.ToString(); }

Status InvalidArgumentError(std::string m) { return Status(StatusCode::kInvalidArgument, std::move(m)); }
Status DataLossError(std::string m) { return Status(StatusCode::kDataLoss, std::move(m)); }
Status UnauthenticatedError(std::string m) { return Status(StatusCode::kUnauthenticated, std::move(m)); }
Status PermissionDeniedError(std::string m) { return Status(StatusCode::kPermissionDenied, std::move(m)); }
Status NotFoundError(std::string m) { return Status(StatusCode::kNotFound, std::move(m)); }
Status FailedPreconditionError(std::string m) { return Status(StatusCode::kFailedPrecondition, std::move(m)); }
Status UnavailableError(std::string m) { return Status(StatusCode::kUnavailable, std::move(m)); }
Status DeadlineExceededError(std::string m) { return Status(StatusCode::kDeadlineExceeded, std::move(m)); }
Status AbortedError(std::string m) { return Status(StatusCode::kAborted, std::move(m)); }
Status OutOfRangeError(std::string m) { return Status(StatusCode::kOutOfRange, std::move(m)); }
Status ResourceExhaustedError(std::string m) { return Status(StatusCode::kResourceExhausted, std::move(m)); }
Status UnimplementedError(std::string m) { return Status(StatusCode::kUnimplemented, std::move(m)); }
Status InternalError(std::string m) { return Status(StatusCode::kInternal, std::move(m)); }

std::string ErrnoMessage(const std::string& what) { return what + ": " + std::strerror(errno); }

Status StatusFromWire(int code, const std::string& message) {
  if (code == 0) return Status();
  const bool known = code > 0 && code <= static_cast<int>(StatusCode::kUnauthenticated);
  return Status(known ? static_cast<StatusCode>(code) : StatusCode::kUnknown, message);
}

}  // namespace gradsync
