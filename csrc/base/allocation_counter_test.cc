#include "csrc/base/allocation_counter.h"

#include <new>
#include <thread>

#include "csrc/base/background_thread.h"

#include "gtest/gtest.h"

namespace pw {
namespace {

// The counter sees operator new while counting, and only then: the kernel
// tests' "no allocation" checks rely on it.
TEST(AllocationCounterTest, CountsOperatorNewOnlyWhileCounting) {
  void* before = ::operator new(16);  // explicit calls cannot be elided
  StartCountingAllocations();
  void* a = ::operator new(8);
  void* b = ::operator new(32);
  EXPECT_EQ(StopCountingAllocations(), 2);
  void* after = ::operator new(16);
  StartCountingAllocations();
  EXPECT_EQ(StopCountingAllocations(), 0);
  for (void* p : {before, a, b, after}) ::operator delete(p);
}

// A background thread of the runtime's (the native compiler's) allocates
// while a test counts: not counted; another thread's allocation is.
TEST(AllocationCounterTest, LeavesOutBackgroundThreads) {
  StartCountingAllocations();
  std::thread background([] {
    MarkBackgroundThread();
    ::operator delete(::operator new(8));
  });
  background.join();
  const int64_t with_background = StopCountingAllocations();
  StartCountingAllocations();
  std::thread plain([] { ::operator delete(::operator new(8)); });
  plain.join();
  const int64_t with_plain = StopCountingAllocations();
  // std::thread's own start allocates on this thread, alike in both.
  EXPECT_EQ(with_plain, with_background + 1);
}

}  // namespace
}  // namespace pw
