#include "csrc/base/allocation_counter.h"

#include <new>

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

}  // namespace
}  // namespace pw
