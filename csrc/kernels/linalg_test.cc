#include "csrc/kernels/linalg.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace pw::kernels {
namespace {

struct alignas(64) Block {
  uint8_t bytes[64];
};

// u, s and vt of `batch` m x n matrices, through the kernel.
template <typename T>
struct Svd {
  std::vector<T> u, s, vt;
};

template <typename T>
Svd<T> Decompose(const std::vector<T>& x, int64_t batch, int64_t m, int64_t n, bool full) {
  const int64_t k = std::min(m, n);
  const DType dtype = sizeof(T) == 4 ? DType::kF32 : DType::kF64;
  Svd<T> r;
  r.u.assign(static_cast<size_t>(batch * m * (full ? m : k)), T(-7));
  r.s.assign(static_cast<size_t>(batch * k), T(-7));
  r.vt.assign(static_cast<size_t>(batch * (full ? n : k) * n), T(-7));
  const int64_t bytes = SvdWorkspaceBytes(dtype, m, n, full);
  std::vector<Block> workspace(static_cast<size_t>(bytes / 64 + 1));
  SvdMatrices(dtype, batch, m, n, full, x.data(), r.u.data(), r.s.data(), r.vt.data(),
              workspace.data(), bytes);
  return r;
}

template <typename T>
void ExpectDecomposes(const std::vector<T>& x, int64_t batch, int64_t m, int64_t n, bool full,
                      double tol) {
  SCOPED_TRACE(testing::Message() << "batch=" << batch << " m=" << m << " n=" << n
                                  << " full=" << full << " bytes=" << sizeof(T));
  const Svd<T> r = Decompose(x, batch, m, n, full);
  const int64_t k = std::min(m, n);
  const int64_t uc = full ? m : k;  // u's columns
  const int64_t vr = full ? n : k;  // vt's rows
  for (int64_t b = 0; b < batch; ++b) {
    const T* xb = x.data() + b * m * n;
    const T* u = r.u.data() + b * m * uc;
    const T* s = r.s.data() + b * k;
    const T* vt = r.vt.data() + b * vr * n;
    double scale = 0;
    for (int64_t i = 0; i < m * n; ++i) scale = std::max(scale, std::abs(double{xb[i]}));
    for (int64_t j = 0; j < k; ++j) {
      EXPECT_GE(s[j], 0);
      if (j > 0) {
        EXPECT_LE(s[j], s[j - 1]);
      }
    }
    // x = u[:, :k] diag(s) vt[:k, :]
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t c = 0; c < n; ++c) {
        double sum = 0;
        for (int64_t j = 0; j < k; ++j) sum += double{u[i * uc + j]} * s[j] * vt[j * n + c];
        EXPECT_NEAR(sum, xb[i * n + c], tol * std::max(scale, 1.0)) << i << "," << c;
      }
    }
    // u's columns and vt's rows orthonormal.
    for (int64_t a = 0; a < uc; ++a) {
      for (int64_t c = 0; c < uc; ++c) {
        double dot = 0;
        for (int64_t i = 0; i < m; ++i) dot += double{u[i * uc + a]} * u[i * uc + c];
        EXPECT_NEAR(dot, a == c ? 1.0 : 0.0, tol) << "u " << a << "," << c;
      }
    }
    for (int64_t a = 0; a < vr; ++a) {
      for (int64_t c = 0; c < vr; ++c) {
        double dot = 0;
        for (int64_t i = 0; i < n; ++i) dot += double{vt[a * n + i]} * vt[c * n + i];
        EXPECT_NEAR(dot, a == c ? 1.0 : 0.0, tol) << "vt " << a << "," << c;
      }
    }
  }
}

template <typename T>
std::vector<T> Random(int64_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal;
  std::vector<T> x(static_cast<size_t>(count));
  for (T& v : x) v = static_cast<T>(normal(rng));
  return x;
}

TEST(SvdTest, DecomposesEveryShapeThinAndFull) {
  const int64_t shapes[][2] = {{1, 1}, {3, 3}, {5, 3}, {3, 5}, {1, 4}, {4, 1}, {17, 9}, {8, 40}};
  uint32_t seed = 1;
  for (const auto& shape : shapes) {
    for (bool full : {false, true}) {
      for (int64_t batch : {1, 3}) {
        const int64_t m = shape[0], n = shape[1];
        ExpectDecomposes(Random<double>(batch * m * n, seed), batch, m, n, full, 1e-12);
        ExpectDecomposes(Random<float>(batch * m * n, seed), batch, m, n, full, 2e-5);
        ++seed;
      }
    }
  }
}

TEST(SvdTest, KnownSingularValuesAndRankDeficientMatrices) {
  // diag(3, -4) padded: singular values 4, 3; a rank-1 outer product; zeros.
  const std::vector<double> diag = {3, 0, 0, -4, 0, 0};  // 3 x 2
  Svd<double> r = Decompose(diag, 1, 3, 2, false);
  EXPECT_DOUBLE_EQ(r.s[0], 4);
  EXPECT_DOUBLE_EQ(r.s[1], 3);
  std::vector<double> outer;
  for (double a : {1.0, 2.0, -1.0}) {
    for (double b : {0.5, 1.0, 2.0, 3.0}) outer.push_back(a * b);
  }
  ExpectDecomposes(outer, 1, 3, 4, true, 1e-12);
  r = Decompose(outer, 1, 3, 4, false);
  EXPECT_NEAR(r.s[0], std::sqrt(6.0) * std::sqrt(14.25), 1e-12);
  EXPECT_NEAR(r.s[1], 0, 1e-12);
  ExpectDecomposes(std::vector<double>(12, 0.0), 1, 4, 3, true, 0);
  r = Decompose(std::vector<double>(12, 0.0), 1, 4, 3, false);
  for (double v : r.s) EXPECT_EQ(v, 0);
}

TEST(SvdTest, EmptyMatricesHaveNoSingularValuesAndIdentityFactors) {
  for (const auto& [m, n] : {std::pair<int64_t, int64_t>{0, 3}, {3, 0}, {0, 0}}) {
    SCOPED_TRACE(testing::Message() << m << "x" << n);
    const Svd<float> thin = Decompose(std::vector<float>{}, 2, m, n, false);
    EXPECT_TRUE(thin.s.empty());
    EXPECT_TRUE(thin.u.empty());
    EXPECT_TRUE(thin.vt.empty());
    const Svd<float> full = Decompose(std::vector<float>{}, 2, m, n, true);
    ASSERT_EQ(full.u.size(), static_cast<size_t>(2 * m * m));
    ASSERT_EQ(full.vt.size(), static_cast<size_t>(2 * n * n));
    for (int64_t b = 0; b < 2; ++b) {
      for (int64_t i = 0; i < m * m; ++i) EXPECT_EQ(full.u[b * m * m + i], i % (m + 1) == 0 ? 1 : 0);
      for (int64_t i = 0; i < n * n; ++i) EXPECT_EQ(full.vt[b * n * n + i], i % (n + 1) == 0 ? 1 : 0);
    }
  }
}

TEST(SvdTest, NonFiniteMatricesGiveNaNAndLeaveTheOthersAlone) {
  std::vector<double> x = Random<double>(3 * 4 * 2, 9);
  x[4 * 2 + 5] = std::numeric_limits<double>::quiet_NaN();  // matrix 1
  x[2 * 4 * 2] = -std::numeric_limits<double>::infinity();  // matrix 2
  const Svd<double> r = Decompose(x, 3, 4, 2, false);
  for (int64_t b = 0; b < 3; ++b) {
    for (int64_t i = 0; i < 2; ++i) EXPECT_EQ(std::isnan(r.s[b * 2 + i]), b > 0) << b;
    for (int64_t i = 0; i < 8; ++i) EXPECT_EQ(std::isnan(r.u[b * 8 + i]), b > 0) << b;
    for (int64_t i = 0; i < 4; ++i) EXPECT_EQ(std::isnan(r.vt[b * 4 + i]), b > 0) << b;
  }
  ExpectDecomposes(std::vector<double>(x.begin(), x.begin() + 8), 1, 4, 2, false, 1e-12);
}

}  // namespace
}  // namespace pw::kernels
