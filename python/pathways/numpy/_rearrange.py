"""Ops that cut values into pieces or build them from pieces of themselves: `split`,
`array_split`, `hstack`, `vstack`, `tile`, `repeat`, `roll`, `pad`, `diff`.

All are static rearrangements (slices, concatenations, broadcasts, gathers
at constant indices), so their gradients come from those ops' rules.
"""

from __future__ import annotations

from typing import Any

import numpy as _np

from pathways import _checks
from pathways._trace_state import _TracerBase
from pathways._tracer import Tracer, bind
from pathways.numpy._common import _axis, _operand, _trace_of
from pathways.numpy._indexing import take
from pathways.numpy._shapes import broadcast_to, concatenate, ravel, reshape

__all__ = ["split", "array_split", "hstack", "vstack", "tile", "repeat", "roll", "pad", "diff"]


def _slice(x: Tracer, axis: int, start: int, stop: int) -> Tracer:
    """Elements `start:stop` (in range, start <= stop) of `x` along `axis`."""
    begin = [0] * x.ndim
    limit = list(x.shape)
    begin[axis], limit[axis] = start, stop
    return bind(x._trace, "slice", (x,), start=begin, limit=limit, step=[1] * x.ndim)


def _pieces(name: str, x: Tracer, indices_or_sections: Any, axis: Any, equal: bool) -> list:
    ax = _axis(name, "axis", axis, x.ndim, x.shape)
    n = x.shape[ax]
    if isinstance(indices_or_sections, Tracer):
        raise TypeError(
            f"{name}: indices_or_sections must be known when tracing (an int or a sequence "
            f"of ints), got a traced value {indices_or_sections.aval}"
        )
    sections = None
    if not isinstance(indices_or_sections, (list, tuple)) and _np.ndim(indices_or_sections) == 0:
        sections = _checks.integer(name, "indices_or_sections", indices_or_sections)
    if sections is not None:
        if sections <= 0:
            raise ValueError(f"{name}: number of sections must be larger than 0, got {sections}")
        if equal and n % sections:
            raise ValueError(
                f"{name}: array split does not result in an equal division ({n} along axis {ax} "
                f"into {sections} sections)"
            )
        each, extra = divmod(n, sections)
        bounds = [0]
        for k in range(sections):
            bounds.append(bounds[-1] + each + (1 if k < extra else 0))
    else:
        cuts = indices_or_sections
        if isinstance(cuts, _np.ndarray) and cuts.ndim == 1:
            cuts = list(cuts)
        cuts = _checks.ints(name, "indices_or_sections", cuts)
        # numpy slices x[a:b] between consecutive cuts, with Python's rules
        # for negative and out-of-range bounds (a piece may be empty).
        bounds = [0, *cuts, n]
    out = []
    for a, b in zip(bounds[:-1], bounds[1:]):
        start, stop, _ = slice(a, b).indices(n)
        out.append(_slice(x, ax, start, max(start, stop)))
    return out


def split(ary: Any, indices_or_sections: Any, axis: Any = 0) -> Any:
    """`numpy.split`: a list of pieces of `ary` along `axis`.

    `indices_or_sections` is a number of equal sections (it must divide the
    axis) or the indices where cuts fall, as numpy. Both are static.

    Raises:
      ValueError: For sections that do not divide the axis, or are not positive.
      TypeError: For traced or non-integer indices.
    """
    trace = _trace_of("split", (ary,))
    if trace is None:
        return _np.split(ary, indices_or_sections, axis=axis)
    return _pieces("split", ary, indices_or_sections, axis, equal=True)


def array_split(ary: Any, indices_or_sections: Any, axis: Any = 0) -> Any:
    """`numpy.array_split`: as `split`, but a number of sections need not divide the
    axis: the first `n % sections` pieces are one element longer."""
    trace = _trace_of("array_split", (ary,))
    if trace is None:
        return _np.array_split(ary, indices_or_sections, axis=axis)
    return _pieces("array_split", ary, indices_or_sections, axis, equal=False)


def _operands(name: str, tup: Any) -> tuple:
    arrays = list(tup)
    if not arrays:
        raise ValueError(f"{name}: need at least one array to concatenate")
    trace = _trace_of(name, tuple(arrays))
    return trace, ([] if trace is None else [_operand(trace, x) for x in arrays])


def hstack(tup: Any) -> Any:
    """`numpy.hstack`: values joined along axis 1 (axis 0 for 1-d values; scalars become 1-d)."""
    trace, xs = _operands("hstack", tup)
    if trace is None:
        return _np.hstack(tup)
    xs = [reshape(x, (1,)) if x.ndim == 0 else x for x in xs]
    return concatenate(xs, axis=0 if xs[0].ndim == 1 else 1)


def vstack(tup: Any) -> Any:
    """`numpy.vstack`: values joined along axis 0, after making them at least 2-d
    (a 1-d value of length n is a row, (1, n))."""
    trace, xs = _operands("vstack", tup)
    if trace is None:
        return _np.vstack(tup)
    xs = [reshape(x, (1, x.size)) if x.ndim < 2 else x for x in xs]
    return concatenate(xs, axis=0)


def tile(A: Any, reps: Any) -> Any:  # noqa: N803 (numpy's name)
    """`numpy.tile`: `A` repeated `reps` times along each axis.

    With fewer reps than dimensions, the leading dimensions repeat once; with
    more, `A` gains leading size-1 dimensions, as numpy.
    """
    trace = _trace_of("tile", (A,))
    if trace is None:
        return _np.tile(A, reps)
    if isinstance(reps, _np.ndarray) and reps.ndim <= 1:
        reps = reps.tolist()
    counts = _checks.ints("tile", "reps", reps)
    if any(r < 0 for r in counts):
        raise ValueError(f"tile: reps must not be negative, got {tuple(counts)}")
    d = max(len(counts), A.ndim)
    counts = (1,) * (d - len(counts)) + tuple(counts)
    shape = (1,) * (d - A.ndim) + tuple(A.shape)
    # (1, s0, 1, s1, ...) broadcast to (r0, s0, r1, s1, ...), then each pair merged.
    x = reshape(A, [v for s in shape for v in (1, s)])
    x = broadcast_to(x, [v for r, s in zip(counts, shape) for v in (r, s)])
    return reshape(x, [r * s for r, s in zip(counts, shape)])


def repeat(a: Any, repeats: Any, axis: Any = None) -> Any:
    """`numpy.repeat`: each element of `a` repeated along `axis` (the flattened `a` if None).

    `repeats` is an int, or a sequence of ints, one per element along the
    axis (or one for all); it must be known when tracing (JAX asks for
    `total_repeat_length` otherwise).

    Raises:
      ValueError: For negative repeats, or a sequence of the wrong length.
      TypeError: For traced or non-integer repeats.
    """
    trace = _trace_of("repeat", (a,))
    if trace is None:
        return _np.repeat(a, repeats, axis=axis)
    if isinstance(repeats, Tracer) or (isinstance(repeats, (list, tuple)) and
                                       any(isinstance(r, _TracerBase) for r in repeats)):
        raise TypeError(
            f"repeat: repeats must be known when tracing (an int or a sequence of ints), got "
            f"traced values ({repeats!r})"
        )
    x = ravel(a) if axis is None else a
    if x.ndim == 0:  # numpy's: a scalar repeats as a 1-d value
        x = reshape(x, (1,))
    ax = 0 if axis is None else _axis("repeat", "axis", axis, x.ndim, x.shape)
    n = x.shape[ax]
    counts = _np.asarray(repeats)
    if counts.size == 0 or counts.dtype.kind == "b":
        counts = counts.astype(_np.int64)
    if counts.dtype.kind not in "iu" or counts.ndim > 1:
        raise TypeError(f"repeat: repeats must be an int or a sequence of ints, got {repeats!r}")
    if (counts < 0).any():
        raise ValueError(f"repeat: repeats may not contain negative values, got {repeats!r}")
    if counts.size == 1:
        r = int(counts.ravel()[0])
        # Each element gains an axis of r copies, merged into `ax`.
        y = reshape(x, list(x.shape[: ax + 1]) + [1] + list(x.shape[ax + 1 :]))
        y = broadcast_to(y, list(x.shape[: ax + 1]) + [r] + list(x.shape[ax + 1 :]))
        return reshape(y, list(x.shape[:ax]) + [n * r] + list(x.shape[ax + 1 :]))
    if counts.size != n:
        raise ValueError(
            f"repeat: repeats has {counts.size} entries for an axis of length {n} (axis {ax} of "
            f"{x.aval})"
        )
    return take(x, _np.repeat(_np.arange(n), counts), axis=ax)


def roll(a: Any, shift: Any, axis: Any = None) -> Any:
    """`numpy.roll`: elements shifted along `axis` (the flattened `a` if None), those
    leaving at one end coming back at the other. `shift` and `axis` may be
    tuples (broadcast against each other); shifts are static."""
    trace = _trace_of("roll", (a,))
    if trace is None:
        return _np.roll(a, shift, axis=axis)
    if isinstance(shift, Tracer):
        raise TypeError(f"roll: shift must be known when tracing, got a traced value {shift.aval}")
    if isinstance(shift, _np.ndarray) and shift.ndim <= 1:
        shift = shift.tolist()
    if isinstance(axis, _np.ndarray) and axis.ndim <= 1:
        axis = axis.tolist()
    shifts = _checks.ints("roll", "shift", shift)
    if axis is None:
        # The flattened value, rolled by every shift (numpy's: they add up).
        return reshape(roll(ravel(a), sum(shifts), 0), a.shape)
    axes = _checks.ints("roll", "axis", axis)
    if len(shifts) != len(axes) and 1 not in (len(shifts), len(axes)):
        raise ValueError(
            f"roll: shift {shift!r} and axis {axis!r} have lengths that do not broadcast"
        )
    pairs = zip(shifts * len(axes), axes) if len(shifts) == 1 else zip(
        shifts, axes * len(shifts) if len(axes) == 1 else axes)
    total: dict = {}
    for s, ax in pairs:
        k = _axis("roll", "axis", ax, a.ndim, a.shape)
        total[k] = total.get(k, 0) + s
    x = a
    for k, s in total.items():
        n = x.shape[k]
        if n == 0 or s % n == 0:
            continue
        s %= n
        x = concatenate([_slice(x, k, n - s, n), _slice(x, k, 0, n - s)], axis=k)
    return x


_PAD_MODES = ("constant", "edge", "reflect", "symmetric", "wrap")


def _pairs(name: str, param: str, value: Any, ndim: int) -> _np.ndarray:
    """numpy's per-axis (before, after) pairs, from a scalar, a pair, or one pair per axis.

    Raises:
      TypeError: Unless the values are numbers (integers for pad_width).
      ValueError: For any other shape.
    """
    try:
        arr = _np.asarray(value)
    except ValueError:  # ragged
        arr = None
    if arr is not None:
        kinds = "iu" if param == "pad_width" else "biuf"
        if arr.size and arr.dtype.kind not in kinds:
            what = "integers" if param == "pad_width" else "numbers"
            raise TypeError(f"{name}: {param} must be {what}, got {value!r}")
        try:
            return _np.broadcast_to(arr, (ndim, 2))
        except ValueError:
            pass
    raise ValueError(
        f"{name}: {param} must be a scalar, a (before, after) pair, or one pair per axis "
        f"({ndim} axes), got {value!r}"
    )


def pad(array: Any, pad_width: Any, mode: str = "constant", **kwargs: Any) -> Any:
    """`numpy.pad` for the modes "constant" (`constant_values`, a scalar or pairs),
    "edge", "reflect", "symmetric" and "wrap" (reflections of type "even").

    The widths are static: an int, a (before, after) pair, or one pair per axis.

    Raises:
      ValueError: For negative widths, another mode, or an argument the mode does not take.
      TypeError: For widths that are not integers.
    """
    trace = _trace_of("pad", (array,))
    if trace is None:
        return _np.pad(array, pad_width, mode=mode, **kwargs)
    x = array
    if mode not in _PAD_MODES:
        raise ValueError(f"pad: mode must be one of {', '.join(map(repr, _PAD_MODES))}, got {mode!r}")
    allowed = {"constant": {"constant_values"}, "reflect": {"reflect_type"},
               "symmetric": {"reflect_type"}}.get(mode, set())
    unknown = set(kwargs) - allowed
    if unknown:
        raise ValueError(f"pad: mode {mode!r} takes no argument {', '.join(sorted(unknown))}")
    if kwargs.get("reflect_type", "even") != "even":
        raise ValueError(f"pad: reflect_type must be 'even', got {kwargs['reflect_type']!r}")
    widths = _pairs("pad", "pad_width", pad_width, x.ndim)
    if (widths < 0).any():
        raise ValueError(f"pad: pad_width must not be negative, got {pad_width!r}")
    if mode == "constant":
        given = kwargs.get("constant_values", 0)
        if isinstance(given, Tracer):
            # A traced value (as JAX takes): a scalar, used on every side.
            given._check()
            if given.ndim != 0:
                raise TypeError(
                    f"pad: a traced constant_values must be a scalar, got {given.aval}"
                )
            values = [[given.astype(x.dtype)] * 2] * x.ndim
        else:
            values = _pairs("pad", "constant_values", given, x.ndim)

        def block(k: int, width: int, value: Any) -> Tracer:
            shape = list(x.shape)
            shape[k] = width
            if not isinstance(value, Tracer):
                value = trace.constant(_np.asarray(value).astype(x.dtype), None)
            return broadcast_to(value, shape)

        for k in range(x.ndim):
            before, after = int(widths[k][0]), int(widths[k][1])
            if before or after:
                parts = [block(k, before, values[k][0])] if before else []
                parts.append(x)
                if after:
                    parts.append(block(k, after, values[k][1]))
                x = concatenate(parts, axis=k)
        return x
    for k in range(x.ndim):
        before, after = int(widths[k][0]), int(widths[k][1])
        if before == 0 and after == 0:
            continue
        n = x.shape[k]
        if n == 0:
            raise ValueError(f"pad: can't extend empty axis {k} of {x.aval} using mode {mode!r}")
        # The other modes take elements of x itself: numpy's own padding of
        # the positions 0..n-1 says which.
        x = take(x, _np.pad(_np.arange(n), (before, after), mode=mode), axis=k)
    return x



def diff(a: Any, n: int = 1, axis: int = -1, prepend: Any = None, append: Any = None) -> Any:
    """`numpy.diff`: the `n`-th differences along `axis` (`prepend` and `append`, scalars
    or values, joined on first); bool differences are `!=`, as numpy's."""
    trace = _trace_of("diff", (a, prepend, append))
    if trace is None:
        kwargs = {k: v for k, v in (("prepend", prepend), ("append", append)) if v is not None}
        return _np.diff(a, n=n, axis=axis, **kwargs)
    n = _checks.integer("diff", "n", n)
    if n < 0:
        raise ValueError(f"diff: order must be non-negative, got {n}")
    x = _operand(trace, a)
    if x.ndim == 0:
        raise ValueError("diff: requires an input of at least one dimension")
    ax = _axis("diff", "axis", axis, x.ndim, x.shape)
    parts = []
    for side, v in (("prepend", prepend), ("append", append)):
        if v is None:
            continue
        v = _operand(trace, v)
        if v.ndim == 0:
            shape = list(x.shape)
            shape[ax] = 1
            v = broadcast_to(v, shape)
        elif v.ndim != x.ndim or any(d != e for i, (d, e) in enumerate(zip(v.shape, x.shape)) if i != ax):
            raise ValueError(
                f"diff: {side} {v.aval} must be a scalar or have the shape of a ({x.aval}) but "
                f"along axis {ax}"
            )
        parts.append((side, v))
    if parts:
        before = [v for side, v in parts if side == "prepend"]
        after = [v for side, v in parts if side == "append"]
        x = concatenate(before + [x] + after, axis=ax)
    for _ in range(n):
        m = x.shape[ax]
        if m == 0:
            break
        hi, lo = _slice(x, ax, 1, m), _slice(x, ax, 0, m - 1)
        x = hi != lo if x.dtype == _np.bool_ else hi - lo
    return x
