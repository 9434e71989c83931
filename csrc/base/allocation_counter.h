#ifndef PATHWAYS_BASE_ALLOCATION_COUNTER_H_
#define PATHWAYS_BASE_ALLOCATION_COUNTER_H_

// For tests: counts calls to operator new between Start and Stop, on every
// thread but the runtime's background ones (base/background_thread.h), to
// check that code meant for executor threads does not allocate. Linking the
// pw_allocation_counter library replaces the global operator new/delete of
// the test binary (allocations from malloc directly, e.g. inside OpenBLAS,
// are not seen).

#include <cstdint>

namespace pw {

void StartCountingAllocations();

// Stops counting; returns the number of operator new calls since Start.
int64_t StopCountingAllocations();

}  // namespace pw

#endif  // PATHWAYS_BASE_ALLOCATION_COUNTER_H_
