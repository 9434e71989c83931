#ifndef PATHWAYS_KERNELS_MATMUL_H_
#define PATHWAYS_KERNELS_MATMUL_H_

// Dense matrix products for the simulated devices' kernels.
//
// float32 / float64 go to OpenBLAS (cblas_sgemm / cblas_dgemm, pthread build,
// which picks AVX2 / AVX-512 kernels at run time); int32 and bool, which BLAS
// does not have, use a blocked loop of our own.
//
// Threading: OpenBLAS runs on one thread (its own pool stays idle). A
// product worth more than a few hundred microseconds is cut into pieces,
// whole batch elements or blocks of rows or columns of one element, that
// run on the calling executor thread and on whichever of its pool's other
// threads are free (base/parallel_for.h): the shards of a gang that runs as
// parallel parts already use every thread, and then each part's products
// simply stay on its own thread. Measured on the large transformer step's
// products: BLAS's pool, woken for every product, ran the attention's 32
// small products 1.6x slower than one thread did.

#include <cstdint>

#include "csrc/base/dtype.h"

namespace pw {

// One row-major matrix product per batch element:
//
//   out[i] (m x n) = op(a[i]) (m x k) @ op(b[i]) (k x n),   0 <= i < batch
//
// where op() transposes when `trans_a` / `trans_b` is set; a[i] is then stored
// k x m (else m x k) and b[i] n x k (else k x n), both dense row-major.
// a[i] starts at `a + a_offsets[i]` elements, b[i] at `b + b_offsets[i]`, and
// out[i] at `out + i * m * n`; equal offsets share one operand between
// elements (e.g. one weight matrix for every shard of a gang). The offset
// arrays hold `batch` entries and are only read during the call.
//
// Semantics follow numpy's matmul: `dtype` is the type of a, b and out (one of
// kF32, kF64, kI32, kBool); int32 wraps on overflow (two's complement); bool
// is an OR of ANDs, reading any non-zero byte as true and writing 0 or 1;
// k == 0 gives zeros. Floating-point sums are in BLAS's order, so results
// may differ from a naive loop in the last bits.
//
// Preconditions (checked by assert): m, n, k, batch >= 0 and m, n, k below
// 2^31 (OpenBLAS takes 32-bit sizes); out does not overlap a or b.
//
// Thread-safe; runs on executor threads: no heap allocation of our own (the
// int32 / bool loop packs into a stack buffer of at most 16 KiB), no locks of
// our own, no Python.
void BatchedMatmul(DType dtype, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                   int64_t batch, const void* a, const int64_t* a_offsets, const void* b,
                   const int64_t* b_offsets, void* out);

}  // namespace pw

#endif  // PATHWAYS_KERNELS_MATMUL_H_
