#include "csrc/kernels/matmul.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <limits>
#include <new>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "csrc/base/allocation_counter.h"
#include "csrc/base/parallel_for.h"
#include "csrc/executor/worker_pool.h"
#include "gtest/gtest.h"


namespace pw {
namespace {

struct Shape {
  int64_t m, n, k;
};

// Odd sizes, empty ones, and sizes past the integer loop's 16-row and
// 256-deep blocks.
constexpr Shape kShapes[] = {{1, 1, 1},   {3, 5, 7},    {17, 1, 9},  {1, 17, 9},
                             {0, 4, 3},   {4, 0, 3},    {4, 3, 0},   {0, 0, 0},
                             {16, 16, 16}, {33, 20, 300}, {70, 9, 513}};

// How the batch elements' operands are laid out.
enum class Layout {
  kSingle,    // batch of one
  kShared,    // every element reads the same a and b (offset 0)
  kDistinct,  // each element its own a and b, with gaps between them
  kStacked,   // a[i] back to back, one b for all (the one-product fast path)
};
constexpr Layout kLayouts[] = {Layout::kSingle, Layout::kShared, Layout::kDistinct,
                               Layout::kStacked};

std::string LayoutName(Layout layout) {
  switch (layout) {
    case Layout::kSingle: return "single";
    case Layout::kShared: return "shared";
    case Layout::kDistinct: return "distinct";
    case Layout::kStacked: return "stacked";
  }
  return "?";
}

struct Problem {
  DType dtype;
  bool trans_a, trans_b;
  Shape shape;
  Layout layout;
  int64_t batch;
};

std::string ToString(const Problem& p) {
  return absl::StrCat(DTypeName(p.dtype), p.trans_a ? " a^T" : " a", p.trans_b ? " b^T" : " b",
                      " m=", p.shape.m, " n=", p.shape.n, " k=", p.shape.k, " ",
                      LayoutName(p.layout), " batch=", p.batch);
}

// Storage type per dtype: int32 as int32_t, bool as one byte.
template <typename T>
void FillRandom(std::vector<T>& v, int64_t k, std::mt19937& rng) {
  if constexpr (std::is_floating_point_v<T>) {
    std::uniform_real_distribution<T> dist(-1, 1);
    for (T& x : v) x = dist(rng);
  } else if constexpr (sizeof(T) == 4) {
    // The whole range, so that sums overflow and must wrap.
    std::uniform_int_distribution<int32_t> dist(std::numeric_limits<int32_t>::min(),
                                                std::numeric_limits<int32_t>::max());
    for (T& x : v) x = dist(rng);
  } else {
    // P(a AND b) ~ 1/k, so about 60% of the outputs are true.
    std::bernoulli_distribution dist(std::min(0.5, 1.0 / std::sqrt(static_cast<double>(k) + 1)));
    for (T& x : v) x = dist(rng) ? 1 : 0;
  }
}

// Element (r, c) of op(x), where op(x) is rows x cols and x is stored
// rows x cols, or cols x rows when transposed.
template <typename T>
T At(const T* x, bool trans, int64_t r, int64_t c, int64_t rows, int64_t cols) {
  return trans ? x[c * rows + r] : x[r * cols + c];
}

// Checks out (m x n) against a naive triple loop over op(a) and op(b).
template <typename T>
void ExpectProduct(const Problem& p, const T* a, const T* b, const T* out) {
  const auto [m, n, k] = p.shape;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      const T got = out[i * n + j];
      if constexpr (std::is_floating_point_v<T>) {
        long double want = 0, magnitude = 0;
        for (int64_t q = 0; q < k; ++q) {
          const long double term = static_cast<long double>(At(a, p.trans_a, i, q, m, k)) *
                                   At(b, p.trans_b, q, j, k, n);
          want += term;
          magnitude += std::fabs(term);
        }
        const long double tolerance =
            (k + 2) * std::numeric_limits<T>::epsilon() * magnitude + std::numeric_limits<T>::min();
        ASSERT_LE(std::fabs(got - want), tolerance) << "at (" << i << ", " << j << ")";
      } else if constexpr (sizeof(T) == 4) {
        uint32_t want = 0;
        for (int64_t q = 0; q < k; ++q) {
          want += static_cast<uint32_t>(At(a, p.trans_a, i, q, m, k)) *
                  static_cast<uint32_t>(At(b, p.trans_b, q, j, k, n));
        }
        ASSERT_EQ(got, static_cast<T>(want)) << "at (" << i << ", " << j << ")";
      } else {
        bool want = false;
        for (int64_t q = 0; q < k; ++q) {
          want = want || (At(a, p.trans_a, i, q, m, k) != 0 && At(b, p.trans_b, q, j, k, n) != 0);
        }
        ASSERT_EQ(got, want ? 1 : 0) << "at (" << i << ", " << j << ")";
      }
    }
  }
}

// Offsets of `batch` operands of `size` elements each, laid out per `layout`
// (`is_a`: the stacked layout shares b only), and the buffer length they need.
std::pair<std::vector<int64_t>, int64_t> Offsets(Layout layout, bool is_a, int64_t batch,
                                                 int64_t size) {
  std::vector<int64_t> offsets(batch, 0);
  switch (layout) {
    case Layout::kSingle:
    case Layout::kShared:
      return {offsets, size};
    case Layout::kDistinct:
      // Reversed order with gaps of 3 elements, starting at element 5.
      for (int64_t i = 0; i < batch; ++i) offsets[i] = 5 + (batch - 1 - i) * (size + 3);
      return {offsets, 5 + batch * (size + 3)};
    case Layout::kStacked:
      if (!is_a) return {offsets, size};
      for (int64_t i = 0; i < batch; ++i) offsets[i] = i * size;
      return {offsets, batch * size};
  }
  return {offsets, 0};
}

// Runs one problem on random operands and checks every batch element.
template <typename T>
void RunAndCheck(const Problem& p, uint32_t seed) {
  SCOPED_TRACE(ToString(p));
  const auto [m, n, k] = p.shape;
  std::mt19937 rng(seed);
  auto [a_offsets, a_len] = Offsets(p.layout, /*is_a=*/true, p.batch, m * k);
  auto [b_offsets, b_len] = Offsets(p.layout, /*is_a=*/false, p.batch, k * n);
  std::vector<T> a(a_len), b(b_len);
  FillRandom(a, k, rng);
  FillRandom(b, k, rng);
  // Garbage in out, so that every element must be written.
  std::vector<T> out(p.batch * m * n);
  if (!out.empty()) std::memset(out.data(), 0x5b, out.size() * sizeof(T));
  BatchedMatmul(p.dtype, p.trans_a, p.trans_b, m, n, k, p.batch, a.data(), a_offsets.data(),
                b.data(), b_offsets.data(), out.data());
  for (int64_t i = 0; i < p.batch; ++i) {
    SCOPED_TRACE(absl::StrCat("batch element ", i));
    ExpectProduct(p, a.data() + a_offsets[i], b.data() + b_offsets[i], out.data() + i * m * n);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

void RunAndCheck(const Problem& p, uint32_t seed) {
  switch (p.dtype) {
    case DType::kF32: return RunAndCheck<float>(p, seed);
    case DType::kF64: return RunAndCheck<double>(p, seed);
    case DType::kI32: return RunAndCheck<int32_t>(p, seed);
    case DType::kU32: return RunAndCheck<uint32_t>(p, seed);
    case DType::kBool: return RunAndCheck<uint8_t>(p, seed);
    default: return;  // uint32 shares int32's kernel; bfloat16 multiplies in float32
  }
}

// One test per (dtype, trans_a, trans_b); each runs every shape and layout.
class MatmulVsNaiveTest : public ::testing::TestWithParam<std::tuple<DType, bool, bool>> {};

TEST_P(MatmulVsNaiveTest, MatchesNaiveProductForEveryShapeAndLayout) {
  const auto [dtype, trans_a, trans_b] = GetParam();
  uint32_t seed = 1;
  for (const Shape& shape : kShapes) {
    for (Layout layout : kLayouts) {
      const int64_t batch = layout == Layout::kSingle ? 1 : 3;
      RunAndCheck({dtype, trans_a, trans_b, shape, layout, batch}, seed++);
      if (HasFatalFailure()) return;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllDTypesAndTransposes, MatmulVsNaiveTest,
    ::testing::Combine(::testing::Values(DType::kF32, DType::kF64, DType::kI32, DType::kBool,
                                         DType::kU32),
                       ::testing::Bool(), ::testing::Bool()),
    // No structured binding here: its commas would split the macro's arguments.
    [](const auto& info) {
      const auto& p = info.param;
      return absl::StrCat(DTypeName(std::get<0>(p)), std::get<1>(p) ? "_aT" : "_a",
                          std::get<2>(p) ? "_bT" : "_b");
    });

TEST(MatmulTest, EmptyBatchWritesNothing) {
  const float a = 1, b = 2;
  float out = 7;
  const int64_t offset = 0;
  BatchedMatmul(DType::kF32, false, false, 1, 1, 1, /*batch=*/0, &a, &offset, &b, &offset, &out);
  EXPECT_EQ(out, 7);
}

TEST(MatmulTest, BoolReadsAnyNonZeroByteAsTrue) {
  // a = [[2, 0], [0, 0]], b = [[0, 255], [9, 9]]: out = [[0, 1], [0, 0]].
  const uint8_t a[] = {2, 0, 0, 0};
  const uint8_t b[] = {0, 255, 9, 9};
  uint8_t out[4];
  const int64_t offset = 0;
  BatchedMatmul(DType::kBool, false, false, 2, 2, 2, 1, a, &offset, b, &offset, out);
  EXPECT_EQ(std::vector<uint8_t>(out, out + 4), (std::vector<uint8_t>{0, 1, 0, 0}));
}

TEST(MatmulTest, Int32WrapsLikeNumpy) {
  // 65536 * 65536 + 1 * -1 wraps to -1 in int32 (numpy gives the same).
  const int32_t a[] = {65536, 1};
  const int32_t b[] = {65536, -1};
  int32_t out = 0;
  const int64_t offset = 0;
  BatchedMatmul(DType::kI32, false, false, 1, 1, 2, 1, a, &offset, b, &offset, &out);
  EXPECT_EQ(out, -1);
}

TEST(MatmulTest, DoesNotAllocate) {
  const int64_t m = 40, n = 30, k = 300;
  // Any bytes will do: only allocations are checked. 8 bytes per element
  // covers every dtype.
  std::vector<uint8_t> bytes_a(m * k * 8, 1), bytes_b(k * n * 8, 1), bytes_out(2 * m * n * 8);
  const int64_t offsets[2] = {0, 0};
  StartCountingAllocations();
  for (DType dtype : {DType::kF32, DType::kF64, DType::kI32, DType::kBool}) {
    for (bool trans : {false, true}) {
      BatchedMatmul(dtype, trans, trans, m, n, k, 2, bytes_a.data(), offsets, bytes_b.data(),
                    offsets, bytes_out.data());
    }
  }
  EXPECT_EQ(StopCountingAllocations(), 0);
}

// Many threads call in at once (BLAS is thread-safe).
class MatmulConcurrencyTest : public ::testing::TestWithParam<int> {};

TEST_P(MatmulConcurrencyTest, ConcurrentCallsGiveCorrectResults) {
  const int num_threads = GetParam();
  const Problem problems[] = {
      {DType::kF32, false, false, {160, 150, 140}, Layout::kSingle, 1},
      {DType::kF64, true, false, {37, 41, 43}, Layout::kDistinct, 2},
      {DType::kF32, false, true, {8, 64, 64}, Layout::kStacked, 4},
      {DType::kI32, true, true, {20, 30, 270}, Layout::kShared, 2},
      {DType::kBool, false, true, {25, 31, 19}, Layout::kDistinct, 3},
  };
  constexpr int kRounds = 4;
  std::vector<std::thread> threads;
  for (int t = 0; t < num_threads; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < kRounds; ++round) {
        // Threads start at different problems so different kinds overlap.
        for (size_t i = 0; i < std::size(problems); ++i) {
          const Problem& p = problems[(i + t) % std::size(problems)];
          RunAndCheck(p, static_cast<uint32_t>(1000 * t + 10 * round + i));
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
}

// Products large enough to be cut into pieces over an executor's threads:
// whole elements in groups, blocks of rows, blocks of columns, a stacked
// batch cut as one tall product, with every transpose. Each result is
// checked against the naive loop, so a piece written twice, missed, or at
// the wrong offset or leading dimension fails.
class MatmulSplitTest : public ::testing::TestWithParam<int> {};

TEST_P(MatmulSplitTest, PiecesOverTheExecutorThreadsGiveTheWholeProduct) {
  WorkerPool pool(GetParam());
  struct Check : Runnable {
    std::atomic<bool> done{false};
    int64_t loops_split = 0;
    void Run(RunContext&) override {
      for (bool trans_a : {false, true}) {
        for (bool trans_b : {false, true}) {
          const Problem problems[] = {
              {DType::kF32, trans_a, trans_b, {301, 203, 101}, Layout::kSingle, 1},    // rows
              {DType::kF32, trans_a, trans_b, {45, 517, 290}, Layout::kSingle, 1},     // columns
              {DType::kF64, trans_a, trans_b, {230, 97, 250}, Layout::kSingle, 1},     // rows
              {DType::kF32, trans_a, trans_b, {64, 70, 66}, Layout::kDistinct, 21},   // groups
              {DType::kF32, trans_a, trans_b, {100, 81, 90}, Layout::kStacked, 9},    // one tall
              {DType::kF32, trans_a, trans_b, {200, 150, 120}, Layout::kShared, 2},   // blocks of 2
              {DType::kI32, trans_a, trans_b, {64, 64, 300}, Layout::kDistinct, 8},   // groups
              {DType::kBool, trans_a, trans_b, {64, 64, 300}, Layout::kDistinct, 8},  // groups
          };
          for (const Problem& p : problems) {
            RunAndCheck(p, static_cast<uint32_t>(p.shape.m + 7 * trans_a + 13 * trans_b));
          }
        }
      }
      loops_split = CurrentParallelTeam()->loops_split();
      done.store(true, std::memory_order_release);
    }
  } check;
  pool.Submit(&check);
  while (!check.done.load(std::memory_order_acquire)) std::this_thread::yield();
  pool.Stop();
  // With helpers, every problem above was split (with none, none was).
  EXPECT_EQ(check.loops_split, GetParam() > 1 ? 32 : 0);
}

INSTANTIATE_TEST_SUITE_P(ExecutorThreads, MatmulSplitTest, ::testing::Values(1, 2, 3),
                         [](const auto& info) { return absl::StrCat(info.param, "_threads"); });

INSTANTIATE_TEST_SUITE_P(ThreadCounts, MatmulConcurrencyTest, ::testing::Values(2, 4),
                         [](const auto& info) { return absl::StrCat(info.param, "_threads"); });

}  // namespace
}  // namespace pw
