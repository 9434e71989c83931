#ifndef PATHWAYS_KERNELS_LINALG_H_
#define PATHWAYS_KERNELS_LINALG_H_

// The kSvd op's kernel: the singular value decomposition of each matrix of a
// batch, by LAPACK's divide-and-conquer gesdd (OpenBLAS ships LAPACK), as
// numpy's and JAX's on CPU.
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

}  // namespace pw::kernels

#endif  // PATHWAYS_KERNELS_LINALG_H_
