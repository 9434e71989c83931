"""`pw.custom_vjp`: a function whose reverse-mode derivative is given, as `jax.custom_vjp`.

    @pw.custom_vjp
    def clip_gradient(x):
        return x

    def fwd(x):
        return x, None                 # the output, and residuals for bwd

    def bwd(res, g):
        return (pnp.clip(g, -1.0, 1.0),)   # one cotangent per argument

    clip_gradient.defvjp(fwd, bwd)

Not differentiated (no `pw.grad`, `pw.vjp` ... around it), a call is the
function's. Differentiated, a call runs `fwd` and puts one entry on each tape
(pathways._autodiff): its operands the traced argument leaves and the traced
residuals, its results copies of `fwd`'s outputs made off the tapes, so the
only way back from them is the entry. Walking back, the entry's rule calls
`bwd(residuals, cotangents)` and hands each argument leaf its cotangent.
`fwd`'s own ops are on the tapes too, reached by no cotangent from the
outputs; the rule's ops go through `bind` like any other. So a tape of an
enclosing `grad` records `bwd`'s ops and, through `fwd`'s, how the residuals
depend on the arguments: second derivatives differentiate `bwd`, as JAX's.
In a separate backward function (`pw.vjp` of a pmap'd function) the
residuals arrive as that function's parameters.
"""

from __future__ import annotations

import functools
import inspect
import threading
from typing import Any, Callable, Sequence

import numpy as np

from pathways._autodiff import _zeros
from pathways._pytree import tree_flatten, tree_unflatten
from pathways._trace_state import TracerError, _state, _TracerBase
from pathways._tracer import Tracer, bind

__all__ = ["custom_vjp"]

# The custom functions whose fwd runs now, on this thread (traces are per thread).
_in_fwd = threading.local()


def _is_none(x: Any) -> bool:
    return x is None


def _describe(x: Any) -> str:
    return x.aval if isinstance(x, Tracer) else f"{type(x).__name__} of shape {np.shape(x)}"


class _CustomVjpRule:
    """The tape entry of a differentiated call (not an op: its forward ops are `fwd`'s)."""

    name = "custom_vjp"
    stops_gradient = False

    @staticmethod
    def vjp(cts: list, operands: list, outs: list, params: dict, needs: list) -> list:
        trace = _state.function
        where = params["where"]
        n_args = len(params["arg_positions"])
        # Residuals: their traced leaves are the entry's operands after the arguments.
        res_leaves = list(params["res_leaves"])
        for pos, t in zip(params["res_positions"], operands[n_args:]):
            res_leaves[pos] = t
        res = tree_unflatten(params["res_tree"], res_leaves)
        g = tree_unflatten(params["out_tree"], [
            _zeros(trace, o.shape, o.dtype) if c is None else c for c, o in zip(cts, outs)
        ])
        got = params["bwd"](*params["nondiff"], res, g)
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


class custom_vjp:  # noqa: N801 (JAX's name)
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

    def __init__(self, fun: Callable[..., Any], nondiff_argnums: Sequence[int] = ()):
        if not callable(fun):
            raise TypeError(f"custom_vjp expects a callable, got {fun!r}")
        nums = nondiff_argnums if isinstance(nondiff_argnums, (tuple, list)) else (nondiff_argnums,)
        for a in nums:
            if isinstance(a, bool) or not isinstance(a, (int, np.integer)):
                raise TypeError(f"custom_vjp: nondiff_argnums must be ints, got {nondiff_argnums!r}")
        functools.update_wrapper(self, fun)
        self.fun = fun
        self.nondiff_argnums = tuple(int(a) for a in nums)
        self.fwd: Any = None
        self.bwd: Any = None
        self._name = getattr(fun, "__name__", type(fun).__name__)

    def defvjp(self, fwd: Callable[..., Any], bwd: Callable[..., Any]) -> None:
        """Sets the forward and backward rules (see the class)."""
        for param, f in (("fwd", fwd), ("bwd", bwd)):
            if not callable(f):
                raise TypeError(f"custom_vjp of {self._name!r}: {param} must be callable, got {f!r}")
        self.fwd, self.bwd = fwd, bwd

    def _positional(self, args: tuple, kwargs: dict) -> tuple:
        if not kwargs:
            return args
        try:
            bound = inspect.signature(self.fun).bind(*args, **kwargs)
        except TypeError as e:
            raise TypeError(f"custom_vjp of {self._name!r}: {e}") from None
        bound.apply_defaults()
        if bound.kwargs:
            raise TypeError(
                f"custom_vjp of {self._name!r}: keyword-only arguments "
                f"{sorted(bound.kwargs)} cannot be differentiated; make them positional"
            )
        return bound.args

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        # As a method: the instance is the first (positional) argument.
        return self if obj is None else functools.partial(self, obj)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        trace = _state.function
        if trace is None or not trace.tapes or id(self) in _in_fwd.__dict__.get("ids", ()):
            return self.fun(*args, **kwargs)
        where = f"custom_vjp of {self._name!r} in {trace.where()}"
        if self.fwd is None:
            raise TypeError(f"{where}: no rules; call defvjp(fwd, bwd) before differentiating it")
        args = self._positional(args, kwargs)
        for a in self.nondiff_argnums:
            if not -len(args) <= a < len(args):
                raise ValueError(
                    f"{where}: nondiff_argnums {a} is out of range for {len(args)} arguments"
                )
        nondiff_at = {a % len(args) for a in self.nondiff_argnums}
        nondiff = tuple(args[i] for i in sorted(nondiff_at))
        diff_args = tuple(a for i, a in enumerate(args) if i not in nondiff_at)

        # fwd's ops go on the tapes like any others: no cotangent reaches them
        # from the outputs (the entry below makes the outputs), but through
        # them the residuals depend on the arguments, which an enclosing
        # grad differentiating bwd needs.
        # A call of this function inside its own fwd (JAX's idiom: `return
        # f(x), res`) is the function's.
        running = _in_fwd.__dict__.setdefault("ids", set())
        running.add(id(self))
        try:
            pair = self.fwd(*args)
        finally:
            running.discard(id(self))
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise TypeError(
                f"{where}: fwd must return a pair (output, residuals), got {type(pair).__name__}"
            )
        out, residuals = pair

        outs, out_tree = tree_flatten(out)
        copies = []
        tapes = trace.tapes
        trace.tapes = []  # the outputs are the entry's, not copies of fwd's on the tapes
        try:
            for leaf in outs:
                if isinstance(leaf, Tracer):
                    leaf._check()
                    t = trace.local(leaf)
                elif isinstance(leaf, _TracerBase):
                    raise TracerError(f"{where}: fwd returned a traced program value ({leaf.aval})")
                else:
                    t = trace.constant(leaf, None)
                copies.append(bind(trace, "copy", (t,)))
        finally:
            trace.tapes = tapes
        arg_leaves = tree_flatten(diff_args)[0]
        arg_positions = [k for k, leaf in enumerate(arg_leaves) if isinstance(leaf, Tracer)]
        for k in arg_positions:
            arg_leaves[k]._check()
        res_leaves, res_tree = tree_flatten(residuals)
        res_positions = [k for k, leaf in enumerate(res_leaves) if isinstance(leaf, Tracer)]
        ids = [trace.local(arg_leaves[k])._id for k in arg_positions]
        ids += [trace.local(res_leaves[k])._id for k in res_positions]
        params = {
            "bwd": self.bwd, "nondiff": nondiff, "diff_args": diff_args, "where": where,
            "arg_positions": arg_positions, "out_tree": out_tree,
            "res_tree": res_tree, "res_positions": res_positions,
            "res_leaves": [None if isinstance(leaf, Tracer) else leaf for leaf in res_leaves],
        }
        out_ids = tuple(c._id for c in copies)
        for tape in tapes:
            tape.record(_CustomVjpRule, ids, out_ids, params)
        return tree_unflatten(out_tree, copies)
