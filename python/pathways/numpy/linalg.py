"""`pathways.numpy.linalg` (`pnp.linalg`): numpy.linalg on traced values.

The singular value decomposition (`svd`, one op of the function IR that runs
LAPACK's gesdd per matrix, as numpy's and JAX's on CPU) and what is built
from it: `svdvals`, the matrix 2-norm, -2-norm and nuclear norm,
`matrix_rank`; the norms built from reductions (`norm`, `vector_norm`,
`matrix_norm`). `pw.grad` differentiates through all of them (the svd by
JAX's rule). The other decompositions and solves (eigh, qr, cholesky, solve,
inv, det, and cond, which needs inv) are not here yet.

Integer and bool matrices compute in float64, bfloat16 ones in float32 with
the results rounded back (LAPACK has no bfloat16). A matrix with a NaN or an
infinity gets NaN singular values and vectors, as in JAX (numpy raises
LinAlgError).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import ml_dtypes as _ml_dtypes
import numpy as _np

from pathways import _checks
from pathways._tracer import bind as _bind
from pathways.numpy._common import _axis, _operand, _trace_of
from pathways.numpy._elementwise import abs as _abs
from pathways.numpy._elementwise import sqrt as _sqrt
from pathways.numpy._shapes import reshape as _reshape
from pathways.numpy._shapes import transpose as _transpose

__all__ = ["SVDResult", "matrix_norm", "matrix_rank", "norm", "svd", "svdvals",
           "vector_norm"]

_INF = float("inf")


class SVDResult(NamedTuple):
    """`svd`'s result, as numpy's and JAX's: unpacks as `u, s, vh`."""

    U: Any
    S: Any
    Vh: Any


def _flag(name: str, param: str, value: Any) -> bool:
    if not isinstance(value, (bool, _np.bool_)):
        raise TypeError(f"{name}: {param} must be a bool, got {value!r}")
    return bool(value)


def _matrices(name: str, a: Any) -> tuple:
    """The trace of `a` and `a` as float32/float64 matrices (or None, a if none is traced)."""
    trace = _trace_of(name, (a,), "pathways.numpy.linalg")
    if trace is None:
        return None, a
    x = _operand(trace, a)
    if x.ndim < 2:
        raise ValueError(
            f"{name}: a must have at least two dimensions (a stack of matrices), got {x.aval}")
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
    trace, m = _matrices("svdvals", x)
    if trace is None:
        return _np.linalg.svdvals(x)
    return _svd(m, False)[1]


def _vector_norm(x: Any, ord: Any, axes: tuple, keepdims: bool) -> Any:  # noqa: A002
    a = _abs(x)
    if ord == _INF:
        return a.max(axis=axes, keepdims=keepdims)
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
        out = sums.max(axis=then, keepdims=True) if ord > 0 else sums.min(axis=then, keepdims=True)
        return out if keepdims else _reshape(out, [d for i, d in enumerate(out.shape) if i not in (rows, cols)])
    if ord in (2, -2, "nuc"):
        # Over the singular values of the matrices (rows, cols) moved last.
        rest = [d for d in range(x.ndim) if d not in (rows, cols)]
        s = _svd(_transpose(x, rest + [rows, cols]), False)[1]
        if ord == 2:
            out = s.sum(axis=-1) if s.shape[-1] == 0 else s[..., 0]  # empty: 0, as numpy
        elif ord == -2:
            if s.shape[-1] == 0:
                raise ValueError("norm: ord=-2 of empty matrices: the smallest singular value "
                                 "of no singular values")
            out = s[..., -1]
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
    x = _operand(trace, x)
    if x.dtype == _np.bool_ or _np.dtype(x.dtype).kind in "iu":
        x = x.astype(_np.float64)
    if isinstance(ord, str) and ord not in ("fro", "nuc"):
        raise ValueError(f"norm: invalid norm order {ord!r}")
    if ord is not None and not isinstance(ord, str) and (
            _np.ndim(ord) != 0 or not isinstance(ord, (int, float, _np.number)) or isinstance(ord, bool)):
        raise ValueError(f"norm: invalid norm order {ord!r}: a number, 'fro' or 'nuc'")
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
    trace, m = _matrices("matrix_norm", x)
    if trace is None:
        return _np.linalg.matrix_norm(x, keepdims=keepdims, ord=ord)
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
    _, m = _matrices("matrix_rank", a)
    s = _svd(m, False)[1]
    if s.shape[-1] == 0:
        return (s > 0).sum(axis=-1).astype(_np.int32)

    def per_matrix(t: Any) -> Any:  # a tolerance per matrix, against its row of s
        t = _operand(trace, t)
        return t[..., None] if t.ndim else t

    if tol is None:
        if rtol is None:
            rtol = max(a.shape[-2:]) * _np.finfo(s.dtype).eps
        tol = s.max(axis=-1, keepdims=True) * per_matrix(rtol)
    else:
        tol = per_matrix(tol)
    return (s > tol).sum(axis=-1).astype(_np.int32)
