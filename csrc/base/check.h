#ifndef PATHWAYS_BASE_CHECK_H_
#define PATHWAYS_BASE_CHECK_H_

// PW_DCHECK(condition, message): an invariant of the code (never of user
// input, which gets a Status). Checked in debug builds (the sanitizer
// builds of `make sanitize` are debug builds): on failure it prints the
// file, line, condition and message, then aborts. Compiled out otherwise.
// (Debian's abseil 20220623 predates ABSL_DCHECK; its raw logging is what
// ABSL_DCHECK uses underneath.)

#include "absl/base/internal/raw_logging.h"

#ifdef NDEBUG
#define PW_DCHECK(condition, message) \
  do {                                \
    if (false) (void)(condition);     \
  } while (0)
#else
#define PW_DCHECK(condition, message) ABSL_RAW_CHECK(condition, message)
#endif

#endif  // PATHWAYS_BASE_CHECK_H_
