"""The function tracer: `pmap`, `psum` and the `Tracer` values they trace with.

A pmap'd function is traced once per input signature (pytree structure, and
shape and dtype of every leaf) into the function IR of `_core.FunctionBuilder`,
compiled for its virtual devices, and wrapped in a one-node program (paper §3:
"we convert each compiled function into a standalone Pathways program containing
just one (sharded) computation"). Later calls with the same signature only look
up that program and execute it: this is the OpByOp hot path.

Tracing state is thread-local, so several threads may trace and run at once;
every cache fill is guarded by a lock.
"""

from __future__ import annotations

import functools
import re
import threading
from typing import Any, Callable, NamedTuple, Optional, Sequence, Union

import numpy as np

from pathways import _checks, _core
from pathways._primitives import PRIMITIVES, Primitive
from pathways._pytree import PyTreeDef, flat_tuple_treedef, tree_flatten, tree_unflatten

__all__ = [
    "TracerError",
    "Tracer",
    "PmapFunction",
    "pmap",
    "psum",
    "pmean",
    "pmax",
    "pmin",
    "axis_index",
    "all_gather",
    "ppermute",
    "all_to_all",
    "psum_scatter",
    "bind",
]

_ShardedBuffer = _core.ShardedBuffer
_VirtualDevice = _core.VirtualDevice

_SUPPORTED_DTYPES = (
    np.dtype(np.float32),
    np.dtype(np.float64),
    np.dtype(np.int32),
    np.dtype(np.bool_),
)
_SUPPORTED_DTYPE_NAMES = "float32, float64, int32, bool"
_SHORT_DTYPE = {"float32": "f32", "float64": "f64", "int32": "i32", "bool": "pred"}


class TracerError(TypeError):
    """A traced value was used in a way that tracing cannot record.

    Raised for Python control flow on traced values (`if x > 0:`), conversions
    to Python or numpy values, escaped tracers (used after their trace ended),
    and computation on program values outside pmap'd functions.
    """


class _TraceState(threading.local):
    """Per-thread state: the traces under way, and how this thread's calls execute.

    At most one function trace and one program trace. `client` is the
    `_core.SchedulingClient` work is attributed to (None: the default client);
    `dispatch` overrides the dispatch mode of calls ("parallel" or
    "sequential"; None: each program's own).
    """

    function: Optional["_FunctionTrace"] = None
    program: Any = None  # a pathways._program._ProgramTrace
    client: Any = None
    dispatch: Optional[str] = None


_state = _TraceState()


def aval_str(shape: Sequence[int], dtype: Any) -> str:
    """Short type string like "f32[2,3]"."""
    name = np.dtype(dtype).name
    return f"{_SHORT_DTYPE.get(name, name)}[{','.join(str(d) for d in shape)}]"


class _TracerBase:
    """Common base of function tracers and program tracers.

    Subclasses set `shape` and `dtype`; the derived properties live here.
    """

    __slots__ = ()

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def aval(self) -> str:
        return aval_str(self.shape, self.dtype)


class _FunctionTrace:
    """One trace of a pmap'd function: its builder and whether it is still running."""

    __slots__ = ("builder", "name", "axis_name", "active", "tapes")

    def __init__(self, builder: Any, name: str, axis_name: Optional[str]):
        self.builder = builder
        self.name = name
        self.axis_name = axis_name
        self.active = True
        self.tapes: list = []  # gradient tapes recording this trace (pathways._autodiff)

    def where(self) -> str:
        return f"pmap of {self.name!r}"

    def constant(self, value: Any, like_dtype: Optional[np.dtype]) -> "Tracer":
        """Adds a constant operand of a value of dtype `like_dtype`.

        Python scalars are weakly typed: a Python int or bool takes
        `like_dtype` (int32 when `like_dtype` is bool), a Python float takes
        `like_dtype` if it is a float type and float32 otherwise; with no
        `like_dtype` (None), they get the dtype an argument would (a bool
        bool, an int int32 as in JAX, a float float64). numpy bool, int32,
        float32 and float64 values keep their dtype; other numpy integers take
        `like_dtype` if it is a float type and int32 otherwise.
        """
        b = self.builder
        like = None if like_dtype is None else np.dtype(like_dtype)
        if isinstance(value, (bool, int, float)) and not isinstance(value, np.generic):
            if like is None:
                int_dtype = np.bool_ if isinstance(value, bool) else np.int32
                dtype = np.float64 if isinstance(value, float) else int_dtype
            elif isinstance(value, float) and like.kind != "f":
                dtype = np.float32
            elif isinstance(value, int) and not isinstance(value, bool) and like.kind == "b":
                dtype = np.int32
            else:
                dtype = like
            arr = np.array(value, dtype=dtype)
        else:
            arr = np.asarray(value)
            if arr.dtype.kind in "iu" and arr.dtype != np.int32:
                arr = arr.astype(like if like is not None and like.kind == "f" else np.int32)
            elif arr.dtype not in _SUPPORTED_DTYPES:
                raise TypeError(
                    f"{self.where()}: constant of dtype {arr.dtype} is not supported; "
                    f"supported dtypes: {_SUPPORTED_DTYPE_NAMES}"
                )
            arr = np.asarray(arr, order="C")  # (ascontiguousarray makes 0-d arrays 1-d)
        return Tracer(self, b.constant(arr))


def _escaped(t: "Tracer") -> TracerError:
    return TracerError(
        f"escaped tracer: a traced value ({t.aval}) of {t._trace.where()} was used "
        "after its trace ended, or in another trace. Traced values only exist while "
        "the function is traced; return them from the function instead of storing them"
    )


def _control_flow_error(t: "Tracer", conversion: str) -> TracerError:
    return TracerError(
        f"{conversion} of a traced value ({t.aval} in {t._trace.where()}): Python control "
        "flow that depends on a traced value is not traceable, because compiled functions "
        "are traced once per input shape before any data exists; compute both branches, "
        "or move the decision outside the compiled function"
    )


def _concrete_error(t: "Tracer", conversion: str) -> TracerError:
    return TracerError(
        f"{conversion} of a traced value ({t.aval} in {t._trace.where()}): a traced value "
        "has no concrete value, because compiled functions are traced once per input shape "
        "before any data exists; return it from the function and convert the result "
        "outside the compiled function"
    )


# --- Primitives -------------------------------------------------------------
#
# Every op a function trace records goes through `bind`: it emits the op of a
# primitive (pathways._primitives) into the trace's builder and shows it to
# the trace's active gradient tapes (pathways._autodiff), which is how
# `pw.grad` sees the computation.


def bind(trace: "_FunctionTrace", prim: Union[str, Primitive], operands: Sequence["Tracer"],
         **params: Any) -> "Tracer":
    """Records primitive `prim` on `operands` (traced values of `trace`).

    Args:
      trace: The active function trace.
      prim: A `Primitive`, or its name (a key of `PRIMITIVES`).
      operands: Traced values of `trace`, checked by the caller.
      **params: The primitive's static parameters, as its emitter takes them.

    Returns:
      The traced result. When the builder returns an operand itself (e.g. a
      cast to the same dtype), no op was recorded and no tape sees one.

    Raises:
      ValueError, TypeError: From the builder, naming the op and the shapes.
    """
    p = prim if type(prim) is Primitive else PRIMITIVES[prim]
    ids = [t._id for t in operands]
    if len(ids) != p.arity and (p.arity >= 0 or not ids):
        raise TypeError(
            f"primitive {p.name!r} takes {'one or more' if p.arity < 0 else p.arity} operands, "
            f"got {len(ids)}"
        )
    out = p.emit(trace.builder, *ids, **params)
    if trace.tapes and out not in ids:
        for tape in trace.tapes:
            tape.record(p, ids, out, params)
    return Tracer(trace, out)


class Tracer(_TracerBase):
    """A value inside a function traced by `pw.pmap`: one shard's array.

    Supports `+ - * / **` (also reflected), comparisons `< <= > >= == !=`
    (giving bool values), `& | ^ ~` on bool values, unary `-`/`+`, `abs()`,
    `.astype()` and the reductions `.sum() .mean() .max() .min() .argmax()`
    (numpy's `axis` and `keepdims`), with other traced values of the same trace, Python scalars
    and numpy scalars and arrays; more ops are in `pathways.numpy`, which
    numpy's own functions call on traced values (`np.sum(x)` is
    `pathways.numpy.sum(x)`). Shapes
    broadcast as in numpy, and dtypes promote as in numpy (bool < int32 <
    float32 < float64, int32 with float32 gives float64; `/` of integers is
    float64). Python scalars are weakly typed: a Python int or bool takes the
    traced value's dtype (int32 for a bool value), a Python float takes it if
    it is a float type and float32 otherwise (so int32 + 0.5 is float64, as in
    numpy). Python control flow on a traced value (`if x > 0:`) raises
    `TracerError`, since `bool()` of a traced value has no answer.

    Attributes:
      shape: The per-shard shape (the pmap'd axis removed).
      dtype: A numpy dtype: float32, float64, int32 or bool.
      ndim: `len(shape)`.
      size: The number of elements per shard.
      aval: A short type string, e.g. "f32[3]".
    """

    __slots__ = ("_trace", "_id", "shape", "dtype")

    __array_priority__ = 1000

    # numpy functions and ufuncs of a traced value (`np.sum(x)`, `np.exp(x)`, and
    # `np_array * x`, which numpy computes with the ufunc `np.multiply`) call their
    # `pathways.numpy` namesakes, or raise TracerError naming the function.
    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        from pathways import numpy as pnp

        return pnp._numpy_ufunc(self, ufunc, method, inputs, kwargs)

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        from pathways import numpy as pnp

        return pnp._numpy_function(self, func, args, kwargs)

    def __init__(self, trace: _FunctionTrace, value_id: int):
        self._trace = trace
        self._id = value_id
        self.shape = tuple(trace.builder.shape(value_id))
        self.dtype = np.dtype(trace.builder.dtype(value_id))

    def __repr__(self) -> str:
        return f"Tracer<{self.aval}>"

    def _check(self) -> _FunctionTrace:
        trace = self._trace
        if not trace.active or _state.function is not trace:
            raise _escaped(self)
        return trace

    def _operand(self, other: Any) -> Optional["Tracer"]:
        """`other` as a traced operand (constants are added), or None if unsupported."""
        trace = self._trace
        if isinstance(other, Tracer):
            if other._trace is not trace or not other._trace.active:
                raise _escaped(other)
            return other
        if isinstance(other, _TracerBase):
            raise TracerError(
                f"{trace.where()} uses a traced program value ({other.aval}) that was not "
                "passed to it as an argument; pass program values to pmap'd functions as "
                "arguments instead of closing over them"
            )
        if isinstance(other, (bool, int, float, np.generic, np.ndarray)):
            if isinstance(other, (np.generic, np.ndarray)) and other.dtype.kind not in "biuf":
                return None
            return trace.constant(other, self.dtype)
        return None

    def _binary(self, op: str, other: Any, reflected: bool) -> Any:
        trace = self._check()
        o = self._operand(other)
        if o is None:
            return NotImplemented
        return bind(trace, op, (o, self) if reflected else (self, o))

    def __add__(self, other: Any) -> Any:
        return self._binary("add", other, False)

    def __radd__(self, other: Any) -> Any:
        return self._binary("add", other, True)

    def __sub__(self, other: Any) -> Any:
        return self._binary("sub", other, False)

    def __rsub__(self, other: Any) -> Any:
        return self._binary("sub", other, True)

    def __mul__(self, other: Any) -> Any:
        return self._binary("mul", other, False)

    def __rmul__(self, other: Any) -> Any:
        return self._binary("mul", other, True)

    def __truediv__(self, other: Any) -> Any:
        return self._binary("div", other, False)

    def __rtruediv__(self, other: Any) -> Any:
        return self._binary("div", other, True)

    def __pow__(self, other: Any) -> Any:
        return self._binary("pow", other, False)

    def __rpow__(self, other: Any) -> Any:
        return self._binary("pow", other, True)

    # Comparisons give bool traced values; `3 < x` calls `x.__gt__(3)`.
    def __lt__(self, other: Any) -> Any:
        return self._binary("lt", other, False)

    def __le__(self, other: Any) -> Any:
        return self._binary("le", other, False)

    def __gt__(self, other: Any) -> Any:
        return self._binary("gt", other, False)

    def __ge__(self, other: Any) -> Any:
        return self._binary("ge", other, False)

    def __eq__(self, other: Any) -> Any:  # type: ignore[override]
        return self._binary("eq", other, False)

    def __ne__(self, other: Any) -> Any:  # type: ignore[override]
        return self._binary("ne", other, False)

    __hash__ = object.__hash__

    def _logical(self, op: str, other: Any, reflected: bool) -> Any:
        self._check()
        others = [other] if isinstance(other, Tracer) else []
        for t in [self, *others]:
            if t.dtype != np.bool_:
                raise TypeError(
                    f"'{PRIMITIVES[op].symbol}' on traced values needs bool operands, got "
                    f"{t.aval} in {self._trace.where()}; bitwise ops on integers are not "
                    "supported yet"
                )
        return self._binary(op, other, reflected)

    def __and__(self, other: Any) -> Any:
        return self._logical("and", other, False)

    def __rand__(self, other: Any) -> Any:
        return self._logical("and", other, True)

    def __or__(self, other: Any) -> Any:
        return self._logical("or", other, False)

    def __ror__(self, other: Any) -> Any:
        return self._logical("or", other, True)

    def __xor__(self, other: Any) -> Any:
        return self._logical("xor", other, False)

    def __rxor__(self, other: Any) -> Any:
        return self._logical("xor", other, True)

    def _unary(self, op: str) -> "Tracer":
        trace = self._check()
        return bind(trace, op, (self,))

    def __invert__(self) -> "Tracer":
        self._check()
        if self.dtype != np.bool_:
            raise TypeError(
                f"'~' on traced values needs a bool operand, got {self.aval} in "
                f"{self._trace.where()}; bitwise ops on integers are not supported yet"
            )
        return self._unary("not")

    def __neg__(self) -> "Tracer":
        trace = self._check()
        return bind(trace, "neg", (self,))

    def __pos__(self) -> "Tracer":
        self._check()
        return self

    def __abs__(self) -> "Tracer":
        return self._unary("abs")

    def astype(self, dtype: Any) -> "Tracer":
        """Casts to `dtype` (float32, float64, int32 or bool), like numpy's `astype`.

        Float to int32 truncates toward zero; to bool is `x != 0`.

        Raises:
          TypeError: For an unsupported dtype.
        """
        trace = self._check()
        dt = np.dtype(dtype)
        if dt not in _SUPPORTED_DTYPES:
            raise TypeError(
                f"astype of a traced value ({self.aval} in {trace.where()}) to {dt}: "
                f"supported dtypes: {_SUPPORTED_DTYPE_NAMES}"
            )
        return bind(trace, "convert", (self,), dtype=dt.name)

    # --- Reductions (numpy semantics) ---------------------------------------

    def _reduce(self, op: str, axis: Any, keepdims: bool) -> "Tracer":
        trace = self._check()
        axes = _checks.axes(op, "axis", axis)
        return bind(trace, "reduce", (self,), kind=op, axes=None if axes is None else list(axes),
                    keepdims=bool(keepdims))

    def sum(self, axis: Any = None, keepdims: bool = False) -> "Tracer":
        """Sum over `axis` (None, int or tuple), as numpy; bool/int32 sum to int32."""
        return self._reduce("sum", axis, keepdims)

    def mean(self, axis: Any = None, keepdims: bool = False) -> "Tracer":
        """Mean over `axis`, as numpy; bool/int32 give float64."""
        return self._reduce("mean", axis, keepdims)

    def max(self, axis: Any = None, keepdims: bool = False) -> "Tracer":
        """Maximum over `axis`, as numpy (NaN-propagating)."""
        return self._reduce("max", axis, keepdims)

    def min(self, axis: Any = None, keepdims: bool = False) -> "Tracer":
        """Minimum over `axis`, as numpy (NaN-propagating)."""
        return self._reduce("min", axis, keepdims)

    def argmax(self, axis: Any = None, keepdims: bool = False) -> "Tracer":
        """Index of the first maximum along `axis` (None: flattened), as int32."""
        return self._reduce("argmax", _checks.optional_index("argmax", "axis", axis), keepdims)

    # --- Not traceable (yet) ------------------------------------------------

    def _unsupported(self, what: str) -> TracerError:
        self._check()
        return TracerError(
            f"{what} on traced values ({self.aval} in {self._trace.where()}) is not supported "
            "yet; supported operations: + - * / ** @ comparisons & | ^ ~ abs() .astype(), "
            "indexing, .reshape() .transpose() .T, .sum() .mean() .max() .min() .argmax(), "
            "pathways.numpy, pathways.nn, pw.psum and the other collectives"
        )

    def __floordiv__(self, other: Any) -> Any:
        raise self._unsupported("'//'")

    __rfloordiv__ = __floordiv__

    def __mod__(self, other: Any) -> Any:
        raise self._unsupported("'%'")

    __rmod__ = __mod__

    def __matmul__(self, other: Any) -> Any:
        from pathways import numpy as pnp  # Local: pathways.numpy imports this module.

        self._check()
        return pnp.matmul(self, other)

    def __rmatmul__(self, other: Any) -> Any:
        from pathways import numpy as pnp

        self._check()
        return pnp.matmul(other, self)

    # --- Shapes (numpy semantics; see pathways.numpy) -------------------------

    def reshape(self, *shape: Any) -> "Tracer":
        """numpy's `reshape`: `x.reshape(2, 3)` or `x.reshape((2, -1))`."""
        from pathways import numpy as pnp

        return pnp.reshape(self, shape[0] if len(shape) == 1 else shape)

    def transpose(self, *axes: Any) -> "Tracer":
        """numpy's `transpose`: reversed dims, or `x.transpose(1, 0, 2)`."""
        from pathways import numpy as pnp

        if len(axes) == 1 and isinstance(axes[0], (tuple, list)):
            axes = tuple(axes[0])
        return pnp.transpose(self, axes or None)

    @property
    def T(self) -> "Tracer":  # noqa: N802 (numpy's name)
        """The transpose (dimensions reversed)."""
        return self.transpose()

    def swapaxes(self, axis1: int, axis2: int) -> "Tracer":
        """numpy's `swapaxes`."""
        from pathways import numpy as pnp

        return pnp.swapaxes(self, axis1, axis2)

    def squeeze(self, axis: Any = None) -> "Tracer":
        """numpy's `squeeze`."""
        from pathways import numpy as pnp

        return pnp.squeeze(self, axis)

    def ravel(self) -> "Tracer":
        """numpy's `ravel`: a 1-d value, row-major."""
        from pathways import numpy as pnp

        return pnp.ravel(self)

    flatten = ravel

    def clip(self, a_min: Any = None, a_max: Any = None) -> "Tracer":
        """numpy's `clip`."""
        from pathways import numpy as pnp

        return pnp.clip(self, a_min, a_max)

    def var(self, axis: Any = None, keepdims: bool = False) -> "Tracer":
        """numpy's `var` (ddof=0)."""
        from pathways import numpy as pnp

        return pnp.var(self, axis, keepdims)

    def std(self, axis: Any = None, keepdims: bool = False) -> "Tracer":
        """numpy's `std` (ddof=0)."""
        from pathways import numpy as pnp

        return pnp.std(self, axis, keepdims)

    def take(self, indices: Any, axis: Any = None, mode: Optional[str] = None,
             fill_value: Any = None) -> "Tracer":
        """numpy's `take`, with JAX's modes (see `pathways.numpy.take`)."""
        from pathways import numpy as pnp

        return pnp.take(self, indices, axis, mode, fill_value)

    def __bool__(self) -> bool:
        raise _control_flow_error(self, "bool()")

    def __int__(self) -> int:
        raise _concrete_error(self, "int()")

    def __float__(self) -> float:
        raise _concrete_error(self, "float()")

    def __complex__(self) -> complex:
        raise _concrete_error(self, "complex()")

    def __index__(self) -> int:
        raise _concrete_error(self, "operator.index()")

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        raise TracerError(
            f"np.asarray() of a traced value ({self.aval} in {self._trace.where()}): numpy "
            "cannot compute on traced values, which have no data while the function is "
            "traced; use the traced value's operators (+ - * / ...) or pathways.numpy "
            "functions instead of numpy functions"
        )

    def __iter__(self) -> Any:
        self._check()
        if not self.shape:
            raise TracerError(f"iteration over a 0-d traced value ({self.aval})")
        return (self[i] for i in range(self.shape[0]))

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError(f"len() of unsized traced value ({self.aval})")
        return self.shape[0]

    def __getitem__(self, index: Any) -> Any:
        """numpy basic indexing with static indices (ints, slices, None, '...'), plus one
        integer array or int32 traced value (a `take`)."""
        from pathways import numpy as pnp

        return pnp._getitem(self, index)


# --- pmap -----------------------------------------------------------------


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

    numpy arrays of float32, float64, int32 and bool keep their dtype (other
    dtypes, e.g. float16, are rejected later with the supported ones named);
    other integer arrays (numpy's default int64 included) and Python ints
    become int32, as in JAX; Python floats become float64 and bools bool.

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
    if arr.dtype.kind not in "biufc" and not isinstance(leaf, np.ndarray):
        text = repr(leaf)
        text = text if len(text) <= 60 else text[:57] + "..."
        raise TypeError(
            f"{where}: {what} {'' if i is None else f'{i} '}has type {type(leaf).__name__} "
            f"({text}), not an array or number; {_ACCEPTED_LEAVES}"
        )
    if arr.dtype.kind in "iu" and arr.dtype != np.int32:
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
        with self._lock:
            entry = self._cache.get(key)
            if entry is None:
                entry = self._trace_and_compile(treedef, avals, self._devices_for(n))
                self._cache[key] = entry
        return entry

    def _trace_and_compile(
        self, treedef: PyTreeDef, avals: Sequence[tuple], devices: list
    ) -> _Compiled:
        ir_name = _ir_name(self._name)
        b = _core.FunctionBuilder(ir_name, self._axis_name or "")
        b.set_axis_size(len(devices))
        trace = _FunctionTrace(b, self._name, self._axis_name)
        st = _state
        prev = st.function
        st.function = trace
        try:
            params = [
                Tracer(trace, b.parameter(np.dtype(dtype).name, list(shape[1:])))
                for shape, dtype in avals
            ]
            out = self._fn(*tree_unflatten(treedef, params))
            out_leaves, out_treedef = tree_flatten(out)
            out_ids = []
            for i, leaf in enumerate(out_leaves):
                if isinstance(leaf, Tracer):
                    if leaf._trace is not trace:
                        raise _escaped(leaf)
                    out_ids.append(leaf._id)
                elif isinstance(leaf, _TracerBase):
                    raise TracerError(
                        f"pmap of {self._name!r} returns a traced program value ({leaf.aval}) "
                        f"as output {i}; pass program values as arguments instead of closing "
                        "over them"
                    )
                else:
                    try:
                        out_ids.append(trace.constant(leaf, None)._id)
                    except (TypeError, ValueError) as e:
                        raise TypeError(
                            f"pmap of {self._name!r}: output {i} is neither a traced value nor "
                            f"a numeric constant: {leaf!r} ({e})"
                        ) from None
        finally:
            trace.active = False
            st.function = prev
        if not out_ids:
            raise ValueError(
                f"pmap of {self._name!r} returns no values (output structure {out_treedef}); "
                "a compiled function needs at least one output"
            )
        function = b.build(out_ids)
        compiled = _core.compile(function, devices)
        pb = _core.ProgramBuilder(ir_name)
        arg_ids = [pb.add_arg(np.dtype(dtype).name, list(shape)) for shape, dtype in avals]
        out_values = pb.add_call(compiled, arg_ids)
        program = pb.build(out_values)
        lowered = program.lower()
        return _Compiled(function, compiled, program, lowered, out_treedef)


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


def _bound_trace(name: str, axis_name: str) -> "_FunctionTrace":
    """The active trace if it binds `axis_name`; NameError otherwise."""
    trace = _state.function
    if trace is None:
        raise NameError(
            f"unbound axis name: {axis_name!r} ({name} must be called inside a function "
            f"traced by pw.pmap with axis_name={axis_name!r})"
        )
    if trace.axis_name is None or axis_name != trace.axis_name:
        bound = "no axis name" if trace.axis_name is None else repr(trace.axis_name)
        raise NameError(f"unbound axis name: {axis_name!r} ({trace.where()} binds {bound})")
    return trace


def _pcollective(name: str, x: Any, axis_name: str) -> Any:
    return _map_leaves(name, x, axis_name)


def pmean(x: Any, axis_name: str) -> Any:
    """Mean of `x` over the devices of axis `axis_name`, like `jax.lax.pmean`.

    A float leaf keeps its type. An integer leaf (int32, or a Python int or
    bool) gives float64: like JAX's `psum(x) / n`, the mean is not truncated.

    Raises:
      NameError: If `axis_name` is not bound by the enclosing pmap.
      TypeError: For a bool array leaf.
    """
    leaves, treedef = tree_flatten(x)

    def mean(leaf: Any) -> Any:
        if isinstance(leaf, int) and not isinstance(leaf, np.generic):
            leaf = float(leaf)  # a Python int or bool: JAX's psum(x) / n
        dtype = leaf.dtype if isinstance(leaf, Tracer) else np.asarray(leaf).dtype
        if np.issubdtype(dtype, np.integer):
            return _pcollective("psum", leaf, axis_name) / _pcollective("psum", 1, axis_name)
        return _pcollective("pmean", leaf, axis_name)

    return tree_unflatten(treedef, [mean(leaf) for leaf in leaves])


def pmax(x: Any, axis_name: str) -> Any:
    """Elementwise maximum of `x` over the devices of axis `axis_name`, like `jax.lax.pmax`."""
    return _pcollective("pmax", x, axis_name)


def pmin(x: Any, axis_name: str) -> Any:
    """Elementwise minimum of `x` over the devices of axis `axis_name`, like `jax.lax.pmin`."""
    return _pcollective("pmin", x, axis_name)


def axis_index(axis_name: str) -> Tracer:
    """The index of this device along the pmap'd axis `axis_name` (an int32 scalar).

    Raises:
      NameError: If `axis_name` is not bound by the enclosing pmap.
    """
    trace = _bound_trace("axis_index", axis_name)
    return bind(trace, "axis_index", (), axis_name=axis_name)


def _map_leaves(name: str, x: Any, axis_name: str, **params: Any) -> Any:
    """Binds collective `name` over axis `axis_name` to every leaf of pytree `x`."""
    trace = _bound_trace(name, axis_name)
    leaves, treedef = tree_flatten(x)
    out = []
    for leaf in leaves:
        if isinstance(leaf, Tracer):
            leaf._check()
        elif isinstance(leaf, _TracerBase):
            raise TracerError(
                f"{name} of a traced program value ({leaf.aval}) inside {trace.where()}; pass "
                "program values to pmap'd functions as arguments"
            )
        else:
            leaf = trace.constant(leaf, None)
        out.append(bind(trace, name, (leaf,), axis_name=axis_name, **params))
    return tree_unflatten(treedef, out)


def all_gather(x: Any, axis_name: str, axis: int = 0) -> Any:
    """Every device's `x` stacked along a new axis `axis`, like `jax.lax.all_gather`.

    The new axis has size the number of devices of the pmap; entry `i` is the
    value of device `i`.

    Raises:
      NameError: If `axis_name` is not bound by the enclosing pmap.
      ValueError: If `axis` is out of range.
    """
    a = _checks.index("all_gather", "axis", axis)
    return _map_leaves("all_gather", x, axis_name, axis=a)


def ppermute(x: Any, axis_name: str, perm: Sequence[tuple]) -> Any:
    """Sends `x` from device `source` to device `destination` for each pair of `perm`.

    Like `jax.lax.ppermute`: devices that are no pair's destination receive
    zeros. Each source and destination may appear at most once.

    Raises:
      TypeError: If `perm` is not a sequence of pairs of ints.
      NameError: If `axis_name` is not bound by the enclosing pmap.
      ValueError: For an out-of-range or repeated source or destination.
    """
    return _map_leaves("ppermute", x, axis_name, perm=_checks.int_pairs("ppermute", "perm", perm))


def all_to_all(x: Any, axis_name: str, split_axis: int, concat_axis: int) -> Any:
    """Exchanges chunks between the devices, like `jax.lax.all_to_all`.

    Each device splits `x` along `split_axis` into as many equal chunks as
    there are devices and sends chunk `i` to device `i`; each device joins the
    chunks it receives along `concat_axis`, in device order. The result's
    `split_axis` is that many times shorter and its `concat_axis` that many
    times longer.

    Raises:
      NameError: If `axis_name` is not bound by the enclosing pmap.
      ValueError: If an axis is out of range or `split_axis` does not divide
        by the number of devices.
    """
    return _map_leaves(
        "all_to_all",
        x,
        axis_name,
        split_axis=_checks.index("all_to_all", "split_axis", split_axis),
        concat_axis=_checks.index("all_to_all", "concat_axis", concat_axis),
    )


def psum_scatter(x: Any, axis_name: str, scatter_dimension: int = 0) -> Any:
    """Sums `x` over the devices and leaves each device one slice, like `jax.lax.psum_scatter`.

    `x.shape[scatter_dimension]` must equal the number of devices; device `i`
    gets the sum over devices of `x` indexed `i` along that dimension (which
    the result drops). It is the transpose of `all_gather`.

    Raises:
      NameError: If `axis_name` is not bound by the enclosing pmap.
      ValueError: If the dimension is out of range or its size is not the
        number of devices.
    """
    return _map_leaves(
        "psum_scatter",
        x,
        axis_name,
        scatter_dimension=_checks.index("psum_scatter", "scatter_dimension", scatter_dimension),
    )


def psum(x: Any, axis_name: str) -> Any:
    """Sums `x` over all devices of the pmap'd axis `axis_name`, like `jax.lax.psum`.

    Args:
      x: A pytree of traced values (or numeric constants, which count once per
        device).
      axis_name: The `axis_name` given to the enclosing `pw.pmap`.

    Returns:
      A pytree like `x` whose leaves hold, on every device, the sum of that
      leaf over all devices.

    Raises:
      NameError: If `axis_name` is not bound by the enclosing pmap, or there is
        no enclosing pmap.
    """
    return _map_leaves("psum", x, axis_name)


def simulated_compute(x: Any, microseconds: float) -> Any:
    """A simulated kernel: keeps the devices busy without using a CPU core.

    Inside a pmap'd function, returns `x` unchanged and makes every run of the
    function hold its devices for at least `microseconds` from its start, as
    if a TPU were running a kernel of that duration: a gang lasts
    max(its real kernels, the total simulated time). Other gangs cannot use
    the devices meanwhile, and no host CPU is used while they wait. Use it for
    scheduling and dispatch experiments with many devices on a small machine.

    Args:
      x: A traced value (or pytree of them) of the enclosing pmap'd function.
      microseconds: Simulated device time: a finite number from 0 to
        3.6e9 (one hour). The durations of one function add up, and their
        total is limited to one hour too.

    Returns:
      `x`, unchanged.

    Raises:
      TracerError: Outside a function traced by `pw.pmap`.
      TypeError: If `microseconds` is not a number.
      ValueError: For a negative, NaN, infinite or too long duration, or a
        function whose total simulated time exceeds one hour.
    """
    microseconds = _checks.real("simulated_compute", "microseconds", microseconds)
    trace = _state.function
    if trace is None:
        raise TracerError(
            "simulated_compute must be called inside a function traced by pw.pmap"
        )
    leaves, treedef = tree_flatten(x)
    out = []
    for leaf in leaves:
        if not isinstance(leaf, Tracer):
            raise TracerError(
                f"simulated_compute in {trace.where()} needs traced values, got {type(leaf).__name__}"
            )
        leaf._check()
        out.append(bind(trace, "simulated_compute", (leaf,), microseconds=microseconds))
    return tree_unflatten(treedef, out)
