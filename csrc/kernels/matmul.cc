#include "csrc/kernels/matmul.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>

// OpenBLAS's cblas.h (with its blasint and CBLAS_* enums). Debian keeps it in
// /usr/include/<multiarch>/openblas-<variant>/; CMake finds the directory.
#include <cblas.h>

#include "csrc/base/check.h"
#include "csrc/base/parallel_for.h"

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

CBLAS_TRANSPOSE BlasTranspose(bool trans) { return trans ? CblasTrans : CblasNoTrans; }

// out (m x n, row stride ldc) = op(a) @ op(b), with a, b stored row-major at
// row strides lda and ldb. One BLAS thread: products are split over the
// executor's threads by BatchedProduct, not by BLAS's own pool.
void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
          const float* b, int64_t ldb, float* out, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, BlasTranspose(trans_a), BlasTranspose(trans_b),
              static_cast<blasint>(m), static_cast<blasint>(n), static_cast<blasint>(k), 1.0f, a,
              static_cast<blasint>(lda), b, static_cast<blasint>(ldb), 0.0f, out,
              static_cast<blasint>(ldc));
}

void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const double* a, int64_t lda,
          const double* b, int64_t ldb, double* out, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, BlasTranspose(trans_a), BlasTranspose(trans_b),
              static_cast<blasint>(m), static_cast<blasint>(n), static_cast<blasint>(k), 1.0, a,
              static_cast<blasint>(lda), b, static_cast<blasint>(ldb), 0.0, out,
              static_cast<blasint>(ldc));
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

// How a batched product is cut into pieces for ParallelFor: a piece is
// `group` whole batch elements, or one block of rows (or of columns) of one
// element when an element is worth more than a piece.
struct Pieces {
  int64_t count = 1;
  int64_t group = 1;   // batch elements per piece (split == 1)
  int64_t split = 1;   // blocks per element (group == 1)
  bool by_rows = true; // blocks of rows of out, else of columns
  int64_t block = 0;   // rows (columns) per block
};

// A piece is worth at least kMinPieceFlops (about 40 us on one core here,
// well above a hand-off), and there are at most kPiecesPerThread per thread
// (a helper that arrives late still finds pieces to take). Blocks are
// multiples of kBlockAlign rows or columns, the width of BLAS's kernels.
constexpr double kMinPieceFlops = 4e6;
constexpr int64_t kPiecesPerThread = 3;
constexpr int64_t kBlockAlign = 32;

Pieces PlanPieces(int64_t m, int64_t n, int64_t k, int64_t batch, bool blocks) {
  // Once per process: BLAS's own pool stays idle (see Gemm).
  static const bool single_threaded_blas = (openblas_set_num_threads(1), true);
  (void)single_threaded_blas;
  Pieces p;
  const double total = 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k) *
                       static_cast<double>(batch);
  const int64_t wanted = ParallelPieces(total, kMinPieceFlops, kPiecesPerThread);
  if (wanted < 2) {
    p.group = batch;
    p.count = 1;
    return p;
  }
  if (batch >= wanted || !blocks) {
    p.group = (batch + wanted - 1) / wanted;
    p.count = (batch + p.group - 1) / p.group;
    return p;
  }
  // Fewer elements than pieces: cut each element into blocks along its
  // longer side of out.
  p.by_rows = m >= n;
  const int64_t side = p.by_rows ? m : n;
  const int64_t per_element = (wanted + batch - 1) / batch;
  p.block = std::max(kBlockAlign, (side / per_element + kBlockAlign - 1) / kBlockAlign * kBlockAlign);
  p.split = (side + p.block - 1) / p.block;
  p.count = batch * p.split;
  return p;
}

// T is the storage type: float, double, uint32_t for int32, uint8_t for bool.
template <typename T>
void BatchedProduct(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, int64_t batch,
                    const void* a_data, const int64_t* a_offsets, const void* b_data,
                    const int64_t* b_offsets, void* out_data) {
  const T* a = static_cast<const T*>(a_data);
  const T* b = static_cast<const T*>(b_data);
  T* out = static_cast<T*>(out_data);
  // Stacked elements are one taller product (element 0's offsets).
  int64_t rows = m;
  int64_t count = batch;
  if (StacksIntoOneProduct(trans_a, m, k, batch, a_offsets, b_offsets)) {
    rows = batch * m;
    count = 1;
  }
  constexpr bool kBlas = std::is_floating_point_v<T>;
  const Pieces p = PlanPieces(rows, n, k, count, kBlas);
  const int64_t lda = trans_a ? rows : k;  // only read by BLAS (for a stacked
  const int64_t ldb = trans_b ? k : n;     // product trans_a is false)
  auto element = [&](int64_t i, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
    const T* ai = a + a_offsets[i];
    const T* bi = b + b_offsets[i];
    T* oi = out + i * rows * n;
    if constexpr (kBlas) {
      Gemm(trans_a, trans_b, r1 - r0, c1 - c0, k, ai + (trans_a ? r0 : r0 * lda), lda,
           bi + (trans_b ? c0 * ldb : c0), ldb, oi + r0 * n + c0, n);
    } else if constexpr (sizeof(T) == 4) {
      SemiringMatmul<WrappingInt32>(trans_a, trans_b, rows, n, k, ai, bi, oi);
    } else {
      SemiringMatmul<OrOfAnds>(trans_a, trans_b, rows, n, k, ai, bi, oi);
    }
  };
  ParallelFor(p.count, [&](int64_t piece) {
    if (p.split == 1) {
      const int64_t end = std::min(count, (piece + 1) * p.group);
      for (int64_t i = piece * p.group; i < end; ++i) element(i, 0, rows, 0, n);
      return;
    }
    const int64_t i = piece / p.split;
    const int64_t lo = piece % p.split * p.block;
    if (p.by_rows) {
      element(i, lo, std::min(rows, lo + p.block), 0, n);
    } else {
      element(i, 0, rows, lo, std::min(n, lo + p.block));
    }
  });
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
    case DType::kBF16:  // multiplied in float32 (the builder widens it)
      return;
  }
}

}  // namespace pw
