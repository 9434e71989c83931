#ifndef PATHWAYS_BASE_FORK_H_
#define PATHWAYS_BASE_FORK_H_

// Knows whether this process is a child made by fork() after the runtime
// started its threads. Such a child has the parent's memory but none of its
// threads: executors, the delay thread and any lock they held are gone, so
// pending work never completes and a lock may never be released. The runtime
// refuses to run there (as PyTorch refuses CUDA in a forked child), and
// frees nothing on the way out (the parent's bookkeeping is not the child's).
//
// Thread-safe; InForkedChild() is one relaxed atomic load.

namespace pw {

// Starts watching: a fork() after this call marks the child. Idempotent.
void WatchForFork();

// True in a child forked after WatchForFork() (and in its own children).
bool InForkedChild();

}  // namespace pw

#endif  // PATHWAYS_BASE_FORK_H_
