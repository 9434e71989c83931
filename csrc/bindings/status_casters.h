#ifndef PATHWAYS_BINDINGS_STATUS_CASTERS_H_
#define PATHWAYS_BINDINGS_STATUS_CASTERS_H_

// The one place where absl::Status becomes a Python exception. A status of
// an ErrorKind (base/error_kind.h) raises that kind's type:
//   kUnsupportedType   -> TypeError (an unsupported dtype)
//   kUnboundName       -> NameError (an unbound axis name)
//   kHostLost          -> pathways.HostLostError (a DeviceFailedError)
// any other, its code's:
//   InvalidArgument    -> ValueError
//   NotFound           -> pathways.NotFoundError (a ValueError)
//   ResourceExhausted  -> pathways.ResourceExhaustedError (a PathwaysError)
//   FailedPrecondition -> RuntimeError
//   Unimplemented      -> NotImplementedError
//   Unavailable        -> pathways.DeviceFailedError (a PathwaysError)
//   anything else      -> pathways.PathwaysError (a RuntimeError)

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "pybind11/pybind11.h"

namespace pw::bindings {

// Creates the exception types in `m`.
void RegisterExceptions(pybind11::module_& m);

// Raises the Python exception for `status` (which must not be OK).
[[noreturn]] void ThrowStatus(const absl::Status& status);
// Raises pathways.DeletedBufferError with `message`.
[[noreturn]] void ThrowDeleted(const std::string& message);

inline void ThrowIfError(const absl::Status& status) {
  if (!status.ok()) ThrowStatus(status);
}

template <typename T>
T ValueOrThrow(absl::StatusOr<T> value) {
  if (!value.ok()) ThrowStatus(value.status());
  return *std::move(value);
}

}  // namespace pw::bindings

#endif  // PATHWAYS_BINDINGS_STATUS_CASTERS_H_
