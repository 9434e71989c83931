#include "csrc/base/allocation_counter.h"

#include "csrc/base/background_thread.h"

#include <atomic>
#include <cstdlib>
#include <new>

namespace {
std::atomic<bool> g_counting{false};
std::atomic<int64_t> g_allocations{0};

// The runtime's background threads (the native compiler's) are not the code
// under test.
bool Counted() {
  return g_counting.load(std::memory_order_relaxed) && !pw::IsBackgroundThread();
}
}  // namespace

void* operator new(std::size_t size) {
  if (Counted()) g_allocations.fetch_add(1);
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}
// The nothrow form too (std::stable_sort's temporary buffer uses it): it is
// freed by the plain operator delete below, so it must come from malloc as
// well, or a sanitizer's own nothrow new pairs with our free.
void* operator new(std::size_t size, const std::nothrow_t&) noexcept {
  if (Counted()) g_allocations.fetch_add(1);
  return std::malloc(size == 0 ? 1 : size);
}
// noinline: inlined into callers, free() of operator new's memory trips GCC's
// -Wmismatched-new-delete.
__attribute__((noinline)) void operator delete(void* p) noexcept { std::free(p); }
__attribute__((noinline)) void operator delete(void* p, std::size_t) noexcept { std::free(p); }
__attribute__((noinline)) void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }

namespace pw {

void StartCountingAllocations() {
  g_allocations = 0;
  g_counting = true;
}

int64_t StopCountingAllocations() {
  g_counting = false;
  return g_allocations.load();
}

}  // namespace pw
