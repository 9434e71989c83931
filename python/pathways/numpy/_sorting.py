"""Running reductions and sorting: `cumsum`, `cumprod`, `sort`, `argsort`; and what
is read off sorted values: `median`, `quantile`, `percentile`.

Each records one op of the function IR (`cumulative`, or `sort` for the
positions, whose values are one `take`), so a call costs one pass (one sort
per row), and `pw.grad` differentiates it through the ops' rules.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as _np

from pathways import _checks
from pathways._trace_state import _SUPPORTED_DTYPE_NAMES, _SUPPORTED_DTYPES
from pathways._tracer import Tracer, bind
from pathways.numpy._common import _axis, _operand, _trace_of
from pathways.numpy._indexing import _gather_along_axis
from pathways.numpy._shapes import moveaxis, ravel, reshape, stack


def _cumulative(name: str, combiner: str, a: Any, axis: Any, dtype: Any, reverse: bool) -> Tracer:
    """`combiner` accumulated along `axis` (None: of `a` flattened) of traced `a`."""
    trace = _trace_of(name, (a,))
    x = _operand(trace, a)
    if dtype is not None:
        dt = _np.dtype(dtype)
        if dt not in _SUPPORTED_DTYPES:
            raise TypeError(f"{name}: dtype {dt} is not supported; supported dtypes: "
                            f"{_SUPPORTED_DTYPE_NAMES}")
        x = x.astype(dt)
    if axis is None:
        x = ravel(x)
        axis = 0
    elif x.ndim == 0:
        raise ValueError(f"{name}: axis {axis!r} is out of range for a zero-dimensional value")
    ax = _axis(name, "axis", axis, x.ndim, x.shape)
    return bind(trace, "cumulative", (x,), combiner=combiner, axis=ax, reverse=bool(reverse))


def cumsum(a: Any, axis: Any = None, dtype: Any = None) -> Any:
    """`numpy.cumsum`: running sums along `axis` (None: of `a` flattened).

    Inside a trace, dtypes follow JAX's (numpy's with int32 for its int64):
    bool and int32 sum in int32 (wrapping), floats in their own type, added
    in order as numpy does. `dtype` casts `a` first. Its gradient is the
    reverse running sum of the cotangent. On numpy arrays, numpy's.

    Raises:
      ValueError: For an axis out of range.
      TypeError: For a non-integer axis or an unsupported dtype.
    """
    if _trace_of("cumsum", (a,)) is None:
        return _np.cumsum(a, axis=axis, dtype=dtype)
    return _cumulative("cumsum", "add", a, axis, dtype, False)


def cumprod(a: Any, axis: Any = None, dtype: Any = None) -> Any:
    """`numpy.cumprod`: running products along `axis` (None: of `a` flattened).

    dtypes as `cumsum`'s (bool and int32 multiply in int32). The gradient is
    exact with zeros in `a` too (no division by them). On numpy arrays,
    numpy's.

    Raises:
      ValueError: For an axis out of range.
      TypeError: For a non-integer axis or an unsupported dtype.
    """
    if _trace_of("cumprod", (a,)) is None:
        return _np.cumprod(a, axis=axis, dtype=dtype)
    return _cumulative("cumprod", "mul", a, axis, dtype, False)


_SORT_KINDS = (None, "stable", "quicksort", "mergesort", "heapsort")


def _check_sort_args(name: str, kind: Any, order: Any) -> None:
    if kind not in _SORT_KINDS:
        raise ValueError(f"{name}: kind must be None, 'stable', 'quicksort', 'mergesort' or "
                         f"'heapsort', got {kind!r}")
    if order is not None:
        raise ValueError(f"{name}: order (structured arrays) is not supported; order must be None")


def _argsort_traced(name: str, trace: Any, x: Tracer, axis: Any, descending: bool) -> tuple:
    """(positions, values) of traced `x` sorted along `axis` (None: flattened)."""
    if axis is None:
        x = ravel(x)
        axis = -1
    if x.ndim == 0:
        raise ValueError(f"{name}: a zero-dimensional value has no axis to sort along; use "
                         "axis=None")
    ax = _axis(name, "axis", axis, x.ndim, x.shape)
    last = x.ndim - 1
    moved = x if ax == last else moveaxis(x, ax, last)
    positions = bind(trace, "sort", (moved,), descending=bool(descending))
    values = _gather_along_axis(trace, moved, positions, last, name) if moved.size else moved
    if ax != last:
        positions, values = moveaxis(positions, last, ax), moveaxis(values, last, ax)
    return positions, values


def _numpy_argsort(a: Any, axis: Any, descending: bool) -> _np.ndarray:
    """numpy's stable argsort; descending as JAX's: larger first, NaN first, ties in
    increasing position (a stable ascending sort of the reversed array, read backwards)."""
    a = _np.asarray(a)
    if not descending:
        return _np.argsort(a, axis=axis, kind="stable")
    if axis is None:
        a = a.ravel()
        axis = -1
    n = a.shape[axis]
    ascending = _np.argsort(_np.flip(a, axis), axis=axis, kind="stable")
    return _np.flip(n - 1 - ascending, axis)


def argsort(a: Any, axis: Any = -1, kind: Optional[str] = None, order: Any = None, *,
            stable: bool = True, descending: bool = False) -> Any:
    """`numpy.argsort` (and `jax.numpy.argsort`'s `stable` and `descending`).

    The int32 positions that sort `a` along `axis` (None: `a` flattened),
    always stably: equal elements keep increasing positions, in either
    direction. Floats sort as numpy's: -0.0 equal to 0.0, NaN after +inf
    (before it when `descending`), whatever its sign. `kind` is accepted for
    numpy's sake and changes nothing (the sort is stable, which every kind
    allows); `stable=False` likewise. Positions carry no gradient. On numpy
    arrays, numpy's stable argsort (int64 positions).

    Raises:
      ValueError: For an axis out of range, a zero-dimensional `a` with an
        axis, an unknown kind, or an `order`.
    """
    _check_sort_args("argsort", kind, order)
    trace = _trace_of("argsort", (a,))
    if trace is None:
        return _numpy_argsort(a, axis, descending)
    if axis is not None:
        axis = _checks.index("argsort", "axis", axis)
    return _argsort_traced("argsort", trace, _operand(trace, a), axis, descending)[0]


def sort(a: Any, axis: Any = -1, kind: Optional[str] = None, order: Any = None, *,
         stable: bool = True, descending: bool = False) -> Any:
    """`numpy.sort` (and `jax.numpy.sort`'s `stable` and `descending`): `a` sorted along
    `axis` (None: flattened).

    The order is `argsort`'s, and the values are `a`'s elements taken at its
    positions, so `pw.grad` sends each value's cotangent back to the
    position it came from. Any dtype. On numpy arrays, numpy's.

    Raises:
      ValueError: As `argsort`.
    """
    _check_sort_args("sort", kind, order)
    trace = _trace_of("sort", (a,))
    if trace is None:
        if descending:
            arr = _np.asarray(a)
            idx = _numpy_argsort(arr, axis, True)
            return _np.take_along_axis(arr.ravel() if axis is None else arr, idx,
                                       axis=-1 if axis is None else axis)
        return _np.sort(a, axis=axis, kind="stable")
    if axis is not None:
        axis = _checks.index("sort", "axis", axis)
    return _argsort_traced("sort", trace, _operand(trace, a), axis, descending)[1]


def _sorted_along_last(name: str, a: Any, axis: Any) -> tuple:
    """`a` (traced) with the axes of `axis` (None: all) flattened into the last and
    sorted along it, integers and bool in float64; and the shape the reduction
    keeps with keepdims.

    Raises:
      ValueError: For an axis out of range, or no elements to reduce over.
    """
    x = _operand(_trace_of(name, (a,)), a)
    axes = _checks.axes(name, "axis", axis)
    axes = tuple(range(x.ndim)) if axes is None else axes
    normalized = [_axis(name, "axis", ax, x.ndim, x.shape) for ax in axes]
    if len(set(normalized)) != len(normalized):
        raise ValueError(f"{name}: repeated axis in {axis!r}")
    axes = tuple(sorted(normalized))
    kept_dims = [1 if i in axes else d for i, d in enumerate(x.shape)]
    rest = [d for i, d in enumerate(x.shape) if i not in axes]
    count = int(_np.prod([x.shape[i] for i in axes], dtype=_np.int64))
    if count == 0:
        raise ValueError(f"{name}: there are no elements to reduce over ({x.aval}, axis {axis})")
    x = reshape(moveaxis(x, axes, tuple(range(len(rest), x.ndim))), rest + [count])
    if x.dtype == _np.bool_ or _np.dtype(x.dtype).kind in "iu":
        x = x.astype(_np.float64)
    return sort(x, axis=-1), kept_dims


def _at(s: Tracer, k: int) -> Tracer:
    return s[..., k]


def _nan_if_any(s: Tracer, out: Tracer) -> Tracer:
    """NaN where the sorted row `s` holds one (sorted last), as numpy's."""
    from pathways.numpy._elementwise import isnan, where

    return where(isnan(_at(s, s.shape[-1] - 1)), _np.nan, out)


def _static_q(name: str, q: Any) -> _np.ndarray:
    """`q` as a float64 array; TypeError naming it unless it is numbers known now."""
    if isinstance(q, Tracer):
        raise TypeError(f"{name}: q must be known when tracing, got a traced value {q.aval}")
    try:
        qs = _np.asarray(q, _np.float64)
    except (TypeError, ValueError):
        raise TypeError(f"{name}: q must be a number or an array of numbers, got {q!r}") from None
    return qs


def quantile(a: Any, q: Any, axis: Any = None, *, method: str = "linear",
             keepdims: bool = False) -> Any:
    """`numpy.quantile` with the "linear" method: the `q`-th quantiles (static, in
    [0, 1]) over `axis` (None: all; an int or a tuple), numpy's interpolation
    between the sorted elements around `q * (n - 1)`; NaN where a NaN is among
    them. `q`'s dimensions come first. Integers and bool compute in float64.

    Raises:
      ValueError: For q outside [0, 1], another method, or an empty axis.
      TypeError: For a traced `q`.
    """
    trace = _trace_of("quantile", (a,))
    if trace is None:
        return _np.quantile(a, q, axis=axis, method=method, keepdims=keepdims)
    if method != "linear":
        raise ValueError(f"quantile: only method='linear' is supported, got {method!r}")
    qs = _static_q("quantile", q)
    if _np.any((qs < 0) | (qs > 1)) or _np.any(_np.isnan(qs)):
        raise ValueError(f"quantile: q must be in the range [0, 1], got {q!r}")
    s, kept_dims = _sorted_along_last("quantile", a, axis)
    n = s.shape[-1]
    outs = []
    for qv in qs.ravel():
        # numpy's virtual index for "linear" (alpha = beta = 1), and its lerp.
        vi = n * qv + (1 + qv * (1 - 1 - 1)) - 1
        prev = int(_np.clip(_np.floor(vi), 0, n - 1))
        nxt = min(prev + 1, n - 1)
        gamma = float(_np.clip(vi - prev, 0, 1))
        lo, hi = _at(s, prev), _at(s, nxt)
        d = hi - lo
        out = hi - d * (1 - gamma) if gamma >= 0.5 else lo + d * gamma
        out = _nan_if_any(s, out)
        outs.append(reshape(out, kept_dims) if keepdims else out)
    if qs.ndim == 0:
        return outs[0]
    if not outs:  # no q: an empty result of q's shape, then the reduction's
        empty = _at(s, 0)[None][:0]
        return reshape(empty, list(qs.shape) + list(reshape(_at(s, 0), kept_dims).shape
                                                    if keepdims else _at(s, 0).shape))
    return reshape(stack(outs), list(qs.shape) + list(outs[0].shape))


def percentile(a: Any, q: Any, axis: Any = None, *, method: str = "linear",
               keepdims: bool = False) -> Any:
    """`numpy.percentile`: `quantile` of `q / 100`."""
    if _trace_of("percentile", (a,)) is None:
        return _np.percentile(a, q, axis=axis, method=method, keepdims=keepdims)
    qs = _static_q("percentile", q)
    if _np.any((qs < 0) | (qs > 100)) or _np.any(_np.isnan(qs)):
        raise ValueError(f"percentile: q must be in the range [0, 100], got {q!r}")
    return quantile(a, qs / 100 if qs.ndim else float(qs) / 100, axis, method=method,
                    keepdims=keepdims)


def median(a: Any, axis: Any = None, *, keepdims: bool = False) -> Any:
    """`numpy.median`: the middle element over `axis` (None: all; an int or a tuple), the
    mean of the two middle ones for an even count; NaN where a NaN is among
    them. Integers and bool compute in float64.

    Raises:
      ValueError: For an empty axis.
    """
    if _trace_of("median", (a,)) is None:
        return _np.median(a, axis=axis, keepdims=keepdims)
    s, kept_dims = _sorted_along_last("median", a, axis)
    n = s.shape[-1]
    mid = _at(s, n // 2)
    out = mid if n % 2 else (_at(s, n // 2 - 1) + mid) / 2
    out = _nan_if_any(s, out)
    return reshape(out, kept_dims) if keepdims else out
