#ifndef PATHWAYS_BASE_ERROR_KIND_H_
#define PATHWAYS_BASE_ERROR_KIND_H_

// Finer kinds of a status code, for the Python edge. A mistake gives one
// Python exception type whichever entry point it comes through: an
// unsupported dtype is a TypeError and an unbound axis name a NameError, as in
// numpy and JAX, whether the Python layer or the core finds it. Inside the
// core these stay InvalidArgument (callers and tests that look at codes see no
// difference); the kind travels as a payload of the status, which
// bindings/status_casters reads when it raises the exception.

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace pw {

enum class ErrorKind : uint8_t {
  kNone = 0,         // a plain status: its code decides
  kUnsupportedType,  // a dtype an op or the runtime does not take (Python TypeError)
  kUnboundName,      // an axis name no enclosing pmap binds (Python NameError)
  kHostLost,         // Unavailable: a host process died or cannot be reached (pw.HostLostError)
};

// InvalidArgument with `message`, of kind kUnsupportedType.
absl::Status UnsupportedTypeError(absl::string_view message);

// InvalidArgument with `message`, of kind kUnboundName.
absl::Status UnboundNameError(absl::string_view message);

// Unavailable with `message`, of kind kHostLost.
absl::Status HostLostError(absl::string_view message);

// The kind `status` carries (kNone for one made otherwise, and for OK).
ErrorKind GetErrorKind(const absl::Status& status);
// `status` carrying `kind` (an error status whose kind crossed the wire, say:
// coordination/host_channel.h's FromWire); OK and kNone stay as they are.
absl::Status WithErrorKind(absl::Status status, ErrorKind kind);

}  // namespace pw

#endif  // PATHWAYS_BASE_ERROR_KIND_H_
