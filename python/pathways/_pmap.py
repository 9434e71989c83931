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
import threading
from typing import Any, Callable, NamedTuple, Optional, Sequence

import numpy as np

from pathways import _checks, _core, _jax_frontend
from pathways._checks import _to_array
from pathways._devices import checked_devices, make_virtual_device_set
from pathways._pytree import (
    PyTreeDef,
    broadcast_prefix,
    flat_tuple_treedef,
    tree_flatten,
    tree_leaves,
    tree_unflatten,
)
from pathways._trace_state import (
    _SUPPORTED_DTYPE_NAMES,
    _SUPPORTED_DTYPES,
    TracerError,
    _state,
    _TracerBase,
    set_front_end_pmap,
)
from pathways._tracer import Tracer, WeakTracer, _escaped, _FunctionTrace, _ir_name

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


def global_aval(x: Any) -> tuple:
    """`(shape, dtype)` of a leaf as the compiled function's program takes it: a
    replicated `ShardedBuffer` with its device axis (its buffer's shape)."""
    if type(x) is _ShardedBuffer and x.is_replicated:
        return (len(x.devices),) + tuple(x.shape), np.dtype(x.dtype)
    return tuple(x.shape), np.dtype(x.dtype)


def mapped_arg(x: Any) -> Any:
    """An argument leaf for a program that maps it over its leading axis: a
    mapped `ShardedBuffer` as it is, anything else (a replicated buffer too:
    its value) as a C-contiguous numpy array."""
    if type(x) is _ShardedBuffer and not x.is_replicated:
        return x
    return np.asarray(x, order="C")  # (ascontiguousarray makes a 0-d array 1-d)


def _check_devices(devices: Any) -> list:
    devices = checked_devices(
        "pmap",
        devices,
        (_VirtualDevice,),
        "virtual devices from `pw.make_virtual_device_set().add_slice(tpu_devices=n).tpus` "
        "(or that VirtualSlice)",
    )
    if not devices:
        raise ValueError("pmap: devices must hold at least one device, got an empty device list")
    return devices


def _check_axes_spec(name: str, spec: Any) -> Any:
    """`spec` (in_axes or out_axes) checked: an int, None, or a pytree of them.

    in_axes, as JAX's, is an int or None for every argument, or a tuple with
    an entry (a pytree prefix of that argument) per positional argument;
    out_axes is a pytree prefix of the output.

    Raises:
      TypeError: Naming `name`, for a leaf that is neither an int nor None
        (bool is not an int here), or an in_axes that is neither an int,
        None nor a tuple.
    """
    if name == "in_axes" and not (spec is None or type(spec) is tuple or _checks._index(spec) is not None):
        raise TypeError(
            f"pmap: in_axes must be an int, None, or a tuple with one entry per positional "
            f"argument, got {spec!r}"
        )
    for leaf in tree_leaves(spec, is_leaf=lambda x: x is None):
        if leaf is not None and _checks._index(leaf) is None:
            raise TypeError(
                f"pmap: {name} must be an int, None, or a pytree (tuple, list, dict) of them, "
                f"got {spec!r}"
            )
    return spec


def _is_zero(spec: Any) -> bool:
    return type(spec) is int and spec == 0


def _check_argnums(argnums: Any) -> tuple:
    """static_broadcasted_argnums as a tuple of ints (TypeError otherwise)."""
    return _checks.ints("pmap", "static_broadcasted_argnums", argnums)


def normalize_argnums(
    argnums: tuple, n: int, where: str, name: str = "static_broadcasted_argnums"
) -> tuple:
    """The argument positions `argnums` (parameter `name`) names in a call of `n` arguments, sorted."""
    out = set()
    for i in argnums:
        if not -n <= i < n:
            raise ValueError(
                f"{where}: {name} {argnums!r} names argument {i}, but it was called with {n} "
                "positional arguments"
            )
        out.add(i % n)
    return tuple(sorted(out))


def check_static(where: str, what: str, value: Any) -> None:
    """TypeError naming `what` unless a static argument `value` is hashable (it is part of cache keys)."""
    try:
        hash(value)
    except TypeError:
        raise TypeError(
            f"{where}: static {what} ({type(value).__name__}) is not hashable; static "
            "arguments are part of the cache key"
        ) from None


def _static_key(value: Any) -> Any:
    """A static argument as a cache key that tells apart equal values of other types.

    `2 == 2.0 == True` and they hash alike, but a function traced with one can
    differ from the function traced with another (`x + s` is int32 or
    float64), so the key holds each value's type, inside tuples too (jit's
    statics are tuples of `(position, value)`).
    """
    if type(value) is tuple:
        return (type(value), tuple(_static_key(v) for v in value))
    return (type(value), value)


def _normalize_axis(axis: int, ndim: int, where: str, what: str) -> int:
    """`axis` of a rank-`ndim` value, negative counting from the end; ValueError if out of range."""
    if not -ndim <= axis < ndim:
        raise ValueError(f"{where}: {what} {axis} is out of range for a value of rank {ndim}")
    return axis % ndim


class PmapFunction:
    """A function mapped over devices by `pw.pmap`; call it like the function.

    Traced and compiled once per input signature (pytree structure, shape and
    dtype of every argument leaf); later calls with the same signature reuse
    the compiled program. Inside a `@pw.program` trace, a call becomes one node
    of the program instead of running.
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        devices: Optional[Sequence[Any]],
        axis_name: Optional[str],
        in_axes: Any = 0,
        out_axes: Any = 0,
        static_broadcasted_argnums: Any = (),
    ):
        functools.update_wrapper(self, fn)
        self._fn = fn
        self._name = getattr(fn, "__name__", type(fn).__name__)
        self._devices = None if devices is None else _check_devices(devices)
        if axis_name is not None:
            if not isinstance(axis_name, str):
                raise TypeError(
                    f"pmap: axis_name must be a str or None, got {axis_name!r}; as in jax.pmap, "
                    "the second positional argument is axis_name: pass devices=... by keyword"
                )
            if not axis_name:
                raise ValueError("pmap: axis_name must be a non-empty str (or None), got ''")
        self._axis_name = axis_name
        self._in_axes = _check_axes_spec("in_axes", in_axes)
        self._out_axes = _check_axes_spec("out_axes", out_axes)
        self._static = _check_argnums(static_broadcasted_argnums)
        # The hot path of __call__ handles the default mapping only.
        self._default_mapping = _is_zero(in_axes) and _is_zero(out_axes) and not self._static
        self._outputs_mapped = all(
            a is not None and a == 0 for a in tree_leaves(out_axes, is_leaf=lambda x: x is None)
        )
        self._out_axes_of: dict = {}  # output treedef -> axis per output leaf
        self._cache: dict = {}
        self._lock = threading.RLock()
        self._slices: dict = {}  # devices=None: size -> VirtualSlice
        self._keyword_variants: dict = {}  # (keyword names, positional count) -> PmapFunction
        self._front_end: Optional[str] = None  # "pathways" or "jax" once traced (see `traced`)

    @property
    def default_mapping(self) -> bool:
        """Whether every argument and output is mapped over axis 0, with no static arguments."""
        return self._default_mapping

    @property
    def out_axes(self) -> Any:
        """The `out_axes` given to `pw.pmap`."""
        return self._out_axes

    @property
    def outputs_mapped(self) -> bool:
        """Whether every output is mapped over axis 0 (as a program node's outputs are)."""
        return self._outputs_mapped

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

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Runs the function on its devices.

        Args:
          *args: Pytrees whose leaves are `ShardedBuffer`s, numpy arrays or
            array-likes, each with a leading axis of size `len(devices)` that is
            split over the devices.
          **kwargs: As JAX's, mapped over their leading axis whatever `in_axes`
            says (it names the positional arguments).

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
        if kwargs:
            names = tuple(sorted(kwargs))
            return self._with_keywords(names, len(args))(*args, {k: kwargs[k] for k in names})
        st = _state
        if st.function is not None:
            raise TypeError(
                f"nested pmap is not supported: {self._name!r} was called inside "
                f"{st.function.where()}"
            )
        if st.program is not None:
            return st.program.stage_pmap(self, args)
        if not self._default_mapping:
            return self._call_mapped(args)
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
            # mapped_arg, inlined on the hot path
            [x if type(x) is _ShardedBuffer and not x.is_replicated else np.asarray(x, order="C")
             for x in leaves],
            False,
            _state.client,
        )
        return tree_unflatten(entry.out_treedef, outs)

    def _with_keywords(self, names: tuple, n: int) -> "PmapFunction":
        """This function called with `n` positional arguments and the keyword arguments
        `names`: a pmap of `fn(*args, **kwargs)` that takes the keywords as one more
        positional dict, mapped over axis 0 (as JAX maps keyword arguments). One per
        (names, n), sharing this function's devices."""
        key = (names, n)
        with self._lock:
            variant = self._keyword_variants.get(key)
            if variant is not None:
                return variant
            fn = self._fn

            def call(*args: Any) -> Any:
                return fn(*args[:-1], **args[-1])

            functools.update_wrapper(call, fn)
            if _is_zero(self._in_axes):
                in_axes: Any = 0
            elif isinstance(self._in_axes, tuple):
                if len(self._in_axes) != n:
                    raise ValueError(
                        f"pmap of {self._name!r}: in_axes {self._in_axes!r} has "
                        f"{len(self._in_axes)} entries but the call has {n} positional "
                        "arguments (keyword arguments are mapped over axis 0 apart)"
                    )
                in_axes = self._in_axes + (0,)
            else:
                in_axes = (self._in_axes,) * n + (0,)
            static = normalize_argnums(self._static, n, f"pmap of {self._name!r}")
            variant = PmapFunction(call, self._devices, self._axis_name, in_axes,
                                   self._out_axes, static)
            variant._slices = self._slices  # devices=None: the same slice per size
            self._keyword_variants[key] = variant
            return variant

    def _call_slow(self, leaves: list, treedef: PyTreeDef) -> Any:
        arrays = self._arrays(leaves)
        avals = [(tuple(x.shape), np.dtype(x.dtype)) for x in arrays]
        entry = self.get_compiled(treedef, avals)
        outs = entry.lowered.execute([mapped_arg(x) for x in arrays], False, _state.client)
        return tree_unflatten(entry.out_treedef, outs)

    # --- in_axes, out_axes and static arguments -----------------------------

    def map_arguments(self, args: tuple, program_value: Optional[type] = None) -> tuple:
        """The leaves a call passes to the compiled function, by `in_axes` and the static arguments.

        Every leaf comes out with the device axis leading: a leaf of axis 0 as
        it is; of axis k by moving axis k first (on the host); of axis None
        broadcast to every device (on the host), except a replicated
        `ShardedBuffer` already on the function's devices, which is passed as
        it is. A replicated buffer where an axis is mapped is read as its value.

        Args:
          args: The call's positional arguments.
          program_value: Inside `@pw.program`, the type of program values,
            which must be mapped over axis 0 (they are not on the host).

        Returns:
          `(treedef, leaves, statics, weak)`: the structure of the dynamic
          arguments, their leaves, the static arguments, and the positions of
          the leaves that were Python scalars, weakly typed in the trace (the
          last two are part of the cache key).

        Raises:
          ValueError: For in_axes that do not fit the arguments, an axis out of
            range, a scalar mapped over an axis, or a static argument index
            beyond the arguments.
          TypeError: For an unhashable static argument.
        """
        where = f"pmap of {self._name!r}"
        static = normalize_argnums(self._static, len(args), where)
        statics = tuple((i, args[i]) for i in static)
        for i, value in statics:
            check_static(where, f"argument {i}", value)
        dynamic = tuple(a for i, a in enumerate(args) if i not in static)
        in_axes = self._in_axes
        if type(in_axes) is tuple:
            if len(in_axes) != len(args):
                raise ValueError(
                    f"{where}: in_axes {in_axes!r} has {len(in_axes)} entries for "
                    f"{len(args)} positional arguments; as in jax.pmap, a tuple in_axes has "
                    "one entry per positional argument"
                )
            in_axes = tuple(a for i, a in enumerate(in_axes) if i not in static)
        leaves, treedef = tree_flatten(dynamic)
        axes = broadcast_prefix(in_axes, dynamic, where, "in_axes")
        n = len(self._devices) if self._devices is not None else None
        if n is None:
            for leaf, axis in zip(leaves, axes):
                if axis is not None:
                    shape = np.shape(leaf) if not isinstance(leaf, _TracerBase) else leaf.shape
                    if shape:
                        n = shape[_normalize_axis(axis, len(shape), where, "in_axes")]
                        break
            if n is None:
                raise ValueError(
                    f"{where} with devices=None needs an argument mapped by in_axes over an "
                    "axis, whose size sets the number of devices"
                )
        devices = self._devices_for(n) if program_value is None else self._devices
        weak = tuple(
            i for i, leaf in enumerate(leaves)
            if type(leaf) in (bool, int, float) and axes[i] is None
        )
        out = []
        for i, (leaf, axis) in enumerate(zip(leaves, axes)):
            if program_value is not None and isinstance(leaf, program_value):
                if axis != 0:
                    raise ValueError(
                        f"{where}: in_axes {axis!r} for argument {i}, a program value, inside "
                        "@pw.program: program values are mapped over their leading axis "
                        "(in_axes=0); other in_axes apply to concrete arguments"
                    )
                out.append(leaf)
            elif axis is None:
                out.append(self._replicate(leaf, n, devices, where, i))
            else:
                out.append(self._map_axis(leaf, axis, where, i))
        return treedef, out, statics, weak

    def _replicate(self, leaf: Any, n: int, devices: Optional[list], where: str, i: int) -> Any:
        if (
            isinstance(leaf, _ShardedBuffer)
            and leaf.is_replicated
            and devices is not None
            and leaf.devices == [d.physical for d in devices]
        ):
            return leaf
        arr = np.asarray(_to_array(leaf, where, i))
        return np.broadcast_to(arr, (n,) + arr.shape)

    def _map_axis(self, leaf: Any, axis: int, where: str, i: int) -> Any:
        if isinstance(leaf, _ShardedBuffer) and not leaf.is_replicated and axis in (0, -leaf.ndim):
            return leaf
        arr = _to_array(leaf, where, i)
        if isinstance(arr, _ShardedBuffer):
            arr = np.asarray(arr)
        if arr.ndim == 0:
            raise ValueError(
                f"{where} got a scalar for argument {i}, mapped by in_axes={axis!r}; a mapped "
                "argument needs that axis (in_axes=None gives every device the whole value)"
            )
        axis = _normalize_axis(axis, arr.ndim, where, f"in_axes for argument {i}")
        return arr if axis == 0 else np.moveaxis(arr, axis, 0)

    def map_outputs(self, out_treedef: PyTreeDef, outs: list) -> Any:
        """The call's result from the compiled function's outputs, by `out_axes`.

        An output of axis 0 is the `ShardedBuffer` as it is; of axis None, a
        replicated view of it (no copy: its value is shard 0, as JAX's
        out_axes=None the function must make it equal on every device); of
        axis k, a numpy array with the device axis moved to k (read back).
        """
        axes = self._out_axes_of.get(out_treedef)
        if axes is None:
            axes = broadcast_prefix(
                self._out_axes, tree_unflatten(out_treedef, [0] * out_treedef.num_leaves),
                f"pmap of {self._name!r}", "out_axes",
            )
            self._out_axes_of[out_treedef] = axes
        client = _state.client
        mapped = []
        for buf, axis in zip(outs, axes):
            if axis is None:
                buf = _core.replicated_view(buf, client)
            elif axis != 0:
                value = np.asarray(buf)
                axis = _normalize_axis(axis, value.ndim, f"pmap of {self._name!r}", "out_axes")
                buf = np.moveaxis(value, 0, axis)
            mapped.append(buf)
        return tree_unflatten(out_treedef, mapped)

    def _call_mapped(self, args: tuple) -> Any:
        treedef, leaves, statics, weak = self.map_arguments(args)
        arrays = self._arrays(leaves)
        entry = self.get_compiled(treedef, [global_aval(x) for x in arrays], statics, weak)
        outs = entry.lowered.execute(
            [x if isinstance(x, _ShardedBuffer) else np.ascontiguousarray(x) for x in arrays],
            False,
            _state.client,
        )
        return self.map_outputs(entry.out_treedef, outs)

    def _arrays(self, leaves: list) -> list:
        where = f"pmap of {self._name!r}"
        return [_to_array(x, where, i) for i, x in enumerate(leaves)]

    def _prepare(self, args: tuple) -> tuple:
        treedef, leaves, statics, weak = self.map_arguments(args)
        arrays = self._arrays(leaves)
        return treedef, [global_aval(x) for x in arrays], statics, weak

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

    def get_compiled(
        self, treedef: PyTreeDef, avals: Sequence[tuple], statics: tuple = (), weak: tuple = ()
    ) -> _Compiled:
        """Returns the cache entry for a signature, tracing and compiling on a miss.

        Args:
          treedef: The structure of the (dynamic) arguments.
          avals: `(global shape, numpy dtype)` per argument leaf.
          statics: `(position, value)` of each static argument.
          weak: The positions of the leaves traced as weakly typed values.

        Returns:
          The compiled function, its one-node program and the output structure.

        Raises:
          As `__call__`.
        """
        key = (treedef, tuple([(tuple(s), np.dtype(d)) for s, d in avals]))
        if statics or weak:
            key += (("static", tuple((i, _static_key(v)) for i, v in statics), weak),)
        entry = self._cache.get(key)
        if entry is not None:
            return entry
        n = self.check_avals(avals)
        return self.cached(
            key, lambda: self._trace_and_compile(treedef, avals, n, statics, weak)
        )

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

    def call_traced(self, fn: Callable[..., Any], treedef: PyTreeDef, leaves: list,
                    statics: tuple = ()) -> Any:
        """Calls `fn` (the function, as `traced` gives it) on traced argument leaves, the
        static arguments put back in place."""
        args = list(tree_unflatten(treedef, leaves))
        for i, value in statics:
            args.insert(i, value)
        return fn(*args)

    def traced(self, n: int, avals: Sequence[tuple], call: Callable[..., Any], weak: tuple = (),
               suffix: str = "") -> tuple:
        """Traces the function by the front end it is written for: `call(trace, params, fn)`.

        `call` runs with a new trace of the function current, its parameters
        (one per aval) and `fn`, which calls the function so that it traces
        there: pathways' own tracer first; if JAX's code rejects a traced value
        (pathways._jax_frontend), the function is JAX's, and `call` runs again
        in a fresh trace with `fn` tracing it by JAX and lowering its jaxpr. The
        front end found is kept for later signatures.

        Returns:
          `(trace, what call returned)`; the trace is no longer current.
        """
        st = _state
        front_ends = ("jax",) if self._front_end == "jax" else ("pathways", "jax")
        for front_end in front_ends:
            trace = self.new_trace(n, suffix)
            prev = st.function
            st.function = trace
            try:
                params = parameters(trace, avals, weak)
                if front_end == "pathways":
                    with _jax_frontend.unfiltered_jax_errors():
                        result = call(trace, params, self._fn)
                else:
                    result = call(trace, params, self._through_jax(trace, n))
                self._front_end = front_end
                return trace, result
            except Exception as e:
                if front_end == "jax" or not _jax_frontend.is_jax_function_error(e):
                    raise
            finally:
                trace.active = False
                st.function = prev
        raise AssertionError("unreachable")

    def _through_jax(self, trace: _FunctionTrace, n: int) -> Callable[..., Any]:
        where = f"pmap of {self._name!r}"
        return lambda *args: _jax_frontend.trace_with_jax(self._fn, trace, n, args, where)

    def _trace_and_compile(
        self, treedef: PyTreeDef, avals: Sequence[tuple], n: int, statics: tuple = (),
        weak: tuple = (),
    ) -> _Compiled:
        def call(trace: _FunctionTrace, params: list, fn: Callable[..., Any]) -> tuple:
            out_leaves, out_treedef = tree_flatten(self.call_traced(fn, treedef, params, statics))
            return self.output_ids(trace, out_leaves), out_treedef

        trace, (out_ids, out_treedef) = self.traced(n, avals, call, weak)
        if not out_ids:
            raise ValueError(
                f"pmap of {self._name!r} returns no values (output structure {out_treedef}); "
                "a compiled function needs at least one output"
            )
        return compile_one_node(trace.builder.build(out_ids), self._devices_for(n), avals,
                                out_treedef)


set_front_end_pmap(PmapFunction)  # for pw.grad and pw.lax, below this layer


def parameters(trace: _FunctionTrace, avals: Sequence[tuple], weak: Sequence[int] = ()) -> list:
    """One parameter of `trace` per argument leaf: its shard, the leading axis removed.

    The leaves at positions `weak` (Python scalar arguments) are weakly typed.
    """
    b = trace.builder
    return [
        (WeakTracer if i in weak else Tracer)(trace, b.parameter(np.dtype(d).name, list(s[1:])))
        for i, (s, d) in enumerate(avals)
    ]


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
    fun: Callable[..., Any],
    axis_name: Optional[str] = None,
    *,
    in_axes: Any = 0,
    out_axes: Any = 0,
    static_broadcasted_argnums: Any = (),
    devices: Optional[Sequence[Any]] = None,
) -> PmapFunction:
    """Maps `fun` over devices, as `jax.pmap` (SPMD over a virtual slice).

    By default every argument leaf has a leading axis of size `len(devices)`
    that is split over the devices: device `i` runs `fun` on `x[i]` for every
    leaf `x`, and the outputs are stacked back along a new leading axis.

    Example:
      >>> tpus = pw.make_virtual_device_set().add_slice(tpu_devices=2).tpus
      >>> f = pw.pmap(lambda x: x - pw.psum(x, "i") / 2., "i", devices=tpus)
      >>> f(np.array([1., 3.]))
      array([-1.,  1.])

    Args:
      fun: The per-device function. Its arguments and outputs are pytrees
        of arrays; it is traced once per input signature, so it must not
        branch on array values.
      axis_name: The name of the mapped axis, for collectives like
        `pw.psum`: a non-empty str, or None.
      in_axes: Which axis of each argument is mapped over the devices: an
        int or None for every argument, or a tuple with one entry per
        positional argument (a pytree prefix of it). None gives every device
        the whole value (scalars included); an axis other than 0 is moved
        first on the host, as is a `ShardedBuffer` given with None unless it
        is replicated (`is_replicated`) on the function's devices.
      out_axes: Where the device axis goes in each output, a pytree prefix of
        the outputs: 0 (a `ShardedBuffer`), None (a replicated
        `ShardedBuffer`, its value the function's output on device 0: the
        function must make it equal on every device, e.g. with `pw.psum`), or
        another axis (a numpy array, read back).
      static_broadcasted_argnums: Positions of arguments passed to `fun` as
        they are, at trace time: hashable Python values (shapes, flags), part
        of the cache key, so every new value traces again.
      devices: Virtual devices, e.g. `slice.tpus` from
        `pw.make_virtual_device_set().add_slice(tpu_devices=n)` (or that
        `VirtualSlice`). If None, a slice of `n` TPUs is allocated (and
        cached) on first call, with `n` the size of the first mapped axis.

    Returns:
      A `PmapFunction` wrapping `fun`.

    Raises:
      TypeError: If `fun` is not callable, `devices` holds anything but
        `VirtualDevice`s (e.g. physical devices from `pw.devices()`),
        `axis_name` is not a str (devices go by keyword, as in JAX), or an
        axis spec is not made of ints and None.
      ValueError: If `devices` or `axis_name` is empty.
    """
    if not callable(fun):
        raise TypeError(f"pmap expects a callable, got {fun!r}")
    return PmapFunction(fun, devices, axis_name, in_axes, out_axes, static_broadcasted_argnums)
