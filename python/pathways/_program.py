"""The program tracer: `@pw.program` (paper §3, Figure 2).

A `Program` traces a block of Python that calls pmap'd functions into a single
Pathways program, a dataflow graph with one computation node per call. The
program is lowered once (placement and transfers between the nodes' devices are
decided then) and each later call dispatches all its nodes at once, instead of
one Python call per compiled function.
"""

from __future__ import annotations

import functools
import threading
from typing import Any, Callable, NamedTuple, Optional

import numpy as np

from pathways import _core
from pathways._checks import _to_array
from pathways._pmap import PmapFunction, global_aval, mapped_arg
from pathways._pytree import PyTreeDef, is_jax_array, tree_flatten, tree_unflatten
from pathways._trace_state import (
    _SUPPORTED_DTYPE_NAMES,
    _SUPPORTED_DTYPES,
    TracerError,
    _state,
    _TracerBase,
    aval_str,
)
from pathways._tracer import Tracer, _ir_name

__all__ = ["Program", "ProgramTracer", "program"]

_ShardedBuffer = _core.ShardedBuffer


class _ProgramTrace:
    """One trace of a `Program`: the calls it recorded and the constants it captured.

    `_core.ProgramBuilder` needs every argument before the first call, but
    captured constants are only found while the function runs. So the trace
    records arguments and calls with its own value ids, and `build` replays them
    into a builder afterwards: the user's arguments, then the constants, then
    the calls.
    """

    def __init__(self, name: str):
        self.name = name
        self.active = True
        self.args: list = []  # (value id, dtype name, shape) of the user's dynamic args
        self.constants: list = []  # concrete arrays, passed after the user's args
        self._constant_ids: list = []  # their value ids
        self._captured: dict = {}  # id(value) -> value id
        self._keepalive: list = []  # the captured objects themselves
        self.deferred_constants: dict = {}  # value id -> concrete input of a deferred node
        self.calls: list = []  # (compiled function, input value ids, output value ids)
        # Nodes whose shapes depend on data (paper §4.5), run by the fallback
        # after the static part: (kind, payload, input value ids, output ids).
        self.deferred: list = []
        self.dynamic: set = set()  # value ids whose shape is known only at run time
        self._next_id = 0

    def where(self) -> str:
        return f"@pw.program {self.name!r}"

    def _new_value(self) -> int:
        vid = self._next_id
        self._next_id += 1
        return vid

    def add_arg(self, dtype: np.dtype, shape: tuple) -> int:
        """Adds one of the user's dynamic arguments; returns its value id."""
        vid = self._new_value()
        self.args.append((vid, dtype.name, list(shape)))
        return vid

    def capture(self, value: Any, devices: list) -> int:
        """Adds a concrete argument of a pmap call as an extra program argument.

        Numpy arrays are copied to `devices` once, now: like values a traced
        function closes over, later changes to the array are not seen.

        Args:
          value: A `ShardedBuffer` or numpy array.
          devices: The virtual devices of the pmap'd function it is passed to.

        Returns:
          Its value id (the same for the same object passed twice).
        """
        vid = self._captured.get(id(value))
        if vid is None:
            vid = self._new_value()
            self._captured[id(value)] = vid
            self._keepalive.append(value)  # keeps id(value) from being reused
            if not isinstance(value, _ShardedBuffer):
                value = _core.device_put(np.asarray(value, order="C"), devices)
            self.constants.append(value)
            self._constant_ids.append(vid)
        return vid

    def check_leaves(self, leaves: list, where: str, what: str = "argument") -> list:
        """The leaves given to a compiled function of this program, checked.

        Program values of this trace stay as they are; concrete leaves become
        ShardedBuffers or numpy arrays (`capture` adds them when staged).

        Raises:
          TracerError: For a value of another (or ended) trace.
          TypeError, ValueError: As `pw.pmap` for a bad concrete leaf.
        """
        checked = []
        for i, leaf in enumerate(leaves):
            if isinstance(leaf, ProgramTracer):
                if leaf._trace is not self or not self.active:
                    raise leaf._escaped()
            elif isinstance(leaf, Tracer):
                raise TracerError(
                    f"escaped tracer: a traced value ({leaf.aval}) of {leaf._trace.where()} "
                    f"was passed to {where} in {self.where()}"
                )
            else:
                leaf = _to_array(leaf, where, i, what)
            checked.append(leaf)
        return checked

    def reject_dynamic(self, leaves: list, where: str) -> None:
        """TracerError for a value of data-dependent shape among `leaves` (for `where`)."""
        for leaf in leaves:
            if isinstance(leaf, ProgramTracer) and leaf._id in self.dynamic:
                raise TracerError(
                    f"{where} got a value of data-dependent shape ({leaf.aval}) in "
                    f"{self.where()}: not supported yet (only pmap'd calls and pw.compact run on "
                    "such values)"
                )

    def stage_call(self, compiled: Any, inputs: list) -> list:
        """Records a node calling `compiled` on checked `inputs`; returns its outputs."""
        ids = []
        for leaf in inputs:
            if isinstance(leaf, ProgramTracer):
                ids.append(leaf._id)
            else:
                ids.append(self.capture(leaf, compiled.virtual_devices))
        outs = []
        out_ids = []
        for shape, dtype in compiled.output_types():
            vid = self._new_value()
            out_ids.append(vid)
            outs.append(ProgramTracer(self, vid, tuple(shape), np.dtype(dtype)))
        self.calls.append((compiled, ids, out_ids))
        return outs

    def stage_pmap(self, fn: PmapFunction, args: tuple) -> Any:
        """Records a call of `fn` on `args` as a program node; returns its outputs.

        A call with an input whose shape depends on data is deferred: traced
        now at the input's bound (for its output structure), run by the
        fallback once the input exists.
        """
        where = f"pmap of {fn._name!r}"
        if fn.default_mapping:
            leaves, treedef = tree_flatten(args)
            statics, weak = (), ()
        else:
            if not fn.outputs_mapped:
                raise ValueError(
                    f"{where}: out_axes {fn.out_axes!r} inside @pw.program: the outputs of a "
                    "program node are program values, mapped over their leading axis "
                    "(out_axes=0)"
                )
            treedef, leaves, statics, weak = fn.map_arguments(args, ProgramTracer)
        inputs = self.check_leaves(leaves, where)
        if any(isinstance(x, ProgramTracer) and x._id in self.dynamic for x in inputs):
            if statics or weak:
                raise TracerError(
                    f"{where} with static or scalar arguments got a value of data-dependent shape in "
                    f"{self.where()}: not supported yet"
                )
            avals = [(x._bound, x.dtype) if isinstance(x, ProgramTracer) and x._id in self.dynamic
                     else (tuple(x.shape), np.dtype(x.dtype)) for x in inputs]
            entry = fn.get_compiled(treedef, avals)
            outs = self.stage_deferred(("call", fn, treedef), inputs, entry.compiled.output_types())
            return tree_unflatten(entry.out_treedef, outs)
        entry = fn.get_compiled(treedef, [global_aval(x) for x in inputs], statics, weak)
        return tree_unflatten(entry.out_treedef, self.stage_call(entry.compiled, inputs))

    def stage_deferred(self, op: tuple, inputs: list, out_types: list) -> list:
        """Records a node of the fallback; returns its outputs, of data-dependent shape.

        Args:
          op: What the node runs (see pathways._dynamic.run_deferred).
          inputs: Checked leaves: program values, or concrete arrays (captured).
          out_types: `(bound shape, dtype)` per output.
        """
        ids = []
        for leaf in inputs:
            if isinstance(leaf, ProgramTracer):
                ids.append(leaf._id)
            else:
                vid = self._new_value()
                self._keepalive.append(leaf)
                self.deferred_constants[vid] = leaf
                ids.append(vid)
        outs = []
        out_ids = []
        for shape, dtype in out_types:
            vid = self._new_value()
            out_ids.append(vid)
            self.dynamic.add(vid)
            outs.append(ProgramTracer(self, vid, None, np.dtype(dtype), bound=tuple(shape)))
        self.deferred.append((op, ids, out_ids))
        return outs

    def build(self, outputs: list) -> Any:
        """Builds the `_core.Program` of the static nodes with the given output value ids."""
        pb = _core.ProgramBuilder(_ir_name(self.name))
        core_id = {}
        for vid, dtype, shape in self.args:
            core_id[vid] = pb.add_arg(dtype, shape)
        for vid, array in zip(self._constant_ids, self.constants):
            shape, dtype = global_aval(array)  # a replicated buffer with its device axis
            core_id[vid] = pb.add_arg(dtype.name, list(shape))
        for compiled, ids, out_ids in self.calls:
            results = pb.add_call(compiled, [core_id[v] for v in ids])
            core_id.update(zip(out_ids, results))
        return pb.build([core_id[v] for v in outputs])


def _untraceable_op(symbol: str) -> Callable[..., Any]:
    def op(self: "ProgramTracer", *args: Any) -> Any:
        raise self._untraceable(f"{symbol!r}")

    return op


class ProgramTracer(_TracerBase):
    """A value inside a `@pw.program` trace: a whole (sharded) array.

    Program values can only be passed to pmap'd functions and returned: any
    other computation, conversion or control flow on them raises `TracerError`,
    because a program records only calls of pmap'd functions.

    Attributes:
      shape: The global shape (leading axis over devices).
      dtype: A numpy dtype.
      ndim: `len(shape)`.
      size: The number of elements.
      aval: A short type string, e.g. "f64[2]".
    """

    __slots__ = ("_trace", "_id", "shape", "dtype", "_arg_index", "_bound")

    __array_priority__ = 1000

    def __init__(
        self,
        trace: _ProgramTrace,
        value_id: int,
        shape: Optional[tuple],
        dtype: np.dtype,
        arg_index: Optional[int] = None,
        bound: Optional[tuple] = None,
    ):
        self._trace = trace
        self._id = value_id
        self.shape = shape  # None: known only at run time (a data-dependent shape)
        self.dtype = dtype
        self._arg_index = arg_index  # index among the program's dynamic args
        self._bound = bound  # the largest shape a data-dependent one can take

    @property
    def ndim(self) -> int:
        return len(self._bound if self.shape is None else self.shape)

    @property
    def aval(self) -> str:
        if self.shape is None:
            return aval_str(("?",) * len(self._bound), self.dtype)
        return aval_str(self.shape, self.dtype)

    def __repr__(self) -> str:
        return f"ProgramTracer<{self.aval}>"

    def _escaped(self) -> TracerError:
        return TracerError(
            f"escaped tracer: a traced program value ({self.aval}) of {self._trace.where()} "
            "was used after its trace ended, or in another trace; return it from the "
            "program instead of storing it"
        )

    def _untraceable(self, what: str) -> TracerError:
        return TracerError(
            f"untraceable Python in {self._trace.where()}: {what} on a traced program value "
            f"({self.aval}). Inside a program only calls of pw.pmap functions are traced; "
            "move this computation into a pmap'd function"
        )

    def _control_flow(self, conversion: str) -> TracerError:
        return TracerError(
            f"untraceable Python in {self._trace.where()}: {conversion} of a traced program "
            f"value ({self.aval}): Python control flow on a traced value is not traceable, "
            "because the program is traced once before any data exists. Inside a program "
            "only calls of pw.pmap functions are traced; move the decision into a pmap'd "
            "function or outside the program"
        )

    __hash__ = object.__hash__

    def __bool__(self) -> bool:
        raise self._control_flow("bool()")

    def __float__(self) -> float:
        raise self._untraceable("float()")

    def __int__(self) -> int:
        raise self._untraceable("int()")

    def __complex__(self) -> complex:
        raise self._untraceable("complex()")

    def __index__(self) -> int:
        raise self._untraceable("operator.index()")

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        raise self._untraceable("np.asarray()")

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        raise self._untraceable(f"numpy function {ufunc.__name__!r}")

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        raise self._untraceable(f"numpy function {func.__name__!r}")

    def __iter__(self) -> Any:
        raise self._untraceable("iteration")

    def __getitem__(self, index: Any) -> Any:
        raise self._untraceable("indexing")

    def __len__(self) -> int:
        if self.shape is None:
            raise TypeError(f"len() of a traced program value of data-dependent shape ({self.aval})")
        if not self.shape:
            raise TypeError(f"len() of unsized traced program value ({self.aval})")
        return self.shape[0]


for _symbol, _names in {
    "+": ("__add__", "__radd__"),
    "-": ("__sub__", "__rsub__"),
    "*": ("__mul__", "__rmul__"),
    "/": ("__truediv__", "__rtruediv__"),
    "//": ("__floordiv__", "__rfloordiv__"),
    "%": ("__mod__", "__rmod__"),
    "**": ("__pow__", "__rpow__"),
    "@": ("__matmul__", "__rmatmul__"),
    "&": ("__and__", "__rand__"),
    "|": ("__or__", "__ror__"),
    "^": ("__xor__", "__rxor__"),
    "<<": ("__lshift__", "__rlshift__"),
    ">>": ("__rshift__", "__rrshift__"),
    "<": ("__lt__",),
    "<=": ("__le__",),
    ">": ("__gt__",),
    ">=": ("__ge__",),
    "==": ("__eq__",),
    "!=": ("__ne__",),
    "unary -": ("__neg__",),
    "unary +": ("__pos__",),
    "abs()": ("__abs__",),
    "~": ("__invert__",),
}.items():
    for _name in _names:
        setattr(ProgramTracer, _name, _untraceable_op(_symbol))
del _symbol, _names, _name


# --- Program ----------------------------------------------------------------

# How to rebuild one output leaf.
_FROM_OUTPUT = 0  # payload: index into the executed program's outputs
_FROM_INPUT = 1  # payload: index into the caller's dynamic leaves
_CONSTANT = 2  # payload: the value itself
_FROM_DEFERRED = 3  # payload: the value id of a deferred node's output


class _Traced(NamedTuple):
    """One cache entry of a `Program`: everything traced for a signature."""

    program: Any  # _core.Program
    lowered: Any  # _core.LoweredProgram
    out_treedef: PyTreeDef
    out_spec: tuple  # (kind, payload) per output leaf
    num_outputs: int  # program value outputs
    constants: list  # captured arrays, passed after the dynamic args
    outputs_in_order: bool  # out_spec is exactly the program's outputs, in order
    # The fallback's nodes (pathways._dynamic): (op, input refs, output ids),
    # a ref being ("output", j), ("input", k), ("constant", array) or
    # ("deferred", value id).
    deferred: tuple = ()


_POSITIONAL: dict = {}


def _positional_treedef(n: int) -> PyTreeDef:
    """The treedef of `(args, kwargs)` for `n` positional leaves and no kwargs."""
    treedef = _POSITIONAL.get(n)
    if treedef is None:
        treedef = _POSITIONAL.setdefault(n, tree_flatten((tuple(range(n)), {}))[1])
    return treedef


def _is_dynamic(leaf: Any) -> bool:
    return isinstance(leaf, (_ShardedBuffer, np.ndarray, np.generic))


class Program:
    """A Python function traced into one Pathways program by `@pw.program`.

    Calling it flattens `(args, kwargs)` into leaves:

    * `ShardedBuffer`s, numpy arrays and numpy scalars are *dynamic*: they
      become program arguments, so calls with new values of the same shapes and
      dtypes reuse the traced program.
    * Every other leaf (Python numbers, strings, None, ...) is *static*: its
      value is part of the cache key, so a new value traces the function again.
      Static leaves must be hashable.

    The function may only pass its values to pmap'd functions and return them;
    the outputs are any pytree of those values (and constants, returned as is).
    Concrete arrays given to pmap'd functions inside the program are captured
    as constants: copied to the function's devices once, when the program is
    traced, and passed again at every call (`ShardedBuffer`s are passed as
    they are).
    """

    def __init__(self, fn: Callable[..., Any], dispatch: str = "parallel"):
        functools.update_wrapper(self, fn)
        self._fn = fn
        self._dispatch = _check_dispatch(dispatch)
        self._name = getattr(fn, "__name__", type(fn).__name__)
        self._cache: dict = {}
        self._lock = threading.Lock()  # the cache's inserts; never held while tracing

    def __repr__(self) -> str:
        return f"<pw.program {self._name!r}>"

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        if obj is None:
            return self
        return functools.partial(self, obj)

    def _signature(self, args: tuple, kwargs: dict) -> tuple:
        leaves, treedef = tree_flatten((args, kwargs))
        key = [treedef]
        dynamic = []
        for i, leaf in enumerate(leaves):
            if is_jax_array(leaf):  # on the host, as a numpy array's
                leaf = leaves[i] = np.asarray(leaf)
            t = type(leaf)
            if (
                t is _ShardedBuffer
                or t is np.ndarray
                or isinstance(leaf, (_ShardedBuffer, np.ndarray, np.generic))
            ):
                dtype = leaf.dtype
                if dtype not in _SUPPORTED_DTYPES:
                    raise TypeError(
                        f"@pw.program {self._name!r}: argument {i} has dtype {dtype}; "
                        f"supported dtypes: {_SUPPORTED_DTYPE_NAMES}"
                    )
                key.append(("dyn", tuple(leaf.shape), dtype))
                dynamic.append(leaf)
            elif isinstance(leaf, _TracerBase):
                raise TracerError(
                    f"escaped tracer: @pw.program {self._name!r} got a traced value "
                    f"({leaf.aval}) as argument {i}, after its trace ended"
                )
            else:
                try:
                    hash(leaf)
                except TypeError:
                    raise TypeError(
                        f"@pw.program {self._name!r}: static argument {i} ({type(leaf).__name__}) "
                        "is not hashable; static arguments (leaves that are not arrays) are part "
                        "of the cache key"
                    ) from None
                key.append(("static", type(leaf), leaf))
        return tuple(key), leaves, treedef, dynamic

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Runs the program (tracing it first for a new signature).

        Inside another program's trace, or inside a pmap'd function, the
        function is called inline instead.

        Args:
          *args: Pytrees of arrays (dynamic) and other values (static).
          **kwargs: Same as `args`.

        Returns:
          The function's outputs: `ShardedBuffer`s (futures) for program
          values, the caller's own objects for returned inputs, and constants
          as they were returned.

        Raises:
          TypeError: For an argument of unsupported dtype or an unhashable
            static argument.
          TracerError: If the function computes on program values in Python.
          ValueError, TypeError: As raised by the pmap'd functions it calls.
        """
        st = _state
        if st.program is not None or st.function is not None:
            return self._fn(*args, **kwargs)
        # Hot path: positional array arguments need no pytree walk, then one
        # dict lookup on the signature.
        entry = None
        if not kwargs:
            for leaf in args:
                t = type(leaf)
                if t is not _ShardedBuffer and t is not np.ndarray:
                    break
            else:
                key = (_positional_treedef(len(args)),) + tuple(
                    [("dyn", x.shape, x.dtype) for x in args]
                )
                entry = self._cache.get(key)
                dynamic = args
        if entry is None:
            key, leaves, treedef, dynamic = self._signature(args, kwargs)
            entry = self._cache.get(key)
            if entry is None:
                entry = self._fill(key, leaves, treedef, dynamic)
        if entry.num_outputs:
            st = _state
            outs = entry.lowered.execute(
                # mapped_arg, inlined on the hot path
                [x if type(x) is _ShardedBuffer and not x.is_replicated else np.asarray(x, order="C")
                 for x in dynamic]
                + entry.constants,
                (st.dispatch or self._dispatch) == "sequential",
                st.client,
            )
            if entry.outputs_in_order:
                return tree_unflatten(entry.out_treedef, outs)
        else:
            outs = ()
        late = _run_deferred(entry.deferred, outs, dynamic) if entry.deferred else None
        return tree_unflatten(
            entry.out_treedef,
            [
                outs[p] if kind == _FROM_OUTPUT
                else dynamic[p] if kind == _FROM_INPUT
                else late[p] if kind == _FROM_DEFERRED
                else p
                for kind, p in entry.out_spec
            ],
        )

    def trace(self, *args: Any, **kwargs: Any) -> Any:
        """Traces the program for these arguments without running it.

        Args:
          *args: As for a call (only shapes, dtypes and static values matter).
          **kwargs: As for a call.

        Returns:
          The `_core.Program` (`.as_text()`, `.num_nodes`, `.num_args`).
        """
        return self._entry(args, kwargs).program

    def lower(self, *args: Any, **kwargs: Any) -> Any:
        """Traces and lowers the program for these arguments without running it.

        Args:
          *args: As for a call.
          **kwargs: As for a call.

        Returns:
          The `_core.LoweredProgram` (`.as_text()`, `.num_compute_steps`,
          `.num_transfer_steps`).
        """
        return self._entry(args, kwargs).lowered

    def _entry(self, args: tuple, kwargs: dict) -> _Traced:
        key, leaves, treedef, dynamic = self._signature(args, kwargs)
        entry = self._cache.get(key)
        if entry is None:
            entry = self._fill(key, leaves, treedef, dynamic)
        return entry

    def _fill(self, key: tuple, leaves: list, treedef: PyTreeDef, dynamic: list) -> _Traced:
        # Traced without a lock, as functools.lru_cache calls its function: a
        # thread calling the program while another thread's trace of the same
        # signature is under way traces it too rather than wait, since that
        # trace may itself be waiting for the thread (a deadlock). The first
        # trace to finish is kept, so every later call runs the same program.
        entry = self._trace(leaves, treedef)
        with self._lock:
            return self._cache.setdefault(key, entry)

    def _trace(self, leaves: list, treedef: PyTreeDef) -> _Traced:
        trace = _ProgramTrace(self._name)
        traced_leaves = []
        k = 0
        for leaf in leaves:
            if _is_dynamic(leaf):
                shape, dtype = tuple(leaf.shape), np.dtype(leaf.dtype)
                vid = trace.add_arg(dtype, shape)
                traced_leaves.append(ProgramTracer(trace, vid, shape, dtype, arg_index=k))
                k += 1
            else:
                traced_leaves.append(leaf)
        args, kwargs = tree_unflatten(treedef, traced_leaves)
        st = _state
        prev = st.program
        st.program = trace
        try:
            out = self._fn(*args, **kwargs)
            out_leaves, out_treedef = tree_flatten(out)
            spec = []
            out_ids: list = []
            index_of: dict = {}
            for i, leaf in enumerate(out_leaves):
                if isinstance(leaf, ProgramTracer):
                    if leaf._trace is not trace:
                        raise leaf._escaped()
                    if leaf._arg_index is not None:
                        spec.append((_FROM_INPUT, leaf._arg_index))
                        continue
                    if leaf._id in trace.dynamic:
                        spec.append((_FROM_DEFERRED, leaf._id))
                        continue
                    j = index_of.get(leaf._id)
                    if j is None:
                        j = index_of[leaf._id] = len(out_ids)
                        out_ids.append(leaf._id)
                    spec.append((_FROM_OUTPUT, j))
                elif isinstance(leaf, _TracerBase):
                    raise TracerError(
                        f"escaped tracer: {trace.where()} returns a traced value "
                        f"({leaf.aval}) of another trace as output {i}"
                    )
                else:
                    spec.append((_CONSTANT, leaf))
        finally:
            trace.active = False
            st.program = prev
        deferred = _deferred_refs(trace, out_ids, index_of)
        prog = trace.build(out_ids)
        lowered = prog.lower()
        in_order = not deferred and spec == [(_FROM_OUTPUT, j) for j in range(len(out_ids))]
        return _Traced(
            prog, lowered, out_treedef, tuple(spec), len(out_ids), list(trace.constants), in_order,
            deferred,
        )


def _deferred_refs(trace: _ProgramTrace, out_ids: list, index_of: dict) -> tuple:
    """The deferred nodes with their inputs as refs; static values they read become outputs."""
    arg_of = {vid: k for k, (vid, _, _) in enumerate(trace.args)}
    constant_of = dict(zip(trace._constant_ids, trace.constants))
    nodes = []
    for op, ids, outs in trace.deferred:
        refs = []
        for vid in ids:
            if vid in trace.dynamic:
                refs.append(("deferred", vid))
            elif vid in arg_of:
                refs.append(("input", arg_of[vid]))
            elif vid in constant_of:
                refs.append(("constant", constant_of[vid]))
            elif vid in trace.deferred_constants:
                refs.append(("constant", trace.deferred_constants[vid]))
            else:  # a static node's output: the static program returns it
                j = index_of.get(vid)
                if j is None:
                    j = index_of[vid] = len(out_ids)
                    out_ids.append(vid)
                refs.append(("output", j))
        nodes.append((op, tuple(refs), tuple(outs)))
    return tuple(nodes)


def _run_deferred(deferred: tuple, outs: Any, dynamic: Any) -> dict:
    """Runs the fallback's nodes of one call (pathways._dynamic)."""
    from pathways._dynamic import run_deferred

    def resolve(ref: tuple) -> Any:
        kind, p = ref
        return outs[p] if kind == "output" else dynamic[p] if kind == "input" else p

    return run_deferred(deferred, resolve)


_DISPATCH_MODES = ("parallel", "sequential")


def _check_dispatch(mode: str) -> str:
    if mode not in _DISPATCH_MODES:
        raise ValueError(f"dispatch must be 'parallel' or 'sequential', got {mode!r}")
    return mode


def program(fn: Optional[Callable[..., Any]] = None, *, dispatch: str = "parallel") -> Any:
    """Traces a block of Python that calls pmap'd functions into one program.

    Use as a decorator (`@pw.program`, `@pw.program(dispatch="sequential")`)
    or call (`pw.program(fn)`). Each call
    of a pmap'd function inside `fn` becomes one computation node of a
    dataflow graph; data moves between the nodes' devices (over ICI within an
    island, DCN across islands) without returning to Python (paper §3,
    Figure 2).

    Leaves of the arguments that are `ShardedBuffer`s, numpy arrays or numpy
    scalars are dynamic program arguments; every other leaf (Python numbers,
    strings, None, ...) is static, part of the cache key, and passed to `fn`
    as is. The program is traced once per signature (pytree structure, shapes
    and dtypes of the dynamic leaves, values of the static leaves); threads
    that call it for the first time at once may each trace it, and the first
    trace to finish is the one kept.

    Example:
      >>> @pw.program
      ... def f(v):
      ...     x = a(v)
      ...     return b(x), a(c(x))

    Dispatch (paper §4.5, Figure 4): with "parallel" (the default) the
    host-side work of every node (allocating its outputs, ordering it in its
    island's gang scheduler) is done when the program is called, before any
    node runs. With "sequential" each node's host-side work waits until its
    inputs are ready, as a system must when shapes depend on data; the call
    then returns once the last node is dispatched. `pw.dispatch_mode(...)`
    overrides the mode for the calls in its scope.

    Args:
      fn: A function of pytrees that only calls pmap'd functions on its array
        arguments and returns pytrees of their results.
      dispatch: "parallel" or "sequential".

    Returns:
      A `Program`; calling it runs the traced program and returns
      `ShardedBuffer`s. Without `fn`, a decorator.

    Raises:
      TypeError: If `fn` is not callable.
      ValueError: For an unknown dispatch mode.
    """
    _check_dispatch(dispatch)
    if fn is None:
        return lambda f: program(f, dispatch=dispatch)
    if not callable(fn):
        raise TypeError(f"pw.program expects a callable, got {fn!r}")
    return Program(fn, dispatch)
