"""The VJP rules of the primitives: how `pw.grad` differentiates each op.

Each rule is registered onto its `Primitive` (pathways._primitives) with
`@_rule(name, ...)`, which sets the primitive's `vjp`; the package imports
this module, and pathways._autodiff's backward pass calls `prim.vjp`. The
rules are written with pathways.numpy, a layer above pathways._autodiff, which
imports neither.

The rules emit their ops through `bind` (Tracer operators included), so a
tape of an enclosing `grad` records the backward ops too: nested `grad` gives
higher derivatives. With collectives the semantics are those of `jax.pmap`:
the transpose of `psum` is `psum`.
"""

from __future__ import annotations

import math
import operator
from typing import Any, Callable, Optional, Sequence

import numpy as np

from pathways._primitives import PRIMITIVES
from pathways._trace_state import _is_float
from pathways._tracer import Tracer, bind
from pathways.numpy import argsort as _argsort
from pathways.numpy import broadcast_to as _broadcast_to
from pathways.numpy import concatenate as _concatenate
from pathways.numpy.linalg import solve as _solve
from pathways.numpy import reshape as _reshape
from pathways.numpy import rint as _rint
from pathways.numpy import take_along_axis as _take_along_axis
from pathways.numpy import transpose as _transpose
from pathways.numpy._indexing import _scatter_add_along_axis

__all__: list = []


# --- Helpers the rules emit with --------------------------------------------


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


@_rule("rem")
def _rem_vjp(ct, ops, out, params, needs):
    a, b = ops

    def divisor() -> Tracer:
        # rem = a - trunc(a / b) * b: d/db = -trunc(a / b), the quotient
        # (a - rem) / b snapped to its integer (it is one up to rounding).
        return _unbroadcast(-ct * _rint((a - out) / b), b.shape)

    return _lazy(needs, lambda: _unbroadcast(ct, a.shape), divisor)


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
        a_f = a if _is_float(a.dtype) else a.astype(out.dtype)
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
    # As JAX (select(x >= 0, g, -g)): the subgradient 1 at 0 and -0.
    return [ct * (2 * _mask(x >= 0, ct.dtype) - 1)]


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


@_rule("tan")
def _tan_vjp(ct, ops, out, params, needs):
    return [ct * (1 + out * out)]


def _float_of(x: Tracer, out: Tracer) -> Tracer:
    """`x` in the float dtype its op computed in (integers and bool were converted)."""
    return x if x.dtype == out.dtype else x.astype(out.dtype)


@_rule("asin")
def _asin_vjp(ct, ops, out, params, needs):
    x = _float_of(ops[0], out)
    return [ct * ((1 - x) * (1 + x))._unary("rsqrt")]


@_rule("acos")
def _acos_vjp(ct, ops, out, params, needs):
    x = _float_of(ops[0], out)
    return [-(ct * ((1 - x) * (1 + x))._unary("rsqrt"))]


@_rule("atan")
def _atan_vjp(ct, ops, out, params, needs):
    x = _float_of(ops[0], out)
    return [ct / (1 + x * x)]


@_rule("sinh")
def _sinh_vjp(ct, ops, out, params, needs):
    return [ct * _float_of(ops[0], out)._unary("cosh")]


@_rule("cosh")
def _cosh_vjp(ct, ops, out, params, needs):
    return [ct * _float_of(ops[0], out)._unary("sinh")]


@_rule("asinh")
def _asinh_vjp(ct, ops, out, params, needs):
    x = _float_of(ops[0], out)
    return [ct * (x * x + 1)._unary("rsqrt")]


@_rule("acosh")
def _acosh_vjp(ct, ops, out, params, needs):
    x = _float_of(ops[0], out)
    return [ct * ((x - 1) * (x + 1))._unary("rsqrt")]


@_rule("atanh")
def _atanh_vjp(ct, ops, out, params, needs):
    x = _float_of(ops[0], out)
    return [ct / ((1 - x) * (1 + x))]


@_rule("atan2")
def _atan2_vjp(ct, ops, out, params, needs):
    # d atan2(y, x) = (x dy - y dx) / (x^2 + y^2).
    y, x = (_float_of(v, out) for v in ops)
    scale = ct / (x * x + y * y)
    return _lazy(needs, lambda: _unbroadcast(scale * x, y.shape),
                 lambda: _unbroadcast(-(scale * y), x.shape))


_TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)


def _gaussian(x: Tracer, dtype: np.dtype) -> Tracer:
    """2 / sqrt(pi) * exp(-x**2), erf's derivative, in float `dtype` (x may be int or bool)."""
    x = x if x.dtype == dtype else x.astype(dtype)
    return _TWO_OVER_SQRT_PI * (-(x * x))._unary("exp")


@_rule("erf")
def _erf_vjp(ct, ops, out, params, needs):
    return [ct * _gaussian(ops[0], out.dtype)]


@_rule("erfc")
def _erfc_vjp(ct, ops, out, params, needs):
    return [-(ct * _gaussian(ops[0], out.dtype))]


@_rule("convert", "copy", "simulated_compute")
def _identity_vjp(ct, ops, out, params, needs):
    # convert: only float -> float is recorded; the caller casts back.
    return [ct]


@_rule("bitcast_convert_type")
def _bitcast_vjp(ct, ops, out, params, needs):
    # A float result comes from integer bits, which need no cotangent (and a
    # float operand gives an integer result, which tapes do not record): no
    # gradient flows, as in JAX.
    return [None]


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


def _clip_indices(indices: Tracer, size: int) -> Tracer:
    """int32 `indices` clipped into [0, size), as the take kernel reads them."""
    return _where(indices < 0, 0, _where(indices >= size, size - 1, indices))


def _scatter(combiner: str, operand: Tracer, indices: Tracer, updates: Tracer, axis: int,
             size: int) -> Tracer:
    return bind(operand._trace, "scatter", (operand, indices, updates), combiner=combiner,
                axis=axis, size=size)


def _scalar(trace: Any, value: Any, dtype: np.dtype) -> Tracer:
    return trace.constant(np.asarray(value, dtype=dtype), None)


@_rule("take")
def _take_vjp(ct, ops, out, params, needs):
    # The cotangent goes back to where take read, at the clipped indices (the
    # scatter drops out-of-range ones, take clips them).
    x, indices = ops
    axis = operator.index(params["axis"]) % x.ndim
    size = x.shape[axis]
    zero = _scalar(ct._trace, 0, ct.dtype)
    return [_scatter("add", zero, _clip_indices(indices, size), ct, axis, size), None]


def _index_mask(indices: Tracer, axis: int, like: Tracer) -> Tracer:
    """`indices` reshaped to broadcast against updates `like` (their dims at `axis`)."""
    shape = [1] * axis + list(indices.shape) + [1] * (like.ndim - axis - indices.ndim)
    return _reshape(indices, shape)


@_rule("scatter")
def _scatter_vjp(ct, ops, out, params, needs):
    """scatter(x, i, u): each combiner's derivative, with dropped (out-of-range) indices
    giving their updates no cotangent.

    set: x keeps the cotangent where nothing was written; the update that won
    (the last at its index) gets it. add: both get it. mul: x gets it times the
    product of the updates at its position; an update gets it times x and the
    other updates there (zero-safe: by counts of zero updates, no division by
    zero). max and min: shared equally by the operand and updates that equal
    the result, as JAX's.
    """
    x, indices, u = ops
    combiner, axis, size = params["combiner"], params["axis"], params["size"]
    trace = ct._trace
    dt = ct.dtype
    valid = _index_mask((indices >= 0) & (indices < size), axis, u)
    safe = _clip_indices(indices, size)

    def gather(t: Tracer) -> Tracer:  # t's elements at the indices: updates' shape
        return bind(trace, "take", (t, safe), axis=axis)

    def at_updates(t: Tracer) -> Tracer:  # gather, 0 for dropped updates
        return _where(valid, gather(t), 0)

    def full(v: Any, like: Tracer) -> Tracer:
        return _broadcast_to(_scalar(trace, v, like.dtype), like.shape)

    if combiner == "add":
        return [_unbroadcast(ct, x.shape) if needs[0] else None, None,
                at_updates(ct) if needs[2] else None]
    if combiner == "set":
        d_x = d_u = None
        if needs[0]:
            d_x = _unbroadcast(_scatter("set", ct, indices, full(0, u).astype(dt), axis, size),
                               x.shape)
        if needs[2]:
            # Which update won at each index: scatter every index's number, read it back.
            flat = _reshape(indices, (indices.size,))
            numbers = trace.constant(np.arange(indices.size, dtype=np.int32), None)
            winner = _scatter("set", _scalar(trace, -1, np.int32), flat, numbers, 0, size)
            won = bind(trace, "take", (winner, _clip_indices(flat, size)), axis=0) == numbers
            won = _index_mask(_reshape(won, indices.shape), axis, u)
            d_u = _where(won & valid, gather(ct), 0)
        return [d_x, None, d_u]
    if combiner == "mul":
        one = _scalar(trace, 1, u.dtype)
        d_x = d_u = None
        if needs[0]:
            d_x = _unbroadcast(ct * _scatter("mul", one, indices, u, axis, size), x.shape)
        if needs[2]:
            is_zero = u == 0
            zeros_at = _scatter("add", _scalar(trace, 0, np.int32), indices,
                                is_zero.astype(np.int32), axis, size)
            nonzero_product = _scatter("mul", one, indices, _where(is_zero, 1, u), axis, size)
            n_zero = gather(zeros_at)
            p = gather(nonzero_product)
            others = _where(is_zero, _where(n_zero == 1, p, 0),
                            _where(n_zero == 0, p / _where(is_zero, 1, u), 0))
            d_u = _where(valid, gather(ct * _broadcast_to(x, out.shape)) * others, 0)
        return [d_x, None, d_u]
    # max, min: winners share equally.
    xb = _broadcast_to(x, out.shape)
    kept = xb == out
    won = valid & (u == gather(out))
    count = _scatter("add", kept.astype(dt), indices, won.astype(dt), axis, size)
    share = ct / _where(count == 0, 1, count)
    return [
        _unbroadcast(_where(kept, share, 0), x.shape) if needs[0] else None,
        None,
        _where(won, gather(share), 0) if needs[2] else None,
    ]


def _cumulative(x: Tracer, combiner: str, axis: int, reverse: bool) -> Tracer:
    return bind(x._trace, "cumulative", (x,), combiner=combiner, axis=axis, reverse=reverse)


def _shift_in_scan(x: Tracer, axis: int, reverse: bool) -> Tracer:
    """`x` moved one step along `axis` in scan order: element i holds the element
    before it (i - 1, or i + 1 when `reverse`), zero at the first."""
    n = x.shape[axis]
    start = [0] * x.ndim
    limit = list(x.shape)
    lo = [0] * x.ndim
    hi = [0] * x.ndim
    if reverse:
        start[axis] = 1
        hi[axis] = 1
    else:
        limit[axis] = n - 1
        lo[axis] = 1
    cut = bind(x._trace, "slice", (x,), start=start, limit=limit, step=[1] * x.ndim)
    return bind(x._trace, "pad", (cut,), lo=lo, hi=hi, interior=[0] * x.ndim)


@_rule("cumulative")
def _cumulative_vjp(ct, ops, out, params, needs):
    """cumsum: the reverse cumsum of the cotangent. cumprod: out_j / x_i summed over
    j >= i where no zero came before i, and at the first zero the same sum of the
    products with that zero taken as 1 (zero-safe); 0 after it. cummax/cummin: each
    output's cotangent to the first position that attained it (where the running
    value last changed)."""
    (x,) = ops
    combiner, axis, reverse = params["combiner"], params["axis"], params["reverse"]
    if combiner == "add":
        return [_cumulative(ct, "add", axis, not reverse)]
    trace = ct._trace
    if combiner == "mul":
        is_zero = x == 0
        zeros_so_far = _cumulative(is_zero.astype(np.int32), "add", axis, reverse)
        first_zero = is_zero & (zeros_so_far == 1)
        before = zeros_so_far == 0
        tail = _cumulative(ct * out, "add", axis, not reverse)
        at_first = _cumulative(ct * _cumulative(_where(first_zero, 1, x), "mul", axis, reverse),
                               "add", axis, not reverse)
        return [_where(before, tail / _where(before, x, 1), _where(first_zero, at_first, 0))]
    # max, min: positions (along the axis) where the running value changed.
    n = x.shape[axis]
    iota_shape = [1] * x.ndim
    iota_shape[axis] = n
    iota = trace.constant(np.arange(n, dtype=np.int32).reshape(iota_shape), None)
    first = iota == (n - 1 if reverse else 0)
    changed = first | (out != _shift_in_scan(out, axis, reverse))
    if reverse:
        at = _cumulative(_where(changed, iota, n), "min", axis, True)
    else:
        at = _cumulative(_where(changed, iota, -1), "max", axis, False)
    return [_scatter_add_along_axis(trace, x.shape, at, ct, axis)]


def _swap_last(x: Tracer) -> Tracer:
    perm = list(range(x.ndim))
    perm[-2], perm[-1] = perm[-1], perm[-2]
    return _transpose(x, perm)


@_rule("svd")
def _svd_vjp(cts, ops, out, params, needs):
    """The reverse mode of x = u diag(s) vt (thin; k = min(m, n)), JAX's rule transposed.

    With F[i, j] = 1 / (s_j^2 - s_i^2) off the diagonal (0 on it) and v = vt^T:
      dx = u (diag(ds) + (F o (u^T du - du^T u)) diag(s) + diag(s) (F o (v^T dv - dv^T v))) vt
           + (I - u u^T) du diag(1/s) vt + u diag(1/s) dv^T (I - v v^T)
    (1/s taken as 0 where s is 0; the projections only where m > k, n > k).
    Equal nonzero singular values make the du, dv terms infinite, as in JAX.
    """
    (x,) = ops
    if not needs[0]:
        return [None]
    ct_u, ct_s, ct_vt = cts
    u, s, vt = out
    m, n = x.shape[-2:]
    k = min(m, n)
    if params["full_matrices"] and m != n:
        if ct_u is not None or ct_vt is not None:
            raise NotImplementedError(
                "differentiation through u or vt of pathways.numpy.linalg.svd(full_matrices=True) of a "
                f"non-square matrix {x.aval}: their extra columns are not unique; use "
                "full_matrices=False (JAX has the same limit)"
            )
        u, vt = u[..., :k], vt[..., :k, :]
    if ct_u is None and ct_vt is None:
        return [(u * ct_s[..., None, :]) @ vt]
    trace = x._trace
    eye = trace.constant(np.eye(k, dtype=x.dtype), None)
    s_col, s_row = s[..., None, :], s[..., :, None]
    s2 = s * s
    f = 1 / (s2[..., None, :] - s2[..., :, None] + eye) - eye
    zero = (s == 0).astype(x.dtype)
    s_inv = (1 / (s + zero) - zero)[..., None, :]
    inner = eye * ct_s[..., None, :] if ct_s is not None else None

    def plus(a, b):
        return b if a is None else a + b

    dx = None
    if ct_u is not None:
        utu = _swap_last(u) @ ct_u
        inner = plus(inner, f * (utu - _swap_last(utu)) * s_col)
        if m > k:
            proj = ct_u - u @ (_swap_last(u) @ ct_u)
            dx = plus(dx, (proj * s_inv) @ vt)
    if ct_vt is not None:
        ct_v = _swap_last(ct_vt)
        vtv = vt @ ct_v
        inner = plus(inner, s_row * (f * (vtv - _swap_last(vtv))))
        if n > k:
            proj = ct_v - _swap_last(vt) @ (vt @ ct_v)
            dx = plus(dx, (u * s_inv) @ _swap_last(proj))
    return [plus(dx, u @ inner @ vt)]


def _triangle(x: Tracer, lower: bool, strict: bool) -> Tracer:
    """x's lower (or upper) triangle of its last two dims, the diagonal left out when `strict`; 0 elsewhere."""
    n, m = x.shape[-2:]
    keep = np.tril(np.ones((n, m), bool), -1 if strict else 0) if lower else \
        np.triu(np.ones((n, m), bool), 1 if strict else 0)
    return _where(x._trace.constant(keep, None), x, 0.0)


def _trsm(a: Tracer, b: Tracer, lower: bool, unit_diagonal: bool, transpose_a: bool) -> Tracer:
    return bind(a._trace, "triangular_solve", (a, b), lower=lower, unit_diagonal=unit_diagonal,
                transpose_a=transpose_a)


@_rule("triangular_solve")
def _triangular_solve_vjp(ct, ops, out, params, needs):
    """x = op(A)^-1 b for the triangle A of a: db = op(A)^-T ct, and dA = -db x^T (op(A) = A)
    or -x db^T (op(A) = A^T), in the triangle that is read."""
    a, _ = ops
    lower, unit, trans = params["lower"], params["unit_diagonal"], params["transpose_a"]
    db = _trsm(a, ct, lower, unit, not trans)
    if not needs[0]:
        return [None, db]
    da = -(out @ _swap_last(db)) if trans else -(db @ _swap_last(out))
    return [_triangle(da, lower, unit), db if needs[1] else None]


def _lower_read(g: Tracer) -> Tracer:
    """The cotangent of an op that reads only its operand's lower triangle, as the symmetric
    matrix it stands for, from `g`, a cotangent of that symmetric matrix: tril(g) + tril(g^T, -1)."""
    return _triangle(g, True, False) + _triangle(_swap_last(g), True, True)


@_rule("eigh")
def _eigh_vjp(cts, ops, out, params, needs):
    """a = v diag(w) v^T: JAX's rule (dw = diag(v^T da v), dv = v (F o (v^T da v)),
    F[i, j] = 1 / (w_j - w_i) off the diagonal) transposed: v (diag(dw) + F o (v^T dv)) v^T,
    then onto the lower triangle the op reads. Equal eigenvalues make dv's part infinite."""
    if not needs[0]:
        return [None]
    ct_w, ct_v = cts
    w, v = out
    trace = w._trace
    n = w.shape[-1]
    eye = trace.constant(np.eye(n, dtype=w.dtype), None)
    inner = None
    if ct_w is not None:
        inner = eye * ct_w[..., None, :]
    if ct_v is not None:
        f = 1 / (w[..., None, :] - w[..., :, None] + eye) - eye
        term = f * (_swap_last(v) @ ct_v)
        inner = term if inner is None else inner + term
    return [_lower_read(v @ inner @ _swap_last(v))]


@_rule("cholesky")
def _cholesky_vjp(ct, ops, out, params, needs):
    """L = chol(a): JAX's rule (dL = L phi(L^-1 da L^-T), phi: the lower triangle with its
    diagonal halved) transposed: L^-T phi(L^T dL) L^-1, onto the lower triangle read."""
    if not needs[0]:
        return [None]
    n = out.shape[-1]
    half = out._trace.constant(np.tril(np.ones((n, n)), -1) + 0.5 * np.eye(n), None).astype(out.dtype)
    p = (_swap_last(out) @ ct) * half
    left = _trsm(out, p, True, False, True)                       # L^-T P
    g = _swap_last(_trsm(out, _swap_last(left), True, False, True))  # (L^-T (L^-T P)^T)^T = L^-T P L^-1
    return [_lower_read(g)]


def _thin_qr_vjp(q: Tracer, r: Tracer, ct_q: Optional[Tracer], ct_r: Optional[Tracer]) -> Tracer:
    """x = q r with m >= n (q m x n, r n x n upper): JAX's thin rule (X = q^T dx r^-1,
    L = tril(X, -1), W = L - L^T, dq = q (W - X) + dx r^-1, dr = (X - W) r) transposed:
    dx = (dq + q C) r^-T with M = q^T dq - dr r^T and C = tril(M - M^T, -1) - M."""
    if ct_q is None:
        ct_q = q._trace.constant(np.zeros(q.shape, q.dtype), None)
    mm = _swap_last(q) @ ct_q
    if ct_r is not None:
        mm = mm - ct_r @ _swap_last(r)
    c = _triangle(mm - _swap_last(mm), True, True) - mm
    y = ct_q + q @ c
    return _swap_last(_trsm(r, _swap_last(y), False, False, False))  # y r^-T = (r^-1 y^T)^T


@_rule("qr")
def _qr_vjp(cts, ops, out, params, needs):
    """JAX's QR rules transposed (a singular r gives infinities).

    m >= n, thin (or square): `_thin_qr_vjp`. Wide (m < n): x = [x1 x2], r = [r1 r2] with
    x1 = q r1 square and r2 = q^T x2, so dq and dr1 come from x1's thin rule and
    dr2 = dq^T x2 + q^T dx2: the transpose adds x2 dr2^T to q's cotangent and gives
    dx2 = q dr2. Complete of tall (m > n): q = [q_mn q_mp], whose last columns follow
    LAPACK's Householder convention: dq_mp = dq_mn Z^T - (q_mn + q_mp Z)(dq_pn - Z dq_nn)^T
    with Z = q_pn (q_nn - I)^-1 (JAX's, from arXiv:2409.13374), transposed onto dq_mn.
    """
    (x,) = ops
    if not needs[0]:
        return [None]
    ct_q, ct_r = cts
    q, r = out
    m, n = x.shape[-2:]
    if m < n:
        if ct_r is not None:
            ct_r1, ct_r2 = ct_r[..., :, :m], ct_r[..., :, m:]
            extra = x[..., :, m:] @ _swap_last(ct_r2)
            ct_q = extra if ct_q is None else ct_q + extra
            dx2 = q @ ct_r2
        else:
            ct_r1 = None
            dx2 = x._trace.constant(np.zeros(x.shape[:-1] + (n - m,), x.dtype), None)
        dx1 = _thin_qr_vjp(q, r[..., :, :m], ct_q, ct_r1)
        return [_concatenate([dx1, dx2], axis=-1)]
    if not params["full_matrices"] or m == n:
        return [_thin_qr_vjp(q, r, ct_q, ct_r)]
    q_mn, q_mp = q[..., :, :n], q[..., :, n:]
    ct_r_nn = None if ct_r is None else ct_r[..., :n, :]
    if ct_q is None:
        return [_thin_qr_vjp(q_mn, r[..., :n, :], None, ct_r_nn)]
    q_nn, q_pn = q_mn[..., :n, :], q_mn[..., n:, :]
    eye = x._trace.constant(np.eye(n, dtype=x.dtype), None)
    z = _swap_last(_solve(_swap_last(q_nn - eye), _swap_last(q_pn)))  # q_pn (q_nn - I)^-1
    ct_mn, ct_mp = ct_q[..., :, :n], ct_q[..., :, n:]
    g = _swap_last(ct_mp) @ (q_mn + q_mp @ z)
    ct_mn = ct_mn + ct_mp @ z + _concatenate([_swap_last(z) @ g, -g], axis=-2)
    return [_thin_qr_vjp(q_mn, r[..., :n, :], ct_mn, ct_r_nn)]


@_rule("lu")
def _lu_vjp(cts, ops, out, params, needs):
    """x[perm] = L U: JAX's rule (X = L^-1 x[perm] U^-1, dL = L tril(X, -1), dU = triu(X) U)
    transposed: dX = tril(L^T tril(c, -1), -1) + triu(triu(c) U^T), dx[perm] = L^-T dX U^-T.
    Only lu's cotangent counts (pivots and permutation are int). A singular U gives infinities."""
    ct = cts[0]
    if ct is None or not needs[0]:
        return [None]
    lu, _, perm = out
    n = lu.shape[-1]
    trace = lu._trace
    eye = trace.constant(np.eye(n, dtype=lu.dtype), None)
    l_mat = _triangle(lu, True, True) + eye
    u_mat = _triangle(lu, False, False)
    dx = (_triangle(_swap_last(l_mat) @ _triangle(ct, True, True), True, True)
          + _triangle(_triangle(ct, False, False) @ _swap_last(u_mat), False, False))
    y = _trsm(lu, dx, True, True, True)                           # L^-T dX
    dperm = _swap_last(_trsm(lu, _swap_last(y), False, False, False))  # (U^-1 Y^T)^T = Y U^-T
    # Row i of dperm is row perm[i] of the operand's cotangent.
    inverse = _argsort(perm, axis=-1)
    return [_take_along_axis(dperm, _broadcast_to(inverse[..., :, None], dperm.shape), axis=-2)]


@_rule("matmul")
def _matmul_vjp(ct, ops, out, params, needs):
    a, b = ops
    trace = ct._trace
    return _lazy(
        needs,
        lambda: _unbroadcast(bind(trace, "matmul", (ct, _swap_last(b))), a.shape),
        lambda: _unbroadcast(bind(trace, "matmul", (_swap_last(a), ct)), b.shape),
    )
