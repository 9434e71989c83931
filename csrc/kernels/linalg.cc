#include "csrc/kernels/linalg.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <limits>
#include <utility>

// blasint: the integer OpenBLAS's BLAS and LAPACK take (32 or 64 bits).
#include <cblas.h>

#include "csrc/base/check.h"
#include "csrc/kernels/kernel_util.h"

// LAPACK's gesdd (Fortran symbols; the trailing length is gfortran's hidden
// argument for the CHARACTER jobz).
extern "C" {
void sgesdd_(const char* jobz, const blasint* m, const blasint* n, float* a, const blasint* lda,
             float* s, float* u, const blasint* ldu, float* vt, const blasint* ldvt, float* work,
             const blasint* lwork, blasint* iwork, blasint* info, size_t jobz_len);
void dgesdd_(const char* jobz, const blasint* m, const blasint* n, double* a, const blasint* lda,
             double* s, double* u, const blasint* ldu, double* vt, const blasint* ldvt,
             double* work, const blasint* lwork, blasint* iwork, blasint* info, size_t jobz_len);
void ssyevd_(const char* jobz, const char* uplo, const blasint* n, float* a, const blasint* lda,
             float* w, float* work, const blasint* lwork, blasint* iwork, const blasint* liwork,
             blasint* info, size_t jobz_len, size_t uplo_len);
void dsyevd_(const char* jobz, const char* uplo, const blasint* n, double* a, const blasint* lda,
             double* w, double* work, const blasint* lwork, blasint* iwork, const blasint* liwork,
             blasint* info, size_t jobz_len, size_t uplo_len);
void spotrf_(const char* uplo, const blasint* n, float* a, const blasint* lda, blasint* info,
             size_t uplo_len);
void dpotrf_(const char* uplo, const blasint* n, double* a, const blasint* lda, blasint* info,
             size_t uplo_len);
void sgeqrf_(const blasint* m, const blasint* n, float* a, const blasint* lda, float* tau,
             float* work, const blasint* lwork, blasint* info);
void dgeqrf_(const blasint* m, const blasint* n, double* a, const blasint* lda, double* tau,
             double* work, const blasint* lwork, blasint* info);
void sorgqr_(const blasint* m, const blasint* n, const blasint* k, float* a, const blasint* lda,
             const float* tau, float* work, const blasint* lwork, blasint* info);
void dorgqr_(const blasint* m, const blasint* n, const blasint* k, double* a, const blasint* lda,
             const double* tau, double* work, const blasint* lwork, blasint* info);
void sgetrf_(const blasint* m, const blasint* n, float* a, const blasint* lda, blasint* ipiv,
             blasint* info);
void dgetrf_(const blasint* m, const blasint* n, double* a, const blasint* lda, blasint* ipiv,
             blasint* info);
}

namespace pw::kernels {
namespace {

void Gesdd(const char* jobz, blasint m, blasint n, float* a, float* s, float* u, blasint ldu,
           float* vt, blasint ldvt, float* work, blasint lwork, blasint* iwork, blasint* info) {
  const blasint lda = std::max<blasint>(1, m);
  sgesdd_(jobz, &m, &n, a, &lda, s, u, &ldu, vt, &ldvt, work, &lwork, iwork, info, 1);
}
void Gesdd(const char* jobz, blasint m, blasint n, double* a, double* s, double* u, blasint ldu,
           double* vt, blasint ldvt, double* work, blasint lwork, blasint* iwork, blasint* info) {
  const blasint lda = std::max<blasint>(1, m);
  dgesdd_(jobz, &m, &n, a, &lda, s, u, &ldu, vt, &ldvt, work, &lwork, iwork, info, 1);
}

// LAPACK's view of one of our m x n matrices: its transpose, lm x ln
// column-major (lm = n, ln = m). LAPACK's u (lm x ucols) is our vt, its vt
// (vrows x ln) our u.
struct Shape {
  blasint lm, ln, k, ucols, vrows;
  const char* jobz;
};

Shape LapackShape(int64_t m, int64_t n, bool full) {
  Shape sh;
  sh.lm = static_cast<blasint>(n);
  sh.ln = static_cast<blasint>(m);
  sh.k = std::min(sh.lm, sh.ln);
  sh.ucols = full ? sh.lm : sh.k;
  sh.vrows = full ? sh.ln : sh.k;
  sh.jobz = full ? "A" : "S";
  return sh;
}

// gesdd's work array length (elements): its own answer to a workspace query,
// rounded up (a float32 answer may round a large length down), and at least
// the documented minimum for jobz 'S' and 'A'.
template <typename T>
int64_t WorkLength(const Shape& sh) {
  if (sh.k == 0) return 0;
  T query = 0;
  blasint info = 0;
  blasint iwork = 0;
  Gesdd(sh.jobz, sh.lm, sh.ln, static_cast<T*>(nullptr), static_cast<T*>(nullptr),
        static_cast<T*>(nullptr), std::max<blasint>(1, sh.lm), static_cast<T*>(nullptr),
        std::max<blasint>(1, sh.vrows), &query, -1, &iwork, &info);
  const int64_t mn = sh.k;
  const int64_t mx = std::max(sh.lm, sh.ln);
  const int64_t minimum = 3 * mn * mn + std::max(mx, 4 * mn * mn + 4 * mn);
  const int64_t asked = info == 0 ? static_cast<int64_t>(std::ceil(static_cast<double>(query) * (1 + 1e-6))) + 1 : 0;
  return std::max(minimum, asked);
}

// The workspace: the matrix LAPACK overwrites, then its iwork, then its
// work array (the rest).
int64_t IworkBytes(const Shape& sh) {
  return RoundUp(8 * int64_t{sh.k} * static_cast<int64_t>(sizeof(blasint)));
}

template <typename T>
void SvdTyped(int64_t batch, int64_t m, int64_t n, bool full, const T* x, T* u, T* s, T* vt,
              uint8_t* workspace, int64_t workspace_bytes) {
  const Shape sh = LapackShape(m, n, full);
  const int64_t k = sh.k;
  const int64_t u_size = m * (full ? m : k);
  const int64_t vt_size = (full ? n : k) * n;
  const int64_t a_bytes = RoundUp(m * n * static_cast<int64_t>(sizeof(T)));
  T* a = reinterpret_cast<T*>(workspace);
  blasint* iwork = reinterpret_cast<blasint*>(workspace + a_bytes);
  T* work = reinterpret_cast<T*>(workspace + a_bytes + IworkBytes(sh));
  const int64_t work_length = std::min<int64_t>(
      (workspace_bytes - a_bytes - IworkBytes(sh)) / static_cast<int64_t>(sizeof(T)),
      std::numeric_limits<blasint>::max());
  for (int64_t b = 0; b < batch; ++b) {
    const T* xb = x + b * m * n;
    T* ub = u + b * u_size;
    T* sb = s + b * k;
    T* vtb = vt + b * vt_size;
    if (k == 0) {
      // No singular values; a full u or vt is the identity (numpy's).
      std::fill(ub, ub + u_size, T(0));
      std::fill(vtb, vtb + vt_size, T(0));
      if (full) {
        for (int64_t i = 0; i < m; ++i) ub[i * m + i] = T(1);
        for (int64_t i = 0; i < n; ++i) vtb[i * n + i] = T(1);
      }
      continue;
    }
    bool finite = true;
    for (int64_t i = 0; i < m * n && finite; ++i) finite = std::isfinite(xb[i]);
    blasint info = 0;
    if (finite) {
      std::memcpy(a, xb, static_cast<size_t>(m * n) * sizeof(T));
      Gesdd(sh.jobz, sh.lm, sh.ln, a, sb, vtb, std::max<blasint>(1, sh.lm), ub,
            std::max<blasint>(1, sh.vrows), work, static_cast<blasint>(work_length), iwork, &info);
    }
    if (!finite || info != 0) {
      const T nan = std::numeric_limits<T>::quiet_NaN();
      std::fill(ub, ub + u_size, nan);
      std::fill(sb, sb + k, nan);
      std::fill(vtb, vtb + vt_size, nan);
    }
  }
}

void Getrf(blasint n, float* a, blasint* ipiv, blasint* info) {
  const blasint lda = std::max<blasint>(1, n);
  sgetrf_(&n, &n, a, &lda, ipiv, info);
}
void Getrf(blasint n, double* a, blasint* ipiv, blasint* info) {
  const blasint lda = std::max<blasint>(1, n);
  dgetrf_(&n, &n, a, &lda, ipiv, info);
}

template <typename T>
void LuTyped(int64_t batch, int64_t n, const T* x, T* lu, int32_t* pivots, int32_t* permutation,
             uint8_t* workspace) {
  T* a = reinterpret_cast<T*>(workspace);
  blasint* ipiv = reinterpret_cast<blasint*>(workspace + RoundUp(n * n * static_cast<int64_t>(sizeof(T))));
  for (int64_t b = 0; b < batch; ++b) {
    const T* xb = x + b * n * n;
    T* lub = lu + b * n * n;
    int32_t* pb = pivots + b * n;
    int32_t* perm = permutation + b * n;
    for (int64_t i = 0; i < n; ++i) {  // column-major: element (i, j) at i + j * n
      for (int64_t j = 0; j < n; ++j) a[i + j * n] = xb[i * n + j];
    }
    blasint info = 0;  // > 0: U is singular, which is an answer too
    if (n > 0) Getrf(static_cast<blasint>(n), a, ipiv, &info);
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < n; ++j) lub[i * n + j] = a[i + j * n];
    }
    for (int64_t i = 0; i < n; ++i) perm[i] = static_cast<int32_t>(i);
    for (int64_t i = 0; i < n; ++i) {
      const int32_t p = static_cast<int32_t>(ipiv[i] - 1);  // LAPACK's are from 1
      pb[i] = p;
      std::swap(perm[i], perm[p]);
    }
  }
}

template <typename T>
void TrsmTyped(int64_t batch, int64_t n, int64_t k, bool lower, bool unit, bool trans, const T* a,
               const T* b, T* out) {
  // Nothing to solve: nothing is copied either (the buffers of no elements
  // may be null, which memcpy must not be given even for no bytes).
  if (batch == 0 || n == 0 || k == 0) return;
  std::memcpy(out, b, static_cast<size_t>(batch * n * k) * sizeof(T));
  const blasint bn = static_cast<blasint>(n);
  const blasint bk = static_cast<blasint>(k);
  for (int64_t i = 0; i < batch; ++i) {
    const T* ai = a + i * n * n;
    T* xi = out + i * n * k;
    const CBLAS_UPLO uplo = lower ? CblasLower : CblasUpper;
    const CBLAS_TRANSPOSE t = trans ? CblasTrans : CblasNoTrans;
    const CBLAS_DIAG diag = unit ? CblasUnit : CblasNonUnit;
    if constexpr (sizeof(T) == 4) {
      cblas_strsm(CblasRowMajor, CblasLeft, uplo, t, diag, bn, bk, 1.0f, ai, bn, xi, bk);
    } else {
      cblas_dtrsm(CblasRowMajor, CblasLeft, uplo, t, diag, bn, bk, 1.0, ai, bn, xi, bk);
    }
  }
}

void Syevd(blasint n, float* a, float* w, float* work, blasint lwork, blasint* iwork,
           blasint liwork, blasint* info) {
  const blasint lda = std::max<blasint>(1, n);
  ssyevd_("V", "U", &n, a, &lda, w, work, &lwork, iwork, &liwork, info, 1, 1);
}
void Syevd(blasint n, double* a, double* w, double* work, blasint lwork, blasint* iwork,
           blasint liwork, blasint* info) {
  const blasint lda = std::max<blasint>(1, n);
  dsyevd_("V", "U", &n, a, &lda, w, work, &lwork, iwork, &liwork, info, 1, 1);
}
void Potrf(blasint n, float* a, blasint* info) {
  const blasint lda = std::max<blasint>(1, n);
  spotrf_("U", &n, a, &lda, info, 1);
}
void Potrf(blasint n, double* a, blasint* info) {
  const blasint lda = std::max<blasint>(1, n);
  dpotrf_("U", &n, a, &lda, info, 1);
}

// syevd's work and iwork lengths: its documented minimums for jobz 'V'
// (1 + 6n + 2n^2 and 3 + 5n), which are also what it asks for.
int64_t EighWork(int64_t n) { return 1 + 6 * n + 2 * n * n; }
int64_t EighIwork(int64_t n) { return 3 + 5 * n; }

template <typename T>
void EighTyped(int64_t batch, int64_t n, const T* x, T* w, T* v, uint8_t* workspace) {
  const int64_t a_bytes = RoundUp(n * n * static_cast<int64_t>(sizeof(T)));
  T* a = reinterpret_cast<T*>(workspace);
  blasint* iwork = reinterpret_cast<blasint*>(workspace + a_bytes);
  T* work = reinterpret_cast<T*>(workspace + a_bytes +
                                 RoundUp(EighIwork(n) * static_cast<int64_t>(sizeof(blasint))));
  for (int64_t b = 0; b < batch; ++b) {
    const T* xb = x + b * n * n;
    T* wb = w + b * n;
    T* vb = v + b * n * n;
    bool finite = true;  // of the lower triangle, the part that is read
    for (int64_t i = 0; i < n && finite; ++i) {
      for (int64_t j = 0; j <= i; ++j) finite = finite && std::isfinite(xb[i * n + j]);
    }
    blasint info = 0;
    if (finite && n > 0) {
      std::memcpy(a, xb, static_cast<size_t>(n * n) * sizeof(T));
      Syevd(static_cast<blasint>(n), a, wb, work, static_cast<blasint>(EighWork(n)), iwork,
            static_cast<blasint>(EighIwork(n)), &info);
    }
    if (!finite || info != 0) {
      std::fill(wb, wb + n, std::numeric_limits<T>::quiet_NaN());
      std::fill(vb, vb + n * n, std::numeric_limits<T>::quiet_NaN());
      continue;
    }
    for (int64_t i = 0; i < n; ++i) {  // column-major eigenvectors to row-major columns
      for (int64_t j = 0; j < n; ++j) vb[i * n + j] = a[i + j * n];
    }
  }
}

template <typename T>
void CholeskyTyped(int64_t batch, int64_t n, const T* x, T* out) {
  if (batch > 0 && n > 0) std::memcpy(out, x, static_cast<size_t>(batch * n * n) * sizeof(T));  // as TrsmTyped
  for (int64_t b = 0; b < batch; ++b) {
    T* l = out + b * n * n;
    blasint info = 0;
    if (n > 0) Potrf(static_cast<blasint>(n), l, &info);
    if (info != 0) {
      std::fill(l, l + n * n, std::numeric_limits<T>::quiet_NaN());
      continue;
    }
    bool finite = true;  // potrf passes a NaN through without reporting it
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = i + 1; j < n; ++j) l[i * n + j] = T(0);
      for (int64_t j = 0; j <= i; ++j) finite = finite && std::isfinite(l[i * n + j]);
    }
    if (!finite) std::fill(l, l + n * n, std::numeric_limits<T>::quiet_NaN());
  }
}

void Geqrf(blasint m, blasint n, float* a, float* tau, float* work, blasint lwork, blasint* info) {
  const blasint lda = std::max<blasint>(1, m);
  sgeqrf_(&m, &n, a, &lda, tau, work, &lwork, info);
}
void Geqrf(blasint m, blasint n, double* a, double* tau, double* work, blasint lwork,
           blasint* info) {
  const blasint lda = std::max<blasint>(1, m);
  dgeqrf_(&m, &n, a, &lda, tau, work, &lwork, info);
}
void Orgqr(blasint m, blasint n, blasint k, float* a, const float* tau, float* work,
           blasint lwork, blasint* info) {
  const blasint lda = std::max<blasint>(1, m);
  sorgqr_(&m, &n, &k, a, &lda, tau, work, &lwork, info);
}
void Orgqr(blasint m, blasint n, blasint k, double* a, const double* tau, double* work,
           blasint lwork, blasint* info) {
  const blasint lda = std::max<blasint>(1, m);
  dorgqr_(&m, &n, &k, a, &lda, tau, work, &lwork, info);
}

// The QR workspace, in elements: the column-major matrix (m x max(n, c)),
// tau (k), then the work array (the larger of geqrf's and orgqr's answers to
// a workspace query, and at least their documented minimums).
struct QrLayout {
  int64_t a, tau, work;
};

// The matrix's and tau's lengths; the work array's is the rest of the
// workspace (QrSizes), so a run makes no workspace query.
QrLayout QrFixedSizes(int64_t m, int64_t n, bool full) {
  const int64_t k = std::min(m, n);
  const int64_t c = full ? m : k;
  return QrLayout{m * std::max(n, c), k, std::max<int64_t>({1, n, c})};
}

template <typename T>
QrLayout QrSizes(int64_t m, int64_t n, bool full) {
  const int64_t k = std::min(m, n);
  const int64_t c = full ? m : k;
  QrLayout sizes = QrFixedSizes(m, n, full);
  if (k > 0) {
    T query = 0;
    blasint info = 0;
    Geqrf(static_cast<blasint>(m), static_cast<blasint>(n), static_cast<T*>(nullptr),
          static_cast<T*>(nullptr), &query, -1, &info);
    if (info == 0) sizes.work = std::max(sizes.work, static_cast<int64_t>(query) + 1);
    Orgqr(static_cast<blasint>(m), static_cast<blasint>(c), static_cast<blasint>(k),
          static_cast<T*>(nullptr), static_cast<T*>(nullptr), &query, -1, &info);
    if (info == 0) sizes.work = std::max(sizes.work, static_cast<int64_t>(query) + 1);
  }
  return sizes;
}

template <typename T>
void QrTyped(int64_t batch, int64_t m, int64_t n, bool full, const T* x, T* q, T* r,
             uint8_t* workspace, int64_t workspace_bytes) {
  const int64_t k = std::min(m, n);
  const int64_t c = full ? m : k;
  const QrLayout sizes = QrFixedSizes(m, n, full);
  const int64_t esize = static_cast<int64_t>(sizeof(T));
  T* a = reinterpret_cast<T*>(workspace);
  T* tau = reinterpret_cast<T*>(workspace + RoundUp(sizes.a * esize));
  T* work = reinterpret_cast<T*>(workspace + RoundUp(sizes.a * esize) + RoundUp(sizes.tau * esize));
  const int64_t work_length =
      (workspace_bytes - RoundUp(sizes.a * esize) - RoundUp(sizes.tau * esize)) / esize;
  for (int64_t b = 0; b < batch; ++b) {
    const T* xb = x + b * m * n;
    T* qb = q + b * m * c;
    T* rb = r + b * c * n;
    bool finite = true;
    for (int64_t i = 0; i < m * n && finite; ++i) finite = std::isfinite(xb[i]);
    if (!finite) {
      std::fill(qb, qb + m * c, std::numeric_limits<T>::quiet_NaN());
      std::fill(rb, rb + c * n, std::numeric_limits<T>::quiet_NaN());
      continue;
    }
    for (int64_t i = 0; i < m; ++i) {  // column-major, m rows
      for (int64_t j = 0; j < n; ++j) a[i + j * m] = xb[i * n + j];
    }
    blasint info = 0;
    if (k > 0) {
      Geqrf(static_cast<blasint>(m), static_cast<blasint>(n), a, tau, work,
            static_cast<blasint>(work_length), &info);
    }
    for (int64_t i = 0; i < c; ++i) {  // r: on and above the diagonal of the factored a
      for (int64_t j = 0; j < n; ++j) rb[i * n + j] = i <= j && i < k ? a[i + j * m] : T(0);
    }
    if (c > 0 && m > 0) {
      if (k > 0) {
        Orgqr(static_cast<blasint>(m), static_cast<blasint>(c), static_cast<blasint>(k), a, tau,
              work, static_cast<blasint>(work_length), &info);
      } else {  // no reflectors: the identity
        std::fill(a, a + m * c, T(0));
        for (int64_t i = 0; i < std::min(m, c); ++i) a[i + i * m] = T(1);
      }
    }
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < c; ++j) qb[i * c + j] = a[i + j * m];
    }
  }
}

}  // namespace

int64_t QrWorkspaceBytes(DType dtype, int64_t m, int64_t n, bool full_matrices) {
  const QrLayout sizes = dtype == DType::kF32 ? QrSizes<float>(m, n, full_matrices)
                                              : QrSizes<double>(m, n, full_matrices);
  const int64_t esize = DTypeSize(dtype);
  return RoundUp(sizes.a * esize) + RoundUp(sizes.tau * esize) + RoundUp(sizes.work * esize);
}

void QrMatrices(DType dtype, int64_t batch, int64_t m, int64_t n, bool full_matrices,
                const void* x, void* q, void* r, void* workspace, int64_t workspace_bytes) {
  uint8_t* ws = static_cast<uint8_t*>(workspace);
  if (dtype == DType::kF32) {
    QrTyped(batch, m, n, full_matrices, static_cast<const float*>(x), static_cast<float*>(q),
            static_cast<float*>(r), ws, workspace_bytes);
  } else {
    PW_DCHECK(dtype == DType::kF64, "qr of float32 or float64 only");
    QrTyped(batch, m, n, full_matrices, static_cast<const double*>(x), static_cast<double*>(q),
            static_cast<double*>(r), ws, workspace_bytes);
  }
}

int64_t EighWorkspaceBytes(DType dtype, int64_t n) {
  const int64_t esize = DTypeSize(dtype);
  return RoundUp(n * n * esize) + RoundUp(EighIwork(n) * static_cast<int64_t>(sizeof(blasint))) +
         RoundUp(EighWork(n) * esize);
}

void EighMatrices(DType dtype, int64_t batch, int64_t n, const void* x, void* w, void* v,
                  void* workspace, int64_t workspace_bytes) {
  PW_DCHECK(workspace_bytes >= EighWorkspaceBytes(dtype, n), "eigh: workspace too small");
  uint8_t* ws = static_cast<uint8_t*>(workspace);
  if (dtype == DType::kF32) {
    EighTyped(batch, n, static_cast<const float*>(x), static_cast<float*>(w),
              static_cast<float*>(v), ws);
  } else {
    PW_DCHECK(dtype == DType::kF64, "eigh of float32 or float64 only");
    EighTyped(batch, n, static_cast<const double*>(x), static_cast<double*>(w),
              static_cast<double*>(v), ws);
  }
}

void CholeskyMatrices(DType dtype, int64_t batch, int64_t n, const void* x, void* out) {
  if (dtype == DType::kF32) {
    CholeskyTyped(batch, n, static_cast<const float*>(x), static_cast<float*>(out));
  } else {
    PW_DCHECK(dtype == DType::kF64, "cholesky of float32 or float64 only");
    CholeskyTyped(batch, n, static_cast<const double*>(x), static_cast<double*>(out));
  }
}

int64_t LuWorkspaceBytes(DType dtype, int64_t n) {
  return RoundUp(n * n * DTypeSize(dtype)) + RoundUp(n * static_cast<int64_t>(sizeof(blasint)));
}

void LuMatrices(DType dtype, int64_t batch, int64_t n, const void* x, void* lu, int32_t* pivots,
                int32_t* permutation, void* workspace) {
  uint8_t* w = static_cast<uint8_t*>(workspace);
  if (dtype == DType::kF32) {
    LuTyped(batch, n, static_cast<const float*>(x), static_cast<float*>(lu), pivots, permutation, w);
  } else {
    PW_DCHECK(dtype == DType::kF64, "lu of float32 or float64 only");
    LuTyped(batch, n, static_cast<const double*>(x), static_cast<double*>(lu), pivots, permutation,
            w);
  }
}

void TriangularSolveMatrices(DType dtype, int64_t batch, int64_t n, int64_t k, bool lower,
                             bool unit_diagonal, bool transpose_a, const void* a, const void* b,
                             void* out) {
  if (dtype == DType::kF32) {
    TrsmTyped(batch, n, k, lower, unit_diagonal, transpose_a, static_cast<const float*>(a),
              static_cast<const float*>(b), static_cast<float*>(out));
  } else {
    PW_DCHECK(dtype == DType::kF64, "triangular_solve of float32 or float64 only");
    TrsmTyped(batch, n, k, lower, unit_diagonal, transpose_a, static_cast<const double*>(a),
              static_cast<const double*>(b), static_cast<double*>(out));
  }
}

int64_t SvdWorkspaceBytes(DType dtype, int64_t m, int64_t n, bool full_matrices) {
  const Shape sh = LapackShape(m, n, full_matrices);
  const int64_t esize = DTypeSize(dtype);
  const int64_t work = dtype == DType::kF32 ? WorkLength<float>(sh) : WorkLength<double>(sh);
  return RoundUp(m * n * esize) + IworkBytes(sh) + RoundUp(work * esize);
}

void SvdMatrices(DType dtype, int64_t batch, int64_t m, int64_t n, bool full_matrices,
                 const void* x, void* u, void* s, void* vt, void* workspace,
                 int64_t workspace_bytes) {
  uint8_t* w = static_cast<uint8_t*>(workspace);
  if (dtype == DType::kF32) {
    SvdTyped(batch, m, n, full_matrices, static_cast<const float*>(x), static_cast<float*>(u),
             static_cast<float*>(s), static_cast<float*>(vt), w, workspace_bytes);
  } else {
    PW_DCHECK(dtype == DType::kF64, "svd of float32 or float64 only");
    SvdTyped(batch, m, n, full_matrices, static_cast<const double*>(x), static_cast<double*>(u),
             static_cast<double*>(s), static_cast<double*>(vt), w, workspace_bytes);
  }
}

}  // namespace pw::kernels
