"""Elementwise functions: numpy's ufuncs, `where`, and what is built from them
(`square`, `sign`, `clip`, `zeros_like` ...).
"""

from __future__ import annotations

import math as _math
from typing import Any

import numpy as _np

from pathways._tracer import Tracer, bind
from pathways.numpy._common import _trace_of, _traced
from pathways.numpy._shapes import broadcast_to


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
# Bitwise not of integers, logical not of bools.
invert = bitwise_not = _unary("invert", "not", _np.invert)


def _special(name: str, scalar_fn: Any) -> Any:
    """An elementwise special function numpy lacks (scipy.special has it): on numpy arrays
    `scalar_fn` (math's, correctly rounded in practice) per element, in float64, then
    in the dtype the op gives (float32 stays float32, int32 float64, bool float32)."""
    vectorized = _np.vectorize(scalar_fn, otypes=[_np.float64])

    def numpy_fn(x: Any) -> Any:
        a = _np.asarray(x)
        dtype = a.dtype if a.dtype.kind == "f" else (_np.float32 if a.dtype == _np.bool_ else
                                                     _np.float64)
        out = vectorized(a.astype(_np.float64)).astype(dtype)
        return out if out.ndim else out[()]

    numpy_fn.__name__ = name
    return numpy_fn


erf = _unary("erf", "erf", _special("erf", _math.erf))
erf.__doc__ = (
    "Elementwise error function erf(x) = 2/sqrt(pi) * integral of exp(-t**2) from 0 to x "
    "(`scipy.special.erf`, `jax.lax.erf`), of a traced value or a numpy array; gradient "
    "2/sqrt(pi) * exp(-x**2). int32 computes in float64 and bool in float32."
)
erfc = _unary("erfc", "erfc", _special("erfc", _math.erfc))
erfc.__doc__ = (
    "Elementwise complementary error function erfc(x) = 1 - erf(x), accurate where it is "
    "tiny (`scipy.special.erfc`, `jax.lax.erfc`); of a traced value or a numpy array."
)


def _binary(name: str, op: str, numpy_fn: Any) -> Any:
    """`numpy_fn`, or on traced values primitive `op` (through `Tracer._binary`; `op` None:
    `Tracer._right_shift`, which picks the shift by the dtypes)."""

    def fn(a: Any, b: Any) -> Any:
        if _traced(name, (a, b)):
            t, other, reflected = (a, b, False) if isinstance(a, Tracer) else (b, a, True)
            t._check()
            if op is None:
                return t._right_shift(other, reflected)
            return t._binary(op, other, reflected)
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
# Bitwise on integers, logical on bools (the builder refuses floats).
bitwise_and = _binary("bitwise_and", "and", _np.bitwise_and)
bitwise_or = _binary("bitwise_or", "or", _np.bitwise_or)
bitwise_xor = _binary("bitwise_xor", "xor", _np.bitwise_xor)
# Shift counts outside [0, 32) shift every bit out (as numpy's and XLA's):
# 0, or the sign for right_shift of int32.
left_shift = _binary("left_shift", "shift_left", _np.left_shift)
right_shift = _binary("right_shift", None, _np.right_shift)  # arithmetic for int32, logical for uint32
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


def full_like(a: Any, fill_value: Any, dtype: Any = None) -> Any:
    """`numpy.full_like`: `fill_value` in `a`'s shape (and dtype unless given).

    As in `jax.numpy`, `fill_value` may be a traced scalar (a value computed in
    the function), broadcast to the shape and cast to the dtype.
    """
    trace = _trace_of("full_like", (a, fill_value))
    if trace is None:
        return _np.full_like(a, fill_value, dtype=dtype)
    dt = _np.dtype(a.dtype if dtype is None else dtype)
    if isinstance(fill_value, Tracer):
        if fill_value.ndim != 0:
            raise ValueError(
                f"full_like: fill_value must be a scalar, got a traced value {fill_value.aval}"
            )
        return broadcast_to(fill_value.astype(dt), tuple(_np.shape(a)))
    return broadcast_to(trace.constant(_np.full((), fill_value, dt), None), tuple(_np.shape(a)))


def empty_like(a: Any, dtype: Any = None) -> Any:
    """`numpy.empty_like`, as `jax.numpy.empty_like`: zeros (arrays are never uninitialized)."""
    return _filled_like("empty_like", a, 0, dtype)


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

