"""`pathways.lax` (`pw.lax`): operations with the semantics of `jax.lax` that numpy has no name for.

Each function works on the traced values of a `pw.pmap`'d function, where it
records primitive ops (so `pw.grad` differentiates it through their rules),
and on concrete arrays, where it runs those same ops as a `pw.pmap` over one
device (so numpy arrays give the device kernels' results) and returns numpy
arrays.

  >>> f = pw.pmap(lambda logits: pw.lax.top_k(logits, 2), devices=tpus)
  >>> values, indices = f(np.array([[[1., 4., 3.]], [[5., 2., 6.]]]))
  >>> pw.lax.top_k(np.array([1., 4., 3.]), 2)
  (array([4., 3.]), array([1, 2], dtype=int32))
  >>> pw.lax.shift_right_logical(np.int32(-8), 28)
  array(15, dtype=int32)
"""

from __future__ import annotations

import math
import threading
from typing import Any, Callable

import numpy as _np

from pathways import _checks
from pathways._pmap import PmapFunction, _to_array
from pathways._trace_state import _SUPPORTED_DTYPE_NAMES, _SUPPORTED_DTYPES, TracerError
from pathways._trace_state import _state
from pathways._tracer import Tracer, bind
from pathways.numpy import reshape as _reshape
from pathways.numpy._common import _trace_of

__all__ = [
    "top_k",
    "shift_left",
    "shift_right_logical",
    "shift_right_arithmetic",
    "bitcast_convert_type",
    "erf",
    "erfc",
    "cumsum",
    "cumprod",
    "cummax",
    "cummin",
]

_INT32_MAX = 2**31 - 1


# --- Running on concrete arrays ---------------------------------------------------

# One pmap over one device per function and static arguments, created on
# first use; each compiles once per operand signature (as pw.grad's).
_outside_lock = threading.Lock()
_outside: dict = {}


def _run_outside(name: str, traced: Callable[..., Any], static: tuple, operands: tuple) -> Any:
    """`traced(*operands, *static)` on concrete operands, as a `pw.pmap` over one device.

    Returns:
      The outputs (a pytree) as numpy arrays.

    Raises:
      TracerError: Inside `@pw.program` outside any pmap'd function (the
        operation belongs inside one).
      TypeError: For an operand of a dtype the devices do not hold.
    """
    if _state.program is not None:
        raise TracerError(
            f"pw.lax.{name} was called in {_state.program.where()} outside any pmap'd "
            f"function: call it inside the function given to pw.pmap"
        )
    arrays = []
    for i, x in enumerate(operands):
        arr = _np.asarray(_to_array(x, f"pw.lax.{name}", i, "operand"))
        if arr.dtype not in _SUPPORTED_DTYPES:
            raise TypeError(
                f"pw.lax.{name}: operand of dtype {arr.dtype} is not supported; supported "
                f"dtypes: {_SUPPORTED_DTYPE_NAMES}"
            )
        arrays.append(arr[None])  # the one device's leading axis
    key = (name, static)
    with _outside_lock:
        fn = _outside.get(key)
        if fn is None:
            def per_device(*xs: Any) -> Any:
                return traced(*xs, *static)

            per_device.__name__ = name
            fn = _outside[key] = PmapFunction(per_device, None, None)
    outs = fn(*arrays)
    if isinstance(outs, tuple):
        return tuple(_np.asarray(o)[0, ...] for o in outs)
    return _np.asarray(outs)[0, ...]


def _function_trace(name: str, x: Any) -> Any:
    """The function trace `x` belongs to (the current one for a concrete `x`), or None outside any.

    Raises:
      TracerError: For a traced program value, or a traced value whose trace ended.
    """
    trace = _trace_of(name, (x,), "pw.lax")
    return _state.function if trace is None else trace


# --- top_k ----------------------------------------------------------------------


def _top_k_traced(x: Tracer, k: int) -> tuple:
    """`top_k` of traced `x`: the positions (one "top_k" op), then the values taken at them.

    The values are a `take` of the positions from `x` flattened (each row's
    positions offset by the row's start), so that `pw.grad` differentiates
    them by take's rule: the values' cotangent scattered (scatter_add) back
    to the positions, zeros elsewhere. One selection per row; the take and
    its gradient cost O(size of x).
    """
    trace = x._trace
    indices = bind(trace, "top_k", (x,), k=k)
    if x.ndim == 1:
        return bind(trace, "take", (x, indices), axis=0), indices
    lead = x.shape[:-1]
    n = x.shape[-1]
    rows = math.prod(lead)
    if rows * n > _INT32_MAX:
        raise ValueError(
            f"top_k: operand {x.aval} has more than 2**31 - 1 elements per shard, beyond the "
            "int32 positions its values are taken at"
        )
    # Row r's positions offset by r * n index x flattened; a take by
    # indices of shape lead + (k,) has that shape.
    starts = (_np.arange(rows, dtype=_np.int32) * _np.int32(n)).reshape(lead + (1,))
    flat_indices = indices + trace.constant(starts, None)
    return bind(trace, "take", (_reshape(x, (rows * n,)), flat_indices), axis=0), indices


def top_k(operand: Any, k: int) -> tuple:
    """The `k` largest elements along the last axis, and their positions, like `jax.lax.top_k`.

    Elements are ranked as XLA's TopK ranks them: larger first, equal ones by
    increasing position (a stable order), floats by IEEE 754 totalOrder: NaN
    is above +inf (a NaN with its sign bit set, as x86 makes `inf - inf`, is
    below -inf), and -0.0 below +0.0. `pw.grad` flows through the values: their
    cotangent goes back to the positions they were taken from (zeros
    elsewhere); the int32 positions carry none.

    Inside a function traced by `pw.pmap` it works on one shard's value;
    called on concrete arrays it runs as a `pw.pmap` over one device (compiled
    once per k and operand shape) and returns numpy arrays.

    Args:
      operand: An array of rank >= 1: a traced value, or a numpy array or
        array-like (float32, float64, int32, uint32, bool or bfloat16; other
        integers become int32 and Python floats float64, as for `pw.pmap`
        arguments).
      k: How many elements to keep from each row: a static int with
        0 <= k <= operand.shape[-1].

    Returns:
      `(values, indices)`: `values` of `operand`'s dtype and `indices` int32,
      both of shape `operand.shape[:-1] + (k,)`.

    Raises:
      TypeError: If `k` is not an int (a bool neither), or for an operand of
        an unsupported dtype.
      ValueError: If `k` is out of [0, operand.shape[-1]], or `operand` is a
        scalar.
      TracerError: For a traced value of another trace, or when called on
        concrete arrays inside `@pw.program` outside any pmap'd function.
    """
    k = _checks.index("top_k", "k", k)
    trace = _function_trace("top_k", operand)
    if trace is None:
        return _run_outside("top_k", _top_k_traced, (k,), (operand,))
    x = operand if isinstance(operand, Tracer) else trace.constant(operand, None)
    return _top_k_traced(x, k)


# --- Shifts and bitcasts ----------------------------------------------------------


def _is_python_scalar(x: Any) -> bool:
    return isinstance(x, (bool, int, float)) and not isinstance(x, _np.generic)


def _same_dtype_operands(name: str, x: Any, y: Any) -> tuple:
    """`x` and `y` of one dtype, as `jax.lax` takes them: a Python scalar takes the
    other operand's dtype (weak typing); two arrays must agree.

    Raises:
      TypeError: For arrays (traced or not) of two dtypes.
    """
    if _is_python_scalar(x) and not _is_python_scalar(y):
        dt = y.dtype if isinstance(y, Tracer) else _np.asarray(_to_array(y, f"pw.lax.{name}")).dtype
        x = _np.asarray(x, dt)
    elif _is_python_scalar(y) and not _is_python_scalar(x):
        dt = x.dtype if isinstance(x, Tracer) else _np.asarray(_to_array(x, f"pw.lax.{name}")).dtype
        y = _np.asarray(y, dt)
    dx = x.dtype if isinstance(x, Tracer) else _np.asarray(_to_array(x, f"pw.lax.{name}")).dtype
    dy = y.dtype if isinstance(y, Tracer) else _np.asarray(_to_array(y, f"pw.lax.{name}")).dtype
    if dx != dy:
        raise TypeError(
            f"{name}: operands must have the same dtype (as jax.lax.{name}), got {dx} and {dy}; "
            "convert one with .astype"
        )
    return x, y


def _shift(name: str, x: Any, y: Any) -> Any:
    trace = _trace_of(name, (x, y), "pw.lax")
    if trace is None:
        trace = _state.function
    x, y = _same_dtype_operands(name, x, y)
    if trace is None:
        return _run_outside(name, lambda a, b: bind(_state.function, name, (a, b)), (), (x, y))
    a = x if isinstance(x, Tracer) else trace.constant(x, None)
    b = y if isinstance(y, Tracer) else trace.constant(y, None)
    return bind(trace, name, (a, b))


def shift_left(x: Any, y: Any) -> Any:
    """`x << y` elementwise, like `jax.lax.shift_left`.

    Shift counts outside [0, 32) (negative ones included: they are taken as
    unsigned) shift every bit out and give 0, as XLA. Inside a function
    traced by `pw.pmap` it records an op; on concrete arrays it runs as a
    `pw.pmap` over one device and returns numpy arrays.

    Args:
      x, y: int32 or uint32 arrays (traced or numpy) of one dtype, or Python
        ints (which take the other operand's dtype); shapes broadcast.

    Returns:
      The shifted values, of the operands' dtype.

    Raises:
      TypeError: For operands of two dtypes, or not integers.
      ValueError: If the shapes do not broadcast.
    """
    return _shift("shift_left", x, y)


def shift_right_logical(x: Any, y: Any) -> Any:
    """`x >> y` elementwise with zeros shifted in, like `jax.lax.shift_right_logical`.

    An int32's bits shift as a uint32's would. Counts outside [0, 32) give
    0. Arguments, result and errors as `shift_left`.
    """
    return _shift("shift_right_logical", x, y)


def shift_right_arithmetic(x: Any, y: Any) -> Any:
    """`x >> y` elementwise with the sign bit shifted in, like `jax.lax.shift_right_arithmetic`.

    A uint32's top bit is taken as its sign, as XLA does. Counts outside
    [0, 32) give 0, or -1 (all bits set) where the sign bit is set.
    Arguments, result and errors as `shift_left`.
    """
    return _shift("shift_right_arithmetic", x, y)


_BITCAST_DTYPES = (_np.dtype(_np.float32), _np.dtype(_np.int32), _np.dtype(_np.uint32))


def bitcast_convert_type(operand: Any, new_dtype: Any) -> Any:
    """`operand`'s bits read as `new_dtype`, like `jax.lax.bitcast_convert_type`.

    Only types of one width are supported: float32, int32 and uint32 among
    themselves (JAX's width-changing casts need 8, 16 or 64-bit types, which
    the devices do not have). No gradient flows through it.

    Args:
      operand: A float32, int32 or uint32 array (traced or numpy).
      new_dtype: float32, int32 or uint32.

    Returns:
      An array of `operand`'s shape and dtype `new_dtype` (numpy's
      `operand.view(new_dtype)`).

    Raises:
      TypeError: For another dtype, of `operand` or `new_dtype`.
    """
    try:
        dt = _np.dtype(new_dtype)
    except TypeError:
        raise TypeError(f"bitcast_convert_type: new_dtype must be a dtype, got {new_dtype!r}") from None
    trace = _function_trace("bitcast_convert_type", operand)
    if isinstance(operand, Tracer):
        src = operand.dtype
    else:
        operand = _np.asarray(_to_array(operand, "pw.lax.bitcast_convert_type"))
        src = operand.dtype
    if dt not in _BITCAST_DTYPES or src not in _BITCAST_DTYPES:
        raise TypeError(
            f"bitcast_convert_type: {src} to {dt} is not supported: only float32, int32 and "
            "uint32 among themselves (the same width)"
        )
    if trace is None:
        return operand.view(dt)  # numpy's view is exactly the device's bitcast
    x = operand if isinstance(operand, Tracer) else trace.constant(operand, None)
    return bind(trace, "bitcast_convert_type", (x,), dtype=dt.name)


# --- erf, erfc ---------------------------------------------------------------------


def _erf_traced(x: Tracer, op: str) -> Tracer:
    return bind(x._trace, op, (x,))


def erf(x: Any) -> Any:
    """The error function, elementwise, like `jax.lax.erf` (see `pathways.numpy.erf`).

    Floats keep their dtype (int32 computes in float64, bool in float32); the
    kernel's error is below 0.501 ulp in float32 and 1 ulp in float64.
    Gradient: 2/sqrt(pi) * exp(-x**2). On concrete arrays it runs as a
    `pw.pmap` over one device and returns a numpy array.

    Raises:
      TypeError: For an operand of an unsupported dtype.
      TracerError: As `top_k`.
    """
    trace = _function_trace("erf", x)
    if trace is None:
        return _run_outside("erf", _erf_traced, ("erf",), (x,))
    return _erf_traced(x if isinstance(x, Tracer) else trace.constant(x, None), "erf")


def erfc(x: Any) -> Any:
    """1 - erf(x), elementwise and accurate where it is tiny, like `jax.lax.erfc` (float64
    error below 2.5 ulp). As `erf` otherwise."""
    trace = _function_trace("erfc", x)
    if trace is None:
        return _run_outside("erfc", _erf_traced, ("erfc",), (x,))
    return _erf_traced(x if isinstance(x, Tracer) else trace.constant(x, None), "erfc")


# --- cumsum, cumprod, cummax, cummin -----------------------------------------------------


_CUMULATIVE_NAMES = {"add": "cumsum", "mul": "cumprod", "max": "cummax", "min": "cummin"}


def _cumulative_traced(x: Tracer, combiner: str, axis: int, reverse: bool) -> Tracer:
    name = _CUMULATIVE_NAMES[combiner]
    if x.ndim == 0:
        raise ValueError(f"{name}: operand must have at least one dimension, got {x.aval}")
    if not -x.ndim <= axis < x.ndim:
        raise ValueError(f"{name}: axis {axis} is out of range for {x.aval}")
    return bind(x._trace, "cumulative", (x,), combiner=combiner, axis=axis % x.ndim,
                reverse=reverse)


def _cumulative(name: str, combiner: str, operand: Any, axis: Any, reverse: Any) -> Any:
    axis = _checks.index(name, "axis", axis)
    if not isinstance(reverse, (bool, _np.bool_)):
        raise TypeError(f"{name}: reverse must be a bool, got {reverse!r}")
    trace = _function_trace(name, operand)
    if trace is None:
        return _run_outside(name, _cumulative_traced, (combiner, axis, bool(reverse)), (operand,))
    x = operand if isinstance(operand, Tracer) else trace.constant(operand, None)
    return _cumulative_traced(x, combiner, axis, bool(reverse))


def cumsum(operand: Any, axis: int = 0, reverse: bool = False) -> Any:
    """Running sums along `axis`, like `jax.lax.cumsum`: element i sums elements 0..i
    (i..n-1 when `reverse`). bool and int32 sum in int32. Gradient: the running sum of
    the cotangent the other way. On concrete arrays, as `top_k`.

    Raises:
      ValueError: For an axis out of range or a zero-dimensional operand.
      TypeError: For a non-integer axis or a non-bool reverse.
    """
    return _cumulative("cumsum", "add", operand, axis, reverse)


def cumprod(operand: Any, axis: int = 0, reverse: bool = False) -> Any:
    """Running products along `axis`, like `jax.lax.cumprod`; the gradient is exact with
    zeros in the operand too. As `cumsum` otherwise."""
    return _cumulative("cumprod", "mul", operand, axis, reverse)


def cummax(operand: Any, axis: int = 0, reverse: bool = False) -> Any:
    """Running maxima along `axis`, like `jax.lax.cummax` (NaN propagates; bool: or). Each
    output's cotangent goes to the first position that attained it (JAX's splits ties
    along its scan tree). As `cumsum` otherwise."""
    return _cumulative("cummax", "max", operand, axis, reverse)


def cummin(operand: Any, axis: int = 0, reverse: bool = False) -> Any:
    """Running minima along `axis`, like `jax.lax.cummin`. As `cummax` otherwise."""
    return _cumulative("cummin", "min", operand, axis, reverse)
