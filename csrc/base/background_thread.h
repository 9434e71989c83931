#ifndef PATHWAYS_BASE_BACKGROUND_THREAD_H_
#define PATHWAYS_BASE_BACKGROUND_THREAD_H_

// Marks threads that do the runtime's own background work, not a caller's
// request (the native kernels' compiler thread): tools that measure what a
// request costs, such as the allocation counter of the tests, leave them out.

namespace pw {

// Marks the calling thread, for the rest of its life.
void MarkBackgroundThread();

// Whether MarkBackgroundThread() was called on this thread. One thread_local
// read; safe inside operator new.
bool IsBackgroundThread();

}  // namespace pw

#endif  // PATHWAYS_BASE_BACKGROUND_THREAD_H_
