#include "csrc/base/error_kind.h"

#include <string>

#include "absl/strings/cord.h"

namespace pw {
namespace {

constexpr absl::string_view kPayloadUrl = "pathways/error_kind";

absl::Status WithKind(absl::string_view message, ErrorKind kind,
                      absl::StatusCode code = absl::StatusCode::kInvalidArgument) {
  absl::Status status(code, message);
  status.SetPayload(kPayloadUrl, absl::Cord(std::string(1, static_cast<char>(kind))));
  return status;
}

}  // namespace

absl::Status UnsupportedTypeError(absl::string_view message) {
  return WithKind(message, ErrorKind::kUnsupportedType);
}

absl::Status UnboundNameError(absl::string_view message) { return WithKind(message, ErrorKind::kUnboundName); }

absl::Status HostLostError(absl::string_view message) {
  return WithKind(message, ErrorKind::kHostLost, absl::StatusCode::kUnavailable);
}

absl::Status WithErrorKind(absl::Status status, ErrorKind kind) {
  if (status.ok() || kind == ErrorKind::kNone) return status;
  status.SetPayload(kPayloadUrl, absl::Cord(std::string(1, static_cast<char>(kind))));
  return status;
}

ErrorKind GetErrorKind(const absl::Status& status) {
  const auto payload = status.GetPayload(kPayloadUrl);  // absl::optional<absl::Cord>
  if (!payload.has_value() || payload->size() != 1) return ErrorKind::kNone;
  const auto kind = static_cast<ErrorKind>(std::string(*payload)[0]);
  switch (kind) {
    case ErrorKind::kUnsupportedType:
    case ErrorKind::kUnboundName:
    case ErrorKind::kHostLost:
      return kind;
    default:
      return ErrorKind::kNone;
  }
}

}  // namespace pw
