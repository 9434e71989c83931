"""The primitives of the function tracer: one `Primitive` object per op, as JAX's `core.Primitive`.

Every op a function trace records is a primitive bound by `bind`
(pathways._tracer): the primitive's emitter records its op with the trace's
`_core.FunctionBuilder`, and the gradient tapes of `pw.grad`
(pathways._autodiff) record the primitive, whose `vjp` rule
(pathways._vjp_rules) differentiates it.

The ops are those of the C++ op registry (csrc/function_ir/op_registry.h),
which `_core.op_registry()` exports: a primitive takes its arity, class and
type rule from there, and this module checks at import that every registry op
but the sources (parameter and constant, which the tracer adds with
`FunctionBuilder.parameter` and `.constant`, not through `bind`) has exactly
one primitive of its name. A primitive with a name of its own records a
registry op with a meaning of its own to the front end: `stop_gradient`
records a `copy` that gradients do not flow through. Reductions are one
primitive, `reduce`, whose `kind` parameter is sum, mean, max, min or argmax.

Adding an op, once it is in the registry with its builder method: its
`_define` below (with its emitter), its VJP rule in pathways._vjp_rules
(`@_rule("name")`; unless its result is never a float, which
tests/python/test_op_registry.py checks), and the public function that binds
it (a `Tracer` method, pathways.numpy, or pathways._collectives).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional, Union

from pathways import _core

__all__ = ["RegistryOp", "REGISTRY", "Primitive", "PRIMITIVES", "lookup"]


class RegistryOp(NamedTuple):
    """One row of the C++ op registry."""

    name: str  # as in IR text and error messages
    arity: int  # number of operands; -1: one or more
    op_class: str  # source, elementwise, simulated, reduction, data_movement, indexing,
    # contraction, collective, control or linalg
    type_rule: str  # arithmetic, comparison, bitwise, shift, numeric, floating, invert,
    # same, indices or own


# The registry, in its (enum) order.
REGISTRY: dict = {row[0]: RegistryOp(*row) for row in _core.op_registry()}

# emit(builder, *operand_ids, **params) -> the output's value id.
Emitter = Callable[..., int]


def is_binary_op(op: RegistryOp) -> bool:
    """`FunctionBuilder.binary`'s ops, as the registry's IsBinaryOp."""
    return op.op_class == "elementwise" and op.arity == 2


def is_unary_op(op: RegistryOp) -> bool:
    """`FunctionBuilder.unary`'s ops, as the registry's IsUnaryOp."""
    return op.op_class == "elementwise" and op.arity == 1 and op.type_rule != "own"


class Primitive:
    """One op of the function tracer.

    Attributes:
      name: The primitive's name: the registry op it records, or a name of its
        own for a primitive that records another one (`stop_gradient`).
      op: The registry op its emitter records.
      arity, op_class, type_rule: The registry's, for `op` (arity -1: one or
        more operands).
      emit: The `_core.FunctionBuilder` call that records it:
        `emit(builder, *operand_ids, **params)` returns the output's value id.
      symbol: The `Tracer` operator that binds it ("+", "&"), or None.
      stops_gradient: Whether gradient tapes leave it out, so that its output
        is a constant to `pw.grad`.
      multiple_results: Whether `emit` returns a list of value ids (a scan's or
        a while's results) instead of one; `bind` then returns a list of traced
        values.
      vjp: Its reverse-mode rule (see pathways._vjp_rules), or None if it has
        none (`pw.grad` raises NotImplementedError on a path through it).
      jvp: Its forward-mode rule; no primitive has one yet.
    """

    __slots__ = ("name", "op", "arity", "op_class", "type_rule", "emit", "symbol",
                 "stops_gradient", "multiple_results", "vjp", "jvp")

    def __init__(self, name: str, op: RegistryOp, emit: Emitter, symbol: Optional[str],
                 stops_gradient: bool, multiple_results: bool = False):
        self.name = name
        self.op = op.name
        self.arity = op.arity
        self.op_class = op.op_class
        self.type_rule = op.type_rule
        self.emit = emit
        self.symbol = symbol
        self.stops_gradient = stops_gradient
        self.multiple_results = multiple_results
        self.vjp: Optional[Callable[..., list]] = None
        self.jvp: Optional[Callable[..., Any]] = None

    def def_vjp(self, rule: Callable[..., list]) -> Callable[..., list]:
        """Sets the primitive's VJP rule (once); returns `rule`, so it can decorate it."""
        if self.vjp is not None:
            raise ValueError(f"primitive {self.name!r} has a VJP rule already: {self.vjp!r}")
        self.vjp = rule
        return rule

    def __repr__(self) -> str:
        return f"Primitive({self.name!r})" if self.op == self.name else (
            f"Primitive({self.name!r}, op={self.op!r})")


# Every primitive by name.
PRIMITIVES: dict = {}


def lookup(prim: Union[str, Primitive]) -> Primitive:
    """The primitive `prim`, given as itself or by name (KeyError for an unknown name)."""
    return prim if type(prim) is Primitive else PRIMITIVES[prim]


def _registry_error(message: str) -> RuntimeError:
    return RuntimeError(
        f"pathways._primitives disagrees with the op registry (_core.op_registry(), "
        f"csrc/function_ir/op_registry.h): {message}"
    )


def _define(name: str, emit: Optional[Emitter] = None, *, op: Optional[str] = None,
            symbol: Optional[str] = None, stops_gradient: bool = False,
            multiple_results: bool = False) -> Primitive:
    """Defines primitive `name`, which records registry op `op` (default: `name`).

    `emit` defaults to `FunctionBuilder.binary` or `.unary` for the registry's
    binary and unary ops.
    """
    if op is None:
        op = name
    elif name in REGISTRY:
        raise _registry_error(f"primitive {name!r} records {op!r}, but {name!r} is a registry op")
    if name in PRIMITIVES:
        raise _registry_error(f"primitive {name!r} is defined twice")
    info = REGISTRY.get(op)
    if info is None:
        raise _registry_error(f"primitive {name!r} records op {op!r}, which is not in the registry")
    if info.op_class == "source":
        raise _registry_error(f"primitive {name!r} records source op {op!r}")
    if emit is None:
        if is_binary_op(info):
            emit = lambda b, x, y: b.binary(op, x, y)  # noqa: E731
        elif is_unary_op(info):
            emit = lambda b, x: b.unary(op, x)  # noqa: E731
        else:
            raise _registry_error(f"primitive {name!r} ({info.op_class}) needs an emitter")
    prim = Primitive(name, info, emit, symbol, stops_gradient, multiple_results)
    PRIMITIVES[name] = prim
    return prim


def _pcollective(op: str) -> Emitter:
    return lambda b, x, axis_name: b.pcollective(op, x, axis_name)


# --- Elementwise --------------------------------------------------------------

_define("convert", lambda b, x, dtype: b.convert(x, dtype))
# Binary (FunctionBuilder.binary): numpy broadcasting.
_define("add", symbol="+")
_define("sub", symbol="-")
_define("mul", symbol="*")
_define("div", symbol="/")
_define("pow", symbol="**")
_define("rem")
_define("atan2")
_define("max")
_define("min")
_define("eq", symbol="==")
_define("ne", symbol="!=")
_define("lt", symbol="<")
_define("le", symbol="<=")
_define("gt", symbol=">")
_define("ge", symbol=">=")
_define("and", symbol="&")
_define("or", symbol="|")
_define("xor", symbol="^")
_define("shift_left", symbol="<<")
_define("shift_right_logical")  # `>>` of uint32 (Tracer._right_shift)
_define("shift_right_arithmetic", symbol=">>")  # `>>` of int32
# Unary (FunctionBuilder.unary).
_define("neg", symbol="-")
_define("abs")
_define("exp")
_define("log")
_define("tanh")
_define("sqrt")
_define("rsqrt")
_define("sin")
_define("cos")
_define("erf")
_define("erfc")
for _name in ("tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh"):
    _define(_name)
_define("not", symbol="~")
_define("select", lambda b, cond, x, y: b.select(cond, x, y))
_define("bitcast_convert_type", lambda b, x, dtype: b.bitcast_convert_type(x, dtype))

# --- Simulated, reductions --------------------------------------------------------

_define("simulated_compute", lambda b, x, microseconds: b.simulated_compute(x, microseconds))
# kind: sum, mean, max, min or argmax; axes None: all.
_define("reduce", lambda b, x, kind, axes, keepdims: b.reduce(kind, x, axes, keepdims))
# combiner: add, mul, max or min (cumsum, cumprod, cummax, cummin); reverse: from the end.
_define("cumulative", lambda b, x, combiner, axis, reverse: b.cumulative(combiner, x, axis, reverse))

# --- Data movement --------------------------------------------------------------

_define("copy", lambda b, x: b.copy(x))
# A copy that gradients do not flow through (pw.stop_gradient).
_define("stop_gradient", lambda b, x: b.copy(x), op="copy", stops_gradient=True)
_define("reshape", lambda b, x, shape: b.reshape(x, shape))
_define("broadcast_to", lambda b, x, shape: b.broadcast_to(x, shape))
_define("transpose", lambda b, x, perm: b.transpose(x, perm))
_define("slice", lambda b, x, start, limit, step: b.slice(x, start, limit, step))
_define("rev", lambda b, x, axes: b.rev(x, axes))
_define("pad", lambda b, x, lo, hi, interior: b.pad(x, lo, hi, interior))
_define("concatenate", lambda b, *xs, axis: b.concatenate(list(xs), axis))

# --- Indexing, contraction ----------------------------------------------------------

_define("take", lambda b, x, indices, axis: b.take(x, indices, axis))
# operand (or a scalar broadcast) with updates combined in at indices along axis, by
# combiner: set, add, mul, max or min; out-of-range indices are dropped. Into a zero
# scalar with "add", the transpose of take.
_define("scatter", lambda b, operand, indices, updates, combiner, axis, size: b.scatter(
    combiner, operand, indices, updates, axis, size))
# The int32 positions of the k largest along the last axis (pw.lax.top_k takes the values).
_define("top_k", lambda b, x, k: b.top_k(x, k))
# The int32 positions that sort each row along the last axis (argsort; sort takes the values).
_define("sort", lambda b, x, descending: b.sort(x, descending))
_define("matmul", lambda b, x, y: b.matmul(x, y))

# --- Collectives (over the pmap axis `axis_name`) ----------------------------------

_define("psum", lambda b, x, axis_name: b.psum(x, axis_name))
_define("pmean", _pcollective("pmean"))
_define("pmax", _pcollective("pmax"))
_define("pmin", _pcollective("pmin"))
_define("axis_index", lambda b, axis_name: b.axis_index(axis_name))
_define("all_gather", lambda b, x, axis_name, axis: b.all_gather(x, axis_name, axis))
_define("ppermute", lambda b, x, axis_name, perm: b.ppermute(x, axis_name, perm))
_define("all_to_all", lambda b, x, axis_name, split_axis, concat_axis: b.all_to_all(
    x, axis_name, split_axis, concat_axis))
_define("psum_scatter", lambda b, x, axis_name, scatter_dimension: b.psum_scatter(
    x, axis_name, scatter_dimension))


# --- Control flow (function_ir.h, "Loops") ----------------------------------------

# A loop over `body` (a built `_core.Function`); the results are the final
# carries, then the stacked ys. pw.lax.scan (pathways._control_flow) traces the
# body and passes `lin`, how to differentiate it, when a gradient tape needs it.
_define("scan", lambda b, *operands, body, num_carries, num_xs, length, reverse, lin=None: b.scan(
    body, list(operands), num_carries, num_xs, length, reverse), multiple_results=True)
# A while loop: `body` runs on the operands (the first `num_carries` carries, the rest
# consts) while `cond` of them is true; both are built `_core.Function`s taking every
# operand, `cond` returning one bool scalar and `body` the next carries. The results are
# the final carries. pw.lax.while_loop (pathways._control_flow) traces cond and body.
_define("while", lambda b, *operands, cond, body, num_carries: b.while_loop(
    cond, body, list(operands), num_carries), multiple_results=True)
# An element of a tuple (a scan's, an svd's). Their emitters add these themselves, so
# Python never holds a tuple value and never binds this primitive.
_define("get_element", lambda b, t, index: b.get_element(t, index))

# --- Linear algebra ------------------------------------------------------------------

# The singular value decomposition of each matrix of x's last two dims: u, s, vt
# (LAPACK's gesdd; square u and vt when full_matrices). Its elements, as a scan's.
_define("svd", lambda b, x, full_matrices: b.svd(x, full_matrices), multiple_results=True)
# The LU decomposition with partial pivoting of each square matrix: lu, pivots,
# permutation (x[..., permutation, :] = L U; LAPACK's getrf).
_define("lu", lambda b, x: b.lu(x), multiple_results=True)
# The eigendecomposition of the symmetric matrices of x's lower triangles: w
# ascending, v (LAPACK's syevd).
_define("eigh", lambda b, x: b.eigh(x), multiple_results=True)
# The Cholesky factor L (L L^T = x) of the symmetric matrices of x's lower triangles.
_define("cholesky", lambda b, x: b.cholesky(x))
# The QR decomposition: q, r (square q when full_matrices; LAPACK's geqrf, orgqr).
_define("qr", lambda b, x, full_matrices: b.qr(x, full_matrices), multiple_results=True)
# x with op(a) x = b, a triangular (BLAS's trsm).
_define("triangular_solve", lambda b, a, rhs, lower, unit_diagonal, transpose_a: b.triangular_solve(
    a, rhs, lower, unit_diagonal, transpose_a))


def _check_every_op_has_a_primitive() -> None:
    missing = [op.name for op in REGISTRY.values()
               if op.op_class != "source" and op.name not in PRIMITIVES]
    if missing:
        raise _registry_error(f"no primitive for op(s) {', '.join(missing)}; define them here")


_check_every_op_has_a_primitive()
