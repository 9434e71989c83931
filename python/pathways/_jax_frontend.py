"""JAX as a front end: functions written with `jax.numpy`, `jax.lax`, flax, optax ... run unchanged.

A function given to `pw.pmap`, `pw.jit` or `pw.vjp` is traced by pathways'
own tracer first (`pathways.numpy`, the `Tracer` operators). When JAX's code
rejects one of our traced values (the error is raised inside the `jax`
package, or our tracer meets a JAX array), the function is a JAX function:
JAX traces it (`jax.make_jaxpr`, with the pmap's axis name bound) and
`lower_jaxpr` turns each equation of the jaxpr into ops of the function IR,
one rule per JAX primitive (`RULES`, as jax2tf's table of primitive to
TensorFlow op). The rules bind pathways' primitives (`pathways._tracer.bind`),
so the result is the same function IR, compiled, cached, scheduled and run as
any other, and gradient tapes see its ops as their own.

Every value a rule makes is checked against the shape and dtype JAX gave the
equation's output, so a rule that disagrees with JAX is an error naming the
primitive and the user's line, never a wrong answer. A primitive without a
rule raises `UnsupportedJaxFeature` (a `NotImplementedError`), a dtype the
devices do not have (complex64, float16, int64 ...) a `TypeError` as
pathways' own tracer does; both name it and the user's line that made it.

PRNG keys are their uint32 key data (shape + (2,) for threefry). The random
primitives (`random_bits`, `random_split`, `random_fold_in`, `random_seed`)
are lowered through JAX's own implementation of the key's PRNG, traced to a
jaxpr of `threefry2x32` and integer ops, so the bits are JAX's.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
from typing import Any, Callable, Optional, Sequence

import numpy as np

from pathways import _collectives, _control_flow
from pathways import numpy as pnp
from pathways._trace_state import (
    _SUPPORTED_DTYPE_NAMES,
    _SUPPORTED_DTYPES,
    JaxValueInPathwaysTrace,
    _state,
)
from pathways._pytree import TracedKeys
from pathways._tracer import Tracer, WeakTracer, _FunctionTrace, bind

__all__ = ["UnsupportedJaxFeature", "MixedFrontEndsError", "RULES", "lower_jaxpr", "trace_with_jax",
           "is_jax_function_error"]


class UnsupportedJaxFeature(NotImplementedError):
    """A JAX primitive or dtype that the function IR does not have (yet)."""


class MixedFrontEndsError(TypeError):
    """One function uses both pathways' front end (`pathways.numpy`, `pw.psum` ...) and JAX's."""


# --- Which front end ------------------------------------------------------------------

_THIS_FILE = os.path.abspath(__file__)
_TRACER_FILE = os.path.join(os.path.dirname(_THIS_FILE), "_tracer.py")
_TRACE_STATE_FILE = os.path.join(os.path.dirname(_THIS_FILE), "_trace_state.py")


def _package_dir(name: str) -> Optional[str]:
    mod = sys.modules.get(name)
    f = getattr(mod, "__file__", None)
    return None if f is None else os.path.dirname(os.path.abspath(f)) + os.sep


def unfiltered_jax_errors() -> Any:
    """A context in which JAX keeps its own frames in the tracebacks of its errors (this
    thread only), so that `is_jax_function_error` can see them; a no-op without JAX."""
    if "jax" not in sys.modules:
        return contextlib.nullcontext()
    from jax._src import config

    return config.traceback_filtering("off")


def _innermost_foreign(exc: BaseException, skip: tuple) -> str:
    """The file of the innermost frame of `exc`'s traceback not in a file or folder of `skip`."""
    frames = []
    tb = exc.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    for frame in reversed(frames):
        f = os.path.abspath(frame.f_code.co_filename)
        if not f.startswith(skip):
            return f
    return ""


def is_jax_function_error(exc: BaseException) -> bool:
    """Whether `exc`, raised while pathways traced a function, says the function is JAX's.

    That is: our tracer met a JAX array, or JAX's code raised it or called
    what raised it (numpy, or a conversion of our traced value such as
    `__array__`): JAX rejected a pathways traced value.
    """
    if "jax" not in sys.modules:
        return False
    if isinstance(exc, JaxValueInPathwaysTrace) or "<class 'pathways._tracer." in str(exc):
        return True
    skip = tuple(d for d in (_package_dir("numpy"),) if d) + (_TRACER_FILE, _TRACE_STATE_FILE)
    f = _innermost_foreign(exc, skip)
    return any(d is not None and f.startswith(d) for d in (_package_dir("jax"), _package_dir("jaxlib")))


def _raised_in_pathways(exc: BaseException) -> Optional[str]:
    """The pathways function that was given JAX's values, if that is what `exc` says.

    That is the innermost frame of the traceback that is neither JAX's nor
    numpy's, when it is pathways' (this module aside): `pnp.sin(x)` of a JAX
    tracer fails inside JAX (its `__array__`) called from pathways.numpy. An
    error of the user's code under JAX has the user's frame there instead.
    """
    skip = tuple(d for d in (_package_dir("jax"), _package_dir("jaxlib"), _package_dir("numpy")) if d)
    f = _innermost_foreign(exc, skip)
    pw_dir = os.path.dirname(_THIS_FILE) + os.sep
    if not f.startswith(pw_dir) or f == _THIS_FILE:
        return None
    tb = exc.__traceback__
    name = "pathways"
    while tb is not None:
        if os.path.abspath(tb.tb_frame.f_code.co_filename) == f:
            name = f"{tb.tb_frame.f_globals.get('__name__', 'pathways')}.{tb.tb_frame.f_code.co_name}"
        tb = tb.tb_next
    return name


def traced_by_jax(tree: Any) -> bool:
    """Whether a leaf of `tree` is a value of JAX's tracer: the function it was given to is
    being traced by JAX (a transformation given them does JAX's transformation)."""
    jax = sys.modules.get("jax")
    return jax is not None and any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves(tree))


# --- Tracing with JAX --------------------------------------------------------------------


def _source(eqn: Any) -> str:
    """The user's line that made `eqn`, as JAX records it ("file.py:12 (fn)"), or ""."""
    try:
        from jax._src import source_info_util

        return source_info_util.summarize(eqn.source_info)
    except Exception:  # noqa: BLE001 (an internal API: no line beats no message)
        return ""


def trace_with_jax(fn: Callable[..., Any], trace: _FunctionTrace, axis_size: int, args: Sequence[Any],
                   where: str) -> Any:
    """Calls `fn(*args)` by JAX's tracer and lowers its jaxpr into `trace`.

    Args:
      fn: A function written for JAX.
      trace: The current function trace (`_state.function`).
      axis_size: The number of devices of the pmap (bound to `trace.axis_name`).
      args: Pytrees (JAX's registry) of traced values of `trace` and static Python values.
      where: For messages ("pmap of 'f'").

    Returns:
      `fn`'s output: its pytree with traced values of `trace` for leaves.

    Raises:
      MixedFrontEndsError: If `fn` also calls pathways' front end on JAX's values.
      UnsupportedJaxFeature: For a primitive or dtype without a lowering.
      Exception: JAX's own errors for a function JAX cannot trace.
    """
    import jax

    from jax._src.random import prng

    leaves, in_tree = jax.tree_util.tree_flatten(args)
    traced = [i for i, x in enumerate(leaves) if isinstance(x, (Tracer, TracedKeys))]
    avals = []
    data = []
    for i in traced:
        x = leaves[i]
        if type(x) is TracedKeys:
            impl = _key_impl_of(x.impl)
            shape = x.data.shape[:len(x.data.shape) - len(impl.key_shape)]
            avals.append(jax.ShapeDtypeStruct(shape, prng.KeyTy(impl)))
            data.append(x.data)
        else:  # a Python scalar argument is weakly typed, as jax.jit makes it
            avals.append(jax.ShapeDtypeStruct(x.shape, x.dtype, weak_type=type(x) is WeakTracer))
            data.append(x)

    def flat_fn(*xs: Any) -> Any:
        full = list(leaves)
        for i, x in zip(traced, xs):
            full[i] = x
        return fn(*jax.tree_util.tree_unflatten(in_tree, full))

    axis_env = [(trace.axis_name, axis_size)] if trace.axis_name else []
    try:
        with unfiltered_jax_errors():
            closed, out_shape = jax.make_jaxpr(flat_fn, axis_env=axis_env, return_shape=True)(*avals)
    except Exception as e:
        culprit = _raised_in_pathways(e)
        if culprit is not None:
            raise MixedFrontEndsError(
                f"{where} mixes two front ends: JAX's (jax.numpy, jax.lax ...) and pathways' "
                f"({culprit} was given a value traced by JAX). Write the function with one of "
                f"them: jax.numpy and jax.lax functions work here as they are ({type(e).__name__}: "
                f"{e})"
            ) from e
        raise
    _check_primitives(closed.jaxpr, where)
    outs = lower_jaxpr(trace, closed, data, where)
    out_leaves, out_tree = jax.tree_util.tree_flatten(out_shape)
    outs = [TracedKeys(t, s.dtype._impl) if getattr(s.dtype, "_impl", None) is not None else t
            for t, s in zip(outs, out_leaves)]
    return jax.tree_util.tree_unflatten(out_tree, outs)


def _key_impl_of(spec: Any) -> Any:
    from jax._src.random import core as random_core

    return random_core.resolve_prng_impl(spec)


# --- The interpreter ---------------------------------------------------------------------


class _Ctx:
    """What rules need besides their operands: the trace and the equation (for messages)."""

    __slots__ = ("trace", "eqn", "where", "outer")

    def __init__(self, trace: _FunctionTrace, eqn: Any, where: str, outer: str = ""):
        self.trace = trace
        self.eqn = eqn
        self.where = where
        self.outer = outer  # the line of the equation this one is nested in

    def source(self) -> str:
        """The user's line that made the equation (of the enclosing call for JAX's own
        jitted functions, whose equations have no line of the user's)."""
        return _source(self.eqn) or self.outer

    def const(self, value: Any, dtype: Any) -> Tracer:
        arr = np.asarray(value, dtype=_device_dtype(self, np.dtype(dtype)))
        return self.trace.constant(arr, None)

    def lower(self, closed: Any, args: Sequence[Tracer]) -> list:
        """A nested (closed) jaxpr called on `args`, inline."""
        return lower_jaxpr(self.trace, closed, args, self.where, self.source())

    def fail(self, message: str, error: type = None) -> Exception:
        src = self.source()
        return (error or UnsupportedJaxFeature)(
            f"{self.where}: {message}{f' (at {src})' if src else ''}"
        )


def _device_dtype(ctx: Optional[_Ctx], dtype: np.dtype) -> np.dtype:
    if dtype in _SUPPORTED_DTYPES:
        return dtype
    what = f"dtype {dtype}"
    if ctx is None:
        raise TypeError(f"{what} is not supported; supported dtypes: {_SUPPORTED_DTYPE_NAMES}")
    raise ctx.fail(
        f"JAX primitive {ctx.eqn.primitive.name!r} makes a value of {what}, which the devices do "
        f"not have; supported dtypes: {_SUPPORTED_DTYPE_NAMES}", TypeError)


def _physical(aval: Any) -> tuple:
    """`(shape, dtype)` of a JAX aval as a traced value holds it: a key array as its key data."""
    dtype = aval.dtype
    impl = getattr(dtype, "_impl", None)
    if impl is not None:
        return tuple(aval.shape) + tuple(impl.key_shape), np.dtype(np.uint32)
    return tuple(aval.shape), np.dtype(dtype)


def lower_jaxpr(trace: _FunctionTrace, closed: Any, args: Sequence[Tracer], where: str,
                outer: str = "") -> list:
    """Lowers a closed jaxpr (or an open one with no consts) called on `args` into `trace`.

    Returns:
      The traced values of its outputs.
    """
    jaxpr = getattr(closed, "jaxpr", closed)
    consts = getattr(closed, "consts", ())
    env: dict = {}

    def read(v: Any) -> Tracer:
        if type(v).__name__ == "Literal":
            shape, dtype = _physical(v.aval)
            arr = np.asarray(v.val, dtype=dtype) if not shape else np.asarray(v.val)
            return trace.constant(np.asarray(arr, dtype=_device_dtype(None, dtype)), None)
        return env[v]

    for v, c in zip(jaxpr.constvars, consts):
        arr = np.asarray(c)
        shape, dtype = _physical(v.aval)
        if arr.dtype != dtype:
            arr = arr.astype(dtype)
        try:
            env[v] = trace.constant(np.asarray(arr, dtype=_device_dtype(None, dtype)), None)
        except TypeError as e:
            raise TypeError(f"{where}: a captured constant {v.aval}: {e}") from None
    if len(args) != len(jaxpr.invars):
        raise AssertionError(f"{where}: jaxpr of {len(jaxpr.invars)} inputs called with {len(args)}")
    for v, a in zip(jaxpr.invars, args):
        shape, dtype = _physical(v.aval)
        if a.dtype != dtype:
            # JAX canonicalizes (float64 is float32 without x64): as jax.jit converts its argument.
            a = bind(trace, "convert", [a], dtype=_device_dtype(None, dtype).name)
        if tuple(a.shape) != shape:
            raise AssertionError(f"{where}: jaxpr input {v.aval} given {a.aval}")
        env[v] = Tracer(trace, a._id) if type(a) is not Tracer else a
    for eqn in jaxpr.eqns:
        ctx = _Ctx(trace, eqn, where, outer)
        name = eqn.primitive.name
        rule = RULES.get(name)
        if rule is None:
            raise ctx.fail(
                f"JAX primitive {name!r} has no lowering to the function IR yet (see the "
                "primitive table in the README)"
            )
        operands = [read(v) for v in eqn.invars]
        params = eqn.params
        if name in _KEY_ADAPTERS and any(_key_ndim(v.aval) for v in eqn.invars):
            operands, params = _KEY_ADAPTERS[name](ctx, operands, dict(params))
        out = rule(ctx, *operands, **params)
        outs = list(out) if isinstance(out, (list, tuple)) else [out]
        if len(outs) != len(eqn.outvars):
            raise AssertionError(f"{where}: rule for {name!r} gave {len(outs)} results")
        for v, t in zip(eqn.outvars, outs):
            shape, dtype = _physical(v.aval)
            _device_dtype(ctx, dtype)
            if tuple(t.shape) != shape or t.dtype != dtype:
                raise AssertionError(
                    f"{where}: the lowering of JAX primitive {name!r} made {t.aval} where JAX "
                    f"gives {v.aval} (at {ctx.source()}); please report this"
                )
            if type(v).__name__ != "DropVar":
                env[v] = t
    return [read(v) for v in jaxpr.outvars]


def _key_ndim(aval: Any) -> int:
    """The number of trailing dims a key array's data adds to its shape (0: not keys)."""
    impl = getattr(getattr(aval, "dtype", None), "_impl", None)
    return 0 if impl is None else len(impl.key_shape)


def _check_primitives(jaxpr: Any, where: str, outer: str = "") -> None:
    """Raises for the first primitive without a rule, nested jaxprs included, before any is
    lowered: the message names it and its line even where an earlier equation would fail
    for a reason of its own (fft's cast to complex64)."""
    for eqn in jaxpr.eqns:
        ctx = _Ctx(None, eqn, where, outer)
        if eqn.primitive.name not in RULES:
            raise ctx.fail(
                f"JAX primitive {eqn.primitive.name!r} has no lowering to the function IR yet "
                "(see the primitive table in the README)"
            )
        for p in eqn.params.values():
            for sub in p if isinstance(p, (tuple, list)) else (p,):
                inner = getattr(sub, "jaxpr", None)
                if inner is not None and hasattr(getattr(inner, "jaxpr", inner), "eqns"):
                    _check_primitives(getattr(inner, "jaxpr", inner), where, ctx.source())
                elif hasattr(sub, "eqns"):
                    _check_primitives(sub, where, ctx.source())


# Structural primitives on key arrays work on their key data: the trailing key dims ride along.


def _key_trailing(ctx: _Ctx, operands: list) -> tuple:
    k = max(_key_ndim(v.aval) for v in ctx.eqn.invars)
    v = next(v for v in ctx.eqn.invars if _key_ndim(v.aval))
    return k, tuple(v.aval.dtype._impl.key_shape)


def _keys_slice(ctx: _Ctx, operands: list, params: dict) -> tuple:
    k, ks = _key_trailing(ctx, operands)
    params["start_indices"] = tuple(params["start_indices"]) + (0,) * k
    params["limit_indices"] = tuple(params["limit_indices"]) + ks
    if params.get("strides") is not None:
        params["strides"] = tuple(params["strides"]) + (1,) * k
    return operands, params


def _keys_reshape(ctx: _Ctx, operands: list, params: dict) -> tuple:
    k, ks = _key_trailing(ctx, operands)
    params["new_sizes"] = tuple(params["new_sizes"]) + ks
    if params.get("dimensions") is not None:
        n = len(params["dimensions"])
        params["dimensions"] = tuple(params["dimensions"]) + tuple(range(n, n + k))
    return operands, params


def _keys_broadcast(ctx: _Ctx, operands: list, params: dict) -> tuple:
    k, ks = _key_trailing(ctx, operands)
    n = len(params["shape"])
    params["shape"] = tuple(params["shape"]) + ks
    params["broadcast_dimensions"] = tuple(params["broadcast_dimensions"]) + tuple(range(n, n + k))
    return operands, params


def _keys_transpose(ctx: _Ctx, operands: list, params: dict) -> tuple:
    k, _ = _key_trailing(ctx, operands)
    n = len(params["permutation"])
    params["permutation"] = tuple(params["permutation"]) + tuple(range(n, n + k))
    return operands, params


def _keys_select(ctx: _Ctx, operands: list, params: dict) -> tuple:
    k, ks = _key_trailing(ctx, operands)
    which = operands[0]
    if which.shape:
        which = _b(ctx, "reshape", which, shape=list(which.shape) + [1] * k)
    which = _b(ctx, "broadcast_to", which, shape=list(operands[1].shape))
    return [which] + list(operands[1:]), params


def _keys_dynamic_slice(ctx: _Ctx, operands: list, params: dict) -> tuple:
    k, ks = _key_trailing(ctx, operands)
    zeros = [ctx.const(0, np.int32)] * k
    if ctx.eqn.primitive.name == "dynamic_slice":
        params["slice_sizes"] = tuple(params["slice_sizes"]) + ks
    return list(operands) + zeros, params


def _keys_gather(ctx: _Ctx, operands: list, params: dict) -> tuple:
    k, ks = _key_trailing(ctx, operands)
    out_rank = len(ctx.eqn.outvars[0].aval.shape)
    dn = params["dimension_numbers"]
    params["dimension_numbers"] = dn._replace(
        offset_dims=tuple(dn.offset_dims) + tuple(range(out_rank, out_rank + k)))
    params["slice_sizes"] = tuple(params["slice_sizes"]) + ks
    return operands, params


_KEY_ADAPTERS = {
    "slice": _keys_slice,
    "reshape": _keys_reshape,
    "broadcast_in_dim": _keys_broadcast,
    "transpose": _keys_transpose,
    "select_n": _keys_select,
    "dynamic_slice": _keys_dynamic_slice,
    "dynamic_update_slice": _keys_dynamic_slice,
    "gather": _keys_gather,
}


# --- Rules ---------------------------------------------------------------------------------

RULES: dict = {}


def _rule(*names: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        for n in names:
            RULES[n] = fn
        return fn

    return register


def _b(ctx: _Ctx, prim: str, *xs: Tracer, **params: Any) -> Tracer:
    return bind(ctx.trace, prim, list(xs), **params)


def _out_aval(ctx: _Ctx, i: int = 0) -> tuple:
    return _physical(ctx.eqn.outvars[i].aval)


def _convert(ctx: _Ctx, x: Tracer, dtype: Any) -> Tracer:
    dtype = np.dtype(dtype)
    return x if x.dtype == dtype else _b(ctx, "convert", x, dtype=dtype.name)


def _full(ctx: _Ctx, value: Any, shape: Sequence[int], dtype: Any) -> Tracer:
    c = ctx.const(value, dtype)
    return c if tuple(shape) == () else _b(ctx, "broadcast_to", c, shape=list(shape))


def _same(name: str) -> None:
    RULES[name] = lambda ctx, *xs, **_: _b(ctx, name, *xs)


for _n in ("add", "sub", "mul", "max", "min", "eq", "ne", "lt", "le", "gt", "ge", "and", "or", "xor",
           "neg", "exp", "log", "tanh", "sqrt", "rsqrt", "sin", "cos", "tan", "asin", "acos", "atan",
           "sinh", "cosh", "asinh", "acosh", "atanh", "erf", "erfc", "atan2", "not",
           "shift_left", "shift_right_logical", "shift_right_arithmetic"):
    _same(_n)
RULES["add_any"] = lambda ctx, x, y: _b(ctx, "add", x, y)


@_rule("abs")
def _abs(ctx: _Ctx, x: Tracer) -> Tracer:
    return x if x.dtype.kind in "bu" else _b(ctx, "abs", x)


@_rule("div")
def _div(ctx: _Ctx, x: Tracer, y: Tracer) -> Tracer:
    if x.dtype.kind in "iu":
        # lax.div of integers rounds toward zero (C's), as XLA; x / 0 is -1 for
        # unsigned and for signed as XLA defines it (see rem).
        return _int_div_rem(ctx, x, y)[0]
    return _b(ctx, "div", x, y)


@_rule("rem")
def _rem(ctx: _Ctx, x: Tracer, y: Tracer) -> Tracer:
    if x.dtype.kind in "iu":
        return _int_div_rem(ctx, x, y)[1]
    return _b(ctx, "rem", x, y)


def _int_div_rem(ctx: _Ctx, x: Tracer, y: Tracer) -> tuple:
    """XLA's integer division and remainder: toward zero; by zero: q = -1 (all ones), r = x;
    INT_MIN / -1 = INT_MIN, remainder 0."""
    shape = np.broadcast_shapes(x.shape, y.shape)
    x = _b(ctx, "broadcast_to", x, shape=list(shape)) if x.shape != shape else x
    y = _b(ctx, "broadcast_to", y, shape=list(shape)) if y.shape != shape else y
    zero = ctx.const(0, y.dtype)
    by_zero = _b(ctx, "eq", y, zero)
    safe_y = _b(ctx, "select", by_zero, _full(ctx, 1, shape, y.dtype), y)
    xf, yf = _convert(ctx, x, np.float64), _convert(ctx, safe_y, np.float64)
    qf = _b(ctx, "div", xf, yf)
    # toward zero: floor of |q| with q's sign; exact since |x| < 2**32 (float64 quotients of
    # 32-bit integers never round across an integer)
    qa = _b(ctx, "abs", qf)
    qt = _b(ctx, "sub", qa, _b(ctx, "rem", qa, ctx.const(1.0, np.float64)))
    qt = _b(ctx, "select", _b(ctx, "lt", qf, ctx.const(0.0, np.float64)), _b(ctx, "neg", qt), qt)
    if x.dtype == np.int32:
        # INT_MIN / -1 overflows to INT_MIN, as XLA (the float quotient 2**31 does not fit)
        qt = _b(ctx, "select", _b(ctx, "ge", qt, ctx.const(2.0**31, np.float64)),
                _full(ctx, -(2.0**31), shape, np.float64), qt)
    q = _convert(ctx, qt, x.dtype)
    r = _b(ctx, "sub", x, _b(ctx, "mul", q, safe_y))
    minus_one = _full(ctx, -1 if x.dtype == np.int32 else 2**32 - 1, shape, x.dtype)
    q = _b(ctx, "select", by_zero, minus_one, q)
    r = _b(ctx, "select", by_zero, x, r)
    return q, r


@_rule("pow")
def _pow(ctx: _Ctx, x: Tracer, y: Tracer) -> Tracer:
    return _b(ctx, "pow", x, _convert(ctx, y, x.dtype))


@_rule("integer_pow")
def _integer_pow(ctx: _Ctx, x: Tracer, *, y: int) -> Tracer:
    # Square-and-multiply, as lax's lowering of integer_pow.
    if y == 0:
        return _full(ctx, 1, x.shape, x.dtype)
    n = abs(y)
    acc = None
    base = x
    while n:
        if n & 1:
            acc = base if acc is None else _b(ctx, "mul", acc, base)
        n >>= 1
        if n:
            base = _b(ctx, "mul", base, base)
    return _b(ctx, "div", ctx.const(1, x.dtype), acc) if y < 0 else acc


@_rule("square")
def _square(ctx: _Ctx, x: Tracer) -> Tracer:
    return _b(ctx, "mul", x, x)


@_rule("logistic")
def _logistic(ctx: _Ctx, x: Tracer, **_: Any) -> Tracer:
    one = ctx.const(1, x.dtype)
    return _b(ctx, "div", one, _b(ctx, "add", one, _b(ctx, "exp", _b(ctx, "neg", x))))


@_rule("exp2")
def _exp2(ctx: _Ctx, x: Tracer, **_: Any) -> Tracer:
    return _b(ctx, "pow", ctx.const(2, x.dtype), x)


def _via_pnp(name: str) -> Callable[..., Tracer]:
    def rule(ctx: _Ctx, x: Tracer, **_: Any) -> Tracer:
        return getattr(pnp, name)(x)

    return rule


for _n in ("log1p", "expm1", "floor", "ceil"):
    RULES[_n] = _via_pnp(_n)


@_rule("cbrt")
def _cbrt(ctx: _Ctx, x: Tracer, **_: Any) -> Tracer:
    a = _b(ctx, "abs", x)
    r = _b(ctx, "pow", a, ctx.const(1 / 3, x.dtype))
    r = _b(ctx, "select", _b(ctx, "lt", x, ctx.const(0, x.dtype)), _b(ctx, "neg", r), r)
    return _b(ctx, "select", _b(ctx, "eq", x, ctx.const(0, x.dtype)), x, r)


@_rule("round")
def _round(ctx: _Ctx, x: Tracer, *, rounding_method: Any) -> Tracer:
    if int(rounding_method) == 1:  # TO_NEAREST_EVEN
        return pnp.round(x)
    # AWAY_FROM_ZERO: trunc(x + copysign(0.5, x)) computed without the rounding of x + 0.5
    a = _b(ctx, "abs", x)
    f = pnp.floor(a)
    up = _b(ctx, "ge", _b(ctx, "sub", a, f), ctx.const(0.5, x.dtype))
    r = _b(ctx, "select", up, _b(ctx, "add", f, ctx.const(1, x.dtype)), f)
    r = _b(ctx, "select", _b(ctx, "lt", x, ctx.const(0, x.dtype)), _b(ctx, "neg", r), r)
    # NaN and inf stay; -0.0 stays
    return _b(ctx, "select", _b(ctx, "eq", a, a), _b(ctx, "select", _b(ctx, "eq", f, a), x, r), x)


@_rule("sign")
def _sign(ctx: _Ctx, x: Tracer) -> Tracer:
    if x.dtype.kind == "u":
        return _convert(ctx, _b(ctx, "ne", x, ctx.const(0, x.dtype)), x.dtype)
    zero = ctx.const(0, x.dtype)
    one = _full(ctx, 1, x.shape, x.dtype)
    s = _b(ctx, "select", _b(ctx, "gt", x, zero), one,
           _b(ctx, "select", _b(ctx, "lt", x, zero), _b(ctx, "neg", one), x))
    return s


@_rule("is_finite")
def _is_finite(ctx: _Ctx, x: Tracer) -> Tracer:
    return _b(ctx, "eq", _b(ctx, "sub", x, x), ctx.const(0, x.dtype))


@_rule("clamp")
def _clamp(ctx: _Ctx, lo: Tracer, x: Tracer, hi: Tracer) -> Tracer:
    return _b(ctx, "min", _b(ctx, "max", x, lo), hi)


@_rule("nextafter")
def _nextafter(ctx: _Ctx, x: Tracer, y: Tracer) -> Tracer:
    """The float after x toward y: x's bits one up or down (sign and magnitude, as IEEE)."""
    if x.dtype != np.float32:
        raise ctx.fail(f"nextafter of {x.dtype}")
    u32 = np.dtype(np.uint32)
    shape = list(np.broadcast_shapes(x.shape, y.shape))
    x = _b(ctx, "broadcast_to", x, shape=shape) if list(x.shape) != shape else x
    y = _b(ctx, "broadcast_to", y, shape=shape) if list(y.shape) != shape else y
    bits = _b(ctx, "bitcast_convert_type", x, dtype="uint32")
    zero = ctx.const(0.0, x.dtype)
    away = _b(ctx, "eq", _b(ctx, "gt", y, x), _b(ctx, "gt", x, zero))
    one = ctx.const(1, u32)
    stepped = _b(ctx, "select", away, _b(ctx, "add", bits, one), _b(ctx, "sub", bits, one))
    # from zero: the smallest subnormal with y's sign
    ybits = _b(ctx, "bitcast_convert_type", y, dtype="uint32")
    tiny = _b(ctx, "or", _b(ctx, "and", ybits, ctx.const(0x80000000, u32)), one)
    stepped = _b(ctx, "select", _b(ctx, "eq", x, zero), tiny, stepped)
    out = _b(ctx, "bitcast_convert_type", stepped, dtype="float32")
    out = _b(ctx, "select", _b(ctx, "eq", x, y), y, out)
    nan = _b(ctx, "or", _b(ctx, "ne", x, x), _b(ctx, "ne", y, y))
    return _b(ctx, "select", nan, _b(ctx, "add", x, y), out)


@_rule("select_n")
def _select_n(ctx: _Ctx, which: Tracer, *cases: Tracer) -> Tracer:
    if len(cases) == 1:
        return cases[0]
    if which.dtype == np.bool_:
        return _b(ctx, "select", which, cases[1], cases[0])
    out = cases[0]
    for i in range(1, len(cases)):
        out = _b(ctx, "select", _b(ctx, "ge", which, ctx.const(i, which.dtype)), cases[i], out)
    return out


@_rule("convert_element_type")
def _convert_element_type(ctx: _Ctx, x: Tracer, *, new_dtype: Any, **_: Any) -> Tracer:
    dtype = _device_dtype(ctx, np.dtype(new_dtype))
    if dtype == np.bool_ and x.dtype != np.bool_:
        return _b(ctx, "ne", x, ctx.const(0, x.dtype))
    return _convert(ctx, x, dtype)


@_rule("bitcast_convert_type")
def _bitcast(ctx: _Ctx, x: Tracer, *, new_dtype: Any) -> Tracer:
    dtype = _device_dtype(ctx, np.dtype(new_dtype))
    if dtype == x.dtype:
        return x
    if dtype.itemsize != x.dtype.itemsize:
        raise ctx.fail(f"bitcast_convert_type from {x.dtype} to {dtype} (different widths)")
    return _b(ctx, "bitcast_convert_type", x, dtype=dtype.name)


@_rule("reduce_precision")
def _reduce_precision(ctx: _Ctx, x: Tracer, *, exponent_bits: int, mantissa_bits: int) -> Tracer:
    finfo = np.finfo(x.dtype) if x.dtype.kind == "f" else None
    if finfo is not None and (exponent_bits, mantissa_bits) == (finfo.nexp, finfo.nmant):
        return x
    if (exponent_bits, mantissa_bits) == (8, 7):
        import ml_dtypes

        return _convert(ctx, _convert(ctx, x, ml_dtypes.bfloat16), x.dtype)
    raise ctx.fail(f"reduce_precision to {exponent_bits} exponent and {mantissa_bits} mantissa bits")


@_rule("stop_gradient")
def _stop_gradient(ctx: _Ctx, x: Tracer) -> Tracer:
    return _b(ctx, "stop_gradient", x)


def _identity(ctx: _Ctx, *xs: Tracer, **_: Any) -> Any:
    return list(xs)


for _n in ("copy", "sharding_constraint", "optimization_barrier", "random_wrap", "random_unwrap",
           "random_clone", "device_put"):
    RULES[_n] = _identity


# --- Shapes ----------------------------------------------------------------------------------


@_rule("iota")
def _iota(ctx: _Ctx, *, dtype: Any, shape: Sequence[int], dimension: int, **_: Any) -> Tracer:
    dtype = _device_dtype(ctx, np.dtype(dtype))
    line = np.arange(shape[dimension]).astype(dtype)
    view = [1] * len(shape)
    view[dimension] = shape[dimension]
    c = ctx.trace.constant(np.ascontiguousarray(line.reshape(view)), None)
    return c if tuple(view) == tuple(shape) else _b(ctx, "broadcast_to", c, shape=list(shape))


@_rule("broadcast_in_dim")
def _broadcast_in_dim(ctx: _Ctx, x: Tracer, *dyn: Tracer, shape: Sequence[int],
                      broadcast_dimensions: Sequence[int], **_: Any) -> Tracer:
    if dyn:
        raise ctx.fail("broadcast_in_dim with dynamic shapes")
    view = [1] * len(shape)
    for src, dst in enumerate(broadcast_dimensions):
        view[dst] = x.shape[src]
    if tuple(view) != tuple(x.shape):
        x = _b(ctx, "reshape", x, shape=view)
    return x if tuple(view) == tuple(shape) else _b(ctx, "broadcast_to", x, shape=list(shape))


@_rule("reshape")
def _reshape(ctx: _Ctx, x: Tracer, *dyn: Tracer, new_sizes: Sequence[int], dimensions: Any,
             **_: Any) -> Tracer:
    if dyn:
        raise ctx.fail("reshape with dynamic shapes")
    if dimensions is not None and tuple(dimensions) != tuple(range(x.ndim)):
        x = _b(ctx, "transpose", x, perm=list(dimensions))
    return x if tuple(new_sizes) == x.shape else _b(ctx, "reshape", x, shape=list(new_sizes))


@_rule("squeeze")
def _squeeze(ctx: _Ctx, x: Tracer, *, dimensions: Sequence[int]) -> Tracer:
    return _b(ctx, "reshape", x, shape=list(_out_aval(ctx)[0]))


@_rule("transpose")
def _transpose(ctx: _Ctx, x: Tracer, *, permutation: Sequence[int]) -> Tracer:
    if tuple(permutation) == tuple(range(x.ndim)):
        return x
    return _b(ctx, "transpose", x, perm=list(permutation))


@_rule("slice")
def _slice(ctx: _Ctx, x: Tracer, *, start_indices: Sequence[int], limit_indices: Sequence[int],
           strides: Optional[Sequence[int]]) -> Tracer:
    strides = list(strides) if strides is not None else [1] * x.ndim
    return _b(ctx, "slice", x, start=[int(s) for s in start_indices],
              limit=[int(s) for s in limit_indices], step=[int(s) for s in strides])


@_rule("rev")
def _rev(ctx: _Ctx, x: Tracer, *, dimensions: Sequence[int]) -> Tracer:
    return _b(ctx, "rev", x, axes=list(dimensions)) if dimensions else x


@_rule("concatenate")
def _concatenate(ctx: _Ctx, *xs: Tracer, dimension: int) -> Tracer:
    return _b(ctx, "concatenate", *xs, axis=dimension) if len(xs) > 1 else xs[0]


@_rule("split")
def _split(ctx: _Ctx, x: Tracer, *, sizes: Sequence[int], axis: int) -> list:
    outs, start = [], 0
    for s in sizes:
        lo = [0] * x.ndim
        hi = list(x.shape)
        lo[axis], hi[axis] = start, start + s
        outs.append(_b(ctx, "slice", x, start=lo, limit=hi, step=[1] * x.ndim))
        start += s
    return outs


@_rule("stack")
def _stack(ctx: _Ctx, *xs: Tracer, axis: int) -> Tracer:
    shape = list(_out_aval(ctx)[0])
    one = shape[:axis] + [1] + shape[axis + 1:]
    parts = [_b(ctx, "reshape", x, shape=one) for x in xs]
    return _b(ctx, "concatenate", *parts, axis=axis) if len(parts) > 1 else parts[0]


@_rule("unstack")
def _unstack(ctx: _Ctx, x: Tracer, *, axis: int) -> list:
    out_shape = [d for i, d in enumerate(x.shape) if i != axis]
    outs = []
    for i in range(x.shape[axis]):
        lo = [0] * x.ndim
        hi = list(x.shape)
        lo[axis], hi[axis] = i, i + 1
        part = _b(ctx, "slice", x, start=lo, limit=hi, step=[1] * x.ndim)
        outs.append(_b(ctx, "reshape", part, shape=out_shape))
    return outs


@_rule("tile")
def _tile(ctx: _Ctx, x: Tracer, *, reps: Sequence[int]) -> Tracer:
    out = x
    for d, r in enumerate(reps):
        if r != 1:
            out = _b(ctx, "concatenate", *([out] * r), axis=d) if r > 0 else out
    return out if tuple(out.shape) == _out_aval(ctx)[0] else _full(ctx, 0, *_out_aval(ctx))


@_rule("pad")
def _pad(ctx: _Ctx, x: Tracer, value: Optional[Tracer], *, padding_config: Sequence[tuple]) -> Tracer:
    """lax.pad: `value` around and between (None: zeros); negative padding crops."""
    config = [(int(lo), int(hi), int(interior)) for lo, hi, interior in padding_config]
    grown = [(max(lo, 0), max(hi, 0), interior) for lo, hi, interior in config]
    padded = x
    if any(g != (0, 0, 0) for g in grown):
        padded = _b(ctx, "pad", x, lo=[g[0] for g in grown], hi=[g[1] for g in grown],
                    interior=[g[2] for g in grown])
        # Where the zeros went in, the padding value: a mask computed now, on the host.
        mask = np.zeros(padded.shape, dtype=bool)
        mask[tuple(slice(lo, lo + (n - 1) * (i + 1) + 1 if n else lo, i + 1)
                   for (lo, _, i), n in zip(grown, x.shape))] = True
        if value is not None and not mask.all():
            fill = _b(ctx, "broadcast_to", value, shape=list(padded.shape))
            padded = _b(ctx, "select", ctx.trace.constant(mask, None), padded, fill)
    if any(lo < 0 or hi < 0 for lo, hi, _ in config):
        start = [-lo if lo < 0 else 0 for lo, _, _ in config]
        limit = [n + hi if hi < 0 else n for n, (_, hi, _) in zip(padded.shape, config)]
        padded = _b(ctx, "slice", padded, start=start, limit=limit, step=[1] * x.ndim)
    return padded


# --- Reductions ------------------------------------------------------------------------------


def _reduce(kind: str) -> Callable[..., Tracer]:
    def rule(ctx: _Ctx, x: Tracer, *, axes: Sequence[int], **_: Any) -> Tracer:
        if not axes:
            return x
        if x.size == 0 and x.dtype == np.bool_:
            return _full(ctx, kind == "min", _out_aval(ctx)[0], np.bool_)
        if x.dtype == np.bool_:
            # any / all as max / min of int32
            r = _b(ctx, "reduce", _convert(ctx, x, np.int32), kind=kind, axes=list(axes), keepdims=False)
            return _b(ctx, "ne", r, ctx.const(0, np.int32))
        if x.size == 0 and kind in ("max", "min"):
            ident = _lowest(x.dtype) if kind == "max" else _highest(x.dtype)
            return _full(ctx, ident, _out_aval(ctx)[0], x.dtype)
        return _b(ctx, "reduce", x, kind=kind, axes=list(axes), keepdims=False)

    return rule


RULES["reduce_sum"] = _reduce("sum")
RULES["reduce_max"] = _reduce("max")
RULES["reduce_min"] = _reduce("min")
RULES["reduce_or"] = _reduce("max")
RULES["reduce_and"] = _reduce("min")


@_rule("reduce_prod")
def _reduce_prod(ctx: _Ctx, x: Tracer, *, axes: Sequence[int], **_: Any) -> Tracer:
    if not axes:
        return x
    keep = [d for d in range(x.ndim) if d not in axes]
    out_shape = [x.shape[d] for d in keep]
    n = math.prod(x.shape[d] for d in axes)
    if n == 0:
        return _full(ctx, 1, out_shape, x.dtype)
    moved = _b(ctx, "transpose", x, perm=keep + list(axes)) if keep + list(axes) != list(range(x.ndim)) else x
    flat = _b(ctx, "reshape", moved, shape=out_shape + [n])
    cum = _b(ctx, "cumulative", flat, combiner="mul", axis=len(out_shape), reverse=True)
    first = _b(ctx, "slice", cum, start=[0] * (len(out_shape) + 1), limit=out_shape + [1],
               step=[1] * (len(out_shape) + 1))
    return _b(ctx, "reshape", first, shape=out_shape)


@_rule("argmax", "argmin")
def _argmax(ctx: _Ctx, x: Tracer, *, axes: Sequence[int], index_dtype: Any) -> Tracer:
    fn = pnp.argmax if ctx.eqn.primitive.name == "argmax" else pnp.argmin
    return _convert(ctx, fn(x, axis=axes[0]), _device_dtype(ctx, np.dtype(index_dtype)))


def _cumulative(combiner: str) -> Callable[..., Tracer]:
    def rule(ctx: _Ctx, x: Tracer, *, axis: int, reverse: bool) -> Tracer:
        if x.dtype == np.bool_:
            r = _b(ctx, "cumulative", _convert(ctx, x, np.int32), combiner=combiner, axis=axis,
                   reverse=reverse)
            return _b(ctx, "ne", r, ctx.const(0, np.int32))
        return _b(ctx, "cumulative", x, combiner=combiner, axis=axis, reverse=reverse)

    return rule


RULES["cumsum"] = _cumulative("add")
RULES["cumprod"] = _cumulative("mul")
RULES["cummax"] = _cumulative("max")
RULES["cummin"] = _cumulative("min")


@_rule("cumlogsumexp")
def _cumlogsumexp(ctx: _Ctx, x: Tracer, *, axis: int, reverse: bool) -> Tracer:
    # A scan along the axis carrying the running logaddexp (exact at every step, as JAX's
    # associative scan of logaddexp).
    perm = [axis] + [d for d in range(x.ndim) if d != axis]
    moved = _b(ctx, "transpose", x, perm=perm) if axis != 0 else x
    init = _full(ctx, -np.inf, moved.shape[1:], x.dtype)

    def body(carries: list, xs: list, consts: list) -> tuple:
        c = pnp.logaddexp(carries[0], xs[0])
        return [c], [c]

    _, (ys,) = _control_flow.scan_core(ctx.trace, body, "cumlogsumexp", "cumlogsumexp body",
                                       [init], [moved], [], moved.shape[0], reverse)
    inv = list(np.argsort(perm))
    return _b(ctx, "transpose", ys, perm=inv) if axis != 0 else ys


# --- Contractions ----------------------------------------------------------------------------


@_rule("dot_general")
def _dot_general(ctx: _Ctx, x: Tracer, y: Tracer, *, dimension_numbers: Any,
                 preferred_element_type: Any = None, **_: Any) -> Tracer:
    (xc, yc), (xb, yb) = dimension_numbers
    xc, yc, xb, yb = list(xc), list(yc), list(xb), list(yb)
    xf = [d for d in range(x.ndim) if d not in xc and d not in xb]
    yf = [d for d in range(y.ndim) if d not in yc and d not in yb]
    out_dtype = _out_aval(ctx)[1]
    compute = np.result_type(x.dtype, y.dtype) if x.dtype != y.dtype else x.dtype
    x = _convert(ctx, x, compute)
    y = _convert(ctx, y, compute)
    bshape = [x.shape[d] for d in xb]
    m = math.prod(x.shape[d] for d in xf)
    n = math.prod(y.shape[d] for d in yf)
    k = math.prod(x.shape[d] for d in xc)
    xt = _b(ctx, "transpose", x, perm=xb + xf + xc) if xb + xf + xc != list(range(x.ndim)) else x
    yt = _b(ctx, "transpose", y, perm=yb + yc + yf) if yb + yc + yf != list(range(y.ndim)) else y
    x3 = _b(ctx, "reshape", xt, shape=bshape + [m, k])
    y3 = _b(ctx, "reshape", yt, shape=bshape + [k, n])
    if k == 0:
        z = _full(ctx, 0, bshape + [m, n], compute)
    else:
        z = _b(ctx, "matmul", x3, y3)
    out = _b(ctx, "reshape", z, shape=list(_out_aval(ctx)[0]))
    return _convert(ctx, out, out_dtype)


# --- Convolutions and windows --------------------------------------------------------------


def _strided(ctx: _Ctx, x: Tracer, start: Sequence[int], count: Sequence[int],
             step: Sequence[int]) -> Tracer:
    """`count[d]` elements of x along each dim d from `start[d]`, `step[d]` apart."""
    limit = [st + (c - 1) * sp + 1 if c else st for st, c, sp in zip(start, count, step)]
    return _b(ctx, "slice", x, start=list(start), limit=limit, step=list(step))


def _patches(ctx: _Ctx, x: Tracer, lead: int, window: Sequence[int], dilation: Sequence[int],
             out: Sequence[int], stride: Sequence[int]) -> Tracer:
    """im2col: `[*x.shape[:lead], prod(window), prod(out)]`, the window elements of each output
    position of the trailing dims of (padded) x: window element k of output position o is
    x[..., o * stride + k * dilation]. Built from one strided slice per window element or per
    output position, whichever are fewer (a weight gradient's window is the image)."""
    head = list(x.shape[:lead])
    kprod, oprod = math.prod(window), math.prod(out)
    parts = []
    if kprod <= oprod:
        for k in np.ndindex(*window):
            part = _strided(ctx, x, [0] * lead + [ki * di for ki, di in zip(k, dilation)],
                            head + list(out), [1] * lead + list(stride))
            parts.append(_b(ctx, "reshape", part, shape=head + [1, oprod]))
        axis = lead
    else:
        for o in np.ndindex(*out):
            part = _strided(ctx, x, [0] * lead + [oi * si for oi, si in zip(o, stride)],
                            head + list(window), [1] * lead + list(dilation))
            parts.append(_b(ctx, "reshape", part, shape=head + [kprod, 1]))
        axis = lead + 1
    return _b(ctx, "concatenate", *parts, axis=axis) if len(parts) > 1 else parts[0]


def _windows(ctx: _Ctx, x: Tracer, lead: int, window: Sequence[int], stride: Sequence[int],
             padding: Sequence[tuple], base_dilation: Sequence[int], window_dilation: Sequence[int],
             pad_value: Optional[Tracer]) -> tuple:
    """x's trailing dims dilated and padded (by `pad_value`, None: zeros), and the number of
    windows along each."""
    n = x.ndim
    config = [(0, 0, 0)] * lead + [(int(lo), int(hi), int(bd) - 1)
                                   for (lo, hi), bd in zip(padding, base_dilation)]
    xp = _pad(ctx, x, pad_value, padding_config=config) if any(c != (0, 0, 0) for c in config) else x
    out = []
    for d in range(lead, n):
        i = d - lead
        span = (window[i] - 1) * window_dilation[i] + 1
        out.append(max(0, (xp.shape[d] - span) // stride[i] + 1) if xp.shape[d] >= span else 0)
    return xp, out


@_rule("conv_general_dilated")
def _conv(ctx: _Ctx, lhs: Tracer, rhs: Tracer, *, window_strides: Sequence[int], padding: Any,
          lhs_dilation: Sequence[int], rhs_dilation: Sequence[int], dimension_numbers: Any,
          feature_group_count: int, batch_group_count: int, preferred_element_type: Any = None,
          **_: Any) -> Tracer:
    lhs_spec, rhs_spec, out_spec = dimension_numbers
    out_shape, out_dtype = _out_aval(ctx)
    compute = np.result_type(lhs.dtype, rhs.dtype) if lhs.dtype != rhs.dtype else lhs.dtype
    x = _transpose(ctx, _convert(ctx, lhs, compute), permutation=list(lhs_spec))  # N C S...
    w = _transpose(ctx, _convert(ctx, rhs, compute), permutation=list(rhs_spec))  # O I K...
    window = list(w.shape[2:])
    xp, out = _windows(ctx, x, 2, window, window_strides, padding, lhs_dilation, rhs_dilation, None)
    n_in, c = x.shape[0], x.shape[1]
    o_feat = w.shape[0]
    # Groups of output features, each from a group of input features (feature_group_count) or
    # of the batch (batch_group_count, a grouped convolution's weight gradient): one batched
    # matmul over the groups.
    g = feature_group_count * batch_group_count
    nb = n_in // batch_group_count
    cg, og = c // feature_group_count, o_feat // g
    kprod, oprod = math.prod(window), math.prod(out)
    if nb * oprod * o_feat == 0 or kprod * cg == 0:
        y = _full(ctx, 0, [nb, o_feat] + out, compute)
    else:
        cols = _patches(ctx, xp, 2, window, rhs_dilation, out, window_strides)  # N C K O
        if batch_group_count > 1:
            cols = _b(ctx, "reshape", cols, shape=[g, nb, cg * kprod, oprod])
            cols = _b(ctx, "transpose", cols, perm=[0, 1, 3, 2])  # G Nb O (C K)
        else:
            cols = _b(ctx, "reshape", cols, shape=[nb, g, cg * kprod, oprod])
            cols = _b(ctx, "transpose", cols, perm=[1, 0, 3, 2])  # G N O (Cg K)
        cols = _b(ctx, "reshape", cols, shape=[g, nb * oprod, cg * kprod])
        wm = _b(ctx, "reshape", w, shape=[g, og, cg * kprod])
        wm = _b(ctx, "transpose", wm, perm=[0, 2, 1])  # G (C K) Og
        y = _b(ctx, "matmul", cols, wm)  # G (N O) Og
        y = _b(ctx, "reshape", y, shape=[g, nb, oprod, og])
        y = _b(ctx, "transpose", y, perm=[1, 0, 3, 2])  # N G Og O
        y = _b(ctx, "reshape", y, shape=[nb, o_feat] + out)
    y = _transpose(ctx, y, permutation=[int(i) for i in np.argsort(out_spec)])
    return _convert(ctx, y, out_dtype)


def _reduce_window(combiner: str, init: Callable[[np.dtype], Any]) -> Callable[..., Tracer]:
    def rule(ctx: _Ctx, x: Tracer, *, window_dimensions: Sequence[int], window_strides: Sequence[int],
             padding: Sequence[tuple], base_dilation: Sequence[int], window_dilation: Sequence[int]) -> Tracer:
        out_shape, _ = _out_aval(ctx)
        xp, out = _windows(ctx, x, 0, window_dimensions, window_strides, padding, base_dilation,
                           window_dilation, ctx.const(init(x.dtype), x.dtype))
        if math.prod(out) == 0 or math.prod(window_dimensions) == 0:
            return _full(ctx, init(x.dtype), out_shape, x.dtype)
        acc = None
        for k in np.ndindex(*window_dimensions):
            part = _strided(ctx, xp, [ki * di for ki, di in zip(k, window_dilation)], out, window_strides)
            acc = part if acc is None else _b(ctx, combiner, acc, part)
        return acc

    return rule


def _lowest(dtype: np.dtype) -> Any:
    return -np.inf if np.dtype(dtype).kind == "f" or dtype == np.dtype("bfloat16") else np.iinfo(dtype).min


def _highest(dtype: np.dtype) -> Any:
    return np.inf if np.dtype(dtype).kind == "f" or dtype == np.dtype("bfloat16") else np.iinfo(dtype).max


RULES["reduce_window_sum"] = _reduce_window("add", lambda d: 0)
RULES["reduce_window_max"] = _reduce_window("max", _lowest)
RULES["reduce_window_min"] = _reduce_window("min", _highest)


@_rule("select_and_scatter_add")
def _select_and_scatter_add(ctx: _Ctx, source: Tracer, operand: Tracer, *, select_prim: Any,
                            window_dimensions: Sequence[int], window_strides: Sequence[int],
                            padding: Sequence[tuple]) -> Tracer:
    """Each window's source value added where the window's first maximum (ge) or minimum (le)
    of operand is: max pooling's gradient."""
    name = getattr(select_prim, "name", str(select_prim))
    if name not in ("ge", "le"):
        raise ctx.fail(f"select_and_scatter_add selecting by {name}")
    cmp = "gt" if name == "ge" else "lt"
    fill = _lowest(operand.dtype) if name == "ge" else _highest(operand.dtype)
    nd = operand.ndim
    xp, out = _windows(ctx, operand, 0, window_dimensions, window_strides, padding, [1] * nd,
                       [1] * nd, ctx.const(fill, operand.dtype))
    offsets = list(np.ndindex(*window_dimensions))
    best = chosen = None
    for j, k in enumerate(offsets):
        part = _strided(ctx, xp, list(k), out, window_strides)
        if best is None:
            best, chosen = part, _full(ctx, 0, out, np.int32)
        else:
            better = _b(ctx, cmp, part, best)  # strictly: the first extreme wins, as XLA's ge
            best = _b(ctx, "select", better, part, best)
            chosen = _b(ctx, "select", better, _full(ctx, j, out, np.int32), chosen)
    zero = _full(ctx, 0, out, source.dtype)
    total = None
    for j, k in enumerate(offsets):
        here = _b(ctx, "select", _b(ctx, "eq", chosen, ctx.const(j, np.int32)), source, zero)
        # the transpose of the strided slice at offset k: a pad with holes
        lo = list(k)
        hi = [xp.shape[d] - (lo[d] + (out[d] - 1) * window_strides[d] + 1) for d in range(nd)]
        spread = _b(ctx, "pad", here, lo=lo, hi=hi, interior=[s - 1 for s in window_strides])
        total = spread if total is None else _b(ctx, "add", total, spread)
    lo = [int(p[0]) for p in padding]
    return _b(ctx, "slice", total, start=lo, limit=[lo[d] + operand.shape[d] for d in range(nd)],
              step=[1] * nd)


# --- Indexing --------------------------------------------------------------------------------


def _strides(shape: Sequence[int]) -> list:
    out, acc = [], 1
    for n in reversed(shape):
        out.append(acc)
        acc *= n
    return out[::-1]


def _flat_starts(ctx: _Ctx, operand_shape: Sequence[int], starts: dict, batch_shape: Sequence[int],
                 sizes: Sequence[int], clip: bool) -> tuple:
    """The linear index of each window's first element, and whether each window is in bounds.

    Args:
      starts: operand dim -> int32 traced start of shape `batch_shape` (dims missing start at 0).
      sizes: The window's size per operand dim.
      clip: Whether to clamp starts so the window fits (else: report which do not).

    Returns:
      `(linear, in_bounds)`: int32 of `batch_shape`; bool of `batch_shape` or None (clip).
    """
    strides = _strides(operand_shape)
    linear = None
    ok = None
    for d, s in starts.items():
        hi = operand_shape[d] - sizes[d]
        s = _convert(ctx, s, np.int32)
        if clip:
            s = _b(ctx, "min", _b(ctx, "max", s, ctx.const(0, np.int32)), ctx.const(max(hi, 0), np.int32))
        else:
            good = _b(ctx, "and", _b(ctx, "ge", s, ctx.const(0, np.int32)),
                      _b(ctx, "le", s, ctx.const(hi, np.int32)))
            ok = good if ok is None else _b(ctx, "and", ok, good)
        term = _b(ctx, "mul", s, ctx.const(strides[d], np.int32)) if strides[d] != 1 else s
        linear = term if linear is None else _b(ctx, "add", linear, term)
    if linear is None:
        linear = ctx.const(0, np.int32)
    if tuple(linear.shape) != tuple(batch_shape):
        linear = _b(ctx, "broadcast_to", linear, shape=list(batch_shape))
    if ok is not None and tuple(ok.shape) != tuple(batch_shape):
        ok = _b(ctx, "broadcast_to", ok, shape=list(batch_shape))
    return linear, ok


def _window_offsets(operand_shape: Sequence[int], window_dims: Sequence[int],
                    sizes: Sequence[int]) -> np.ndarray:
    """Linear offsets within a window, over the window dims in order (host constant)."""
    strides = _strides(operand_shape)
    grids = np.meshgrid(*[np.arange(sizes[d]) * strides[d] for d in window_dims], indexing="ij")
    total = np.zeros([sizes[d] for d in window_dims], dtype=np.int64)
    for g in grids:
        total = total + g
    return total


def _index_starts(ctx: _Ctx, indices: Tracer, index_map: Sequence[int], operand_batching: Sequence[int],
                  indices_batching: Sequence[int]) -> tuple:
    """Operand dim -> start (batch-shaped), from gather/scatter indices with the index vector last."""
    batch_shape = list(indices.shape[:-1])
    nb = len(batch_shape)
    starts = {}
    for j, d in enumerate(index_map):
        col = _b(ctx, "slice", indices, start=[0] * nb + [j], limit=batch_shape + [j + 1],
                 step=[1] * (nb + 1))
        starts[d] = _b(ctx, "reshape", col, shape=batch_shape)
    for od, ib in zip(operand_batching, indices_batching):
        line = np.arange(batch_shape[ib], dtype=np.int32)
        view = [1] * nb
        view[ib] = batch_shape[ib]
        starts[od] = ctx.trace.constant(np.ascontiguousarray(line.reshape(view)), None)
    return starts, batch_shape


def _fill_value(dtype: np.dtype, fill: Any) -> Any:
    if fill is not None:
        return fill
    if dtype.kind == "f" or dtype == np.dtype("bfloat16"):
        return np.nan
    if dtype.kind == "b":
        return True
    return np.iinfo(dtype).min if dtype.kind == "i" else np.iinfo(dtype).max


def _mode(mode: Any) -> str:
    name = getattr(mode, "name", str(mode))
    return {"CLIP": "clip", "FILL_OR_DROP": "fill", "PROMISE_IN_BOUNDS": "clip",
            "ONE_HOT": "clip"}.get(name, "clip")


def _along_one_axis(operand_shape: Sequence[int], index_map: Sequence[int], collapsed: Sequence[int],
                    batching: Sequence[int], sizes: Sequence[int], window_positions: Sequence[int],
                    rank: int, nb: int) -> Optional[int]:
    """The operand axis d when a gather or scatter is numpy's take along d (whole slices of
    every other axis, one index per batch element, the batch dims in d's place), else None."""
    if len(index_map) != 1 or batching:
        return None
    d = index_map[0]
    if set(collapsed) != {d} or sizes[d] != 1:
        return None
    if any(sizes[k] != operand_shape[k] for k in range(len(operand_shape)) if k != d):
        return None
    batch_positions = [p for p in range(rank) if p not in window_positions]
    return d if batch_positions == list(range(d, d + nb)) else None


def _index_column(ctx: _Ctx, indices: Tracer) -> Tracer:
    """The indices' one index vector element: int32 of the batch shape."""
    return _convert(ctx, _b(ctx, "reshape", indices, shape=list(indices.shape[:-1])), np.int32)


@_rule("gather")
def _gather(ctx: _Ctx, operand: Tracer, indices: Tracer, *, dimension_numbers: Any,
            slice_sizes: Sequence[int], mode: Any, fill_value: Any = None, **_: Any) -> Tracer:
    dn = dimension_numbers
    out_shape, _dtype = _out_aval(ctx)
    offset_dims = list(dn.offset_dims)
    d = _along_one_axis(operand.shape, dn.start_index_map, dn.collapsed_slice_dims,
                        getattr(dn, "operand_batching_dims", ()), slice_sizes, offset_dims,
                        len(out_shape), indices.ndim - 1)
    if d is not None and operand.size and math.prod(out_shape):
        # Rows (embeddings, x[idx], x[:, idx]): one take, its indices clipped as JAX clamps.
        idx = _index_column(ctx, indices)
        out = _b(ctx, "take", operand, idx, axis=d)
        if _mode(mode) == "clip":
            return out
        ok = _b(ctx, "and", _b(ctx, "ge", idx, ctx.const(0, np.int32)),
                _b(ctx, "lt", idx, ctx.const(operand.shape[d], np.int32)))
        view = [1] * d + list(idx.shape) + [1] * (len(out_shape) - d - idx.ndim)
        ok = _b(ctx, "broadcast_to", _b(ctx, "reshape", ok, shape=view), shape=list(out_shape))
        fill = _full(ctx, _fill_value(operand.dtype, fill_value), out_shape, operand.dtype)
        return _b(ctx, "select", ok, out, fill)
    collapsed = set(dn.collapsed_slice_dims) | set(getattr(dn, "operand_batching_dims", ()))
    window_dims = [d for d in range(operand.ndim) if d not in collapsed]
    starts, batch_shape = _index_starts(ctx, indices, dn.start_index_map,
                                        getattr(dn, "operand_batching_dims", ()),
                                        getattr(dn, "start_indices_batching_dims", ()))
    clip = _mode(mode) == "clip"
    linear, ok = _flat_starts(ctx, operand.shape, starts, batch_shape, slice_sizes, clip)
    if math.prod(out_shape) == 0 or operand.size == 0:
        return _full(ctx, 0 if operand.size else _fill_value(operand.dtype, fill_value), out_shape,
                     operand.dtype)
    # Output dims: offset_dims hold the window dims (in order), the rest the batch dims.
    batch_pos = [d for d in range(len(out_shape)) if d not in offset_dims]
    view = [1] * len(out_shape)
    for p, n in zip(batch_pos, batch_shape):
        view[p] = n
    lin = _b(ctx, "reshape", linear, shape=view) if tuple(view) != tuple(linear.shape) else linear
    offsets = _window_offsets(operand.shape, window_dims, slice_sizes)
    oview = [1] * len(out_shape)
    for p, d in zip(offset_dims, window_dims):
        oview[p] = slice_sizes[d]
    off = ctx.trace.constant(np.ascontiguousarray(offsets.reshape(oview).astype(np.int32)), None)
    flat_index = _b(ctx, "add", _b(ctx, "broadcast_to", lin, shape=list(out_shape)), off)
    flat = _b(ctx, "reshape", operand, shape=[operand.size])
    out = _b(ctx, "take", flat, flat_index, axis=0)
    if ok is not None:
        okv = _b(ctx, "reshape", ok, shape=view) if tuple(view) != tuple(ok.shape) else ok
        okv = _b(ctx, "broadcast_to", okv, shape=list(out_shape))
        fill = _full(ctx, _fill_value(operand.dtype, fill_value), out_shape, operand.dtype)
        out = _b(ctx, "select", okv, out, fill)
    return out


def _scatter(combiner: str) -> Callable[..., Tracer]:
    def rule(ctx: _Ctx, operand: Tracer, indices: Tracer, updates: Tracer, *, dimension_numbers: Any,
             mode: Any, **_: Any) -> Tracer:
        dn = dimension_numbers
        window_update_dims = list(dn.update_window_dims)
        inserted = set(dn.inserted_window_dims) | set(getattr(dn, "operand_batching_dims", ()))
        window_dims = [d for d in range(operand.ndim) if d not in inserted]
        sizes = [1] * operand.ndim
        for u, d in zip(window_update_dims, window_dims):
            sizes[d] = updates.shape[u]
        if updates.size == 0 or operand.size == 0:
            return operand
        d = _along_one_axis(operand.shape, dn.scatter_dims_to_operand_dims, dn.inserted_window_dims,
                            getattr(dn, "operand_batching_dims", ()), sizes, window_update_dims,
                            updates.ndim, indices.ndim - 1)
        if d is not None:
            # Rows (an embedding's gradient): one scatter along d; out-of-range indices are
            # dropped by the op (FILL_OR_DROP), or clamped first (CLIP).
            idx = _index_column(ctx, indices)
            if _mode(mode) == "clip":
                idx = _b(ctx, "min", _b(ctx, "max", idx, ctx.const(0, np.int32)),
                         ctx.const(operand.shape[d] - 1, np.int32))
            return _b(ctx, "scatter", operand, idx, updates, combiner=combiner, axis=d,
                      size=operand.shape[d])
        starts, batch_shape = _index_starts(ctx, indices, dn.scatter_dims_to_operand_dims,
                                            getattr(dn, "operand_batching_dims", ()),
                                            getattr(dn, "scatter_indices_batching_dims", ()))
        clip = _mode(mode) == "clip"
        linear, ok = _flat_starts(ctx, operand.shape, starts, batch_shape, sizes, clip)
        if ok is not None:  # a window out of bounds is dropped whole: send it out of range
            linear = _b(ctx, "select", ok, linear, _full(ctx, operand.size, batch_shape, np.int32))
        ushape = list(updates.shape)
        batch_pos = [d for d in range(len(ushape)) if d not in window_update_dims]
        view = [1] * len(ushape)
        for p, n in zip(batch_pos, batch_shape):
            view[p] = n
        lin = _b(ctx, "reshape", linear, shape=view) if tuple(view) != tuple(linear.shape) else linear
        offsets = _window_offsets(operand.shape, window_dims, sizes)
        oview = [1] * len(ushape)
        for p, d in zip(window_update_dims, window_dims):
            oview[p] = sizes[d]
        off = ctx.trace.constant(np.ascontiguousarray(offsets.reshape(oview).astype(np.int32)), None)
        flat_index = _b(ctx, "add", _b(ctx, "broadcast_to", lin, shape=ushape), off)
        flat_index = _b(ctx, "reshape", flat_index, shape=[updates.size])
        flat_updates = _b(ctx, "reshape", updates, shape=[updates.size])
        flat = _b(ctx, "reshape", operand, shape=[operand.size])
        out = _b(ctx, "scatter", flat, flat_index, flat_updates, combiner=combiner, axis=0,
                 size=operand.size)
        return _b(ctx, "reshape", out, shape=list(operand.shape))

    return rule


RULES["scatter-add"] = _scatter("add")
RULES["scatter-mul"] = _scatter("mul")
RULES["scatter-min"] = _scatter("min")
RULES["scatter-max"] = _scatter("max")
RULES["scatter"] = _scatter("set")


@_rule("scatter-sub")
def _scatter_sub(ctx: _Ctx, operand: Tracer, indices: Tracer, updates: Tracer, **params: Any) -> Tracer:
    return RULES["scatter-add"](ctx, operand, indices, _b(ctx, "neg", updates), **params)


@_rule("dynamic_slice")
def _dynamic_slice(ctx: _Ctx, x: Tracer, *starts: Tracer, slice_sizes: Sequence[int]) -> Tracer:
    if x.size == 0 or math.prod(slice_sizes) == 0:
        return _full(ctx, 0, slice_sizes, x.dtype)
    linear, _ = _flat_starts(ctx, x.shape, dict(enumerate(starts)), [], slice_sizes, True)
    offsets = _window_offsets(x.shape, list(range(x.ndim)), slice_sizes).astype(np.int32)
    idx = _b(ctx, "add", _b(ctx, "broadcast_to", linear, shape=list(slice_sizes)),
             ctx.trace.constant(np.ascontiguousarray(offsets), None))
    return _b(ctx, "take", _b(ctx, "reshape", x, shape=[x.size]), idx, axis=0)


@_rule("dynamic_update_slice")
def _dynamic_update_slice(ctx: _Ctx, x: Tracer, update: Tracer, *starts: Tracer) -> Tracer:
    if update.size == 0 or x.size == 0:
        return x
    linear, _ = _flat_starts(ctx, x.shape, dict(enumerate(starts)), [], update.shape, True)
    offsets = _window_offsets(x.shape, list(range(x.ndim)), update.shape).astype(np.int32)
    idx = _b(ctx, "add", _b(ctx, "broadcast_to", linear, shape=list(update.shape)),
             ctx.trace.constant(np.ascontiguousarray(offsets), None))
    out = _b(ctx, "scatter", _b(ctx, "reshape", x, shape=[x.size]),
             _b(ctx, "reshape", idx, shape=[update.size]),
             _b(ctx, "reshape", update, shape=[update.size]), combiner="set", axis=0, size=x.size)
    return _b(ctx, "reshape", out, shape=list(x.shape))


@_rule("sort")
def _sort(ctx: _Ctx, *xs: Tracer, dimension: int, is_stable: bool, num_keys: int) -> list:
    nd = xs[0].ndim
    perm = [d for d in range(nd) if d != dimension] + [dimension]
    moved = [_b(ctx, "transpose", x, perm=perm) if dimension != nd - 1 else x for x in xs]
    # Lexicographic over the keys: stable argsorts from the last key to the first.
    order = None
    for key in reversed(moved[:num_keys]):
        k = key if order is None else pnp.take_along_axis(key, order, axis=-1)
        o = _key_argsort(ctx, k)
        order = o if order is None else pnp.take_along_axis(order, o, axis=-1)
    outs = [pnp.take_along_axis(x, order, axis=-1) for x in moved]
    inv = list(np.argsort(perm))
    return [_b(ctx, "transpose", o, perm=inv) if dimension != nd - 1 else o for o in outs]


def _key_argsort(ctx: _Ctx, k: Tracer) -> Tracer:
    """A stable ascending argsort of the last axis with JAX's total order (NaNs last, -0 < 0)."""
    if k.dtype == np.bool_:
        k = _convert(ctx, k, np.int32)
    return _b(ctx, "sort", k, descending=False)


@_rule("top_k")
def _top_k(ctx: _Ctx, x: Tracer, *, k: int, axis: int = -1, **_: Any) -> list:
    nd = x.ndim
    axis = axis % nd if nd else 0
    perm = [d for d in range(nd) if d != axis] + [axis]
    moved = _b(ctx, "transpose", x, perm=perm) if axis != nd - 1 else x
    idx = _b(ctx, "top_k", moved, k=k)
    vals = pnp.take_along_axis(moved, idx, axis=-1)
    inv = list(np.argsort(perm))
    if axis != nd - 1:
        vals = _b(ctx, "transpose", vals, perm=inv)
        idx = _b(ctx, "transpose", idx, perm=inv)
    return [vals, idx]


# --- Collectives -----------------------------------------------------------------------------


def _one_axis(ctx: _Ctx, names: Any, groups: Any = None) -> str:
    if groups is not None:
        raise ctx.fail(f"{ctx.eqn.primitive.name} with axis_index_groups")
    names = tuple(names) if isinstance(names, (tuple, list)) else (names,)
    if len(names) != 1:
        raise ctx.fail(f"{ctx.eqn.primitive.name} over axes {names}: a pmap binds one axis")
    return names[0]


@_rule("psum")
def _psum(ctx: _Ctx, *xs: Tracer, axes: Any, axis_index_groups: Any = None) -> list:
    name = _one_axis(ctx, axes, axis_index_groups)
    outs = []
    for x in xs:
        if x.dtype == np.bool_:
            raise ctx.fail("psum of bool")
        outs.append(_b(ctx, "psum", x, axis_name=name))
    return outs


def _pcoll(op: str) -> Callable[..., list]:
    def rule(ctx: _Ctx, *xs: Tracer, axes: Any, axis_index_groups: Any = None) -> list:
        name = _one_axis(ctx, axes, axis_index_groups)
        return [_b(ctx, op, x, axis_name=name) for x in xs]

    return rule


RULES["pmax"] = _pcoll("pmax")
RULES["pmin"] = _pcoll("pmin")


@_rule("axis_index")
def _axis_index(ctx: _Ctx, *, axis_name: Any) -> Tracer:
    return _b(ctx, "axis_index", axis_name=_one_axis(ctx, axis_name))


@_rule("all_gather")
def _all_gather(ctx: _Ctx, x: Tracer, *, all_gather_dimension: int, axis_name: Any,
                axis_index_groups: Any = None, tiled: bool = False, **_: Any) -> Tracer:
    name = _one_axis(ctx, axis_name, axis_index_groups)
    return _collectives.all_gather(x, name, all_gather_dimension, tiled=tiled)


@_rule("all_to_all")
def _all_to_all(ctx: _Ctx, x: Tracer, *, split_axis: int, concat_axis: int, axis_name: Any,
                axis_index_groups: Any = None, tiled: bool = False, **_: Any) -> Tracer:
    name = _one_axis(ctx, axis_name, axis_index_groups)
    # The primitive is the tiled exchange whatever `tiled` says: for an untiled
    # lax.all_to_all, JAX inserts and removes the size-1 axes around it.
    return _collectives.all_to_all(x, name, split_axis, concat_axis, tiled=True)


@_rule("reduce_scatter")
def _reduce_scatter(ctx: _Ctx, x: Tracer, *, scatter_dimension: int, axis_name: Any,
                    axis_index_groups: Any = None, tiled: bool = False, **_: Any) -> Tracer:
    name = _one_axis(ctx, axis_name, axis_index_groups)
    return _collectives.psum_scatter(x, name, scatter_dimension=scatter_dimension, tiled=tiled)


@_rule("pbroadcast")
def _pbroadcast(ctx: _Ctx, x: Tracer, *, axis_name: Any, source: int) -> Tracer:
    # Every device gets device `source`'s value: its slice of an all-gather.
    name = _one_axis(ctx, axis_name)
    every = _b(ctx, "all_gather", x, axis_name=name, axis=0)
    one = _b(ctx, "slice", every, start=[source] + [0] * x.ndim, limit=[source + 1] + list(x.shape),
             step=[1] * (x.ndim + 1))
    return _b(ctx, "reshape", one, shape=list(x.shape))


@_rule("ppermute")
def _ppermute(ctx: _Ctx, x: Tracer, *, axis_name: Any, perm: Sequence[tuple]) -> Tracer:
    name = _one_axis(ctx, axis_name)
    return _b(ctx, "ppermute", x, axis_name=name, perm=[tuple(int(i) for i in p) for p in perm])


# --- Calls and control flow ------------------------------------------------------------------


def _inline(param: str) -> Callable[..., list]:
    def rule(ctx: _Ctx, *xs: Tracer, **params: Any) -> list:
        return ctx.lower(params[param], xs)

    return rule


RULES["jit"] = _inline("jaxpr")
RULES["remat2"] = _inline("jaxpr")  # jax.checkpoint
RULES["custom_jvp_call"] = _inline("call_jaxpr")
RULES["custom_vjp_call"] = _inline("call_jaxpr")


@_rule("cond")
def _cond(ctx: _Ctx, index: Tracer, *ops: Tracer, branches: Sequence[Any], **_: Any) -> list:
    # Every branch runs and each output is selected by the (clamped) index, as
    # pw.lax.switch does for a traced index.
    results = [ctx.lower(br, ops) for br in branches]
    if len(results) == 1:
        return results[0]
    index = _convert(ctx, index, np.int32)
    outs = []
    for j in range(len(results[0])):
        out = results[0][j]
        for i in range(1, len(results)):
            pick = _b(ctx, "ge", index, ctx.const(i, np.int32))
            if out.shape:
                pick = _b(ctx, "broadcast_to", pick, shape=list(out.shape))
            out = _b(ctx, "select", pick, results[i][j], out)
        outs.append(out)
    return outs


@_rule("scan")
def _scan(ctx: _Ctx, *ops: Tracer, jaxpr: Any, length: int, reverse: bool, num_consts: int,
          num_carry: int, **_: Any) -> list:
    consts = list(ops[:num_consts])
    carries = list(ops[num_consts:num_consts + num_carry])
    xs = list(ops[num_consts + num_carry:])
    n_ys = len(jaxpr.jaxpr.outvars) - num_carry

    def body(c: list, x: list, k: list) -> tuple:
        outs = lower_jaxpr(_state.function, jaxpr, [*consts, *c, *x], ctx.where, ctx.source())
        return outs[:num_carry], outs[num_carry:]

    if length == 0:
        ys = [_full(ctx, 0, *_out_aval(ctx, num_carry + i)) for i in range(n_ys)]
        return carries + ys
    finals, ys = _control_flow.scan_core(ctx.trace, body, "scan", "scan body", carries, xs, [],
                                         length, reverse)
    return list(finals) + list(ys)


# --- Linear algebra --------------------------------------------------------------------------


def _swap_last(ctx: _Ctx, x: Tracer) -> Tracer:
    perm = list(range(x.ndim - 2)) + [x.ndim - 1, x.ndim - 2]
    return _b(ctx, "transpose", x, perm=perm)


@_rule("cholesky")
def _cholesky(ctx: _Ctx, x: Tracer, **_: Any) -> Tracer:
    return _b(ctx, "cholesky", x)


@_rule("lu")
def _lu(ctx: _Ctx, x: Tracer) -> list:
    return _b(ctx, "lu", x)


@_rule("eigh")
def _eigh(ctx: _Ctx, x: Tracer, *, lower: bool, sort_eigenvalues: bool, subset_by_index: Any,
          **_: Any) -> list:
    if subset_by_index is not None and tuple(subset_by_index) != (0, x.shape[-1]):
        raise ctx.fail(f"eigh with subset_by_index={subset_by_index}")
    w, v = _b(ctx, "eigh", x if lower else _swap_last(ctx, x))  # ascending, as sort_eigenvalues
    return [v, w]


@_rule("qr")
def _qr(ctx: _Ctx, x: Tracer, *, full_matrices: bool, pivoting: bool = False, **_: Any) -> list:
    if pivoting:
        raise ctx.fail("qr with pivoting")
    return _b(ctx, "qr", x, full_matrices=full_matrices)


@_rule("svd")
def _svd(ctx: _Ctx, x: Tracer, *, full_matrices: bool, compute_uv: bool, subset_by_index: Any,
         **_: Any) -> list:
    if subset_by_index is not None and tuple(subset_by_index) != (0, min(x.shape[-2:])):
        raise ctx.fail(f"svd with subset_by_index={subset_by_index}")
    u, sv, vt = _b(ctx, "svd", x, full_matrices=full_matrices)
    return [sv, u, vt] if compute_uv else [sv]


@_rule("triangular_solve")
def _triangular_solve(ctx: _Ctx, a: Tracer, b: Tracer, *, left_side: bool, lower: bool,
                      transpose_a: bool, unit_diagonal: bool, **_: Any) -> Tracer:
    if left_side:
        return _b(ctx, "triangular_solve", a, b, lower=lower, unit_diagonal=unit_diagonal,
                  transpose_a=transpose_a)
    # x op(a) = b is op(a)^T x^T = b^T
    xt = _b(ctx, "triangular_solve", a, _swap_last(ctx, b), lower=lower, unit_diagonal=unit_diagonal,
            transpose_a=not transpose_a)
    return _swap_last(ctx, xt)


@_rule("custom_linear_solve")
def _custom_linear_solve(ctx: _Ctx, *args: Tracer, const_lengths: Any, jaxprs: Any) -> list:
    # The solve itself (its transpose and matvecs are for JAX's differentiation, done by now).
    groups, k = [], 0
    for n in const_lengths:
        groups.append(list(args[k:k + n]))
        k += n
    return ctx.lower(jaxprs.solve, [*groups[2], *args[k:]])


@_rule("while")
def _while(ctx: _Ctx, *ops: Tracer, cond_jaxpr: Any, body_jaxpr: Any, cond_nconsts: int,
           body_nconsts: int) -> list:
    # A while op of the IR: its condition computed on the device, every iteration.
    cond_consts = list(ops[:cond_nconsts])
    body_consts = list(ops[cond_nconsts:cond_nconsts + body_nconsts])
    carries = list(ops[cond_nconsts + body_nconsts:])
    if not carries:  # nothing carried: nothing to compute
        return []
    src = ctx.source()

    def cond(c: list, k: list) -> Tracer:
        return lower_jaxpr(_state.function, cond_jaxpr, [*k[:cond_nconsts], *c], ctx.where, src)[0]

    def body(c: list, k: list) -> list:
        return lower_jaxpr(_state.function, body_jaxpr, [*k[cond_nconsts:], *c], ctx.where, src)

    return _control_flow.while_core(ctx.trace, cond, body, "while_cond", "while_body", carries,
                                    cond_consts + body_consts)


# --- Random numbers --------------------------------------------------------------------------


def _rotl(ctx: _Ctx, x: Tracer, r: int) -> Tracer:
    left = _b(ctx, "shift_left", x, ctx.const(r, np.uint32))
    right = _b(ctx, "shift_right_logical", x, ctx.const(32 - r, np.uint32))
    return _b(ctx, "or", left, right)


@_rule("threefry2x32")
def _threefry2x32(ctx: _Ctx, k1: Tracer, k2: Tracer, x1: Tracer, x2: Tracer) -> list:
    """Threefry-2x32 with 20 rounds (Salmon et al., SC 2011), on uint32 ops."""
    shape = list(np.broadcast_shapes(k1.shape, k2.shape, x1.shape, x2.shape))

    def full(t: Tracer) -> Tracer:
        return t if list(t.shape) == shape else _b(ctx, "broadcast_to", t, shape=shape)

    k1, k2, x1, x2 = (full(t) for t in (k1, k2, x1, x2))
    k3 = _b(ctx, "xor", _b(ctx, "xor", k1, k2), ctx.const(0x1BD11BDA, np.uint32))
    ks = [k1, k2, k3]
    rotations = [(13, 15, 26, 6), (17, 29, 16, 24)]
    x = [_b(ctx, "add", x1, ks[0]), _b(ctx, "add", x2, ks[1])]
    for i in range(5):
        for r in rotations[i % 2]:
            x[0] = _b(ctx, "add", x[0], x[1])
            x[1] = _b(ctx, "xor", x[0], _rotl(ctx, x[1], r))
        x[0] = _b(ctx, "add", x[0], ks[(i + 1) % 3])
        x[1] = _b(ctx, "add", _b(ctx, "add", x[1], ks[(i + 2) % 3]), ctx.const(i + 1, np.uint32))
    return x


@_rule("iota_2x32_shape")
def _iota_2x32_shape(ctx: _Ctx, *, shape: Sequence[int]) -> list:
    count = np.arange(math.prod(shape), dtype=np.uint64).reshape(shape)
    hi = np.ascontiguousarray((count >> np.uint64(32)).astype(np.uint32))
    lo = np.ascontiguousarray((count & np.uint64(0xFFFFFFFF)).astype(np.uint32))
    return [ctx.trace.constant(hi, None), ctx.trace.constant(lo, None)]


def _through_jax(ctx: _Ctx, fn: Callable[..., Any], *xs: Tracer) -> Tracer:
    """`fn` (a JAX function of uint32 key data and other arrays) traced by JAX and lowered."""
    import jax

    closed = jax.make_jaxpr(fn)(*[jax.ShapeDtypeStruct(x.shape, x.dtype) for x in xs])
    (out,) = ctx.lower(closed, xs)
    return out


def _key_impl(ctx: _Ctx, i: int = 0, out: bool = False) -> Any:
    aval = (ctx.eqn.outvars if out else ctx.eqn.invars)[i].aval
    return aval.dtype._impl


@_rule("random_bits")
def _random_bits(ctx: _Ctx, keys: Tracer, *, bit_width: int, shape: Sequence[int]) -> Tracer:
    from jax._src.random import prng

    impl = _key_impl(ctx)
    ndim = ctx.eqn.invars[0].aval.ndim
    return _through_jax(ctx, prng.iterated_vmap_unary(
        ndim, lambda k: impl.random_bits(k, bit_width, shape)), keys)


@_rule("random_split")
def _random_split(ctx: _Ctx, keys: Tracer, *, shape: Sequence[int]) -> Tracer:
    from jax._src.random import prng

    impl = _key_impl(ctx)
    ndim = ctx.eqn.invars[0].aval.ndim
    return _through_jax(ctx, prng.iterated_vmap_unary(ndim, lambda k: impl.split(k, shape)), keys)


@_rule("random_fold_in")
def _random_fold_in(ctx: _Ctx, keys: Tracer, msgs: Tracer) -> Tracer:
    from jax._src.random import prng

    impl = _key_impl(ctx)
    kshape = ctx.eqn.invars[0].aval.shape
    return _through_jax(ctx, prng.iterated_vmap_binary_bcast(kshape, msgs.shape, impl.fold_in),
                        keys, msgs)


@_rule("random_seed")
def _random_seed(ctx: _Ctx, seeds: Tracer, *, impl: Any) -> Tracer:
    from jax._src.random import prng

    return _through_jax(ctx, prng.iterated_vmap_unary(seeds.ndim, impl.seed), seeds)


@_rule("erf_inv")
def _erf_inv(ctx: _Ctx, x: Tracer) -> Tracer:
    """Giles' single-precision approximation ("Approximating the erfinv function", 2010), with
    one Newton step on erf in float64 for float64 operands."""
    dt = x.dtype
    f32 = np.dtype(np.float32)
    xf = _convert(ctx, x, f32) if dt != f32 else x
    one = ctx.const(1.0, f32)
    w = _b(ctx, "neg", pnp.log1p(_b(ctx, "neg", _b(ctx, "mul", xf, xf))))
    small = (2.81022636e-08, 3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087,
             -0.00125372503, -0.00417768164, 0.246640727, 1.50140941)
    large = (-0.000200214257, 0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773,
             -0.0076224613, 0.00943887047, 1.00167406, 2.83297682)

    def poly(t: Tracer, coeffs: Sequence[float]) -> Tracer:
        p = ctx.const(coeffs[0], f32)
        for c in coeffs[1:]:
            p = _b(ctx, "add", ctx.const(c, f32), _b(ctx, "mul", p, t))
        return p

    ps = poly(_b(ctx, "sub", w, ctx.const(2.5, f32)), small)
    pl = poly(_b(ctx, "sub", _b(ctx, "sqrt", w), ctx.const(3.0, f32)), large)
    p = _b(ctx, "select", _b(ctx, "lt", w, ctx.const(5.0, f32)), ps, pl)
    y = _b(ctx, "mul", p, xf)
    edge = _b(ctx, "eq", _b(ctx, "abs", xf), one)
    y = _b(ctx, "select", edge, _b(ctx, "mul", xf, ctx.const(np.inf, f32)), y)
    if dt == f32:
        return y
    y = _convert(ctx, y, dt)
    if dt == np.float64:
        # Newton on erf(y) = x: y -= (erf(y) - x) / (2/sqrt(pi) exp(-y^2)), twice.
        for _ in range(2):
            d = _b(ctx, "mul", ctx.const(2 / math.sqrt(math.pi), dt),
                   _b(ctx, "exp", _b(ctx, "neg", _b(ctx, "mul", y, y))))
            step = _b(ctx, "div", _b(ctx, "sub", _b(ctx, "erf", y), x), d)
            finite = _b(ctx, "eq", _b(ctx, "sub", step, step), ctx.const(0.0, dt))
            y = _b(ctx, "select", finite, _b(ctx, "sub", y, step), y)
    return y


def supported_primitives() -> list:
    """The JAX primitives that have a lowering, sorted."""
    return sorted(RULES)

