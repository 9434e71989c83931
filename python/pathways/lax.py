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

Loops (`scan`, `fori_loop`) trace their body once into one `scan` op of the
function IR, whatever the trip count (pathways._control_flow); `while_loop`
(and `fori_loop` with traced bounds) traces its cond and body once into one
`while` op, whose trip count the device decides. Conditionals
(`cond`, `switch`) on a traced predicate run every branch and select.
"""

from __future__ import annotations

import math
import threading
from typing import Any, Callable

import numpy as _np

from pathways import _checks
from pathways._checks import _to_array
from pathways._control_flow import WeakCarryPromoted, describe, scan_core, static_int, while_core
from pathways._pytree import tree_flatten, tree_map, tree_unflatten
from pathways._trace_state import _SUPPORTED_DTYPE_NAMES, _SUPPORTED_DTYPES, TracerError
from pathways._trace_state import _state, _TracerBase, one_device_pmap
from pathways._tracer import Tracer, WeakTracer, bind
from pathways.numpy import clip as _clip
from pathways.numpy import reshape as _reshape
from pathways.numpy import where as _where
from pathways.numpy._common import _trace_of

__all__ = [
    "top_k",
    "shift_left",
    "shift_right_logical",
    "shift_right_arithmetic",
    "bitcast_convert_type",
    "erf",
    "erfc",
    "rem",
    "cumsum",
    "cumprod",
    "cummax",
    "cummin",
    "scan",
    "fori_loop",
    "while_loop",
    "map",
    "cond",
    "switch",
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
            fn = _outside[key] = one_device_pmap(per_device)
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
    trace = x._check()
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


def _same_dtype_binary(name: str, x: Any, y: Any) -> Any:
    """Binary op `name` of jax.lax's kind (shifts, rem): operands of one dtype."""
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
    return _same_dtype_binary("shift_left", x, y)


def shift_right_logical(x: Any, y: Any) -> Any:
    """`x >> y` elementwise with zeros shifted in, like `jax.lax.shift_right_logical`.

    An int32's bits shift as a uint32's would. Counts outside [0, 32) give
    0. Arguments, result and errors as `shift_left`.
    """
    return _same_dtype_binary("shift_right_logical", x, y)


def shift_right_arithmetic(x: Any, y: Any) -> Any:
    """`x >> y` elementwise with the sign bit shifted in, like `jax.lax.shift_right_arithmetic`.

    A uint32's top bit is taken as its sign, as XLA does. Counts outside
    [0, 32) give 0, or -1 (all bits set) where the sign bit is set.
    Arguments, result and errors as `shift_left`.
    """
    return _same_dtype_binary("shift_right_arithmetic", x, y)


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


def rem(x: Any, y: Any) -> Any:
    """The remainder of truncated division, with the sign of `x`, like `jax.lax.rem`
    (C's fmod and %): exact for floats; integers by 0 give `x`, as XLA's.
    Operands of one dtype, as `jax.lax` takes them (a Python scalar takes the
    other's). Gradient: 1 to `x`, `-trunc(x / y)` to `y`. On concrete arrays
    it runs as a `pw.pmap` over one device and returns numpy arrays.

    Raises:
      TypeError: For operands of two dtypes.
      ValueError: If the shapes do not broadcast.
    """
    return _same_dtype_binary("rem", x, y)


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


# --- Loops ------------------------------------------------------------------------


def _loop_operand(trace: Any, leaf: Any, where: str, what: str) -> Tracer:
    """A carry or xs leaf as a traced value `trace` can read (numbers become constants)."""
    if isinstance(leaf, Tracer):
        leaf._check()
        return leaf
    if isinstance(leaf, _TracerBase):
        raise TracerError(
            f"{where} got a traced program value ({leaf.aval}) as {what}; pass program values "
            "to pmap'd functions as arguments"
        )
    if isinstance(leaf, (bool, int, float)) and not isinstance(leaf, _np.generic):
        return trace.constant(leaf, None)  # weakly typed, as in JAX
    arr = _to_array(leaf, where, None, what)
    if isinstance(arr, _np.ndarray) and arr.dtype not in _SUPPORTED_DTYPES:
        raise TypeError(
            f"{where}: {what} has dtype {arr.dtype}; supported dtypes: {_SUPPORTED_DTYPE_NAMES}"
        )
    return trace.constant(arr, None)


def _scan_traced(trace: Any, f: Callable[..., Any], init: Any, xs: Any, length: Any,
                 reverse: bool) -> tuple:
    name = getattr(f, "__name__", type(f).__name__)
    where = f"pw.lax.scan of {name!r}"
    carry_leaves, carry_tree = tree_flatten(init)
    x_leaves, x_tree = tree_flatten(xs)
    carries = [_loop_operand(trace, leaf, where, f"carry leaf {j}") for j, leaf in enumerate(carry_leaves)]
    x_vals = [_loop_operand(trace, leaf, where, f"xs leaf {i}") for i, leaf in enumerate(x_leaves)]
    for i, x in enumerate(x_vals):
        if x.ndim == 0:
            raise ValueError(
                f"{where}: xs leaf {i} ({x.aval}) has no leading axis to scan over"
            )
    sizes = sorted({x.shape[0] for x in x_vals})
    if length is not None:
        length = static_int(where, "length", length)
        if length < 0:
            raise ValueError(f"{where}: length must be >= 0, got {length}")
        if sizes and sizes != [length]:
            raise ValueError(
                f"{where}: length is {length}, which disagrees with the leading axis sizes of "
                f"xs ({describe(x_vals)})"
            )
    elif not sizes:
        raise ValueError(f"{where}: there are no xs to scan over, so length must be given")
    elif len(sizes) > 1:
        raise ValueError(
            f"{where}: the xs have different leading axis sizes ({describe(x_vals)})"
        )
    else:
        length = sizes[0]
    y_tree: list = []

    def body(c: list, x: list, consts: list) -> tuple:
        out = f(tree_unflatten(carry_tree, c), tree_unflatten(x_tree, x))
        if not isinstance(out, (tuple, list)) or len(out) != 2:
            raise TypeError(
                f"{where}: the body must return a pair (carry, y), got "
                f"{type(out).__name__}"
            )
        new_leaves, new_tree = tree_flatten(out[0])
        if new_tree != carry_tree:
            raise TypeError(
                f"{where}: the body's carry output must have the carry input's structure: "
                f"input {carry_tree}, output {new_tree}"
            )
        y_leaves, tree = tree_flatten(out[1])
        y_tree.append(tree)
        return new_leaves, y_leaves

    final, ys = _promoting_weak_carries(
        trace, carries, y_tree.clear,
        lambda: scan_core(trace, body, name, "scan body", carries, x_vals, [], length,
                          bool(reverse)))
    return tree_unflatten(carry_tree, final), tree_unflatten(y_tree[-1], ys)


def _promoting_weak_carries(trace: Any, carries: list, retrace: Callable[[], None],
                            core: Callable[[], Any]) -> Any:
    """`core()`, which traces a loop over `carries`, again while a weakly typed initial
    carry (a Python scalar) comes out of the body with another dtype: that carry
    takes the dtype the body gives it, as in JAX. `retrace()` runs before each
    new attempt.
    """
    for _ in range(len(carries)):
        try:
            return core()
        except WeakCarryPromoted as e:
            carries[e.index] = bind(trace, "convert", (carries[e.index],), dtype=e.dtype.name)
            retrace()
    return core()


def scan(f: Callable[..., Any], init: Any, xs: Any = None, length: Any = None,
         reverse: bool = False, unroll: Any = 1) -> tuple:
    """A loop carrying state over the leading axis of `xs`, like `jax.lax.scan`.

    Semantically::

      def scan(f, init, xs, length=None):
          carry, ys = init, []
          for x in xs:            # (x is None for each of `length` steps if xs is None)
              carry, y = f(carry, x)
              ys.append(y)
          return carry, np.stack(ys)

    but `f` is traced once, into the body of one `scan` op: tracing time and
    the IR do not grow with the trip count. The body may use every op of a
    compiled function, collectives (`pw.psum` over the pmap's axis) and
    nested loops, and read traced values of the enclosing function (they are
    passed to every iteration). `pw.grad` differentiates it: the forward
    keeps, stacked over the iterations, the values the backward reads, and
    the backward is a reverse loop over them (`pw.checkpoint(f)` keeps only
    `f`'s inputs and recomputes the rest). Int and bool carries get no
    gradient.

    Inside a function traced by `pw.pmap` it works on one shard's values;
    called on concrete arrays it runs as a `pw.pmap` over one device and
    returns numpy arrays.

    Args:
      f: `f(carry, x) -> (carry, y)`. The carry output must have the carry
        input's pytree structure and, leaf by leaf, its shape and dtype. `y`
        is any pytree of arrays (None for no ys).
      init: The initial carry: a pytree of arrays or numbers. Python
        scalars are weakly typed, as in JAX: a carry that starts as `0.0`
        takes the dtype the body gives it (float32 next to float32 values;
        the body is traced a second time then), and is float64 otherwise.
      xs: A pytree of arrays with a common leading axis to scan over, or
        None.
      length: The number of iterations: a static int, required when `xs` is
        None (then `x` is None), else equal to the leading axis of `xs`.
      reverse: Whether to run from the last slice of `xs` to the first (the
        ys are still stacked in the order of `xs`).
      unroll: Accepted for compatibility with JAX (an int >= 1 or a bool);
        it changes no result, and the loop is not unrolled.

    Returns:
      `(final carry, ys)`: the carry after the last iteration, and each leaf
      of `y` stacked along a new leading axis of size `length`.

    Raises:
      TypeError: If `f` is not callable, does not return a pair, or its
        carry output differs from its input in structure, shape or dtype; if
        `length` is not an int or `unroll` not an int or bool.
      ValueError: If the xs have different leading sizes or none (a scalar),
        `length` disagrees with them or is negative, or there are no xs and
        no `length`.
      TracerError: Called on concrete arrays inside `@pw.program` outside any
        pmap'd function.
    """
    if not callable(f):
        raise TypeError(f"pw.lax.scan expects a callable, got {f!r}")
    if isinstance(unroll, (bool, _np.bool_)):
        pass
    elif static_int("pw.lax.scan", "unroll", unroll) < 1:
        raise ValueError(f"pw.lax.scan: unroll must be >= 1, got {unroll!r}")
    if not isinstance(reverse, (bool, _np.bool_)):
        raise TypeError(f"pw.lax.scan: reverse must be a bool, got {reverse!r}")
    if length is not None:
        static_int("pw.lax.scan", "length", length)
    leaves = tree_flatten((init, xs))[0]
    trace = _function_trace("scan", next((x for x in leaves if isinstance(x, Tracer)), None))
    if trace is None:
        return _scan_outside(f, init, xs, length, bool(reverse))
    return _scan_traced(trace, f, init, xs, length, bool(reverse))


def _scan_outside(f: Callable[..., Any], init: Any, xs: Any, length: Any, reverse: bool) -> tuple:
    """`scan` on concrete arrays: a `pw.pmap` over one device (traced per call)."""

    def per_device(init: Any, xs: Any) -> Any:
        return scan(f, init, xs, length, reverse)

    per_device.__name__ = getattr(f, "__name__", "scan")
    return _loop_outside("scan", per_device, init, xs)


def _loop_outside(name: str, per_device: Callable[..., Any], *trees: Any) -> Any:
    """`per_device(*trees)` on pytrees of concrete arrays, as a `pw.pmap` over one
    device (traced per call): a loop called outside any pmap'd function.

    Returns:
      The outputs' pytree, of numpy arrays.

    Raises:
      TracerError: Inside `@pw.program` outside any pmap'd function.
      TypeError: For a leaf of a dtype the devices do not hold.
    """
    where = f"pw.lax.{name}"
    if _state.program is not None:
        raise TracerError(
            f"{where} was called in {_state.program.where()} outside any pmap'd function: "
            "call it inside the function given to pw.pmap"
        )

    def stack(leaf: Any) -> Any:
        arr = _np.asarray(_to_array(leaf, where, None, "leaf"))
        if arr.dtype not in _SUPPORTED_DTYPES:
            raise TypeError(
                f"{where}: a leaf of dtype {arr.dtype} is not supported; supported dtypes: "
                f"{_SUPPORTED_DTYPE_NAMES}"
            )
        return arr[None]

    out = one_device_pmap(per_device)(*[tree_map(stack, t) for t in trees])
    return tree_map(lambda o: _np.asarray(o)[0, ...], out)


def while_loop(cond_fun: Callable[..., Any], body_fun: Callable[..., Any], init_val: Any) -> Any:
    """`body_fun` applied while `cond_fun` holds, like `jax.lax.while_loop`.

    Semantically::

      def while_loop(cond_fun, body_fun, init_val):
          val = init_val
          while cond_fun(val):
              val = body_fun(val)
          return val

    but the trip count is decided on the device: `cond_fun` and `body_fun`
    are traced once each, into one `while` op of the function IR, whose
    condition the device computes before each iteration. Both may use
    every op of a compiled function, collectives over the pmap's axis,
    nested loops (scans, whiles), and traced values of the enclosing
    function. Inside `pw.pmap` each device runs its own trip count. A
    collective in the loop runs every iteration across the gang: with trip
    counts that differ across devices (a user error in JAX too), the
    devices that are done take part with their final values. There is no
    reverse-mode gradient, as in JAX: `pw.grad` through it raises
    ValueError (use `scan`, or `fori_loop` with static bounds); so does
    `pw.jvp`, which transposes the pullback (JAX's forward mode works).

    Called on concrete arrays it runs as a `pw.pmap` over one device and
    returns numpy arrays.

    Args:
      cond_fun: `cond_fun(val) -> bool scalar`.
      body_fun: `body_fun(val) -> val`, keeping the pytree structure and,
        leaf by leaf, the shape and dtype of `val`.
      init_val: The initial value: a pytree of arrays or numbers. Python
        scalars are weakly typed, as in JAX (as `scan`'s carries: one the
        body makes float32 is float32, and both functions are traced again).

    Returns:
      The value when `cond_fun` first fails (`init_val`'s if it fails at
      once). With an empty pytree, `init_val` itself: nothing is carried.

    Raises:
      TypeError: If `cond_fun` or `body_fun` is not callable, `cond_fun`
        does not return a bool scalar, or `body_fun`'s output differs from
        its input in structure, shape or dtype.
      TracerError: Called on concrete arrays inside `@pw.program` outside
        any pmap'd function.
    """
    for param, fn in (("cond_fun", cond_fun), ("body_fun", body_fun)):
        if not callable(fn):
            raise TypeError(f"pw.lax.while_loop: {param} must be callable, got {fn!r}")
    leaves, carry_tree = tree_flatten(init_val)
    if not leaves:
        return init_val
    trace = _function_trace("while_loop", next((x for x in leaves if isinstance(x, Tracer)), None))
    if trace is None:
        def per_device(init: Any) -> Any:
            return while_loop(cond_fun, body_fun, init)

        per_device.__name__ = getattr(body_fun, "__name__", "while_loop")
        return _loop_outside("while_loop", per_device, init_val)
    cond_name = getattr(cond_fun, "__name__", type(cond_fun).__name__)
    body_name = getattr(body_fun, "__name__", type(body_fun).__name__)
    where = f"pw.lax.while_loop of {body_name!r}"
    carries = [_loop_operand(trace, leaf, where, f"carry leaf {j}") for j, leaf in enumerate(leaves)]

    def cond(c: list, consts: list) -> Any:
        return cond_fun(tree_unflatten(carry_tree, c))

    def body(c: list, consts: list) -> list:
        new_leaves, new_tree = tree_flatten(body_fun(tree_unflatten(carry_tree, c)))
        if new_tree != carry_tree:
            raise TypeError(
                f"{where}: body_fun's output must have the structure of its input: input "
                f"{carry_tree}, output {new_tree}"
            )
        return new_leaves

    final = _promoting_weak_carries(
        trace, carries, lambda: None,
        lambda: while_core(trace, cond, body, cond_name, body_name, carries, []))
    return tree_unflatten(carry_tree, final)


def fori_loop(lower: Any, upper: Any, body_fun: Callable[..., Any], init_val: Any) -> Any:
    """`body_fun` applied for i in range(lower, upper), like `jax.lax.fori_loop`.

    Semantically::

      val = init_val
      for i in range(lower, upper):
          val = body_fun(i, val)
      return val

    With static bounds (Python ints) this is a `pw.lax.scan` of
    `upper - lower` iterations (none if upper <= lower) carrying `(i, val)`:
    the body is traced once and `pw.grad` differentiates through it. `i` is
    an int32 traced value. With a traced bound (a value of the pmap'd
    function) it is a `pw.lax.while_loop` carrying `(i, val)` while `i <
    upper`, as in JAX: each device runs its own trip count, and there is no
    reverse-mode gradient. `i` then has the traced bounds' dtype (two
    traced bounds must have one, as in JAX; a static bound takes the
    traced one's).

    Args:
      lower, upper: The bounds: static ints in int32's range, or traced
        integer scalars.
      body_fun: `body_fun(i, val) -> val`, keeping the structure, shapes and
        dtypes of `val`.
      init_val: The initial value: a pytree of arrays or numbers.

    Returns:
      The final value.

    Raises:
      TypeError: For bounds that are neither static ints nor traced integer
        scalars, or as `scan` (static bounds) and `while_loop` (traced).
      ValueError: For bounds outside int32's range.
    """
    if not callable(body_fun):
        raise TypeError(f"pw.lax.fori_loop expects a callable body_fun, got {body_fun!r}")
    where = "pw.lax.fori_loop"
    if isinstance(lower, Tracer) or isinstance(upper, Tracer):
        return _fori_while(lower, upper, body_fun, init_val)
    lo = static_int(where, "lower", lower)
    hi = static_int(where, "upper", upper)
    for param, v in (("lower", lo), ("upper", hi)):
        if not -(2**31) <= v <= _INT32_MAX:
            raise ValueError(f"{where}: {param} {v} is outside int32's range")
    n = max(hi - lo, 0)

    def step(carry: tuple, _: Any) -> tuple:
        i, val = carry
        return (i + 1, body_fun(i, val)), None

    start = _np.int32(lo)
    (_, val), _ = scan(step, (start, init_val), None, length=n)
    return val


def _fori_while(lower: Any, upper: Any, body_fun: Callable[..., Any], init_val: Any) -> Any:
    """`fori_loop` with a traced bound: a `while_loop` over `(i, val)` while `i < upper`."""
    where = "pw.lax.fori_loop"
    lo = _selector(where, "lower", lower, "iu")
    hi = _selector(where, "upper", upper, "iu")
    dtypes = [_np.dtype(b.dtype) for b in (lo, hi) if isinstance(b, Tracer)]
    if len(set(dtypes)) > 1:
        raise TypeError(
            f"{where}: lower and upper arguments to fori_loop must have equal types, got "
            f"{dtypes[0]} and {dtypes[1]}"
        )
    dtype = dtypes[0]
    for param, v in (("lower", lo), ("upper", hi)):
        if not isinstance(v, Tracer) and not -(2**31) <= v <= _INT32_MAX:
            raise ValueError(f"{where}: {param} {v} is outside int32's range")
    start = lo.astype(dtype) if isinstance(lo, Tracer) else _np.asarray(lo).astype(dtype)
    stop = hi.astype(dtype) if isinstance(hi, Tracer) else _np.asarray(hi).astype(dtype)

    def cond(carry: tuple) -> Any:
        return carry[0] < stop

    def step(carry: tuple) -> tuple:
        i, val = carry
        return i + 1, body_fun(i, val)

    cond.__name__ = "fori_cond"
    step.__name__ = getattr(body_fun, "__name__", "fori_body")
    return while_loop(cond, step, (start, init_val))[1]


def map(f: Callable[..., Any], xs: Any, *, batch_size: Any = None) -> Any:  # noqa: A001 (JAX's name)
    """`f` applied to each slice of `xs` along its leading axis, the results stacked, like
    `jax.lax.map`: a `scan` with no carry, so `f` is traced once whatever the
    length, and the slices run one after another.

    Args:
      f: A function of one slice of `xs` (a pytree of arrays), returning a
        pytree of arrays.
      xs: A pytree of arrays with a common leading axis.
      batch_size: As JAX's, a positive int or None: JAX maps `vmap(f)` over
        chunks of that many slices, which gives the same results as slice by
        slice; here the slices always run one at a time (pathways has no
        vmap), so it changes no result, as `scan`'s `unroll`.

    Raises:
      TypeError: If `f` is not callable, or `batch_size` is not an int.
      ValueError: For a `batch_size` below 1, or as `scan`.
    """
    if not callable(f):
        raise TypeError(f"pw.lax.map expects a callable, got {f!r}")
    if batch_size is not None and static_int("pw.lax.map", "batch_size", batch_size) < 1:
        raise ValueError(f"pw.lax.map: batch_size must be >= 1, got {batch_size!r}")

    def body(carry: Any, x: Any) -> tuple:
        return carry, f(x)

    body.__name__ = getattr(f, "__name__", "map")
    return scan(body, (), xs)[1]


# --- Conditionals -----------------------------------------------------------------


def _is_weak(leaf: Any) -> bool:
    """Whether a branch output takes the other branch's dtype: a Python or numpy
    scalar, or a weakly typed traced value (README: numpy scalars are weak)."""
    if isinstance(leaf, Tracer):
        return isinstance(leaf, WeakTracer)
    return isinstance(leaf, (bool, int, float, _np.generic))


def _kind(leaf: Any) -> str:
    """'b', 'i' or 'f': bool, integer (signed or not) or float (bfloat16 included)."""
    if isinstance(leaf, (bool, _np.bool_)):
        return "b"
    if isinstance(leaf, int):
        return "i"
    if isinstance(leaf, float):
        return "f"
    dt = getattr(leaf, "dtype", None)
    dt = _np.asarray(leaf).dtype if dt is None else _np.dtype(dt)
    return "i" if dt.kind in "iu" else "f" if dt.kind == "f" or dt.name == "bfloat16" else dt.kind


def _same_type(a: Any, b: Any) -> bool:
    """Whether two branch outputs have one type after JAX's weak-type promotion: equal
    strong dtypes; a weak value (a Python or numpy scalar, a weak traced value)
    of a kind the other's dtype holds without changing (a weak int with an
    integer or float, a weak float with a float, a weak bool with anything);
    two weak values of one kind."""
    wa, wb = _is_weak(a), _is_weak(b)
    if not wa and not wb:
        return _np.dtype(a.dtype) == _np.dtype(b.dtype)
    if wa and wb:
        return _kind(a) == _kind(b)
    weak, strong = (a, b) if wa else (b, a)
    k, ks = _kind(weak), _kind(strong)
    return k == "b" or (k == "i" and ks in "if") or (k == "f" and ks == "f")


def _branch_outputs(where: str, fns: list, operands: tuple) -> tuple:
    """Each branch called on `operands`: their output leaves and common tree.

    Raises:
      TypeError: If the branches' outputs differ in structure, in a leaf's
        shape, or in type after weak-type promotion (`_same_type`), as
        `jax.lax.cond` requires.
    """
    outs = []
    for k, fn in enumerate(fns):
        leaves, tree = tree_flatten(fn(*operands))
        for leaf in leaves:
            if isinstance(leaf, _TracerBase) and not isinstance(leaf, Tracer):
                raise TracerError(f"{where}: branch {k} returned a traced program value ({leaf.aval})")
        outs.append((leaves, tree))
    leaves0, tree0 = outs[0]
    for k, (leaves, tree) in enumerate(outs[1:], 1):
        if tree != tree0:
            raise TypeError(
                f"{where}: the branches must return the same structure: branch 0 gives "
                f"{tree0}, branch {k} gives {tree}"
            )
        for j, (a, b) in enumerate(zip(leaves0, leaves)):
            if _np.shape(a) != _np.shape(b) or not _same_type(a, b):
                raise TypeError(
                    f"{where}: the branches must return the same types: output leaf {j} is "
                    f"{describe([a])} in branch 0 and {describe([b])} in branch {k}"
                )
    return [leaves for leaves, _ in outs], tree0


def _selector(where: str, param: str, value: Any, kinds: str) -> Any:
    """A predicate or branch index, checked to be a scalar of a dtype of `kinds`:
    a Python int if it is concrete, else the traced value.

    Raises:
      TypeError: For any other shape or dtype.
      TracerError: For a traced program value.
    """
    expected = "a scalar bool or integer" if "b" in kinds else "a scalar integer"
    if isinstance(value, Tracer):
        value._check()
        if value.ndim != 0 or _np.dtype(value.dtype).kind not in kinds:
            raise TypeError(f"{where}: {param} must be {expected}, got {value.aval}")
        return value
    if isinstance(value, _TracerBase):
        raise TracerError(f"{where}: {param} is a traced program value ({value.aval}); decide it "
                          "inside a pmap'd function")
    v = _np.asarray(value)
    if v.ndim != 0 or v.dtype.kind not in kinds:
        raise TypeError(f"{where}: {param} must be {expected}, got {value!r}")
    return int(v)


def cond(pred: Any, true_fun: Callable[..., Any], false_fun: Callable[..., Any], *operands: Any) -> Any:
    """`true_fun(*operands)` if `pred` else `false_fun(*operands)`, like `jax.lax.cond`.

    A traced `pred` (a scalar bool or integer, nonzero is true) is known only
    on the devices: both branches are traced and run, and each output leaf
    is selected (`pnp.where`), as JAX does for a batched predicate. So both
    branches must be safe to run (a branch guarded against a division by
    zero still divides; the selected result is right, and its gradient too,
    unless the other branch's gradient is NaN or infinite there). A
    concrete `pred` (a Python or numpy value) calls only the branch it
    picks.

    Raises:
      TypeError: For branches that are not callable, a `pred` that is not a
        scalar bool or integer, or branches whose outputs differ in
        structure, shapes, or strong dtypes.
    """
    where = "pw.lax.cond"
    for param, fn in (("true_fun", true_fun), ("false_fun", false_fun)):
        if not callable(fn):
            raise TypeError(f"{where}: {param} must be callable, got {fn!r}")
    pred = _selector(where, "pred", pred, "biu")
    if not isinstance(pred, Tracer):
        return (true_fun if pred else false_fun)(*operands)
    (t, f), tree = _branch_outputs(where, [true_fun, false_fun], operands)
    return tree_unflatten(tree, [_where(pred, a, b) for a, b in zip(t, f)])


def switch(index: Any, branches: Any, *operands: Any) -> Any:
    """`branches[index](*operands)`, like `jax.lax.switch`: `index` is clamped into
    `[0, len(branches) - 1]`.

    A traced `index` (a scalar integer) runs every branch and selects each
    output leaf, as `cond` does (see there); a concrete one calls only its
    branch.

    Raises:
      ValueError: For an empty sequence of branches.
      TypeError: For a branch that is not callable, an `index` that is not a
        scalar integer, or branches whose outputs differ in structure,
        shapes, or strong dtypes.
    """
    where = "pw.lax.switch"
    fns = list(branches) if isinstance(branches, (list, tuple)) else None
    if fns is None:
        raise TypeError(f"{where}: branches must be a sequence of callables, got {branches!r}")
    if not fns:
        raise ValueError(f"{where}: branches must not be empty")
    for k, fn in enumerate(fns):
        if not callable(fn):
            raise TypeError(f"{where}: branch {k} must be callable, got {fn!r}")
    n = len(fns)
    index = _selector(where, "index", index, "iu")
    if not isinstance(index, Tracer):
        return fns[min(max(index, 0), n - 1)](*operands)
    outs, tree = _branch_outputs(where, fns, operands)
    if n == 1:
        return tree_unflatten(tree, outs[0])
    index = _clip(index, 0, n - 1)
    chosen = list(outs[n - 1])
    for k in range(n - 2, -1, -1):
        chosen = [_where(index == k, a, c) for a, c in zip(outs[k], chosen)]
    return tree_unflatten(tree, chosen)
