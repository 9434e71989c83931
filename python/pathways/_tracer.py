"""The values of a function trace: `Tracer` and its operators, the trace, `bind`, `stop_gradient`.

Every op a function trace records goes through `bind`: it emits the op of a
primitive (pathways._primitives) into the trace's builder and shows it to the
trace's active gradient tapes (pathways._autodiff), which is how `pw.grad`
sees the computation.

This is the core layer: it imports no transformation, op library or front
end. `Tracer`'s methods and operators that pathways.numpy implements are
installed on the class by pathways.numpy._methods.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Optional, Sequence, Union

import numpy as np

from pathways import _checks
from pathways._primitives import PRIMITIVES, Primitive
from pathways._pytree import tree_map
from pathways._trace_state import (
    JaxValueInPathwaysTrace,
    _SUPPORTED_DTYPE_NAMES,
    _SUPPORTED_DTYPES,
    TracerError,
    _is_float,
    _state,
    _TracerBase,
)

__all__ = ["Tracer", "bind", "stop_gradient"]


def _ir_name(name: str) -> str:
    """A name usable in IR text: "<lambda>" -> "lambda"."""
    cleaned = re.sub(r"\W+", "_", name).strip("_")
    return cleaned or "fn"


# Arrays that live on devices (ours and JAX's): an operand of one of them is a
# capture the user should pass as an argument instead.
_DEVICE_ARRAYS = ("ShardedBuffer", "ArrayImpl", "Array")


class _FunctionTrace:
    """One trace of a pmap'd function: its builder and whether it is still running.

    A trace may read traced values of other traces in two ways, both resolved
    by `resolve` (which `bind` calls for every operand when either is in use):

    * A loop body's trace (pathways._control_flow) has a `parent`, the trace
      the loop is in. A value of the parent (or of its ancestors) that the
      body reads becomes a parameter of the body, once: `lifted` lists those
      values in parameter order, and the loop passes them in.
    * `subst` maps values of other traces (or of this one) to values of this
      trace while a function runs again in it: `pw.checkpoint`'s backward
      recomputes the forward from copies of its inputs.

    `recorder`, when set, sees the operands of every op bound (a
    checkpointed function's inputs are those it reads from before it ran).
    """

    __slots__ = ("builder", "name", "axis_name", "active", "tapes", "constant_values", "parent",
                 "lifted", "lifted_ids", "subst", "recorder")

    def __init__(self, builder: Any, name: str, axis_name: Optional[str],
                 parent: Optional["_FunctionTrace"] = None):
        self.builder = builder
        self.name = name
        self.axis_name = axis_name
        self.active = True
        self.tapes: list = []  # gradient tapes recording this trace (pathways._autodiff)
        # Constant arrays by value id, kept only when set to a dict: the forward
        # trace of a `pw.vjp` split (pathways._vjp) gives its constants to the
        # backward function as constants, not as residuals.
        self.constant_values: Optional[dict] = None
        self.parent = parent
        self.lifted: list = []  # values of enclosing traces that are parameters here
        self.lifted_ids: dict = {}  # (trace, id) -> parameter id, of those
        self.subst: dict = {}  # (trace, id) -> id in this trace
        self.recorder: Optional[Callable[[Sequence["Tracer"], list], None]] = None

    def where(self) -> str:
        return f"pmap of {self.name!r}"

    def can_read(self, t: "Tracer") -> bool:
        """Whether traced value `t` may be an operand here (see the class docstring)."""
        key = None
        tr: Optional[_FunctionTrace] = self
        while tr is not None:
            if t._trace is tr:
                return tr.active
            if tr.subst or tr.lifted_ids:
                if key is None:
                    key = (t._trace, t._id)
                if key in tr.subst or key in tr.lifted_ids:
                    return True
            tr = tr.parent
        return False

    def resolve(self, t: "Tracer") -> int:
        """The value id of traced value `t` in this trace.

        Raises:
          TracerError: If `t` cannot be read here (an escaped tracer).
        """
        if self.subst:
            v = self.subst.get((t._trace, t._id))
            if v is not None:
                return v
        if t._trace is self:
            if not self.active:
                raise _escaped(t)
            return t._id
        key = (t._trace, t._id)
        v = self.lifted_ids.get(key)
        if v is not None:
            return v
        if self.parent is None or not self.parent.can_read(t):
            raise _escaped(t)
        v = self.builder.parameter(t.dtype.name, list(t.shape))
        self.lifted.append(t)
        self.lifted_ids[key] = v
        return v

    def local(self, t: "Tracer") -> "Tracer":
        """`t` as a traced value of this trace (itself if it is one)."""
        if t._trace is self and not self.subst:
            return t
        v = self.resolve(t)
        return t if t._trace is self and v == t._id else Tracer(self, v)

    def constant(self, value: Any, like_dtype: Optional[np.dtype]) -> "Tracer":
        """Adds a constant operand of a value of dtype `like_dtype`.

        Python scalars are weakly typed: a Python int or bool takes
        `like_dtype` (int32 when `like_dtype` is bool), a Python float takes
        `like_dtype` if it is a float type and float32 otherwise; with no
        `like_dtype` (None), they get the dtype an argument would (a bool
        bool, an int int32 as in JAX, a float float64). numpy scalars
        (`np.float64(2.0)`, what `np.sqrt(d)` returns) are weakly typed too
        when there is a `like_dtype`, as a JAX user expects of a float32
        model (JAX without x64 has no float64 to promote to): numpy's own
        rule would make `x_f32 * np.float64(2)` float64. numpy arrays, 0-d
        ones included, keep their dtype (bool, int32, uint32, float32,
        float64, bfloat16; other numpy integers take `like_dtype` if it is a float type
        and int32 otherwise).

        Raises:
          OverflowError: For a Python int out of the range of the dtype it
            takes (`uint32_value + -1`), as numpy's.
        """
        b = self.builder
        like = None if like_dtype is None else np.dtype(like_dtype)
        if like is not None and isinstance(value, np.generic) and value.dtype.kind in "biuf":
            value = value.item()
        weak = isinstance(value, (bool, int, float)) and not isinstance(value, np.generic)
        if weak:
            if like is None:
                int_dtype = np.bool_ if isinstance(value, bool) else np.int32
                dtype = np.float64 if isinstance(value, float) else int_dtype
            elif isinstance(value, float) and not _is_float(like):
                dtype = np.float32
            elif isinstance(value, int) and not isinstance(value, bool) and like.kind == "b":
                dtype = np.int32
            else:
                dtype = like
            arr = np.array(value, dtype=dtype)
        else:
            arr = np.asarray(value)
            if arr.dtype.kind in "iu" and arr.dtype not in (np.int32, np.uint32):
                target = like if like is not None and _is_float(like) else np.int32
                if target == np.int32 and arr.size and (
                        int(arr.min()) < -(2**31) or int(arr.max()) > 2**31 - 1):
                    raise ValueError(  # as for arguments: int32 would wrap them
                        f"{self.where()}: constant of dtype {arr.dtype} has values outside "
                        "the int32 range (int64 is not a dtype here)"
                    )
                arr = arr.astype(target)
            elif arr.dtype not in _SUPPORTED_DTYPES:
                raise TypeError(
                    f"{self.where()}: constant of dtype {arr.dtype} is not supported; "
                    f"supported dtypes: {_SUPPORTED_DTYPE_NAMES}"
                )
            arr = np.asarray(arr, order="C")  # (ascontiguousarray makes 0-d arrays 1-d)
        vid = b.constant(arr)
        if self.constant_values is not None:
            self.constant_values[vid] = arr
        return WeakTracer(self, vid) if weak else Tracer(self, vid)


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



def _weak_operands_converted(
    trace: "_FunctionTrace", p: Primitive, operands: Sequence["Tracer"]
) -> Sequence["Tracer"]:
    """`operands` with each weakly typed one (`WeakTracer`) cast as a Python scalar would be.

    The dtype comes from the strongly typed operands (select's condition
    aside): a weak float takes theirs if it is a float type and float32
    otherwise, a weak int or bool takes theirs (int32 for bool). With no
    strongly typed operand, nothing changes.
    """
    first = 1 if p.name == "select" else 0
    strong = [t.dtype for t in operands[first:] if type(t) is not WeakTracer]
    if len(strong) == len(operands) - first or not strong:
        return operands
    like = np.result_type(*strong)
    out = list(operands)
    for i in range(first, len(out)):
        t = out[i]
        if type(t) is WeakTracer:
            if t.dtype.kind == "f":
                dtype = like if like.kind == "f" else np.dtype(np.float32)
            elif t.dtype.kind == "i":
                dtype = like if like.kind != "b" else np.dtype(np.int32)
            else:
                dtype = like
            out[i] = bind(trace, "convert", [t], dtype=dtype.name) if dtype != t.dtype else t
    return out


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
      cast to the same dtype), no op was recorded and no tape sees one. A
      primitive with multiple results (scan) gives a list of them.

    Raises:
      ValueError, TypeError: From the builder, naming the op and the shapes.
    """
    p = prim if type(prim) is Primitive else PRIMITIVES[prim]
    if p.op_class == "elementwise" and len(operands) > 1:
        operands = _weak_operands_converted(trace, p, operands)
    if trace.parent is not None or trace.subst or trace.recorder is not None:
        ids = [trace.resolve(t) for t in operands]
        if trace.recorder is not None:
            trace.recorder(operands, ids)
    else:
        ids = [t._id for t in operands]
    if len(ids) != p.arity and (p.arity >= 0 or not ids) and not p.multiple_results:
        raise TypeError(
            f"primitive {p.name!r} takes {'one or more' if p.arity < 0 else p.arity} operands, "
            f"got {len(ids)}"
        )
    out = p.emit(trace.builder, *ids, **params)
    if p.multiple_results:
        # One tape entry for all results (pathways._autodiff), as a tuple of ids.
        outs = tuple(out)
        for tape in trace.tapes:
            tape.record(p, ids, outs, params)
        return [Tracer(trace, o) for o in outs]
    if trace.tapes and out not in ids:
        for tape in trace.tapes:
            tape.record(p, ids, out, params)
    # Weak in, weak out (`lr * 0.5` of a weak `lr` stays weak); a cast is strong.
    if (
        operands
        and type(operands[0]) is WeakTracer
        and p.op_class == "elementwise"
        and p.name != "convert"
        and all(type(t) is WeakTracer for t in operands)
    ):
        return WeakTracer(trace, out)
    return Tracer(trace, out)


class Tracer(_TracerBase):
    """A value inside a function traced by `pw.pmap`: one shard's array.

    Supports `+ - * / **` (also reflected), comparisons `< <= > >= == !=`
    (giving bool values), `& | ^ ~` (bitwise on integers, logical on bools)
    and the shifts `<< >>` on integers (`>>` arithmetic for int32, logical
    for uint32), unary `-`/`+`, `abs()`,
    `.astype()` and the reductions `.sum() .mean() .max() .min() .argmax()`
    (numpy's `axis` and `keepdims`), with other traced values of the same trace, Python scalars
    and numpy scalars and arrays; more ops are in `pathways.numpy`, which
    numpy's own functions call on traced values (`np.sum(x)` is
    `pathways.numpy.sum(x)`). Shapes
    broadcast as in numpy, and dtypes promote as in numpy (bool < int32,
    uint32 < float32 < float64, an integer with float32 gives float64; `/`
    of integers is float64), but int32 with uint32 gives int32, as JAX's
    (numpy's int64 is no dtype here). bfloat16 promotes as in JAX: with
    bool or an integer it stays bfloat16, with float32 or float64 it widens;
    it is stored in bfloat16 and computed in float32, each result rounded
    once. Python scalars are weakly typed: a Python int or bool takes the
    traced value's dtype (int32 for a bool value), a Python float takes it if
    it is a float type and float32 otherwise (so int32 + 0.5 is float64, as in
    numpy). Python control flow on a traced value (`if x > 0:`) raises
    `TracerError`, since `bool()` of a traced value has no answer.

    Attributes:
      shape: The per-shard shape (the pmap'd axis removed).
      dtype: A numpy dtype: float32, float64, int32, uint32, bool or bfloat16
        (`ml_dtypes.bfloat16`, which is `pw.numpy.bfloat16`).
      ndim: `len(shape)`.
      size: The number of elements per shard.
      aval: A short type string, e.g. "f32[3]".
    """

    __slots__ = ("_trace", "_id", "shape", "dtype")

    __array_priority__ = 1000

    def __init__(self, trace: _FunctionTrace, value_id: int):
        self._trace = trace
        self._id = value_id
        self.shape = tuple(trace.builder.shape(value_id))
        self.dtype = np.dtype(trace.builder.dtype(value_id))

    def __repr__(self) -> str:
        return f"Tracer<{self.aval}>"

    def _check(self) -> _FunctionTrace:
        """The current function trace, in which this value may be an operand.

        That is this value's own trace, or a trace that reads it from an
        enclosing one (a loop body's) or through a substitution.

        Raises:
          TracerError: For an escaped tracer.
        """
        trace = self._trace
        cur = _state.function
        if cur is trace and trace.active:
            return trace
        if cur is not None and cur.can_read(self):
            return cur
        raise _escaped(self)

    def _operand(self, other: Any, trace: Optional[_FunctionTrace] = None) -> Optional["Tracer"]:
        """`other` as an operand in `trace` (default: the current one, in which
        this value is read; constants are added), or None if unsupported."""
        if trace is None:
            trace = self._check()
        if isinstance(other, Tracer):
            other._check()
            return other
        if isinstance(other, _TracerBase):
            raise TracerError(
                f"{trace.where()} uses a traced program value ({other.aval}) that was not "
                "passed to it as an argument; pass program values to pmap'd functions as "
                "arguments instead of closing over them"
            )
        if isinstance(other, (bool, int, float, np.generic, np.ndarray)):
            if (isinstance(other, (np.generic, np.ndarray)) and other.dtype.kind not in "biuf"
                    and not _is_float(other.dtype)):
                return None
            return trace.constant(other, self.dtype)
        if hasattr(other, "__array__") and type(other).__name__ in _DEVICE_ARRAYS:
            error = TypeError if type(other).__name__ == "ShardedBuffer" else JaxValueInPathwaysTrace
            raise error(
                f"{trace.where()} uses a {type(other).__name__} it did not get as an argument: "
                "device arrays are not captured as constants (that would read them back to the "
                "host at every trace); pass it as an argument (in_axes=None for one whole "
                "value), or capture np.asarray(it)"
            )
        return None

    def _binary(self, op: str, other: Any, reflected: bool) -> Any:
        trace = self._check()
        o = self._operand(other, trace)
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
        # A Python integer exponent of 2 or 3 on numbers is repeated
        # multiplication, as JAX's integer_pow (x ** 3 in GELU): exact
        # where pow is within an ulp, and no libm call per element.
        if type(other) is int and other in (2, 3) and (_is_float(self.dtype) or self.dtype.kind == "i"):
            self._check()
            square = self._binary("mul", self, False)
            return square if other == 2 else square._binary("mul", self, False)
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

    # Bitwise ops: on integers bitwise, on bools logical (numpy's bitwise_and
    # ...); the builder refuses floats with a TypeError naming the op.
    def __and__(self, other: Any) -> Any:
        return self._binary("and", other, False)

    def __rand__(self, other: Any) -> Any:
        return self._binary("and", other, True)

    def __or__(self, other: Any) -> Any:
        return self._binary("or", other, False)

    def __ror__(self, other: Any) -> Any:
        return self._binary("or", other, True)

    def __xor__(self, other: Any) -> Any:
        return self._binary("xor", other, False)

    def __rxor__(self, other: Any) -> Any:
        return self._binary("xor", other, True)

    def __lshift__(self, other: Any) -> Any:
        return self._binary("shift_left", other, False)

    def __rlshift__(self, other: Any) -> Any:
        return self._binary("shift_left", other, True)

    def _right_shift(self, other: Any, reflected: bool) -> Any:
        """numpy's `>>`: logical when the operands promote to uint32, arithmetic otherwise."""
        trace = self._check()
        o = self._operand(other)
        if o is None:
            return NotImplemented
        kinds = {self.dtype.kind, o.dtype.kind}
        logical = "u" in kinds and kinds <= {"u", "b"}
        return bind(trace, "shift_right_logical" if logical else "shift_right_arithmetic",
                    (o, self) if reflected else (self, o))

    def __rshift__(self, other: Any) -> Any:
        return self._right_shift(other, False)

    def __rrshift__(self, other: Any) -> Any:
        return self._right_shift(other, True)

    def _unary(self, op: str) -> "Tracer":
        trace = self._check()
        return bind(trace, op, (self,))

    def __invert__(self) -> "Tracer":
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
        """Casts to `dtype` (float32, float64, int32, uint32, bool or bfloat16), like numpy's `astype`.

        Float to an integer truncates toward zero (out of range: int32 gets
        INT32_MIN as numpy on x86, uint32 saturates as XLA, NaN giving 0);
        between int32 and uint32 the bits stay; to bool is `x != 0`; to
        bfloat16 rounds to nearest even through float32 (NaN stays NaN), the
        bits `ml_dtypes` gives.

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

    # numpy's positional order: (axis, dtype, out, keepdims) for sum and mean,
    # (axis, out, keepdims) for max, min and argmax; `out` is not taken, so
    # keepdims is keyword-only (a third positional argument is never it).

    def sum(self, axis: Any = None, dtype: Any = None, *, keepdims: bool = False) -> "Tracer":
        """Sum over `axis` (None, int or tuple), as numpy; bool/int32 sum to int32.
        `dtype` casts first (the sum is computed in it)."""
        x = self if dtype is None else self.astype(dtype)
        return x._reduce("sum", axis, keepdims)

    def mean(self, axis: Any = None, dtype: Any = None, *, keepdims: bool = False) -> "Tracer":
        """Mean over `axis`, as numpy; bool/int32 give float64. `dtype` casts first."""
        x = self if dtype is None else self.astype(dtype)
        return x._reduce("mean", axis, keepdims)

    def max(self, axis: Any = None, *, keepdims: bool = False) -> "Tracer":
        """Maximum over `axis`, as numpy (NaN-propagating)."""
        return self._reduce("max", axis, keepdims)

    def min(self, axis: Any = None, *, keepdims: bool = False) -> "Tracer":
        """Minimum over `axis`, as numpy (NaN-propagating)."""
        return self._reduce("min", axis, keepdims)

    def argmax(self, axis: Any = None, *, keepdims: bool = False) -> "Tracer":
        """Index of the first maximum along `axis` (None: flattened), as int32."""
        return self._reduce("argmax", _checks.optional_index("argmax", "axis", axis), keepdims)

    # --- Not traceable (yet) ------------------------------------------------

    def _unsupported(self, what: str) -> TracerError:
        self._check()
        return TracerError(
            f"{what} on traced values ({self.aval} in {self._trace.where()}) is not supported "
            "yet; supported operations: + - * / ** @ comparisons & | ^ ~ << >> abs() .astype(), "
            "indexing, .reshape() .transpose() .T, .sum() .mean() .max() .min() .argmax(), "
            "pathways.numpy, pathways.nn, pw.psum and the other collectives"
        )

    @property
    def T(self) -> "Tracer":  # noqa: N802 (numpy's name)
        """The transpose (dimensions reversed)."""
        return self.transpose()

    # The methods and operators that pathways.numpy's functions implement (`//`, `%`,
    # divmod, `@`, .prod() .any() .all() .argmin() .round(), shapes: .reshape()
    # .transpose() .swapaxes() .squeeze() .ravel() .flatten(), .clip() .var() .std()
    # .take() .repeat() .dot() .cumsum() .cumprod() .sort() .argsort(), `.at`,
    # indexing, and numpy's __array_ufunc__ and __array_function__ protocols) are
    # installed on this class by pathways.numpy (pathways.numpy._methods) at its import.

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


class WeakTracer(Tracer):
    """A weakly typed traced value, as JAX's weak types: a constant of a Python
    (or numpy) scalar, a parameter of a Python scalar argument, or an
    elementwise result of weak values only.

    In an elementwise op with strongly typed operands it takes their dtype as
    a Python scalar would (`bind`), so `pw.jit(step)(w_f32, 0.1)` keeps `w`
    float32, and so does `w - (lr * 0.5) * g`. Casts (`astype`) and every
    other op give strongly typed values.
    """

    __slots__ = ()


def stop_gradient(x: Any) -> Any:
    """`x`, with no gradient flowing back through it, like `jax.lax.stop_gradient`.

    Args:
      x: A pytree. Inside a function traced by `pw.pmap`, each float traced
        leaf goes through a "stop_gradient" op (an identity that `grad`
        treats as a constant); other leaves are returned as they are.
        Outside a trace, `x` is returned unchanged.

    Returns:
      A pytree like `x`.

    Raises:
      TracerError: For a traced value used after its trace ended.
    """
    trace = _state.function
    if trace is None:
        return x

    def stop(leaf: Any) -> Any:
        if isinstance(leaf, Tracer):
            leaf._check()
            if _is_float(leaf.dtype):
                return bind(trace, "stop_gradient", (leaf,))
        return leaf

    return tree_map(stop, x)
