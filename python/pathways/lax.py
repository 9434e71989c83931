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

__all__ = ["top_k", "erf", "erfc", "cumsum", "cumprod", "cummax", "cummin"]

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
        array-like (float32, float64, int32 or bool; other integers become
        int32 and Python floats float64, as for `pw.pmap` arguments).
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
