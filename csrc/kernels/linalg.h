#ifndef PATHWAYS_KERNELS_LINALG_H_
#define PATHWAYS_KERNELS_LINALG_H_

// The kernels of the linear algebra ops (kLinalg), each over a batch of
// row-major matrices, through OpenBLAS's LAPACK and BLAS as numpy's and
// JAX's on CPU: kSvd (gesdd), kLu (getrf), kTriangularSolve (trsm), kEigh
// (syevd), kCholesky (potrf) and kQr (geqrf, orgqr).
//
// kSvd: the singular value decomposition of each matrix, by LAPACK's
// divide-and-conquer gesdd.
//
// LAPACK is column-major, and a row-major m x n matrix is its transpose
// column-major, so the kernel decomposes that transpose, x^T = vt^T s u^T:
// LAPACK's u of it is our vt and its vt our u, both already row-major, and
// nothing is transposed. gesdd overwrites its input and needs a workspace;
// Compile sizes one (SvdWorkspaceBytes) in the executable's scratch, so the
// kernel allocates nothing. A matrix with a NaN or an infinity, where LAPACK
// may not converge or may not return, is not given to it: its u, s and vt
// are NaN, as JAX's. The same when gesdd reports no convergence.

#include <cstdint>

#include "csrc/base/dtype.h"

namespace pw::kernels {

// Bytes of workspace SvdMatrices needs (for any batch: the matrices run one
// at a time) for m x n matrices of `dtype` (float32 or float64).
int64_t SvdWorkspaceBytes(DType dtype, int64_t m, int64_t n, bool full_matrices);

// For each of `batch` row-major m x n matrices of `dtype` at `x` (m, n <=
// INT32_MAX), with k = min(m, n): writes u (m x k, or m x m when
// `full_matrices`), s (k, descending) and vt (k x n, or n x n), each
// row-major and the batch's matrices contiguous. `workspace` holds
// `workspace_bytes` = SvdWorkspaceBytes(dtype, m, n, full_matrices) bytes,
// 64-byte aligned.
void SvdMatrices(DType dtype, int64_t batch, int64_t m, int64_t n, bool full_matrices,
                 const void* x, void* u, void* s, void* vt, void* workspace,
                 int64_t workspace_bytes);

// kLu: LAPACK's getrf works on column-major matrices and pivots rows, so
// each matrix is transposed into the workspace, factored there, and
// transposed back: x[permutation] = L U as JAX's lax.linalg.lu.
int64_t LuWorkspaceBytes(DType dtype, int64_t n);

// For each of `batch` row-major n x n matrices of `dtype` (float32 or
// float64) at `x` (n <= INT32_MAX): writes lu (n x n, L strictly below the
// diagonal, U on and above), pivots (n int32: row i swapped with row
// pivots[i], for i in turn) and permutation (n int32), each contiguous over
// the batch. A singular matrix factors too (a zero on U's diagonal).
// `workspace` holds LuWorkspaceBytes(dtype, n) bytes, 64-byte aligned.
void LuMatrices(DType dtype, int64_t batch, int64_t n, const void* x, void* lu, int32_t* pivots,
                int32_t* permutation, void* workspace);

// kTriangularSolve: for each of `batch` pairs of a row-major n x n `a` and
// n x k `b` of `dtype` (float32 or float64), writes x (n x k) with op(a) x =
// b into `out` (which may not overlap them): BLAS's trsm on a copy of b.
void TriangularSolveMatrices(DType dtype, int64_t batch, int64_t n, int64_t k, bool lower,
                             bool unit_diagonal, bool transpose_a, const void* a, const void* b,
                             void* out);

// kEigh: LAPACK's syevd on a copy of each matrix in the workspace (its
// upper triangle, column-major, is the row-major lower one), the
// eigenvectors transposed out. A matrix with a NaN or inf, or one syevd
// does not converge on, gets NaN.
int64_t EighWorkspaceBytes(DType dtype, int64_t n);

// For each of `batch` row-major n x n matrices of `dtype` (float32 or
// float64) at `x`, of which only the lower triangles are read: writes w (n,
// ascending) and v (n x n, the eigenvectors as columns), each contiguous
// over the batch. `workspace` holds `workspace_bytes` =
// EighWorkspaceBytes(dtype, n) bytes, 64-byte aligned.
void EighMatrices(DType dtype, int64_t batch, int64_t n, const void* x, void* w, void* v,
                  void* workspace, int64_t workspace_bytes);

// kCholesky: for each of `batch` row-major n x n matrices (lower triangles
// read), writes L (lower, zeros above the diagonal) with L L^T = x into
// `out` (not overlapping x); a matrix that is not positive definite (or has
// a NaN) gets NaN. LAPACK's potrf in place on out.
void CholeskyMatrices(DType dtype, int64_t batch, int64_t n, const void* x, void* out);

// kQr: each matrix transposed into the workspace (column-major), geqrf,
// r copied out, orgqr to form q there, q transposed out.
int64_t QrWorkspaceBytes(DType dtype, int64_t m, int64_t n, bool full_matrices);

// For each of `batch` row-major m x n matrices of `dtype` (float32 or
// float64) at `x`, with k = min(m, n) and c = m if `full_matrices` else k:
// writes q (m x c, orthonormal columns) and r (c x n, upper triangular),
// each contiguous over the batch; NaN in both for a matrix with a NaN or inf.
// `workspace` holds `workspace_bytes` = QrWorkspaceBytes(...) bytes, 64-byte
// aligned.
void QrMatrices(DType dtype, int64_t batch, int64_t m, int64_t n, bool full_matrices,
                const void* x, void* q, void* r, void* workspace, int64_t workspace_bytes);

}  // namespace pw::kernels

#endif  // PATHWAYS_KERNELS_LINALG_H_
