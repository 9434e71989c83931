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
trace), each function simply calls its numpy namesake.
"""

from __future__ import annotations

from typing import Any

import numpy as _np

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
]

float32 = _np.float32
float64 = _np.float64
int32 = _np.int32
bool_ = _np.bool_


def _traced(name: str, args: tuple) -> bool:
    """True if any argument is a traced value of a pmap'd function."""
    found = False
    for a in args:
        if isinstance(a, Tracer):
            found = True
        elif isinstance(a, _TracerBase):
            raise TracerError(
                f"pathways.numpy.{name} of a traced program value ({a.aval}); pass program "
                "values to pmap'd functions as arguments and compute inside them"
            )
    return found


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
abs = _unary("abs", "abs", _np.abs)  # noqa: A001 (numpy's name)


def _binary(name: str, op: str, numpy_fn: Any) -> Any:
    def fn(a: Any, b: Any) -> Any:
        if _traced(name, (a, b)):
            if isinstance(a, Tracer):
                a._check()
                return a._binary(op, b, False)
            b._check()
            return b._binary(op, a, True)
        return numpy_fn(a, b)

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = (
        f"Elementwise `numpy.{numpy_fn.__name__}` of traced values (numpy broadcasting and "
        "promotion), or of numpy arrays."
    )
    return fn


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


def _default_constant(trace: Any, x: Any) -> Tracer:
    """A constant with numpy's dtype for `x`, narrowed to a supported one."""
    arr = _np.asarray(x)
    if arr.dtype.kind in "iu":
        arr = arr.astype(_np.int32)
    return trace.constant(arr, None)


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
            return _default_constant(trace, v)
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
