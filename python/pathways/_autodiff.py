"""Reverse-mode gradients of traced functions: `grad`, `value_and_grad`, `stop_gradient`.

`pw.grad(f)(x)` inside a function traced by `pw.pmap` differentiates `f` on a
*tape*, inside the same function trace, so the backward ops become part of the
same compiled function IR as the forward ones:

1. Every differentiated input leaf goes through a "copy" op, so its value id
   is fresh: the tape then tells the input apart from the same value passed
   twice (`f(x, x)`) or closed over by `f`.
2. A `_Tape` is pushed on `trace.tapes` while `f` runs. `bind`
   (pathways._tracer) shows it every op; it keeps the ops that have an
   operand depending on the inputs (a *tracked* value) and tracks their float
   outputs, with the `Primitive` of each.
3. The tape is walked backwards from a cotangent of 1 for the scalar output.
   Cotangents are keyed by value id; each primitive's `vjp` rule
   (pathways._vjp_rules) maps the cotangent of its output to cotangents of
   its operands, and contributions to one value are added up.

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
from typing import Any, Callable, Sequence, Union

import numpy as np

from pathways._checks import _to_array
from pathways._primitives import PRIMITIVES, Primitive
from pathways._pytree import tree_flatten, tree_map, tree_unflatten
from pathways._trace_state import TracerError, _state, _TracerBase, one_device_pmap
from pathways._tracer import Tracer, _FunctionTrace, bind

__all__ = ["grad", "value_and_grad", "VJP_RULES"]

# bfloat16 values get bfloat16 cotangents, as in JAX.
_FLOAT_DTYPE_NAMES = ("float32", "float64", "bfloat16")


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

    def record(self, prim: Primitive, operand_ids: Sequence[int], out_id: Any,
               params: dict) -> None:
        """Keeps the op if it depends on a tracked value and has a float output.

        Int and bool outputs (comparisons, argmax, casts to int) carry no
        gradient, and a primitive that stops gradients ("stop_gradient") cuts
        the dependence, so neither is tracked. A primitive with several
        results (a scan) gives a tuple of ids: one entry for all, its float
        results tracked.
        """
        if prim.stops_gradient:
            return
        tracked = self.tracked
        for i in operand_ids:
            if i in tracked:
                break
        else:
            return
        dtype = self._builder.dtype
        if type(out_id) is tuple:
            floats = [o for o in out_id if dtype(o) in _FLOAT_DTYPE_NAMES]
            if not floats:
                return
            tracked.update(floats)
        else:
            if dtype(out_id) not in _FLOAT_DTYPE_NAMES:
                return
            tracked.add(out_id)
        self.entries.append((prim, list(operand_ids), out_id, params))


def _zeros(trace: _FunctionTrace, shape: Sequence[int], dtype: Any) -> Tracer:
    """Zeros of `shape` and `dtype`: a scalar constant broadcast (no array constant)."""
    z = trace.constant(np.zeros((), np.dtype(dtype)), None)
    return bind(trace, "broadcast_to", (z,), shape=list(shape))


# --- The parameters of a backward function -----------------------------------------


class _Parameters:
    """The backward function's parameters, each added when an op first reads it.

    Keys are forward value ids (residuals) and the caller's own keys (pathways._vjp's
    `(_COTANGENT, j)` for output leaf `j`'s cotangent). A forward constant is emitted
    again as a constant. pathways._vjp and pathways._control_flow split functions with it.
    """

    __slots__ = ("trace", "keys", "_ids", "_constants")

    def __init__(self, trace: _FunctionTrace, constants: dict):
        self.trace = trace
        self.keys: list = []  # in parameter order
        self._ids: dict = {}
        self._constants = constants

    def id_of(self, key: Any, shape: tuple, dtype: np.dtype) -> int:
        vid = self._ids.get(key)
        if vid is None:
            b = self.trace.builder
            const = self._constants.get(key) if type(key) is int else None
            if const is not None:
                vid = b.constant(const)
            else:
                vid = b.parameter(dtype.name, list(shape))
                self.keys.append(key)
            self._ids[key] = vid
        return vid


class _LazyParameter(Tracer):
    """A traced value of the backward function that is a parameter once read.

    `bind` reads `_id` of every operand it emits an op on, so a value the
    backward ops never read never becomes a parameter (nor, thus, a residual).
    """

    __slots__ = ("_key", "_params")

    def __init__(self, params: _Parameters, key: Any, shape: tuple, dtype: np.dtype):
        self._trace = params.trace
        self.shape = tuple(shape)
        self.dtype = np.dtype(dtype)
        self._key = key
        self._params = params

    @property  # type: ignore[override]
    def _id(self) -> int:  # noqa: D401 (overrides Tracer's slot)
        return self._params.id_of(self._key, self.shape, self.dtype)


# --- The rules -----------------------------------------------------------------------


class _VjpRules(Mapping):
    """The primitives' VJP rules by primitive name, a read-only view: a rule is
    the `vjp` of its `Primitive`, set in pathways._vjp_rules."""

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


# --- The backward pass -----------------------------------------------------------


def _backward(tape: _Tape, cts: dict, value: Callable[[int], Tracer], where: str) -> dict:
    """Walks `tape` backwards from the cotangents `cts`.

    Args:
      tape: The recorded forward ops.
      cts: Cotangents by value id of the forward values they belong to (the
        differentiated outputs); consumed.
      value: The traced value the rules read for a forward value id: the
        forward value itself when the backward ops go into the same trace, or
        a parameter of a separate backward function (pathways._vjp).
      where: The caller and its trace, for messages ("pw.grad in pmap of 'f'").

    Returns:
      Cotangents by value id, for the values the walk reached that are no
      output of a recorded op (the tape's inputs among them).

    Raises:
      NotImplementedError: For a primitive without a gradient rule on the path.
    """
    tracked = tape.tracked
    for prim, ids, out_id, params in reversed(tape.entries):
        if type(out_id) is tuple:
            # Several results (a scan): a cotangent (or None) per result, and
            # the results' values, for a rule of the same shape.
            ct = [cts.pop(o, None) for o in out_id]
            if all(c is None for c in ct):
                continue
            out = [value(o) for o in out_id]
        else:
            ct = cts.pop(out_id, None)
            if ct is None:
                continue
            out = value(out_id)
        rule = prim.vjp
        if rule is None:
            raise NotImplementedError(
                f"{where}: differentiation of primitive {prim.name!r} is not implemented"
            )
        operands = [value(i) for i in ids]
        needs = [i in tracked for i in ids]
        contributions = rule(ct, operands, out, params, needs)
        for i, x, c, need in zip(ids, operands, contributions, needs):
            if c is None or not need:
                continue
            if c.dtype != x.dtype:
                c = c.astype(x.dtype)
            if c.shape != x.shape:
                raise AssertionError(
                    f"{where}: the rule of {prim.name!r} gave a cotangent {c.aval} for an "
                    f"operand {x.aval} (a bug in pathways._autodiff)"
                )
            prev = cts.get(i)
            cts[i] = c if prev is None else prev + c
    return cts


# --- grad --------------------------------------------------------------------------


def _real_dtype_error(what: str, pos: int) -> TypeError:
    return TypeError(
        f"grad requires real-valued inputs (float32, float64 or bfloat16), got {what} for "
        f"argument {pos}"
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
            f"grad requires real-valued outputs (float32, float64 or bfloat16), got {out.aval} "
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
    out = trace.local(_output(trace, result, name))
    ones = trace.constant(np.ones((), out.dtype), None)
    cts = _backward(tape, {out._id: ones}, functools.partial(Tracer, trace),
                    f"pw.grad of {name!r} in {trace.where()}")
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
    pmapped: list = []  # The cached pmap, once created.
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
            fn_1 = one_device_pmap(per_device(kwargs))
        else:
            with lock:
                if not pmapped:
                    pmapped.append(one_device_pmap(per_device({})))
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
