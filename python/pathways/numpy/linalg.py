"""`pathways.numpy.linalg` (`pnp.linalg`): numpy.linalg's norms on traced values.

Only what is built from reductions: `norm` of vectors (any order) and of
matrices (Frobenius, and the orders 1, -1, inf and -inf). The decompositions
(svd, eigh, qr, solve, the nuclear and 2-norms of matrices) need kernels the
function IR does not have yet, and raise NotImplementedError.
"""

from __future__ import annotations

from typing import Any

import numpy as _np

from pathways import _checks
from pathways.numpy._common import _axis, _operand, _trace_of
from pathways.numpy._elementwise import abs as _abs
from pathways.numpy._elementwise import sqrt as _sqrt
from pathways.numpy._shapes import reshape as _reshape

__all__ = ["norm"]

_INF = float("inf")


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
        raise NotImplementedError(
            f"norm: the matrix norm ord={ord!r} needs singular values, which pathways does not "
            "compute yet; ord may be None, 'fro', 1, -1, inf or -inf"
        )
    raise ValueError(f"norm: invalid norm order {ord!r} for matrices")


def norm(x: Any, ord: Any = None, axis: Any = None, keepdims: bool = False) -> Any:  # noqa: A002
    """`numpy.linalg.norm`.

    With `axis` None, `x` 1-d or 2-d gives its vector or matrix norm (and
    `ord` None any `x` flattened's 2-norm); an int `axis` vector norms along
    it, a pair of axes matrix norms over them. Vector orders: None or 2, 1,
    0 (the count of nonzeros), inf, -inf and any other number p
    (`sum(|x|**p)**(1/p)`); matrix orders: None or "fro", 1, -1, inf, -inf.
    Integers and bool compute in float64. As numpy's and JAX's, the gradient
    of the 2-norm at zero is NaN.

    Raises:
      ValueError: For an invalid order or axes.
      NotImplementedError: For the matrix orders 2, -2 and "nuc".
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
