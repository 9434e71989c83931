"""Indexing: `take` and `take_along_axis` (`x[index]` of a traced value is in pathways.numpy._at).
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as _np

from pathways._trace_state import _is_float
from pathways._tracer import Tracer, bind
from pathways.numpy._common import _axis, _operand, _trace_of
from pathways.numpy._elementwise import where
from pathways.numpy._shapes import ravel, reshape


def _int_indices(name: str, indices: Any) -> Any:
    """Indices as an int32 traced value, or as a numpy integer array if they are constants."""
    if isinstance(indices, Tracer):
        indices._check()
        if indices.dtype != _np.int32:
            raise TypeError(f"{name}: indices must be int32, got {indices.aval}")
        return indices
    arr = _np.asarray(indices)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{name}: indices must be integers, got dtype {arr.dtype}")
    return arr


def _checked_indices(name: str, arr: Any, dim: int) -> Any:
    """Constant indices into a dimension of size `dim`, negative ones counted from the end.

    Raises:
      IndexError: For an index out of range, as numpy.
    """
    if arr.size and (arr.min() < -dim or arr.max() >= dim):
        bad = arr[(arr < -dim) | (arr >= dim)].flat[0]
        raise IndexError(f"{name}: index {bad} is out of bounds for axis with size {dim}")
    return _np.where(arr < 0, arr + dim, arr)


def _from_end(indices: Any, dim: int) -> Any:
    """Indices with `dim` added to the negative ones, which count from the end."""
    return where(indices < 0, indices + dim, indices)


def _wrap_indices(indices: Any, dim: int) -> Any:
    """Traced int32 `indices` modulo `dim` (> 0), in [0, dim) as numpy's mode="wrap".

    The IR has no integer remainder: the quotient is truncated from a float64
    division, which can be one off for huge dims, so the remainder is brought
    into range from either side.
    """
    r = indices - (indices / dim).astype(_np.int32) * dim
    r = where(r < 0, r + dim, r)
    return where(r >= dim, r - dim, r)


_TAKE_MODES = (None, "fill", "clip", "raise", "wrap")


def _fill_value(dtype: Any, fill_value: Any) -> Any:
    """`fill_value` in `dtype`, or JAX's default: NaN, the most negative int32, the largest
    uint32, or True."""
    dt = _np.dtype(dtype)
    if fill_value is None:
        fill_value = _np.nan if _is_float(dt) else {
            "i": _np.iinfo(_np.int32).min, "u": _np.iinfo(_np.uint32).max, "b": True}[dt.kind]
    return _np.asarray(fill_value).astype(dt)


def take(a: Any, indices: Any, axis: Any = None, mode: Optional[str] = None,
         fill_value: Any = None) -> Any:
    """`numpy.take`: elements of `a` at `indices` along `axis` (None: of the flattened `a`).

    Out-of-range traced indices follow `mode`, as in `jax.numpy.take` (a
    device cannot raise):
      - None or "fill" (the default): negative indices count from the end,
        and indices still out of range give `fill_value` (default NaN for
        floats, the most negative int32, the largest uint32, True for bool);
      - "clip": indices are clipped into range (negative ones to 0, as
        numpy's "clip");
      - "wrap": indices are taken modulo the axis size, as numpy's "wrap".
    Constant indices (and numpy arrays outside a trace) follow numpy's modes:
    None or "raise" checks them (at trace time), "clip" and "wrap" as numpy;
    "fill" works there too.

    Raises:
      TypeError: For indices that are not integers (traced ones: not int32).
      IndexError: For constant indices out of range, with mode None or "raise".
      ValueError: For an unknown mode.
      NotImplementedError: For traced indices with mode "raise" (as JAX).
    """
    if mode not in _TAKE_MODES:
        raise ValueError(
            f"take: mode must be one of None, 'fill', 'clip', 'raise', 'wrap', got {mode!r}"
        )
    trace = _trace_of("take", (a, indices))
    if trace is None and mode != "fill":
        return _np.take(a, indices, axis=axis, mode="raise" if mode is None else mode)
    a = _np.asarray(a) if trace is None else _operand(trace, a)
    if axis is None:
        a = ravel(a)
        axis = 0
    if a.ndim == 0:
        raise ValueError(f"take: cannot index into a zero-dimensional value (shape {a.shape})")
    ax = _axis("take", "axis", axis, a.ndim, a.shape)
    n = a.shape[ax]
    idx = _int_indices("take", indices)
    if trace is None:
        gather = lambda i: _np.take(a, i, axis=ax, mode="clip")  # noqa: E731
    else:
        gather = lambda i: bind(trace, "take", (a, i), axis=ax)  # noqa: E731 (clips)
        if not isinstance(idx, Tracer):
            if mode in (None, "raise"):
                idx = _checked_indices("take", idx, n)
            elif mode == "clip":
                idx = _np.clip(idx, 0, n - 1)
            elif mode == "wrap" and n:
                idx = _np.mod(idx, n)
            idx = trace.constant(idx.astype(_np.int32), None)
            if mode != "fill":
                return gather(idx)
        elif mode == "raise":
            # As jax.numpy.take: an index known only at run time cannot raise.
            raise NotImplementedError(
                f"take: mode='raise' with traced indices ({idx.aval}) is not supported (nor in "
                "jax.numpy.take); traced indices take mode='fill' (the default), 'clip' or 'wrap'"
            )
        elif mode == "wrap" and n:
            return gather(_wrap_indices(idx, n))
        if mode == "clip":
            return gather(idx)
    idx = _from_end(idx, n)
    inside = reshape((idx >= 0) & (idx < n), [1] * ax + list(idx.shape) + [1] * (a.ndim - ax - 1))
    return where(inside, gather(idx), _fill_value(a.dtype, fill_value))


# --- Along an axis: take_along_axis, and sort's values ------------------------------

_INT32_MAX = 2**31 - 1


def _along_axis_positions(trace: Any, shape: tuple, indices: Tracer, axis: int,
                          name: str = "take_along_axis") -> Tracer:
    """The positions, in `shape` flattened row-major, of the elements at `indices` along `axis`.

    `indices` (int32) has `shape`'s rank and dims but at `axis`, and values in
    [0, shape[axis]). Element r of the result is
    `(outer(r) * shape[axis] + indices[r]) * inner + inner_index(r)`: the
    row's start, a constant broadcast along `axis` (shape's size over
    shape[axis] elements), plus the index times the row stride, so that one
    `take` of the flattened array gathers along the axis (and its gradient is
    one scatter).

    Raises:
      ValueError: If `shape` has more elements than int32 positions reach.
    """
    size = int(_np.prod(shape, dtype=_np.int64))
    if size > _INT32_MAX:
        raise ValueError(
            f"{name}: an array of shape {tuple(shape)} has more than 2**31 - 1 "
            "elements, beyond the int32 positions it is gathered at"
        )
    lead = [int(d) for d in indices.shape[:axis]]
    trail = [int(d) for d in indices.shape[axis + 1 :]]
    n = int(shape[axis])
    inner = int(_np.prod(shape[axis + 1 :], dtype=_np.int64))
    pos = indices if inner == 1 else indices * inner
    outer = _np.arange(int(_np.prod(lead, dtype=_np.int64)), dtype=_np.int64)
    base = (outer.reshape(lead + [1] + [1] * len(trail)) * (n * inner)
            + _np.arange(inner, dtype=_np.int64).reshape([1] * (len(lead) + 1) + trail))
    if base.size > 1 or (base.size == 1 and base.flat[0] != 0):
        pos = pos + trace.constant(base.astype(_np.int32), None)
    return pos


def _gather_along_axis(trace: Any, arr: Tracer, indices: Tracer, axis: int,
                       name: str = "take_along_axis") -> Tracer:
    """`arr`'s elements at `indices` along `axis` (indices in range, of arr's dims but at `axis`)."""
    pos = _along_axis_positions(trace, arr.shape, indices, axis, name)
    return bind(trace, "take", (reshape(arr, (arr.size,)), pos), axis=0)


def _scatter_add_along_axis(trace: Any, shape: tuple, indices: Tracer, updates: Tracer,
                            axis: int) -> Tracer:
    """Zeros of `shape` with `updates` added at `indices` along `axis` (the transpose of
    `_gather_along_axis`)."""
    pos = _along_axis_positions(trace, shape, indices, axis, "gradient")
    size = int(_np.prod(shape, dtype=_np.int64))
    zero = trace.constant(_np.zeros((), updates.dtype), None)
    flat = bind(trace, "scatter", (zero, pos, updates), combiner="add", axis=0, size=size)
    return reshape(flat, shape)


_ALONG_AXIS_MODES = (None, "fill", "clip")


def take_along_axis(arr: Any, indices: Any, axis: Any = -1, mode: Optional[str] = None,
                    fill_value: Any = None) -> Any:
    """`numpy.take_along_axis`: `arr`'s elements at `indices` along `axis`.

    `indices` has `arr`'s rank; off `axis` its dims and `arr`'s broadcast
    against each other (numpy's rule), and the result has the broadcast
    dims, with `indices`' length at `axis`. `axis=None` takes from `arr`
    flattened (then `indices` is 1-d).

    Traced indices follow `jax.numpy.take_along_axis`: negative ones count
    from the end; out-of-range ones give `fill_value` (mode None or "fill";
    default NaN, the most negative int32, or True) or are clipped into range
    (mode "clip"). Constant indices (numpy arrays) are checked at trace time
    as numpy does, and on numpy arrays outside a trace this is numpy's.
    Gradients flow to `arr` (a scatter of the cotangent to the positions).

    Raises:
      TypeError: For indices that are not integers (traced ones: not int32).
      IndexError: For constant indices out of range (mode None).
      ValueError: For ranks or shapes that do not match, a bad axis or mode.
    """
    if mode not in _ALONG_AXIS_MODES:
        raise ValueError(f"take_along_axis: mode must be None, 'fill' or 'clip', got {mode!r}")
    trace = _trace_of("take_along_axis", (arr, indices))
    if trace is None:
        if mode == "clip":
            a = _np.asarray(arr)
            ax = _np.ndim(indices) - 1 if axis is None else axis
            n = a.size if axis is None else a.shape[ax]
            i = _np.asarray(indices)
            return _np.take_along_axis(a, _np.clip(_np.where(i < 0, i + n, i), 0, n - 1), axis)
        return _np.take_along_axis(arr, indices, axis)
    a = _operand(trace, arr)
    if axis is None:
        a = ravel(a)
        axis = 0
    idx = _int_indices("take_along_axis", indices)
    if idx.ndim != a.ndim:
        raise ValueError(
            f"take_along_axis: indices of shape {tuple(idx.shape)} must have the rank of the "
            f"array, {a.ndim} (shape {a.shape})"
        )
    if a.ndim == 0:
        raise ValueError("take_along_axis: cannot index into a zero-dimensional value")
    ax = _axis("take_along_axis", "axis", axis, a.ndim, a.shape)
    out_shape = []
    for d, (m, k) in enumerate(zip(a.shape, idx.shape)):
        if d == ax:
            out_shape.append(int(k))
        elif m == k or m == 1 or k == 1:
            out_shape.append(int(max(m, k)) if m and k else 0)
        else:
            raise ValueError(
                f"take_along_axis: indices of shape {tuple(idx.shape)} do not broadcast against "
                f"the array's shape {a.shape} off axis {ax}"
            )
    n = a.shape[ax]
    if n == 0 and 0 not in out_shape:
        raise IndexError(f"take_along_axis: cannot take from empty axis {ax} of shape {a.shape}")
    arr_shape = [n if d == ax else s for d, s in enumerate(out_shape)]
    if tuple(arr_shape) != a.shape:
        a = bind(trace, "broadcast_to", (a,), shape=arr_shape)
    inside = None
    if isinstance(idx, Tracer):
        if tuple(out_shape) != idx.shape:
            idx = bind(trace, "broadcast_to", (idx,), shape=out_shape)
        idx = _from_end(idx, n)
        if mode == "clip":
            idx = where(idx < 0, 0, where(idx >= n, n - 1, idx))
        else:
            inside = (idx >= 0) & (idx < n)
    else:
        if mode == "clip":
            idx = _np.clip(_np.where(idx < 0, idx + n, idx), 0, max(n - 1, 0))
        else:
            idx = _checked_indices("take_along_axis", idx, n)
        idx = trace.constant(_np.broadcast_to(idx, out_shape).astype(_np.int32), None)
    if 0 in out_shape:
        return bind(trace, "broadcast_to", (trace.constant(_np.zeros((), a.dtype), None),),
                    shape=out_shape)
    out = _gather_along_axis(trace, a, idx, ax)
    if inside is None:
        return out
    return where(inside, out, _fill_value(a.dtype, fill_value))
