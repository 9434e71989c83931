"""Shape ops: reshape, transpose and their relatives, broadcasting, joining, flipping.
"""

from __future__ import annotations

from typing import Any

import numpy as _np

from pathways import _checks
from pathways._tracer import bind
from pathways.numpy._common import _axis, _operand, _trace_of


def _resolve_shape(name: str, size: int, shape: tuple, old: tuple) -> list:
    """`shape` with a -1 entry (at most one) replaced so the sizes match."""
    unknown = [i for i, d in enumerate(shape) if d == -1]
    if len(unknown) > 1 or any(d < -1 for d in shape):
        raise ValueError(f"{name}: invalid shape {shape} (at most one -1, no other negatives)")
    known = int(_np.prod([d for d in shape if d != -1], dtype=_np.int64))
    out = list(shape)
    if unknown:
        if known == 0 or size % known:
            raise ValueError(f"{name}: cannot reshape array of shape {old} into shape {shape}")
        out[unknown[0]] = size // known
    if int(_np.prod(out, dtype=_np.int64)) != size:
        raise ValueError(f"{name}: cannot reshape array of shape {old} into shape {shape}")
    return out


def reshape(a: Any, shape: Any = None, *, newshape: Any = None) -> Any:
    """`numpy.reshape`: the same elements in row-major order, with a new shape (one -1 allowed)."""
    if shape is None:
        shape = newshape
    trace = _trace_of("reshape", (a,))
    if trace is None:
        return _np.reshape(a, shape)
    dims = _resolve_shape("reshape", a.size, _checks.ints("reshape", "shape", shape), a.shape)
    return bind(trace, "reshape", (a,), shape=dims)


def ravel(a: Any) -> Any:
    """`numpy.ravel`: the elements as a 1-d value, row-major."""
    return reshape(a, (-1,))


def transpose(a: Any, axes: Any = None) -> Any:
    """`numpy.transpose`: dimensions permuted (reversed when `axes` is None)."""
    trace = _trace_of("transpose", (a,))
    if trace is None:
        return _np.transpose(a, axes)
    perm = list(range(a.ndim))[::-1] if axes is None else list(_checks.ints("transpose", "axes", axes))
    return bind(trace, "transpose", (a,), perm=perm)


def swapaxes(a: Any, axis1: int, axis2: int) -> Any:
    """`numpy.swapaxes`: dimensions `axis1` and `axis2` exchanged."""
    if _trace_of("swapaxes", (a,)) is None:
        return _np.swapaxes(a, axis1, axis2)
    i = _axis("swapaxes", "axis1", axis1, a.ndim, a.shape)
    j = _axis("swapaxes", "axis2", axis2, a.ndim, a.shape)
    perm = list(range(a.ndim))
    perm[i], perm[j] = perm[j], perm[i]
    return transpose(a, perm)


def moveaxis(a: Any, source: Any, destination: Any) -> Any:
    """`numpy.moveaxis`: dimensions `source` (an int or a sequence of them) moved to the
    positions `destination` (as many), the others keeping their order.

    Raises:
      ValueError: For an axis out of range, a repeated one, or sequences of two lengths.
    """
    if _trace_of("moveaxis", (a,)) is None:
        return _np.moveaxis(a, source, destination)
    sources = source if isinstance(source, (tuple, list)) else [source]
    destinations = destination if isinstance(destination, (tuple, list)) else [destination]
    s = [_axis("moveaxis", "source", x, a.ndim, a.shape) for x in sources]
    d = [_axis("moveaxis", "destination", x, a.ndim, a.shape) for x in destinations]
    if len(s) != len(d):
        raise ValueError(
            f"moveaxis: source {source!r} and destination {destination!r} must have the same "
            "number of elements"
        )
    for name, axes in (("source", s), ("destination", d)):
        if len(set(axes)) != len(axes):
            raise ValueError(f"moveaxis: repeated axis in {name} {axes}")
    perm = [i for i in range(a.ndim) if i not in s]
    for dest, src in sorted(zip(d, s)):
        perm.insert(dest, src)
    return transpose(a, perm)


def broadcast_to(a: Any, shape: Any) -> Any:
    """`numpy.broadcast_to`: `a` stretched to `shape` by numpy's broadcasting rules."""
    trace = _trace_of("broadcast_to", (a,))
    if trace is None:
        return _np.broadcast_to(a, shape)
    return bind(trace, "broadcast_to", (a,), shape=list(_checks.ints("broadcast_to", "shape", shape)))


def expand_dims(a: Any, axis: Any) -> Any:
    """`numpy.expand_dims`: size-1 dimensions inserted at `axis` (an int or tuple)."""
    if _trace_of("expand_dims", (a,)) is None:
        return _np.expand_dims(a, axis)
    axes = _checks.ints("expand_dims", "axis", axis)
    out_ndim = a.ndim + len(axes)
    pos = sorted(_axis("expand_dims", "axis", x, out_ndim, a.shape) for x in axes)
    if len(set(pos)) != len(pos):
        raise ValueError(f"expand_dims: repeated axis in {axis}")
    shape = list(a.shape)
    for p in pos:
        shape.insert(p, 1)
    return reshape(a, shape)


def squeeze(a: Any, axis: Any = None) -> Any:
    """`numpy.squeeze`: size-1 dimensions removed (all of them, or those of `axis`)."""
    if _trace_of("squeeze", (a,)) is None:
        return _np.squeeze(a, axis)
    axes = _checks.axes("squeeze", "axis", axis)
    if axes is None:
        drop = {i for i, d in enumerate(a.shape) if d == 1}
    else:
        drop = {_axis("squeeze", "axis", x, a.ndim, a.shape) for x in axes}
        for i in drop:
            if a.shape[i] != 1:
                raise ValueError(
                    f"squeeze: cannot select an axis to squeeze out which has size not equal "
                    f"to one (axis {i} of {a.aval})"
                )
    return reshape(a, [d for i, d in enumerate(a.shape) if i not in drop])


def concatenate(arrays: Any, axis: Any = 0) -> Any:
    """`numpy.concatenate`: values joined along an existing axis (dtypes promote);
    `axis=None` joins them flattened."""
    arrays = list(arrays)
    trace = _trace_of("concatenate", tuple(arrays))
    if trace is None:
        return _np.concatenate(arrays, axis=axis)
    xs = [_operand(trace, x) for x in arrays]
    if axis is None:
        xs = [reshape(x, (int(_np.prod(x.shape)),)) if x.ndim != 1 else x for x in xs]
        axis = 0
    return bind(trace, "concatenate", xs, axis=_checks.index("concatenate", "axis", axis))


def stack(arrays: Any, axis: int = 0) -> Any:
    """`numpy.stack`: values of one shape joined along a new axis."""
    arrays = list(arrays)
    trace = _trace_of("stack", tuple(arrays))
    if trace is None:
        return _np.stack(arrays, axis=axis)
    xs = [_operand(trace, x) for x in arrays]
    shapes = {x.shape for x in xs}
    if len(shapes) != 1:
        raise ValueError(
            "stack: all input arrays must have the same shape, got "
            + ", ".join(x.aval for x in xs)
        )
    a = _axis("stack", "axis", axis, xs[0].ndim + 1, xs[0].shape)
    return concatenate([expand_dims(x, a) for x in xs], axis=a)


def flip(m: Any, axis: Any = None) -> Any:
    """`numpy.flip`: elements reversed along `axis` (an int, tuple, or None for all)."""
    trace = _trace_of("flip", (m,))
    if trace is None:
        return _np.flip(m, axis)
    axes = _checks.axes("flip", "axis", axis)
    axes = list(range(m.ndim)) if axes is None else list(axes)
    return bind(trace, "rev", (m,), axes=axes)

