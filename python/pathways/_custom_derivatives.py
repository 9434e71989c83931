"""`pw.custom_vjp` and `pw.custom_jvp`: functions whose derivatives are given, as JAX's.

    @pw.custom_vjp
    def clip_gradient(x):
        return x

    def fwd(x):
        return x, None                 # the output, and residuals for bwd

    def bwd(res, g):
        return (pnp.clip(g, -1.0, 1.0),)   # one cotangent per argument

    clip_gradient.defvjp(fwd, bwd)

    @pw.custom_jvp
    def log1pexp(x):
        return pnp.log1p(pnp.exp(x))

    @log1pexp.defjvp
    def log1pexp_jvp(primals, tangents):
        (x,), (t,) = primals, tangents
        return log1pexp(x), t * pw.nn.sigmoid(x)

Not differentiated (no `pw.grad`, `pw.vjp` ... around it), a call is the
function's. Differentiated, a call puts one entry on each tape
(pathways._autodiff) whose results are copies of the outputs made off the
tapes, so the only way back from them is the entry's rule:

- custom_vjp: the call runs `fwd`; the entry's operands are the traced
  argument leaves and the traced residuals, and its rule calls
  `bwd(residuals, cotangents)`. `fwd`'s own ops stay on the tapes, reached
  by no cotangent from the outputs, so through them an enclosing `grad`
  sees how the residuals depend on the arguments.
- custom_jvp: the call runs the function with the tapes paused; the
  entry's operands are the traced argument leaves, and its rule transposes
  the JVP rule: it runs `jvp(primals, tangents)` with fresh zero tangents
  under a tape of its own and walks that tape back from the cotangents
  (the tangent output is linear in the tangents).

The rules' ops go through `bind` like any other, so a tape of an enclosing
`grad` records them: second derivatives differentiate `bwd` or the JVP
rule, as JAX's. In a separate backward function (`pw.vjp` of a pmap'd
function) the operands arrive as that function's parameters.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from pathways._autodiff import _FLOAT_DTYPE_NAMES, _backward, _Tape, _zeros
from pathways._pytree import tree_flatten, tree_map, tree_unflatten
from pathways._trace_state import TracerError, _state, _TracerBase
from pathways._tracer import Tracer, bind

__all__ = ["custom_vjp", "custom_jvp"]


def _zeros_like(x: Any) -> Any:
    """Zeros like `x`: a traced value's in its trace, numpy's otherwise."""
    if isinstance(x, Tracer):
        return _zeros(x._check(), x.shape, x.dtype)
    return np.zeros_like(x)


# The custom_vjp functions whose fwd runs now, on this thread (traces are per
# thread): see custom_vjp._forward.
_in_rule = threading.local()


@contextlib.contextmanager
def _paused(trace: Any) -> Iterator[list]:
    """The tapes of `trace` set aside while the block runs (it gets them)."""
    tapes = trace.tapes
    trace.tapes = []
    try:
        yield tapes
    finally:
        trace.tapes = tapes


def _is_none(x: Any) -> bool:
    return x is None


def _describe(x: Any) -> str:
    return x.aval if isinstance(x, Tracer) else f"{type(x).__name__} of shape {np.shape(x)}"


class _Custom:
    """What custom_vjp and custom_jvp share: the function, its non-differentiated
    arguments, binding a call's arguments, and the entry's outputs.

    A custom function is itself the "primitive" of its tape entries: it has
    the `name`, `stops_gradient` and `vjp` (the rule) that `_Tape.record` and
    `_backward` read.
    """

    kind = ""
    stops_gradient = False

    @property
    def name(self) -> str:
        return f"{self.kind} of {self._name!r}"

    def __init__(self, fun: Callable[..., Any], nondiff_argnums: Sequence[int] = ()):
        if not callable(fun):
            raise TypeError(f"{self.kind} expects a callable, got {fun!r}")
        nums = nondiff_argnums if isinstance(nondiff_argnums, (tuple, list)) else (nondiff_argnums,)
        for a in nums:
            if isinstance(a, bool) or not isinstance(a, (int, np.integer)):
                raise TypeError(f"{self.kind}: nondiff_argnums must be ints, got {nondiff_argnums!r}")
        functools.update_wrapper(self, fun)
        self.fun = fun
        self.nondiff_argnums = tuple(int(a) for a in nums)
        self._name = getattr(fun, "__name__", type(fun).__name__)

    def _check_rules(self, **rules: Any) -> None:
        for param, f in rules.items():
            if not callable(f):
                raise TypeError(f"{self.kind} of {self._name!r}: {param} must be callable, got {f!r}")

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        # As a method: the instance is the first (positional) argument.
        return self if obj is None else functools.partial(self, obj)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        trace = _state.function
        if trace is None or not trace.tapes:
            return self.fun(*args, **kwargs)
        where = f"{self.kind} of {self._name!r} in {trace.where()}"
        if not self._has_rules():
            raise TypeError(f"{where}: no rules; call {self._def_name} before differentiating it")
        args = self._positional(args, kwargs)
        for a in self.nondiff_argnums:
            if not -len(args) <= a < len(args):
                raise ValueError(
                    f"{where}: nondiff_argnums {a} is out of range for {len(args)} arguments"
                )
        nondiff_at = {a % len(args) for a in self.nondiff_argnums}
        nondiff = tuple(args[i] for i in sorted(nondiff_at))
        diff_args = tuple(a for i, a in enumerate(args) if i not in nondiff_at)
        arg_leaves = tree_flatten(diff_args)[0]
        arg_positions = [k for k, leaf in enumerate(arg_leaves) if isinstance(leaf, Tracer)]
        for k in arg_positions:
            arg_leaves[k]._check()
        params = {"nondiff": nondiff, "nondiff_at": sorted(nondiff_at), "diff_args": diff_args,
                  "where": where, "arg_positions": arg_positions}
        out, extra_ids = self._forward(trace, args, params)

        outs, params["out_tree"] = tree_flatten(out)
        copies = []
        with _paused(trace) as tapes:  # the outputs are the entry's, not copies on the tapes
            for leaf in outs:
                if isinstance(leaf, Tracer):
                    leaf._check()
                    t = trace.local(leaf)
                elif isinstance(leaf, _TracerBase):
                    raise TracerError(f"{where}: the output is a traced program value ({leaf.aval})")
                else:
                    t = trace.constant(leaf, None)
                copies.append(bind(trace, "copy", (t,)))
        ids = [trace.local(arg_leaves[k])._id for k in arg_positions] + extra_ids
        out_ids = tuple(c._id for c in copies)
        for tape in tapes:
            tape.record(self, ids, out_ids, params)
        return tree_unflatten(params["out_tree"], copies)

    def _positional(self, args: tuple, kwargs: dict) -> tuple:
        """The arguments by position, defaults applied (as JAX binds them), so the
        rules see the same arguments however the call was written."""
        try:
            signature = inspect.signature(self.fun)
        except (TypeError, ValueError):  # no signature (a builtin): as given
            if kwargs:
                raise TypeError(
                    f"{self.kind} of {self._name!r}: keyword arguments need a function with a "
                    "signature"
                ) from None
            return args
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError as e:
            raise TypeError(f"{self.kind} of {self._name!r}: {e}") from None
        bound.apply_defaults()
        if bound.kwargs:
            raise TypeError(
                f"{self.kind} of {self._name!r}: keyword-only arguments "
                f"{sorted(bound.kwargs)} cannot be differentiated; make them positional"
            )
        return bound.args


def _all_args(params: dict, operands: list) -> tuple:
    """A call's positional arguments, its traced argument leaves replaced by `operands`
    (the entry's, in the trace its rule runs in)."""
    leaves, tree = tree_flatten(params["diff_args"])
    for pos, t in zip(params["arg_positions"], operands):
        leaves[pos] = t
    diff = iter(tree_unflatten(tree, leaves))
    nondiff = iter(params["nondiff"])
    at = set(params["nondiff_at"])
    return tuple(next(nondiff) if i in at else next(diff)
                 for i in range(len(params["diff_args"]) + len(params["nondiff"])))


def _running(custom: Any, fn: Callable[..., Any], *args: Any) -> Any:
    """`fn(*args)`, the fwd of `custom`: a call of `custom` inside it (JAX's idiom:
    `return f(x), res`) is differentiated by recomputing fwd (see custom_vjp)."""
    running = _in_rule.__dict__.setdefault("ids", set())
    running.add(id(custom))
    try:
        return fn(*args)
    finally:
        running.discard(id(custom))


class custom_vjp(_Custom):  # noqa: N801 (JAX's name)
    """A function with a reverse-mode derivative of your own, like `jax.custom_vjp`.

    Decorate the function, then give its forward and backward rules with
    `defvjp(fwd, bwd)`:

    - `fwd(*args)` returns `(output, residuals)`: `fun`'s output, and any
      pytree (of traced values, numpy arrays or Python values) for `bwd`.
    - `bwd(residuals, g)` (with `nondiff_argnums`, `bwd(*nondiff_args,
      residuals, g)`) takes the output's cotangent `g` (a pytree like the
      output; zeros where nothing flows back) and returns a tuple with one
      cotangent per positional argument (those of `nondiff_argnums` left
      out): each a pytree like its argument, or None for zeros.

    Only the positional arguments are differentiated through `bwd`; traced
    values that `fun` captures from around it get no gradient through the
    call (JAX refuses them). Keyword arguments are bound to positions by
    `fun`'s signature. `pw.grad`, `pw.value_and_grad`, `pw.vjp` and
    `pw.jvp` (as the transpose of the pullback, so `bwd` must be made of
    differentiable ops) all use the rule, and a second derivative
    differentiates `bwd`.

    Args:
      fun: The function.
      nondiff_argnums: Positions of arguments that are not differentiated
        (static values such as a Python float or a callable): passed to
        `fwd` in place and to `bwd` first.

    Raises:
      TypeError: If `fun`, `fwd` or `bwd` is not callable, or
        `nondiff_argnums` not ints; when called differentiated before
        `defvjp`; if `fwd` does not return a pair or `bwd` not one cotangent
        per argument of the argument's structure.
      ValueError: For a cotangent of another shape than its argument's.
    """

    kind = "custom_vjp"
    _def_name = "defvjp(fwd, bwd)"

    def __init__(self, fun: Callable[..., Any], nondiff_argnums: Sequence[int] = ()):
        super().__init__(fun, nondiff_argnums)
        self.fwd: Any = None
        self.bwd: Any = None

    def defvjp(self, fwd: Callable[..., Any], bwd: Callable[..., Any]) -> None:
        """Sets the forward and backward rules (see the class)."""
        self._check_rules(fwd=fwd, bwd=bwd)
        self.fwd, self.bwd = fwd, bwd

    def _has_rules(self) -> bool:
        return self.fwd is not None

    def _forward(self, trace: Any, args: tuple, params: dict) -> tuple:
        """Runs fwd (its ops on the tapes: the module docstring); the output and the
        residuals' ids, which the entry takes as operands after the arguments.

        A call inside this function's own fwd (JAX's idiom: `return f(x), res`)
        cannot run fwd again: it runs the function with the tapes paused, and
        its entry's rule recomputes fwd for the residuals. So an enclosing
        grad differentiates it through the rule too (the residuals' own
        dependence on the arguments, for second derivatives, included).
        """
        if id(self) in _in_rule.__dict__.get("ids", ()):
            params["recompute"] = True
            with _paused(trace):
                return self.fun(*args), []
        pair = _running(self, self.fwd, *args)
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise TypeError(
                f"{params['where']}: fwd must return a pair (output, residuals), got "
                f"{type(pair).__name__}"
            )
        out, residuals = pair
        res_leaves, params["res_tree"] = tree_flatten(residuals)
        params["res_positions"] = [k for k, leaf in enumerate(res_leaves) if isinstance(leaf, Tracer)]
        params["res_leaves"] = [None if isinstance(leaf, Tracer) else leaf for leaf in res_leaves]
        return out, [trace.local(res_leaves[k])._id for k in params["res_positions"]]

    def vjp(self, cts: list, operands: list, outs: list, params: dict, needs: list) -> list:
        """The tape entry's rule (pathways._autodiff): bwd gives the arguments' cotangents."""
        trace = _state.function
        where = params["where"]
        n_args = len(params["arg_positions"])
        if params.get("recompute"):
            pair = _running(self, self.fwd, *_all_args(params, operands))
            if not isinstance(pair, (tuple, list)) or len(pair) != 2:
                raise TypeError(
                    f"{where}: fwd must return a pair (output, residuals), got {type(pair).__name__}"
                )
            res = pair[1]
        else:
            # Residuals: their traced leaves are the entry's operands after the arguments.
            res_leaves = list(params["res_leaves"])
            for pos, t in zip(params["res_positions"], operands[n_args:]):
                res_leaves[pos] = t
            res = tree_unflatten(params["res_tree"], res_leaves)
        g = tree_unflatten(params["out_tree"], [
            _zeros(trace, o.shape, o.dtype) if c is None else c for c, o in zip(cts, outs)
        ])
        got = self.bwd(*params["nondiff"], res, g)
        diff_args = params["diff_args"]
        if not isinstance(got, (tuple, list)) or len(got) != len(diff_args):
            raise TypeError(
                f"{where}: bwd must return a tuple with one cotangent per argument "
                f"({len(diff_args)}), got {type(got).__name__}"
                + (f" of length {len(got)}" if isinstance(got, (tuple, list)) else "")
            )
        # Cotangent leaves aligned with the arguments' leaves; a None (for a
        # whole argument, or in place of a leaf) is zero.
        ct_leaves: list = []
        for k, (arg, ct) in enumerate(zip(diff_args, got)):
            arg_nodes, arg_tree = tree_flatten(arg, is_leaf=_is_none)
            if ct is None:
                ct_leaves.extend(None for a in arg_nodes if a is not None)
                continue
            leaves, tree = tree_flatten(ct, is_leaf=_is_none)
            if tree != arg_tree:
                raise TypeError(
                    f"{where}: bwd's cotangent {k} must have the structure of argument {k}: "
                    f"{tree_flatten(arg)[1]}, got {tree_flatten(ct)[1]}"
                )
            ct_leaves.extend(c for a, c in zip(arg_nodes, leaves) if a is not None)
        contributions: list = []
        for j, (pos, x, need) in enumerate(zip(params["arg_positions"], operands, needs)):
            c = ct_leaves[pos]
            if c is None or not need:
                contributions.append(None)
                continue
            if not isinstance(c, Tracer):
                if isinstance(c, _TracerBase):
                    raise TracerError(f"{where}: bwd returned a traced program value ({c.aval})")
                c = trace.constant(np.asarray(c, x.dtype), None)
            if tuple(c.shape) != tuple(x.shape):
                raise ValueError(
                    f"{where}: bwd's cotangent for argument leaf {pos} is {_describe(c)}, but the "
                    f"argument is {x.aval}: it must have the argument's shape"
                )
            contributions.append(c)
        return contributions + [None] * (len(operands) - n_args)


class custom_jvp(_Custom):  # noqa: N801 (JAX's name)
    """A function with a forward-mode derivative of your own, like `jax.custom_jvp`.

    Decorate the function, then give its JVP rule with `@f.defjvp`:
    `jvp(primals, tangents)` (with `nondiff_argnums`, `jvp(*nondiff_args,
    primals, tangents)`) takes the tuples of the positional arguments and of
    their tangents (zeros for arguments not differentiated) and returns
    `(output, tangent_out)`, the tangent linear in the tangents. Or give one
    function per argument with `defjvps(*fns)`: `fn(t, ans, *primals)` is
    that argument's contribution to the output's tangent (None: none).

    Reverse mode (`pw.grad`, `pw.vjp` ...) transposes the rule: the function
    runs as it is, and the backward pass runs the rule on the arguments
    again with fresh tangents and walks its tangent back. Second
    derivatives differentiate the rule. Arguments as for `custom_vjp`.

    Raises:
      TypeError: If `fun` or a rule is not callable, or `nondiff_argnums` not
        ints; when called differentiated before `defjvp`; if the rule does
        not return a pair, or its tangent has another structure than the
        output.
      ValueError: For a tangent of another shape than its output's.
    """

    kind = "custom_jvp"
    _def_name = "defjvp(jvp)"

    def __init__(self, fun: Callable[..., Any], nondiff_argnums: Sequence[int] = ()):
        super().__init__(fun, nondiff_argnums)
        self.jvp: Any = None

    def defjvp(self, jvp: Callable[..., Any]) -> Callable[..., Any]:
        """Sets the JVP rule (see the class); returns it, so it decorates."""
        self._check_rules(jvp=jvp)
        self.jvp = jvp
        return jvp

    def defjvps(self, *jvps: Any) -> None:
        """Sets the JVP rule from one function per positional argument (see the class)."""
        for k, fn in enumerate(jvps):
            if fn is not None:
                self._check_rules(**{f"jvps[{k}]": fn})
        if self.nondiff_argnums:
            raise TypeError(f"custom_jvp of {self._name!r}: defjvps takes no nondiff_argnums; use defjvp")

        def jvp(primals: tuple, tangents: tuple) -> tuple:
            if len(jvps) != len(primals):
                raise TypeError(
                    f"custom_jvp of {self._name!r}: defjvps got {len(jvps)} functions for "
                    f"{len(primals)} arguments"
                )
            ans = self.fun(*primals)
            parts = [fn(t, ans, *primals) for fn, t in zip(jvps, tangents) if fn is not None]
            parts = [p for p in parts if p is not None]
            if not parts:
                return ans, tree_map(_zeros_like, ans)
            total = parts[0]
            for p in parts[1:]:
                total = tree_map(lambda a, b: a + b, total, p)
            return ans, total

        self.jvp = jvp

    def _has_rules(self) -> bool:
        return self.jvp is not None

    def _forward(self, trace: Any, args: tuple, params: dict) -> tuple:
        """Runs the function with the tapes paused (the entry stands for it)."""
        with _paused(trace):
            return self.fun(*args), []

    def vjp(self, cts: list, operands: list, outs: list, params: dict, needs: list) -> list:
        """The tape entry's rule (pathways._autodiff): the JVP rule, transposed."""
        trace = _state.function
        where = params["where"]
        arg_leaves, arg_tree = tree_flatten(params["diff_args"])
        operand_at = dict(zip(params["arg_positions"], range(len(operands))))
        primals = list(arg_leaves)
        tangents = []
        fresh = []  # (operand index, id of its tangent on the rule's tape)
        for k, leaf in enumerate(arg_leaves):
            j = operand_at.get(k)
            if j is None:  # not traced: a zero tangent that nothing depends on
                arr = np.asarray(leaf)
                tangents.append(np.zeros(arr.shape, arr.dtype))
                continue
            x = primals[k] = operands[j]
            t = _zeros(trace, x.shape, x.dtype)
            if needs[j] and np.dtype(x.dtype).name in _FLOAT_DTYPE_NAMES:
                t = bind(trace, "copy", (t,))
                fresh.append((j, t._id))
            tangents.append(t)
        tape = _Tape(trace.builder, [vid for _, vid in fresh])
        trace.tapes.append(tape)
        try:
            # A call of this function inside its rule is a call like any other: it
            # puts an entry on the enclosing tapes (and runs no rule now).
            pair = self.jvp(*params["nondiff"], tree_unflatten(arg_tree, primals),
                            tree_unflatten(arg_tree, tangents))
        finally:
            trace.tapes.remove(tape)
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise TypeError(
                f"{where}: the JVP rule must return a pair (output, tangent), got {type(pair).__name__}"
            )
        t_leaves, t_tree = tree_flatten(pair[1])
        if t_tree != params["out_tree"]:
            raise TypeError(
                f"{where}: the JVP rule's tangent must have the output's structure "
                f"{params['out_tree']}, got {t_tree}"
            )
        seeds: dict = {}
        for j, (c, t, o) in enumerate(zip(cts, t_leaves, outs)):
            if np.shape(t) != tuple(o.shape):
                raise ValueError(
                    f"{where}: the JVP rule's tangent for output leaf {j} is {_describe(t)}, but the "
                    f"output is {o.aval}: it must have the output's shape"
                )
            if c is None or not isinstance(t, Tracer):
                continue
            vid = trace.local(t)._id
            if vid in tape.tracked:
                prev = seeds.get(vid)
                seeds[vid] = c if prev is None else prev + c
        res = _backward(tape, seeds, functools.partial(Tracer, trace), where)
        contributions: list = [None] * len(operands)
        for j, vid in fresh:
            contributions[j] = res.get(vid)
        return contributions
