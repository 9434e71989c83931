"""`pmap`: tracing, compiling and calling a function mapped over devices.

A pmap'd function is traced once per input signature (pytree structure, and
shape and dtype of every leaf) into the function IR of `_core.FunctionBuilder`,
compiled for its virtual devices, and wrapped in a one-node program (paper §3:
"we convert each compiled function into a standalone Pathways program containing
just one (sharded) computation"). Later calls with the same signature only look
up that program and execute it: this is the OpByOp hot path.

Every cache fill is guarded by a lock, so several threads may trace and run
at once.
"""

from __future__ import annotations

import functools
import re
import threading
from typing import Any, Callable, NamedTuple, Optional, Sequence

import numpy as np

from pathways import _checks, _core
from pathways._pytree import PyTreeDef, flat_tuple_treedef, tree_flatten, tree_unflatten
from pathways._trace_state import (
    _SUPPORTED_DTYPE_NAMES,
    _SUPPORTED_DTYPES,
    TracerError,
    _is_float,
    _state,
    _TracerBase,
)
from pathways._tracer import Tracer, _escaped, _FunctionTrace

__all__ = ["PmapFunction", "pmap"]

_ShardedBuffer = _core.ShardedBuffer
_VirtualDevice = _core.VirtualDevice

class _Compiled(NamedTuple):
    """One cache entry of a pmap'd function: everything traced for a signature."""

    function: Any  # _core.Function
    compiled: Any  # _core.CompiledFunction
    program: Any  # _core.Program with one call node
    lowered: Any  # _core.LoweredProgram
    out_treedef: PyTreeDef


def _ir_name(name: str) -> str:
    """A name usable in IR text: "<lambda>" -> "lambda"."""
    cleaned = re.sub(r"\W+", "_", name).strip("_")
    return cleaned or "fn"


_ACCEPTED_LEAVES = (
    "accepted: ShardedBuffers, numpy arrays, Python and numpy scalars (bool, int, float), "
    "and pytrees of them (tuples, lists, dicts, None)"
)


def _to_array(leaf: Any, where: str = "pmap", i: Optional[int] = None, what: str = "argument") -> Any:
    """A ShardedBuffer or numpy array for a concrete argument leaf.

    numpy arrays of float32, float64, int32, uint32, bool and bfloat16 keep their dtype
    (other dtypes, e.g. float16, are rejected later with the supported ones
    named); other integer arrays (numpy's default int64 included) and Python
    ints become int32, as in JAX; Python floats become float64 and bools bool.

    Args:
      leaf: The argument leaf.
      where, i, what: For messages: the function, the leaf's index and what
        leaves are called ("pmap of 'f'", 2, "argument").

    Raises:
      TypeError: For a leaf that is no array or number (a set, a generator,
        a dataclass, a str ...); it is not iterated.
      ValueError: For integers outside int32's range.
    """
    if type(leaf) is _ShardedBuffer:
        return leaf
    if isinstance(leaf, _ShardedBuffer):
        return leaf
    if isinstance(leaf, _TracerBase):
        raise TracerError(
            f"escaped tracer: a traced value ({leaf.aval}) was used after its trace ended"
        )
    arr = np.asarray(leaf)
    if arr.dtype.kind not in "biufc" and not _is_float(arr.dtype) and not isinstance(leaf, np.ndarray):
        text = repr(leaf)
        text = text if len(text) <= 60 else text[:57] + "..."
        raise TypeError(
            f"{where}: {what} {'' if i is None else f'{i} '}has type {type(leaf).__name__} "
            f"({text}), not an array or number; {_ACCEPTED_LEAVES}"
        )
    if arr.dtype.kind in "iu" and arr.dtype != np.int32 and arr.dtype != np.uint32:
        info = np.iinfo(np.int32)
        if arr.size and (arr.min() < info.min or arr.max() > info.max):
            raise ValueError(
                f"an argument of dtype {arr.dtype} has values outside the int32 range, the "
                "only integer dtype on the devices"
            )
        arr = arr.astype(np.int32)
    return arr


def _check_devices(devices: Any) -> list:
    devices = _checks.devices(
        "pmap",
        devices,
        (_VirtualDevice,),
        "virtual devices from `pw.make_virtual_device_set().add_slice(tpu_devices=n).tpus` "
        "(or that VirtualSlice)",
    )
    if not devices:
        raise ValueError("pmap: devices must hold at least one device, got an empty device list")
    return devices


class PmapFunction:
    """A function mapped over devices by `pw.pmap`; call it like the function.

    Traced and compiled once per input signature (pytree structure, shape and
    dtype of every argument leaf); later calls with the same signature reuse
    the compiled program. Inside a `@pw.program` trace, a call becomes one node
    of the program instead of running.
    """

    def __init__(
        self, fn: Callable[..., Any], devices: Optional[Sequence[Any]], axis_name: Optional[str]
    ):
        functools.update_wrapper(self, fn)
        self._fn = fn
        self._name = getattr(fn, "__name__", type(fn).__name__)
        self._devices = None if devices is None else _check_devices(devices)
        if axis_name is not None:
            _checks.string("pmap", "axis_name", axis_name)
            if not axis_name:
                raise ValueError("pmap: axis_name must be a non-empty str (or None), got ''")
        self._axis_name = axis_name
        self._cache: dict = {}
        self._lock = threading.RLock()
        self._slices: dict = {}  # devices=None: size -> VirtualSlice

    @property
    def axis_name(self) -> Optional[str]:
        """The axis name bound inside the function (for `pw.psum`), or None."""
        return self._axis_name

    @property
    def devices(self) -> Optional[list]:
        """The virtual devices the function runs on (None: allocated per call size)."""
        return None if self._devices is None else list(self._devices)

    def __repr__(self) -> str:
        return f"<pmap of {self._name!r} on {len(self._devices or ())} devices>"

    # --- Calling ------------------------------------------------------------

    def __call__(self, *args: Any) -> Any:
        """Runs the function on its devices.

        Args:
          *args: Pytrees whose leaves are `ShardedBuffer`s, numpy arrays or
            array-likes, each with a leading axis of size `len(devices)` that is
            split over the devices.

        Returns:
          The function's outputs (same pytree structure), as `ShardedBuffer`s
          whose leading axis runs over the devices. They are futures: the call
          returns once the work is dispatched.

        Raises:
          ValueError: A leaf is a scalar or has the wrong leading axis, or the
            traced computation has mismatched shapes.
          TypeError: A leaf has an unsupported dtype, the function was called
            with the wrong number of arguments, or this is a nested pmap.
          TracerError: The function uses Python that cannot be traced.
        """
        st = _state
        if st.function is not None:
            raise TypeError(
                f"nested pmap is not supported: {self._name!r} was called inside "
                f"{st.function.where()}"
            )
        if st.program is not None:
            return st.program.stage_pmap(self, args)
        # Hot path (OpByOp): arguments that are all arrays need no pytree walk,
        # then one dict lookup on the signature.
        for leaf in args:
            t = type(leaf)
            if t is not _ShardedBuffer and t is not np.ndarray:
                leaves, treedef = tree_flatten(args)
                break
        else:
            leaves, treedef = args, flat_tuple_treedef(len(args))
        for leaf in leaves:
            t = type(leaf)
            if t is not _ShardedBuffer and t is not np.ndarray:
                return self._call_slow(list(leaves), treedef)
        entry = self._cache.get((treedef, tuple([(x.shape, x.dtype) for x in leaves])))
        if entry is None:
            return self._call_slow(leaves, treedef)
        outs = entry.lowered.execute(
            [x if type(x) is _ShardedBuffer else np.ascontiguousarray(x) for x in leaves],
            False,
            _state.client,
        )
        return tree_unflatten(entry.out_treedef, outs)

    def _call_slow(self, leaves: list, treedef: PyTreeDef) -> Any:
        arrays = self._arrays(leaves)
        avals = [(tuple(x.shape), np.dtype(x.dtype)) for x in arrays]
        entry = self.get_compiled(treedef, avals)
        outs = entry.lowered.execute(
            [x if isinstance(x, _ShardedBuffer) else np.ascontiguousarray(x) for x in arrays],
            False,
            _state.client,
        )
        return tree_unflatten(entry.out_treedef, outs)

    def _arrays(self, leaves: list) -> list:
        where = f"pmap of {self._name!r}"
        return [_to_array(x, where, i) for i, x in enumerate(leaves)]

    def _prepare(self, args: tuple) -> tuple:
        leaves, treedef = tree_flatten(args)
        arrays = self._arrays(leaves)
        return treedef, [(tuple(x.shape), np.dtype(x.dtype)) for x in arrays]

    def as_text(self, *args: Any) -> str:
        """Returns the function IR traced for these arguments (without running it).

        Args:
          *args: Arguments as for a call (only their shapes and dtypes matter).

        Returns:
          The IR text of one shard's computation.
        """
        return self.get_compiled(*self._prepare(args)).function.as_text()

    def compiled(self, *args: Any) -> Any:
        """Returns the compiled function for these arguments (without running it).

        Args:
          *args: Arguments as for a call (only their shapes and dtypes matter).

        Returns:
          The `_core.CompiledFunction`.
        """
        return self.get_compiled(*self._prepare(args)).compiled

    # --- Tracing and compiling ----------------------------------------------

    def check_avals(self, avals: Sequence[tuple]) -> int:
        """Validates argument leaf types; returns the number of devices.

        Args:
          avals: `(global shape, numpy dtype)` per argument leaf.

        Returns:
          The number of devices the call maps over.

        Raises:
          ValueError: For a scalar leaf or a wrong leading axis.
          TypeError: For an unsupported dtype.
        """
        name = self._name
        if self._devices is not None:
            n = len(self._devices)
        elif avals and avals[0][0]:
            n = avals[0][0][0]
        elif avals:
            raise ValueError(
                f"pmap of {name!r} (devices=None) got a scalar for argument 0; its leading "
                "axis sets the number of devices"
            )
        else:
            raise ValueError(
                f"pmap of {name!r} with devices=None needs at least one argument, whose "
                "leading axis sets the number of devices"
            )
        for i, (shape, dtype) in enumerate(avals):
            if not shape:
                raise ValueError(f"pmap of {name!r} over {n} devices got a scalar for argument {i}")
            if shape[0] != n:
                raise ValueError(
                    f"pmap of {name!r} over {n} devices got leading axis of size {shape[0]} "
                    f"for argument {i}"
                )
            if dtype not in _SUPPORTED_DTYPES:
                raise TypeError(
                    f"pmap of {name!r}: argument {i} has dtype {dtype}; supported dtypes: "
                    f"{_SUPPORTED_DTYPE_NAMES}"
                )
        return n

    def _devices_for(self, n: int) -> list:
        if self._devices is not None:
            return self._devices
        vslice = self._slices.get(n)
        if vslice is None:
            from pathways._devices import make_virtual_device_set

            vslice = make_virtual_device_set().add_slice(tpu_devices=n)
            self._slices[n] = vslice
        return vslice.devices

    def cached(self, key: Any, make: Callable[[], Any]) -> Any:
        """The cache entry for `key`, made by `make()` (under the lock) on a miss.

        Holds the compiled entries of calls (keyed by signature) and of what is
        derived from the function (`pw.vjp`'s forward and backward functions,
        keyed by a tuple starting with its kind).
        """
        entry = self._cache.get(key)
        if entry is None:
            with self._lock:
                entry = self._cache.get(key)
                if entry is None:
                    entry = self._cache[key] = make()
        return entry

    def get_compiled(self, treedef: PyTreeDef, avals: Sequence[tuple]) -> _Compiled:
        """Returns the cache entry for a signature, tracing and compiling on a miss.

        Args:
          treedef: The structure of the arguments.
          avals: `(global shape, numpy dtype)` per argument leaf.

        Returns:
          The compiled function, its one-node program and the output structure.

        Raises:
          As `__call__`.
        """
        key = (treedef, tuple([(tuple(s), np.dtype(d)) for s, d in avals]))
        entry = self._cache.get(key)
        if entry is not None:
            return entry
        n = self.check_avals(avals)
        return self.cached(key, lambda: self._trace_and_compile(treedef, avals, n))

    def new_trace(self, n: int, suffix: str = "") -> _FunctionTrace:
        """A function trace (not yet current) over `n` devices, named after the function."""
        b = _core.FunctionBuilder(_ir_name(self._name) + suffix, self._axis_name or "")
        b.set_axis_size(n)
        return _FunctionTrace(b, self._name, self._axis_name)

    def output_ids(self, trace: _FunctionTrace, leaves: Sequence[Any], what: str = "output") -> list:
        """The value ids of the function's output leaves; constants are added to `trace`.

        Raises:
          TracerError: For a traced value of another trace.
          TypeError: For a leaf that is neither a traced value nor a number.
        """
        ids = []
        for i, leaf in enumerate(leaves):
            if isinstance(leaf, Tracer):
                if leaf._trace is not trace:
                    raise _escaped(leaf)
                ids.append(leaf._id)
            elif isinstance(leaf, _TracerBase):
                raise TracerError(
                    f"pmap of {self._name!r} returns a traced program value ({leaf.aval}) "
                    f"as {what} {i}; pass program values as arguments instead of closing "
                    "over them"
                )
            else:
                try:
                    ids.append(trace.constant(leaf, None)._id)
                except (TypeError, ValueError) as e:
                    raise TypeError(
                        f"pmap of {self._name!r}: {what} {i} is neither a traced value nor "
                        f"a numeric constant: {leaf!r} ({e})"
                    ) from None
        return ids

    def _trace_and_compile(self, treedef: PyTreeDef, avals: Sequence[tuple], n: int) -> _Compiled:
        trace = self.new_trace(n)
        b = trace.builder
        st = _state
        prev = st.function
        st.function = trace
        try:
            out = self._fn(*tree_unflatten(treedef, parameters(trace, avals)))
            out_leaves, out_treedef = tree_flatten(out)
            out_ids = self.output_ids(trace, out_leaves)
        finally:
            trace.active = False
            st.function = prev
        if not out_ids:
            raise ValueError(
                f"pmap of {self._name!r} returns no values (output structure {out_treedef}); "
                "a compiled function needs at least one output"
            )
        return compile_one_node(b.build(out_ids), self._devices_for(n), avals, out_treedef)


def parameters(trace: _FunctionTrace, avals: Sequence[tuple]) -> list:
    """One parameter of `trace` per argument leaf: its shard, the leading axis removed."""
    b = trace.builder
    return [Tracer(trace, b.parameter(np.dtype(d).name, list(s[1:]))) for s, d in avals]


def compile_one_node(
    function: Any, devices: list, avals: Sequence[tuple], out_treedef: PyTreeDef
) -> _Compiled:
    """Compiles `function` for `devices`, wrapped in a one-node program taking `avals`."""
    compiled = _core.compile(function, devices)
    pb = _core.ProgramBuilder(function.name)
    arg_ids = [pb.add_arg(np.dtype(dtype).name, list(shape)) for shape, dtype in avals]
    program = pb.build(pb.add_call(compiled, arg_ids))
    return _Compiled(function, compiled, program, program.lower(), out_treedef)


def pmap(
    fn: Callable[..., Any],
    devices: Optional[Sequence[Any]] = None,
    axis_name: Optional[str] = None,
) -> PmapFunction:
    """Maps `fn` over devices, like `jax.pmap` (SPMD over a virtual slice).

    Every argument leaf has a leading axis of size `len(devices)` that is split
    over the devices: device `i` runs `fn` on `x[i]` for every leaf `x`. The
    outputs are stacked back along a new leading axis.

    Example:
      >>> tpus = pw.make_virtual_device_set().add_slice(tpu_devices=2).tpus
      >>> f = pw.pmap(lambda x: x - pw.psum(x, "i") / 2., devices=tpus, axis_name="i")
      >>> f(np.array([1., 3.]))
      array([-1.,  1.])

    Args:
      fn: The per-device function. Its arguments and outputs are pytrees
        (tuples, lists, dicts, None) of arrays; it is traced once per input
        signature, so it must not branch on array values.
      devices: Virtual devices, e.g. `slice.tpus` from
        `pw.make_virtual_device_set().add_slice(tpu_devices=n)` (or that
        `VirtualSlice`). If None, a slice of `n` TPUs is allocated (and
        cached) on first call, with `n` the leading axis size of the first
        argument.
      axis_name: The name of the mapped axis, for collectives like
        `pw.psum`: a non-empty str, or None.

    Returns:
      A `PmapFunction` wrapping `fn`.

    Raises:
      TypeError: If `fn` is not callable, `devices` holds anything but
        `VirtualDevice`s (e.g. physical devices from `pw.devices()`), or
        `axis_name` is not a str.
      ValueError: If `devices` or `axis_name` is empty.
    """
    if not callable(fn):
        raise TypeError(f"pmap expects a callable, got {fn!r}")
    return PmapFunction(fn, devices, axis_name)
