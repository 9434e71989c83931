#ifndef PATHWAYS_BASE_STATUS_MACROS_H_
#define PATHWAYS_BASE_STATUS_MACROS_H_

// Errors are values inside the core: functions return absl::Status or
// absl::StatusOr<T>, and these macros propagate them. The bindings map status
// codes to Python exceptions in exactly one place (bindings/status_casters.h).

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define PW_CONCAT_IMPL(a, b) a##b
#define PW_CONCAT(a, b) PW_CONCAT_IMPL(a, b)

// Returns from the enclosing function if `expr` (an absl::Status) is not OK.
#define PW_RETURN_IF_ERROR(expr)                    \
  do {                                              \
    ::absl::Status pw_status_ = (expr);             \
    if (!pw_status_.ok()) return pw_status_;        \
  } while (0)

// `lhs = value of expr` where expr is an absl::StatusOr<T>; returns its status
// from the enclosing function if it is not OK.
#define PW_ASSIGN_OR_RETURN(lhs, expr) \
  PW_ASSIGN_OR_RETURN_IMPL(PW_CONCAT(pw_statusor_, __LINE__), lhs, expr)
#define PW_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                             \
  if (!tmp.ok()) return tmp.status();            \
  lhs = std::move(tmp).value()

#endif  // PATHWAYS_BASE_STATUS_MACROS_H_
