"""`pathways.numpy.linalg` (`pnp.linalg`): numpy.linalg on traced values.

Decompositions, each one op of the function IR that runs LAPACK per
matrix of the last two dims (as numpy's and JAX's on CPU), and what is built
from them: the singular value decomposition (`svd`: `svdvals`, the matrix
2-norm, -2-norm and nuclear norm, `matrix_rank`, `cond` for p None, 2, -2)
and the LU decomposition with partial pivoting (with triangular solves:
`solve`, `inv`, `det`, `slogdet`, `cond` for the other orders); and the norms
built from reductions (`norm`, `vector_norm`, `matrix_norm`); and for
symmetric matrices `eigh`, `eigvalsh` (LAPACK's syevd) and `cholesky`
(potrf); `qr` (geqrf, orgqr). `pw.grad` differentiates through all of them
(by JAX's rules); from the svd also `pinv` and `lstsq`. eig and eigvals
(complex results) are not here.

Integer and bool matrices compute in float64, bfloat16 ones in float32 with
the results rounded back (LAPACK has no bfloat16). Where numpy raises
LinAlgError, the answer is JAX's: NaN singular values and vectors for a
matrix with a NaN or an infinity, infinities or NaN for the inverse of a
singular matrix.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import ml_dtypes as _ml_dtypes
import numpy as _np

from pathways import _checks
from pathways._tracer import bind as _bind
from pathways.numpy._common import _axis, _broadcasts_to, _operand, _trace_of
from pathways.numpy._elementwise import abs as _abs
from pathways.numpy._elementwise import isnan as _isnan
from pathways.numpy._elementwise import log as _log
from pathways.numpy._elementwise import sign as _sign
from pathways.numpy._elementwise import where as _where
from pathways.numpy._elementwise import sqrt as _sqrt
from pathways.numpy._indexing import take_along_axis as _take_along_axis
from pathways.numpy._shapes import broadcast_to as _broadcast_to
from pathways.numpy._shapes import reshape as _reshape
from pathways.numpy._shapes import transpose as _transpose

__all__ = ["EighResult", "QRResult", "SVDResult", "SlogdetResult", "cholesky", "cond", "det", "eigh",
           "eigvalsh", "inv", "lstsq", "matrix_norm", "matrix_rank", "norm", "pinv", "qr", "slogdet",
           "solve", "svd", "svdvals", "vector_norm"]

_INF = float("inf")
_MATRIX_ORDERS = (1, -1, 2, -2, _INF, -_INF)


class SVDResult(NamedTuple):
    """`svd`'s result, as numpy's and JAX's: unpacks as `u, s, vh`."""

    U: Any
    S: Any
    Vh: Any


def _flag(name: str, param: str, value: Any) -> bool:
    """A flag as numpy and JAX take it: a bool, or an int (0 or 1 in practice)."""
    if not isinstance(value, (bool, _np.bool_, int, _np.integer)):
        raise TypeError(f"{name}: {param} must be a bool, got {value!r}")
    return bool(value)


def _matrices(name: str, a: Any, param: str = "a", trace: Any = None) -> tuple:
    """The trace of `a` (or `trace`, when another argument has it) and `a` as float
    matrices, integers and bool in float64; (None, a) when nothing is traced."""
    if trace is None:
        trace = _trace_of(name, (a,), "pathways.numpy.linalg")
        if trace is None:
            return None, a
    x = _operand(trace, a)
    if x.ndim < 2:
        raise ValueError(
            f"{name}: {param} must have at least two dimensions (a stack of matrices), got {x.aval}")
    if x.dtype == _np.bool_ or _np.dtype(x.dtype).kind in "iu":
        x = x.astype(_np.float64)
    return trace, x


def _svd(x: Any, full_matrices: bool) -> list:
    """u, s, vt of float matrices `x`; bfloat16 computes in float32 and rounds back."""
    if x.dtype == _ml_dtypes.bfloat16:
        return [r.astype(_ml_dtypes.bfloat16)
                for r in _bind(x._trace, "svd", (x.astype(_np.float32),), full_matrices=full_matrices)]
    return _bind(x._trace, "svd", (x,), full_matrices=full_matrices)


def svd(a: Any, full_matrices: bool = True, compute_uv: bool = True,
        hermitian: bool = False) -> Any:
    """`numpy.linalg.svd`: `a = u @ (s[..., None] * vh)` per matrix of the last two dims.

    With k = min(m, n) for `a` of shape (..., m, n): s (..., k) holds the
    singular values in descending order; u is (..., m, m) and vh (..., n, n)
    when `full_matrices`, else (..., m, k) and (..., k, n). The signs of the
    singular vectors are LAPACK's, as numpy's. `hermitian` is accepted; the
    general decomposition is computed (it is valid for those too). `pw.grad`
    differentiates it as JAX does: through s always; through u and vh when
    they are thin (or square), with infinite gradients where two nonzero
    singular values are equal.

    Returns:
      `SVDResult(U, S, Vh)` (unpacks as `u, s, vh`), or only s when not
      `compute_uv`.

    Raises:
      ValueError: For `a` of rank below 2.
      TypeError: For flags that are not bools.
    """
    trace, x = _matrices("svd", a)
    if trace is None:
        return _np.linalg.svd(a, full_matrices=full_matrices, compute_uv=compute_uv,
                              hermitian=hermitian)
    full_matrices = _flag("svd", "full_matrices", full_matrices)
    compute_uv = _flag("svd", "compute_uv", compute_uv)
    _flag("svd", "hermitian", hermitian)
    u, s, vt = _svd(x, full_matrices and compute_uv)
    return SVDResult(u, s, vt) if compute_uv else s


def svdvals(x: Any, /) -> Any:
    """`numpy.linalg.svdvals`: the singular values of each matrix, descending (`svd`'s s)."""
    trace, m = _matrices("svdvals", x, "x")
    if trace is None:
        return _np.linalg.svdvals(x)
    return _svd(m, False)[1]


def _largest(a: Any, axes: Any, keepdims: bool) -> Any:
    """The max of |x| values `a` over `axes`; 0 over no elements (numpy's norms start at 0)."""
    if any(a.shape[d] == 0 for d in axes):
        return a.sum(axis=axes, keepdims=keepdims)
    return a.max(axis=axes, keepdims=keepdims)


def _vector_norm(x: Any, ord: Any, axes: tuple, keepdims: bool) -> Any:  # noqa: A002
    a = _abs(x)
    if ord == _INF:
        return _largest(a, axes, keepdims)
    if ord == -_INF:
        return a.min(axis=axes, keepdims=keepdims)
    if ord == 0:
        return (x != 0).astype(a.dtype).sum(axis=axes, keepdims=keepdims)
    if ord == 1:
        return a.sum(axis=axes, keepdims=keepdims)
    if ord is None or ord == 2:
        return _sqrt((x * x).sum(axis=axes, keepdims=keepdims))
    return ((a ** ord).sum(axis=axes, keepdims=keepdims)) ** (1.0 / ord)


def _matrix_norm(x: Any, ord: Any, rows: int, cols: int, keepdims: bool) -> Any:  # noqa: A002
    if ord is None or ord == "fro":
        return _sqrt((x * x).sum(axis=(rows, cols), keepdims=keepdims))
    if ord in (1, -1, _INF, -_INF):
        # 1: the largest column sum of |x|; inf: the largest row sum.
        over, then = (rows, cols) if ord in (1, -1) else (cols, rows)
        sums = _abs(x).sum(axis=over, keepdims=True)
        out = _largest(sums, (then,), True) if ord > 0 else sums.min(axis=then, keepdims=True)
        return out if keepdims else _reshape(out, [d for i, d in enumerate(out.shape) if i not in (rows, cols)])
    if ord in (2, -2, "nuc"):
        # Over the singular values of the matrices (rows, cols) moved last.
        rest = [d for d in range(x.ndim) if d not in (rows, cols)]
        s = _svd(_transpose(x, rest + [rows, cols]), False)[1]
        # max and min, not s[..., 0] and s[..., -1]: their gradients split between equal
        # singular values, as JAX's.
        if ord == 2:
            out = _largest(s, (s.ndim - 1,), False)
        elif ord == -2:
            if s.shape[-1] == 0:
                raise ValueError("norm: ord=-2 of empty matrices: the smallest singular value "
                                 "of no singular values")
            out = s.min(axis=-1)
        else:
            out = s.sum(axis=-1)
        if keepdims:
            shape = list(x.shape)
            shape[rows] = shape[cols] = 1
            out = _reshape(out, shape)
        return out
    raise ValueError(f"norm: invalid norm order {ord!r} for matrices")


def norm(x: Any, ord: Any = None, axis: Any = None, keepdims: bool = False) -> Any:  # noqa: A002
    """`numpy.linalg.norm`.

    With `axis` None, `x` 1-d or 2-d gives its vector or matrix norm (and
    `ord` None any `x` flattened's 2-norm); an int `axis` vector norms along
    it, a pair of axes matrix norms over them. Vector orders: None or 2, 1,
    0 (the count of nonzeros), inf, -inf and any other number p
    (`sum(|x|**p)**(1/p)`); matrix orders: None or "fro", 1, -1, inf, -inf,
    and from the singular values (`svd`) 2 (the largest), -2 (the smallest)
    and "nuc" (their sum). Integers and bool compute in float64. As numpy's
    and JAX's, the gradient of the 2-norm at zero is NaN.

    Raises:
      ValueError: For an invalid order or axes.
    """
    trace = _trace_of("norm", (x,), "pathways.numpy.linalg")
    if trace is None:
        return _np.linalg.norm(x, ord=ord, axis=axis, keepdims=keepdims)
    if isinstance(ord, str) and ord == "f":  # numpy's alias
        ord = "fro"
    x = _operand(trace, x)
    if x.dtype == _np.bool_ or _np.dtype(x.dtype).kind in "iu":
        x = x.astype(_np.float64)
    if isinstance(ord, str) and ord not in ("fro", "nuc"):
        raise ValueError(f"norm: invalid norm order {ord!r}")
    if ord is not None and not isinstance(ord, str) and (
            _np.ndim(ord) != 0 or not isinstance(ord, (int, float, _np.number)) or isinstance(ord, bool)):
        raise ValueError(f"norm: invalid norm order {ord!r}: a number, 'fro' or 'nuc'")
    if isinstance(ord, _np.number):  # np.float32(3): its reciprocal in float64, as numpy's
        ord = ord.item()
    if axis is None:
        if ord is None:
            out = _sqrt((x * x).sum())
            return _reshape(out, [1] * x.ndim) if keepdims else out
        if x.ndim == 1:
            if isinstance(ord, str):
                raise ValueError(f"norm: invalid norm order {ord!r} for vectors")
            return _vector_norm(x, ord, (0,), keepdims)
        if x.ndim == 2:
            return _matrix_norm(x, ord, 0, 1, keepdims)
        raise ValueError(f"norm: improper number of dimensions to norm ({x.aval}) with ord={ord!r}")
    axes = _checks.axes("norm", "axis", axis)
    axes = tuple(_axis("norm", "axis", a, x.ndim, x.shape) for a in axes)
    if len(axes) == 1:
        if isinstance(ord, str):
            raise ValueError(f"norm: invalid norm order {ord!r} for vectors")
        return _vector_norm(x, ord, axes, keepdims)
    if len(axes) == 2:
        if axes[0] == axes[1]:
            raise ValueError(f"norm: duplicate axes given ({axis!r})")
        return _matrix_norm(x, ord, axes[0], axes[1], keepdims)
    raise ValueError(f"norm: improper number of dimensions to norm (axis {axis!r})")


def vector_norm(x: Any, /, *, axis: Any = None, keepdims: bool = False, ord: Any = 2) -> Any:  # noqa: A002
    """`numpy.linalg.vector_norm`: `norm`'s vector norms, of `x` flattened when `axis` is None."""
    trace = _trace_of("vector_norm", (x,), "pathways.numpy.linalg")
    if trace is None:
        return _np.linalg.vector_norm(x, axis=axis, keepdims=keepdims, ord=ord)
    v = _operand(trace, x)
    if isinstance(ord, str):
        raise ValueError(f"vector_norm: invalid norm order {ord!r} for vectors")
    if axis is None:
        out = norm(_reshape(v, [-1]), ord=ord)
        return _reshape(out, [1] * v.ndim) if keepdims else out
    axes = _checks.axes("vector_norm", "axis", axis)
    if len(axes) == 1:
        return norm(v, ord=ord, axis=axes[0], keepdims=keepdims)
    # Several axes: moved last and flattened into one.
    axes = tuple(_axis("vector_norm", "axis", a, v.ndim, v.shape) for a in axes)
    if len(set(axes)) != len(axes):
        raise ValueError(f"vector_norm: duplicate axes given ({axis!r})")
    rest = [d for d in range(v.ndim) if d not in axes]
    moved = _transpose(v, rest + list(axes))
    out = norm(_reshape(moved, [v.shape[d] for d in rest] + [-1]), ord=ord, axis=-1)
    if keepdims:
        out = _reshape(out, [1 if d in axes else v.shape[d] for d in range(v.ndim)])
    return out


def matrix_norm(x: Any, /, *, keepdims: bool = False, ord: Any = "fro") -> Any:  # noqa: A002
    """`numpy.linalg.matrix_norm`: `norm`'s matrix norms over the last two dims."""
    trace, m = _matrices("matrix_norm", x, "x")
    if trace is None:
        return _np.linalg.matrix_norm(x, keepdims=keepdims, ord=ord)
    if ord is not None and not (
            (isinstance(ord, str) and ord in ("fro", "nuc"))
            or (isinstance(ord, (int, float, _np.integer, _np.floating)) and not isinstance(ord, bool)
                and ord in _MATRIX_ORDERS)):
        raise ValueError(f"matrix_norm: invalid norm order {ord!r} for matrices: 'fro', 'nuc', "
                         "1, -1, 2, -2, inf or -inf")
    return norm(m, ord=ord, axis=(-2, -1), keepdims=keepdims)


def matrix_rank(A: Any, tol: Any = None, hermitian: bool = False, *, rtol: Any = None) -> Any:  # noqa: N803
    """`numpy.linalg.matrix_rank`: the number of singular values above the tolerance.

    The tolerance is `tol` if given, else `rtol` (default max(m, n) * the
    dtype's eps) times the largest singular value. A vector or scalar `A` has
    rank 1 unless all zero. int32 (numpy's default int is int64; JAX's is int32).
    """
    trace = _trace_of("matrix_rank", (A, tol, rtol), "pathways.numpy.linalg")
    if trace is None:
        return _np.linalg.matrix_rank(A, tol=tol, hermitian=hermitian, rtol=rtol)
    a = _operand(trace, A)
    _flag("matrix_rank", "hermitian", hermitian)
    if a.ndim < 2:
        return (a != 0).any().astype(_np.int32)
    if tol is not None and rtol is not None:
        raise ValueError("matrix_rank: tol and rtol cannot both be given")
    _, m = _matrices("matrix_rank", a, "A")
    s = _svd(m, False)[1]
    if s.shape[-1] == 0:
        return (s > 0).sum(axis=-1).astype(_np.int32)

    if tol is None:
        if rtol is None:
            rtol = max(a.shape[-2:]) * _ml_dtypes.finfo(s.dtype).eps
        tol = s.max(axis=-1, keepdims=True) * _per_matrix(trace, "matrix_rank", "rtol", rtol, s.shape[:-1])
    else:
        tol = _per_matrix(trace, "matrix_rank", "tol", tol, s.shape[:-1])
    return (s > tol).sum(axis=-1).astype(_np.int32)


# --- LU: solve, inv, det, slogdet, cond -------------------------------------------------


class SlogdetResult(NamedTuple):
    """`slogdet`'s result, as numpy's and JAX's: unpacks as `sign, logabsdet`."""

    sign: Any
    logabsdet: Any


def _square(name: str, param: str, x: Any) -> None:
    if x.shape[-1] != x.shape[-2]:
        raise ValueError(f"{name}: {param} must be square matrices [..., n, n], got {x.aval}")


def _lu(x: Any) -> list:
    """lu, pivots, permutation of square float matrices `x` (bfloat16 in float32)."""
    return _bind(x._trace, "lu", (x,))


def _trsm(a: Any, b: Any, lower: bool, unit_diagonal: bool) -> Any:
    return _bind(a._trace, "triangular_solve", (a, b), lower=lower, unit_diagonal=unit_diagonal,
                 transpose_a=False)


def _diagonal(x: Any) -> Any:
    """The diagonals of square matrices x[..., n, n]: a strided slice of them flattened."""
    n = x.shape[-1]
    return _reshape(x, x.shape[:-2] + (n * n,))[..., :: n + 1]


_FLOATS = (_np.dtype(_ml_dtypes.bfloat16), _np.dtype(_np.float32), _np.dtype(_np.float64))


def _common_float(x: Any, y: Any) -> tuple:
    """float matrices `x` and `y` (integers and bool in float64) converted to the wider dtype."""
    if y.dtype == _np.bool_ or _np.dtype(y.dtype).kind in "iu":
        y = y.astype(_np.float64)
    if x.dtype != y.dtype:
        wide = max(_np.dtype(x.dtype), _np.dtype(y.dtype), key=_FLOATS.index)
        x, y = x.astype(wide), y.astype(wide)
    return x, y


def solve(a: Any, b: Any) -> Any:
    """`numpy.linalg.solve`: x with a @ x = b, through the LU decomposition of a.

    `a` is (..., n, n); `b` is (n,) (one vector for every matrix, as numpy 2)
    or (..., n, k), the batch dims broadcasting with a's. Integers and bool
    compute in float64, bfloat16 in float32 (the result rounded back). A
    singular `a` gives infinities or NaN, as JAX (numpy raises LinAlgError).
    `pw.grad` differentiates it through the decomposition's and the
    triangular solves' rules.

    Raises:
      ValueError: For a that is not square matrices, or b whose shape does not fit.
    """
    trace = _trace_of("solve", (a, b), "pathways.numpy.linalg")
    if trace is None:
        return _np.linalg.solve(a, b)
    _, x = _matrices("solve", a, "a", trace)
    _square("solve", "a", x)
    rhs = _operand(trace, b)
    n = x.shape[-1]
    vector = rhs.ndim == 1
    if vector:
        if rhs.shape != (n,):
            raise ValueError(f"solve: b {rhs.aval} does not fit a {x.aval}: a vector needs {n} elements")
        rhs = rhs[:, None]
    elif rhs.ndim < 2 or rhs.shape[-2] != n:
        raise ValueError(f"solve: b {rhs.aval} does not fit a {x.aval}: b must be (n,) or "
                         f"(..., n, k) with n = {n}")
    x, rhs = _common_float(x, rhs)
    try:
        batch = _np.broadcast_shapes(x.shape[:-2], rhs.shape[:-2])
    except ValueError:
        raise ValueError(f"solve: the batch dims of a {x.aval} and b {rhs.aval} do not broadcast") from None
    low = x.dtype == _ml_dtypes.bfloat16
    if low:
        x, rhs = x.astype(_np.float32), rhs.astype(_np.float32)
    lu, _, perm = _lu(x)
    lu = _broadcast_to(lu, batch + (n, n))
    rhs = _broadcast_to(rhs, batch + rhs.shape[-2:])
    perm = _broadcast_to(perm[..., :, None], batch + (n, rhs.shape[-1]))
    out = _trsm(lu, _trsm(lu, _take_along_axis(rhs, perm, axis=-2), True, True), False, False)
    if vector:
        out = out[..., 0]
    return out.astype(_ml_dtypes.bfloat16) if low else out


def inv(a: Any) -> Any:
    """`numpy.linalg.inv`: `solve(a, identity)` per matrix; infinities or NaN where singular (JAX's)."""
    trace = _trace_of("inv", (a,), "pathways.numpy.linalg")
    if trace is None:
        return _np.linalg.inv(a)
    _, x = _matrices("inv", a)
    _square("inv", "a", x)
    n = x.shape[-1]
    eye = trace.constant(_np.eye(n, dtype=_np.float32 if x.dtype == _ml_dtypes.bfloat16 else x.dtype), None)
    return solve(x, _broadcast_to(eye.astype(x.dtype), x.shape))


def _lu_parts(name: str, a: Any) -> tuple:
    """The diagonal of U and the sign of the permutation, of a's LU decomposition."""
    _, x = _matrices(name, a)
    _square(name, "a", x)
    low = x.dtype == _ml_dtypes.bfloat16
    lu, pivots, _ = _lu(x.astype(_np.float32) if low else x)
    n = x.shape[-1]
    swaps = (pivots != x._trace.constant(_np.arange(n, dtype=_np.int32), None)).astype(_np.int32).sum(axis=-1)
    sign = (1 - 2 * (swaps % 2)).astype(lu.dtype)
    return _diagonal(lu), sign, low


def det(a: Any) -> Any:
    """`numpy.linalg.det`: the product of U's diagonal, signed by the row permutation.

    Its gradient (through the LU decomposition) is NaN at a singular matrix,
    where JAX's is the adjugate.
    """
    trace = _trace_of("det", (a,), "pathways.numpy.linalg")
    if trace is None:
        return _np.linalg.det(a)
    diag, sign, low = _lu_parts("det", a)
    out = sign * diag.prod(axis=-1)
    return out.astype(_ml_dtypes.bfloat16) if low else out


def slogdet(a: Any) -> Any:
    """`numpy.linalg.slogdet`: `SlogdetResult(sign, logabsdet)` of det without its overflow.

    A singular matrix gives sign 0 and logabsdet -inf, as numpy's.
    """
    trace = _trace_of("slogdet", (a,), "pathways.numpy.linalg")
    if trace is None:
        return _np.linalg.slogdet(a)
    diag, sign, low = _lu_parts("slogdet", a)
    # Each diagonal element's sign, 0 for 0, and + for NaN (numpy's: the sign stays 1 and
    # logabsdet is NaN).
    sign = sign * _where(diag < 0, -1.0, _where(diag == 0, 0.0, 1.0)).astype(diag.dtype).prod(axis=-1)
    logabsdet = _log(_abs(diag)).sum(axis=-1)
    if low:
        sign, logabsdet = sign.astype(_ml_dtypes.bfloat16), logabsdet.astype(_ml_dtypes.bfloat16)
    return SlogdetResult(sign, logabsdet)


def cond(x: Any, p: Any = None) -> Any:
    """`numpy.linalg.cond`: `norm(x, p) * norm(inv(x), p)` per matrix.

    p None, 2 and -2 come from the singular values (the largest over the
    smallest, or its inverse), any shape; the other orders ("fro", "nuc", 1,
    -1, inf, -inf) from `inv`, square matrices only. As numpy: inf where the
    answer is not a number (a singular or zero matrix, an infinity in x) unless
    x has a NaN.

    Raises:
      ValueError: For an invalid p, empty or (for the orders through inv)
        non-square matrices.
    """
    trace, m = _matrices("cond", x, "x")
    if trace is None:
        return _np.linalg.cond(x, p)
    if m.shape[-1] == 0 or m.shape[-2] == 0:
        raise ValueError(f"cond: x holds empty matrices ({m.aval})")
    if isinstance(p, str) and p == "f":  # numpy's alias
        p = "fro"
    if p is None or (not isinstance(p, str) and p in (2, -2)):
        s = _svd(m, False)[1]
        big, small = s[..., 0], s[..., -1]
        out = big / small if p != -2 else small / big
    else:
        if p not in ("fro", "nuc", 1, -1, _INF, -_INF):
            raise ValueError(f"cond: invalid norm order {p!r}")
        _square("cond", "x", m)
        out = norm(m, p, axis=(-2, -1)) * norm(inv(m), p, axis=(-2, -1))
    finite_input = ~_isnan(m).any(axis=(-2, -1))
    return _where(_isnan(out) & finite_input, _INF, out)


# --- Symmetric matrices: eigh, eigvalsh, cholesky -----------------------------------------


class EighResult(NamedTuple):
    """`eigh`'s result, as numpy's and JAX's: unpacks as `w, v`."""

    eigenvalues: Any
    eigenvectors: Any


def _symmetric(name: str, a: Any, uplo: Any, symmetrize_input: Any) -> Any:
    """a's matrices as the op reads them (lower triangles): (a + a^T) / 2 when
    `symmetrize_input` (JAX's default), else a's lower ("L") or upper ("U") triangle."""
    _, x = _matrices(name, a)
    _square(name, "a", x)
    if isinstance(uplo, str):
        uplo = uplo.upper()  # numpy's
    if uplo not in (None, "L", "U"):
        raise ValueError(f"{name}: UPLO must be 'L' or 'U', got {uplo!r}")
    if _flag(name, "symmetrize_input", symmetrize_input):
        return (x + _swap(x)) / 2
    return _swap(x) if uplo == "U" else x


def _swap(x: Any) -> Any:
    return _transpose(x, list(range(x.ndim - 2)) + [x.ndim - 1, x.ndim - 2])


def _low(x: Any, results: list) -> list:
    """Results of a float32 computation rounded back to bfloat16 when `x` was bfloat16."""
    if x.dtype == _ml_dtypes.bfloat16:
        return [r.astype(_ml_dtypes.bfloat16) for r in results]
    return results


def eigh(a: Any, UPLO: Any = None, symmetrize_input: bool = True) -> Any:  # noqa: N803 (numpy's)
    """`numpy.linalg.eigh`: eigenvalues (ascending) and eigenvectors (columns) of symmetric matrices.

    As JAX's: the matrices are symmetrized, (a + a^T) / 2, unless
    `symmetrize_input` is False; then only the lower triangle (`UPLO` "L",
    numpy's default) or the upper ("U") is read. One `eigh` op (LAPACK's
    syevd). `pw.grad` differentiates it by JAX's rule (infinite through the
    eigenvectors where two eigenvalues are equal). NaN for a matrix with a
    NaN or inf (numpy raises). Called on concrete arrays only, numpy's own
    runs (which reads the `UPLO` triangle, "L" by default).

    Returns:
      `EighResult(eigenvalues, eigenvectors)` (unpacks as `w, v`).
    """
    trace = _trace_of("eigh", (a,), "pathways.numpy.linalg")
    if trace is None:
        return _np.linalg.eigh(a, UPLO="L" if UPLO is None else UPLO)
    x = _symmetric("eigh", a, UPLO, symmetrize_input)
    w, v = _bind(trace, "eigh", (x.astype(_np.float32) if x.dtype == _ml_dtypes.bfloat16 else x,))
    return EighResult(*_low(x, [w, v]))


def eigvalsh(a: Any, UPLO: Any = "L", *, symmetrize_input: bool = True) -> Any:  # noqa: N803
    """`numpy.linalg.eigvalsh`: `eigh`'s eigenvalues, ascending."""
    trace = _trace_of("eigvalsh", (a,), "pathways.numpy.linalg")
    if trace is None:
        return _np.linalg.eigvalsh(a, UPLO=UPLO)
    x = _symmetric("eigvalsh", a, UPLO, symmetrize_input)
    w, _ = _bind(trace, "eigh", (x.astype(_np.float32) if x.dtype == _ml_dtypes.bfloat16 else x,))
    return _low(x, [w])[0]


def cholesky(a: Any, *, upper: bool = False, symmetrize_input: bool = True) -> Any:
    """`numpy.linalg.cholesky`: L lower triangular with L @ L^T = a (U = L^T when `upper`).

    As JAX's: a is symmetrized first unless `symmetrize_input` is False; then
    its lower triangle is read, whatever `upper` (numpy's upper=True reads the
    upper one). One `cholesky` op (LAPACK's potrf). NaN for a matrix that is
    not positive definite, as JAX (numpy raises). `pw.grad` differentiates it
    by JAX's rule. Called on concrete arrays only, numpy's own runs (which
    reads one triangle and raises LinAlgError).
    """
    trace = _trace_of("cholesky", (a,), "pathways.numpy.linalg")
    if trace is None:
        return _np.linalg.cholesky(a, upper=upper)
    upper = _flag("cholesky", "upper", upper)
    x = _symmetric("cholesky", a, None, symmetrize_input)
    low = _bind(trace, "cholesky", (x.astype(_np.float32) if x.dtype == _ml_dtypes.bfloat16 else x,))
    out = _low(x, [low])[0]
    return _swap(out) if upper else out


# --- QR -------------------------------------------------------------------------------------


class QRResult(NamedTuple):
    """`qr`'s result, as numpy's and JAX's: unpacks as `q, r`."""

    Q: Any
    R: Any


def qr(a: Any, mode: str = "reduced") -> Any:
    """`numpy.linalg.qr`: a = q @ r per matrix, q's columns orthonormal, r upper triangular.

    `mode` "reduced" (q (..., m, k), r (..., k, n), k = min(m, n)), "complete"
    (q (..., m, m), r (..., m, n)) or "r" (r alone, as "reduced"'s); numpy's
    "raw" (Householder reflectors) is refused, as JAX refuses it. One `qr` op
    (LAPACK's geqrf and orgqr; the signs are LAPACK's, as numpy's). `pw.grad`
    differentiates it by JAX's rules, for every shape and mode (a complete q's
    extra columns as LAPACK's Householder convention makes them). NaN for a
    matrix with a NaN or inf.

    Returns:
      `QRResult(Q, R)` (unpacks as `q, r`), or r alone for mode "r".
    """
    trace, x = _matrices("qr", a)
    if trace is None:
        return _np.linalg.qr(a, mode=mode)
    if mode not in ("reduced", "complete", "r"):
        raise ValueError(f"qr: mode must be 'reduced', 'complete' or 'r', got {mode!r}")
    low = x.dtype == _ml_dtypes.bfloat16
    q, r = _bind(trace, "qr", (x.astype(_np.float32) if low else x,),
                 full_matrices=mode == "complete")
    q, r = _low(x, [q, r])
    return r if mode == "r" else QRResult(q, r)


# --- From the singular values: pinv, lstsq -------------------------------------------------


def _per_matrix(trace: Any, name: str, param: str, value: Any, batch: tuple) -> Any:
    """A tolerance given per matrix (a scalar, or an array of the batch dims), as a traced
    value that broadcasts against the rows of singular values (batch + (1,))."""
    t = _operand(trace, value)
    if not _broadcasts_to(t.shape, batch):
        raise ValueError(f"{name}: {param} {t.aval} does not broadcast against the matrices' "
                         f"batch dims {batch}")
    return t[..., None] if t.ndim else t


def pinv(a: Any, rtol: Any = None, hermitian: bool = False, *, rcond: Any = None) -> Any:
    """`numpy.linalg.pinv`: the Moore-Penrose pseudo-inverse (..., n, m) of a (..., m, n).

    From the svd: singular values at most `rtol` (or its alias `rcond`) times
    the largest count as zero. The default `rtol` is JAX's, 10 * max(m, n) *
    the dtype's eps (numpy's is 1e-15). `hermitian` symmetrizes a first, as
    JAX. `pw.grad` differentiates it by JAX's rule (Golub and Pereyra's
    derivative of the pseudo-inverse, a custom JVP), not through the svd:
    finite at repeated singular values.

    Raises:
      ValueError: For both rtol and rcond, or a tolerance that does not
        broadcast against the matrices.
    """
    if rcond is not None:
        if rtol is not None:
            raise ValueError("pinv: only one of rtol and rcond may be given")
        rtol = rcond
    trace, x = _matrices("pinv", a)
    if trace is None:
        return _np.linalg.pinv(a, rtol=rtol, hermitian=hermitian)
    if _flag("pinv", "hermitian", hermitian):
        _square("pinv", "a", x)
        x = (x + _swap(x)) / 2
    low = x.dtype == _ml_dtypes.bfloat16
    if low:
        x = x.astype(_np.float32)
    m, n = x.shape[-2:]
    if m == 0 or n == 0:
        out = _broadcast_to(trace.constant(_np.zeros((), x.dtype), None), x.shape[:-2] + (n, m))
        return out.astype(_ml_dtypes.bfloat16) if low else out
    if rtol is None:
        rtol = 10.0 * max(m, n) * _np.finfo(x.dtype).eps
    tol = _per_matrix(trace, "pinv", "rtol", rtol, x.shape[:-2])
    # (Imported here: pathways._custom_derivatives imports the autodiff, which imports
    # pathways.numpy.)
    from pathways._custom_derivatives import custom_jvp  # noqa: PLC0415

    @custom_jvp
    def core(q: Any) -> Any:
        u, s, vt = _svd(q, False)
        keep = s > tol * s[..., :1]
        s_inv = _where(keep, 1 / _where(keep, s, 1.0), 0.0).astype(s.dtype)
        return _swap(vt) @ (_swap(u) * s_inv[..., :, None])

    @core.defjvp
    def core_jvp(primals: tuple, tangents: tuple) -> tuple:
        (q,), (dq,) = primals, tangents
        p = core(q)
        ph, dqh = _swap(p), _swap(dq)
        if m >= n:
            s_ = (p @ ph) @ dqh
            t = (dqh @ ph) @ p
            dp = -(p @ dq) @ p + s_ - (s_ @ q) @ p + t - (p @ q) @ t
        else:
            s_ = p @ (ph @ dqh)
            t = dqh @ (ph @ p)
            dp = -p @ (dq @ p) + s_ - s_ @ (q @ p) + t - p @ (q @ t)
        return p, dp

    out = core(x)
    return out.astype(_ml_dtypes.bfloat16) if low else out


def lstsq(a: Any, b: Any, rcond: Any = None) -> tuple:
    """`numpy.linalg.lstsq`: the x minimizing |b - a x| for a (m, n), b (m,) or (m, k).

    Returns `(x, residuals, rank, s)` as JAX's: residuals are always the
    squared norms of b - a x per column ((k,) or (1,)), where numpy leaves
    them empty when the rank is below n or m <= n; rank is int32. Singular
    values at most `rcond` (default max(m, n) * eps) times the largest count
    as zero (a negative rcond: the dtype's eps, as numpy and JAX). `pw.grad`
    differentiates it through the svd.

    Raises:
      ValueError: For a that is not 2-d, b not 1-d or 2-d, rows that differ, or
        an rcond that is not a scalar.
    """
    trace = _trace_of("lstsq", (a, b), "pathways.numpy.linalg")
    if trace is None:
        return _np.linalg.lstsq(a, b, rcond=rcond)
    _, x = _matrices("lstsq", a, "a", trace)
    rhs = _operand(trace, b)
    if x.ndim != 2:
        raise ValueError(f"lstsq: a must be a matrix (2-d), got {x.aval}")
    if rhs.ndim not in (1, 2) or rhs.shape[0] != x.shape[0]:
        raise ValueError(f"lstsq: b must be (m,) or (m, k) with a's m = {x.shape[0]} rows, got {rhs.aval}")
    x, rhs = _common_float(x, rhs)
    low = x.dtype == _ml_dtypes.bfloat16
    if low:
        x, rhs = x.astype(_np.float32), rhs.astype(_np.float32)
    vector = rhs.ndim == 1
    if vector:
        rhs = rhs[:, None]
    m, n = x.shape
    if m == 0 or n == 0:
        s = _svd(x, False)[1]
        sol = _broadcast_to(trace.constant(_np.zeros((), x.dtype), None), (n, rhs.shape[1]))
        rank = trace.constant(_np.int32(0), None)
    else:
        eps = _np.finfo(x.dtype).eps
        if rcond is None:
            rcond = eps * max(m, n)
        cut = _operand(trace, rcond)
        if cut.ndim:
            raise ValueError(f"lstsq: rcond must be a scalar, got {cut.aval}")
        cut = _where(cut < 0, eps, cut).astype(x.dtype)  # negative: the dtype's eps, as numpy
        u, s, vt = _svd(x, False)
        keep = (s > 0) & (s >= cut * s[:1])
        rank = keep.astype(_np.int32).sum()
        s_inv = _where(keep, 1 / _where(keep, s, 1.0), 0.0).astype(s.dtype)
        sol = _swap(vt) @ (s_inv[:, None] * (_swap(u) @ rhs))
    resid = norm(rhs - x @ sol, axis=0) ** 2
    if vector:
        sol = sol[:, 0]
    if low:
        sol, resid, s = (t.astype(_ml_dtypes.bfloat16) for t in (sol, resid, s))
    return sol, resid, rank, s
