"""Reductions: `sum`, `mean`, `max`, `min`, `argmax` (the `Tracer` methods), `var`, `std`,
`any`, `all`, `prod`, `argmin`, `count_nonzero`, `ptp`, `average`.
"""

from __future__ import annotations

from typing import Any

import numpy as _np

from pathways import _checks
from pathways._trace_state import _BFLOAT16 as _BF16
from pathways._tracer import Tracer
from pathways.numpy._common import _axis, _trace_of, _traced
from pathways.numpy._elementwise import sqrt


def _reduction(name: str, numpy_fn: Any) -> Any:
    """numpy's `name(a, axis=None, *, keepdims=False)` (max, min, argmax: numpy's third
    positional argument is `out`, which is not taken)."""

    def fn(a: Any, axis: Any = None, *, keepdims: bool = False) -> Any:
        if _traced(name, (a,)):
            return getattr(a, name)(axis=axis, keepdims=keepdims)
        return numpy_fn(a, axis=axis, keepdims=keepdims)

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = (
        f"`numpy.{name}(a, axis=None, *, keepdims=False)` of a traced value (or of a numpy "
        "array); axis may be None, an int or (except argmax) a tuple; negative axes count "
        "from the end."
    )
    return fn


def _typed_reduction(name: str, numpy_fn: Any) -> Any:
    """numpy's `name(a, axis=None, dtype=None, *, keepdims=False)` (sum, mean)."""

    def fn(a: Any, axis: Any = None, dtype: Any = None, *, keepdims: bool = False) -> Any:
        if _traced(name, (a,)):
            return getattr(a, name)(axis, dtype, keepdims=keepdims)
        if dtype is None and _np.asarray(a).dtype == _BF16:
            # As on the devices (and XLA): bfloat16 accumulates in float32 and
            # rounds once; numpy's own sum would round at every add.
            out = numpy_fn(_np.asarray(a, _np.float32), axis=axis, keepdims=keepdims)
            return _np.asarray(out).astype(_BF16)
        return numpy_fn(a, axis=axis, dtype=dtype, keepdims=keepdims)

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = (
        f"`numpy.{name}(a, axis=None, dtype=None, *, keepdims=False)` of a traced value (or "
        "of a numpy array): `dtype` casts `a` first; axis may be None, an int or a tuple; "
        "negative axes count from the end."
    )
    return fn


sum = _typed_reduction("sum", _np.sum)  # noqa: A001
mean = _typed_reduction("mean", _np.mean)
max = _reduction("max", _np.max)  # noqa: A001
min = _reduction("min", _np.min)  # noqa: A001
argmax = _reduction("argmax", _np.argmax)

def var(a: Any, axis: Any = None, dtype: Any = None, *, keepdims: bool = False) -> Any:
    """`numpy.var` (ddof=0): the mean squared deviation from the mean over `axis`
    (`dtype` casts `a` first)."""
    if _trace_of("var", (a,)) is None:
        return _np.var(a, axis=axis, dtype=dtype, keepdims=keepdims)
    if dtype is not None:
        a = a.astype(dtype)
    axis = _checks.axes("var", "axis", axis)
    centered = a - mean(a, axis=axis, keepdims=True)
    return mean(centered * centered, axis=axis, keepdims=keepdims)


def std(a: Any, axis: Any = None, dtype: Any = None, *, keepdims: bool = False) -> Any:
    """`numpy.std` (ddof=0): the square root of `var`."""
    if _trace_of("std", (a,)) is None:
        return _np.std(a, axis=axis, dtype=dtype, keepdims=keepdims)
    axis = _checks.axes("std", "axis", axis)
    return sqrt(var(a, axis=axis, dtype=dtype, keepdims=keepdims))



def _nonzero(a: Any) -> Any:
    return a if a.dtype == _np.bool_ else a != 0


def any(a: Any, axis: Any = None, *, keepdims: bool = False) -> Any:  # noqa: A001 (numpy's name)
    """`numpy.any`: whether any element over `axis` is nonzero (NaN is); False if there is none."""
    if _trace_of("any", (a,)) is None:
        return _np.any(a, axis=axis, keepdims=keepdims)
    return _nonzero(a).sum(axis=axis, keepdims=keepdims) > 0


def all(a: Any, axis: Any = None, *, keepdims: bool = False) -> Any:  # noqa: A001 (numpy's name)
    """`numpy.all`: whether every element over `axis` is nonzero; True if there is none."""
    if _trace_of("all", (a,)) is None:
        return _np.all(a, axis=axis, keepdims=keepdims)
    return (~_nonzero(a)).sum(axis=axis, keepdims=keepdims) == 0


def prod(a: Any, axis: Any = None, dtype: Any = None, *, keepdims: bool = False) -> Any:
    """`numpy.prod`: the product over `axis` (1 if there are no elements).

    dtypes as `cumprod`'s (JAX's: bool and int32 multiply in int32, wrapping);
    computed as the last running product of `cumprod`, so the gradient is
    exact with zeros in `a` too.
    """
    from pathways.numpy._shapes import reshape
    from pathways.numpy._sorting import cumprod

    if _trace_of("prod", (a,)) is None:
        return _np.prod(a, axis=axis, dtype=dtype, keepdims=keepdims)
    if dtype is not None:
        a = a.astype(dtype)
    axes = _checks.axes("prod", "axis", axis)
    ndim = len(a.shape)
    axes = tuple(range(ndim)) if axes is None else axes
    for ax in axes:
        if not -ndim <= ax < ndim:
            raise ValueError(f"prod: axis {ax} is out of range for {a.aval}")
    axes = sorted({ax % ndim for ax in axes})
    kept = [d for i, d in enumerate(a.shape) if i not in axes]
    n = int(_np.prod([a.shape[i] for i in axes]))
    perm = [i for i in range(ndim) if i not in axes] + axes
    moved = a.transpose(*perm) if perm != list(range(ndim)) else a
    flat = reshape(moved, tuple(kept) + (n,))
    running = cumprod(flat, axis=-1)
    if n == 0:
        from pathways.numpy._elementwise import ones_like

        out = ones_like(reshape(running, tuple(kept) + (0,)).sum(axis=-1))
    else:
        out = running[..., -1]
    if keepdims:
        out = reshape(out, tuple(1 if i in axes else d for i, d in enumerate(a.shape)))
    return out


def argmin(a: Any, axis: Any = None, *, keepdims: bool = False) -> Any:
    """`numpy.argmin`: the index of the first minimum along `axis` (None: flattened), int32.

    The first NaN, as numpy. The argmax of an order-reversing bijection of
    `a`: `-a` for floats, `~a` for integers and bool (no overflow).
    """
    if _trace_of("argmin", (a,)) is None:
        return _np.argmin(a, axis=axis, keepdims=keepdims)
    reversed_order = ~a if a.dtype in (_np.int32, _np.uint32, _np.bool_) else -a
    return reversed_order.argmax(axis=axis, keepdims=keepdims)


amax = max
amin = min


def count_nonzero(a: Any, axis: Any = None, *, keepdims: bool = False) -> Any:
    """`numpy.count_nonzero`: the number of nonzero elements over `axis` (NaN counts),
    int32 (numpy's is int64, which the devices do not hold)."""
    if _trace_of("count_nonzero", (a,)) is None:
        return _np.count_nonzero(a, axis=axis, keepdims=keepdims)
    return _nonzero(a).sum(axis=axis, keepdims=keepdims)


def ptp(a: Any, axis: Any = None, *, keepdims: bool = False) -> Any:
    """`numpy.ptp`: the range, max - min, over `axis`."""
    if _trace_of("ptp", (a,)) is None:
        return _np.ptp(a, axis=axis, keepdims=keepdims)
    return a.max(axis=axis, keepdims=keepdims) - a.min(axis=axis, keepdims=keepdims)


def average(a: Any, axis: Any = None, weights: Any = None, returned: bool = False, *,
            keepdims: bool = False) -> Any:
    """`numpy.average`: the mean over `axis`, weighted by `weights` (of `a`'s shape, or
    1-d along a single `axis`); with `returned`, also the sum of the weights.

    Integers and bool average in float64, as numpy's.

    Raises:
      ValueError: For weights of another shape, or an axis out of range.
      ZeroDivisionError: For constant weights summing to zero over an axis,
        as numpy (traced ones give inf or NaN there, as JAX's).
    """
    if _trace_of("average", (a, weights)) is None:
        return _np.average(a, axis=axis, weights=weights, returned=returned, keepdims=keepdims)
    from pathways.numpy._common import _operand
    from pathways.numpy._shapes import broadcast_to, reshape

    trace = _trace_of("average", (a, weights))
    a = _operand(trace, a)
    axes = _checks.axes("average", "axis", axis)
    if axes is not None:
        axes = tuple(_axis("average", "axis", ax, a.ndim, a.shape) for ax in axes)
    if a.dtype == _np.bool_ or _np.dtype(a.dtype).kind in "iu":
        a = a.astype(_np.float64)  # numpy's: integers and bool average in float64
    if weights is None:
        avg = mean(a, axis=axes, keepdims=keepdims)
        if not returned:
            return avg
        count = a.size if axes is None else int(_np.prod([a.shape[i] for i in axes]))
        return avg, broadcast_to(trace.constant(_np.asarray(count, avg.dtype), None), avg.shape)
    w = _operand(trace, weights)
    if w.shape != a.shape:
        if axes is None or len(axes) != 1 or w.ndim != 1 or w.shape[0] != a.shape[axes[0]]:
            raise ValueError(
                f"average: weights {w.aval} must have the shape of a ({a.aval}), or be 1-d of "
                "the length of the one axis averaged over"
            )
        ax = axes[0]
        w = broadcast_to(reshape(w, [w.shape[0] if i == ax else 1 for i in range(a.ndim)]), a.shape)
    if not isinstance(weights, Tracer):
        # Constant weights are checked now, as numpy does (traced ones give
        # inf or NaN, as JAX's).
        wn = _np.asarray(weights, _np.float64)
        if wn.shape != a.shape:  # 1-d along the one axis (checked above)
            wn = wn.reshape([wn.size if i == axes[0] else 1 for i in range(a.ndim)])
        if _np.any(_np.broadcast_to(wn, a.shape).sum(axis=axes) == 0):
            raise ZeroDivisionError("average: weights sum to zero, can't be normalized")
    total = w.sum(axis=axes, keepdims=keepdims)
    avg = (a * w).sum(axis=axes, keepdims=keepdims) / total
    if not returned:
        return avg
    return avg, broadcast_to(total, avg.shape).astype(avg.dtype)
