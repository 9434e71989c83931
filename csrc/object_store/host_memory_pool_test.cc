#include "csrc/object_store/host_memory_pool.h"

#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace pw {
namespace {

constexpr size_t kLarge = HostMemoryPool::kMinCachedBytes;

TEST(HostMemoryPoolTest, LargeBlocksAreReusedBySizeSmallOnesAreNot) {
  HostMemoryPool pool;
  void* a = pool.Allocate(kLarge);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % 64, 0u);
  std::memset(a, 1, kLarge);
  pool.Free(a, kLarge);
  EXPECT_EQ(pool.cached_bytes(), kLarge);
  void* other_size = pool.Allocate(kLarge + 64);  // a different size: new memory
  EXPECT_NE(other_size, a);
  EXPECT_EQ(pool.Allocate(kLarge), a);  // the same size: the cached block
  EXPECT_EQ(pool.cached_bytes(), 0u);
  pool.Free(other_size, kLarge + 64);
  pool.Free(a, kLarge);
  EXPECT_EQ(pool.cached_bytes(), 2 * kLarge + 64);

  void* small = pool.Allocate(100);
  pool.Free(small, 100);
  EXPECT_EQ(pool.cached_bytes(), 2 * kLarge + 64);  // not cached
  pool.Trim();
  EXPECT_EQ(pool.cached_bytes(), 0u);
}

TEST(HostMemoryPoolTest, CacheIsBounded) {
  HostMemoryPool pool;
  const size_t block = HostMemoryPool::kMaxCachedBytes / 4 + 64;
  std::vector<void*> blocks;
  for (int i = 0; i < 4; ++i) blocks.push_back(pool.Allocate(block));
  for (void* p : blocks) pool.Free(p, block);
  EXPECT_EQ(pool.cached_bytes(), 3 * block);  // the fourth did not fit
  pool.Trim();
}

TEST(HostMemoryPoolTest, ConcurrentAllocateAndFree) {
  HostMemoryPool pool;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&pool, t] {
      for (int i = 0; i < 2000; ++i) {
        const size_t bytes = kLarge * (1 + (i + t) % 3);
        auto* p = static_cast<uint8_t*>(pool.Allocate(bytes));
        p[0] = static_cast<uint8_t>(t);
        p[bytes - 1] = static_cast<uint8_t>(i);
        ASSERT_EQ(p[0], static_cast<uint8_t>(t));
        pool.Free(p, bytes);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_LE(pool.cached_bytes(), 4 * 3 * kLarge * 3);
  pool.Trim();
}

}  // namespace
}  // namespace pw
