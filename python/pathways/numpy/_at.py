"""`x.at[index]`: JAX's out-of-place indexed updates of a traced value; and `x[index]`.

`x.at[index].set(v)` (and `.add .subtract .multiply .mul .min .max .get`)
returns a new value: `x` with `v`, broadcast to the shape of `x[index]`,
combined into the indexed elements. The index is any index `x[index]`
takes and more: ints, slices, None, Ellipsis, integer arrays (several, as
numpy broadcasts them) and constant boolean masks, and int32 traced values.

One integer index amid full slices (`x.at[i]`, `x.at[:, i]`, the common
case) is one `scatter` op along its axis (one `take` for `.get`). Every other
form becomes the positions, in `x` flattened, of the
indexed elements (an int32 array of the shape of `x[index]`), and one
`scatter` op of the function IR (one `take` for `.get`). Positions of
constant indices are computed with numpy at trace time, from per-dimension
coordinates (broadcast views: no array of x's size is made), so numpy's own
indexing rules place every dimension. A traced index adds its coordinate
times its dimension's stride, gathered to the result's shape by constant
positions found the same way.

`x[index]` (`Tracer.__getitem__`, `_getitem`) is a slice and at most one `take`;
the other indices (several integer arrays, boolean masks) are `x.at[index].get()`.
"""

from __future__ import annotations

import builtins as _builtins
import operator as _operator
from typing import Any, Optional

import numpy as _np

from pathways._trace_state import TracerError, _TracerBase
from pathways._tracer import Tracer, bind
from pathways.numpy._common import _broadcasts_to
from pathways.numpy._elementwise import where
from pathways.numpy._indexing import (
    _INT32_MAX,
    _checked_indices,
    _fill_value,
    _from_end,
    _int_indices,
    take,
)
from pathways.numpy._shapes import broadcast_to, reshape, transpose

_UPDATE_MODES = (None, "drop", "fill", "clip", "promise_in_bounds")


def _consumed(entry: Any) -> int:
    """How many dimensions of the indexed array an index entry (not Ellipsis) consumes."""
    if entry is None:
        return 0
    if isinstance(entry, Tracer):
        return 1
    if isinstance(entry, (_np.ndarray, list, tuple)) and _np.asarray(entry).dtype == _np.bool_:
        return _np.asarray(entry).ndim
    return 1


class _Positions:
    """Where `x[index]` lies in `x` flattened.

    Attributes:
      shape: The shape of `x[index]`.
      static: int64 numpy positions of the constant part (all of it if no index is traced).
      traced: (dim, int32 traced index, constant int64 gather positions of shape `shape`)
        per traced index entry.
    """

    __slots__ = ("shape", "static", "traced")

    def __init__(self, x: Tracer, index: Any, name: str):
        idx = index if isinstance(index, tuple) else (index,)
        for e in idx:
            if isinstance(e, _TracerBase) and not isinstance(e, Tracer):
                raise TracerError(f"{name}: a traced program value ({e.aval}) cannot index a traced "
                                  "value; pass it to the pmap'd function as an argument")
            if isinstance(e, Tracer):
                e._check()
                if e.dtype == _np.bool_:
                    raise IndexError(
                        f"{name}: a traced boolean mask ({e.aval}) selects a number of elements "
                        "known only at run time; use pw.numpy.where, or a constant numpy mask"
                    )
                if e.dtype != _np.int32:
                    raise TypeError(f"{name}: a traced index must be int32, got {e.aval}")
        if sum(1 for e in idx if e is Ellipsis) > 1:
            raise IndexError(f"{name}: an index can only have a single ellipsis ('...')")
        used = sum(_consumed(e) for e in idx if e is not Ellipsis)
        if used > x.ndim:
            raise IndexError(f"{name}: too many indices for traced value {x.aval}: {used} indices "
                             f"for {x.ndim} dimensions")
        if Ellipsis not in [e for e in idx if not isinstance(e, (Tracer, _np.ndarray, list))]:
            idx = idx + (Ellipsis,)
        # The dimension each entry starts at.
        dims: list = []
        d = 0
        for e in idx:
            dims.append(d)
            if e is Ellipsis and not isinstance(e, (Tracer, _np.ndarray, list)):
                d += x.ndim - used
            else:
                d += _consumed(e)
        traced = [(k, e) for k, e in enumerate(idx) if isinstance(e, Tracer)]
        for k, e in traced:
            if x.shape[dims[k]] == 0:
                raise IndexError(f"{name}: cannot index empty axis {dims[k]} of {x.aval} with a "
                                 "traced index")
        # Constant coordinates: traced entries read as index 0.
        base = tuple(_np.zeros(e.shape, _np.intp) if isinstance(e, Tracer) else e for e in idx)
        strides = [int(_np.prod(x.shape[a + 1 :], dtype=_np.int64)) for a in range(x.ndim)]

        def coordinate(a: int, size: int, entries: tuple) -> _np.ndarray:
            shape = list(x.shape)
            shape[a] = size
            view = _np.broadcast_to(
                _np.arange(size, dtype=_np.int64).reshape([size if b == a else 1
                                                           for b in range(x.ndim)]), shape)
            return _np.asarray(view[entries])

        if x.ndim == 0:
            self.static = _np.asarray(_np.zeros((), _np.int64)[base])
        else:
            self.static = sum(coordinate(a, x.shape[a], base) * strides[a] for a in range(x.ndim))
        self.shape = tuple(self.static.shape)
        # A traced entry's element read at each result element: its own
        # positions 0..size-1 in its place, through a coordinate array whose
        # axis is that long.
        self.traced = []
        for k, e in traced:
            entries = base[:k] + (_np.arange(e.size, dtype=_np.intp).reshape(e.shape),) + base[k + 1 :]
            self.traced.append((dims[k], e, coordinate(dims[k], max(e.size, 1), entries)))
        if x.size > _INT32_MAX:
            raise ValueError(f"{name}: {x.aval} has more than 2**31 - 1 elements, beyond the int32 "
                             "positions it is updated at")

    def resolve(self, x: Tracer, out_of_range: str) -> Tracer:
        """The int32 positions, of shape `self.shape` (a traced value, or a constant).

        Negative traced indices count from the end. Indices still out of range
        are, by `out_of_range`: "clip"ped into range; "drop"ped (their positions
        are -1, which a scatter skips); or "mask"ed, returned as a bool traced
        value beside positions clipped into range (a gather then reads them):
        `(positions, valid)`.
        """
        trace = x._trace
        # A zero constant part (a traced index on the first axis) needs no add.
        pos = None if self.traced and not self.static.any() else trace.constant(
            self.static.astype(_np.int32), None)
        valid = None
        for dim, e, gather_at in self.traced:
            n = x.shape[dim]
            i = where(e < 0, e + n, e)
            if out_of_range != "clip":
                inside = (i >= 0) & (i < n)
                valid = self._place(trace, inside, gather_at) if valid is None else (
                    valid & self._place(trace, inside, gather_at))
            if out_of_range != "drop":
                i = where(i < 0, 0, where(i >= n, n - 1, i))
            stride = int(_np.prod(x.shape[dim + 1 :], dtype=_np.int64))
            term = self._place(trace, i * stride if stride != 1 else i, gather_at)
            pos = term if pos is None else pos + term
        if out_of_range == "drop" and valid is not None:
            return where(valid, pos, -1)
        if out_of_range == "mask":
            return pos, valid
        return pos

    def _place(self, trace: Any, t: Tracer, gather_at: _np.ndarray) -> Tracer:
        """Traced index entry `t` (or a value of its shape) at each element of `self.shape`."""
        if t.ndim == 0:
            return broadcast_to(t, self.shape)
        if t.shape == self.shape and _np.array_equal(gather_at.reshape(-1), _np.arange(t.size)):
            return t  # the index's own layout: no gather
        flat_at = trace.constant(gather_at.astype(_np.int32), None)
        return bind(trace, "take", (reshape(t, (t.size,)), flat_at), axis=0)


def _one_axis(x: Tracer, index: Any) -> Optional[tuple]:
    """`(dim, indices)` when `index` is one integer index (an int, an integer array or an
    int32 traced value) at `dim` amid full slices and at most one Ellipsis: the common
    `x.at[i]`, `x.at[:, i]`, `x.at[..., i]`. Else None.

    Those need no positions: the update is one scatter along `dim` of `x` itself,
    whose kernel drops out-of-range indices (and `get` one take, which clips).
    """
    idx = index if isinstance(index, tuple) else (index,)
    is_array = lambda e: isinstance(e, (Tracer, _np.ndarray, list))  # noqa: E731
    full = lambda e: isinstance(e, slice) and e == slice(None)  # noqa: E731
    ellipses = [k for k, e in enumerate(idx) if not is_array(e) and e is Ellipsis]
    picks = [k for k, e in enumerate(idx) if is_array(e) or not (full(e) or e is Ellipsis)]
    if len(ellipses) > 1 or len(picks) != 1:
        return None
    k = picks[0]
    e = idx[k]
    if isinstance(e, Tracer):
        if e.dtype != _np.int32:
            return None  # the general path says why
    elif e is None or isinstance(e, (slice, bool, _np.bool_)) or _np.asarray(e).dtype.kind not in "iu":
        return None
    rest = len(idx) - 1 - len(ellipses)
    if rest + 1 > x.ndim:
        return None
    # Entries before the index, an Ellipsis among them standing for the dims no entry takes.
    dim = k - 1 + (x.ndim - 1 - rest) if ellipses and ellipses[0] < k else k
    return dim, e


def _check_mode(name: str, mode: Any) -> None:
    if mode not in _UPDATE_MODES:
        raise ValueError(f"{name}: mode must be None, 'drop', 'fill', 'clip' or "
                         f"'promise_in_bounds', got {mode!r}")


class _IndexUpdateRef:
    """`x.at[index]`: the indexed elements of `x`, to read (`get`) or update out of place."""

    __slots__ = ("_x", "_index")

    def __init__(self, x: Tracer, index: Any):
        self._x = x
        self._index = index

    def __repr__(self) -> str:
        return f"_IndexUpdateRef({self._x!r}, {self._index!r})"

    def get(self, *, mode: Optional[str] = None, fill_value: Any = None,
            indices_are_sorted: bool = False, unique_indices: bool = False) -> Tracer:
        """`x[index]`, any index form; out-of-range traced indices are clipped into range
        (as `x[index]`), or give `fill_value` with mode "fill" or "drop" (as JAX's;
        default NaN, the most negative int32, or True)."""
        _check_mode("at[...].get", mode)
        x = self._x
        trace = x._check()
        one = _one_axis(x, self._index)
        if one is not None:
            dim, e = one
            if mode in ("fill", "drop"):  # as JAX's: a gather fills where a scatter drops
                return take(x, e, axis=dim, mode="fill", fill_value=fill_value)
            i = self._one_axis_indices("get", e, x.shape[dim], "clip")
            return bind(trace, "take", (x, i), axis=dim)  # the kernel clips, as x[i]
        where_ = _Positions(x, self._index, "at[...].get")
        if mode in ("fill", "drop"):
            pos, valid = where_.resolve(x, "mask")
        else:
            pos, valid = where_.resolve(x, "clip"), None
        out = bind(trace, "take", (reshape(x, (x.size,)), pos), axis=0) if x.size else \
            broadcast_to(trace.constant(_np.zeros((), x.dtype), None), where_.shape)
        if valid is None:
            return out
        return where(valid, out, _fill_value(x.dtype, fill_value))

    def _update(self, name: str, combiner: str, values: Any, mode: Optional[str]) -> Tracer:
        _check_mode(f"at[...].{name}", mode)
        x = self._x
        trace = x._check()
        v = x._operand(values)
        if v is None:
            raise TypeError(f"at[...].{name}: values must be an array or a number, got "
                            f"{type(values).__name__}")
        one = _one_axis(x, self._index)
        if one is not None:
            dim, e = one
            n = x.shape[dim]
            i = self._one_axis_indices(name, e, n, mode)
            if isinstance(e, Tracer) and mode == "clip":
                i = where(i < 0, 0, where(i >= n, n - 1, i))
            shape = x.shape[:dim] + tuple(i.shape) + x.shape[dim + 1 :]
            v = self._broadcast(name, v, shape)
            return bind(trace, "scatter", (x, i, v), combiner=combiner, axis=dim, size=n)
        where_ = _Positions(x, self._index, f"at[...].{name}")
        pos = where_.resolve(x, "clip" if mode == "clip" else "drop")  # JAX's scatters drop
        v = self._broadcast(name, v, where_.shape)
        out = bind(trace, "scatter", (reshape(x, (x.size,)), pos, v), combiner=combiner, axis=0,
                   size=x.size)
        return reshape(out, x.shape)

    def _one_axis_indices(self, name: str, e: Any, n: int, mode: Optional[str]) -> Tracer:
        """Indices into a dim of size `n`: traced ones with the negative ones counted from
        the end; constant ones checked (IndexError) as numpy, or clipped with mode "clip"."""
        trace = self._x._trace
        if isinstance(e, Tracer):
            return where(e < 0, e + n, e)
        i = _np.asarray(e)
        if mode == "clip":
            i = _np.clip(_np.where(i < 0, i + n, i), 0, max(n - 1, 0))
        else:
            i = _checked_indices(f"at[...].{name}", i, n)
        return trace.constant(i.astype(_np.int32), None)

    def _broadcast(self, name: str, v: Tracer, shape: tuple) -> Tracer:
        """`v` broadcast to the indexed `shape`; ValueError if it does not broadcast."""
        if not _broadcasts_to(v.shape, shape):
            raise ValueError(f"at[...].{name}: values of shape {v.shape} do not broadcast to the "
                             f"indexed shape {tuple(shape)} of {self._x.aval}")
        return broadcast_to(v, shape)

    def set(self, values: Any, *, mode: Optional[str] = None, indices_are_sorted: bool = False,
            unique_indices: bool = False) -> Tracer:
        """`x` with the indexed elements replaced by `values` (cast to x's dtype, broadcast
        to the indexed shape); where an element is indexed twice, the last update wins.
        Out-of-range traced indices are dropped (mode None, "drop", "fill") or clipped
        ("clip"). Gradient: to `x` where not overwritten, to the winning updates."""
        return self._update("set", "set", values, mode)

    def add(self, values: Any, *, mode: Optional[str] = None, indices_are_sorted: bool = False,
            unique_indices: bool = False) -> Tracer:
        """`x` with `values` added at the index; repeated indices add up (`np.add.at`).
        Not for bool `x` (TypeError, as JAX)."""
        return self._update("add", "add", values, mode)

    def subtract(self, values: Any, *, mode: Optional[str] = None,
                 indices_are_sorted: bool = False, unique_indices: bool = False) -> Tracer:
        """`x` with `values` subtracted at the index (repeated indices subtract each)."""
        v = self._x._operand(values)
        if v is None:
            raise TypeError(f"at[...].subtract: values must be an array or a number, got "
                            f"{type(values).__name__}")
        return self._update("subtract", "add", -v, mode)

    def multiply(self, values: Any, *, mode: Optional[str] = None,
                 indices_are_sorted: bool = False, unique_indices: bool = False) -> Tracer:
        """`x` with the indexed elements multiplied by `values`; repeated indices multiply
        each (`np.multiply.at`). The gradient is exact with zeros and repeats too. Not for
        bool `x` (TypeError, as JAX)."""
        return self._update("multiply", "mul", values, mode)

    mul = multiply

    def min(self, values: Any, *, mode: Optional[str] = None, indices_are_sorted: bool = False,
            unique_indices: bool = False) -> Tracer:
        """`x` with each indexed element the minimum of itself and its updates (NaN
        propagates; bool: logical and). Gradient shared equally among the ties, as JAX."""
        return self._update("min", "min", values, mode)

    def max(self, values: Any, *, mode: Optional[str] = None, indices_are_sorted: bool = False,
            unique_indices: bool = False) -> Tracer:
        """`x` with each indexed element the maximum of itself and its updates (NaN
        propagates; bool: logical or). Gradient shared equally among the ties, as JAX."""
        return self._update("max", "max", values, mode)


class _IndexUpdateHelper:
    """`x.at`: index it (`x.at[index]`) for the out-of-place updates of JAX's `Array.at`."""

    __slots__ = ("_x",)

    def __init__(self, x: Tracer):
        self._x = x

    def __getitem__(self, index: Any) -> _IndexUpdateRef:
        self._x._check()
        return _IndexUpdateRef(self._x, index)

    def __repr__(self) -> str:
        return f"_IndexUpdateHelper({self._x!r})"


def _getitem(x: Tracer, index: Any) -> Tracer:
    """`x[index]` for static indices: ints, slices (any step), None, Ellipsis, and at
    most one integer array or int32 traced value (a `take` along its dimension);
    several integer arrays, or a constant boolean mask, go through the general
    gather of `x.at[index].get()`.

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
    arrays = [e for e in idx if is_array(e)]
    if len(arrays) > 1 or _builtins.any(
        not isinstance(e, Tracer) and _np.asarray(e).dtype == _np.bool_ for e in arrays
    ):
        # Several integer arrays (broadcast together) or a constant boolean mask
        # (its positions known now, as JAX takes a concrete mask): the general
        # gather of x.at[index].get(), which clamps traced indices as x[i] does.
        return _IndexUpdateRef(x, index).get()
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
