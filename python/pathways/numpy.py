"""numpy-style functions on the values of a function traced by `pw.pmap`.

Usage:
  >>> import pathways.numpy as pnp
  >>> f = pw.pmap(lambda x: pnp.where(x > 0, pnp.sqrt(x), 0.0), devices=tpus)

Inside a pmap trace, a call with at least one traced value among its array
arguments records an op of the compiled function. Shapes broadcast and dtypes
promote as in numpy (bool < int32 < float32 < float64; int32 with float32
gives float64); the transcendental functions compute int32 in float64 and
bool in float32; Python scalars are weakly typed as for the `Tracer`
operators. Called with no traced value (e.g. on numpy arrays outside a
trace), each function simply calls its numpy namesake. Conversely numpy's own
functions, called on a traced value (`np.sum(x)`, `np.exp(x)`), call their
namesakes here, and raise TracerError for those this module lacks.
"""

from __future__ import annotations

import builtins as _builtins
import functools as _functools
import inspect as _inspect
import operator as _operator
from typing import Any, Optional

import numpy as _np

from pathways import _checks
from pathways._tracing import Tracer, TracerError, _TracerBase, bind

__all__ = [
    "float32",
    "float64",
    "int32",
    "bool_",
    "exp",
    "log",
    "tanh",
    "sqrt",
    "rsqrt",
    "sin",
    "cos",
    "abs",
    "absolute",
    "negative",
    "add",
    "subtract",
    "multiply",
    "divide",
    "true_divide",
    "power",
    "bitwise_and",
    "bitwise_or",
    "bitwise_xor",
    "maximum",
    "minimum",
    "where",
    "equal",
    "not_equal",
    "less",
    "less_equal",
    "greater",
    "greater_equal",
    "logical_and",
    "logical_or",
    "logical_xor",
    "logical_not",
    "sum",
    "mean",
    "max",
    "min",
    "argmax",
    "reshape",
    "ravel",
    "transpose",
    "swapaxes",
    "moveaxis",
    "broadcast_to",
    "expand_dims",
    "squeeze",
    "concatenate",
    "stack",
    "flip",
    "take",
    "matmul",
    "dot",
    "einsum",
    "zeros_like",
    "ones_like",
    "square",
    "sign",
    "clip",
    "var",
    "std",
]

float32 = _np.float32
float64 = _np.float64
int32 = _np.int32
bool_ = _np.bool_


def _trace_of(name: str, args: tuple) -> Any:
    """The function trace of the traced values among `args`, or None if there are none.

    Raises:
      TracerError: For a traced program value, or a traced value whose trace ended.
    """
    for a in args:
        if isinstance(a, Tracer):
            return a._check()
        if isinstance(a, _TracerBase):
            raise TracerError(
                f"pathways.numpy.{name} of a traced program value ({a.aval}); pass program "
                "values to pmap'd functions as arguments and compute inside them"
            )
    return None


def _traced(name: str, args: tuple) -> bool:
    """True if any argument is a traced value of a pmap'd function."""
    return _trace_of(name, args) is not None


def _unary(name: str, op: str, numpy_fn: Any) -> Any:
    def fn(x: Any) -> Any:
        if _traced(name, (x,)):
            return x._unary(op)
        return numpy_fn(x)

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = f"Elementwise `numpy.{numpy_fn.__name__}` of a traced value (or of a numpy array)."
    return fn


def _np_rsqrt(x: Any) -> Any:
    return 1 / _np.sqrt(x)


_np_rsqrt.__name__ = "rsqrt"

exp = _unary("exp", "exp", _np.exp)
log = _unary("log", "log", _np.log)
tanh = _unary("tanh", "tanh", _np.tanh)
sqrt = _unary("sqrt", "sqrt", _np.sqrt)
rsqrt = _unary("rsqrt", "rsqrt", _np_rsqrt)
sin = _unary("sin", "sin", _np.sin)
cos = _unary("cos", "cos", _np.cos)
abs = absolute = _unary("abs", "abs", _np.abs)  # noqa: A001 (numpy's name)
negative = _unary("negative", "neg", _np.negative)


def _binary(name: str, op: str, numpy_fn: Any, method: str = "_binary") -> Any:
    """`numpy_fn`, or on traced values primitive `op` through the `Tracer` method `method`
    (`_logical` for the bitwise ops, which need bool operands)."""

    def fn(a: Any, b: Any) -> Any:
        if _traced(name, (a, b)):
            if isinstance(a, Tracer):
                a._check()
                return getattr(a, method)(op, b, False)
            b._check()
            return getattr(b, method)(op, a, True)
        return numpy_fn(a, b)

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = (
        f"Elementwise `numpy.{numpy_fn.__name__}` of traced values (numpy broadcasting and "
        "promotion), or of numpy arrays."
    )
    return fn


add = _binary("add", "add", _np.add)
subtract = _binary("subtract", "sub", _np.subtract)
multiply = _binary("multiply", "mul", _np.multiply)
divide = true_divide = _binary("divide", "div", _np.divide)
power = _binary("power", "pow", _np.power)
bitwise_and = _binary("bitwise_and", "and", _np.bitwise_and, "_logical")
bitwise_or = _binary("bitwise_or", "or", _np.bitwise_or, "_logical")
bitwise_xor = _binary("bitwise_xor", "xor", _np.bitwise_xor, "_logical")
maximum = _binary("maximum", "max", _np.maximum)
minimum = _binary("minimum", "min", _np.minimum)
equal = _binary("equal", "eq", _np.equal)
not_equal = _binary("not_equal", "ne", _np.not_equal)
less = _binary("less", "lt", _np.less)
less_equal = _binary("less_equal", "le", _np.less_equal)
greater = _binary("greater", "gt", _np.greater)
greater_equal = _binary("greater_equal", "ge", _np.greater_equal)


def _as_bool(trace: Any, x: Any) -> Tracer:
    """`x` as a bool traced value (nonzero is True, as numpy's truthiness)."""
    if isinstance(x, Tracer):
        return x.astype(_np.bool_)
    return trace.constant(_np.asarray(x).astype(_np.bool_), None)


def _logical(name: str, op: str, numpy_fn: Any) -> Any:
    def fn(a: Any, b: Any) -> Any:
        if _traced(name, (a, b)):
            t = a if isinstance(a, Tracer) else b
            trace = t._check()
            return _as_bool(trace, a)._binary(op, _as_bool(trace, b), False)
        return numpy_fn(a, b)

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = (
        f"Elementwise `numpy.{name}`: operands are taken as bool (nonzero is True); numpy "
        "broadcasting."
    )
    return fn


logical_and = _logical("logical_and", "and", _np.logical_and)
logical_or = _logical("logical_or", "or", _np.logical_or)
logical_xor = _logical("logical_xor", "xor", _np.logical_xor)


def logical_not(x: Any) -> Any:
    """Elementwise `numpy.logical_not` (nonzero is True)."""
    if _traced("logical_not", (x,)):
        return _as_bool(x._check(), x)._unary("not")
    return _np.logical_not(x)


def where(condition: Any, x: Any, y: Any) -> Any:
    """Elementwise `x if condition else y`, like `numpy.where(condition, x, y)`.

    Args:
      condition: Taken as bool (nonzero is True).
      x: Values where `condition` holds.
      y: Values elsewhere.

    Returns:
      The three broadcast together, with `x` and `y` promoted to a common
      dtype. Python scalars take the dtype of a traced `x` or `y`; with
      neither traced, Python floats are float64 and ints int32.

    Raises:
      ValueError: If the shapes do not broadcast.
    """
    if not _traced("where", (condition, x, y)):
        return _np.where(condition, x, y)
    t = next(a for a in (condition, x, y) if isinstance(a, Tracer))
    trace = t._check()
    like = next((a.dtype for a in (x, y) if isinstance(a, Tracer)), None)

    def operand(v: Any) -> Tracer:
        if isinstance(v, Tracer):
            v._check()
            return v
        if like is None:
            return trace.constant(v, None)
        return trace.constant(v, like)

    c = _as_bool(trace, condition)
    xv = operand(x)
    yv = operand(y)
    return bind(trace, "select", (c, xv, yv))


def _reduction(name: str, numpy_fn: Any) -> Any:
    def fn(a: Any, axis: Any = None, keepdims: bool = False) -> Any:
        if _traced(name, (a,)):
            return getattr(a, name)(axis=axis, keepdims=keepdims)
        return numpy_fn(a, axis=axis, keepdims=keepdims)

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = (
        f"`numpy.{name}(a, axis=None, keepdims=False)` of a traced value (or of a numpy array); "
        "axis may be None, an int or (except argmax) a tuple; negative axes count from the end."
    )
    return fn


sum = _reduction("sum", _np.sum)  # noqa: A001
mean = _reduction("mean", _np.mean)
max = _reduction("max", _np.max)  # noqa: A001
min = _reduction("min", _np.min)  # noqa: A001
argmax = _reduction("argmax", _np.argmax)


# --- Shapes, indexing, linear algebra --------------------------------------


def _operand(trace: Any, x: Any) -> Tracer:
    """`x` as a traced value of `trace` (numpy values become constants)."""
    if isinstance(x, Tracer):
        x._check()
        return x
    return trace.constant(x, None)


def _axis(name: str, param: str, axis: Any, ndim: int, shape: tuple) -> int:
    """Axis `axis` (parameter `param` of op `name`) of a value of rank `ndim`, made non-negative.

    Raises:
      TypeError: Unless it is an integer (see `_checks.index`).
      ValueError: If it is out of range.
    """
    a = _checks.index(name, param, axis)
    if not -ndim <= a < ndim:
        raise ValueError(f"{name}: {param} {a} is out of range for shape {shape} (rank {ndim})")
    return a + ndim if a < 0 else a


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


def moveaxis(a: Any, source: int, destination: int) -> Any:
    """`numpy.moveaxis` for one axis: dimension `source` moved to position `destination`."""
    if _trace_of("moveaxis", (a,)) is None:
        return _np.moveaxis(a, source, destination)
    s = _axis("moveaxis", "source", source, a.ndim, a.shape)
    d = _axis("moveaxis", "destination", destination, a.ndim, a.shape)
    perm = [i for i in range(a.ndim) if i != s]
    perm.insert(d, s)
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


def concatenate(arrays: Any, axis: int = 0) -> Any:
    """`numpy.concatenate`: values joined along an existing axis (dtypes promote)."""
    arrays = list(arrays)
    trace = _trace_of("concatenate", tuple(arrays))
    if trace is None:
        return _np.concatenate(arrays, axis=axis)
    xs = [_operand(trace, x) for x in arrays]
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
    """`fill_value` in `dtype`, or JAX's default: NaN, the most negative int32, or True."""
    dt = _np.dtype(dtype)
    if fill_value is None:
        fill_value = {"f": _np.nan, "i": _np.iinfo(_np.int32).min, "b": True}[dt.kind]
    return _np.asarray(fill_value).astype(dt)


def take(a: Any, indices: Any, axis: Any = None, mode: Optional[str] = None,
         fill_value: Any = None) -> Any:
    """`numpy.take`: elements of `a` at `indices` along `axis` (None: of the flattened `a`).

    Out-of-range traced indices follow `mode`, as in `jax.numpy.take` (a
    device cannot raise):
      - None or "fill" (the default): negative indices count from the end,
        and indices still out of range give `fill_value` (default NaN for
        floats, the most negative int32, True for bool);
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


def matmul(a: Any, b: Any) -> Any:
    """`numpy.matmul` (the `@` operator): batched matrix product, batch dims broadcast.

    1-d operands are promoted to matrices and the added dimension removed
    afterwards, as numpy does; scalars are rejected.
    """
    trace = _trace_of("matmul", (a, b))
    if trace is None:
        return _np.matmul(a, b)
    a = _operand(trace, a)
    b = _operand(trace, b)
    if a.ndim == 0 or b.ndim == 0:
        raise ValueError(
            f"matmul: operands must not be scalars, got {a.aval} and {b.aval}; use * instead"
        )
    ka = a.shape[-1]
    kb = b.shape[0] if b.ndim == 1 else b.shape[-2]
    if ka != kb:
        raise ValueError(
            f"matmul: incompatible shapes {a.aval} and {b.aval} (contracting dimension "
            f"{ka} != {kb})"
        )
    a2 = reshape(a, (1, ka)) if a.ndim == 1 else a
    b2 = reshape(b, (kb, 1)) if b.ndim == 1 else b
    out = bind(trace, "matmul", (a2, b2))
    if a.ndim == 1 and b.ndim == 1:
        return reshape(out, ())
    if a.ndim == 1:
        return squeeze(out, -2)
    if b.ndim == 1:
        return squeeze(out, -1)
    return out


def dot(a: Any, b: Any) -> Any:
    """`numpy.dot` for operands of rank <= 2 (the matrix product; scalars multiply)."""
    trace = _trace_of("dot", (a, b))
    if trace is None:
        return _np.dot(a, b)
    a = _operand(trace, a)
    b = _operand(trace, b)
    if a.ndim == 0 or b.ndim == 0:
        return a * b
    if a.ndim > 2 or b.ndim > 2:
        raise ValueError(
            f"dot: operands of rank > 2 are not supported ({a.aval}, {b.aval}); use matmul "
            "or einsum"
        )
    return matmul(a, b)


def _einsum_pair(trace: Any, x: Tracer, xs: str, y: Tracer, ys: str, out: str) -> tuple:
    """Contracts two operands by one batched matmul; `out` lists the letters to keep.

    Returns the result and its letters.
    """
    batch = [c for c in xs if c in ys and c in out]
    contract = [c for c in xs if c in ys and c not in out]
    x_free = [c for c in xs if c not in ys]
    y_free = [c for c in ys if c not in xs]
    size = {c: d for c, d in zip(xs, x.shape)}
    for c, d in zip(ys, y.shape):
        if c in size and size[c] != d:
            raise ValueError(
                f"einsum: dimension '{c}' has size {size[c]} in one operand and {d} in another"
            )
        size[c] = d

    def prod(letters: list) -> int:
        return int(_np.prod([size[c] for c in letters], dtype=_np.int64))

    xt = transpose(x, [xs.index(c) for c in batch + x_free + contract])
    yt = transpose(y, [ys.index(c) for c in batch + contract + y_free])
    xm = reshape(xt, (prod(batch), prod(x_free), prod(contract)))
    ym = reshape(yt, (prod(batch), prod(contract), prod(y_free)))
    r = bind(trace, "matmul", (xm, ym))
    return reshape(r, [size[c] for c in batch + x_free + y_free]), "".join(batch + x_free + y_free)


def _einsum_diagonal(x: Tracer, s: str) -> tuple:
    """Operand `x` with subscripts `s`, reduced to its diagonal over every repeated letter.

    The axes of a letter repeated k times (size n) are moved to the end and
    flattened; element (i, ..., i) is then at i * (1 + n + ... + n**(k-1)),
    so a strided slice takes the diagonal. Returns the result and its
    letters (each once; a repeated letter's axis last).

    Raises:
      ValueError: If the axes of a repeated letter differ in size.
    """
    for c in dict.fromkeys(s):
        at = [i for i, letter in enumerate(s) if letter == c]
        if len(at) < 2:
            continue
        sizes = {x.shape[i] for i in at}
        if len(sizes) > 1:
            raise ValueError(
                f"einsum: letter '{c}' repeats in {s!r} over axes of different sizes "
                f"{sorted(sizes)} (operand {x.aval})"
            )
        n = x.shape[at[0]]
        rest = [i for i in range(len(s)) if i not in at]
        x = reshape(transpose(x, rest + at), [x.shape[i] for i in rest] + [n ** len(at)])
        x = x[..., :: _builtins.sum(n**j for j in range(len(at)))]
        s = "".join(s[i] for i in rest) + c
    return x, s


def _einsum_sum_out(x: Tracer, s: str, keep: Any) -> tuple:
    """Sums `x` (subscripts `s`) over its letters not in `keep`; returns it and its letters.

    Over bool the sum is a logical or, as numpy's einsum, and stays bool.
    """
    drop = tuple(i for i, c in enumerate(s) if c not in keep)
    if not drop:
        return x, s
    total = x.sum(axis=drop)
    if x.dtype == _np.bool_:
        total = total != 0
    return total, "".join(c for c in s if c in keep)


def einsum(subscripts: str, *operands: Any) -> Any:
    """`numpy.einsum` for explicit letters (no '...').

    Covers the usual contractions: matrix products (`ij,jk->ik`), batched ones
    (`bij,bjk->bik`), outer products, traces over shared letters, sums over
    letters missing from the output, transposes (`ij->ji`), and diagonals of
    letters repeated within an operand (`ii->i`, `ii->`, `iij->j`). Without
    '->', the output has the letters appearing once, in alphabetical order.
    Two or more operands are contracted left to right, each step one batched
    matmul. The result has the operands' promoted dtype; over bool, as numpy,
    products are logical and and sums logical or.
    """
    trace = _trace_of("einsum", operands)
    if trace is None:
        return _np.einsum(subscripts, *operands)
    spec = subscripts.replace(" ", "")
    if "." in spec:
        raise ValueError(f"einsum: '...' is not supported yet ({subscripts!r})")
    if "->" in spec:
        lhs, out = spec.split("->")
    else:
        lhs = spec
        letters = lhs.replace(",", "")
        out = "".join(sorted(c for c in set(letters) if letters.count(c) == 1))
    ins = lhs.split(",")
    if len(ins) != len(operands):
        raise ValueError(
            f"einsum: {subscripts!r} names {len(ins)} operands, got {len(operands)}"
        )
    xs = [_operand(trace, x) for x in operands]
    for s, x in zip(ins, xs):
        if len(s) != x.ndim:
            raise ValueError(f"einsum: subscripts {s!r} do not match operand {x.aval}")
        if not s.isalpha() and s:
            raise ValueError(f"einsum: invalid subscripts {s!r}")
    if len(set(out)) != len(out) or any(c not in lhs for c in out):
        raise ValueError(f"einsum: invalid output subscripts {out!r}")
    dtype = _np.result_type(*[x.dtype for x in xs])
    if dtype != _np.bool_:  # bool operands count as 0 and 1 among numbers
        xs = [x.astype(dtype) if x.dtype == _np.bool_ else x for x in xs]
    xs, ins = zip(*[_einsum_diagonal(x, s) for x, s in zip(xs, ins)])

    def needed_after(k: int) -> set:
        return set(out).union(*[set(s) for s in ins[k + 1 :]])

    # Sum out letters no one else needs, operand by operand, then contract pairwise.
    cur, cur_s = _einsum_sum_out(xs[0], ins[0], needed_after(0))
    for k in range(1, len(xs)):
        keep_k = needed_after(k)
        y, ys = _einsum_sum_out(xs[k], ins[k], keep_k | set(cur_s))
        cur, cur_s = _einsum_pair(trace, cur, cur_s, y, ys, "".join(sorted(keep_k)))
    cur, cur_s = _einsum_sum_out(cur, cur_s, out)
    return transpose(cur, [cur_s.index(c) for c in out]) if cur_s != out else cur


def _filled_like(name: str, a: Any, value: int, dtype: Any) -> Any:
    trace = _trace_of(name, (a,))
    if trace is None:
        return _np.full_like(a, value, dtype=dtype)
    dt = _np.dtype(a.dtype if dtype is None else dtype)
    return broadcast_to(trace.constant(_np.full((), value, dt), None), a.shape)


def zeros_like(a: Any, dtype: Any = None) -> Any:
    """`numpy.zeros_like`: zeros of `a`'s shape (and dtype unless given)."""
    return _filled_like("zeros_like", a, 0, dtype)


def ones_like(a: Any, dtype: Any = None) -> Any:
    """`numpy.ones_like`: ones of `a`'s shape (and dtype unless given)."""
    return _filled_like("ones_like", a, 1, dtype)


def square(x: Any) -> Any:
    """`numpy.square`: x * x, elementwise; bool gives int32 (numpy: int8, not a dtype here)."""
    if _trace_of("square", (x,)) is None:
        return _np.square(x)
    if x.dtype == _np.bool_:
        x = x.astype(_np.int32)
    return x * x


def sign(x: Any) -> Any:
    """`numpy.sign`: -1, 0 or 1 by the sign of x, in x's dtype (NaN stays NaN)."""
    trace = _trace_of("sign", (x,))
    if trace is None:
        return _np.sign(x)
    if x.dtype == _np.bool_:
        raise TypeError(f"sign: operand must be numeric, got {x.aval}")
    one = trace.constant(1, x.dtype)
    zero = trace.constant(0, x.dtype)
    return where(x > 0, one, where(x < 0, -one, where(x == 0, zero, x)))


def clip(a: Any, a_min: Any = None, a_max: Any = None) -> Any:
    """`numpy.clip`: `a` limited to [a_min, a_max] (either may be None)."""
    if _trace_of("clip", (a, a_min, a_max)) is None:
        return _np.clip(a, a_min, a_max)
    if a_min is None and a_max is None:
        raise ValueError("clip: at least one of a_min and a_max must be given")
    out = a
    if a_min is not None:
        out = maximum(out, a_min)
    if a_max is not None:
        out = minimum(out, a_max)
    return out


def var(a: Any, axis: Any = None, keepdims: bool = False) -> Any:
    """`numpy.var` (ddof=0): the mean squared deviation from the mean over `axis`."""
    if _trace_of("var", (a,)) is None:
        return _np.var(a, axis=axis, keepdims=keepdims)
    axis = _checks.axes("var", "axis", axis)
    centered = a - mean(a, axis=axis, keepdims=True)
    return mean(centered * centered, axis=axis, keepdims=keepdims)


def std(a: Any, axis: Any = None, keepdims: bool = False) -> Any:
    """`numpy.std` (ddof=0): the square root of `var`."""
    if _trace_of("std", (a,)) is None:
        return _np.std(a, axis=axis, keepdims=keepdims)
    axis = _checks.axes("std", "axis", axis)
    return sqrt(var(a, axis=axis, keepdims=keepdims))


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


# --- numpy's own functions on traced values ------------------------------------
#
# `np.sum(x)` or `np.exp(x)` of a traced value comes here (numpy's
# __array_function__ and __array_ufunc__ protocols, NEP 18 and 13) and calls
# the namesake of this module, as `np.sum` of a JAX array calls its method.
# numpy functions this module lacks raise TracerError naming them.

# numpy functions that only read the static shape.
_SHAPE_FUNCTIONS = {
    "shape": lambda a: a.shape,
    "ndim": lambda a: a.ndim,
    "size": lambda a, axis=None: a.size if axis is None else a.shape[axis],
}


def _no_numpy(x: Tracer, what: str, why: str) -> TracerError:
    return TracerError(
        f"{what} of a traced value ({x.aval} in {x._trace.where()}): {why}; numpy cannot "
        "compute on traced values, which have no data while the function is traced: use "
        "the operators (+ - * / ...) and pathways.numpy (pw.numpy) functions"
    )


@_functools.lru_cache(maxsize=None)
def _signature(fn: Any) -> _inspect.Signature:
    return _inspect.signature(fn)


def _call_namesake(x: Tracer, what: str, name: str, args: tuple, kwargs: dict) -> Any:
    """pathways.numpy's `name` on numpy's arguments; TracerError if there is none or it
    does not take them. Keywords given as None (`out=None`, `dtype=None`) are numpy's
    defaults, and dropped."""
    fn = globals().get(name) if name in __all__ else None
    if fn is None:
        raise _no_numpy(x, what, f"pathways.numpy has no {name}")
    kwargs = {k: v for k, v in kwargs.items() if v is not None}
    try:
        _signature(fn).bind(*args, **kwargs)
    except TypeError as e:
        raise _no_numpy(
            x, what, f"it calls pathways.numpy.{name}, which does not take these arguments ({e})"
        ) from None
    return fn(*args, **kwargs)


def _numpy_function(x: Tracer, func: Any, args: tuple, kwargs: dict) -> Any:
    """`func(*args, **kwargs)`, a numpy function called with traced value `x` among its arguments."""
    x._check()
    name = func.__name__
    if name in _SHAPE_FUNCTIONS:
        return _SHAPE_FUNCTIONS[name](*args, **kwargs)
    return _call_namesake(x, f"numpy.{name}", name, args, kwargs)


def _numpy_ufunc(x: Tracer, ufunc: Any, method: str, inputs: tuple, kwargs: dict) -> Any:
    """`ufunc` (called, or its `method`: reduce, accumulate ...) with traced value `x` among `inputs`.

    numpy's operators on arrays are ufuncs too: `np_array + x` comes here as
    `numpy.add`, and `np_array < x` as `numpy.less`.
    """
    x._check()
    if method != "__call__":
        raise _no_numpy(
            x, f"numpy.{ufunc.__name__}.{method}", "ufunc methods are not supported (for "
            "numpy.add.reduce use pathways.numpy.sum)"
        )
    return _call_namesake(x, f"numpy.{ufunc.__name__}", ufunc.__name__, inputs, kwargs)
