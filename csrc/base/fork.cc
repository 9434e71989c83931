#include "csrc/base/fork.h"

#include <pthread.h>

#include <atomic>
#include <mutex>

namespace pw {
namespace {

std::atomic<bool> forked_child{false};

// Runs in the child right after fork(): async-signal-safe work only.
void MarkChild() { forked_child.store(true, std::memory_order_relaxed); }

}  // namespace

void WatchForFork() {
  static std::once_flag once;
  std::call_once(once, [] { pthread_atfork(nullptr, nullptr, &MarkChild); });
}

bool InForkedChild() { return forked_child.load(std::memory_order_relaxed); }

}  // namespace pw
