#include "csrc/kernels/matmul.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>

// OpenBLAS's cblas.h (with its blasint and CBLAS_* enums). Debian keeps it in
// /usr/include/<multiarch>/openblas-<variant>/; CMake finds the directory.
#include <cblas.h>

#include "csrc/base/check.h"
#include "csrc/base/mutex.h"

namespace pw {
namespace {

// True if v fits the integer type OpenBLAS takes for sizes.
bool FitsBlasInt(int64_t v) {
  return v >= 0 && v <= static_cast<int64_t>(std::numeric_limits<blasint>::max());
}

// A product of batch elements that are laid out like one taller product:
// a[i] follows a[i-1] directly, every b[i] is the same matrix, and op(a) is
// not transposed. Then out (batch*m x n) = a (batch*m x k) @ op(b) in one
// call, which lets BLAS split one big product over its threads instead of
// running many small ones.
bool StacksIntoOneProduct(bool trans_a, int64_t m, int64_t k, int64_t batch,
                          const int64_t* a_offsets, const int64_t* b_offsets) {
  if (batch < 2 || trans_a || !FitsBlasInt(batch * m)) return false;
  for (int64_t i = 1; i < batch; ++i) {
    if (b_offsets[i] != b_offsets[0] || a_offsets[i] != a_offsets[0] + i * m * k) return false;
  }
  return true;
}

// Leading dimensions of the row-major operands as stored (m, n, k > 0 here;
// BLAS rejects a leading dimension of 0).
struct LeadingDims {
  blasint a, b, c;
};

LeadingDims StoredLeadingDims(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k) {
  return {static_cast<blasint>(trans_a ? m : k), static_cast<blasint>(trans_b ? k : n),
          static_cast<blasint>(n)};
}

CBLAS_TRANSPOSE BlasTranspose(bool trans) { return trans ? CblasTrans : CblasNoTrans; }

void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a,
          const float* b, float* out) {
  const LeadingDims ld = StoredLeadingDims(trans_a, trans_b, m, n, k);
  cblas_sgemm(CblasRowMajor, BlasTranspose(trans_a), BlasTranspose(trans_b),
              static_cast<blasint>(m), static_cast<blasint>(n), static_cast<blasint>(k), 1.0f, a,
              ld.a, b, ld.b, 0.0f, out, ld.c);
}

void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const double* a,
          const double* b, double* out) {
  const LeadingDims ld = StoredLeadingDims(trans_a, trans_b, m, n, k);
  cblas_dgemm(CblasRowMajor, BlasTranspose(trans_a), BlasTranspose(trans_b),
              static_cast<blasint>(m), static_cast<blasint>(n), static_cast<blasint>(k), 1.0, a,
              ld.a, b, ld.b, 0.0, out, ld.c);
}

// The two semirings BLAS has no kernel for. int32 is computed in uint32,
// where overflow is defined to wrap; converting back gives numpy's two's
// complement result. (Signed and unsigned variants of a type may alias.)
struct WrappingInt32 {
  using T = uint32_t;
  static T MulAdd(T acc, T x, T y) { return acc + x * y; }
};

// numpy's bool matmul: out = OR over p of (a[i,p] AND b[p,j]).
struct OrOfAnds {
  using T = uint8_t;
  static T MulAdd(T acc, T x, T y) { return acc | static_cast<T>((x != 0) & (y != 0)); }
};

// Blocking for the integer loop: kRowBlock rows of op(a) at a time, over
// kDepthBlock of the shared dimension, so that rows of b (no trans_b) or of
// op(a) (trans_a) are reused from cache across the block. The packed block
// of a transposed `a` lives on the stack: 16 KiB for int32.
constexpr int64_t kRowBlock = 16;
constexpr int64_t kDepthBlock = 256;

// out (m x n) = op(a) @ op(b) over a semiring, k > 0. Loop order i-p-j when b
// is not transposed (the inner loop runs along rows of b and out), i-j-p (a
// dot product of two contiguous rows) when it is. A transposed a is first
// packed block by block into row-major order, so every inner loop is
// unit-stride.
template <typename Semiring>
void SemiringMatmul(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                    const typename Semiring::T* a, const typename Semiring::T* b,
                    typename Semiring::T* out) {
  using T = typename Semiring::T;
  T packed[kRowBlock * kDepthBlock];
  std::fill(out, out + m * n, T{0});
  for (int64_t i0 = 0; i0 < m; i0 += kRowBlock) {
    const int64_t rows = std::min(kRowBlock, m - i0);
    for (int64_t p0 = 0; p0 < k; p0 += kDepthBlock) {
      const int64_t depth = std::min(kDepthBlock, k - p0);
      // Row r of this block of op(a) is a_block[r * a_stride + p], p < depth.
      const T* a_block;
      int64_t a_stride;
      if (trans_a) {
        for (int64_t p = 0; p < depth; ++p) {
          const T* src = a + (p0 + p) * m + i0;  // stored row p0+p, columns i0...
          for (int64_t r = 0; r < rows; ++r) packed[r * kDepthBlock + p] = src[r];
        }
        a_block = packed;
        a_stride = kDepthBlock;
      } else {
        a_block = a + i0 * k + p0;
        a_stride = k;
      }
      for (int64_t r = 0; r < rows; ++r) {
        const T* a_row = a_block + r * a_stride;
        T* out_row = out + (i0 + r) * n;
        if (!trans_b) {
          for (int64_t p = 0; p < depth; ++p) {
            const T x = a_row[p];
            if (x == 0) continue;  // contributes nothing in either semiring
            const T* b_row = b + (p0 + p) * n;
            for (int64_t j = 0; j < n; ++j) out_row[j] = Semiring::MulAdd(out_row[j], x, b_row[j]);
          }
        } else {
          for (int64_t j = 0; j < n; ++j) {
            const T* b_row = b + j * k + p0;  // row j of stored b is column j of op(b)
            T acc = out_row[j];
            for (int64_t p = 0; p < depth; ++p) acc = Semiring::MulAdd(acc, a_row[p], b_row[p]);
            out_row[j] = acc;
          }
        }
      }
    }
  }
}

template <typename T>
void Product(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const T* a, const T* b,
             T* out) {
  if constexpr (std::is_floating_point_v<T>) {
    Gemm(trans_a, trans_b, m, n, k, a, b, out);
  } else if constexpr (sizeof(T) == 4) {
    SemiringMatmul<WrappingInt32>(trans_a, trans_b, m, n, k, a, b, out);
  } else {
    SemiringMatmul<OrOfAnds>(trans_a, trans_b, m, n, k, a, b, out);
  }
}

// T is the storage type: float, double, uint32_t for int32, uint8_t for bool.
template <typename T>
void BatchedProduct(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, int64_t batch,
                    const void* a_data, const int64_t* a_offsets, const void* b_data,
                    const int64_t* b_offsets, void* out_data) {
  const T* a = static_cast<const T*>(a_data);
  const T* b = static_cast<const T*>(b_data);
  T* out = static_cast<T*>(out_data);
  if (StacksIntoOneProduct(trans_a, m, k, batch, a_offsets, b_offsets)) {
    Product(trans_a, trans_b, batch * m, n, k, a + a_offsets[0], b + b_offsets[0], out);
    return;
  }
  for (int64_t i = 0; i < batch; ++i) {
    Product(trans_a, trans_b, m, n, k, a + a_offsets[i], b + b_offsets[i], out + i * m * n);
  }
}

}  // namespace

void BatchedMatmul(DType dtype, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                   int64_t batch, const void* a, const int64_t* a_offsets, const void* b,
                   const int64_t* b_offsets, void* out) {
  PW_DCHECK(FitsBlasInt(m) && FitsBlasInt(n) && FitsBlasInt(k) && batch >= 0,
            "matmul sizes are checked at trace time to fit BLAS's int");
  if (m == 0 || n == 0 || batch == 0) return;
  if (k == 0) {
    // Empty sums. Done here so neither BLAS nor the integer loop has to
    // treat k == 0 specially (all-zero bytes are 0.0, 0 and false).
    std::fill_n(static_cast<uint8_t*>(out), batch * m * n * DTypeSize(dtype), uint8_t{0});
    return;
  }
  switch (dtype) {
    case DType::kF32:
      return BatchedProduct<float>(trans_a, trans_b, m, n, k, batch, a, a_offsets, b, b_offsets,
                                   out);
    case DType::kF64:
      return BatchedProduct<double>(trans_a, trans_b, m, n, k, batch, a, a_offsets, b, b_offsets,
                                    out);
    case DType::kI32:  // wraps modulo 2^32: the same bits as uint32's products
    case DType::kU32:
      return BatchedProduct<uint32_t>(trans_a, trans_b, m, n, k, batch, a, a_offsets, b,
                                      b_offsets, out);
    case DType::kBool:
      return BatchedProduct<uint8_t>(trans_a, trans_b, m, n, k, batch, a, a_offsets, b, b_offsets,
                                     out);
  }
}

namespace {

// The parallel runs in progress, and BLAS's thread count outside them.
struct BlasThreads {
  Mutex mu;
  int active ABSL_GUARDED_BY(mu) = 0;
  int outside ABSL_GUARDED_BY(mu) = 0;
};

BlasThreads& GetBlasThreads() {
  static BlasThreads* const threads = new BlasThreads;
  return *threads;
}

}  // namespace

void EnterParallelShards() {
  BlasThreads& t = GetBlasThreads();
  MutexLock lock(&t.mu);
  if (t.active++ == 0) {
    t.outside = openblas_get_num_threads();
    if (t.outside > 1) openblas_set_num_threads(1);
  }
}

void ExitParallelShards() {
  BlasThreads& t = GetBlasThreads();
  MutexLock lock(&t.mu);
  if (--t.active == 0 && t.outside > 1) openblas_set_num_threads(t.outside);
}

}  // namespace pw
