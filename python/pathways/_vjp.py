"""`vjp` and `jvp`: gradients whose forward and backward run apart (paper §5.3 pipelines).

`out, f_vjp = pw.vjp(f, *primals)` computes `f` now and returns its pullback:
`f_vjp(cotangent)` gives the cotangents of the primals, as `jax.vjp` does.
Where `f` is, decides how:

* **A `pw.pmap`'d function** (in `@pw.program` or outside it): `f` is traced
  once per signature into two compiled functions. The *forward* one computes
  `f`'s outputs and also outputs its *residuals*, the forward values the
  backward ops read; the *backward* one takes the cotangent and the residuals
  and gives the primals' cotangents. In a program each becomes one node, so a
  pipeline stage's backward node reads its forward node's residuals where they
  are, and nothing is recomputed; outside a program each call dispatches at
  once (OpByOp). The residuals are `ShardedBuffer`s (program values in a
  program) held by `f_vjp`: dropping it frees them.
* **A Python function inside a pmap'd function**: recorded on a tape in the
  same trace (as `pw.grad`); `f_vjp` adds the backward ops to that trace.
* **A Python function outside any trace**: as a `pw.pmap` over one device.

How the split finds the residuals: the forward is traced with a tape
(pathways._autodiff), then the tape is walked backwards in a second trace, of
the backward function. The rules read forward values through
`_LazyParameter`s, each of which becomes a parameter of the backward function
the first time an op reads it. So the residuals are exactly the forward values
some backward op reads. A residual that is a primal is passed to the backward
function directly; a constant of the forward trace is a constant of the
backward one too; every other residual is an extra output of the forward
function.

`pw.jvp` (forward mode) is the transpose of the pullback, which is linear in
the cotangent: inside a trace, the backward ops of a zero cotangent are
recorded on a second tape, and walking that tape backwards from the tangents
of the primals gives the tangents of the outputs. It costs about two backward
passes; it needs no rule beyond the VJP rules.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple, Optional

import numpy as np

from pathways import _core, _jax_frontend
from pathways._autodiff import _FLOAT_DTYPE_NAMES, _backward, _LazyParameter, _Parameters, _Tape, _zeros
from pathways._checks import _to_array
from pathways._pmap import (
    PmapFunction,
    _Compiled,
    compile_one_node,
    mapped_arg,
    parameters,
)
from pathways._pytree import PyTreeDef, tree_flatten, tree_map, tree_unflatten
from pathways._trace_state import TracerError, _state, _TracerBase, aval_str
from pathways._tracer import Tracer, _FunctionTrace, bind

__all__ = ["vjp", "jvp"]

_ShardedBuffer = _core.ShardedBuffer

# Where a backward-function parameter comes from.
_COTANGENT = 0  # payload: index of the output leaf
_PRIMAL = 1  # payload: index of the primal leaf
_FORWARD_OUTPUT = 2  # payload: index among the forward function's outputs


def _is_float(dtype: Any) -> bool:
    return np.dtype(dtype).name in _FLOAT_DTYPE_NAMES


# --- The split into a forward and a backward function ---------------------------


class _VjpEntry(NamedTuple):
    """The forward and backward functions of a pmap'd function, for one signature.

    The forward function's outputs are the output leaves, the aux leaves
    (with `has_aux`), then the residuals it alone can give. The backward
    function's parameters come from `backward_inputs`: `(_COTANGENT, j)`,
    `(_PRIMAL, k)` or `(_FORWARD_OUTPUT, j)`; its outputs are one cotangent
    per primal leaf.
    """

    forward: _Compiled
    backward: _Compiled
    in_treedef: PyTreeDef  # of the primals tuple
    in_avals: tuple  # (global shape, dtype) per primal leaf
    out_treedef: PyTreeDef
    out_avals: tuple  # (global shape, dtype) per output leaf
    aux_treedef: Optional[PyTreeDef]
    num_out: int
    num_aux: int
    backward_inputs: tuple


def _split(pf: PmapFunction, treedef: PyTreeDef, avals: list, n: int, has_aux: bool) -> _VjpEntry:
    """Traces `pf` into its forward and backward functions (the module docstring)."""
    name = pf._name
    where = f"pw.vjp of pmap of {name!r}"
    st = _state

    def forward_call(fwd: Any, params: list, fn: Callable[..., Any]) -> tuple:
        fwd.constant_values = {}
        tape = _Tape(fwd.builder, [p._id for p in params if _is_float(p.dtype)])
        fwd.tapes.append(tape)
        try:
            result = fn(*tree_unflatten(treedef, params))
        finally:
            fwd.tapes.remove(tape)
        aux_treedef = None
        aux_ids: list = []
        if has_aux:
            result, aux = _aux_pair(result, where)
            aux_leaves, aux_treedef = tree_flatten(aux)
            aux_ids = pf.output_ids(fwd, aux_leaves, "aux output")
        out_leaves, out_treedef = tree_flatten(result)
        return params, tape, aux_treedef, aux_ids, out_treedef, pf.output_ids(fwd, out_leaves)

    fwd, (params, tape, aux_treedef, aux_ids, out_treedef, out_ids) = pf.traced(
        n, avals, forward_call, suffix="_fwd")
    fb = fwd.builder
    prev = st.function
    if not out_ids:
        raise ValueError(
            f"{where}: the function returns no values (output structure {out_treedef})"
        )

    bwd = pf.new_trace(n, "_bwd")
    bwd_params = _Parameters(bwd, fwd.constant_values)
    st.function = bwd
    try:
        cts: dict = {}
        for j, oid in enumerate(out_ids):
            if oid in tape.tracked:
                ct = _LazyParameter(bwd_params, (_COTANGENT, j), fb.shape(oid), fb.dtype(oid))
                prev_ct = cts.get(oid)
                cts[oid] = ct if prev_ct is None else prev_ct + ct
        cts = _backward(
            tape,
            cts,
            lambda i: _LazyParameter(bwd_params, i, fb.shape(i), fb.dtype(i)),
            f"{where}",
        )
        grads = []
        for p in params:
            g = cts.get(p._id)
            grads.append((_zeros(bwd, p.shape, p.dtype) if g is None else g)._id)
        backward_fn = bwd.builder.build(grads)
    finally:
        bwd.active = False
        st.function = prev

    # Where each backward parameter comes from; the residuals the forward
    # function must output besides its outputs.
    primal_of = {p._id: k for k, p in enumerate(params)}
    forward_outs = out_ids + aux_ids
    output_of: dict = {}
    for j, vid in enumerate(forward_outs):
        output_of.setdefault(vid, j)
    backward_inputs = []
    for key in bwd_params.keys:
        if type(key) is tuple:
            backward_inputs.append(key)
        elif key in primal_of:
            backward_inputs.append((_PRIMAL, primal_of[key]))
        else:
            j = output_of.get(key)
            if j is None:
                j = output_of[key] = len(forward_outs)
                forward_outs.append(key)
            backward_inputs.append((_FORWARD_OUTPUT, j))

    def global_aval(vid: int) -> tuple:
        return (n, *fb.shape(vid)), np.dtype(fb.dtype(vid))

    out_avals = tuple(global_aval(i) for i in out_ids)
    in_avals = tuple((tuple(s), np.dtype(d)) for s, d in avals)
    bwd_avals = [
        out_avals[k] if kind == _COTANGENT
        else in_avals[k] if kind == _PRIMAL
        else global_aval(forward_outs[k])
        for kind, k in backward_inputs
    ]
    devices = pf._devices_for(n)
    forward = compile_one_node(fb.build(forward_outs), devices, avals, out_treedef)
    backward = compile_one_node(backward_fn, devices, bwd_avals, treedef)
    return _VjpEntry(
        forward, backward, treedef, in_avals, out_treedef, out_avals, aux_treedef,
        len(out_ids), len(aux_ids), tuple(backward_inputs),
    )


def _aux_pair(result: Any, where: str) -> tuple:
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        raise TypeError(
            f"{where} with has_aux=True: the function must return a pair (output, auxiliary "
            f"data), got {type(result).__name__}"
        )
    return result[0], result[1]


def _entry(pf: PmapFunction, leaves: list, treedef: PyTreeDef, has_aux: bool) -> _VjpEntry:
    avals = [(tuple(x.shape), np.dtype(x.dtype)) for x in leaves]
    n = pf.check_avals(avals)
    key = ("vjp", has_aux, treedef, tuple(avals))
    return pf.cached(key, lambda: _split(pf, treedef, avals, n, has_aux))


# --- The pullback ----------------------------------------------------------------


class _Pullback:
    """`f_vjp` of a pmap'd function: holds the residuals until it is dropped.

    In a program the residuals are program values and a call adds the
    backward node; outside, they are `ShardedBuffer`s and a call runs the
    backward function at once.
    """

    __slots__ = ("_entry", "_sources", "_program", "_name", "__weakref__")

    def __init__(self, entry: _VjpEntry, sources: list, program: Any, name: str):
        self._entry = entry
        self._sources = sources  # per backward input: its value, or None for a cotangent
        self._program = program  # the _ProgramTrace, or None
        self._name = name

    def __repr__(self) -> str:
        return f"<pw.vjp pullback of {self._name!r}>"

    def __call__(self, cotangent: Any) -> tuple:
        """The cotangents of the primals: a tuple with one pytree per primal.

        Args:
          cotangent: A pytree like the function's output, each leaf of its
            output leaf's shape and dtype.

        Raises:
          TypeError: For a cotangent of another structure or dtype.
          ValueError: For a leaf of another shape.
          TracerError: In a program, if called after the program's trace ended.
        """
        e = self._entry
        where = f"pw.vjp pullback of pmap of {self._name!r}"
        if self._program is not None and self._program.active:
            self._program.reject_dynamic(tree_flatten(cotangent)[0], where)
        leaves = _cotangent_leaves(cotangent, e.out_treedef, e.out_avals, where)
        program = self._program
        if program is not None:
            if not program.active:
                raise TracerError(
                    f"{where} was called after the {program.where()} trace that made it "
                    "ended; call it inside that program"
                )
            leaves = program.check_leaves(leaves, where, "cotangent leaf")
        else:
            for i, leaf in enumerate(leaves):
                if isinstance(leaf, _TracerBase):
                    raise TracerError(
                        f"{where} got a traced value ({leaf.aval}) as cotangent leaf {i}: "
                        "call pw.vjp inside the same program or pmap'd function"
                    )
            leaves = [_to_array(x, where, i, "cotangent leaf") for i, x in enumerate(leaves)]
        inputs = [
            leaves[k] if src is None else src
            for src, (_, k) in zip(self._sources, e.backward_inputs)
        ]
        if program is not None:
            outs = program.stage_call(e.backward.compiled, inputs)
        else:
            outs = e.backward.lowered.execute(
                [mapped_arg(x) for x in inputs],
                False,
                _state.client,
            )
        return tuple(tree_unflatten(e.in_treedef, outs))


def _cotangent_leaves(cotangent: Any, treedef: PyTreeDef, avals: tuple, where: str) -> list:
    """The leaves of `cotangent`, checked against the output they belong to."""
    leaves, ct_treedef = tree_flatten(cotangent)
    if ct_treedef != treedef:
        raise TypeError(
            f"{where}: the cotangent has tree structure {ct_treedef}, which does not match "
            f"the function's output structure {treedef}"
        )
    for i, (leaf, (shape, dtype)) in enumerate(zip(leaves, avals)):
        leaf_dtype = getattr(leaf, "dtype", None)
        leaf_dtype = np.asarray(leaf).dtype if leaf_dtype is None else np.dtype(leaf_dtype)
        leaf_shape = _shape(leaf)
        if leaf_shape != shape:
            raise ValueError(
                f"{where}: cotangent leaf {i} has shape {aval_str(leaf_shape, leaf_dtype)}; "
                f"it must have the shape of output leaf {i}, {aval_str(shape, dtype)}"
            )
        if leaf_dtype != dtype:
            raise TypeError(
                f"{where}: cotangent leaf {i} has dtype {leaf_dtype}; it must have the dtype "
                f"of output leaf {i}, {aval_str(shape, dtype)}"
            )
    return leaves


class _OneDevicePullback:
    """The pullback of a function run as a pmap over one device: unstacked leaves."""

    __slots__ = ("_pullback",)

    def __init__(self, pullback: _Pullback):
        self._pullback = pullback

    def __repr__(self) -> str:
        return repr(self._pullback)

    def __call__(self, cotangent: Any) -> tuple:
        stacked = tree_map(lambda leaf: np.asarray(_leading_one(leaf)), cotangent)
        return tree_map(lambda g: np.asarray(g)[0, ...], self._pullback(stacked))


def _leading_one(leaf: Any) -> np.ndarray:
    if isinstance(leaf, _TracerBase):
        raise TracerError(
            f"pw.vjp pullback got a traced value ({leaf.aval}) as a cotangent leaf, outside "
            "the trace it belongs to"
        )
    return np.asarray(leaf)[None]


# --- vjp --------------------------------------------------------------------------


def _check_default_mapping(pf: PmapFunction, what: str) -> None:
    """ValueError unless `pf` maps every argument and output over axis 0 (no static arguments)."""
    if not pf.default_mapping:
        raise ValueError(
            f"pw.{what} of pmap of {pf._name!r}: a pmap'd function with in_axes, out_axes or "
            f"static arguments other than the default is not supported by pw.{what}; apply "
            f"pw.{what} to the function inside the pmap instead"
        )


def _vjp_pmapped(pf: PmapFunction, primals: tuple, has_aux: bool) -> tuple:
    """`vjp` of a pmap'd function: the forward node now, the backward one in `f_vjp`."""
    where = f"pw.vjp of pmap of {pf._name!r}"
    leaves, treedef = tree_flatten(primals)
    program = _state.program
    if program is not None:
        inputs = program.check_leaves(leaves, where, "primal leaf")
        program.reject_dynamic(inputs, where)
    else:
        inputs = [_to_array(x, where, i, "primal leaf") for i, x in enumerate(leaves)]
    entry = _entry(pf, inputs, treedef, has_aux)
    if program is not None:
        outs = program.stage_call(entry.forward.compiled, inputs)
    else:
        client = _state.client
        devices = entry.forward.compiled.virtual_devices
        for kind, k in entry.backward_inputs:
            x = inputs[k] if kind == _PRIMAL else None
            mapped_buffer = isinstance(x, _ShardedBuffer) and not x.is_replicated
            if kind == _PRIMAL and not mapped_buffer:
                # Put once, for both functions: later changes to the array are not seen.
                inputs[k] = _core.device_put(np.asarray(x, order="C"), devices, client)
        outs = entry.forward.lowered.execute(
            [mapped_arg(x) for x in inputs],
            False,
            client,
        )
    sources = [
        None if kind == _COTANGENT else inputs[k] if kind == _PRIMAL else outs[k]
        for kind, k in entry.backward_inputs
    ]
    out = tree_unflatten(entry.out_treedef, outs[: entry.num_out])
    pullback = _Pullback(entry, sources, program, pf._name)
    if has_aux:
        aux = tree_unflatten(entry.aux_treedef, outs[entry.num_out : entry.num_out + entry.num_aux])
        return out, pullback, aux
    return out, pullback


def _traced_leaf(trace: _FunctionTrace, leaf: Any, where: str, i: int, what: str,
                 like: Optional[np.dtype] = None) -> Tracer:
    """A leaf given to `vjp`/`jvp` inside function trace `trace`, as one of its values."""
    if isinstance(leaf, Tracer):
        leaf._check()  # raises for a value of an ended trace
        return trace.local(leaf)  # (a loop body's parameter, for a value of an enclosing trace)
    if isinstance(leaf, _TracerBase):
        raise TracerError(
            f"{where} got a traced program value ({leaf.aval}) as {what} {i}; pass program "
            "values to pmap'd functions as arguments"
        )
    if like is not None and np.ndim(leaf) == 0 and not isinstance(leaf, np.ndarray):
        return trace.constant(leaf, like)
    return trace.constant(_to_array(leaf, where, i, what), None)


def _transpose(trace: _FunctionTrace, tape: _Tape, seeds: Any, inputs: list, where: str,
               what: str) -> list:
    """The cotangents of `inputs` from walking `tape` back in `trace`.

    Args:
      seeds: `(forward value, cotangent leaf)` pairs; cotangents of values
        the tape does not track (int outputs, constants) are dropped.
      inputs: The tape's inputs; one without a cotangent gets zeros.
      where, what: For messages ("pw.jvp of 'f' in ...", "tangent leaf").
    """
    cts: dict = {}
    for i, (v, c) in enumerate(seeds):
        if v._id in tape.tracked:
            c = _traced_leaf(trace, c, where, i, what, v.dtype)
            prev = cts.get(v._id)
            cts[v._id] = c if prev is None else prev + c
    cts = _backward(tape, cts, functools.partial(Tracer, trace), where)
    grads = []
    for t in inputs:
        g = cts.get(t._id)
        grads.append(_zeros(trace, t.shape, t.dtype) if g is None else g)
    return grads


def _vjp_in_trace(trace: _FunctionTrace, fn: Callable[..., Any], primals: tuple,
                  has_aux: bool) -> tuple:
    """`vjp` of a Python function inside a function trace: a tape, then ops in the same trace."""
    name = getattr(fn, "__name__", type(fn).__name__)
    where = f"pw.vjp of {name!r} in {trace.where()}"
    leaves, treedef = tree_flatten(primals)
    fresh = []
    for i, leaf in enumerate(leaves):
        x = _traced_leaf(trace, leaf, where, i, "primal leaf")
        # A fresh id: the tape must not mistake the same value passed twice,
        # or closed over by the function, for this input.
        fresh.append(bind(trace, "copy", (x,)) if _is_float(x.dtype) else x)
    tape = _Tape(trace.builder, [t._id for t in fresh if _is_float(t.dtype)])
    trace.tapes.append(tape)
    try:
        result = fn(*tree_unflatten(treedef, fresh))
    finally:
        trace.tapes.remove(tape)
    aux = None
    if has_aux:
        result, aux = _aux_pair(result, where)
    out_leaves, out_treedef = tree_flatten(result)
    outs = [_traced_leaf(trace, leaf, where, i, "output leaf") for i, leaf in enumerate(out_leaves)]
    out_avals = tuple((o.shape, o.dtype) for o in outs)
    pullback_where = f"pw.vjp pullback of {name!r} in {trace.where()}"

    def f_vjp(cotangent: Any) -> tuple:
        if not trace.active or _state.function is not trace:
            raise TracerError(
                f"{pullback_where} was called outside that trace; call it inside the same "
                "pmap'd function"
            )
        ct_leaves = _cotangent_leaves(cotangent, out_treedef, out_avals, pullback_where)
        seeds = zip(outs, ct_leaves)
        grads = _transpose(trace, tape, seeds, fresh, pullback_where, "cotangent leaf")
        return tuple(tree_unflatten(treedef, grads))

    f_vjp.__name__ = f"vjp_of_{name}"
    out = tree_unflatten(out_treedef, outs)
    return (out, f_vjp, aux) if has_aux else (out, f_vjp)


def _vjp_outside(fn: Callable[..., Any], primals: tuple, has_aux: bool) -> tuple:
    """`vjp` of a Python function outside any trace: a pmap over one device."""
    name = getattr(fn, "__name__", type(fn).__name__)
    where = f"pw.vjp of {name!r}"
    leaves, treedef = tree_flatten(primals)
    stacked = [np.asarray(_to_array(x, where, i, "primal leaf"))[None] for i, x in enumerate(leaves)]
    pf = PmapFunction(fn, None, None)
    result = _vjp_pmapped(pf, tree_unflatten(treedef, stacked), has_aux)

    def unstack(tree: Any) -> Any:
        return tree_map(lambda o: np.asarray(o)[0, ...], tree)

    out = unstack(result[0])
    pullback = _OneDevicePullback(result[1])
    return (out, pullback, unstack(result[2])) if has_aux else (out, pullback)


def vjp(fn: Callable[..., Any], *primals: Any, has_aux: bool = False) -> tuple:
    """`fn`'s outputs and its pullback (vector-Jacobian product), like `jax.vjp`.

    `out, f_vjp = pw.vjp(f, *primals)`; then `f_vjp(cotangent)` returns a
    tuple with the cotangent of each primal: the sum over the outputs of
    cotangent times the derivative of the output with respect to that primal.

    On a `pw.pmap`'d function this splits it into a forward and a backward
    compiled function: in `@pw.program` each is one node, and the backward
    node reads the forward node's residuals (the forward values it needs,
    kept on the devices) with no recomputation, which is what a pipeline of
    stages needs; outside a program each runs when called. `f_vjp` holds the
    residuals (as `ShardedBuffer`s outside a program): dropping it frees them.
    With collectives the semantics are `jax.pmap`'s (the transpose of `psum`
    is `psum`). Inside a pmap'd function `fn` is any traced Python function;
    outside any trace it runs as a pmap over one device on numpy arrays.

    Example:
      >>> stage = pw.pmap(lambda w, x: pnp.tanh(x @ w), devices=tpus)
      >>> @pw.program
      ... def step(w, x, ct):
      ...     y, stage_vjp = pw.vjp(stage, w, x)   # forward node
      ...     dw, dx = stage_vjp(ct)                # backward node
      ...     return y, dw, dx

    Args:
      fn: A `pw.pmap`'d function, or a Python function of traced values
        (inside a pmap'd function) or of arrays (outside any trace).
      *primals: Its arguments: pytrees of arrays (program values in a
        program). Cotangents are computed for float leaves; int and bool
        leaves get zeros of their own dtype.
      has_aux: Whether `fn` returns `(output, aux)`; then `aux` is returned
        as a third value and not differentiated.

    Returns:
      `(out, f_vjp)`, or `(out, f_vjp, aux)` with `has_aux`. `f_vjp` takes a
      pytree like `out` whose leaves have the shapes and dtypes of `out`'s.

    Raises:
      TypeError: If `fn` is not callable; for a cotangent of another
        structure or dtype (when `f_vjp` is called).
      ValueError: For a cotangent leaf of another shape.
      TracerError: For a Python function called in `@pw.program` outside any
        pmap'd function, or a pullback called outside its trace.
      NotImplementedError: For an op without a gradient rule.
    """
    if not callable(fn):
        raise TypeError(f"vjp expects a callable, got {fn!r}")
    has_aux = bool(has_aux)
    trace = _state.function
    if trace is not None:
        return _vjp_in_trace(trace, fn, primals, has_aux)
    if isinstance(fn, PmapFunction):
        _check_default_mapping(fn, "vjp")
        return _vjp_pmapped(fn, primals, has_aux)
    if _state.program is not None:
        name = getattr(fn, "__name__", type(fn).__name__)
        raise TracerError(
            f"vjp of {name!r} was called in {_state.program.where()} on a function that is "
            "not pmap'd: inside a program, pass a pw.pmap'd function to pw.vjp (or call "
            "pw.vjp inside a pmap'd function)"
        )
    return _vjp_outside(fn, primals, has_aux)


# --- jvp --------------------------------------------------------------------------


def _jvp_in_trace(trace: _FunctionTrace, fn: Callable[..., Any], primals: tuple,
                  tangents: tuple, has_aux: bool) -> tuple:
    """`jvp` inside a function trace: the transpose of the pullback (module docstring)."""
    name = getattr(fn, "__name__", type(fn).__name__)
    where = f"pw.jvp of {name!r} in {trace.where()}"
    result = _vjp_in_trace(trace, fn, primals, has_aux)
    out, f_vjp = result[0], result[1]
    out_leaves, out_treedef = tree_flatten(out)
    # A fresh zero cotangent per output: the pullback is linear in it.
    us = [bind(trace, "copy", (_zeros(trace, o.shape, o.dtype),)) for o in out_leaves]
    tape = _Tape(trace.builder, [u._id for u in us if _is_float(u.dtype)])
    trace.tapes.append(tape)
    try:
        grads = f_vjp(tree_unflatten(out_treedef, us))
    finally:
        trace.tapes.remove(tape)
    seeds = zip(tree_flatten(grads)[0], tree_flatten(tangents)[0])
    tangent_out = tree_unflatten(out_treedef, _transpose(trace, tape, seeds, us, where, "tangent leaf"))
    return (out, tangent_out, result[2]) if has_aux else (out, tangent_out)


def _shape(leaf: Any) -> tuple:
    shape = getattr(leaf, "shape", None)  # (np.shape of a program value raises)
    return tuple(np.shape(leaf) if shape is None else shape)


def _check_jvp_args(primals: Any, tangents: Any) -> None:
    for name, v in (("primals", primals), ("tangents", tangents)):
        if not isinstance(v, (tuple, list)):
            raise TypeError(
                f"pw.jvp: {name} must be a tuple or list with one entry per argument, got "
                f"{type(v).__name__}"
            )
    if len(primals) != len(tangents):
        raise ValueError(
            f"pw.jvp: primals has {len(primals)} arguments but tangents has {len(tangents)}"
        )
    p_leaves, p_treedef = tree_flatten(tuple(primals))
    t_leaves, t_treedef = tree_flatten(tuple(tangents))
    if p_treedef != t_treedef:
        raise TypeError(
            f"pw.jvp: tangents have tree structure {t_treedef}, primals {p_treedef}; they "
            "must match"
        )
    for i, (p, t) in enumerate(zip(p_leaves, t_leaves)):
        p_shape, t_shape = _shape(p), _shape(t)
        if p_shape != t_shape:
            raise ValueError(
                f"pw.jvp: tangent leaf {i} has shape {t_shape}, its primal {p_shape}; they "
                "must match"
            )
        p_dtype = getattr(p, "dtype", None)
        t_dtype = getattr(t, "dtype", None)
        if p_dtype is not None and t_dtype is not None and np.dtype(p_dtype) != np.dtype(t_dtype):
            raise TypeError(
                f"pw.jvp: tangent leaf {i} has dtype {np.dtype(t_dtype)}, its primal "
                f"{np.dtype(p_dtype)}; they must match"
            )


def jvp(fn: Callable[..., Any], primals: Any, tangents: Any, has_aux: bool = False) -> tuple:
    """`fn`'s outputs and their tangents (Jacobian-vector product), like `jax.jvp`.

    Computed as the transpose of `fn`'s pullback, so it costs about two
    backward passes. On a `pw.pmap`'d function it is one compiled function
    (one node in `@pw.program`); inside a pmap'd function `fn` is any traced
    Python function; outside any trace it runs as a pmap over one device.

    Args:
      fn: As for `vjp`.
      primals: A tuple or list of `fn`'s arguments.
      tangents: A tuple or list like `primals`: one tangent per primal leaf,
        of its shape and dtype.
      has_aux: Whether `fn` returns `(output, aux)`; then `aux` is returned
        as a third value.

    Returns:
      `(out, tangent_out)`, or `(out, tangent_out, aux)` with `has_aux`.

    Raises:
      TypeError: If `fn` is not callable, `primals`/`tangents` are not
        tuples or lists or their structures or dtypes differ.
      ValueError: For different numbers of arguments or leaf shapes.
      TracerError: For a Python function called in `@pw.program` outside any
        pmap'd function.
    """
    if not callable(fn):
        raise TypeError(f"jvp expects a callable, got {fn!r}")
    if _state.program is not None:
        _state.program.reject_dynamic(tree_flatten((primals, tangents))[0], "pw.jvp")
    _check_jvp_args(primals, tangents)
    primals, tangents = tuple(primals), tuple(tangents)
    has_aux = bool(has_aux)
    trace = _state.function
    if trace is not None:
        return _jvp_in_trace(trace, fn, primals, tangents, has_aux)
    name = getattr(fn, "__name__", type(fn).__name__)
    if isinstance(fn, PmapFunction):
        _check_default_mapping(fn, "jvp")
        pf = fn.cached(("jvp", has_aux), lambda: _jvp_function(fn._fn, name, has_aux,
                                                                fn._devices, fn._axis_name))
        return pf(primals, tangents)
    if _state.program is not None:
        raise TracerError(
            f"jvp of {name!r} was called in {_state.program.where()} on a function that is "
            "not pmap'd: inside a program, pass a pw.pmap'd function to pw.jvp (or call "
            "pw.jvp inside a pmap'd function)"
        )
    pf = _jvp_function(fn, name, has_aux, None, None)
    stacked = tree_map(lambda leaf: np.asarray(_to_array(leaf, f"pw.jvp of {name!r}"))[None],
                       (primals, tangents))
    return tree_map(lambda o: np.asarray(o)[0, ...], pf(*stacked))


def _jvp_function(fn: Callable[..., Any], name: str, has_aux: bool, devices: Any,
                  axis_name: Optional[str]) -> PmapFunction:
    """A pmap'd function of `(primals, tangents)` giving `fn`'s jvp."""

    def jvp_of(primals: tuple, tangents: tuple) -> tuple:
        if _jax_frontend.traced_by_jax((primals, tangents)):  # fn is JAX's: JAX's jvp
            import jax

            return jax.jvp(fn, primals, tangents, has_aux=has_aux)
        return _jvp_in_trace(_state.function, fn, primals, tangents, has_aux)

    jvp_of.__name__ = f"jvp_of_{name}"
    return PmapFunction(jvp_of, devices, axis_name)
