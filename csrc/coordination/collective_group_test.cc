#include "csrc/coordination/collective_group.h"

#include <signal.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <thread>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gloo/config.h"
#include "gtest/gtest.h"

namespace pw {
namespace {

// collective_group.h explains why Gloo's connections go without TLS: the
// installed Gloo is built without its TLS transport. A Gloo that has it
// fails this, and should then be used (gloo::transport::tcp::tls).
TEST(GlooBuild, HasNoTlsTransport) { EXPECT_EQ(GLOO_HAVE_TRANSPORT_TCP_TLS, 0); }

using ::testing::AnyOf;
using ::testing::HasSubstr;

// Runs fn(rank) on `n` threads at once and joins them: the ranks of a group
// as threads of one process.
void RunRanks(int n, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back(fn, r);
  for (auto& t : threads) t.join();
}

// Creates all `n` members of `key` (Create blocks until all have joined).
std::vector<std::unique_ptr<CollectiveGroup>> CreateGroups(KeyValueStore* store, const std::string& key, int n,
                                                           absl::Duration timeout = absl::Seconds(10),
                                                           bool check_agreement = false) {
  std::vector<std::unique_ptr<CollectiveGroup>> groups(n);
  CollectiveOptions options;
  options.timeout = timeout;
  options.check_agreement = check_agreement;
  RunRanks(n, [&](int r) {
    auto group = CollectiveGroup::Create(store, key, r, n, options);
    ASSERT_TRUE(group.ok()) << group.status();
    groups[r] = *std::move(group);
  });
  for (const auto& g : groups) EXPECT_NE(g, nullptr);
  return groups;
}

// ---------------------------------------------------------------------------
// InMemoryKeyValueStore

TEST(InMemoryKeyValueStoreTest, GetWaitsForALaterSet) {
  InMemoryKeyValueStore store;
  std::thread setter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    ASSERT_TRUE(store.Set("k", std::string("a\0b", 3)).ok());
  });
  absl::StatusOr<std::string> value = store.Get("k", absl::Now() + absl::Seconds(10));
  setter.join();
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, std::string("a\0b", 3));  // bytes, not a C string
}

TEST(InMemoryKeyValueStoreTest, MissingKeyIsDeadlineExceededNamingIt) {
  InMemoryKeyValueStore store;
  ASSERT_TRUE(store.Set("other", "x").ok());
  absl::StatusOr<std::string> value = store.Get("group/3", absl::Now() + absl::Milliseconds(20));
  EXPECT_EQ(value.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(value.status().message(), HasSubstr("'group/3'"));
}

TEST(InMemoryKeyValueStoreTest, SetReplaces) {
  InMemoryKeyValueStore store;
  ASSERT_TRUE(store.Set("k", "old").ok());
  ASSERT_TRUE(store.Set("k", "new").ok());
  EXPECT_EQ(*store.Get("k", absl::Now()), "new");
}

// ---------------------------------------------------------------------------
// CollectiveGroup: arguments

TEST(CollectiveGroupTest, CreateRejectsBadArguments) {
  InMemoryKeyValueStore store;
  EXPECT_EQ(CollectiveGroup::Create(&store, "g", 2, 2).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CollectiveGroup::Create(&store, "g", -1, 2).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CollectiveGroup::Create(&store, "g", 0, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CollectiveGroup::Create(nullptr, "g", 0, 1).status().code(), absl::StatusCode::kInvalidArgument);
  CollectiveOptions zero_timeout;
  zero_timeout.timeout = absl::ZeroDuration();
  EXPECT_EQ(CollectiveGroup::Create(&store, "g", 0, 1, zero_timeout).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(CollectiveGroupTest, AddressThatCannotBeBoundIsInvalidArgumentNotAnAbort) {
  InMemoryKeyValueStore store;
  CollectiveOptions options;
  options.bind_address = "no-such-host.invalid";
  absl::StatusOr<std::unique_ptr<CollectiveGroup>> group = CollectiveGroup::Create(&store, "g", 0, 1, options);
  EXPECT_EQ(group.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(group.status().message(), HasSubstr("no-such-host.invalid"));
  // Resolves, but is no address of this machine (TEST-NET-1): bind fails.
  options.bind_address = "192.0.2.1";
  group = CollectiveGroup::Create(&store, "g", 0, 1, options);
  EXPECT_EQ(group.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(group.status().message(), HasSubstr("192.0.2.1"));
}

TEST(CollectiveGroupTest, CreateIgnoresSigpipeSoAPeerThatLeftCannotEndThisProcess) {
  // gtest_main leaves SIGPIPE at its default (terminate the process).
  InMemoryKeyValueStore store;
  ASSERT_TRUE(CollectiveGroup::Create(&store, "sigpipe", 0, 1).ok());
  struct sigaction after;
  ASSERT_EQ(sigaction(SIGPIPE, nullptr, &after), 0);
  EXPECT_EQ(after.sa_handler, SIG_IGN);
}

TEST(CollectiveGroupTest, OneMemberGroupRunsEveryCollectiveLocally) {
  InMemoryKeyValueStore store;
  auto group = *CollectiveGroup::Create(&store, "solo", 0, 1);
  float x[3] = {1, -2, 3};
  ASSERT_TRUE(group->AllReduce(DType::kF32, ReduceOp::kSum, x, 3, 0).ok());
  EXPECT_EQ(x[1], -2);
  const char in[2] = {'a', 'b'};
  char out[2] = {};
  const int64_t counts[] = {2};
  ASSERT_TRUE(group->AllGatherV(in, 2, out, counts, 0).ok());
  EXPECT_EQ(std::string(out, 2), "ab");
  ASSERT_TRUE(group->Barrier(0).ok());
  EXPECT_EQ(group->Send(0, in, 2, 0).code(), absl::StatusCode::kInvalidArgument);  // not to itself
}

TEST(CollectiveGroupTest, InvalidArgumentsDoNotBreakTheGroup) {
  InMemoryKeyValueStore store;
  auto groups = CreateGroups(&store, "args", 2);
  bool flags[2] = {true, false};
  EXPECT_EQ(groups[0]->AllReduce(DType::kBool, ReduceOp::kSum, flags, 2, 0).code(),
            absl::StatusCode::kInvalidArgument);
  float x = 0;
  EXPECT_EQ(groups[0]->AllReduce(DType::kF32, ReduceOp::kSum, &x, -1, 0).code(), absl::StatusCode::kInvalidArgument);
  char buf[4] = {};
  const int64_t wrong_arity[] = {4};
  EXPECT_EQ(groups[0]->AllGatherV(buf, 4, buf, wrong_arity, 0).code(), absl::StatusCode::kInvalidArgument);
  const int64_t counts[] = {1, 3};
  EXPECT_EQ(groups[0]->AllGatherV(buf, 2, buf, counts, 0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(groups[0]->SendRecv(0, buf, 1, 1, buf, 1, 0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(groups[0]->Recv(2, buf, 1, 0).code(), absl::StatusCode::kInvalidArgument);
  // Still usable.
  RunRanks(2, [&](int r) { EXPECT_TRUE(groups[r]->Barrier(0).ok()); });
}

// ---------------------------------------------------------------------------
// CollectiveGroup over 2, 3 and 4 members (threads, loopback TCP)

class CollectiveGroupSizeTest : public ::testing::TestWithParam<int> {
 protected:
  int n() const { return GetParam(); }
  InMemoryKeyValueStore store_;
};

// Contribution of `rank` at index i: small integers, so float sums are exact
// in any order, and a different extreme on different ranks.
double Contribution(int rank, int64_t i) { return static_cast<double>(((rank + 1) * 7 + i * 3) % 23) - 11; }

template <typename T>
void CheckAllReduce(std::vector<std::unique_ptr<CollectiveGroup>>& groups, DType dtype, ReduceOp op,
                    int64_t count) {
  const int n = static_cast<int>(groups.size());
  std::vector<std::vector<T>> data(n, std::vector<T>(count));
  for (int r = 0; r < n; ++r) {
    // Through int64 for integers: a negative contribution wraps to a large uint32.
    for (int64_t i = 0; i < count; ++i) {
      data[r][i] = std::is_integral_v<T> ? static_cast<T>(static_cast<int64_t>(Contribution(r, i)))
                                         : static_cast<T>(Contribution(r, i));
    }
  }
  std::vector<T> expected = data[0];
  for (int r = 1; r < n; ++r) {
    for (int64_t i = 0; i < count; ++i) {
      const T v = data[r][i];
      switch (op) {
        case ReduceOp::kSum:
          expected[i] += v;
          break;
        case ReduceOp::kMax:
          expected[i] = std::max(expected[i], v);
          break;
        case ReduceOp::kMin:
          expected[i] = std::min(expected[i], v);
          break;
      }
    }
  }
  RunRanks(n, [&](int r) {
    absl::Status s = groups[r]->AllReduce(dtype, op, data[r].data(), count, /*tag=*/5);
    ASSERT_TRUE(s.ok()) << s;
  });
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(data[r], expected) << DTypeName(dtype) << " op " << static_cast<int>(op) << " count " << count
                                 << " rank " << r;
  }
}

TEST_P(CollectiveGroupSizeTest, AllReduceEveryNumericTypeAndOp) {
  auto groups = CreateGroups(&store_, "allreduce", n());
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin}) {
    for (int64_t count : {0, 1, 7, 1000}) {
      CheckAllReduce<float>(groups, DType::kF32, op, count);
      CheckAllReduce<double>(groups, DType::kF64, op, count);
      CheckAllReduce<int32_t>(groups, DType::kI32, op, count);
      CheckAllReduce<uint32_t>(groups, DType::kU32, op, count);
    }
  }
}

TEST_P(CollectiveGroupSizeTest, AllReduceLargeFloatSum) {
  auto groups = CreateGroups(&store_, "large", n());
  CheckAllReduce<float>(groups, DType::kF32, ReduceOp::kSum, int64_t{1} << 20);
}

TEST_P(CollectiveGroupSizeTest, AllReduceBoolMaxIsOrMinIsAnd) {
  auto groups = CreateGroups(&store_, "bool", n());
  // Element 0: true only on rank 0; 1: true everywhere; 2: false everywhere.
  std::vector<std::vector<uint8_t>> any(n()), all(n());
  for (int r = 0; r < n(); ++r) {
    any[r] = {static_cast<uint8_t>(r == 0), 1, 0};
    all[r] = any[r];
  }
  RunRanks(n(), [&](int r) {
    ASSERT_TRUE(groups[r]->AllReduce(DType::kBool, ReduceOp::kMax, any[r].data(), 3, 0).ok());
    ASSERT_TRUE(groups[r]->AllReduce(DType::kBool, ReduceOp::kMin, all[r].data(), 3, 1).ok());
  });
  for (int r = 0; r < n(); ++r) {
    EXPECT_EQ(any[r], (std::vector<uint8_t>{1, 1, 0}));
    EXPECT_EQ(all[r], (std::vector<uint8_t>{0, 1, 0}));
  }
}

TEST_P(CollectiveGroupSizeTest, AllReduceInt32SumWrapsAndFloatMaxPropagatesNaN) {
  auto groups = CreateGroups(&store_, "edges", n());
  std::vector<int32_t> ints(n(), std::numeric_limits<int32_t>::max());
  std::vector<float> floats(n(), 1.0f);
  std::vector<float> mins(n(), 1.0f);
  floats[n() - 1] = std::nanf("");
  mins[0] = std::nanf("");
  RunRanks(n(), [&](int r) {
    ASSERT_TRUE(groups[r]->AllReduce(DType::kI32, ReduceOp::kSum, &ints[r], 1, 0).ok());
    ASSERT_TRUE(groups[r]->AllReduce(DType::kF32, ReduceOp::kMax, &floats[r], 1, 0).ok());
    ASSERT_TRUE(groups[r]->AllReduce(DType::kF32, ReduceOp::kMin, &mins[r], 1, 0).ok());
  });
  uint32_t wrapped = 0;
  for (int r = 0; r < n(); ++r) wrapped += static_cast<uint32_t>(std::numeric_limits<int32_t>::max());
  for (int r = 0; r < n(); ++r) {
    EXPECT_EQ(ints[r], static_cast<int32_t>(wrapped));
    EXPECT_TRUE(std::isnan(floats[r])) << "rank " << r;
    EXPECT_TRUE(std::isnan(mins[r])) << "rank " << r;
  }
}

TEST_P(CollectiveGroupSizeTest, AllGatherVWithUnequalAndEmptyContributions) {
  auto groups = CreateGroups(&store_, "gather", n());
  std::vector<int64_t> counts(n());
  for (int r = 0; r < n(); ++r) counts[r] = r == 1 ? 0 : 5 * r + 3;  // rank 1 contributes nothing
  const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  std::string expected;
  for (int r = 0; r < n(); ++r) expected += std::string(counts[r], static_cast<char>('a' + r));
  std::vector<std::string> out(n(), std::string(total, '?'));
  std::vector<std::string> in_place(n(), std::string(total, '?'));
  RunRanks(n(), [&](int r) {
    const std::string in(counts[r], static_cast<char>('a' + r));
    absl::Status s = groups[r]->AllGatherV(in.data(), counts[r], out[r].data(), counts, 0);
    ASSERT_TRUE(s.ok()) << s;
    // In place: this rank's bytes already sit in its slot of the output.
    const int64_t offset = std::accumulate(counts.begin(), counts.begin() + r, int64_t{0});
    std::memcpy(in_place[r].data() + offset, in.data(), counts[r]);
    s = groups[r]->AllGatherV(in_place[r].data() + offset, counts[r], in_place[r].data(), counts, 0);
    ASSERT_TRUE(s.ok()) << s;
  });
  for (int r = 0; r < n(); ++r) {
    EXPECT_EQ(out[r], expected) << "rank " << r;
    EXPECT_EQ(in_place[r], expected) << "rank " << r;
  }
}

TEST_P(CollectiveGroupSizeTest, SendRecvAroundTheRingWithoutDeadlock) {
  auto groups = CreateGroups(&store_, "ring", n());
  std::vector<std::vector<int32_t>> received(n(), std::vector<int32_t>(100, -1));
  RunRanks(n(), [&](int r) {
    std::vector<int32_t> mine(100);
    std::iota(mine.begin(), mine.end(), 1000 * r);
    const int next = (r + 1) % n(), prev = (r + n() - 1) % n();
    absl::Status s = groups[r]->SendRecv(next, mine.data(), 400, prev, received[r].data(), 400, 3);
    ASSERT_TRUE(s.ok()) << s;
  });
  for (int r = 0; r < n(); ++r) {
    const int prev = (r + n() - 1) % n();
    EXPECT_EQ(received[r][0], 1000 * prev);
    EXPECT_EQ(received[r][99], 1000 * prev + 99);
  }
}

TEST_P(CollectiveGroupSizeTest, SendAndRecvPairsKeepOrderOnATag) {
  auto groups = CreateGroups(&store_, "p2p", n());
  // Rank 0 sends three messages to every other rank; each receives in order.
  std::vector<std::vector<int64_t>> got(n());
  RunRanks(n(), [&](int r) {
    for (int64_t m = 0; m < 3; ++m) {
      if (r == 0) {
        for (int peer = 1; peer < n(); ++peer) {
          const int64_t value = 100 * peer + m;
          ASSERT_TRUE(groups[0]->Send(peer, &value, sizeof(value), 7).ok());
        }
      } else {
        int64_t value = -1;
        ASSERT_TRUE(groups[r]->Recv(0, &value, sizeof(value), 7).ok());
        got[r].push_back(value);
      }
    }
  });
  for (int r = 1; r < n(); ++r) EXPECT_EQ(got[r], (std::vector<int64_t>{100 * r, 100 * r + 1, 100 * r + 2}));
}

TEST_P(CollectiveGroupSizeTest, BarrierWaitsForEveryMember) {
  auto groups = CreateGroups(&store_, "barrier", n());
  std::atomic<int> arrived[5] = {};
  std::atomic<int> early{0};
  RunRanks(n(), [&](int r) {
    for (int round = 0; round < 5; ++round) {
      if (r == round % n()) std::this_thread::sleep_for(std::chrono::milliseconds(20));  // a late member
      arrived[round].fetch_add(1);
      ASSERT_TRUE(groups[r]->Barrier(round).ok());
      if (arrived[round].load() != n()) early.fetch_add(1);
    }
  });
  EXPECT_EQ(early.load(), 0);
}

TEST_P(CollectiveGroupSizeTest, TwoGroupsAtOnceDoNotMix) {
  auto a = CreateGroups(&store_, "group-a", n());
  auto b = CreateGroups(&store_, "group-b", n());
  std::vector<double> xa(n(), 1.0), xb(n(), 10.0);
  RunRanks(2 * n(), [&](int t) {
    const int r = t % n();
    // Same tag on both groups: only the group separates them.
    for (int i = 0; i < 10; ++i) {
      if (t < n()) {
        double v = 1.0;
        ASSERT_TRUE(a[r]->AllReduce(DType::kF64, ReduceOp::kSum, &v, 1, 0).ok());
        xa[r] = v;
      } else {
        double v = 10.0;
        ASSERT_TRUE(b[r]->AllReduce(DType::kF64, ReduceOp::kSum, &v, 1, 0).ok());
        xb[r] = v;
      }
    }
  });
  for (int r = 0; r < n(); ++r) {
    EXPECT_EQ(xa[r], n());
    EXPECT_EQ(xb[r], 10.0 * n());
  }
}

TEST_P(CollectiveGroupSizeTest, OperationsOnDifferentTagsRunConcurrently) {
  auto groups = CreateGroups(&store_, "tags", n());
  // Two threads per rank, one group per rank: tag 1 sums ones, tag 2 sums
  // the rank, tag 3 gathers. Each thread checks its own results.
  std::atomic<int> wrong{0};
  RunRanks(3 * n(), [&](int t) {
    const int r = t % n(), kind = t / n();
    for (int i = 0; i < 20; ++i) {
      if (kind == 0) {
        std::vector<float> v(257, 1.0f);
        ASSERT_TRUE(groups[r]->AllReduce(DType::kF32, ReduceOp::kSum, v.data(), v.size(), 1).ok());
        if (v[0] != n() || v[256] != n()) wrong.fetch_add(1);
      } else if (kind == 1) {
        int32_t v = r;
        ASSERT_TRUE(groups[r]->AllReduce(DType::kI32, ReduceOp::kSum, &v, 1, 2).ok());
        if (v != n() * (n() - 1) / 2) wrong.fetch_add(1);
      } else {
        std::vector<int64_t> counts(n(), 1);
        std::string out(n(), '?');
        const char in = static_cast<char>('a' + r);
        ASSERT_TRUE(groups[r]->AllGatherV(&in, 1, out.data(), counts, 3).ok());
        if (out != std::string("abcd", n())) wrong.fetch_add(1);
      }
    }
  });
  EXPECT_EQ(wrong.load(), 0);
}

TEST_P(CollectiveGroupSizeTest, RecvOnOneTagDoesNotTakeAnotherTagsMessage) {
  auto groups = CreateGroups(&store_, "tag-order", n());
  // Rank 0 sends tag 1 then tag 2 (on two threads, as Send waits for the
  // Recv); rank n-1 receives tag 2 first.
  int32_t got1 = 0, got2 = 0;
  const int last = n() - 1;
  RunRanks(3, [&](int t) {
    const int32_t one = 1, two = 2;
    if (t == 0) {
      ASSERT_TRUE(groups[0]->Send(last, &one, 4, 1).ok());
    } else if (t == 1) {
      ASSERT_TRUE(groups[0]->Send(last, &two, 4, 2).ok());
    } else {
      ASSERT_TRUE(groups[last]->Recv(0, &got2, 4, 2).ok());
      ASSERT_TRUE(groups[last]->Recv(0, &got1, 4, 1).ok());
    }
  });
  EXPECT_EQ(got1, 1);
  EXPECT_EQ(got2, 2);
}

// ---------------------------------------------------------------------------
// check_agreement: disagreements on sizes are InvalidArgument, not aborts

TEST_P(CollectiveGroupSizeTest, CheckedOperationsGiveTheSameResults) {
  auto groups = CreateGroups(&store_, "checked", n(), absl::Seconds(10), /*check_agreement=*/true);
  CheckAllReduce<int32_t>(groups, DType::kI32, ReduceOp::kMax, 0);
  CheckAllReduce<int32_t>(groups, DType::kI32, ReduceOp::kMax, 33);
  std::vector<int32_t> received(n(), -1);
  RunRanks(n(), [&](int r) {
    const int32_t mine = 10 * r;
    ASSERT_TRUE(groups[r]->SendRecv((r + 1) % n(), &mine, 4, (r + n() - 1) % n(), &received[r], 4, 0).ok());
    std::vector<int64_t> counts(n(), 1);
    std::string out(n(), '?');
    const char in = static_cast<char>('a' + r);
    ASSERT_TRUE(groups[r]->AllGatherV(&in, 1, out.data(), counts, 0).ok());
    EXPECT_EQ(out, std::string("abcd", n()));
  });
  for (int r = 0; r < n(); ++r) EXPECT_EQ(received[r], 10 * ((r + n() - 1) % n()));
}

TEST_P(CollectiveGroupSizeTest, CheckedAllReduceCountsThatDisagreeAreInvalidArgumentEverywhere) {
  auto groups = CreateGroups(&store_, "disagree", n(), absl::Seconds(10), /*check_agreement=*/true);
  RunRanks(n(), [&](int r) {
    std::vector<float> x(r == 0 ? 4 : 8, 1.0f);  // rank 0 thinks 4 elements, the others 8
    absl::Status s = groups[r]->AllReduce(DType::kF32, ReduceOp::kSum, x.data(), x.size(), 0);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(s.message(), HasSubstr("rank 0 calls AllReduce sum float32[4]; rank 1 calls AllReduce sum float32[8]"));
    // Nothing moved: the group is still usable.
    float y = 1;
    s = groups[r]->AllReduce(DType::kF32, ReduceOp::kSum, &y, 1, 0);
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_EQ(y, n());
  });
}

TEST_P(CollectiveGroupSizeTest, CheckedAllGatherVCountsThatDisagreeAreInvalidArgumentEverywhere) {
  auto groups = CreateGroups(&store_, "disagree-gather", n(), absl::Seconds(10), /*check_agreement=*/true);
  RunRanks(n(), [&](int r) {
    // The last rank believes rank 0 contributes 2 bytes; everyone else 1.
    std::vector<int64_t> counts(n(), 1);
    if (r == n() - 1) counts[0] = 2;
    const std::string in(counts[r], 'x');
    std::string out(std::accumulate(counts.begin(), counts.end(), int64_t{0}), '?');
    absl::Status s = groups[r]->AllGatherV(in.data(), in.size(), out.data(), counts, 4);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_TRUE(groups[r]->Barrier(0).ok());
  });
}

TEST_P(CollectiveGroupSizeTest, CheckedSendRecvSizesThatDisagreeAreInvalidArgumentOnBothSides) {
  auto groups = CreateGroups(&store_, "disagree-p2p", n(), absl::Seconds(10), /*check_agreement=*/true);
  // Unchecked, the receiver of fewer bytes than sent would abort the process.
  char buf[16] = {};
  RunRanks(2, [&](int r) {
    absl::Status s = r == 0 ? groups[0]->Send(1, buf, 16, 0) : groups[1]->Recv(0, buf, 4, 0);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(s.message(), HasSubstr(r == 0 ? "rank 1 receives 4 bytes, this member sends 16"
                                              : "rank 0 sends 16 bytes, this member receives 4"));
  });
  // A ring where rank 0 expects one byte too many from its predecessor.
  RunRanks(n(), [&](int r) {
    char out[4] = {}, in[5] = {};
    absl::Status s = groups[r]->SendRecv((r + 1) % n(), out, 4, (r + n() - 1) % n(), in, r == 0 ? 5 : 4, 1);
    const bool involved = r == 0 || r == n() - 1;  // rank 0 and its predecessor
    EXPECT_EQ(s.code(), involved ? absl::StatusCode::kInvalidArgument : absl::StatusCode::kOk) << s;
  });
  RunRanks(n(), [&](int r) { EXPECT_TRUE(groups[r]->Barrier(0).ok()); });
}

// ---------------------------------------------------------------------------
// Failures: errors within the timeout, never a hang or an abort

TEST_P(CollectiveGroupSizeTest, MemberThatNeverJoinsFailsCreate) {
  CollectiveOptions options;
  options.timeout = absl::Seconds(1);
  // Every rank but the last joins.
  RunRanks(n() - 1, [&](int r) {
    auto group = CollectiveGroup::Create(&store_, "absent", r, n(), options);
    ASSERT_FALSE(group.ok());
    EXPECT_THAT(group.status().code(),
                AnyOf(absl::StatusCode::kDeadlineExceeded, absl::StatusCode::kUnavailable));
    EXPECT_THAT(group.status().message(), HasSubstr(absl::StrCat("collective group 'absent' rank ", r)));
  });
}

TEST_P(CollectiveGroupSizeTest, MemberThatLeavesFailsThePeersNextOperations) {
  auto groups = CreateGroups(&store_, "leaver", n(), absl::Seconds(2));
  RunRanks(n(), [&](int r) { ASSERT_TRUE(groups[r]->Barrier(0).ok()); });
  groups[n() - 1].reset();  // the last member's process "dies"
  RunRanks(n() - 1, [&](int r) {
    float x = 1;
    absl::Status s = groups[r]->AllReduce(DType::kF32, ReduceOp::kSum, &x, 1, 0);
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
    EXPECT_THAT(s.message(), HasSubstr(absl::StrCat("rank ", r, " of ", n(), ": AllReduce")));
    // Broken for good: later operations fail at once, naming the first failure.
    s = groups[r]->Barrier(1);
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
    EXPECT_THAT(s.message(), HasSubstr("broke earlier"));
  });
  // A new incarnation under a new key works for the survivors.
  if (n() > 2) {
    auto again = CreateGroups(&store_, "leaver-2", n() - 1, absl::Seconds(2));
    RunRanks(n() - 1, [&](int r) { EXPECT_TRUE(again[r]->Barrier(0).ok()); });
  }
}

TEST_P(CollectiveGroupSizeTest, MemberThatSkipsAnOperationTimesTheOthersOut) {
  auto groups = CreateGroups(&store_, "skipper", n(), absl::Milliseconds(500));
  // The last member is alive but never calls AllReduce: the others' wait ends
  // with an error after the timeout. Their failure then breaks the group for
  // the skipper too (its connections are closed).
  RunRanks(n() - 1, [&](int r) {
    std::vector<float> x(64, 1.0f);
    absl::Status s = groups[r]->AllReduce(DType::kF32, ReduceOp::kSum, x.data(), x.size(), 0);
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  });
  float y = 0;
  EXPECT_FALSE(groups[n() - 1]->AllReduce(DType::kF32, ReduceOp::kSum, &y, 1, 0).ok());
}

TEST_P(CollectiveGroupSizeTest, RecvWithNoSenderTimesOut) {
  auto groups = CreateGroups(&store_, "no-sender", n(), absl::Milliseconds(300));
  char c = 0;
  absl::Status s = groups[0]->Recv(1, &c, 1, 0);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_THAT(s.message(), HasSubstr("Recv of 1 bytes from rank 1"));
}

// Arrive waits for a member that comes late (busy elsewhere) past the
// group's own timeout, with a timeout of its own; the group is usable after.
TEST_P(CollectiveGroupSizeTest, ArriveWaitsForALateMemberPastTheGroupsTimeout) {
  auto groups = CreateGroups(&store_, "late", n(), absl::Milliseconds(200));
  const auto start = std::chrono::steady_clock::now();
  RunRanks(n(), [&](int r) {
    if (r == n() - 1) std::this_thread::sleep_for(std::chrono::milliseconds(800));
    absl::Status s = groups[r]->Arrive(7, absl::Seconds(30));
    ASSERT_TRUE(s.ok()) << s;
    float x = 1;
    s = groups[r]->AllReduce(DType::kF32, ReduceOp::kSum, &x, 1, 7);
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_EQ(x, static_cast<float>(n()));
  });
  EXPECT_GE(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 0.75);
}

// An Arrive that waits for a member that does not come ends at once when
// the group is aborted (a member known to be lost), or at its own timeout;
// either breaks the group for good.
TEST_P(CollectiveGroupSizeTest, AbortEndsAnArriveThatWaits) {
  for (bool abort : {true, false}) {
    SCOPED_TRACE(abort ? "aborted" : "timed out");
    auto groups = CreateGroups(&store_, abort ? "abandoned" : "abandoned-timeout", n(), absl::Seconds(10));
    const auto start = std::chrono::steady_clock::now();
    std::thread aborter;
    if (abort) {
      aborter = std::thread([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        groups[0]->Abort(absl::UnavailableError("rank lost"));
      });
    }
    // Every rank but the last arrives.
    absl::Status s = groups[0]->Arrive(3, abort ? absl::Seconds(30) : absl::Milliseconds(300));
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
    if (abort) {
      EXPECT_THAT(s.message(), HasSubstr("rank lost"));
    }
    if (aborter.joinable()) aborter.join();
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 5);
    EXPECT_FALSE(groups[0]->broken().ok());
    float x = 1;
    EXPECT_FALSE(groups[0]->AllReduce(DType::kF32, ReduceOp::kSum, &x, 1, 4).ok());
  }
}

// A member whose gang will not meet (another member refused the run, and
// will never come) ends its Arrive by a stop, without breaking the group:
// requested while it waits, or before it starts. A member that arrives
// after another gave up sends its message into the Arrive that gave up
// (kept by the group), not into a buffer that is gone, so the group's later
// operations, on other tags, run as usual for every member.
TEST_P(CollectiveGroupSizeTest, CancellingAnArriveEndsItWithoutBreakingTheGroup) {
  auto groups = CreateGroups(&store_, "cancelled-arrive", n(), absl::Seconds(10));
  const int refuser = n() - 1;  // never arrives on tag 3
  std::vector<std::stop_source> cancels(static_cast<size_t>(n()));
  const auto start = std::chrono::steady_clock::now();
  auto cancel_later = [&](int r) {
    return std::thread([&, r] {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      cancels[r].request_stop();
    });
  };
  // Rank 0 waits, and is cancelled 200 ms later.
  std::thread canceller = cancel_later(0);
  absl::Status s = groups[0]->Arrive(3, absl::Seconds(30), cancels[0].get_token());
  canceller.join();
  EXPECT_EQ(s.code(), absl::StatusCode::kCancelled) << s;
  // The others but the refuser come after it gave up; each is cancelled
  // 200 ms later, or before it starts (the last of them, from 4 members).
  RunRanks(n(), [&](int r) {
    if (r == 0 || r == refuser) return;
    if (r == refuser - 1 && r != 1) cancels[r].request_stop();
    std::thread later = cancel_later(r);
    absl::Status mine = groups[r]->Arrive(3, absl::Seconds(30), cancels[r].get_token());
    later.join();
    EXPECT_EQ(mine.code(), absl::StatusCode::kCancelled) << "rank " << r << ": " << mine;
  });
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 5);
  for (int r = 0; r < n(); ++r) EXPECT_TRUE(groups[r]->broken().ok()) << "rank " << r << ": " << groups[r]->broken();
  // Every member, the refuser too, meets again on later tags.
  RunRanks(n(), [&](int r) {
    ASSERT_TRUE(groups[r]->Arrive(4, absl::Seconds(10)).ok());
    float x = static_cast<float>(r + 1);
    absl::Status sum = groups[r]->AllReduce(DType::kF32, ReduceOp::kSum, &x, 1, 4);
    ASSERT_TRUE(sum.ok()) << sum;
    EXPECT_EQ(x, static_cast<float>(n() * (n() + 1) / 2));
    std::stop_source unused;
    ASSERT_TRUE(groups[r]->Arrive(5, absl::Seconds(10), unused.get_token()).ok());
  });
}

INSTANTIATE_TEST_SUITE_P(Members, CollectiveGroupSizeTest, ::testing::Values(2, 3, 4),
                         [](const ::testing::TestParamInfo<int>& info) { return absl::StrCat(info.param); });

}  // namespace
}  // namespace pw
