"""What every tracer shares: the per-thread tracing state, `TracerError`, and the base of traced values.

Tracing state is thread-local, so several threads may trace and run at once.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

import ml_dtypes
import numpy as np

if TYPE_CHECKING:
    from pathways._tracer import _FunctionTrace

__all__ = ["TracerError", "aval_str"]

# ml_dtypes' bfloat16 (JAX's jnp.bfloat16): numpy's kind for it is "V", so
# code that asks whether a dtype is a float asks `_is_float` instead.
_BFLOAT16 = np.dtype(ml_dtypes.bfloat16)

_SUPPORTED_DTYPES = (
    np.dtype(np.float32),
    np.dtype(np.float64),
    np.dtype(np.int32),
    np.dtype(np.bool_),
    np.dtype(np.uint32),
    _BFLOAT16,
)
_SUPPORTED_DTYPE_NAMES = "float32, float64, int32, bool, uint32, bfloat16"
_SHORT_DTYPE = {"float32": "f32", "float64": "f64", "int32": "i32", "bool": "pred", "uint32": "u32",
                "bfloat16": "bf16"}


def _is_float(dtype: Any) -> bool:
    """Whether `dtype` is a floating-point type: numpy's floats and bfloat16."""
    dt = np.dtype(dtype)
    return dt.kind == "f" or dt == _BFLOAT16


class TracerError(TypeError):
    """A traced value was used in a way that tracing cannot record.

    Raised for Python control flow on traced values (`if x > 0:`), conversions
    to Python or numpy values, escaped tracers (used after their trace ended),
    and computation on program values outside pmap'd functions.
    """


class JaxValueInPathwaysTrace(TypeError):
    """pathways' tracer met a JAX array: the function is written for JAX, whose tracer
    takes it over (pathways._jax_frontend)."""


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


# The front end's pmap (pathways._pmap's PmapFunction), which that module sets at
# its import: the layers below the front end run through it.
_front_end_pmap: Any = None


def set_front_end_pmap(pmap: Any) -> None:
    """Sets the front end's pmap, `pmap(fn, devices, axis_name)`: called by pathways._pmap."""
    global _front_end_pmap
    _front_end_pmap = pmap


def one_device_pmap(fn: Callable[..., Any]) -> Any:
    """`fn` as a `pw.pmap` over one device: how `pw.grad` and `pw.lax`'s functions run
    when called outside any trace (their arguments get a leading axis of 1)."""
    return _front_end_pmap(fn, None, None)


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

