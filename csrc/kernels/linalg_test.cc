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

namespace pw::kernels {
namespace {

template <typename T>
void ExpectLuFactors(const std::vector<T>& x, int64_t batch, int64_t n, double tol) {
  SCOPED_TRACE(testing::Message() << "batch=" << batch << " n=" << n << " bytes=" << sizeof(T));
  const DType dtype = sizeof(T) == 4 ? DType::kF32 : DType::kF64;
  std::vector<T> lu(static_cast<size_t>(batch * n * n), T(-7));
  std::vector<int32_t> pivots(static_cast<size_t>(batch * n), -7);
  std::vector<int32_t> perm(static_cast<size_t>(batch * n), -7);
  std::vector<Block> workspace(static_cast<size_t>(LuWorkspaceBytes(dtype, n) / 64 + 1));
  LuMatrices(dtype, batch, n, x.data(), lu.data(), pivots.data(), perm.data(), workspace.data());
  for (int64_t b = 0; b < batch; ++b) {
    const T* xb = x.data() + b * n * n;
    const T* f = lu.data() + b * n * n;
    const int32_t* p = perm.data() + b * n;
    const int32_t* piv = pivots.data() + b * n;
    // The pivots, applied in turn to 0..n-1, give the permutation; partial
    // pivoting keeps |L| <= 1.
    std::vector<int32_t> from_pivots(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) from_pivots[i] = static_cast<int32_t>(i);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_GE(piv[i], i);
      ASSERT_LT(piv[i], n);
      std::swap(from_pivots[i], from_pivots[piv[i]]);
    }
    EXPECT_EQ(from_pivots, std::vector<int32_t>(p, p + n));
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < i; ++j) EXPECT_LE(std::abs(f[i * n + j]), 1.0 + tol);
    }
    // x[perm] = L U
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double sum = 0;
        for (int64_t q = 0; q <= std::min(i, j); ++q) {
          sum += (q == i ? 1.0 : double{f[i * n + q]}) * f[q * n + j];
        }
        EXPECT_NEAR(sum, xb[p[i] * n + j], tol * 4) << i << "," << j;
      }
    }
  }
}

TEST(LuTest, FactorsWithRowPivotingAsJax) {
  uint32_t seed = 3;
  for (int64_t n : {1, 2, 3, 7, 16}) {
    for (int64_t batch : {1, 3}) {
      ExpectLuFactors(Random<double>(batch * n * n, seed), batch, n, 1e-13);
      ExpectLuFactors(Random<float>(batch * n * n, seed), batch, n, 1e-5);
      ++seed;
    }
  }
  // Pivoting: a zero leading element; a singular matrix factors too.
  ExpectLuFactors(std::vector<double>{0, 1, 2, 3}, 1, 2, 0);
  ExpectLuFactors(std::vector<double>{1, 2, 2, 4}, 1, 2, 0);
  ExpectLuFactors(std::vector<double>{}, 2, 0, 0);
}

template <typename T>
void ExpectSolves(int64_t batch, int64_t n, int64_t k, bool lower, bool unit, bool trans,
                  double tol) {
  SCOPED_TRACE(testing::Message() << "n=" << n << " k=" << k << " lower=" << lower
                                  << " unit=" << unit << " trans=" << trans);
  const DType dtype = sizeof(T) == 4 ? DType::kF32 : DType::kF64;
  // A well-conditioned triangle (diagonal 2..3) with garbage in the other
  // triangle (never read), and, when unit, on the diagonal too.
  std::vector<T> a = Random<T>(batch * n * n, static_cast<uint32_t>(n * 10 + k));
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t i = 0; i < n; ++i) {
      T& d = a[b * n * n + i * n + i];
      d = unit ? T(1e6) : T(2.5) + T(0.5) * std::abs(d);
      for (int64_t j = 0; j < n; ++j) {
        if (j != i) a[b * n * n + i * n + j] *= T(0.3);
      }
    }
  }
  const std::vector<T> rhs = Random<T>(batch * n * k, 77);
  std::vector<T> x(rhs.size(), T(-7));
  TriangularSolveMatrices(dtype, batch, n, k, lower, unit, trans, a.data(), rhs.data(), x.data());
  auto at = [&](int64_t b, int64_t i, int64_t j) -> double {  // op(a) as read
    if (trans) std::swap(i, j);
    if (i == j) return unit ? 1.0 : a[b * n * n + i * n + j];
    if (lower ? j > i : j < i) return 0.0;
    return a[b * n * n + i * n + j];
  };
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t c = 0; c < k; ++c) {
        double sum = 0;
        for (int64_t j = 0; j < n; ++j) sum += at(b, i, j) * x[b * n * k + j * k + c];
        EXPECT_NEAR(sum, rhs[b * n * k + i * k + c], tol) << b << ":" << i << "," << c;
      }
    }
  }
}

TEST(TriangularSolveTest, SolvesEveryTriangleDiagonalAndTranspose) {
  for (bool lower : {false, true}) {
    for (bool unit : {false, true}) {
      for (bool trans : {false, true}) {
        for (auto [n, k] : {std::pair<int64_t, int64_t>{1, 1}, {4, 1}, {5, 3}, {3, 6}}) {
          ExpectSolves<double>(2, n, k, lower, unit, trans, 1e-12);
          ExpectSolves<float>(2, n, k, lower, unit, trans, 1e-4);
        }
      }
    }
  }
  // Empty: nothing to solve, nothing read.
  std::vector<double> none;
  TriangularSolveMatrices(DType::kF64, 3, 0, 4, true, false, false, none.data(), none.data(),
                          none.data());
  TriangularSolveMatrices(DType::kF64, 3, 4, 0, true, false, false, none.data(), none.data(),
                          none.data());
}

}  // namespace
}  // namespace pw::kernels

namespace pw::kernels {
namespace {

// A random symmetric matrix's lower triangle, with garbage above it (never read).
template <typename T>
std::vector<T> LowerOfSymmetric(int64_t batch, int64_t n, uint32_t seed, std::vector<T>* sym) {
  std::vector<T> x = Random<T>(batch * n * n, seed);
  sym->assign(x.size(), T(0));
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j <= i; ++j) {
        (*sym)[b * n * n + i * n + j] = (*sym)[b * n * n + j * n + i] = x[b * n * n + i * n + j];
      }
      for (int64_t j = i + 1; j < n; ++j) x[b * n * n + i * n + j] = T(1e3);
    }
  }
  return x;
}

template <typename T>
void ExpectEigh(int64_t batch, int64_t n, double tol) {
  SCOPED_TRACE(testing::Message() << "batch=" << batch << " n=" << n << " bytes=" << sizeof(T));
  const DType dtype = sizeof(T) == 4 ? DType::kF32 : DType::kF64;
  std::vector<T> sym;
  const std::vector<T> x = LowerOfSymmetric<T>(batch, n, static_cast<uint32_t>(n + 5), &sym);
  std::vector<T> w(static_cast<size_t>(batch * n), T(-7)), v(static_cast<size_t>(batch * n * n), T(-7));
  const int64_t bytes = EighWorkspaceBytes(dtype, n);
  std::vector<Block> workspace(static_cast<size_t>(bytes / 64 + 1));
  EighMatrices(dtype, batch, n, x.data(), w.data(), v.data(), workspace.data(), bytes);
  for (int64_t b = 0; b < batch; ++b) {
    const T* s = sym.data() + b * n * n;
    const T* wb = w.data() + b * n;
    const T* vb = v.data() + b * n * n;
    for (int64_t j = 1; j < n; ++j) EXPECT_LE(wb[j - 1], wb[j]);
    for (int64_t j = 0; j < n; ++j) {  // s v_j = w_j v_j, |v_j| = 1
      double norm = 0;
      for (int64_t i = 0; i < n; ++i) {
        double sv = 0;
        for (int64_t q = 0; q < n; ++q) sv += double{s[i * n + q]} * vb[q * n + j];
        EXPECT_NEAR(sv, double{wb[j]} * vb[i * n + j], tol) << i << "," << j;
        norm += double{vb[i * n + j]} * vb[i * n + j];
      }
      EXPECT_NEAR(norm, 1.0, tol);
    }
  }
}

TEST(EighTest, DecomposesTheSymmetricMatrixOfTheLowerTriangle) {
  for (int64_t n : {1, 2, 5, 16}) {
    ExpectEigh<double>(3, n, 1e-12);
    ExpectEigh<float>(3, n, 2e-5);
  }
  // diag(3, 1): eigenvalues ascending; a NaN in the lower triangle gives NaN, one
  // above it (never read) does not.
  std::vector<double> x = {3, 0, 0, 1, 1, std::nan(""), 2, 1, std::nan(""), 0, 0, 0};
  std::vector<double> w(6), v(12);
  const int64_t bytes = EighWorkspaceBytes(DType::kF64, 2);
  std::vector<Block> workspace(static_cast<size_t>(bytes / 64 + 1));
  EighMatrices(DType::kF64, 3, 2, x.data(), w.data(), v.data(), workspace.data(), bytes);
  EXPECT_EQ(w[0], 1);
  EXPECT_EQ(w[1], 3);
  EXPECT_NEAR(std::abs(v[2]), 1, 1e-15);  // the eigenvector of 1 is (0, 1): column 0
  EXPECT_NEAR(w[2], -1, 1e-15);           // [[1, .], [2, 1]]: eigenvalues -1, 3
  EXPECT_NEAR(w[3], 3, 1e-15);
  EXPECT_TRUE(std::isnan(w[4]) && std::isnan(w[5]) && std::isnan(v[8]));
  EighMatrices(DType::kF64, 0, 2, x.data(), w.data(), v.data(), workspace.data(), bytes);
}

TEST(CholeskyTest, FactorsPositiveDefiniteMatricesAndGivesNaNOtherwise) {
  for (int64_t n : {1, 3, 8}) {
    for (bool f32 : {false, true}) {
      SCOPED_TRACE(testing::Message() << "n=" << n << " f32=" << f32);
      // s = g g^T + n I: positive definite; above its diagonal, garbage.
      const std::vector<double> g = Random<double>(2 * n * n, static_cast<uint32_t>(n));
      std::vector<double> s(2 * n * n);
      for (int64_t b = 0; b < 2; ++b) {
        for (int64_t i = 0; i < n; ++i) {
          for (int64_t j = 0; j < n; ++j) {
            double sum = i == j ? static_cast<double>(n) : 0;
            for (int64_t q = 0; q < n; ++q) sum += g[b * n * n + i * n + q] * g[b * n * n + j * n + q];
            s[b * n * n + i * n + j] = j > i ? -1e3 : sum;
          }
        }
      }
      std::vector<double> l(s.size(), -7);
      if (f32) {
        std::vector<float> sf(s.begin(), s.end()), lf(s.size(), -7);
        CholeskyMatrices(DType::kF32, 2, n, sf.data(), lf.data());
        l.assign(lf.begin(), lf.end());
      } else {
        CholeskyMatrices(DType::kF64, 2, n, s.data(), l.data());
      }
      for (int64_t b = 0; b < 2; ++b) {
        for (int64_t i = 0; i < n; ++i) {
          for (int64_t j = 0; j < n; ++j) {
            if (j > i) {
              EXPECT_EQ(l[b * n * n + i * n + j], 0);
              continue;
            }
            double sum = 0;
            for (int64_t q = 0; q <= j; ++q) sum += l[b * n * n + i * n + q] * l[b * n * n + j * n + q];
            EXPECT_NEAR(sum, s[b * n * n + i * n + j], f32 ? 1e-3 * n : 1e-12 * n);
          }
        }
      }
    }
  }
  // Not positive definite, a NaN: NaN everywhere; the other matrix is factored.
  std::vector<double> x = {1, 0, 2, 1, 4, 0, 0, 9, std::nan(""), 0, 0, 1};
  std::vector<double> l(12);
  CholeskyMatrices(DType::kF64, 3, 2, x.data(), l.data());
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(std::isnan(l[i])) << i;
  EXPECT_EQ(l[4], 2);
  EXPECT_EQ(l[5], 0);
  EXPECT_EQ(l[6], 0);
  EXPECT_EQ(l[7], 3);
  for (int i = 8; i < 12; ++i) EXPECT_TRUE(std::isnan(l[i])) << i;
  // Empty: nothing to factor, nothing read (no buffer at all).
  std::vector<double> none;
  CholeskyMatrices(DType::kF64, 3, 0, none.data(), none.data());
  CholeskyMatrices(DType::kF64, 0, 4, none.data(), none.data());
}

}  // namespace
}  // namespace pw::kernels

namespace pw::kernels {
namespace {

template <typename T>
void ExpectQr(int64_t batch, int64_t m, int64_t n, bool full, double tol) {
  SCOPED_TRACE(testing::Message() << "m=" << m << " n=" << n << " full=" << full
                                  << " bytes=" << sizeof(T));
  const DType dtype = sizeof(T) == 4 ? DType::kF32 : DType::kF64;
  const int64_t k = std::min(m, n);
  const int64_t c = full ? m : k;
  const std::vector<T> x = Random<T>(batch * m * n, static_cast<uint32_t>(m * 7 + n));
  std::vector<T> q(static_cast<size_t>(batch * m * c), T(-7)), r(static_cast<size_t>(batch * c * n), T(-7));
  const int64_t bytes = QrWorkspaceBytes(dtype, m, n, full);
  std::vector<Block> workspace(static_cast<size_t>(bytes / 64 + 1));
  QrMatrices(dtype, batch, m, n, full, x.data(), q.data(), r.data(), workspace.data(), bytes);
  for (int64_t b = 0; b < batch; ++b) {
    const T* qb = q.data() + b * m * c;
    const T* rb = r.data() + b * c * n;
    for (int64_t i = 0; i < c; ++i) {
      for (int64_t j = 0; j < std::min(i, n); ++j) EXPECT_EQ(rb[i * n + j], 0) << i << "," << j;
    }
    for (int64_t i = 0; i < m; ++i) {  // q r = x
      for (int64_t j = 0; j < n; ++j) {
        double sum = 0;
        for (int64_t p = 0; p < c; ++p) sum += double{qb[i * c + p]} * rb[p * n + j];
        EXPECT_NEAR(sum, x[b * m * n + i * n + j], tol) << i << "," << j;
      }
    }
    for (int64_t p = 0; p < c; ++p) {  // q^T q = I
      for (int64_t s = 0; s < c; ++s) {
        double dot = 0;
        for (int64_t i = 0; i < m; ++i) dot += double{qb[i * c + p]} * qb[i * c + s];
        EXPECT_NEAR(dot, p == s ? 1.0 : 0.0, tol) << p << "," << s;
      }
    }
  }
}

TEST(QrTest, FactorsEveryShapeReducedAndComplete) {
  for (auto [m, n] : {std::pair<int64_t, int64_t>{1, 1}, {4, 4}, {6, 3}, {3, 6}, {5, 1}, {1, 5},
                      {0, 3}, {3, 0}, {0, 0}}) {
    for (bool full : {false, true}) {
      ExpectQr<double>(2, m, n, full, 1e-12);
      ExpectQr<float>(2, m, n, full, 2e-5);
    }
  }
  // A NaN: NaN in both, for that matrix only.
  std::vector<double> x = {1, 2, 3, 4, std::nan(""), 1, 1, 1};
  std::vector<double> q(8), r(8);
  const int64_t bytes = QrWorkspaceBytes(DType::kF64, 2, 2, false);
  std::vector<Block> workspace(static_cast<size_t>(bytes / 64 + 1));
  QrMatrices(DType::kF64, 2, 2, 2, false, x.data(), q.data(), r.data(), workspace.data(), bytes);
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(std::isfinite(q[i]) && std::isfinite(r[i])) << i;
  for (int i = 4; i < 8; ++i) EXPECT_TRUE(std::isnan(q[i]) && std::isnan(r[i])) << i;
}

}  // namespace
}  // namespace pw::kernels
