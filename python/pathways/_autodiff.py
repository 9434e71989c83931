"""Reverse-mode gradients of traced functions: `grad`, `value_and_grad`, `stop_gradient`.

`pw.grad(f)(x)` inside a function traced by `pw.pmap` differentiates `f` on a
*tape*, inside the same function trace, so the backward ops become part of the
same compiled function IR as the forward ones:

1. Every differentiated input leaf goes through a "copy" op, so its value id
   is fresh: the tape then tells the input apart from the same value passed
   twice (`f(x, x)`) or closed over by `f`.
2. A `_Tape` is pushed on `trace.tapes` while `f` runs. `bind`
   (pathways._tracing) shows it every op; it keeps the ops that have an
   operand depending on the inputs (a *tracked* value) and tracks their float
   outputs, with the `Primitive` of each.
3. The tape is walked backwards from a cotangent of 1 for the scalar output.
   Cotangents are keyed by value id; each primitive's `vjp` rule (registered
   below) maps the cotangent of its output to cotangents of its operands, and
   contributions to one value are added up.

The rules emit their ops through `bind` (Tracer operators included), so a
tape of an enclosing `grad` records the backward ops too: nested `grad` gives
higher derivatives. With collectives the semantics are those of `jax.pmap`:
the transpose of `psum` is `psum`, so `grad` gives, on each device, the
gradient of the sum over devices of every device's output with respect to
that device's inputs.

Outside any trace, `grad(f)(x)` runs as a `pw.pmap` over one device.
"""

from __future__ import annotations

import functools
import operator
import threading
from collections.abc import Iterator, Mapping
from typing import Any, Callable, Optional, Sequence, Union

import numpy as np

from pathways._primitives import PRIMITIVES, Primitive
from pathways._pytree import tree_flatten, tree_map, tree_unflatten
from pathways.numpy import broadcast_to as _broadcast_to
from pathways.numpy import reshape as _reshape
from pathways.numpy import transpose as _transpose
from pathways._tracing import (
    PmapFunction,
    Tracer,
    TracerError,
    _FunctionTrace,
    _state,
    _to_array,
    _TracerBase,
    bind,
)

__all__ = ["grad", "value_and_grad", "stop_gradient", "VJP_RULES"]

_FLOAT_DTYPE_NAMES = ("float32", "float64")


# --- The tape -----------------------------------------------------------------


class _Tape:
    """The ops of one `grad` call that depend on its inputs, in trace order.

    Lives on `trace.tapes` while the differentiated function runs; `bind`
    calls `record` for every op emitted meanwhile, including ops of nested
    `grad`s. Not thread-safe, like the trace it records (traces are
    thread-local).

    Attributes:
      tracked: Value ids that depend on the inputs: the inputs and the float
        outputs of recorded ops.
      entries: `(Primitive, operand ids, output id, params)` per recorded op.
    """

    __slots__ = ("_builder", "tracked", "entries")

    def __init__(self, builder: Any, input_ids: Sequence[int]):
        self._builder = builder
        self.tracked = set(input_ids)
        self.entries: list = []

    def record(self, prim: Primitive, operand_ids: Sequence[int], out_id: int,
               params: dict) -> None:
        """Keeps the op if it depends on a tracked value and has a float output.

        Int and bool outputs (comparisons, argmax, casts to int) carry no
        gradient, and a primitive that stops gradients ("stop_gradient") cuts
        the dependence, so neither is tracked.
        """
        if prim.stops_gradient:
            return
        tracked = self.tracked
        for i in operand_ids:
            if i in tracked:
                break
        else:
            return
        if self._builder.dtype(out_id) not in _FLOAT_DTYPE_NAMES:
            return
        tracked.add(out_id)
        self.entries.append((prim, list(operand_ids), out_id, params))


# --- Helpers the rules emit with --------------------------------------------


def _zeros(trace: _FunctionTrace, shape: Sequence[int], dtype: Any) -> Tracer:
    """Zeros of `shape` and `dtype`: a scalar constant broadcast (no array constant)."""
    z = trace.constant(np.zeros((), np.dtype(dtype)), None)
    return _broadcast_to(z, shape)


def _sum(x: Tracer, axes: Sequence[int], keepdims: bool) -> Tracer:
    return bind(x._trace, "reduce", (x,), kind="sum", axes=list(axes), keepdims=keepdims)


def _where(cond: Tracer, x: Any, y: Any) -> Tracer:
    """`select(cond, x, y)`; Python scalars take the dtype of the traced one of `x`, `y`."""
    trace = cond._trace
    like = x.dtype if isinstance(x, Tracer) else y.dtype
    if not isinstance(x, Tracer):
        x = trace.constant(x, like)
    if not isinstance(y, Tracer):
        y = trace.constant(y, like)
    return bind(trace, "select", (cond, x, y))


def _mask(cond: Tracer, dtype: np.dtype) -> Tracer:
    """A bool value as 1.0 / 0.0 of a float `dtype`."""
    return cond.astype(dtype)


def _unbroadcast(ct: Tracer, shape: Sequence[int]) -> Tracer:
    """Sums `ct` over the dimensions that numpy broadcasting added to `shape`.

    Leading dimensions that `shape` lacks are summed away; dimensions where
    `shape` has size 1 and `ct` does not are summed with keepdims. Needs no
    reshape.
    """
    shape = tuple(shape)
    if ct.shape == shape:
        return ct
    lead = ct.ndim - len(shape)
    ones = [lead + i for i, d in enumerate(shape) if d == 1 and ct.shape[lead + i] != 1]
    if ones:
        ct = _sum(ct, ones, keepdims=True)
    if lead:
        ct = _sum(ct, range(lead), keepdims=False)
    return ct


def _reduced_axes(ndim: int, axes: Optional[Sequence[int]]) -> list:
    if axes is None:
        return list(range(ndim))
    return sorted(operator.index(a) % ndim for a in axes)


def _keepdims_shape(shape: Sequence[int], axes: Sequence[int]) -> tuple:
    return tuple(1 if d in axes else n for d, n in enumerate(shape))


def _expand_reduced(v: Tracer, shape: Sequence[int], axes: Sequence[int], keepdims: bool) -> Tracer:
    """A reduction's output `v` with its reduced `axes` of `shape` back as size-1 dims."""
    if keepdims or list(axes) == list(range(len(axes))):
        # Leading axes come back by broadcasting, which aligns trailing dims.
        return v
    return _reshape(v, _keepdims_shape(shape, axes))


# --- VJP rules ----------------------------------------------------------------
#
# A rule takes (ct, operands, out, params, needs): the cotangent of the op's
# output (a Tracer of the output's shape and dtype), the operands and output
# as Tracers, the op's parameters as `bind` got them, and which operands need
# a cotangent (those that depend on the differentiated inputs). It returns one
# cotangent or None per operand; None for operands that do not need one keeps
# dead backward ops out of the compiled function. A cotangent must have its
# operand's shape; the caller casts it to the operand's dtype. Int and bool
# operands never need one. Primitives whose result is never a float have no
# rule (tapes do not record them), nor has "stop_gradient" (nor are they).

VjpRule = Callable[[Tracer, Sequence[Tracer], Tracer, dict, Sequence[bool]], list]


def _rule(*prims: str) -> Callable[[VjpRule], VjpRule]:
    """Registers the decorated function as the VJP rule of primitives `prims`."""

    def register(fn: VjpRule) -> VjpRule:
        for p in prims:
            PRIMITIVES[p].def_vjp(fn)
        return fn

    return register


class _VjpRules(Mapping):
    """The primitives' VJP rules by primitive name, a read-only view: a rule is
    the `vjp` of its `Primitive`, set by `_rule`."""

    def __getitem__(self, name: str) -> Callable[..., list]:
        rule = PRIMITIVES[name].vjp
        if rule is None:
            raise KeyError(name)
        return rule

    def __iter__(self) -> Iterator[str]:
        return (name for name, prim in PRIMITIVES.items() if prim.vjp is not None)

    def __len__(self) -> int:
        return sum(1 for _ in self)


VJP_RULES = _VjpRules()


def _lazy(needs: Sequence[bool], *thunks: Callable[[], Tracer]) -> list:
    """Calls the thunk of each operand that needs a cotangent."""
    return [t() if n else None for n, t in zip(needs, thunks)]


@_rule("add")
def _add_vjp(ct, ops, out, params, needs):
    a, b = ops
    return _lazy(needs, lambda: _unbroadcast(ct, a.shape), lambda: _unbroadcast(ct, b.shape))


@_rule("sub")
def _sub_vjp(ct, ops, out, params, needs):
    a, b = ops
    return _lazy(needs, lambda: _unbroadcast(ct, a.shape), lambda: _unbroadcast(-ct, b.shape))


@_rule("mul")
def _mul_vjp(ct, ops, out, params, needs):
    a, b = ops
    return _lazy(
        needs, lambda: _unbroadcast(ct * b, a.shape), lambda: _unbroadcast(ct * a, b.shape)
    )


@_rule("div")
def _div_vjp(ct, ops, out, params, needs):
    a, b = ops
    # d(a/b)/db = -a/b**2 = -out/b.
    return _lazy(
        needs,
        lambda: _unbroadcast(ct / b, a.shape),
        lambda: _unbroadcast(-(ct * out) / b, b.shape),
    )


@_rule("pow")
def _pow_vjp(ct, ops, out, params, needs):
    a, b = ops

    def base() -> Tracer:
        # b * a**(b-1), and 0 where b == 0 (a**-1 would be inf at a == 0); the
        # safe exponent keeps inf and NaN out of higher derivatives.
        b_is_0 = b == 0
        d = _where(b_is_0, 0, b * a ** (_where(b_is_0, 1, b) - 1))
        return _unbroadcast(ct * d, a.shape)

    def exponent() -> Tracer:
        # log(a) * out where a > 0 and 0 elsewhere (no real log there); the log
        # of a safe operand keeps NaN out of higher derivatives.
        a_f = a if a.dtype.kind == "f" else a.astype(out.dtype)
        pos = a_f > 0
        log_a = _where(pos, a_f, 1)._unary("log")
        return _unbroadcast(_where(pos, ct * log_a * out, 0), b.shape)

    return _lazy(needs, base, exponent)


def _extremum_vjp(greater: str):
    """max/min: the winner gets the cotangent; ties split it half and half, as JAX."""

    def rule(ct, ops, out, params, needs):
        a, b = ops
        dt = out.dtype

        def weight(x: Tracer, y: Tracer) -> Tracer:
            wins = _mask(bind(x._trace, greater, (x, y)), dt)
            return wins + _mask(x == y, dt) * 0.5

        return _lazy(
            needs,
            lambda: _unbroadcast(ct * weight(a, b), a.shape),
            lambda: _unbroadcast(ct * weight(b, a), b.shape),
        )

    return rule


_rule("max")(_extremum_vjp("gt"))
_rule("min")(_extremum_vjp("lt"))


@_rule("neg")
def _neg_vjp(ct, ops, out, params, needs):
    return [-ct]


@_rule("abs")
def _abs_vjp(ct, ops, out, params, needs):
    (x,) = ops
    sign = _mask(x > 0, ct.dtype) - _mask(x < 0, ct.dtype)
    return [ct * sign]


@_rule("exp")
def _exp_vjp(ct, ops, out, params, needs):
    return [ct * out]


@_rule("log")
def _log_vjp(ct, ops, out, params, needs):
    return [ct / ops[0]]


@_rule("tanh")
def _tanh_vjp(ct, ops, out, params, needs):
    return [ct * (1 - out * out)]


@_rule("sqrt")
def _sqrt_vjp(ct, ops, out, params, needs):
    return [ct * 0.5 / out]


@_rule("rsqrt")
def _rsqrt_vjp(ct, ops, out, params, needs):
    # d(x**-0.5)/dx = -0.5 * x**-1.5 = -0.5 * out / x.
    return [ct * (-0.5) * out / ops[0]]


@_rule("sin")
def _sin_vjp(ct, ops, out, params, needs):
    return [ct * ops[0]._unary("cos")]


@_rule("cos")
def _cos_vjp(ct, ops, out, params, needs):
    return [-(ct * ops[0]._unary("sin"))]


@_rule("convert", "copy", "simulated_compute")
def _identity_vjp(ct, ops, out, params, needs):
    # convert: only float -> float is recorded; the caller casts back.
    return [ct]


@_rule("select")
def _select_vjp(ct, ops, out, params, needs):
    c, x, y = ops
    return _lazy(
        needs,
        lambda: None,
        lambda: _unbroadcast(_where(c, ct, 0), x.shape),
        lambda: _unbroadcast(_where(c, 0, ct), y.shape),
    )


@_rule("reduce")
def _reduce_vjp(ct, ops, out, params, needs):
    (x,) = ops
    kind = params["kind"]
    axes = _reduced_axes(x.ndim, params["axes"])
    keepdims = params["keepdims"]
    if kind == "sum" or kind == "mean":
        if kind == "mean":
            count = 1
            for a in axes:
                count *= x.shape[a]
            ct = ct / float(max(count, 1))
        return [_broadcast_to(_expand_reduced(ct, x.shape, axes, keepdims), x.shape)]
    if kind == "max" or kind == "min":
        # Every position equal to the result shares the cotangent equally, as JAX.
        at = _mask(x == _expand_reduced(out, x.shape, axes, keepdims), ct.dtype)
        share = at / _sum(at, axes, keepdims=True)
        return [_expand_reduced(ct, x.shape, axes, keepdims) * share]
    return [None]  # argmax: an int32 result carries no cotangent


def _collective(prim: str, ct: Tracer, **params: Any) -> Tracer:
    return bind(ct._trace, prim, (ct,), **params)


@_rule("psum")
def _psum_vjp(ct, ops, out, params, needs):
    return [_collective("psum", ct, axis_name=params["axis_name"])]


@_rule("pmean")
def _pmean_vjp(ct, ops, out, params, needs):
    return [_collective("pmean", ct, axis_name=params["axis_name"])]


@_rule("pmax", "pmin")
def _pextremum_vjp(ct, ops, out, params, needs):
    # Every device's result is the extremum, so its cotangent is the sum over
    # devices, shared equally among the devices that hold the extremum.
    axis_name = params["axis_name"]
    at = _mask(ops[0] == out, ct.dtype)
    return [_collective("psum", ct, axis_name=axis_name) * at
            / _collective("psum", at, axis_name=axis_name)]


@_rule("ppermute")
def _ppermute_vjp(ct, ops, out, params, needs):
    inverse = [(d, s) for s, d in params["perm"]]
    return [_collective("ppermute", ct, axis_name=params["axis_name"], perm=inverse)]


@_rule("all_gather")
def _all_gather_vjp(ct, ops, out, params, needs):
    return [_collective("psum_scatter", ct, axis_name=params["axis_name"],
                        scatter_dimension=params["axis"])]


@_rule("psum_scatter")
def _psum_scatter_vjp(ct, ops, out, params, needs):
    return [_collective("all_gather", ct, axis_name=params["axis_name"],
                        axis=params["scatter_dimension"])]


@_rule("all_to_all")
def _all_to_all_vjp(ct, ops, out, params, needs):
    return [_collective("all_to_all", ct, axis_name=params["axis_name"],
                        split_axis=params["concat_axis"], concat_axis=params["split_axis"])]


@_rule("reshape")
def _reshape_vjp(ct, ops, out, params, needs):
    return [_reshape(ct, ops[0].shape)]


@_rule("broadcast_to")
def _broadcast_to_vjp(ct, ops, out, params, needs):
    return [_unbroadcast(ct, ops[0].shape)]


@_rule("transpose")
def _transpose_vjp(ct, ops, out, params, needs):
    perm = params["perm"]
    inverse = [0] * len(perm)
    for i, p in enumerate(perm):
        inverse[p % len(perm)] = i
    return [_transpose(ct, inverse)]


@_rule("slice")
def _slice_vjp(ct, ops, out, params, needs):
    # Zeros around and between the taken elements: a pad with interior
    # step - 1, and whatever the slice did not reach at the high end.
    (x,) = ops
    lo, hi, interior = [], [], []
    for d, start, step, n in zip(x.shape, params["start"], params["step"], ct.shape):
        covered = n + max(n - 1, 0) * (step - 1)
        lo.append(start)
        interior.append(step - 1)
        hi.append(d - start - covered)
    return [bind(ct._trace, "pad", (ct,), lo=lo, hi=hi, interior=interior)]


@_rule("pad")
def _pad_vjp(ct, ops, out, params, needs):
    (x,) = ops
    start, limit, step = [], [], []
    for d, lo, gap in zip(x.shape, params["lo"], params["interior"]):
        start.append(lo)
        limit.append(lo + (d - 1) * (gap + 1) + 1 if d else lo)
        step.append(gap + 1)
    return [bind(ct._trace, "slice", (ct,), start=start, limit=limit, step=step)]


@_rule("rev")
def _rev_vjp(ct, ops, out, params, needs):
    return [bind(ct._trace, "rev", (ct,), axes=list(params["axes"]))]


@_rule("concatenate")
def _concatenate_vjp(ct, ops, out, params, needs):
    axis = operator.index(params["axis"]) % ct.ndim
    cts: list = []
    offset = 0
    for x, need in zip(ops, needs):
        size = x.shape[axis]
        if need:
            start = [0] * ct.ndim
            limit = list(ct.shape)
            start[axis], limit[axis] = offset, offset + size
            cts.append(bind(ct._trace, "slice", (ct,), start=start, limit=limit,
                            step=[1] * ct.ndim))
        else:
            cts.append(None)
        offset += size
    return cts


@_rule("take")
def _take_vjp(ct, ops, out, params, needs):
    x, indices = ops
    axis = operator.index(params["axis"]) % x.ndim
    return [
        bind(ct._trace, "scatter_add", (ct, indices), axis=axis, size=x.shape[axis]),
        None,
    ]


@_rule("scatter_add")
def _scatter_add_vjp(ct, ops, out, params, needs):
    _, indices = ops
    return [bind(ct._trace, "take", (ct, indices), axis=params["axis"]), None]


def _swap_last(x: Tracer) -> Tracer:
    perm = list(range(x.ndim))
    perm[-2], perm[-1] = perm[-1], perm[-2]
    return _transpose(x, perm)


@_rule("matmul")
def _matmul_vjp(ct, ops, out, params, needs):
    a, b = ops
    trace = ct._trace
    return _lazy(
        needs,
        lambda: _unbroadcast(bind(trace, "matmul", (ct, _swap_last(b))), a.shape),
        lambda: _unbroadcast(bind(trace, "matmul", (_swap_last(a), ct)), b.shape),
    )


# --- The backward pass -----------------------------------------------------------


def _backward(trace: _FunctionTrace, tape: _Tape, out: Tracer) -> dict:
    """Walks `tape` backwards from a cotangent of 1 for `out`.

    Returns:
      Cotangents by value id, for the values the walk reached that are no
      output of a recorded op (the tape's inputs among them).

    Raises:
      NotImplementedError: For a primitive without a gradient rule on the path.
    """
    cts = {out._id: trace.constant(np.ones((), out.dtype), None)}
    tracked = tape.tracked
    for prim, ids, out_id, params in reversed(tape.entries):
        ct = cts.pop(out_id, None)
        if ct is None:
            continue
        rule = prim.vjp
        if rule is None:
            raise NotImplementedError(
                f"pw.grad: differentiation of primitive {prim.name!r} is not implemented "
                f"(in {trace.where()})"
            )
        operands = [Tracer(trace, i) for i in ids]
        needs = [i in tracked for i in ids]
        contributions = rule(ct, operands, Tracer(trace, out_id), params, needs)
        for i, x, c, need in zip(ids, operands, contributions, needs):
            if c is None or not need:
                continue
            if c.dtype != x.dtype:
                c = c.astype(x.dtype)
            if c.shape != x.shape:
                raise AssertionError(
                    f"pw.grad: the rule of {prim.name!r} gave a cotangent {c.aval} for an operand "
                    f"{x.aval} (a bug in pathways._autodiff)"
                )
            prev = cts.get(i)
            cts[i] = c if prev is None else prev + c
    return cts


# --- grad --------------------------------------------------------------------------


def _real_dtype_error(what: str, pos: int) -> TypeError:
    return TypeError(
        f"grad requires real-valued inputs (float32 or float64), got {what} for argument {pos}"
    )


def _differentiated_input(trace: _FunctionTrace, leaf: Any, pos: int) -> Tracer:
    """A fresh traced value for one differentiated leaf of argument `pos`."""
    if isinstance(leaf, Tracer):
        leaf._check()
        if leaf.dtype.name not in _FLOAT_DTYPE_NAMES:
            raise _real_dtype_error(leaf.dtype.name, pos)
        # A fresh id: the tape must not mistake the same value passed twice,
        # or closed over by the function, for this input.
        return bind(trace, "copy", (leaf,))
    if isinstance(leaf, _TracerBase):
        raise TracerError(
            f"grad in {trace.where()} got a traced program value ({leaf.aval}) for argument "
            f"{pos}; pass program values to pmap'd functions as arguments"
        )
    _check_concrete_leaf(leaf, pos)
    return trace.constant(leaf, None)  # Fresh already.


def _check_concrete_leaf(leaf: Any, pos: int) -> None:
    """TypeError unless `leaf` (not traced) is a float array or a Python float."""
    if isinstance(leaf, (bool, int)) and not isinstance(leaf, np.generic):
        raise _real_dtype_error(type(leaf).__name__, pos)
    if isinstance(leaf, float):
        return
    dtype = getattr(leaf, "dtype", None)
    if dtype is None:
        dtype = np.asarray(leaf).dtype
    dtype = np.dtype(dtype)
    if dtype.name not in _FLOAT_DTYPE_NAMES:
        raise _real_dtype_error(dtype.name, pos)


def _output(trace: _FunctionTrace, out: Any, name: str) -> Tracer:
    """The differentiated function's output as a float scalar traced value."""
    if isinstance(out, Tracer):
        out._check()
    elif isinstance(out, _TracerBase):
        raise TracerError(
            f"grad of {name!r} in {trace.where()}: the function returned a traced program "
            f"value ({out.aval})"
        )
    else:
        try:
            out = trace.constant(out, None)
        except (TypeError, ValueError) as e:
            raise TypeError(
                f"grad of {name!r}: the function must return a float scalar, got {out!r} ({e})"
            ) from None
    if out.shape != ():
        raise TypeError(
            f"Gradient only defined for scalar-output functions. Output had shape {out.aval} "
            f"(grad of {name!r} in {trace.where()})"
        )
    if out.dtype.name not in _FLOAT_DTYPE_NAMES:
        raise TypeError(
            f"grad requires real-valued outputs (float32 or float64), got {out.aval} "
            f"(grad of {name!r} in {trace.where()})"
        )
    return out


def _normalize_argnums(argnums: Union[int, Sequence[int]]) -> tuple:
    if isinstance(argnums, (tuple, list)):
        return tuple(operator.index(a) for a in argnums)
    return (operator.index(argnums),)


def _positions(argnums: tuple, nargs: int, name: str) -> list:
    positions = []
    for a in argnums:
        if not -nargs <= a < nargs:
            raise TypeError(
                f"grad of {name!r}: differentiating with respect to argnums={a} requires at "
                f"least {a + 1 if a >= 0 else -a} positional arguments, got {nargs}"
            )
        p = a % nargs
        if p in positions:
            raise ValueError(f"grad of {name!r}: argnums repeats argument {p}")
        positions.append(p)
    return positions


def _value_and_grad_in_trace(
    trace: _FunctionTrace,
    fn: Callable[..., Any],
    name: str,
    argnums: tuple,
    single: bool,
    has_aux: bool,
    args: tuple,
    kwargs: dict,
) -> tuple:
    """`(value, aux, gradients)` of `fn` at `args`, inside function trace `trace`."""
    positions = _positions(argnums, len(args), name)
    args = list(args)
    inputs = []  # (treedef, input tracers) per differentiated argument
    for p in positions:
        leaves, treedef = tree_flatten(args[p])
        fresh = [_differentiated_input(trace, leaf, p) for leaf in leaves]
        args[p] = tree_unflatten(treedef, fresh)
        inputs.append((treedef, fresh))
    tape = _Tape(trace.builder, [t._id for _, fresh in inputs for t in fresh])
    trace.tapes.append(tape)
    try:
        result = fn(*args, **kwargs)
    finally:
        trace.tapes.remove(tape)
    aux = None
    if has_aux:
        if not isinstance(result, (tuple, list)) or len(result) != 2:
            raise TypeError(
                f"grad of {name!r} with has_aux=True: the function must return a pair "
                f"(output, auxiliary data), got {type(result).__name__}"
            )
        result, aux = result
    out = _output(trace, result, name)
    cts = _backward(trace, tape, out)
    grads = []
    for treedef, fresh in inputs:
        leaves = []
        for t in fresh:
            g = cts.get(t._id)
            leaves.append(_zeros(trace, t.shape, t.dtype) if g is None else g)
        grads.append(tree_unflatten(treedef, leaves))
    return out, aux, grads[0] if single else tuple(grads)


def _differentiate(
    fn: Callable[..., Any], argnums: Any, has_aux: bool, with_value: bool
) -> Callable[..., Any]:
    """The function that `grad` (`with_value=False`) or `value_and_grad` returns.

    Inside a `pw.pmap` trace it differentiates there. Outside any trace it
    runs itself as a `pw.pmap` over one device, compiled once per signature
    (the pmap is created on first use and kept in this closure).
    """
    name = getattr(fn, "__name__", type(fn).__name__)
    kind = "value_and_grad" if with_value else "grad"
    nums = _normalize_argnums(argnums)
    single = not isinstance(argnums, (tuple, list))
    has_aux = bool(has_aux)
    pmapped: list = []  # The cached PmapFunction, once created.
    lock = threading.Lock()

    @functools.wraps(fn)
    def differentiated(*args: Any, **kwargs: Any) -> Any:
        trace = _state.function
        if trace is None:
            if _state.program is not None:
                raise TracerError(
                    f"{kind} of {name!r} was called in {_state.program.where()} outside any "
                    "pmap'd function: grad must be called inside a pmap'd function (compute "
                    "the gradient inside the function given to pw.pmap)"
                )
            return call_outside(args, kwargs)
        out, aux, grads = _value_and_grad_in_trace(
            trace, fn, name, nums, single, has_aux, args, kwargs
        )
        value = (out, aux) if has_aux else out
        if with_value:
            return value, grads
        return (grads, aux) if has_aux else grads

    def per_device(kwargs: dict) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            return differentiated(*args, **kwargs)

        call.__name__ = f"{kind}_of_{name}"
        return call

    def call_outside(args: tuple, kwargs: dict) -> Any:
        """Runs as a pmap over one device: a leading axis of 1 on every leaf."""
        for p in _positions(nums, len(args), name):
            for leaf in tree_flatten(args[p])[0]:
                if not isinstance(leaf, _TracerBase):
                    _check_concrete_leaf(leaf, p)
        if kwargs:
            # Keyword arguments are closed over: a fresh pmap (and trace) per call.
            fn_1 = PmapFunction(per_device(kwargs), None, None)
        else:
            with lock:
                if not pmapped:
                    pmapped.append(PmapFunction(per_device({}), None, None))
            fn_1 = pmapped[0]
        stacked = tree_map(lambda leaf: np.asarray(_to_array(leaf))[None], args)
        return tree_map(lambda o: np.asarray(o)[0, ...], fn_1(*stacked))

    return differentiated


def grad(fn: Callable[..., Any], argnums: Union[int, Sequence[int]] = 0,
         has_aux: bool = False) -> Callable[..., Any]:
    """The gradient of `fn`, like `jax.grad` (reverse mode).

    Call the result inside a function traced by `pw.pmap`: the backward ops
    are traced into the same compiled function. With collectives the
    semantics are `jax.pmap`'s: each device gets the gradient of the sum over
    devices of every device's output with respect to its own inputs (the
    transpose of `psum` is `psum`). Called outside any trace (on numpy arrays
    or Python floats), it runs as a `pw.pmap` over one device and returns
    numpy arrays; Python floats are float64. `grad` of a `grad` gives higher
    derivatives.

    Example:
      >>> f = pw.pmap(pw.grad(lambda x: (x * x).sum()), devices=tpus)
      >>> f(np.array([[1., 2.], [3., 4.]]))
      array([[2., 4.],
             [6., 8.]])

    Args:
      fn: The function to differentiate. Its differentiated arguments are
        pytrees of float32/float64 values (traced values, numpy arrays or
        Python floats); it returns a float scalar (or, with `has_aux`, a pair
        of a float scalar and any pytree). Keyword arguments are passed
        through and not differentiated.
      argnums: The position of the argument to differentiate, or a tuple of
        positions (negative counts from the end).
      has_aux: Whether `fn` returns `(output, aux)`; `aux` is returned as is.

    Returns:
      A function with `fn`'s arguments that returns the gradient: a pytree
      like argument `argnums` (a tuple of them for a tuple `argnums`), each
      leaf of its input's shape and dtype; `(gradient, aux)` with `has_aux`.

    Raises:
      TypeError: If `fn` is not callable; when called: for an int or bool
        differentiated leaf, an output that is not a float scalar, or
        `argnums` beyond the arguments.
      ValueError: When called, if `argnums` names an argument twice.
      TracerError: When called inside `@pw.program` outside a pmap'd function.
      NotImplementedError: When called, for an op without a gradient rule.
    """
    if not callable(fn):
        raise TypeError(f"grad expects a callable, got {fn!r}")
    return _differentiate(fn, argnums, has_aux, with_value=False)


def value_and_grad(fn: Callable[..., Any], argnums: Union[int, Sequence[int]] = 0,
                   has_aux: bool = False) -> Callable[..., Any]:
    """`fn`'s value and gradient, like `jax.value_and_grad`.

    As `grad`, but the function returns `(value, gradient)`, or
    `((value, aux), gradient)` with `has_aux`.

    Args:
      fn: As for `grad`.
      argnums: As for `grad`.
      has_aux: As for `grad`.

    Returns:
      A function with `fn`'s arguments returning `(value, gradient)`.

    Raises:
      As `grad`.
    """
    if not callable(fn):
        raise TypeError(f"value_and_grad expects a callable, got {fn!r}")
    return _differentiate(fn, argnums, has_aux, with_value=True)


def stop_gradient(x: Any) -> Any:
    """`x`, with no gradient flowing back through it, like `jax.lax.stop_gradient`.

    Args:
      x: A pytree. Inside a function traced by `pw.pmap`, each float traced
        leaf goes through a "stop_gradient" op (an identity that `grad`
        treats as a constant); other leaves are returned as they are.
        Outside a trace, `x` is returned unchanged.

    Returns:
      A pytree like `x`.

    Raises:
      TracerError: For a traced value used after its trace ended.
    """
    trace = _state.function
    if trace is None:
        return x

    def stop(leaf: Any) -> Any:
        if isinstance(leaf, Tracer):
            leaf._check()
            if leaf.dtype.name in _FLOAT_DTYPE_NAMES:
                return bind(trace, "stop_gradient", (leaf,))
        return leaf

    return tree_map(stop, x)
