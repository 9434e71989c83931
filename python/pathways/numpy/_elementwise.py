"""Elementwise functions: numpy's ufuncs, `where`, and what is built from them
(`square`, `sign`, `clip`, `zeros_like` ...).
"""

from __future__ import annotations

import math as _math
from typing import Any

import ml_dtypes as _ml_dtypes
import numpy as _np

from pathways import _checks
from pathways._trace_state import _BFLOAT16 as _BF16
from pathways._trace_state import _is_float as _is_float_dtype
from pathways._tracer import Tracer, bind, stop_gradient
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
tan = _unary("tan", "tan", _np.tan)
# numpy's names, and numpy 2's (and jax.numpy's) short ones.
arcsin = asin = _unary("arcsin", "asin", _np.arcsin)
arccos = acos = _unary("arccos", "acos", _np.arccos)
arctan = atan = _unary("arctan", "atan", _np.arctan)
sinh = _unary("sinh", "sinh", _np.sinh)
cosh = _unary("cosh", "cosh", _np.cosh)
arcsinh = asinh = _unary("arcsinh", "asinh", _np.arcsinh)
arccosh = acosh = _unary("arccosh", "acosh", _np.arccosh)
arctanh = atanh = _unary("arctanh", "atanh", _np.arctanh)
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
arctan2 = atan2 = _binary("arctan2", "atan2", _np.arctan2)
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
    x = stop_gradient(x)  # zero everywhere, NaN too (its branch below is x itself)
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



# --- Built from the ops above: NaN tests, rounding, integer division, log1p --


def _is_float(x: Tracer) -> bool:
    return _is_float_dtype(x.dtype)


def isnan(x: Any) -> Any:
    """`numpy.isnan`: True where `x` is NaN (False everywhere for integers and bool)."""
    if _trace_of("isnan", (x,)) is None:
        return _np.isnan(x)
    return x != x


def isinf(x: Any) -> Any:
    """`numpy.isinf`: True where `x` is +inf or -inf (False for integers and bool)."""
    if _trace_of("isinf", (x,)) is None:
        return _np.isinf(x)
    if not _is_float(x):
        return x != x
    return abs(x) == _np.inf


def isfinite(x: Any) -> Any:
    """`numpy.isfinite`: True where `x` is neither NaN nor infinite (True for integers and bool)."""
    if _trace_of("isfinite", (x,)) is None:
        return _np.isfinite(x)
    if not _is_float(x):
        return x == x
    return (x - x) == 0  # inf - inf and NaN - NaN are NaN


def _rounded(x: Any, direction: int) -> Any:
    """`x` rounded to an integer value, in its own float type: half to even
    (`direction` 0), down (-1) or up (1). Integers and bool are returned as
    they are (as `jax.numpy`; numpy makes floats of them). No gradient flows
    (the derivative is zero almost everywhere, as JAX's).

    Exact from adds alone: below 2**(mantissa bits) in magnitude,
    `(|x| + 2**p) - 2**p` is |x| rounded to an integer half to even (the add
    rounds away the fraction under IEEE round-to-nearest); at or above it
    every float is an integer already. bfloat16 rounds in float32, since its
    ops round each result back to bfloat16.
    """
    if not _is_float(x):
        return x
    dtype = _np.dtype(x.dtype)
    v = stop_gradient(x.astype(_np.float32) if dtype.kind != "f" else x)
    big = 2.0 ** (_np.finfo(v.dtype).nmant)
    a = abs(v)
    r = (a + big) - big
    r = where(v < 0, -r, r)  # -0.4 rounds to -0.0, as numpy
    if direction < 0:  # where, not r - (r > v): -0.0 + 0.0 would lose the sign
        r = where(r > v, r - 1, r)
    elif direction > 0:
        r = where(r < v, r + 1, r)
        r = where(v < 0, -abs(r), r)  # ceil of (-1, 0) is -0.0, as numpy (r + 1 gave 0.0)
    # NaN, infinities, integers beyond 2**p and +-0 are their own rounding.
    out = where(a < big, where(v == 0, v, r), v)
    return out.astype(dtype) if dtype != out.dtype else out


def floor(x: Any) -> Any:
    """`numpy.floor`: the largest integer value <= x, in x's float type (-0.0 stays -0.0).

    Integers and bool are returned as they are (as `jax.numpy`); the gradient is zero.
    """
    if _trace_of("floor", (x,)) is None:
        return _np.floor(x)
    return _rounded(x, -1)


def ceil(x: Any) -> Any:
    """`numpy.ceil`: the smallest integer value >= x, in x's float type; as `floor` otherwise."""
    if _trace_of("ceil", (x,)) is None:
        return _np.ceil(x)
    return _rounded(x, 1)


def round(a: Any, decimals: int = 0) -> Any:  # noqa: A001 (numpy's name)
    """`numpy.round` with `decimals=0`: to the nearest integer value, halves to even.

    Raises:
      TypeError: For `decimals` other than 0 on a traced value.
    """
    if _trace_of("round", (a,)) is None:
        return _np.round(a, decimals)
    if decimals != 0 or isinstance(decimals, bool):
        raise TypeError(f"round: decimals must be 0 on traced values, got {decimals!r}")
    return _rounded(a, 0)


def rint(x: Any) -> Any:
    """`numpy.rint`: `round(x)`."""
    if _trace_of("rint", (x,)) is None:
        return _np.rint(x)
    return _rounded(x, 0)


around = round


def _division_operands(name: str, a: Any, b: Any) -> tuple:
    """`(a, b, is_float)`: both as traced values (a Python scalar takes the other's
    type); for integers, of one integer dtype (bool as int32, int32 with uint32
    int32), as numpy's promotion gives them."""
    t = a if isinstance(a, Tracer) else b
    ops = [t._operand(a), t._operand(b)]
    if any(o is None for o in ops):
        raise TypeError(f"{name}: unsupported operands {type(a).__name__} and {type(b).__name__}")
    if any(_is_float(o) for o in ops):
        return ops[0], ops[1], True  # the builder promotes each op's operands
    ops = [o.astype(_np.int32) if o.dtype == _np.bool_ else o for o in ops]
    if ops[0].dtype != ops[1].dtype:
        ops = [o.astype(_np.int32) for o in ops]
    return ops[0], ops[1], False


def _signed_zero(like: Tracer) -> Tracer:
    """0.0 with the sign bit of `like` (numpy's copysign(0, like)); -0.0 is told
    from 0.0 by its reciprocal, -inf."""
    negative = (like < 0) | ((like == 0) & (1 / like < 0))
    trace = like._check()
    return where(negative, trace.constant(-0.0, like.dtype), trace.constant(0.0, like.dtype))


def _float_divmod(a: Tracer, b: Tracer) -> tuple:
    """numpy's floor division and remainder of floats (its npy_divmod, elementwise).

    The remainder starts from fmod (the `rem` op, exact), which the quotient
    `(a - fmod) / b` then matches up to rounding; both move by one step where
    fmod's sign is not b's, and the quotient snaps to the nearest integer.
    Zeros carry numpy's signs; by zero, `(a / b, fmod(a, 0) = NaN)`.
    """
    trace = a._check() if isinstance(a, Tracer) else b._check()
    mod = fm = bind(trace, "rem", (a, b))
    div = (a - mod) / b
    fix = (mod != 0) & ((b < 0) != (mod < 0))
    div = where(fix, div - 1, div)
    mod = where(fix, mod + b, where(mod != 0, mod, _signed_zero(b)))
    low = floor(div)
    snapped = where(div - low > 0.5, low + 1, low)
    quotient = where(div != 0, snapped, _signed_zero(a / b))  # NaN != 0: NaN stays
    by_zero = b == 0
    return where(by_zero, a / b, quotient), where(by_zero, fm, mod)


def floor_divide(a: Any, b: Any) -> Any:
    """`numpy.floor_divide` (`a // b`): the quotient rounded down.

    Integers: exact (the float64 quotient of two 32-bit integers never rounds
    across an integer); as numpy, a division by zero gives 0 and
    INT32_MIN // -1 wraps to INT32_MIN. Floats: numpy's, bit for bit (from the
    exact remainder, see `remainder`), `1.0 // 0.1` is 9.0 as in numpy and
    JAX. No gradient flows (it is piecewise constant).
    """
    if _trace_of("floor_divide", (a, b)) is None:
        return _np.floor_divide(a, b)
    a, b, is_float = _division_operands("floor_divide", a, b)
    if is_float:
        return _float_divmod(stop_gradient(a), stop_gradient(b))[0]
    q = floor(a.astype(_np.float64) / b.astype(_np.float64))
    if a.dtype == _np.int32:
        q = where(q == 2.0**31, -(2.0**31), q)  # -2**31 // -1 wraps
    return where(b == 0, 0, q.astype(a.dtype))


def remainder(a: Any, b: Any) -> Any:
    """`numpy.remainder` (`a % b`): `a - (a // b) * b`, with the sign of `b`, as numpy.

    Integers: from the truncated remainder (the `rem` op), exact; a remainder
    by zero is 0, as numpy. Floats: numpy's, bit for bit (fmod moved into b's
    sign); the gradient is 1 to `a` and `-(a // b)` to `b`.
    """
    if _trace_of("remainder", (a, b)) is None:
        return _np.remainder(a, b)
    a, b, is_float = _division_operands("remainder", a, b)
    if is_float:
        return _float_divmod(a, b)[1]
    trace = a._check()
    r = bind(trace, "rem", (a, b))
    if a.dtype == _np.int32:
        r = where((r != 0) & ((r < 0) != (b < 0)), r + b, r)
    return where(b == 0, 0, r)


mod = remainder


def fmod(a: Any, b: Any) -> Any:
    """`numpy.fmod`: the remainder of truncated division, with the sign of `a` (C's).

    One `rem` op (`jax.lax.rem`). Integers: a remainder by zero is 0, as
    numpy (the op gives `a`). Gradient: 1 to `a`, `-trunc(a / b)` to `b`.
    """
    if _trace_of("fmod", (a, b)) is None:
        return _np.fmod(a, b)
    a, b, is_float = _division_operands("fmod", a, b)
    r = bind(a._check() if isinstance(a, Tracer) else b._check(), "rem", (a, b))
    return r if is_float else where(b == 0, 0, r)


def divmod(a: Any, b: Any) -> tuple:  # noqa: A001 (numpy's name)
    """`numpy.divmod`: `(floor_divide(a, b), remainder(a, b))`."""
    if _trace_of("divmod", (a, b)) is None:
        return _np.divmod(a, b)
    return floor_divide(a, b), remainder(a, b)


def _float_operand(x: Tracer) -> Tracer:
    """`x` in the float type the transcendental functions compute it in."""
    if _np.dtype(x.dtype).kind == "f":
        return x
    if x.dtype == _BF16:
        return x.astype(_np.float32)
    return x.astype(_np.float32 if x.dtype == _np.bool_ else _np.float64)


def log1p(x: Any) -> Any:
    """`numpy.log1p`: log(1 + x), accurate for tiny x (a few ulp).

    Goldberg's form from `log`: with u = 1 + x rounded, log(u) * x / (u - 1)
    (x itself where u == 1). Integers compute in float64, bool and bfloat16
    in float32 (bfloat16 is rounded back).
    """
    if _trace_of("log1p", (x,)) is None:
        return _np.log1p(x)
    v = _float_operand(x)
    u = v + 1
    d = u - 1
    safe = where(d == 0, 1, d)
    out = where(d == 0, v, where(u == _np.inf, u, log(u) * (v / safe)))
    return out.astype(x.dtype) if x.dtype == _BF16 else out


def expm1(x: Any) -> Any:
    """`numpy.expm1`: exp(x) - 1, accurate for tiny x (a few ulp).

    Kahan's form from `exp` and `log`: with u = exp(x), (u - 1) * x / log(u)
    (x itself where u == 1, -1 where u - 1 == -1, u where it is infinite).
    dtypes as `log1p`'s.
    """
    if _trace_of("expm1", (x,)) is None:
        return _np.expm1(x)
    v = _float_operand(x)
    u = exp(v)
    d = u - 1
    lu = log(u)
    exact = (d == 0) | (d == -1) | (u == _np.inf)
    safe = where(exact, 1, lu)
    out = where(d == 0, v, where(exact, d, d * (v / safe)))
    return out.astype(x.dtype) if x.dtype == _BF16 else out


def log2(x: Any) -> Any:
    """`numpy.log2`: log(x) / log(2) (exact at powers of two up to rounding of the quotient)."""
    if _trace_of("log2", (x,)) is None:
        return _np.log2(x)
    v = _float_operand(x)
    return log(v) * (1 / _math.log(2))


def log10(x: Any) -> Any:
    """`numpy.log10`: log(x) / log(10)."""
    if _trace_of("log10", (x,)) is None:
        return _np.log10(x)
    v = _float_operand(x)
    return log(v) * (1 / _math.log(10))


def reciprocal(x: Any) -> Any:
    """`numpy.reciprocal`: 1 / x."""
    if _trace_of("reciprocal", (x,)) is None:
        return _np.reciprocal(x)
    return 1 / x


def logaddexp(x1: Any, x2: Any) -> Any:
    """`numpy.logaddexp`: log(exp(x1) + exp(x2)) without overflow.

    The larger operand plus log1p(exp(-|x1 - x2|)); where the difference is
    NaN (equal infinities, or a NaN) the sum x1 + x2, as JAX. The gradient
    is each operand's softmax weight (1/2 each at a tie). dtypes as `log1p`'s.
    """
    if _trace_of("logaddexp", (x1, x2)) is None:
        return _np.logaddexp(x1, x2)
    t = x1 if isinstance(x1, Tracer) else x2
    ops = [t._operand(x1), t._operand(x2)]
    if any(o is None for o in ops):
        raise TypeError(
            f"logaddexp: unsupported operands {type(x1).__name__} and {type(x2).__name__}"
        )
    a, b = (_float_operand(o) for o in ops)
    delta = a - b
    # A select, not `maximum`: at a tie the gradient of the larger goes to x1
    # whole, and the log1p term's (abs' is 1 at 0) takes back its half.
    larger = where(delta >= 0, a, b)
    out = where(isnan(delta), a + b, larger + log1p(exp(-abs(delta))))
    # bfloat16 computes in float32 and is rounded back, unless a wider float came too.
    floats = {o.dtype for o in ops if _is_float(o)}
    return out.astype(_BF16) if floats == {_BF16} else out


def nan_to_num(x: Any, copy: bool = True, nan: Any = 0.0, posinf: Any = None,
               neginf: Any = None) -> Any:
    """`numpy.nan_to_num`: NaN replaced by `nan`, +inf by `posinf` and -inf by `neginf`
    (by default the largest and the most negative finite value of the dtype).
    Integers and bool come back as they are. `copy` is accepted (values are
    never changed in place)."""
    if _trace_of("nan_to_num", (x,)) is None:
        return _np.nan_to_num(x, copy=copy, nan=nan, posinf=posinf, neginf=neginf)
    nan = _checks.real("nan_to_num", "nan", nan)
    posinf = None if posinf is None else _checks.real("nan_to_num", "posinf", posinf)
    neginf = None if neginf is None else _checks.real("nan_to_num", "neginf", neginf)
    if not _is_float(x):
        return x
    big = float(_ml_dtypes.finfo(x.dtype).max)
    hi = big if posinf is None else posinf
    lo = -big if neginf is None else neginf
    return where(isnan(x), nan, where(x == _np.inf, hi, where(x == -_np.inf, lo, x)))


def hypot(x1: Any, x2: Any) -> Any:
    """`numpy.hypot`: sqrt(x1**2 + x2**2) without overflow or underflow, as the larger
    magnitude times sqrt(1 + r**2) with r the ratio of the smaller to it (within 2
    ulp of numpy's); inf if either is infinite, even with a NaN. dtypes as
    `log1p`'s."""
    if _trace_of("hypot", (x1, x2)) is None:
        return _np.hypot(x1, x2)
    t = x1 if isinstance(x1, Tracer) else x2
    ops = [t._operand(x1), t._operand(x2)]
    if any(o is None for o in ops):
        raise TypeError(f"hypot: unsupported operands {type(x1).__name__} and {type(x2).__name__}")
    a, b = (abs(_float_operand(o)) for o in ops)
    big = maximum(a, b)
    small = minimum(a, b)
    safe = where(big == 0, 1, big)
    r = small / safe
    out = where(big == 0, 0, big * sqrt(1 + r * r))
    out = where((a == _np.inf) | (b == _np.inf), _np.inf, out)
    floats = {o.dtype for o in ops if _is_float(o)}
    return out.astype(_BF16) if floats == {_BF16} else out
