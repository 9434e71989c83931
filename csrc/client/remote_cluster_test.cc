// The client's side of host processes, in the parts that need no host.

#include <cstdint>
#include <limits>

#include "csrc/client/remote_cluster_internal.h"
#include "gtest/gtest.h"

namespace pw {
namespace {

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
constexpr int64_t kMin = std::numeric_limits<int64_t>::min();

TEST(OnClientClockTest, MovesSaneTimesByTheOffset) {
  const PartInterval p = OnClientClock(1'500, 1'800, 1'000, 100, 2'000);
  EXPECT_EQ(p.start_ns, 500);
  EXPECT_EQ(p.end_ns, 800);
}

TEST(OnClientClockTest, ClampsTimesToTheRunsLife) {
  // Before the submission, after now, and reversed.
  PartInterval p = OnClientClock(0, 10'000, 0, 100, 2'000);
  EXPECT_EQ(p.start_ns, 100);
  EXPECT_EQ(p.end_ns, 2'000);
  p = OnClientClock(900, 300, 0, 100, 2'000);
  EXPECT_EQ(p.start_ns, 900);
  EXPECT_EQ(p.end_ns, 900);
}

TEST(OnClientClockTest, HostileTimesNeitherOverflowNorLeaveTheRunsLife) {
  for (const int64_t start : {kMin, int64_t{-1}, int64_t{0}, kMax}) {
    for (const int64_t end : {kMin, int64_t{0}, kMax}) {
      for (const int64_t offset : {kMin, int64_t{0}, kMax}) {
        const PartInterval p = OnClientClock(start, end, offset, 100, 2'000);
        EXPECT_GE(p.start_ns, 100);
        EXPECT_LE(p.end_ns, 2'000);
        EXPECT_LE(p.start_ns, p.end_ns);
        // What the accounts multiply by a gang's size stays small.
        EXPECT_LE(p.end_ns - p.start_ns, 1'900);
      }
    }
  }
}

}  // namespace
}  // namespace pw
