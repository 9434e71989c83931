"""Indexing: `take`, and `x[index]` of a traced value (`Tracer.__getitem__`).
"""

from __future__ import annotations

import builtins as _builtins
import operator as _operator
from typing import Any, Optional

import numpy as _np

from pathways._tracer import Tracer, bind
from pathways.numpy._common import _axis, _operand, _trace_of
from pathways.numpy._elementwise import where
from pathways.numpy._shapes import ravel, reshape, transpose


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
        fill_value = {"f": _np.nan, "i": _np.iinfo(_np.int32).min, "u": _np.iinfo(_np.uint32).max,
                      "b": True}[dt.kind]
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


def _getitem(x: Tracer, index: Any) -> Tracer:
    """`x[index]` for static indices: ints, slices (any step), None, Ellipsis, and at
    most one integer array or int32 traced value (a `take` along its dimension).

    The result's shape follows numpy: with an array in the index, the ints are
    advanced indices too, and if the advanced indices are not side by side (a
    slice, None or '...' between them) the array's dimensions come first;
    otherwise they stand where the array is.
    """
    trace = x._check()
    idx = index if isinstance(index, tuple) else (index,)
    is_array = lambda e: isinstance(e, (Tracer, _np.ndarray, list))  # noqa: E731
    if _builtins.sum(1 for e in idx if e is Ellipsis) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    for e in idx:
        if isinstance(e, (bool, _np.bool_)):
            raise IndexError(
                f"indexing {x.aval} with a boolean scalar ({e!r}): numpy takes it as a mask "
                "adding a dimension, which is not supported; use None or pw.numpy.where"
            )
    advanced_at = [
        k for k, e in enumerate(idx)
        if is_array(e) or (e is not None and e is not Ellipsis and not isinstance(e, slice))
    ]
    arrays_first = (
        _builtins.any(is_array(e) for e in idx)
        and advanced_at[-1] - advanced_at[0] + 1 != len(advanced_at)
    )
    consumed = _builtins.sum(1 for e in idx if e is not None and e is not Ellipsis)
    if consumed > x.ndim:
        raise IndexError(
            f"too many indices for traced value {x.aval}: {consumed} indices for {x.ndim} "
            "dimensions"
        )
    if Ellipsis in [e for e in idx if not is_array(e)]:
        k = next(i for i, e in enumerate(idx) if not is_array(e) and e is Ellipsis)
        idx = idx[:k] + (slice(None),) * (x.ndim - consumed) + idx[k + 1 :]
    else:
        idx = idx + (slice(None),) * (x.ndim - consumed)
    start, limit, step, rev = [], [], [], []
    final: list = []  # the result shape, built entry by entry
    advanced = None  # (dim, indices)
    d = 0
    for e in idx:
        if e is None:
            final.append(1)
            continue
        n = x.shape[d]
        if is_array(e):
            if advanced is not None:
                raise IndexError(
                    f"indexing {x.aval}: at most one integer array index is supported"
                )
            mask_dtype = e.dtype if isinstance(e, Tracer) else _np.asarray(e).dtype
            if mask_dtype == _np.bool_:
                raise IndexError(
                    f"indexing {x.aval} with a boolean mask: the result's shape would depend "
                    "on the data; use pw.numpy.where instead"
                )
            advanced = (d, e)
            start.append(0), limit.append(n), step.append(1)
            final.append(("take", d))
        elif isinstance(e, slice):
            b, s_end, st = e.indices(n)
            count = len(range(b, s_end, st))
            if count == 0:
                start.append(0), limit.append(0), step.append(1)
            elif st > 0:
                start.append(b), limit.append(b + (count - 1) * st + 1), step.append(st)
            else:
                low = b + (count - 1) * st
                start.append(low), limit.append(b + 1), step.append(-st)
                rev.append(d)
            final.append(count)
        else:
            try:
                i = _operator.index(e)
            except TypeError:
                raise IndexError(
                    f"indexing {x.aval}: only integers, slices, None, '...' and integer "
                    f"arrays are valid indices, got {e!r}"
                ) from None
            if not -n <= i < n:
                raise IndexError(f"index {i} is out of bounds for axis {d} with size {n}")
            i = i + n if i < 0 else i
            start.append(i), limit.append(i + 1), step.append(1)
        d += 1
    y = bind(trace, "slice", (x,), start=start, limit=limit, step=step)
    if rev:
        y = bind(trace, "rev", (y,), axes=rev)
    shape: list = []
    if advanced is not None:
        dim, e = advanced
        # Constant indices are checked; traced ones count from the end when negative and
        # are clipped into range by the kernel (as JAX's indexing clamps).
        ind = _int_indices("indexing", e)
        if isinstance(ind, Tracer):
            ind = _from_end(ind, x.shape[dim])
        else:
            ind = _checked_indices("indexing", ind, x.shape[dim])
            ind = trace.constant(ind.astype(_np.int32), None)
        y = bind(trace, "take", (y, ind), axis=dim)
        if arrays_first:
            k = ind.ndim
            if dim and k:
                y = transpose(y, [*range(dim, dim + k), *range(dim), *range(dim + k, y.ndim)])
            shape = list(ind.shape) + [f for f in final if not isinstance(f, tuple)]
        else:
            for f in final:
                shape.extend(ind.shape if isinstance(f, tuple) else [f])
    else:
        shape = final
    return reshape(y, shape)

