"""Loops and rematerialization in traced functions: the scan and while cores, the scan's gradient, and `checkpoint`.

`pw.lax.scan` and `pw.lax.fori_loop` (pathways.lax) trace their body once,
into a function of its own (a *body*, `_core.Function`), and bind one `scan`
op (function_ir.h, "Loops") that runs it `length` times: tracing time and IR
size do not grow with the trip count. `pw.lax.while_loop` (and `fori_loop`
with traced bounds) traces its cond and body once each and binds one `while`
op (`while_core`), whose trip count the device decides; as in JAX it has no
reverse-mode gradient (`_while_vjp` says so).

**Bodies.** A body is traced in a `_BodyTrace` whose parent is the trace the
loop is in. Values of enclosing traces that the body reads (weights a Python
closure captures) become parameters of the body, once each, and operands
(consts) of the scan: `_FunctionTrace.resolve` lifts them as `bind` meets
them. The body's parameters are the carries, the xs' slices, the explicit
consts, then the lifted values; it returns the next carries, then the ys.

**Gradients** (`_scan_vjp`, the scan primitive's VJP rule). When the trace
has gradient tapes, the body is traced with a tape of its own over all its
float parameters, and if a tape of the trace tracks an operand of the scan,
the body is *linearized* before the scan is bound (`_linearize`): the
backward of one iteration is the tape walked backwards (`_backward`, as
`pw.grad`), and the forward values it reads are found as `pw.vjp`'s split
finds its residuals, with `_LazyParameter`s in a trace that is then thrown
away. Those residuals are the linearization's: a const or an xs of the scan
is passed to the backward loop as it is, a constant of the body is emitted
again, and every other one (a value computed in the body, or a carry as it
enters an iteration) becomes an extra y of the forward scan, stacked over the
iterations. The backward is a reverse scan over the stacked residuals and the
ys' cotangents, carrying the carries' cotangents and the consts' cotangents
summed so far; its body replays the same tape walk with those values, so it
is itself a traced body that an enclosing tape can differentiate again.

**Rematerialization** (`checkpoint`). A checkpointed function runs with the
trace's tapes set aside, so none of its intermediates is recorded, and one
tape entry stands for it, whose operands are the values it read from before it
ran (its inputs, explicit or captured). Its rule runs the function again on
copies of those inputs (the trace's `subst` maps the originals to the copies),
under a tape, and walks that tape back: the backward recomputes the forward,
and only the inputs are residuals. In a scan body that makes the stacked
residuals the body's inputs alone.
"""

from __future__ import annotations

import contextlib
import functools
import operator
from typing import Any, Callable, Iterator, NamedTuple, Optional, Sequence

import numpy as np

from pathways import _core
from pathways._autodiff import _FLOAT_DTYPE_NAMES, _backward, _LazyParameter, _Parameters, _Tape, _zeros
from pathways._primitives import PRIMITIVES
from pathways._pytree import tree_flatten, tree_unflatten
from pathways._trace_state import TracerError, _state, _TracerBase, aval_str
from pathways._tracer import Tracer, WeakTracer, _FunctionTrace, _ir_name, bind

__all__ = ["scan_core", "while_core", "checkpoint", "BodyFn", "CondFn", "WhileBodyFn",
           "WeakCarryPromoted", "static_int", "describe"]

# body_fn(carries, x slices, consts) -> (next carries, ys): lists of leaves.
BodyFn = Callable[[list, list, list], tuple]


def _is_float(dtype: Any) -> bool:
    return np.dtype(dtype).name in _FLOAT_DTYPE_NAMES


class _BodyTrace(_FunctionTrace):
    """The trace of a loop's body: a function of its own, inside `parent`."""

    __slots__ = ("what", "full_tape")

    def __init__(self, parent: _FunctionTrace, name: str, what: str):
        builder = _core.FunctionBuilder(_ir_name(name), parent.axis_name or "")
        n = parent.builder.axis_size
        if n:
            builder.set_axis_size(n)
        super().__init__(builder, name, parent.axis_name, parent)
        self.what = what
        self.full_tape: Optional[_Tape] = None  # over every float parameter, when set

    def where(self) -> str:
        return f"{self.what} of {self.name!r} in {self.parent.where()}"

    def resolve(self, t: Tracer) -> int:
        lifted = len(self.lifted)
        v = super().resolve(t)
        if self.full_tape is not None and len(self.lifted) > lifted and _is_float(t.dtype):
            self.full_tape.tracked.add(v)  # a float parameter too, lifted as the body reads it
        return v


class _Linearization(NamedTuple):
    """How to differentiate one scan: its body's tape and residuals (module docstring).

    Positions are among the body's parameters (carries, xs, consts) or its
    outputs (next carries, ys, stacked residuals); value ids are the body's.
    """

    tape: _Tape  # the body's ops that depend on the differentiated parameters
    param_ids: tuple  # per parameter, its value id
    output_ids: tuple  # per output, its value id
    num_carries: int
    num_xs: int
    carries: tuple  # the differentiated carries (positions): their cotangents are carried
    consts: tuple  # the differentiated consts (positions): their cotangents are summed
    xs: tuple  # the differentiated xs (positions): their cotangents are the backward's ys
    seeds: tuple  # output positions (past the carries) whose cotangents seed the walk
    stacked: tuple  # (value id, output position) per residual stacked by the forward
    xs_residuals: tuple  # xs positions the backward reads
    const_residuals: tuple  # const positions the backward reads
    avals: dict  # value id -> (shape, dtype), of every value the walk may read
    constants: dict  # value id -> array, of the body's constants
    name: str


def _prune(full: _Tape, builder: Any, tracked_params: set) -> _Tape:
    """The tape a tape over `tracked_params` alone would have recorded, from `full`.

    `full` tracked every float parameter; an entry stays if one of its
    operands depends on `tracked_params`.
    """
    tape = _Tape(builder, ())
    tracked = tape.tracked = set(tracked_params)
    for entry in full.entries:
        _, ids, out, _ = entry
        for i in ids:
            if i in tracked:
                break
        else:
            continue
        if type(out) is tuple:
            tracked.update(o for o in out if o in full.tracked)
        else:
            tracked.add(out)
        tape.entries.append(entry)
    return tape


class _ReplayValues:
    """The forward values a backward body reads: its parameters, or constants again.

    Used as `_LazyParameter`'s parameters object: `id_of(key)` is the value
    of the body's forward value `key` in the backward body's trace.
    """

    __slots__ = ("trace", "_values", "_constants", "_emitted", "_name")

    def __init__(self, trace: _FunctionTrace, values: dict, constants: dict, name: str):
        self.trace = trace
        self._values = values
        self._constants = constants
        self._emitted: dict = {}
        self._name = name

    def id_of(self, key: int, shape: tuple, dtype: np.dtype) -> int:
        t = self._values.get(key)
        if t is not None:
            return self.trace.resolve(t)
        v = self._emitted.get(key)
        if v is None:
            const = self._constants.get(key)
            if const is None:
                raise AssertionError(
                    f"the backward of scan {self._name!r} read forward value %{key}, which its "
                    "linearization did not keep (a bug in pathways._control_flow)"
                )
            v = self._emitted[key] = self.trace.builder.constant(const)
        return v


def _replay(lin: _Linearization, trace: _FunctionTrace, carry_cts: list, seed_cts: list,
            value: Callable[[int], Tracer], where: str) -> tuple:
    """One iteration's backward: cotangents of the differentiated parameters.

    Args:
      carry_cts: Per differentiated carry, the cotangent of its next value.
      seed_cts: Per seed output, its cotangent, or None.
      value: The backward's value for a forward value id.

    Returns:
      `(carries, consts, xs)`: per differentiated carry, const and xs, the
      cotangent of the parameter (zeros where none reaches it).
    """
    cts: dict = {}

    def seed(vid: int, ct: Any) -> None:
        if vid not in lin.tape.tracked:
            return
        prev = cts.get(vid)
        cts[vid] = ct if prev is None else prev + ct

    for j, ct in zip(lin.carries, carry_cts):
        seed(lin.output_ids[j], ct)
    for p, ct in zip(lin.seeds, seed_cts):
        if ct is not None:
            seed(lin.output_ids[p], ct)
    cts = _backward(lin.tape, cts, value, where)

    def ct_of(position: int) -> Tracer:
        vid = lin.param_ids[position]
        c = cts.get(vid)
        if c is None:
            shape, dtype = lin.avals[vid]
            return _zeros(trace, shape, dtype)
        return c

    return ([ct_of(j) for j in lin.carries], [ct_of(k) for k in lin.consts],
            [ct_of(k) for k in lin.xs])


def _linearize(body: _BodyTrace, full: _Tape, needs: list, num_carries: int, num_xs: int,
               param_ids: list, outputs: list, handled: int, name: str) -> _Linearization:
    """Linearizes a traced body (module docstring): its pruned tape and residuals.

    Args:
      body: The body's trace, ended but not built.
      full: Its tape over all float parameters.
      needs: Per parameter, whether a cotangent is needed for it.
      param_ids, outputs: The body's parameters' and outputs' value ids.
      handled: How many outputs get cotangents (the next carries, the ys and
        the residuals of inner linearizations).
    """
    b = body.builder
    nc = num_carries
    tracked = {param_ids[k] for k, need in enumerate(needs) if need}
    while True:
        tape = _prune(full, b, tracked)
        # A carry whose next value depends on a differentiated value is
        # differentiated too: its cotangent flows into the previous iteration.
        more = {param_ids[j] for j in range(nc)
                if outputs[j] in tape.tracked and param_ids[j] not in tracked}
        if not more:
            break
        tracked |= more
    carries = tuple(j for j in range(nc) if param_ids[j] in tracked)
    xs = tuple(k for k in range(nc, nc + num_xs) if param_ids[k] in tracked)
    consts = tuple(k for k in range(nc + num_xs, len(param_ids)) if param_ids[k] in tracked)
    seeds = tuple(p for p in range(nc, handled) if outputs[p] in tape.tracked)
    avals: dict = {}
    for vid in list(param_ids) + list(outputs[:handled]):
        avals[vid] = (tuple(b.shape(vid)), np.dtype(b.dtype(vid)))
    for _, ids, out, _ in tape.entries:
        for vid in (*ids, *(out if type(out) is tuple else (out,))):
            if vid not in avals:
                avals[vid] = (tuple(b.shape(vid)), np.dtype(b.dtype(vid)))
    constants = dict(body.constant_values or {})
    lin = _Linearization(tape, tuple(param_ids), tuple(outputs), nc, num_xs, carries, consts, xs,
                         seeds, (), (), (), avals, constants, name)

    # The residuals: the forward values one iteration's backward reads,
    # found by walking it in a trace that is thrown away.
    discover = _FunctionTrace(_core.FunctionBuilder("linearize", body.axis_name or ""),
                              body.name, body.axis_name)
    if body.builder.axis_size:
        discover.builder.set_axis_size(body.builder.axis_size)
    residuals = _Parameters(discover, constants)
    db = discover.builder

    def fresh(vid: int) -> Tracer:
        shape, dtype = avals[vid]
        return Tracer(discover, db.parameter(dtype.name, list(shape)))

    prev = _state.function
    _state.function = discover
    try:
        _replay(lin, discover, [fresh(outputs[j]) for j in carries],
                [fresh(outputs[p]) for p in seeds],
                lambda vid: _LazyParameter(residuals, vid, *avals[vid]),
                f"pw.grad of {body.where()}")
    finally:
        discover.active = False
        _state.function = prev
    position = {vid: k for k, vid in enumerate(param_ids)}
    stacked, xs_res, const_res = [], [], []
    for vid in residuals.keys:
        k = position.get(vid)
        if k is not None and k >= nc + num_xs:
            const_res.append(k)
        elif k is not None and k >= nc:
            xs_res.append(k)
        else:  # computed in the body, or a carry as it enters the iteration
            stacked.append(vid)
    return lin._replace(stacked=tuple(stacked), xs_residuals=tuple(xs_res),
                        const_residuals=tuple(const_res))


def _as_body_value(body: _BodyTrace, leaf: Any, what: str, like: Optional[np.dtype]) -> Tracer:
    """An output leaf of a body as one of its values (constants added; outer values lifted)."""
    if isinstance(leaf, Tracer):
        leaf._check()
        return body.local(leaf)
    if isinstance(leaf, _TracerBase):
        raise TracerError(
            f"{body.where()} returns a traced program value ({leaf.aval}) as {what}; pass "
            "program values to pmap'd functions as arguments"
        )
    try:
        return body.constant(leaf, like)
    except (TypeError, ValueError) as e:
        raise TypeError(
            f"{body.where()}: {what} is neither a traced value nor a numeric constant: "
            f"{leaf!r} ({e})"
        ) from None


class WeakCarryPromoted(TypeError):
    """A weakly typed carry (a Python scalar's) came out of the body with another dtype.

    As JAX does, the caller converts that carry to the dtype the body gave it
    and traces the body again (`pw.lax.scan`).
    """

    def __init__(self, message: str, index: int, dtype: np.dtype):
        super().__init__(message)
        self.index = index
        self.dtype = dtype


def _loop_params(body: _BodyTrace, carries: list, xs: list, consts: list) -> list:
    """The parameters of a loop's nested function, one per operand: a carry's type,
    an xs's without its leading axis (an iteration's slice), a const's type.

    A weakly typed carry enters weakly typed, so that it takes the dtype of
    what it meets, as a Python scalar would.
    """
    bb = body.builder
    params = [(WeakTracer if type(t) is WeakTracer else Tracer)(
        body, bb.parameter(t.dtype.name, list(t.shape))) for t in carries]
    params += [Tracer(body, bb.parameter(t.dtype.name, list(t.shape[1:]))) for t in xs]
    params += [Tracer(body, bb.parameter(t.dtype.name, list(t.shape))) for t in consts]
    return params


@contextlib.contextmanager
def _tracing(body: _BodyTrace) -> Iterator[None]:
    """Makes `body` the current trace while a loop's function is traced, and ends it."""
    st = _state
    prev = st.function
    st.function = body
    try:
        yield
    finally:
        body.active = False
        st.function = prev


def _carry_ids(body: _BodyTrace, next_carries: list, carries: list) -> list:
    """The value ids in `body` of the next carries a loop's body returned.

    Raises:
      TypeError: If a next carry has another shape or dtype than its carry
        (`WeakCarryPromoted` if only the dtype of a weakly typed one).
    """
    if len(next_carries) != len(carries):
        raise AssertionError(
            f"{body.where()}: {len(next_carries)} next carries for {len(carries)}")
    out_ids = []
    for j, (leaf, c) in enumerate(zip(next_carries, carries)):
        t = _as_body_value(body, leaf, f"carry leaf {j}", c.dtype)
        if t.shape != c.shape or t.dtype != c.dtype:
            message = (f"{body.where()}: the carry output must have the carry input's "
                       f"type: carry leaf {j} is {c.aval} on input but {t.aval} on output")
            if type(c) is WeakTracer and t.shape == c.shape:
                raise WeakCarryPromoted(message, j, t.dtype)
            raise TypeError(message)
        out_ids.append(t._id)
    return out_ids


def scan_core(trace: _FunctionTrace, body_fn: BodyFn, name: str, what: str, carries: list,
              xs: list, consts: list, length: int, reverse: bool) -> tuple:
    """Traces `body_fn` once and binds a scan of it in `trace` (module docstring).

    Args:
      trace: The current function trace.
      body_fn: `body_fn(carries, x slices, consts)` returns `(next carries,
        ys)`, lists of leaves (traced values of the body, values it reads
        from enclosing traces, or numeric constants).
      name, what: The body's name, and what it is for messages ("scan body").
      carries, xs, consts: The scan's operands, traced values `trace` can
        read; each xs has a leading axis of `length`.
      length: The trip count.
      reverse: Whether iterations run from the last to the first.

    Returns:
      `(final carries, stacked ys)`: lists of traced values of `trace`.

    Raises:
      TypeError: If a next carry has another shape or dtype than its carry
        (`WeakCarryPromoted` if only the dtype of a weakly typed one).
      ValueError, TypeError: From the builder (an op of the body, or the scan).
    """
    body = _BodyTrace(trace, name, what)
    bb = body.builder
    nc, nx = len(carries), len(xs)
    params = _loop_params(body, carries, xs, consts)
    full = None
    if trace.tapes:
        # Whether a tape will need this loop's gradient is known once the body
        # is traced (it may capture a differentiated value): record a tape of
        # every float parameter now, and prune it later (_linearize).
        body.constant_values = {}
        full = body.full_tape = _Tape(bb, [p._id for p in params if _is_float(p.dtype)])
        body.tapes.append(full)
    with _tracing(body):
        try:
            next_carries, ys = body_fn(params[:nc], params[nc:nc + nx], params[nc + nx:])
            out_ids = _carry_ids(body, list(next_carries), carries)
            for i, leaf in enumerate(ys):
                out_ids.append(_as_body_value(body, leaf, f"y leaf {i}", None)._id)
        finally:
            if full is not None:
                body.tapes.remove(full)
    operands = [*carries, *xs, *consts, *body.lifted]
    param_ids = [p._id for p in params] + [body.lifted_ids[(t._trace, t._id)] for t in body.lifted]
    outputs = list(out_ids)
    lin = None
    if full is not None:
        op_ids = [trace.resolve(t) for t in operands]
        levels = [tape for tape in trace.tapes if any(i in tape.tracked for i in op_ids)]
        if levels:
            needs = [_is_float(t.dtype) and any(op_ids[k] in tape.tracked for tape in levels)
                     for k, t in enumerate(operands)]
            # One linearization per tape that differentiates the loop. An
            # enclosing tape also differentiates the backward loop of an inner
            # one, which reads the stacked residuals: its linearization gets
            # their cotangents too. The last handles every output, and is the
            # one the scan's rule uses for all of them.
            for _ in levels:
                lin = _linearize(body, full, needs, nc, nx, param_ids, outputs, len(outputs), name)
                ys_at = {vid: p for p, vid in enumerate(outputs) if p >= nc}
                stacked = []
                for vid in lin.stacked:
                    p = ys_at.get(vid)
                    if p is None:
                        p = ys_at[vid] = len(outputs)
                        outputs.append(vid)
                    stacked.append((vid, p))
                lin = lin._replace(stacked=tuple(stacked))
    if not outputs:
        return [], []  # nothing carried and nothing stacked: nothing to run
    results = bind(trace, "scan", operands, body=bb.build(outputs), num_carries=nc, num_xs=nx,
                   length=length, reverse=reverse, lin=lin)
    return results[:nc], results[nc:nc + len(ys)]


def _scan_vjp(cts: list, operands: list, outs: list, params: dict, needs: list) -> list:
    """The scan primitive's VJP rule: a reverse scan (module docstring)."""
    lin: Optional[_Linearization] = params.get("lin")
    if lin is None:
        raise NotImplementedError(
            "differentiation of a scan bound without its linearization: write loops with "
            "pw.lax.scan or pw.lax.fori_loop"
        )
    trace = _state.function
    length = params["length"]

    def zeros_like(t: Tracer) -> Tracer:
        return _zeros(trace, t.shape, t.dtype)

    carry_cts = [cts[j] if cts[j] is not None else zeros_like(outs[j]) for j in lin.carries]
    accs = [zeros_like(operands[k]) for k in lin.consts]
    # Seeds without a cotangent (a y the loss does not use) are left out.
    seeds = [(i, cts[p]) for i, p in enumerate(lin.seeds) if cts[p] is not None]
    stacked = [outs[p] for _, p in lin.stacked]
    xs = [ct for _, ct in seeds] + stacked + [operands[k] for k in lin.xs_residuals]
    consts = [operands[k] for k in lin.const_residuals]
    ncc, nacc = len(lin.carries), len(lin.consts)
    where = f"pw.grad of pw.lax.scan of {lin.name!r}"

    def backward(carries: list, x: list, k: list) -> tuple:
        cur = _state.function
        values = {}
        for (vid, _), v in zip(lin.stacked, x[len(seeds):]):
            values[vid] = v
        rest = x[len(seeds) + len(stacked):]
        for pos, v in zip(lin.xs_residuals, rest):
            values[lin.param_ids[pos]] = v
        for pos, v in zip(lin.const_residuals, k):
            values[lin.param_ids[pos]] = v
        replay = _ReplayValues(cur, values, lin.constants, lin.name)
        seed_cts: list = [None] * len(lin.seeds)
        for (i, _), ct in zip(seeds, x[:len(seeds)]):
            seed_cts[i] = ct
        d_carries, d_consts, d_xs = _replay(
            lin, cur, carries[:ncc], seed_cts,
            lambda vid: _LazyParameter(replay, vid, *lin.avals[vid]), where)
        return d_carries + [a + d for a, d in zip(carries[ncc:], d_consts)], d_xs

    carry_res, ys_res = scan_core(trace, backward, f"{lin.name}_bwd", "backward scan body",
                                  carry_cts + accs, xs, consts, length, not params["reverse"])
    contributions: list = [None] * len(operands)
    for j, c in zip(lin.carries, carry_res[:ncc]):
        contributions[j] = c
    for k, c in zip(lin.consts, carry_res[ncc:ncc + nacc]):
        contributions[k] = c
    for k, c in zip(lin.xs, ys_res):
        contributions[k] = c
    return contributions


PRIMITIVES["scan"].def_vjp(_scan_vjp)


# --- while ----------------------------------------------------------------------------

# cond_fn(carries, consts) -> the predicate (one leaf); body_fn(carries, consts) -> the
# next carries (a list of leaves).
CondFn = Callable[[list, list], Any]
WhileBodyFn = Callable[[list, list], list]


def while_core(trace: _FunctionTrace, cond_fn: CondFn, body_fn: WhileBodyFn, cond_name: str,
               body_name: str, carries: list, consts: list) -> list:
    """Traces `cond_fn` and `body_fn` once each and binds a while loop of them in `trace`.

    Both functions take every operand of the loop (function_ir.h, "Loops"):
    the carries, the explicit consts, then the values of enclosing traces
    that either reads (lifted as the scan body's are), so those are lifted
    into both: the body's trace starts with the cond's lifted values, and
    the cond gets a parameter for each value only the body reads.

    Args:
      trace: The current function trace.
      cond_fn: `cond_fn(carries, consts)` returns the predicate: a bool
        scalar (a traced value, a value of an enclosing trace, or a
        constant).
      body_fn: `body_fn(carries, consts)` returns the next carries, a list
        of leaves as `scan_core`'s.
      cond_name, body_name: The functions' names, for the IR and messages.
      carries, consts: The loop's operands, traced values `trace` can read;
        at least one carry.

    Returns:
      The final carries: a list of traced values of `trace`.

    Raises:
      TypeError: If the predicate is not a bool scalar, or a next carry has
        another shape or dtype than its carry (`WeakCarryPromoted` if only
        the dtype of a weakly typed one).
      ValueError, TypeError: From the builder (an op of either function).
    """
    nc = len(carries)
    cond = _BodyTrace(trace, cond_name, "while_loop cond")
    cond_params = _loop_params(cond, carries, [], consts)
    with _tracing(cond):
        out = cond_fn(cond_params[:nc], cond_params[nc:])
        if isinstance(out, (tuple, list, dict)) or out is None:
            raise TypeError(
                f"{cond.where()} must return a boolean scalar, but got {type(out).__name__} "
                f"{out!r}")
        pred = _as_body_value(cond, out, "the predicate", None)
        if pred.shape != () or pred.dtype != np.bool_:
            raise TypeError(
                f"{cond.where()} must return a boolean scalar, but got {pred.aval}")
    body = _BodyTrace(trace, body_name, "while_loop body")
    body_params = _loop_params(body, carries, [], consts)
    for t in cond.lifted:  # the cond's lifted values first, in its order
        body.resolve(t)
    with _tracing(body):
        out_ids = _carry_ids(body, list(body_fn(body_params[:nc], body_params[nc:])), carries)
    for t in body.lifted[len(cond.lifted):]:  # then those only the body reads
        cond.resolve(t)
    operands = [*carries, *consts, *cond.lifted]
    return bind(trace, "while", operands, cond=cond.builder.build([pred._id]),
                body=body.builder.build(out_ids), num_carries=nc)


def _while_vjp(cts: list, operands: list, outs: list, params: dict, needs: list) -> list:
    """The while primitive's VJP rule: there is none, as in JAX."""
    raise ValueError(
        f"Reverse-mode differentiation does not work for lax.while_loop or lax.fori_loop "
        f"with dynamic start/stop values (pw.lax.while_loop of {params['body'].name!r}): its "
        f"trip count is known only on the device, so no iteration's values are kept for a "
        f"backward pass. Try using lax.scan, or using fori_loop with static start/stop."
    )


PRIMITIVES["while"].def_vjp(_while_vjp)


# --- checkpoint -----------------------------------------------------------------------


class _RematRule:
    """The tape entry of a checkpointed call (not an op: its forward ops are the function's)."""

    name = "checkpoint"
    stops_gradient = False

    @staticmethod
    def vjp(cts: list, operands: list, outs: list, params: dict, needs: list) -> list:
        """Recomputes the function from copies of its inputs under a tape, and walks it back."""
        trace = _state.function
        subst = dict(trace.subst)
        copies = []
        for key, x, need in zip(params["keys"], operands, needs):
            if need and _is_float(x.dtype):
                c = bind(trace, "copy", (x,))
                copies.append(c._id)
                subst[key] = c._id
            else:
                copies.append(None)
                subst[key] = trace.resolve(x)
        tape = _Tape(trace.builder, [c for c in copies if c is not None])
        saved = trace.subst
        trace.subst = subst
        trace.tapes.append(tape)
        try:
            result = params["fun"](*params["args"], **params["kwargs"])
            out_ids = [trace.resolve(t) if isinstance(t, Tracer) else None
                       for t in tree_flatten(result)[0]]
        finally:
            trace.tapes.remove(tape)
            trace.subst = saved
        seeds: dict = {}
        for vid, ct in zip(out_ids, cts):
            if ct is not None and vid is not None and vid in tape.tracked:
                prev = seeds.get(vid)
                seeds[vid] = ct if prev is None else prev + ct
        res = _backward(tape, seeds, functools.partial(Tracer, trace), params["where"])
        return [None if c is None else res.get(c) for c in copies]


def _checkpointed_call(trace: _FunctionTrace, fun: Callable[..., Any], name: str, args: tuple,
                       kwargs: dict) -> Any:
    """Calls `fun` in `trace` with its intermediates kept off the tapes (module docstring)."""
    b = trace.builder
    start = b.num_values()
    lifted_before = len(trace.lifted)
    reads: dict = {}  # (trace, id) of each value read from before the call -> its id here
    new_lifted: set = set()
    outer = trace.recorder

    def recorder(operands: Sequence[Tracer], ids: list) -> None:
        if outer is not None:
            outer(operands, ids)
        if len(trace.lifted) > lifted_before + len(new_lifted):
            for t in trace.lifted[lifted_before:]:
                new_lifted.add(trace.lifted_ids[(t._trace, t._id)])
        for t, vid in zip(operands, ids):
            if vid < start or vid in new_lifted:
                reads.setdefault((t._trace, t._id), vid)

    tapes = trace.tapes
    trace.tapes = []
    trace.recorder = recorder
    try:
        result = fun(*args, **kwargs)
        leaves, treedef = tree_flatten(result)
        outs = []
        for leaf in leaves:
            if isinstance(leaf, Tracer):
                leaf._check()
                t = trace.local(leaf)
                if t._id < start or t._id in new_lifted or t._id in reads.values():
                    t = bind(trace, "copy", (t,))  # an input returned: a value of its own
                outs.append(t)
            else:
                outs.append(leaf)
    finally:
        trace.tapes = tapes
        trace.recorder = outer
    keys = list(reads)
    ids = [reads[k] for k in keys]
    out_ids = tuple(t._id for t in outs if isinstance(t, Tracer))
    if out_ids:
        params = {"fun": fun, "args": args, "kwargs": kwargs, "keys": keys,
                  "where": f"pw.checkpoint of {name!r} in {trace.where()}"}
        for tape in tapes:
            tape.record(_RematRule, ids, out_ids, params)
    return tree_unflatten(treedef, outs)


def checkpoint(fun: Callable[..., Any], *, prevent_cse: bool = True, policy: Any = None,
               static_argnums: Any = ()) -> Callable[..., Any]:
    """`fun`, with its forward recomputed in the backward pass, like `jax.checkpoint` (`jax.remat`).

    Differentiated (by `pw.grad`, `pw.vjp` ...), a checkpointed function keeps
    none of its intermediate values for the backward pass: the backward runs
    the function again from its inputs (the arguments and the traced values
    it captures) and differentiates that recomputation. That trades compute
    for memory: only the inputs live from the forward to the backward pass.
    The common use is the body of a loop, `pw.lax.scan(pw.checkpoint(step),
    ...)`, whose stacked residuals are then the body's inputs alone. Values
    and gradients are those of `fun`. Not differentiated, or outside a
    traced function, it is `fun`.

    Args:
      fun: The function: any function of traced values and pytrees of them.
      prevent_cse: Accepted for compatibility with JAX; nothing here merges
        the recomputation with the forward.
      policy: Must be None: nothing is saved (JAX's default policy).
      static_argnums: Accepted for compatibility with JAX: every argument that
        is not a traced value is passed to `fun` as it is anyway.

    Returns:
      A function with `fun`'s arguments and results.

    Raises:
      TypeError: If `fun` is not callable, `prevent_cse` is not a bool or
        `static_argnums` not ints.
      NotImplementedError: For a `policy` other than None.
    """
    if not callable(fun):
        raise TypeError(f"checkpoint expects a callable, got {fun!r}")
    if not isinstance(prevent_cse, (bool, np.bool_)):
        raise TypeError(f"checkpoint: prevent_cse must be a bool, got {prevent_cse!r}")
    if policy is not None:
        raise NotImplementedError(
            "checkpoint: policies are not supported; policy=None recomputes everything"
        )
    nums = static_argnums if isinstance(static_argnums, (tuple, list)) else (static_argnums,)
    for a in nums:
        if isinstance(a, bool) or not isinstance(a, (int, np.integer)):
            raise TypeError(f"checkpoint: static_argnums must be ints, got {static_argnums!r}")
    name = getattr(fun, "__name__", type(fun).__name__)

    @functools.wraps(fun)
    def remat(*args: Any, **kwargs: Any) -> Any:
        trace = _state.function
        if trace is None or not trace.tapes:
            return fun(*args, **kwargs)
        return _checkpointed_call(trace, fun, name, args, kwargs)

    return remat


def static_int(where: str, param: str, value: Any) -> int:
    """`value` as a Python int (a traced value, a bool or a non-integer: TypeError)."""
    if isinstance(value, (bool, np.bool_)) or isinstance(value, _TracerBase):
        raise TypeError(f"{where}: {param} must be a static int, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{where}: {param} must be a static int, got {value!r}") from None


def describe(leaves: Sequence[Any]) -> str:
    """Short types of leaves, for messages."""
    out = []
    for leaf in leaves:
        shape = getattr(leaf, "shape", None)
        dtype = getattr(leaf, "dtype", None)
        if shape is None or dtype is None:
            arr = np.asarray(leaf)
            shape, dtype = arr.shape, arr.dtype
        out.append(aval_str(tuple(shape), dtype))
    return ", ".join(out)
